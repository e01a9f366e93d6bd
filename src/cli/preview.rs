//! `vaultd check --preview NOTE…`: the dry-run preview of each call, decided through `plan()`.

use super::{GlobalArgs, escape_controls, load_lenient, mcp_registry_for, open_journal};
use crate::config::Config;
use crate::daemon;
use crate::note::parse_note;
use crate::pipeline::plan::{self, Facts, Rules};
use anyhow::Result;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `vaultd check --preview`: the `tool_preview` of every pending call, exactly as a note in
/// Dry_Run/ gets it, printed instead of written. Exit 1 when a call would be denied.
pub(super) fn preview(g: &GlobalArgs, notes: &[PathBuf], as_json: bool) -> Result<i32> {
    let (config, _) = load_lenient(g)?;
    let (registry, _, _) = mcp_registry_for(&config)?;
    let redactor = daemon::redactor_for(&config);
    // What a running daemon records: its open circuits.
    let circuits = crate::guard::breaker::read_state_file(
        &config.state_dir,
        daemon::running_daemon(&config.vault),
    );
    let journal = preview_journal(&config)?;
    let vault = crate::vault::Vault::new(config.vault.clone(), config.folders.clone());
    let mut any_denied = false;
    let mut out = std::io::stdout().lock();
    for path in notes {
        let text = match std::fs::read(path).map(String::from_utf8) {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => {
                any_denied = true;
                report_unreadable(&mut out, path, "note is not UTF-8", as_json)?;
                continue;
            }
            Err(e) => {
                any_denied = true;
                report_unreadable(&mut out, path, &format!("cannot read: {e}"), as_json)?;
                continue;
            }
        };
        let parsed = parse_note(&text);
        let note = path.display().to_string();
        // The daemon's plan of this note, with the journal's facts (docs/design.md §12.1): a
        // note in Approved/ is planned as the daemon claims it from there.
        let in_approved = [path.canonicalize(), std::path::absolute(path)]
            .into_iter()
            .flatten()
            .find_map(|abs| vault.locate(&abs))
            .is_some_and(|(state, _)| state == crate::vault::State::Approved);
        let rules = Rules::for_config(&config, in_approved);
        let facts = match &journal {
            Some(j) => {
                let note_id = crate::note::frontmatter_property(&text, "tool_note");
                let questions = if config.approval_via == crate::config::ApprovalVia::Cli {
                    Facts::questions(&parsed)
                } else {
                    Vec::new()
                };
                crate::guard::dry_run::journal_facts(j, note_id, &questions)?
            }
            None => Facts::default(),
        };
        let plan = plan::plan(&parsed, &registry, &rules, &facts);
        let shown = crate::guard::dry_run::Shown {
            registry: &registry,
            redactor: &redactor,
            note: &note,
            circuits: &circuits,
            max_calls: config.max_calls_per_note,
        };
        // Every pending call, even one a dry run already previewed in the note.
        let previews = crate::guard::dry_run::previews(&shown, &parsed, &plan, &Default::default());
        any_denied |= previews.iter().any(|p| p["decision"]["action"] == "deny");
        if as_json {
            let line = json!({ "path": note, "previews": previews });
            writeln!(out, "{}", redactor.redact(&line.to_string()))?;
        } else {
            writeln!(out, "{note}: {} pending call(s)", previews.len())?;
            for p in &previews {
                let lines = crate::note::render::preview_callout(p);
                writeln!(out, "{}", redactor.redact(&lines.join("\n")))?;
            }
        }
    }
    Ok(if any_denied { 1 } else { 0 })
}

/// The journal `check --preview` reads its facts from, opened only when the vault has one:
/// previewing a note must not create a state dir.
pub(super) fn preview_journal(config: &Config) -> Result<Option<crate::journal::Journal>> {
    if !config.state_dir.join(crate::state::JOURNAL_FILE).exists() {
        return Ok(None);
    }
    Ok(Some(open_journal(config)?))
}

pub(super) fn report_unreadable(
    out: &mut impl Write,
    path: &Path,
    message: &str,
    as_json: bool,
) -> Result<()> {
    if as_json {
        let line = json!({ "path": path.display().to_string(), "calls": [], "error": { "code": "UNREADABLE", "message": message } });
        writeln!(out, "{line}")?;
    } else {
        writeln!(
            out,
            "{}: {message}",
            escape_controls(&path.display().to_string())
        )?;
    }
    Ok(())
}
