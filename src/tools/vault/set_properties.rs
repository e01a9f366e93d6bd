//! `vault_set_properties` (state_change): sets or removes (`null`) frontmatter properties,
//! touching only their lines.

use super::paths::Access;
use super::{
    Planned, ToolDef, VaultCall, VaultContext, changed, check_if_sha256, edit_note, param,
    path_and_hash, read_text,
};
use crate::call::{CallError, ErrorCode, ToolOutput};
use crate::note::frontmatter::set_json;
use crate::tools::{ApprovalRule, Effect};
use serde_json::{Map, Value, json};

/// vaultd's own properties (docs/design.md §3, §9): a tool may not forge a note's state or identity.
const RESERVED: [&str; 6] = [
    "tool_status",
    "tool_calls",
    "tool_errors",
    "tool_updated",
    "tool_note",
    "tool_runner",
];

pub fn tool() -> ToolDef {
    ToolDef {
        description: "Set frontmatter properties of a note (null removes one). Every other line stays as it was.",
        effect: Effect::StateChange,
        approval: ApprovalRule::Never,
        schema: json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "minLength": 1, "maxLength": 1024 },
                "properties": {
                    "type": "object",
                    "minProperties": 1,
                    "propertyNames": { "pattern": "^[A-Za-z0-9_][A-Za-z0-9_ .-]{0,99}$" }
                },
                "if_sha256": { "type": "string", "pattern": "^[0-9a-fA-F]{64}$" }
            },
            "required": ["path", "properties"],
            "additionalProperties": false
        }),
        run,
        plan: Some(planned),
    }
}

/// Property names a tool may set: not vaultd's own, however written (`tool_note ` reads back
/// as `tool_note`), and each one that reads back as itself (no space or quote at its ends).
pub fn check_keys(props: &Map<String, Value>) -> Result<(), CallError> {
    if let Some(k) = props
        .keys()
        .find(|k| k.trim() != k.as_str() || k.starts_with(['"', '\'']) || k.contains(['\n', '\r', ':']))
    {
        return Err(CallError::new(
            ErrorCode::InvalidParams,
            format!(
                "property name `{}` would not read back as itself: no space or quote at its ends, no colon or line break",
                k.escape_debug()
            ),
        ));
    }
    if let Some(k) = props.keys().find(|k| RESERVED.contains(&k.as_str())) {
        return Err(CallError::new(
            ErrorCode::PolicyDenied,
            format!("property `{k}` is vaultd's own; tools cannot set it"),
        ));
    }
    Ok(())
}

pub fn run(context: &VaultContext, call: &VaultCall) -> Result<ToolOutput, CallError> {
    let note = context.paths.note(param(call, "path"), Access::Write)?;
    let props = properties(call)?;
    let (change, written) = edit_note(context, call, "vault_set_properties", &note, |current| {
        check_if_sha256(call, &note.rel, current)?;
        Ok(set_json(current, &props))
    })?;
    Ok(changed(
        path_and_hash(&note.rel, &written),
        format!("{} properties set", props.len()),
        vec![change],
    ))
}

/// The `properties` parameter, its keys checked.
fn properties(call: &VaultCall) -> Result<Map<String, Value>, CallError> {
    let props = call
        .parameters
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    check_keys(&props)?;
    Ok(props)
}

/// The edit `run` would make, for a preview (docs/design.md §12.1); nothing is written.
pub fn planned(context: &VaultContext, call: &VaultCall) -> Result<Vec<Planned>, CallError> {
    let note = context.paths.note(param(call, "path"), Access::Write)?;
    let props = properties(call)?;
    let current = read_text(&note)?;
    check_if_sha256(call, &note.rel, &current)?;
    let after = set_json(&current, &props);
    Ok(vec![Planned::edited(&note.rel, current, after)])
}
