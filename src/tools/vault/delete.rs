//! `vault_delete` (state_change, held for approval by default): moves a note to `.trash/`
//! (keeping its folder path there); nothing is ever unlinked.

use super::paths::Access;
use super::{
    Planned, ToolDef, VaultCall, VaultContext, changed, current_bytes, execution, move_file,
    not_found, param, prepare, sha256_hex, trash_slot,
};
use crate::call::{CallError, ToolOutput, VaultChange};
use crate::tools::{ApprovalRule, Effect};
use serde_json::json;

pub fn tool() -> ToolDef {
    ToolDef {
        description: "Move a note to the vault's .trash/ folder (it can be restored with vault_undo). Held for a person's approval by default.",
        effect: Effect::StateChange,
        approval: ApprovalRule::Always,
        schema: json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "minLength": 1, "maxLength": 1024 }
            },
            "required": ["path"],
            "additionalProperties": false
        }),
        run,
        plan: Some(planned),
    }
}

/// Where `run` would move the note, for a preview (docs/design.md §12.1); nothing is moved.
pub fn planned(context: &VaultContext, call: &VaultCall) -> Result<Vec<Planned>, CallError> {
    let note = context.paths.note(param(call, "path"), Access::Write)?;
    let Some(bytes) = current_bytes(&note.abs)? else {
        return Err(not_found(&note.rel));
    };
    // A move keeps the bytes as they are; the preview shows them as text.
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let trashed = trash_slot(context.paths.root(), &note.rel);
    Ok(vec![Planned::moved(&note.rel, &trashed, text)])
}

pub fn run(context: &VaultContext, call: &VaultCall) -> Result<ToolOutput, CallError> {
    let note = context.paths.note(param(call, "path"), Access::Write)?;
    let Some(bytes) = current_bytes(&note.abs)? else {
        return Err(not_found(&note.rel));
    };
    let trashed = trash_slot(context.paths.root(), &note.rel);
    let hash = sha256_hex(&bytes);
    let changes = vec![
        VaultChange {
            path: note.rel.clone(),
            before: Some(bytes),
            after_sha256: None,
        },
        VaultChange {
            path: trashed.clone(),
            before: None,
            after_sha256: Some(hash),
        },
    ];
    prepare(context, call, "vault_delete", &changes)?;
    move_file(&note.abs, &context.paths.root().join(&trashed))
        .map_err(|e| execution(format!("cannot move `{}` to the trash: {e}", note.rel)))?;
    Ok(changed(
        json!({ "trashed": trashed }),
        format!("{} to the trash", note.rel),
        changes,
    ))
}
