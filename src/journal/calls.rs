//! The `calls` table: one row per start of a call (or per outcome recorded without a start),
//! its outcome and when its result block was written into the note (docs/design.md §9.3).

use super::events::{EventFields, event};
use super::{Committed, Wait, record_move, run_note};
use super::{
    Failure, Journal, JournalError, RunId, Tx, attach, exec, from_ms, from_ns, now_ms, query_one,
    to_ms, to_ns, undo,
};
use crate::call::Effect;
use crate::call::{CallError, CallResult, ToolOutput, UndoRecord};
use rusqlite::{OptionalExtension, params};
use serde_json::Value;
use std::time::SystemTime;

/// Where a call of a run got to before the daemon stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum CallProgress {
    /// Start committed, no outcome: a read_only call runs again, a side effect is UNKNOWN_OUTCOME.
    Started,
    /// Outcome recorded, not yet written into the note.
    Finished(CallResult),
    /// Result block written into the note.
    Written,
}

#[derive(Debug, Clone, PartialEq)]
pub struct JournalCall {
    pub call_id: String,
    pub tool: String,
    /// The effect recorded when the call started: recovery decides by it, never by what the
    /// registry says now (§9.3). A call whose outcome was recorded without it ever starting
    /// (validation, policy, quota, rate limit) did nothing to the world and is `ReadOnly`.
    pub effect: Effect,
    pub progress: CallProgress,
    /// The recorded outcome, also once written (a stale copy of the note gets it, §9.6).
    pub recorded: Option<CallResult>,
    /// When its newest start was recorded, if it started.
    pub started_at: Option<SystemTime>,
    /// The current path of the note of the run it started in (for "already sent … from").
    pub note: String,
    /// Its newest start was stopped before its tool ran (`runner::BeforeRun`): it did
    /// nothing, and counts against no rate limit or budget.
    pub not_run: bool,
}

impl Journal {
    /// Records that a call is about to run. `params` are stored as given: the caller redacts
    /// them. A call with effects is committed before this returns: only then may the tool
    /// run. A `read_only` call's start is queued for the next group commit and not waited
    /// for (see the module doc: a crash runs it again).
    pub fn call_started(
        &self,
        run: RunId,
        call_id: &str,
        tool: &str,
        effect: Effect,
        params: &Value,
    ) -> Result<(), JournalError> {
        let (call_id, tool, params) = (call_id.to_owned(), tool.to_owned(), params.to_string());
        let now = now_ms();
        let start = move |tx: &Tx<'_>| insert_start(tx, now, run, &call_id, &tool, effect, &params);
        if needs_durable_start(effect) {
            self.write(start)
        } else {
            self.write_queued("a read_only call's start", start)
        }
    }

    /// Records a call's outcome. A call that never started (validation, policy, quota, rate
    /// limit) gets a row of its own that rate limits do not count.
    pub fn call_finished(&self, run: RunId, result: &CallResult) -> Result<(), JournalError> {
        let outcome = EncodedOutcome::new(result).map_err(|e| attach(self.path(), e))?;
        self.write(move |tx| record_outcome(tx, run, &outcome))
    }

    /// [`call_finished`](Self::call_finished) for async callers (the runner).
    pub async fn call_finished_async(
        &self,
        run: RunId,
        result: &CallResult,
    ) -> Result<(), JournalError> {
        let outcome = EncodedOutcome::new(result).map_err(|e| attach(self.path(), e))?;
        self.write_async(Wait::Recorded, move |tx| record_outcome(tx, run, &outcome))
            .await
    }

    /// [`call_finished_async`](Self::call_finished_async) for the runner: queued, and
    /// returned at once. The results write [`settle`](Self::settle)s it once the note's new
    /// text is written and fsynced to its temp file, before that replaces the note
    /// (`note::update_note_settling`): a result block is never in the note before its outcome
    /// is in the journal, and the commit's fsync overlaps the temp file's. `durable` (a side
    /// effect's outcome): the settle waits for the commit's fsync; else for the commit
    /// ("Per-effect durability" above).
    pub async fn call_finished_later(
        &self,
        run: RunId,
        result: &CallResult,
        durable: bool,
    ) -> Result<Committed, JournalError> {
        let outcome = EncodedOutcome::new(result).map_err(|e| attach(self.path(), e))?;
        self.outcome_later(run, outcome, durable).await
    }

