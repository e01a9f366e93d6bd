//! `vaultd approve NOTE` and `vaultd reject NOTE`.

use super::{GlobalArgs, escape_controls, load, resolve_note};
use crate::daemon;
use crate::journal::Decision;
use anyhow::Result;
use serde_json::Value;
use std::io::Write;
use std::path::Path;

/// `vaultd approve` / `vaultd reject`: prints each decided call and where the note went.
pub(super) fn decide(g: &GlobalArgs, note: &Path, decision: Decision) -> Result<i32> {
    use crate::vault::State;
    let (config, _) = load(g)?;
    let note = &resolve_note(&config, note, &[State::PendingApproval, State::Approved])?;
    let outcome = match decision {
        Decision::Approved => crate::approval::approve(&config, note)?,
        Decision::Rejected => crate::approval::reject(&config, note)?,
    };
    let mut out = std::io::stdout().lock();
    for c in &outcome.decided {
        writeln!(
            out,
            "{} {} {} {}",
            decision.as_str(),
            c.call_id,
            c.name,
            Value::Object(c.parameters.clone())
        )?;
        if let Some(answer) = &c.answer {
            writeln!(out, "  with the answer {answer}")?;
        }
    }
    for id in &outcome.changed {
        writeln!(
            out,
            "not approved {id}: its parameters changed after the question was written; vaultd asks again"
        )?;
    }
    let daemon_note = match (decision, daemon::running_daemon(&config.vault)) {
        (Decision::Approved, Some(_)) if outcome.was_in_approved => {
            "; the running daemon sends it at its next full scan (rescan_interval)"
        }
        (Decision::Approved, Some(_)) => "; the running daemon sends it now",
        (Decision::Approved, None) => {
            "; it runs when vaultd next runs (`vaultd run` or `vaultd once`)"
        }
        (Decision::Rejected, _) => "",
    };
    writeln!(
        out,
        "note is now {}{daemon_note}",
        escape_controls(&outcome.note)
    )?;
    Ok(0)
}
