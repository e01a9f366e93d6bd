//! Rate limits (DESIGN §5): counted from the start records in `calls`, checked and recorded
//! in one transaction so two calls cannot both take the last slot.

use super::calls::{insert_start, needs_durable_start};
use super::writer::Wait;
use super::{Failure, Journal, JournalError, RunId, Tx, from_ms, now_ms, query_one, to_ms};
use crate::tools::Effect;
use rusqlite::{OptionalExtension, params};
use serde_json::Value;
use std::time::{Duration, SystemTime};

/// One rate limit of a tool: at most `max` starts within any `length` (an hour, a day).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateWindow {
    pub max: u64,
    pub length: Duration,
}

/// What [`Journal::call_started_within`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAdmission {
    /// The start is recorded: run the tool.
    Started,
    /// Nothing recorded: the window is full until `reset_at` (the RATE_LIMITED reset time).
    RateLimited {
        window: RateWindow,
        reset_at: SystemTime,
    },
}

/// Starts of one tool in the last hour and day, for `vaultd status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateUse {
    pub last_hour: u64,
    pub last_day: u64,
}

impl Journal {
    /// [`call_started`](Self::call_started) unless a rate limit of `tool` is full, checked in
    /// the same transaction so concurrent calls cannot both take the last slot. When limited,
    /// nothing is recorded; the caller records the RATE_LIMITED result with `call_finished`.
    ///
    /// Durability follows the effect as for `call_started`: a `read_only` call's admission
    /// is answered once it ran in the writer's transaction (atomic with every other start,
    /// so the count is exact), without waiting for that transaction's commit; with no limit
    /// to check, it is only queued.
    pub fn call_started_within(
        &self,
        run: RunId,
        call_id: &str,
        tool: &str,
        effect: Effect,
        params: &Value,
        limits: &[RateWindow],
    ) -> Result<StartAdmission, JournalError> {
        match start_write(run, call_id, tool, effect, params, limits) {
            StartWrite::Queued(insert) => self.queue_start(insert),
            StartWrite::Admit(Wait::Durable, admit) => self.write(admit),
            StartWrite::Admit(Wait::Executed, admit) => self.write_executed(admit),
        }
    }

    /// A `read_only` start with no limit to check: queued, not waited for.
    fn queue_start(&self, insert: TxJob<()>) -> Result<StartAdmission, JournalError> {
        self.write_queued("a read_only call's start", insert)?;
        Ok(StartAdmission::Started)
    }

    /// [`call_started_within`](Self::call_started_within) for async callers (the runner).
    pub async fn call_started_within_async(
        &self,
        run: RunId,
        call_id: &str,
        tool: &str,
        effect: Effect,
        params: &Value,
        limits: &[RateWindow],
    ) -> Result<StartAdmission, JournalError> {
        match start_write(run, call_id, tool, effect, params, limits) {
            StartWrite::Queued(insert) => self.queue_start(insert),
            StartWrite::Admit(wait, admit) => self.write_async(wait, admit).await,
        }
    }

    /// How many calls of `tool` started at or after `since`, across all runs.
    pub fn calls_started_since(&self, tool: &str, since: SystemTime) -> Result<u64, JournalError> {
        self.read(|tx| Ok(count_since(tx, tool, to_ms(since))?))
    }

    /// When the oldest call of `tool` counted since `since` started: the window frees a slot
    /// when that call leaves it.
    pub fn oldest_call_since(
        &self,
        tool: &str,
        since: SystemTime,
    ) -> Result<Option<SystemTime>, JournalError> {
        self.read(|tx| {
            let oldest: Option<i64> = query_one(
                tx,
                "SELECT min(started_at_ms) FROM calls WHERE tool = ?1 AND started_at_ms >= ?2",
                params![tool, to_ms(since)],
                |r| r.get(0),
            )?;
            Ok(oldest.map(from_ms))
        })
    }

