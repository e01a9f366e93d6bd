//! `vaultd log`: the journal's calls, filtered.

use super::{GlobalArgs, escape_controls, open_journal, validated_without_secrets};
use crate::daemon;
use anyhow::Result;
use std::io::Write;

pub(super) fn log(
    g: &GlobalArgs,
    since: Option<humantime::Duration>,
    tool: Option<String>,
    note: Option<String>,
    limit: usize,
    as_json: bool,
) -> Result<i32> {
    let (config, _) = validated_without_secrets(g)?;
    let journal = open_journal(&config)?;
    // Further back than the clock goes: everything.
    let since = since.map(|d| {
        std::time::SystemTime::now()
            .checked_sub(d.into())
            .unwrap_or(std::time::UNIX_EPOCH)
    });
    let entries = journal.log(&crate::journal::LogFilter {
        since,
        tool,
        note,
        limit: Some(limit),
    })?;
    // The journal holds redacted text only; the redactor here is the last line of defence.
    let redactor = daemon::redactor_for(&config);
    let mut out = std::io::stdout().lock();
    for e in entries {
        if as_json {
            writeln!(out, "{}", redactor.redact(&serde_json::to_string(&e)?))?;
        } else {
            let mut line = format!("{}  {:<10} {}", e.time, e.event, escape_controls(&e.note));
            for part in [&e.call_id, &e.tool, &e.outcome].into_iter().flatten() {
                line.push_str("  ");
                line.push_str(part);
            }
            if let Some(ms) = e.duration_ms {
                line.push_str(&format!("  {ms} ms"));
            }
            if let Some(d) = &e.detail {
                line.push_str("  ");
                line.push_str(&escape_controls(d));
            }
            writeln!(out, "{}", redactor.redact(&line))?;
        }
    }
    Ok(0)
}
