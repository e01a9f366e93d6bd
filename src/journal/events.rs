//! The `events` table: what `vaultd log` shows, in order, and the queries of `vaultd status`
//! (problems, recent failures, running calls).

use super::{Failure, Journal, JournalError, RunId, Tx, exec, now_ms, query_one, rfc3339, to_ms};
use rusqlite::{OptionalExtension, params};
use std::time::SystemTime;

/// One row of `vaultd log`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LogEntry {
    /// RFC 3339 UTC.
    pub time: String,
    /// claim | call_start | call_end | written | move | problem | approval
    pub event: String,
    pub note: String,
    pub call_id: Option<String>,
    pub tool: Option<String>,
    /// For call_end: "ok" or the error code. For approval: "approved" or "rejected".
    pub outcome: Option<String>,
    /// For call_end: how long the call ran. For [`Journal::running_calls`]: how long so far.
    pub duration_ms: Option<u64>,
    /// Error message, move destination, problem description, approved parameters hash.
    pub detail: Option<String>,
}

/// A failed call of `vaultd status`: the `call_end` entry (its `note` is where the call ran,
/// in In_Progress) and what tells where the note is now.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RecentFailure {
    #[serde(flatten)]
    pub entry: LogEntry,
    /// The note's `tool_note` (None in a journal older than note ids).
    pub note_id: Option<String>,
    /// The path the run last recorded for the note (its move to Failed/, say); the note may
    /// have been moved by hand since.
    pub moved_to: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct LogFilter {
    pub since: Option<SystemTime>,
    pub tool: Option<String>,
    /// Substring of the note path.
    pub note: Option<String>,
    pub limit: Option<usize>,
}

