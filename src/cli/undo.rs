//! `vaultd undo`: undoes a vault write, or every vault write of a note.

use super::{GlobalArgs, load, open_journal, resolve_note};
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

/// `vaultd undo`: the same undo code `vault_undo` runs (tools::vault::undo).
pub(super) fn undo(
    g: &GlobalArgs,
    call_id: Option<String>,
    note: Option<PathBuf>,
    dry_run: bool,
    force: bool,
) -> Result<i32> {
    use crate::tools::vault::undo::{Target, note_key_of_arg, undo_from_cli};
    let (config, _) = load(g)?;
    let journal = open_journal(&config)?;
    // NOTE as every command reads it (§13); a note that is gone may still have a history
    // under its old path, so a miss is only said when the journal has none either.
    let note = note.map(
        |n| match resolve_note(&config, &n, &crate::vault::State::ALL) {
            Ok(path) => {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let id = crate::note::frontmatter_property(&text, "tool_note").map(str::to_string);
                (
                    note_key_of_arg(&config.vault, &config.folders, &path),
                    id,
                    None,
                )
            }
            Err(e) => (
                note_key_of_arg(&config.vault, &config.folders, &n),
                None,
                Some(e.to_string()),
            ),
        },
    );
    let target = match (call_id, note) {
        (Some(call_id), note) => Target::Call {
            call_id,
            note_key: note.map(|(key, _, _)| key),
        },
        (None, Some((note_key, note_id, missing))) => Target::Note {
            note_id,
            note_key,
            missing,
        },
        (None, None) => anyhow::bail!("give a CALL_ID or --note NOTE"),
    };
    let mut out = std::io::stdout().lock();
    match undo_from_cli(&journal, &config.vault, &target, force, dry_run) {
        Ok(done) => {
            out.write_all(done.diff.as_bytes())?;
            match done.call_id {
                Some(id) => writeln!(
                    out,
                    "restored {}\nundo id {id} (vaultd undo {id} puts it back)",
                    done.restored.join(", ")
                )?,
                None => writeln!(out, "dry run: nothing changed")?,
            }
            Ok(0)
        }
        Err(e) => {
            if let Some(diff) = e.details.as_ref().and_then(|d| d["diff"].as_str()) {
                out.write_all(diff.as_bytes())?;
            }
            eprintln!("vaultd: {}: {}", e.code, e.message);
            Ok(1)
        }
    }
}
