//! `vault_create` (state_change): a new note; `CONFLICT` if the name (or a look-alike of it)
//! is taken. Never replaces a file.

use super::paths::Access;
use super::set_properties::check_keys;
use super::{
    Planned, ToolDef, VaultCall, VaultContext, WriteAhead, changed, conflict,
    create_file_when_ready, execution, param, path_and_hash, refuse_look_alike, sha256_hex,
};
use crate::call::{CallError, ToolOutput, VaultChange};
use crate::note::frontmatter::set_json;
use crate::tools::{ApprovalRule, Effect};
use serde_json::json;

pub fn tool() -> ToolDef {
    ToolDef {
        description: "Create a new note with the given content (and optional frontmatter properties). Fails with CONFLICT if the note exists.",
        effect: Effect::StateChange,
        approval: ApprovalRule::Never,
        schema: json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "minLength": 1, "maxLength": 1024, "description": "Vault-relative path ending in .md; missing folders are created" },
                "content": { "type": "string", "maxLength": 1048576 },
                "properties": { "type": "object", "description": "Frontmatter properties to set" }
            },
            "required": ["path", "content"],
            "additionalProperties": false
        }),
        run,
        plan: Some(planned),
    }
}

pub fn run(context: &VaultContext, call: &VaultCall) -> Result<ToolOutput, CallError> {
    let note = context.paths.note(param(call, "path"), Access::Write)?;
    if std::fs::symlink_metadata(&note.abs).is_ok() {
        return Err(conflict(format!("`{}` already exists", note.rel)));
    }
    refuse_look_alike(&note)?;
    let text = content(call)?;
    let change = VaultChange {
        path: note.rel.clone(),
        before: None,
        after_sha256: Some(sha256_hex(text.as_bytes())),
    };
    let mut ahead = WriteAhead::queue(context, call, "vault_create", std::slice::from_ref(&change))?;
    let created = create_file_when_ready(&note.abs, text.as_bytes(), || ahead.durable());
    created.map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            conflict(format!("`{}` already exists", note.rel))
        } else {
            ahead.or(execution(format!("cannot create `{}`: {e}", note.rel)))
        }
    })?;
    Ok(changed(
        path_and_hash(&note.rel, &text),
        format!("created {}", note.rel),
        vec![change],
    ))
}

/// The new note's text: `content` with `properties` in its frontmatter.
fn content(call: &VaultCall) -> Result<String, CallError> {
    let mut text = param(call, "content").to_string();
    if let Some(props) = call
        .parameters
        .get("properties")
        .and_then(|p| p.as_object())
    {
        check_keys(props)?;
        text = set_json(&text, props);
    }
    Ok(text)
}

/// The note `run` would create, for a preview (docs/design.md §12.1); nothing is written.
pub fn planned(context: &VaultContext, call: &VaultCall) -> Result<Vec<Planned>, CallError> {
    let note = context.paths.note(param(call, "path"), Access::Write)?;
    if std::fs::symlink_metadata(&note.abs).is_ok() {
        return Err(conflict(format!("`{}` already exists", note.rel)));
    }
    refuse_look_alike(&note)?;
    Ok(vec![Planned::created(&note.rel, content(call)?)])
}