    /// Starts of `tool` since the start of the hour and day windows, for `vaultd status`.
    pub fn rate_use(
        &self,
        tool: &str,
        hour_since: SystemTime,
        day_since: SystemTime,
    ) -> Result<RateUse, JournalError> {
        self.read(|tx| {
            Ok(RateUse {
                last_hour: count_since(tx, tool, to_ms(hour_since))?,
                last_day: count_since(tx, tool, to_ms(day_since))?,
            })
        })
    }
}

pub(super) fn count_since(tx: &Tx<'_>, tool: &str, since_ms: i64) -> rusqlite::Result<u64> {
    let n: i64 = query_one(
        tx,
        "SELECT count(*) FROM calls WHERE tool = ?1 AND started_at_ms >= ?2",
        params![tool, since_ms],
        |r| r.get(0),
    )?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// When `window` of `tool` frees a slot, if it is full now: with n starts in the window and
/// room for `max`, the (n - max + 1)-th oldest must leave it.
pub(super) fn window_reset(
    tx: &Tx<'_>,
    tool: &str,
    window: RateWindow,
    now: i64,
) -> rusqlite::Result<Option<i64>> {
    let length = i64::try_from(window.length.as_millis()).unwrap_or(i64::MAX);
    let since = now.saturating_sub(length);
    let used = count_since(tx, tool, since)?;
    if used < window.max {
        return Ok(None);
    }
    let offset = i64::try_from(used - window.max).unwrap_or(i64::MAX);
    let leaving: Option<i64> = query_one(
        tx,
        "SELECT started_at_ms FROM calls WHERE tool = ?1 AND started_at_ms >= ?2
             ORDER BY started_at_ms LIMIT 1 OFFSET ?3",
        params![tool, since, offset],
        |r| r.get(0),
    )
    .optional()?;
    // No such start (max = 0): the window never frees; say one window from now.
    Ok(Some(leaving.unwrap_or(now).saturating_add(length)))
}

/// How a call's start is written: queued (a `read_only` call with no limit to check), or an
/// admission (rate limits checked and the start inserted in one job) waited for as `Wait`.
enum StartWrite {
    Queued(TxJob<()>),
    Admit(Wait, TxJob<StartAdmission>),
}

/// A write job answering `T`.
type TxJob<T> = Box<dyn FnOnce(&Tx<'_>) -> Result<T, Failure> + Send>;

fn start_write(
    run: RunId,
    call_id: &str,
    tool: &str,
    effect: Effect,
    params: &Value,
    limits: &[RateWindow],
) -> StartWrite {
    let (call_id, tool, params) = (call_id.to_owned(), tool.to_owned(), params.to_string());
    let limits = limits.to_vec();
    let now = now_ms();
    if !needs_durable_start(effect) && limits.is_empty() {
        return StartWrite::Queued(Box::new(move |tx| {
            insert_start(tx, now, run, &call_id, &tool, effect, &params)
        }));
    }
    let admit = move |tx: &Tx<'_>| {
        let (call_id, tool, params) = (call_id.as_str(), tool.as_str(), params.as_str());
        let mut worst: Option<(RateWindow, i64)> = None;
        for &window in &limits {
            if let Some(reset_at) = window_reset(tx, tool, window, now)?
                && worst.is_none_or(|(_, r)| reset_at > r)
            {
                worst = Some((window, reset_at));
            }
        }
        match worst {
            Some((window, reset_at)) => Ok(StartAdmission::RateLimited {
                window,
                reset_at: from_ms(reset_at),
            }),
            None => {
                insert_start(tx, now, run, call_id, tool, effect, params)?;
                Ok(StartAdmission::Started)
            }
        }
    };
    let wait = if needs_durable_start(effect) {
        Wait::Durable
    } else {
        Wait::Executed
    };
    StartWrite::Admit(wait, Box::new(admit))
}

#[cfg(test)]
mod tests {
    use crate::journal::testing::*;
    use crate::journal::*;
    use crate::tools::Effect;
    use serde_json::json;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    #[test]
    fn rate_limit_counts_starts_across_runs_and_windows() {
        let (_dir, journal) = fresh_journal();
        let before_all = SystemTime::now() - Duration::from_secs(1);
        let a = journal.begin_run("In_Progress/a.md").unwrap();
        start_search(&journal, a, "c-1");
        start_search(&journal, a, "c-2");
        journal.note_moved(a, "Done/a.md", true).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let middle = SystemTime::now();
        std::thread::sleep(Duration::from_millis(20));
        let b = journal.begin_run("In_Progress/b.md").unwrap();
        start_search(&journal, b, "c-3");
        start_send(&journal, b, "c-4");
        // Results recorded without a start do not count.
        journal.call_finished(b, &invalid_params("c-5")).unwrap();
        journal.call_finished(b, &timed_out("c-3")).unwrap();

        assert_eq!(
            journal
                .calls_started_since("search_web", before_all)
                .unwrap(),
            3
        );
        assert_eq!(
            journal.calls_started_since("search_web", middle).unwrap(),
            1
        );
        assert_eq!(
            journal
                .calls_started_since("send_notification", before_all)
                .unwrap(),
            1
        );
        assert_eq!(
            journal
                .calls_started_since("search_web", SystemTime::now() + Duration::from_secs(1))
                .unwrap(),
            0
        );
        assert_eq!(
            journal.calls_started_since("unknown", before_all).unwrap(),
            0
        );

        let oldest = journal
            .oldest_call_since("search_web", before_all)
            .unwrap()
            .expect("some call");
        assert!(oldest >= before_all && oldest < middle);
        let oldest_after_middle = journal
            .oldest_call_since("search_web", middle)
            .unwrap()
            .expect("some call");
        assert!(oldest_after_middle >= middle);
        assert_eq!(
            journal
                .oldest_call_since("search_web", SystemTime::now() + Duration::from_secs(1))
                .unwrap(),
            None
        );

        assert_eq!(
            journal.rate_use("search_web", middle, before_all).unwrap(),
            RateUse {
                last_hour: 1,
                last_day: 3
            }
        );
    }

    #[test]
    fn start_within_limits_refuses_the_call_past_the_limit() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let hour = RateWindow {
            max: 2,
            length: Duration::from_secs(3600),
        };
        let day = RateWindow {
            max: 10,
            length: Duration::from_secs(86400),
        };
        let params = json!({ "query": "q" });
        let start = |id: &str| {
            journal
                .call_started_within(
                    run,
                    id,
                    "search_web",
                    Effect::ReadOnly,
                    &params,
                    &[hour, day],
                )
                .unwrap()
        };
        assert_eq!(start("c-1"), StartAdmission::Started);
        // The admission counts unflushed starts; a read sees them once flushed.
        journal.flush().unwrap();
        let first = journal
            .oldest_call_since("search_web", UNIX_EPOCH)
            .unwrap()
            .unwrap();
        assert_eq!(start("c-2"), StartAdmission::Started);
        match start("c-3") {
            StartAdmission::RateLimited { window, reset_at } => {
                assert_eq!(window, hour);
                assert_eq!(reset_at, first + Duration::from_secs(3600));
            }
            other => panic!("expected RateLimited, got {other:?}"),
        }
        // Nothing was recorded for the refused call.
        journal.flush().unwrap();
        assert_eq!(
            journal
                .calls_started_since("search_web", UNIX_EPOCH)
                .unwrap(),
            2
        );
        assert_eq!(journal.open_runs().unwrap()[0].calls.len(), 2);
        // Other tools have their own windows.
        assert_eq!(
            journal
                .call_started_within(
                    run,
                    "c-4",
                    "send_notification",
                    Effect::ExternalSideEffect,
                    &params,
                    &[hour]
                )
                .unwrap(),
            StartAdmission::Started
        );
    }
}