    /// [`call_finished_later`](Self::call_finished_later) for a call stopped after its start
    /// record and before its tool ran (the identity stamp it waited for failed:
    /// `runner::BeforeRun`): its start then counts against neither its rate limit nor its
    /// note's budget. The outcome stays with the start, so a copy of the note gets it, not
    /// `UNKNOWN_OUTCOME` (docs/design.md §9.10).
    pub async fn call_not_run_later(
        &self,
        run: RunId,
        result: &CallResult,
        durable: bool,
    ) -> Result<Committed, JournalError> {
        let mut outcome = EncodedOutcome::new(result).map_err(|e| attach(self.path(), e))?;
        outcome.not_run = true;
        self.outcome_later(run, outcome, durable).await
    }

    async fn outcome_later(
        &self,
        run: RunId,
        outcome: EncodedOutcome,
        durable: bool,
    ) -> Result<Committed, JournalError> {
        let wait = if durable {
            Wait::Recorded
        } else {
            Wait::Committed
        };
        self.writer
            .submit_later(wait, move |tx| record_outcome(tx, run, &outcome))
            .await
            .map(Committed)
            .map_err(|e| self.failed(e))
    }

    /// Waits (blocking) for an outcome queued by
    /// [`call_finished_later`](Self::call_finished_later) to commit.
    pub fn settle(&self, committed: Committed) -> Result<(), JournalError> {
        committed.0.wait().map_err(|e| self.failed(e))
    }

    /// [`settle`](Self::settle)s each of `committed`; a failed commit is logged (its result
    /// stands: the call ran).
    pub fn settle_all(&self, committed: impl IntoIterator<Item = Committed>) {
        for c in committed {
            if let Err(e) = self.settle(c) {
                tracing::error!("journal could not record an outcome: {e}");
            }
        }
    }

