//! `vault_list` (read_only): the notes of a folder that the read scope allows.

use super::{ToolDef, VaultCall, VaultContext, opt_param};
use crate::call::{CallError, ToolOutput};
use crate::tools::{ApprovalRule, Effect};
use serde_json::{Value, json};
use std::path::Path;

/// At most this many notes in one result; `truncated` says when there were more.
const MAX_NOTES: usize = 1000;

pub fn tool() -> ToolDef {
    ToolDef {
        description: "List the notes of a vault folder (default: the whole vault) with their size and modification time.",
        effect: Effect::ReadOnly,
        approval: ApprovalRule::Never,
        schema: json!({
            "type": "object",
            "properties": {
                "folder": { "type": "string", "maxLength": 1024, "description": "Vault-relative folder; empty or absent for the vault root" },
                "recursive": { "type": "boolean", "default": true }
            },
            "additionalProperties": false
        }),
        run,
        plan: None,
    }
}

pub fn run(context: &VaultContext, call: &VaultCall) -> Result<ToolOutput, CallError> {
    let (rel, abs) = context.paths.folder(opt_param(call, "folder"))?;
    if !abs.is_dir() {
        return Err(CallError::new(
            crate::call::ErrorCode::NotFound,
            format!("no folder `{rel}` in the vault"),
        ));
    }
    let recursive = call
        .parameters
        .get("recursive")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let mut notes = Vec::new();
    for path in walk_notes(context, &abs, recursive) {
        if notes.len() == MAX_NOTES {
            break;
        }
        let Ok(meta) = std::fs::symlink_metadata(context.paths.root().join(&path)) else {
            continue;
        };
        let modified = meta
            .modified()
            .map(crate::call::rfc3339_seconds)
            .unwrap_or_default();
        notes.push(json!({ "path": path, "bytes": meta.len(), "modified": modified }));
    }
    let n = notes.len();
    Ok(ToolOutput {
        data: json!({ "notes": notes, "truncated": n == MAX_NOTES }),
        summary: format!("{n} notes"),
        undo: None,
    })
}

/// Vault-relative paths of the notes under `dir` that the policy lets a tool see, sorted.
/// Hidden entries and symlinks are never entered (the `ignore` walker, with symlinks not
/// followed and no ignore files read).
pub fn walk_notes(context: &VaultContext, dir: &Path, recursive: bool) -> Vec<String> {
    let root = context.paths.root();
    let mut walk = ignore::WalkBuilder::new(dir);
    walk.standard_filters(false)
        .hidden(true)
        .follow_links(false)
        .sort_by_file_name(|a, b| a.cmp(b));
    if !recursive {
        walk.max_depth(Some(1));
    }
    walk.build()
        .flatten()
        .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
        .filter_map(|e| {
            let rel = e.path().strip_prefix(root).ok()?.to_str()?.to_string();
            context.paths.listable(&rel).then_some(rel)
        })
        .collect()
}
