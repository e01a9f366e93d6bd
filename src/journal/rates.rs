//! Rate limits (docs/design.md §5): counted from the start records in `calls`, checked and recorded
//! in one transaction so two calls cannot both take the last slot.

use super::Wait;
use super::calls::{insert_start, needs_durable_start};
use super::{Failure, Journal, JournalError, RunRef, Tx, from_ms, now_ms, query_one, to_ms};
use crate::call::Effect;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
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
        run: impl Into<RunRef>,
        call_id: &str,
        tool: &str,
        effect: Effect,
        params: &Value,
        limits: &[RateWindow],
    ) -> Result<StartAdmission, JournalError> {
        match self.start_or_admit(run.into(), call_id, tool, effect, params, limits, None)? {
            None => Ok(StartAdmission::Started),
            Some((Wait::Executed, admit)) => self.write_executed(admit),
            Some((_, admit)) => self.write(admit),
        }
    }

    /// [`call_started_within`](Self::call_started_within) for async callers (the runner).
    /// `spend`: the parameters hash of the approval this start acts on, consumed in the same
    /// transaction (admitted or rate limited), so a crash can neither spend a decision whose
    /// call never started nor start a call whose decision is still there to be used again.
    #[allow(clippy::too_many_arguments)]
    pub async fn call_started_within_async(
        &self,
        run: RunRef,
        call_id: &str,
        tool: &str,
        effect: Effect,
        params: &Value,
        limits: &[RateWindow],
        spend: Option<&str>,
    ) -> Result<StartAdmission, JournalError> {
        match self.start_or_admit(run, call_id, tool, effect, params, limits, spend)? {
            None => Ok(StartAdmission::Started),
            Some((wait, admit)) => self.write_async(wait, admit).await,
        }
    }

    /// What both `call_started_within*` do before the writer decides: `None` when the call
    /// has started without it, else the admission it must decide and what to wait for.
    ///
    /// A `read_only` call whose windows have room to spare ([`RateRoom::admit`]) starts
    /// without asking the writer: its insert is queued, not waited for. So does one with no
    /// limit to check. The writer decides a side effect's start, an approval to spend, a
    /// window not counted yet or more than half full, and a start the full queue refused.
    #[allow(clippy::too_many_arguments)]
    fn start_or_admit(
        &self,
        run: RunRef,
        call_id: &str,
        tool: &str,
        effect: Effect,
        params: &Value,
        limits: &[RateWindow],
        spend: Option<&str>,
    ) -> Result<Option<(Wait, TxJob<StartAdmission>)>, JournalError> {
        if !needs_durable_start(effect) && !limits.is_empty() && spend.is_none() {
            let now = now_ms();
            let (id, name, text) = (call_id.to_owned(), tool.to_owned(), params.to_string());
            let on_room = self.room.admit(tool, limits, |held| {
                let insert = move |tx: &Tx<'_>| {
                    let inserted = tx
                        .run_of(run)
                        .and_then(|run| insert_start(tx, now, run, &id, &name, effect, &text));
                    drop(held); // counted now (or rolled back, and the counts with it)
                    inserted
                };
                matches!(
                    self.writer.try_enqueue("a read_only call's start", insert),
                    Ok(true)
                )
            });
            if on_room {
                return Ok(None);
            }
        }
        match start_write(run, call_id, tool, effect, params, limits, spend) {
            StartWrite::Queued(insert) => {
                self.write_queued("a read_only call's start", insert)?;
                Ok(None)
            }
            StartWrite::Admit(wait, admit) => Ok(Some((wait, self.room.deciding(tool, admit)))),
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
                "SELECT min(started_at_ms) FROM calls
                 WHERE tool = ?1 AND started_at_ms >= ?2 AND not_run IS NULL",
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

/// The starts of a tool since a time that its rate limits count: read from the index
/// `calls_by_tool` alone, which holds the `not_run` mark (schema version 7; `schema.rs`
/// checks the plan).
pub(super) const COUNT_SINCE: &str = "SELECT count(*) FROM calls
     WHERE tool = ?1 AND started_at_ms >= ?2 AND not_run IS NULL";

pub(super) fn count_since(tx: &Tx<'_>, tool: &str, since_ms: i64) -> rusqlite::Result<u64> {
    let n: i64 = query_one(tx, COUNT_SINCE, params![tool, since_ms], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// When `window` of `tool` frees a slot, if it is full now: with n starts in the window and
/// room for `max`, the (n - max + 1)-th oldest must leave it. In the writer, from its
/// [`RateCache`]; elsewhere counted in the table.
pub(super) fn window_reset(
    tx: &Tx<'_>,
    tool: &str,
    window: RateWindow,
    now: i64,
) -> rusqlite::Result<Option<i64>> {
    if let Some(rates) = tx.rates {
        return rates.borrow_mut().reset(tx, tool, window, now);
    }
    let length = window_ms(window);
    let since = now.saturating_sub(length);
    let used = count_since(tx, tool, since)?;
    if used < window.max {
        return Ok(None);
    }
    let offset = i64::try_from(used - window.max).unwrap_or(i64::MAX);
    let leaving: Option<i64> = query_one(
        tx,
        "SELECT started_at_ms FROM calls
         WHERE tool = ?1 AND started_at_ms >= ?2 AND not_run IS NULL
         ORDER BY started_at_ms LIMIT 1 OFFSET ?3",
        params![tool, since, offset],
        |r| r.get(0),
    )
    .optional()?;
    // No such start (max = 0): the window never frees; say one window from now.
    Ok(Some(leaving.unwrap_or(now).saturating_add(length)))
}

fn window_ms(window: RateWindow) -> i64 {
    i64::try_from(window.length.as_millis()).unwrap_or(i64::MAX)
}

/// The rate-limit windows the writer thread keeps, so that an admission costs the same however
/// many calls the window holds. It counted them (`count(*)` over the window, twice per call
/// for an hour and a day limit): a day of 100,000 calls made every admission read 200,000
/// index entries, in the one thread every journal write waits for (a CPU profile under load
/// showed a third of that thread's time with 2,000 calls in the window).
///
/// Per (tool, window length, max) it holds the start times in the window, oldest first, at
/// most the newest `max` of them: enough to decide (n ≥ max) and to name the start whose
/// leaving frees a slot (the max-th newest). It is exact, not an estimate:
/// - it is filled from the `calls` table the first time a window is asked for, inside the
///   writer's transaction (so it sees the group's own uncommitted starts), and then follows
///   every start this writer inserts ([`RateCache::started`], called by `insert_start`);
/// - whatever the writer rolls back (a failed job, a failed commit) empties it
///   ([`RateCache::clear`]), and so does a commit by another process (`PRAGMA data_version`,
///   checked at the start of every group, when the group holds the write lock), and a start
///   marked `not_run` (`calls::record_outcome`: it no longer counts);
/// - a clock stepped back past a window's start reloads that window.
#[derive(Default)]
pub(super) struct RateCache {
    data_version: Option<i64>,
    windows: HashMap<WindowKey, Starts>,
    /// Where each count is published for [`Journal::admit_on_room`].
    room: Arc<RateRoom>,
}

/// The writer's last count of each rate-limit window it keeps, published for admissions made
/// without it, and per tool the starts that count does not hold yet ([`Ahead`]).
///
/// A `read_only` start whose every window is at most half full by that count (every start
/// of the tool ahead of it in the writer's queue, admitted here or waiting for the writer's
/// decision, and itself included) is admitted at once and its insert queued, not waited for:
/// even if each start ahead of it takes a slot, the window is not full. A count only
/// overstates a window as time passes (starts leave it); this writer's inserts update it;
/// whatever voids the writer's cache (a rollback, a commit by another process seen at the
/// next group, a start marked `not_run`) voids the counts, and the writer decides alone until it has counted again. What a kill can cost is what it costs a queued
/// `read_only` start (the module doc of `journal`): a call that ran and is counted only when
/// recovery runs it again. A window near its limit is left to the writer, exact as before.
#[derive(Default)]
pub(super) struct RateRoom {
    state: Mutex<RoomState>,
    /// Starts admitted here, for tests to see that it happens.
    #[cfg(test)]
    admitted: AtomicU64,
}

#[derive(Default)]
struct RoomState {
    counted: HashMap<WindowKey, u64>,
    tools: HashMap<String, Arc<Ahead>>,
}

/// A tool's starts the writer's counts do not hold yet: admitted here and queued, and
/// admissions queued for the writer to decide. Each is taken back by its [`Held`] once its
/// job ran (or was dropped unrun).
#[derive(Default)]
struct Ahead {
    admitted: AtomicU64,
    deciding: AtomicU64,
}

/// One start counted in [`Ahead`] until dropped.
pub(super) struct Held {
    ahead: Arc<Ahead>,
    admitted: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        let n = if self.admitted {
            &self.ahead.admitted
        } else {
            &self.ahead.deciding
        };
        n.fetch_sub(1, AtomicOrdering::SeqCst);
    }
}

impl RateRoom {
    fn lock(&self) -> std::sync::MutexGuard<'_, RoomState> {
        // Plain counts inside: a panic while it was held left them consistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn ahead(st: &mut RoomState, tool: &str) -> Arc<Ahead> {
        st.tools.entry(tool.to_owned()).or_default().clone()
    }

    /// Admits a start of `tool` when, by the writer's last count, each of `limits` has room
    /// for it within half its max, every start of the tool ahead of it in the writer's queue
    /// counted too; `enqueue` must then queue its insert without waiting, and drop the
    /// [`Held`] it is given once the insert ran. Under one lock with the check, so every
    /// admission the writer may run before that insert was counted here, or is queued after
    /// it and sees it: the writer never finds a window full that this admission counted on.
    fn admit(&self, tool: &str, limits: &[RateWindow], enqueue: impl FnOnce(Held) -> bool) -> bool {
        let mut st = self.lock();
        let ahead = Self::ahead(&mut st, tool);
        let before = ahead.admitted.load(AtomicOrdering::SeqCst)
            + ahead.deciding.load(AtomicOrdering::SeqCst);
        let room = limits.iter().all(|&window| {
            let key = WindowKey {
                tool: tool.to_owned(),
                length_ms: window_ms(window),
                max: window.max,
            };
            st.counted
                .get(&key)
                .is_some_and(|&n| n.saturating_add(before + 1).saturating_mul(2) <= window.max)
        });
        if !room {
            return false;
        }
        ahead.admitted.fetch_add(1, AtomicOrdering::SeqCst);
        let queued = enqueue(Held {
            ahead,
            admitted: true,
        });
        #[cfg(test)]
        if queued {
            self.admitted.fetch_add(1, AtomicOrdering::SeqCst);
        }
        queued
    }

    /// `job`, an admission for the writer to decide, counted ahead of the writer's counts of
    /// `tool` until it ran.
    fn deciding<T: 'static>(&self, tool: &str, job: TxJob<T>) -> TxJob<T> {
        // Counted under the lock: an admission that checks after this sees it, one that
        // checked before has queued its insert ahead of this job.
        let mut st = self.lock();
        let ahead = Self::ahead(&mut st, tool);
        ahead.deciding.fetch_add(1, AtomicOrdering::SeqCst);
        drop(st);
        let held = Held {
            ahead,
            admitted: false,
        };
        Box::new(move |tx: &Tx<'_>| {
            let decided = job(tx);
            drop(held);
            decided
        })
    }

    fn counted(&self, key: &WindowKey, n: u64) {
        self.lock().counted.insert(key.clone(), n);
    }

    fn forget(&self) {
        self.lock().counted.clear();
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct WindowKey {
    tool: String,
    length_ms: i64,
    max: u64,
}

/// Start times (ms) at or after `since`, ascending, at most `max` of them (the newest).
struct Starts {
    since: i64,
    at: VecDeque<i64>,
}

impl RateCache {
    /// At the start of a group (write lock held): forgets everything if another connection
    /// committed since the last look.
    pub(super) fn check(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let version: i64 = conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get(0))?;
        if self.data_version != Some(version) {
            self.clear();
            self.data_version = Some(version);
        }
        Ok(())
    }

    /// A cache whose counts are published to `room`.
    pub(super) fn new(room: Arc<RateRoom>) -> RateCache {
        RateCache {
            room,
            ..RateCache::default()
        }
    }

    /// Forgets every window: they reload from the table when next asked for.
    pub(super) fn clear(&mut self) {
        self.windows.clear();
        self.room.forget();
    }

    /// A start of `tool` at `at` was inserted in the current transaction.
    pub(super) fn started(&mut self, tool: &str, at: i64) {
        for (key, starts) in &mut self.windows {
            if key.tool != tool || at < starts.since {
                continue;
            }
            // Usually the newest; a clock stepped back puts it in its place.
            let i = starts.at.partition_point(|&t| t <= at);
            starts.at.insert(i, at);
            while starts.at.len() as u64 > key.max {
                starts.at.pop_front();
            }
            self.room.counted(key, starts.at.len() as u64);
        }
    }

    /// [`window_reset`] from the kept window.
    fn reset(
        &mut self,
        conn: &Connection,
        tool: &str,
        window: RateWindow,
        now: i64,
    ) -> rusqlite::Result<Option<i64>> {
        let length = window_ms(window);
        let since = now.saturating_sub(length);
        let key = WindowKey {
            tool: tool.to_owned(),
            length_ms: length,
            max: window.max,
        };
        let starts = match self.windows.entry(key.clone()) {
            Entry::Occupied(e) if e.get().since <= since => e.into_mut(),
            Entry::Occupied(mut e) => {
                *e.get_mut() = load(conn, tool, since, window.max)?;
                e.into_mut()
            }
            Entry::Vacant(e) => e.insert(load(conn, tool, since, window.max)?),
        };
        while starts.at.front().is_some_and(|&t| t < since) {
            starts.at.pop_front();
        }
        starts.since = since;
        self.room.counted(&key, starts.at.len() as u64);
        if (starts.at.len() as u64) < window.max {
            return Ok(None);
        }
        // Full: the max-th newest start leaves first (none when max = 0: one window from now).
        let leaving = starts.at.front().copied().unwrap_or(now);
        Ok(Some(leaving.saturating_add(length)))
    }
}