    /// [`call_finished`](Self::call_finished) for many results in one transaction: the
    /// results of calls that never started (validation, policy, quota), which need no
    /// durability of their own before the note is written.
    pub fn calls_finished(&self, run: RunId, results: &[CallResult]) -> Result<(), JournalError> {
        if results.is_empty() {
            return Ok(());
        }
        let outcomes = results
            .iter()
            .map(EncodedOutcome::new)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| attach(self.path(), e))?;
        self.write(move |tx| {
            for outcome in &outcomes {
                record_outcome(tx, run, outcome)?;
            }
            Ok(())
        })
    }

    /// Records that the result blocks of `call_ids` are in the note. Ids without a recorded
    /// outcome are skipped with a warning: there is nothing of theirs that was written.
    pub fn results_written(&self, run: RunId, call_ids: &[&str]) -> Result<(), JournalError> {
        let call_ids = owned_ids(call_ids);
        self.write(move |tx| mark_written(tx, run, &call_ids))
    }

    /// [`results_written`](Self::results_written) and [`note_moved`](Self::note_moved) in one
    /// transaction (one fsync): the note's own result blocks are the truth about what is
    /// written, so the "written" mark need not be durable before the move.
    pub fn written_and_moved(
        &self,
        run: RunId,
        call_ids: &[&str],
        to: &str,
        ends_run: bool,
    ) -> Result<(), JournalError> {
        let (call_ids, to) = (owned_ids(call_ids), to.to_owned());
        // Not waited for, not even to run: the note itself is the record (`journal/mod.rs`,
        // "Durability soon"); an error is logged by the writer, which also notes a storage
        // failure (§9.12). A later look at the note that needs the record flushes first
        // (`identify`).
        self.write_queued("the written results and the note's move", move |tx| {
            mark_written(tx, run, &call_ids)?;
            record_move(tx, run, &to, ends_run)
        })
    }

    /// Every call the journal holds for the note `note_id`, across all its runs, each at the
    /// progress of its newest row (docs/design.md §9.3).
    pub fn note_calls(&self, note_id: &str) -> Result<Vec<JournalCall>, JournalError> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT c.call_id, c.tool, c.effect, c.result_json, c.written_at_ms,
                        c.started_at_ms, r.note, c.not_run
                 FROM calls c JOIN runs r ON r.id = c.run_id
                 WHERE r.note_id = ?1 ORDER BY c.id",
            )?;
            let rows = stmt.query_map(params![note_id], call_row)?;
            collect_calls(rows)
        })
    }

    /// How many calls have started for the note `note_id`, across all its runs (the note
    /// budget, docs/design.md §12.2).
    pub fn calls_started_for_note(&self, note_id: &str) -> Result<u64, JournalError> {
        self.read(|tx| {
            let n: i64 = query_one(
                tx,
                "SELECT count(*) FROM calls c JOIN runs r ON r.id = c.run_id
                 WHERE r.note_id = ?1 AND c.started_at_ms IS NOT NULL AND c.not_run IS NULL",
                params![note_id],
                |r| r.get(0),
            )?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }
}

/// Whether a call's start record must be on disk before the tool runs (module doc, "Per-effect
/// durability"): decided by the effect, so a `read_only` call never waits for an fsync.
pub(super) fn needs_durable_start(effect: Effect) -> bool {
    match effect {
        Effect::ReadOnly => false,
        Effect::StateChange | Effect::ExternalSideEffect => true,
    }
}

fn owned_ids(call_ids: &[&str]) -> Vec<String> {
    call_ids.iter().map(|id| id.to_string()).collect()
}

/// A call's outcome as its row stores it, encoded on the caller's thread so that the writer
/// thread, which every note's writes go through, only runs SQL.
pub(super) struct EncodedOutcome {
    call_id: String,
    name: String,
    /// `calls.result_json`.
    stored: String,
    /// None when ok.
    error_code: Option<&'static str>,
    message: Option<String>,
    ended_ms: i64,
    duration_ms: u64,
    /// A vault change to confirm in the same transaction (docs/design.md §11.3).
    undo: Option<UndoRecord>,
    /// The call was stopped after its start and before its tool ran: its start is marked
    /// (`calls.not_run`), and counts against neither its rate limit nor its note's budget.
    not_run: bool,
}

impl EncodedOutcome {
    fn new(result: &CallResult) -> Result<EncodedOutcome, Failure> {
        let stored = serde_json::to_string(&StoredResult::from_result(result))
            .map_err(|e| Failure::Other(format!("cannot encode result: {e}")))?;
        let (error_code, message, undo) = match &result.outcome {
            Ok(out) => (None, None, out.undo.clone()),
            Err(e) => (Some(e.code.as_str()), Some(e.message.clone()), None),
        };
        Ok(EncodedOutcome {
            call_id: result.call_id.clone(),
            name: result.name.clone(),
            stored,
            error_code,
            message,
            ended_ms: to_ms(result.ended_at),
            duration_ms: result.duration_ms(),
            undo,
            not_run: false,
        })
    }
}

/// Records one call's outcome (see [`Journal::call_finished`]).
pub(super) fn record_outcome(
    tx: &Tx<'_>,
    run: RunId,
    result: &EncodedOutcome,
) -> Result<(), Failure> {
    let note = run_note(tx, run)?;
    let (stored, error_code, ended) = (&result.stored, result.error_code, result.ended_ms);
    let (outcome, message) = (error_code.unwrap_or("ok"), &result.message);
    // The outcome belongs to the newest start of the call, if that one has none yet;
    // otherwise (never started, or an outcome already recorded) it is a row of its own.
    let newest: Option<(i64, bool)> = query_one(
        tx,
        "SELECT id, result_json IS NULL FROM calls WHERE run_id = ?1 AND call_id = ?2
             ORDER BY id DESC LIMIT 1",
        params![run, result.call_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()?;
    let unfinished = newest.and_then(|(id, open)| open.then_some(id));
    match unfinished {
        Some(id) => {
            exec(
                tx,
                "UPDATE calls SET ended_at_ms = ?1, result_json = ?2, error_code = ?3
                 WHERE id = ?4",
                params![ended, stored, error_code, id],
            )?;
            // A statement of its own: one that set `not_run` for every outcome would rewrite
            // the rate limits' index entry (it holds the column) of every call.
            if result.not_run {
                exec(
                    tx,
                    "UPDATE calls SET not_run = 1 WHERE id = ?1",
                    params![id],
                )?;
                // The writer's counts held this start: they are counted again when next asked.
                if let Some(rates) = tx.rates {
                    rates.borrow_mut().clear();
                }
            }
        }
        None => {
            exec(
                tx,
                "INSERT INTO calls (run_id, call_id, tool, ended_at_ms, result_json, error_code)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![run, result.call_id, result.name, ended, stored, error_code],
            )?;
        }
    }
    if let Some(record) = &result.undo {
        undo::confirm(tx, &result.call_id, &note, &result.name, record)?;
    }
    let fields = EventFields {
        call_id: Some(&result.call_id),
        tool: Some(&result.name),
        outcome: Some(outcome),
        duration_ms: Some(result.duration_ms),
        detail: message.as_deref(),
    };
    event(tx, now_ms(), "call_end", Some(run), &note, &fields)
}

/// Marks the newest recorded outcome of each call as written into the note: of the note
/// (by its id, whichever run recorded it, §9.3), or of the run for a note without an id.
pub(super) fn mark_written(tx: &Tx<'_>, run: RunId, call_ids: &[String]) -> Result<(), Failure> {
    let note = run_note(tx, run)?;
    let note_id: Option<String> = query_one(
        tx,
        "SELECT note_id FROM runs WHERE id = ?1",
        params![run],
        |r| r.get(0),
    )?;
    let now = now_ms();
    for call_id in call_ids {
        let row: Option<(i64, String)> = match &note_id {
            Some(id) => query_one(
                tx,
                "SELECT c.id, c.tool FROM calls c JOIN runs r ON r.id = c.run_id
                 WHERE r.note_id = ?1 AND c.call_id = ?2 AND c.result_json IS NOT NULL
                 ORDER BY c.id DESC LIMIT 1",
                params![id, call_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            ),
            None => query_one(
                tx,
                "SELECT id, tool FROM calls WHERE run_id = ?1 AND call_id = ?2
                     AND result_json IS NOT NULL ORDER BY id DESC LIMIT 1",
                params![run, call_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            ),
        }
        .optional()?;
        let Some((id, tool)) = row else {
            tracing::warn!(
                run,
                call_id,
                "journal: result written without a recorded outcome"
            );
            continue;
        };
        exec(
            tx,
            "UPDATE calls SET written_at_ms = ?1 WHERE id = ?2",
            params![now, id],
        )?;
        let fields = EventFields {
            call_id: Some(call_id.as_str()),
            tool: Some(&tool),
            ..EventFields::default()
        };
        event(tx, now, "written", Some(run), &note, &fields)?;
    }
    Ok(())
}

pub(super) fn insert_start(
    tx: &Tx<'_>,
    now: i64,
    run: RunId,
    call_id: &str,
    tool: &str,
    effect: Effect,
    params_json: &str,
) -> Result<(), Failure> {
    let note = run_note(tx, run)?;
    exec(
        tx,
        "INSERT INTO calls (run_id, call_id, tool, effect, params_json, started_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![run, call_id, tool, effect.as_str(), params_json, now],
    )?;
    if let Some(rates) = tx.rates {
        rates.borrow_mut().started(tool, now);
    }
    let fields = EventFields {
        call_id: Some(call_id),
        tool: Some(tool),
        ..EventFields::default()
    };
    event(tx, now, "call_start", Some(run), &note, &fields)
}

/// The calls of one run in order of first appearance, each at the progress of its newest row.
pub(super) fn run_calls(tx: &Tx<'_>, run: RunId) -> Result<Vec<JournalCall>, Failure> {
    let mut stmt = tx.prepare_cached(
        "SELECT c.call_id, c.tool, c.effect, c.result_json, c.written_at_ms, c.started_at_ms,
                r.note, c.not_run
         FROM calls c JOIN runs r ON r.id = c.run_id WHERE c.run_id = ?1 ORDER BY c.id",
    )?;
    let rows = stmt.query_map(params![run], call_row)?;
    collect_calls(rows)
}

pub(super) type CallRow = (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    String,
    Option<i64>,
);

pub(super) fn call_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CallRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
    ))
}

/// Calls in order of first appearance, each at the progress of its newest row.
pub(super) fn collect_calls(
    rows: impl Iterator<Item = rusqlite::Result<CallRow>>,
) -> Result<Vec<JournalCall>, Failure> {
    let mut calls: Vec<JournalCall> = Vec::new();
    for row in rows {
        let (call_id, tool, effect, result, written, started, note, not_run) = row?;
        let effect = match effect.as_deref() {
            None => Effect::ReadOnly,
            Some(text) => Effect::parse(text)
                .ok_or_else(|| Failure::Other(format!("unknown effect {text:?}")))?,
        };
        let recorded = result
            .map(|json| decode_result(&call_id, &tool, &json))
            .transpose()?;
        let progress = match (&recorded, written) {
            (_, Some(_)) => CallProgress::Written,
            (Some(r), None) => CallProgress::Finished(r.clone()),
            (None, None) => CallProgress::Started,
        };
        let call = JournalCall {
            call_id,
            tool,
            effect,
            progress,
            recorded,
            started_at: started.map(from_ms),
            note,
            not_run: not_run.is_some(),
        };
        match calls.iter_mut().find(|c| c.call_id == call.call_id) {
            Some(earlier) => *earlier = call,
            None => calls.push(call),
        }
    }
    Ok(calls)
}

/// `calls.result_json`: a [`CallResult`] with its times in nanoseconds, so it comes back
/// exactly as it went in.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct StoredResult {
    name: String,
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<CallError>,
    started_at_ns: i64,
    ended_at_ns: i64,
}

impl StoredResult {
    fn from_result(result: &CallResult) -> StoredResult {
        let (data, summary, error) = match &result.outcome {
            Ok(out) => (Some(out.data.clone()), Some(out.summary.clone()), None),
            Err(e) => (None, None, Some(e.clone())),
        };
        StoredResult {
            name: result.name.clone(),
            ok: result.outcome.is_ok(),
            data,
            summary,
            error,
            started_at_ns: to_ns(result.started_at),
            ended_at_ns: to_ns(result.ended_at),
        }
    }
}

pub(super) fn decode_result(call_id: &str, tool: &str, json: &str) -> Result<CallResult, Failure> {
    let bad = |why: String| Failure::Other(format!("result of call {call_id} ({tool}): {why}"));
    let stored: StoredResult = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    let outcome = match (stored.ok, stored.error) {
        (true, _) => Ok(ToolOutput {
            data: stored.data.unwrap_or(Value::Null),
            summary: stored.summary.unwrap_or_default(),
            undo: None,
        }),
        (false, Some(error)) => Err(error),
        (false, None) => return Err(bad("failed without an error".to_string())),
    };
    Ok(CallResult {
        call_id: call_id.to_string(),
        name: stored.name,
        outcome,
        started_at: from_ns(stored.started_at_ns),
        ended_at: from_ns(stored.ended_at_ns),
    })
}

#[cfg(test)]
mod tests {
    use crate::call::Effect;
    use crate::call::{CallError, CallResult, ErrorCode};
    use crate::journal::testing::*;
    use crate::journal::*;

    /// A call stopped after its start and before its tool ran is marked: its start counts
    /// against neither the rate limit nor the note's budget, and its outcome stays with it,
    /// for a copy of the note to get (§9.10). Another start of the same tool still counts.
    #[tokio::test]
    async fn a_call_stopped_before_its_run_counts_against_no_limit_and_keeps_its_outcome() {
        let (_dir, journal) = fresh_journal();
        let run = journal
            .begin_note_run("In_Progress/a.md", Some("n-a"), None, None)
            .unwrap();
        let params = serde_json::json!({});
        for id in ["c-stopped", "c-ran"] {
            journal
                .call_started(
                    run,
                    id,
                    "send_notification",
                    Effect::ExternalSideEffect,
                    &params,
                )
                .unwrap();
        }
        let stopped = CallResult::failed_now(
            "c-stopped",
            "send_notification",
            CallError::new(
                ErrorCode::ExecutionError,
                "send_notification did not run: …",
            ),
        );
        let committed = journal
            .call_not_run_later(run, &stopped, true)
            .await
            .unwrap();
        journal.settle(committed).unwrap();
        let since = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        let used = journal.rate_use("send_notification", since, since).unwrap();
        assert_eq!(
            (used.last_hour, used.last_day),
            (1, 1),
            "the start that ran counts"
        );
        assert_eq!(journal.calls_started_for_note("n-a").unwrap(), 1);
        let calls = journal.note_calls("n-a").unwrap();
        let kept = calls.iter().find(|c| c.call_id == "c-stopped").unwrap();
        assert!(kept.started_at.is_some(), "{kept:?}");
        assert!(
            matches!(kept.progress, CallProgress::Finished(_)),
            "{kept:?}"
        );
    }

    /// A `read_only` outcome is queued and returned at once, while the writer is busy; it is
    /// in the journal once settled (the write back settles it before the note's move).
    #[tokio::test]
    async fn a_read_only_outcome_is_returned_before_its_commit_and_found_once_settled() {
        let (_dir, journal) = fresh_journal();
        let run = journal
            .begin_note_run("In_Progress/a.md", Some("n-a"), None, None)
            .unwrap();
        // The writer is held inside a job until `release` is sent.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (inside, entered) = std::sync::mpsc::channel::<()>();
        journal
            .write_queued("held", move |_tx| {
                inside.send(()).unwrap();
                held.recv().unwrap();
                Ok(())
            })
            .unwrap();
        entered.recv().unwrap();
        let committed = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            journal.call_finished_later(run, &search_ok("c-1"), false),
        )
        .await
        .expect("returned while the writer was busy: not waited for")
        .unwrap();
        release.send(()).unwrap();
        journal.settle(committed).unwrap();
        let calls = journal.note_calls("n-a").unwrap();
        let c1 = calls.iter().find(|c| c.call_id == "c-1").expect("recorded");
        assert!(c1.recorded.is_some(), "its outcome is in the journal");
    }

    #[test]
    fn calls_are_found_by_note_id_across_runs_and_paths() {
        let (_dir, journal) = fresh_journal();
        let r1 = journal
            .begin_note_run(
                "In_Progress/a.md",
                Some("n-a"),
                Some("Needs_Action/a.md"),
                None,
            )
            .unwrap();
        start_send(&journal, r1, "c-send");
        journal.abandon_run(r1, "moved by hand").unwrap();
        let mut sent = search_ok("c-send");
        sent.name = "send_notification".into();
        journal.call_finished(r1, &sent).unwrap();
        // Back under another name, another run: the outcome is the note's.
        let r2 = journal
            .begin_note_run(
                "In_Progress/b.md",
                Some("n-a"),
                Some("Needs_Action/b.md"),
                None,
            )
            .unwrap();
        let calls = journal.note_calls("n-a").unwrap();
        assert_eq!(calls.len(), 1);
        assert!(matches!(calls[0].progress, CallProgress::Finished(_)));
        assert_eq!(
            calls[0].effect,
            Effect::ExternalSideEffect,
            "the effect recorded at start"
        );
        journal.results_written(r2, &["c-send"]).unwrap();
        let calls = journal.note_calls("n-a").unwrap();
        assert_eq!(calls[0].progress, CallProgress::Written);
        assert!(calls[0].recorded.is_some(), "kept for stale copies");
        assert_eq!(journal.calls_started_for_note("n-a").unwrap(), 1);
        assert_eq!(journal.calls_started_for_note("n-b").unwrap(), 0);
        let claim = journal
            .last_claim_from("Needs_Action/a.md")
            .unwrap()
            .unwrap();
        assert_eq!(claim.note_id, "n-a");
        assert_eq!(
            journal.note_path("n-a").unwrap().as_deref(),
            Some("In_Progress/b.md")
        );
        assert!(
            journal
                .last_claim_from("Needs_Action/c.md")
                .unwrap()
                .is_none()
        );
        journal
            .begin_note_run(
                "In_Progress/a.md",
                Some("n-c"),
                Some("Needs_Action/a.md"),
                Some(("n-a", true)),
            )
            .unwrap();
        assert_eq!(
            journal.copy_of("n-c").unwrap(),
            Some(("n-a".to_string(), true))
        );
        assert_eq!(journal.copy_of("n-a").unwrap(), None);
    }

    #[test]
    fn finished_results_round_trip_exactly() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let ok = search_ok("c-ok");
        let failed = invalid_params("c-bad");
        start_search(&journal, run, "c-ok");
        journal.call_finished(run, &ok).unwrap();
        // Never started: validation failure recorded directly.
        journal.call_finished(run, &failed).unwrap();

        let runs = journal.open_runs().unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].run_id, run);
        assert_eq!(runs[0].note, "In_Progress/a.md");
        assert_eq!(
            shape(&runs[0].calls),
            vec![
                (
                    "c-ok".to_string(),
                    "search_web".to_string(),
                    Effect::ReadOnly,
                    CallProgress::Finished(ok)
                ),
                (
                    "c-bad".to_string(),
                    "search_web".to_string(),
                    Effect::ReadOnly,
                    CallProgress::Finished(failed)
                ),
            ]
        );
    }

    #[test]
    fn progress_goes_started_finished_written() {
        let (_dir, journal) = fresh_journal();
        let note = "In_Progress/work/a.md";
        let run = journal.begin_run(note).unwrap();
        start_search(&journal, run, "c-1");
        start_send(&journal, run, "c-2");
        assert_eq!(
            progress_of(&journal, note),
            vec![
                ("c-1".into(), CallProgress::Started),
                ("c-2".into(), CallProgress::Started)
            ]
        );
        let effects: Vec<Effect> = journal.open_runs().unwrap()[0]
            .calls
            .iter()
            .map(|c| c.effect)
            .collect();
        assert_eq!(effects, vec![Effect::ReadOnly, Effect::ExternalSideEffect]);

        let result = search_ok("c-1");
        journal.call_finished(run, &result).unwrap();
        assert_eq!(
            progress_of(&journal, note),
            vec![
                ("c-1".into(), CallProgress::Finished(result)),
                ("c-2".into(), CallProgress::Started)
            ]
        );

        journal.results_written(run, &["c-1"]).unwrap();
        assert_eq!(
            progress_of(&journal, note),
            vec![
                ("c-1".into(), CallProgress::Written),
                ("c-2".into(), CallProgress::Started)
            ]
        );
    }

    #[test]
    fn written_and_moved_marks_written_and_closes_the_run_in_one_step() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        start_search(&journal, run, "c-1");
        journal.call_finished(run, &search_ok("c-1")).unwrap();
        journal
            .written_and_moved(run, &["c-1"], "Done/a.md", true)
            .unwrap();
        // Not waited for (the note is the record): reads see it once its group commits.
        journal.flush().unwrap();
        assert!(journal.open_runs().unwrap().is_empty());
        let events: Vec<(String, Option<String>)> = journal
            .log(&LogFilter::default())
            .unwrap()
            .into_iter()
            .map(|e| (e.event, e.detail))
            .collect();
        assert!(events.contains(&("written".into(), None)), "{events:?}");
        assert!(
            events.contains(&("move".into(), Some("Done/a.md".into()))),
            "{events:?}"
        );
    }

    #[test]
    fn calls_finished_records_every_result_of_the_batch() {
        let (_dir, journal) = fresh_journal();
        let note = "In_Progress/b.md";
        let run = journal.begin_run(note).unwrap();
        let batch: Vec<CallResult> = (0..3).map(|i| search_ok(&format!("c-{i}"))).collect();
        journal.calls_finished(run, &batch).unwrap();
        journal.calls_finished(run, &[]).unwrap();
        assert_eq!(
            progress_of(&journal, note),
            batch
                .iter()
                .map(|r| (r.call_id.clone(), CallProgress::Finished(r.clone())))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_call_run_again_shows_its_newest_progress_in_first_start_order() {
        let (_dir, journal) = fresh_journal();
        let note = "In_Progress/a.md";
        let run = journal.begin_run(note).unwrap();
        start_search(&journal, run, "c-1");
        start_search(&journal, run, "c-2");
        // After a crash the read_only c-1 runs again.
        start_search(&journal, run, "c-1");
        let result = search_ok("c-1");
        journal.call_finished(run, &result).unwrap();
        assert_eq!(
            progress_of(&journal, note),
            vec![
                ("c-1".into(), CallProgress::Finished(result)),
                ("c-2".into(), CallProgress::Started)
            ]
        );
        let running: Vec<_> = journal
            .running_calls()
            .unwrap()
            .into_iter()
            .map(|e| e.call_id.unwrap())
            .collect();
        assert_eq!(running, vec!["c-2".to_string()]);
    }

    #[test]
    fn unknown_outcome_recorded_on_recovery_finishes_the_started_row() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        start_send(&journal, run, "c-send");
        let unknown = CallResult::failed_now(
            "c-send",
            "send_notification",
            CallError::new(
                ErrorCode::UnknownOutcome,
                "the daemon stopped while sending",
            ),
        );
        journal.call_finished(run, &unknown).unwrap();
        let calls = &journal.open_runs().unwrap()[0].calls;
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].effect, Effect::ExternalSideEffect);
        assert_eq!(calls[0].progress, CallProgress::Finished(unknown));
        // It did start once: it counts against the rate limit once.
        assert_eq!(
            journal
                .calls_started_since("send_notification", UNIX_EPOCH)
                .unwrap(),
            1
        );
    }
}
