//! `vaultd log`: the journal's calls, filtered.

use super::{GlobalArgs, escape_controls, open_journal, validated_without_secrets};
use crate::daemon;
use anyhow::{Context, Result};
use std::io::Write;

pub(super) fn log(
    g: &GlobalArgs,
    since: Option<String>,
    tool: Option<String>,
    note: Option<String>,
    limit: usize,
    as_json: bool,
) -> Result<i32> {
    let (config, _) = validated_without_secrets(g)?;
    let journal = open_journal(&config)?;
    let since = match since {
        Some(s) => {
            let d = humantime::parse_duration(&s)
                .with_context(|| format!("--since {s}: not a duration like 30m, 1h, 2days"))?;
            // Further back than the clock goes: everything.
            Some(
                std::time::SystemTime::now()
                    .checked_sub(d)
                    .unwrap_or(std::time::UNIX_EPOCH),
            )
        }
        None => None,
    };
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