/// The newest `max` starts of `tool` at or after `since`, from the table.
fn load(conn: &Connection, tool: &str, since: i64, max: u64) -> rusqlite::Result<Starts> {
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(
        "SELECT started_at_ms FROM calls
         WHERE tool = ?1 AND started_at_ms >= ?2 AND not_run IS NULL
         ORDER BY started_at_ms DESC LIMIT ?3",
    )?;
    let mut at = stmt
        .query_map(params![tool, since, limit], |r| r.get::<_, i64>(0))?
        .collect::<rusqlite::Result<VecDeque<i64>>>()?;
    at.make_contiguous().reverse();
    Ok(Starts { since, at })
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
    run: RunRef,
    call_id: &str,
    tool: &str,
    effect: Effect,
    params: &Value,
    limits: &[RateWindow],
    spend: Option<&str>,
) -> StartWrite {
    let (call_id, tool, params) = (call_id.to_owned(), tool.to_owned(), params.to_string());
    let (limits, spend) = (limits.to_vec(), spend.map(str::to_owned));
    let now = now_ms();
    if !needs_durable_start(effect) && limits.is_empty() {
        return StartWrite::Queued(Box::new(move |tx| {
            let run = tx.run_of(run)?;
            if let Some(hash) = &spend {
                super::approvals::spend_approval(tx, &call_id, hash, now)?;
            }
            insert_start(tx, now, run, &call_id, &tool, effect, &params)
        }));
    }
    let admit = move |tx: &Tx<'_>| {
        let run = tx.run_of(run)?;
        let (call_id, tool, params) = (call_id.as_str(), tool.as_str(), params.as_str());
        if let Some(hash) = &spend {
            super::approvals::spend_approval(tx, call_id, hash, now)?;
        }
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
    use crate::call::Effect;
    use crate::journal::testing::*;
    use crate::journal::*;
    use rusqlite::params;
    use serde_json::json;
    use std::sync::atomic::Ordering;
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

    /// An approved call's decision is spent in its start record's transaction: a start that
    /// is not recorded leaves the decision unspent (it was spent on its own before, so a crash
    /// or a failed start between the two lost the person's approval).
    #[tokio::test]
    async fn a_start_spends_its_approval_in_the_same_transaction() {
        use crate::journal::Decision;
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let params = json!({ "to": "x" });
        for id in ["c-1", "c-2"] {
            journal
                .record_approval("Pending_Approval/a.md", id, "h", Decision::Approved)
                .unwrap();
        }
        let start = |run: RunId, id: &'static str| {
            let (journal, params) = (&journal, params.clone());
            async move {
                journal
                    .call_started_within_async(
                        run.into(),
                        id,
                        "send_notification",
                        Effect::ExternalSideEffect,
                        &params,
                        &[],
                        Some("h"),
                    )
                    .await
            }
        };
        // A run that does not exist: the start fails, and the decision stays.
        assert!(start(run + 1000, "c-1").await.is_err());
        assert_eq!(
            journal.approval("c-1", "h").unwrap(),
            Some(Decision::Approved),
            "a start that failed spent the decision"
        );
        // A start recorded spends it.
        assert_eq!(start(run, "c-2").await.unwrap(), StartAdmission::Started);
        assert_eq!(journal.approval("c-2", "h").unwrap(), None);
        assert_eq!(journal.open_runs().unwrap()[0].calls.len(), 1);
    }

    fn hourly(max: u64) -> RateWindow {
        RateWindow {
            max,
            length: Duration::from_secs(3600),
        }
    }

    fn admit(journal: &Journal, run: RunId, id: &str, window: RateWindow) -> StartAdmission {
        journal
            .call_started_within(
                run,
                id,
                "search_web",
                Effect::ReadOnly,
                &json!({ "query": id }),
                &[window],
            )
            .unwrap()
    }

    /// The writer's window held the start; once the start is marked `not_run` the window
    /// is counted again, and the slot is free for the next call.
    #[tokio::test]
    async fn a_start_marked_not_run_frees_its_slot_in_the_writers_window() {
        use crate::call::{CallError, CallResult, ErrorCode};
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let window = hourly(1);
        assert_eq!(admit(&journal, run, "c-1", window), StartAdmission::Started);
        assert!(
            matches!(
                admit(&journal, run, "c-2", window),
                StartAdmission::RateLimited { .. }
            ),
            "the window is full"
        );
        let stopped = CallResult::failed_now(
            "c-1",
            "search_web",
            CallError::new(ErrorCode::ExecutionError, "search_web did not run: …"),
        );
        let committed = journal
            .call_not_run_later(run, &stopped, true)
            .await
            .unwrap();
        journal.settle(committed).unwrap();
        assert_eq!(admit(&journal, run, "c-3", window), StartAdmission::Started);
    }

    #[test]
    fn the_writers_windows_match_the_table_when_full() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let window = hourly(3);
        let started: Vec<_> = (0..5)
            .map(|i| admit(&journal, run, &format!("c-{i}"), window))
            .collect();
        assert_eq!(
            started
                .iter()
                .filter(|a| **a == StartAdmission::Started)
                .count(),
            3
        );
        journal.flush().unwrap();
        let oldest = journal
            .oldest_call_since("search_web", UNIX_EPOCH)
            .unwrap()
            .unwrap();
        for refused in &started[3..] {
            assert_eq!(
                *refused,
                StartAdmission::RateLimited {
                    window,
                    reset_at: oldest + Duration::from_secs(3600)
                }
            );
        }
        // A second window of the same tool is kept apart, and filled from the table.
        assert_eq!(
            admit(&journal, run, "c-5", hourly(4)),
            StartAdmission::Started
        );
        assert!(matches!(
            admit(&journal, run, "c-6", hourly(4)),
            StartAdmission::RateLimited { .. }
        ));
    }

    #[test]
    fn a_start_another_process_recorded_counts() {
        let (dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let window = hourly(2);
        // The first admission fills the writer's window (one start).
        assert_eq!(admit(&journal, run, "c-1", window), StartAdmission::Started);
        journal.flush().unwrap();
        // Another process (its own connection) records a start of the same tool.
        let other = rusqlite::Connection::open(dir.path().join("journal.sqlite")).unwrap();
        other
            .execute(
                "INSERT INTO calls (run_id, call_id, tool, effect, started_at_ms)
                 VALUES (?1, 'elsewhere', 'search_web', 'read_only', ?2)",
                params![run, super::now_ms()],
            )
            .unwrap();
        drop(other);
        // Two starts in the window: full.
        assert!(matches!(
            admit(&journal, run, "c-2", window),
            StartAdmission::RateLimited { .. }
        ));
    }

    /// Far from its limits a `read_only` start is admitted on the writer's last count without
    /// waiting for the writer; near them the writer decides, and the limit holds exactly
    /// however many calls start at once.
    #[test]
    fn starts_far_from_the_limit_need_no_writer_and_the_limit_still_holds() {
        let (_dir, journal) = fresh_journal();
        let journal = std::sync::Arc::new(journal);
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let window = hourly(40);
        // The first start is the writer's: nothing was counted yet.
        assert_eq!(
            admit(&journal, run, "first", window),
            StartAdmission::Started
        );
        assert_eq!(journal.room.admitted.load(Ordering::SeqCst), 0);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let journal = journal.clone();
                std::thread::spawn(move || {
                    (0..10)
                        .map(|i| admit(&journal, run, &format!("c-{t}-{i}"), window))
                        .filter(|a| *a == StartAdmission::Started)
                        .count()
                })
            })
            .collect();
        let started: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(
            started, 39,
            "40 starts in the hour, the first one's included"
        );
        let fast = journal.room.admitted.load(Ordering::SeqCst);
        assert!(
            (1..=19).contains(&fast),
            "up to half the window admitted without the writer: {fast}"
        );
        journal.flush().unwrap();
        assert_eq!(
            journal
                .calls_started_since("search_web", UNIX_EPOCH)
                .unwrap(),
            40
        );
    }

    #[test]
    fn a_start_rolled_back_does_not_count() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let window = hourly(2);
        assert_eq!(admit(&journal, run, "c-1", window), StartAdmission::Started);
        // A write that inserted a start and then failed: rolled back.
        let failed = journal.write(move |tx| {
            super::insert_start(
                tx,
                super::now_ms(),
                run,
                "c-gone",
                "search_web",
                Effect::ReadOnly,
                "{}",
            )?;
            Err::<(), _>(Failure::Other("failed after the insert".into()))
        });
        assert!(failed.is_err());
        assert_eq!(admit(&journal, run, "c-2", window), StartAdmission::Started);
        assert!(matches!(
            admit(&journal, run, "c-3", window),
            StartAdmission::RateLimited { .. }
        ));
    }
}