impl Journal {
    /// Records a note that could not be processed (too big, not UTF-8, unreadable). The same
    /// problem found again by a later scan, with nothing else recorded about the note in
    /// between, is not recorded twice.
    pub fn record_problem(&self, note: &str, message: &str) -> Result<(), JournalError> {
        let (note, message) = (note.to_owned(), message.to_owned());
        self.write(move |tx| {
            let (note, message) = (note.as_str(), message.as_str());
            let last: Option<(String, Option<String>)> = query_one(
                tx,
                "SELECT event, detail FROM events WHERE note = ?1 ORDER BY id DESC LIMIT 1",
                params![note],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
            if let Some((kind, detail)) = last
                && kind == "problem"
                && detail.as_deref() == Some(message)
            {
                return Ok(());
            }
            let fields = EventFields {
                detail: Some(message),
                ..EventFields::default()
            };
            event(tx, now_ms(), "problem", None, note, &fields)
        })
    }

    /// The newest `limit` problems, newest first.
    pub fn problems(&self, limit: usize) -> Result<Vec<LogEntry>, JournalError> {
        self.read(|tx| {
            let mut stmt = tx.prepare(&format!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE event = 'problem'
                 ORDER BY id DESC LIMIT ?1"
            ))?;
            let rows = stmt.query_map(params![sql_limit(Some(limit))], log_entry)?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
    }

    /// `vaultd log`: matching events oldest first; `limit` keeps the newest N.
    pub fn log(&self, filter: &LogFilter) -> Result<Vec<LogEntry>, JournalError> {
        self.read(|tx| {
            let mut stmt = tx.prepare(&format!(
                "SELECT {EVENT_COLUMNS} FROM events
                 WHERE (?1 IS NULL OR at_ms >= ?1)
                   AND (?2 IS NULL OR tool = ?2)
                   AND (?3 IS NULL OR instr(note, ?3) > 0)
                 ORDER BY id DESC LIMIT ?4"
            ))?;
            let rows = stmt.query_map(
                params![
                    filter.since.map(to_ms),
                    filter.tool,
                    filter.note,
                    sql_limit(filter.limit)
                ],
                log_entry,
            )?;
            let mut entries: Vec<LogEntry> = rows.collect::<Result<_, _>>()?;
            entries.reverse();
            Ok(entries)
        })
    }

    /// The newest `limit` call outcomes that are not ok, newest first, each with its note's
    /// id and the path its run last recorded for it (where the run moved it).
    pub fn recent_failures(&self, limit: usize) -> Result<Vec<RecentFailure>, JournalError> {
        self.read(|tx| {
            let mut stmt = tx.prepare(
                "SELECT e.at_ms, e.event, e.note, e.call_id, e.tool, e.outcome, e.duration_ms,
                        e.detail, r.note_id, r.note
                 FROM events e LEFT JOIN runs r ON r.id = e.run_id
                 WHERE e.event = 'call_end' AND coalesce(e.outcome, '') NOT IN ('ok', 'NEEDS_ANSWER')
                 ORDER BY e.id DESC LIMIT ?1",
            )?;
            let rows = stmt.query_map(params![sql_limit(Some(limit))], |r| {
                Ok(RecentFailure {
                    entry: log_entry(r)?,
                    note_id: r.get(8)?,
                    moved_to: r.get(9)?,
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
    }

    /// Calls started with no outcome yet in open runs, oldest start first, as `call_start`
    /// entries whose `duration_ms` is the time run so far.
    pub fn running_calls(&self) -> Result<Vec<LogEntry>, JournalError> {
        self.read(|tx| {
            let now = now_ms();
            let mut stmt = tx.prepare(
                "SELECT c.started_at_ms, r.note, c.call_id, c.tool
                 FROM calls c JOIN runs r ON r.id = c.run_id
                 WHERE r.ended_at_ms IS NULL AND c.started_at_ms IS NOT NULL
                   AND c.result_json IS NULL
                   AND c.id = (SELECT max(id) FROM calls l
                               WHERE l.run_id = c.run_id AND l.call_id = c.call_id)
                 ORDER BY c.started_at_ms, c.id",
            )?;
            let rows = stmt.query_map([], |r| {
                let started: i64 = r.get(0)?;
                Ok(LogEntry {
                    time: rfc3339(started),
                    event: "call_start".to_string(),
                    note: r.get(1)?,
                    call_id: Some(r.get(2)?),
                    tool: Some(r.get(3)?),
                    outcome: None,
                    duration_ms: Some(u64::try_from(now - started).unwrap_or(0)),
                    detail: None,
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
    }
}

/// The optional columns of an event row.
#[derive(Default)]
pub(super) struct EventFields<'a> {
    pub(super) call_id: Option<&'a str>,
    pub(super) tool: Option<&'a str>,
    pub(super) outcome: Option<&'a str>,
    pub(super) duration_ms: Option<u64>,
    pub(super) detail: Option<&'a str>,
}

pub(super) fn event(
    tx: &Tx<'_>,
    at_ms: i64,
    kind: &str,
    run: Option<RunId>,
    note: &str,
    f: &EventFields<'_>,
) -> Result<(), Failure> {
    let duration = f.duration_ms.map(|d| i64::try_from(d).unwrap_or(i64::MAX));
    exec(tx,
        "INSERT INTO events (at_ms, event, run_id, note, call_id, tool, outcome, duration_ms, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            at_ms, kind, run, note, f.call_id, f.tool, f.outcome, duration, f.detail
        ],
    )?;
    Ok(())
}

pub(super) const EVENT_COLUMNS: &str =
    "at_ms, event, note, call_id, tool, outcome, duration_ms, detail";

pub(super) fn log_entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<LogEntry> {
    let duration: Option<i64> = r.get(6)?;
    Ok(LogEntry {
        time: rfc3339(r.get(0)?),
        event: r.get(1)?,
        note: r.get(2)?,
        call_id: r.get(3)?,
        tool: r.get(4)?,
        outcome: r.get(5)?,
        duration_ms: duration.map(|d| u64::try_from(d).unwrap_or(0)),
        detail: r.get(7)?,
    })
}

/// SQLite's LIMIT: -1 is no limit.
pub(super) fn sql_limit(limit: Option<usize>) -> i64 {
    limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use crate::call::{CallError, CallResult, ErrorCode};
    use crate::journal::testing::*;
    use crate::journal::*;
    use std::time::{Duration, SystemTime};
    use tempfile::TempDir;

    /// Two notes, two tools, an ok call and a failure.
    fn journal_with_history() -> (TempDir, Journal, SystemTime) {
        let (dir, journal) = fresh_journal();
        let a = journal.begin_run("In_Progress/work/alpha.md").unwrap();
        start_search(&journal, a, "c-a1");
        journal.call_finished(a, &search_ok("c-a1")).unwrap();
        journal.results_written(a, &["c-a1"]).unwrap();
        journal.note_moved(a, "Done/work/alpha.md", true).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let middle = SystemTime::now();
        std::thread::sleep(Duration::from_millis(20));
        let b = journal.begin_run("In_Progress/beta.md").unwrap();
        start_send(&journal, b, "c-b1");
        journal
            .call_finished(
                b,
                &CallResult::failed_now(
                    "c-b1",
                    "send_notification",
                    CallError::new(ErrorCode::ExecutionError, "SMTP said 554"),
                ),
            )
            .unwrap();
        (dir, journal, middle)
    }

    fn kinds(entries: &[LogEntry]) -> Vec<&str> {
        entries.iter().map(|e| e.event.as_str()).collect()
    }

    #[test]
    fn log_lists_everything_oldest_first() {
        let (_dir, journal, _) = journal_with_history();
        let all = journal.log(&LogFilter::default()).unwrap();
        assert_eq!(
            kinds(&all),
            vec![
                "claim",
                "call_start",
                "call_end",
                "written",
                "move",
                "claim",
                "call_start",
                "call_end"
            ]
        );
        let end = &all[2];
        assert_eq!(end.note, "In_Progress/work/alpha.md");
        assert_eq!(end.tool.as_deref(), Some("search_web"));
        assert_eq!(end.outcome.as_deref(), Some("ok"));
        assert_eq!(end.duration_ms, Some(412));
        assert!(
            humantime::parse_rfc3339(&end.time).is_ok(),
            "RFC 3339: {}",
            end.time
        );
        let failed = &all[7];
        assert_eq!(failed.outcome.as_deref(), Some("EXECUTION_ERROR"));
        assert_eq!(failed.detail.as_deref(), Some("SMTP said 554"));
        let serialized = serde_json::to_value(end).unwrap();
        assert_eq!(serialized["event"], "call_end");
    }

    #[test]
    fn log_filters_by_tool_note_since_and_limit() {
        let (_dir, journal, middle) = journal_with_history();
        let by_tool = journal
            .log(&LogFilter {
                tool: Some("send_notification".into()),
                ..LogFilter::default()
            })
            .unwrap();
        assert_eq!(kinds(&by_tool), vec!["call_start", "call_end"]);

        // Substring, not a pattern: `_` is a literal here.
        let by_note = journal
            .log(&LogFilter {
                note: Some("work/al".into()),
                ..LogFilter::default()
            })
            .unwrap();
        assert_eq!(
            kinds(&by_note),
            vec!["claim", "call_start", "call_end", "written", "move"]
        );
        let underscore = journal
            .log(&LogFilter {
                note: Some("In_Progress/b".into()),
                ..LogFilter::default()
            })
            .unwrap();
        assert_eq!(kinds(&underscore), vec!["claim", "call_start", "call_end"]);
        let wildcard = journal
            .log(&LogFilter {
                note: Some("%".into()),
                ..LogFilter::default()
            })
            .unwrap();
        assert!(wildcard.is_empty());

        let since = journal
            .log(&LogFilter {
                since: Some(middle),
                ..LogFilter::default()
            })
            .unwrap();
        assert_eq!(kinds(&since), vec!["claim", "call_start", "call_end"]);

        let newest_two = journal
            .log(&LogFilter {
                limit: Some(2),
                ..LogFilter::default()
            })
            .unwrap();
        assert_eq!(kinds(&newest_two), vec!["call_start", "call_end"]);

        let combined = journal
            .log(&LogFilter {
                tool: Some("search_web".into()),
                note: Some("alpha".into()),
                limit: Some(1),
                since: None,
            })
            .unwrap();
        assert_eq!(kinds(&combined), vec!["written"]);
    }

    #[test]
    fn status_queries_show_failures_problems_and_running_calls() {
        let (_dir, journal, _) = journal_with_history();
        let run = journal.begin_run("In_Progress/gamma.md").unwrap();
        start_search(&journal, run, "c-g1");
        journal.call_finished(run, &timed_out("c-g2")).unwrap();

        let failures = journal.recent_failures(10).unwrap();
        let codes: Vec<_> = failures
            .iter()
            .map(|e| e.entry.outcome.clone().unwrap())
            .collect();
        assert_eq!(codes, vec!["TIMEOUT", "EXECUTION_ERROR"]);
        assert_eq!(
            failures[0].moved_to.as_deref(),
            Some("In_Progress/gamma.md")
        );
        assert_eq!(journal.recent_failures(1).unwrap().len(), 1);

        let running = journal.running_calls().unwrap();
        assert_eq!(running.len(), 1);
        assert_eq!(running[0].note, "In_Progress/gamma.md");
        assert_eq!(running[0].call_id.as_deref(), Some("c-g1"));
        assert_eq!(running[0].tool.as_deref(), Some("search_web"));
        assert!(running[0].duration_ms.is_some());

        journal
            .record_problem("Needs_Action/big.md", "over max_note_bytes (2 MB)")
            .unwrap();
        // Found again by the next scan: not recorded twice.
        journal
            .record_problem("Needs_Action/big.md", "over max_note_bytes (2 MB)")
            .unwrap();
        journal
            .record_problem("Needs_Action/bin.md", "not UTF-8")
            .unwrap();
        let problems = journal.problems(10).unwrap();
        let notes: Vec<_> = problems.iter().map(|e| e.note.as_str()).collect();
        assert_eq!(notes, vec!["Needs_Action/bin.md", "Needs_Action/big.md"]);
        assert_eq!(problems[0].detail.as_deref(), Some("not UTF-8"));
        assert_eq!(journal.problems(1).unwrap().len(), 1);
    }
}
