//! `vaultd undo`: undoes a vault write, or every vault write of a note.

use super::{GlobalArgs, load, open_journal, resolve_note};
use anyhow::Result;
use std::io::Write;
use std::path::{Path, PathBuf};

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
    if call_id.is_none()
        && let Some(session) = note.as_deref().and_then(|n| session_note(&config, n))
    {
        return undo_session(&config, &journal, &session, dry_run, force);
    }
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
            print_undone(&mut out, "", &done)?;
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

/// A note in the sessions folder (docs/design.md §14 item 4): `vaultd undo --note` on it undoes
/// every call note it links.
fn session_note(config: &crate::config::Config, arg: &Path) -> Option<PathBuf> {
    let folder = config.vault.join(&config.gateway.sessions);
    let path = resolve_note(config, arg, &[]).ok().or_else(|| {
        let named = folder.join(arg);
        let named = if named.extension().is_some() {
            named
        } else {
            named.with_extension("md")
        };
        named.is_file().then_some(named)
    })?;
    let path = path.canonicalize().ok()?;
    path.starts_with(folder.canonicalize().ok()?)
        .then_some(path)
}

/// The call notes a session note links (`- call note: [[NAME]]`), in the order of the calls.
fn call_notes(session_text: &str) -> Vec<String> {
    session_text
        .lines()
        .filter_map(|l| l.strip_prefix("- call note: [[")?.strip_suffix("]]"))
        .map(|name| format!("{name}.md"))
        .collect()
}

/// Undoes the calls of every call note of a session, the newest first; a call note that
/// changed nothing in the vault is skipped. Exit status 1 when one could not be undone.
fn undo_session(
    config: &crate::config::Config,
    journal: &crate::journal::Journal,
    session: &Path,
    dry_run: bool,
    force: bool,
) -> Result<i32> {
    let text = std::fs::read_to_string(session)?;
    let notes = call_notes(&text);
    let mut status = 0;
    let mut undone = 0;
    for name in notes.iter().rev() {
        let Ok(path) = resolve_note(config, Path::new(name), &crate::vault::State::ALL) else {
            eprintln!("vaultd: the call note {name} is not in the vault any more: skipped");
            continue;
        };
        let id = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| crate::note::frontmatter_property(&t, "tool_note").map(str::to_string));
        let target = crate::tools::vault::undo::Target::Note {
            note_id: id,
            note_key: crate::tools::vault::undo::note_key_of_arg(
                &config.vault,
                &config.folders,
                &path,
            ),
            missing: None,
        };
        match crate::tools::vault::undo::undo_from_cli(
            journal,
            &config.vault,
            &target,
            force,
            dry_run,
        ) {
            Ok(done) => {
                undone += 1;
                print_undone(&mut std::io::stdout().lock(), &format!("{name}: "), &done)?;
            }
            Err(e) if e.code == crate::call::ErrorCode::NothingToUndo => {}
            Err(e) => {
                eprintln!("vaultd: {name}: {}: {}", e.code, e.message);
                status = 1;
            }
        }
    }
    if undone == 0 && status == 0 {
        eprintln!(
            "vaultd: NOTHING_TO_UNDO: no call of this session ({} call notes) changed the vault",
            notes.len()
        );
        return Ok(1);
    }
    Ok(status)
}

/// An undo's diff, then what it restored and its own undo id (`label` before the summary).
fn print_undone(
    out: &mut impl Write,
    label: &str,
    done: &crate::tools::vault::undo::CliUndo,
) -> std::io::Result<()> {
    out.write_all(done.diff.as_bytes())?;
    match &done.call_id {
        Some(id) => writeln!(
            out,
            "{label}restored {}\nundo id {id} (vaultd undo {id} puts it back)",
            done.restored.join(", ")
        ),
        None => writeln!(out, "{label}dry run: nothing changed"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_sessions_call_notes_are_its_links() {
        let text = "# s\n\n## t `a`\n\n- call note: [[s call 1]]\n- outcome: ok\n\n## t `b`\n\n- call note: [[s call 2]]\n> - call note: [[quoted]]\n";
        assert_eq!(super::call_notes(text), ["s call 1.md", "s call 2.md"]);
    }
}
