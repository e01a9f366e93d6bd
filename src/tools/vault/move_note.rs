//! `vault_move` (state_change): renames a note, never over another one. Links elsewhere are
//! not rewritten.

use super::paths::Access;
use super::{
    Planned, ToolDef, VaultCall, VaultContext, changed, conflict, current_bytes, execution,
    move_file, not_found, param, prepare, refuse_look_alike, sha256_hex,
};
use crate::call::{CallError, ToolOutput, VaultChange};
use crate::tools::{ApprovalRule, Effect};
use serde_json::json;

pub fn tool() -> ToolDef {
    ToolDef {
        description: "Move or rename a note. Fails with CONFLICT if the target exists. Links to it in other notes are not rewritten.",
        effect: Effect::StateChange,
        approval: ApprovalRule::Never,
        schema: json!({
            "type": "object",
            "properties": {
                "from": { "type": "string", "minLength": 1, "maxLength": 1024 },
                "to": { "type": "string", "minLength": 1, "maxLength": 1024 }
            },
            "required": ["from", "to"],
            "additionalProperties": false
        }),
        run,
        plan: Some(planned),
    }
}

/// The move `run` would make, for a preview (docs/design.md §12.1); nothing is moved.
pub fn planned(context: &VaultContext, call: &VaultCall) -> Result<Vec<Planned>, CallError> {
    let from = context.paths.note(param(call, "from"), Access::Write)?;
    let to = context.paths.note(param(call, "to"), Access::Write)?;
    let Some(bytes) = current_bytes(&from.abs)? else {
        return Err(not_found(&from.rel));
    };
    // A move keeps the bytes as they are; the preview shows them as text.
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if std::fs::symlink_metadata(&to.abs).is_ok() {
        return Err(conflict(format!("`{}` already exists", to.rel)));
    }
    refuse_look_alike(&to)?;
    Ok(vec![Planned::moved(&from.rel, &to.rel, text)])
}

pub fn run(context: &VaultContext, call: &VaultCall) -> Result<ToolOutput, CallError> {
    let from = context.paths.note(param(call, "from"), Access::Write)?;
    let to = context.paths.note(param(call, "to"), Access::Write)?;
    let Some(bytes) = current_bytes(&from.abs)? else {
        return Err(not_found(&from.rel));
    };
    if std::fs::symlink_metadata(&to.abs).is_ok() {
        return Err(conflict(format!("`{}` already exists", to.rel)));
    }
    refuse_look_alike(&to)?;
    let hash = sha256_hex(&bytes);
    let changes = vec![
        VaultChange {
            path: from.rel.clone(),
            before: Some(bytes),
            after_sha256: None,
        },
        VaultChange {
            path: to.rel.clone(),
            before: None,
            after_sha256: Some(hash),
        },
    ];
    prepare(context, call, "vault_move", &changes)?;
    move_file(&from.abs, &to.abs).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            conflict(format!("`{}` already exists", to.rel))
        } else {
            execution(format!("cannot move `{}` to `{}`: {e}", from.rel, to.rel))
        }
    })?;
    Ok(changed(
        json!({ "path": to.rel }),
        format!("moved to {}", to.rel),
        changes,
    ))
}
