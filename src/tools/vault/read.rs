//! `vault_read` (read_only): one note's properties, body, hash and size.

use super::paths::Access;
use super::{ToolDef, VaultCall, VaultContext, param, read_text, sha256_hex};
use crate::call::{CallError, ToolOutput};
use crate::note::frontmatter::read_properties;
use crate::tools::{ApprovalRule, Effect};
use serde_json::json;

pub fn tool() -> ToolDef {
    ToolDef {
        description: "Read a note of the vault: its frontmatter properties, its content (the text after the frontmatter), its sha256 (pass it as if_sha256 to a later write) and size.",
        effect: Effect::ReadOnly,
        approval: ApprovalRule::Never,
        schema: json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "minLength": 1, "maxLength": 1024, "description": "Vault-relative note path ending in .md" }
            },
            "required": ["path"],
            "additionalProperties": false
        }),
        run,
        plan: None,
    }
}

pub fn run(context: &VaultContext, call: &VaultCall) -> Result<ToolOutput, CallError> {
    let note = context.paths.note(param(call, "path"), Access::Read)?;
    let text = read_text(&note)?;
    let content = match crate::note::frontmatter::span(&text) {
        Some(span) => text[span.end..].trim_start_matches(['\r', '\n']),
        None => text.trim_start_matches('\u{feff}'),
    };
    Ok(ToolOutput {
        data: json!({
            "path": note.rel,
            "properties": read_properties(&text),
            "content": content,
            "sha256": sha256_hex(text.as_bytes()),
            "bytes": text.len(),
        }),
        summary: format!("{} bytes", text.len()),
        undo: None,
    })
}
