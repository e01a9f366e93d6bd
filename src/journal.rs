//! The journal: one SQLite file (WAL, synchronous=FULL) in the state dir recording every
//! claim, call start, call outcome, result write and move, so a daemon killed at any instant
//! restarts without losing a note, running a side effect twice or writing a result twice.
//! The only SQL in the crate lives here.
//!
//! Every method is one transaction, committed (and, with `synchronous=FULL`, on disk) before
//! it returns: a "call started" row exists before the tool runs. Methods are synchronous; the
//! daemon calls them from `spawn_blocking`. The CLI (`status`, `log`, `approve`) opens the same
//! file while the daemon runs: WAL lets it read while the daemon writes, and the 5 s busy
//! timeout plus `BEGIN IMMEDIATE` for every write serialise two writers instead of failing.
//!
//! # Tables (schema version 3, kept in `PRAGMA user_version`)
//! - `runs`: one claim of one note, from the rename into In_Progress to the move out of it.
//!   `note` is the note's *current* path, so recovery finds it where it now is; `note_id` is
//!   the note's identity (its `tool_note` property, DESIGN §9.2) and `claimed_from` the path it
//!   was claimed from (the stale-copy rule, §9.6); `copy_of` the note a stale copy stands for
//!   (kept, so a copy killed or moved mid-run still never runs that note's calls again). Version 1 journals get both columns, empty,
//!   in place; a run without a note id is given one when its note is next seen.
//!   `left_behind` (version 3) is the file key of the first name a hard-link claim keeps in
//!   Needs_Action/ for `moved_in_grace` (so `mv` of several notes never fails): recorded with
//!   the claim, it lets a restart after a crash inside that window remove the old name instead
//!   of taking it for a new note.
//!   Calls are keyed by (note id, call id) through their run: what a note's call did is known
//!   whatever path the note has now.
//! - `calls`: one row per start (or per outcome recorded without a start: validation, policy,
//!   quota, rate limit). Rate limits count rows with a `started_at_ms`. A call run again in the
//!   same run (a `read_only` call after a crash) gets a new row; the newest row per call id is
//!   its progress.
//! - `events`: what `vaultd log` shows, in order.
//! - `approvals`: `vaultd approve`/`reject` decisions, bound to the call id and the hash of the
//!   exact parameters shown.

pub mod catalog;
pub mod runners;
pub mod undo;

use crate::call::{CallError, CallResult, ToolOutput};
use crate::tools::Effect;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {source}")]
    Sqlite {
        path: std::path::PathBuf,
        source: rusqlite::Error,
    },
    #[error("journal {path}: {message}")]
    Other {
        path: std::path::PathBuf,
        message: String,
    },
}

/// One claim of one note: from the rename into In_Progress to the move out of it.
pub type RunId = i64;

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
}

/// The newest claim made from one path (DESIGN §9.6): which note it was and where it is now.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub note_id: String,
    pub claimed_at: SystemTime,
    /// The vault-relative path the note has now (as far as the journal knows).
    pub note: String,
}

/// A run whose note has not been moved out of In_Progress yet.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenRun {
    pub run_id: RunId,
    /// Vault-relative path of the note in In_Progress.
    pub note: String,
    /// The note's identity; None for a run recorded by a version 1 journal.
    pub note_id: Option<String>,
    pub calls: Vec<JournalCall>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approved,
    Rejected,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approved => "approved",
            Decision::Rejected => "rejected",
        }
    }

    fn parse(s: &str) -> Option<Decision> {
        match s {
            "approved" => Some(Decision::Approved),
            "rejected" => Some(Decision::Rejected),
            _ => None,
        }
    }
}

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

#[derive(Debug, Clone, Default)]
pub struct LogFilter {
    pub since: Option<SystemTime>,
    pub tool: Option<String>,
    /// Substring of the note path.
    pub note: Option<String>,
    pub limit: Option<usize>,
}

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

pub struct Journal {
    /// The database file, named in every error.
    path: PathBuf,
    /// One connection; the mutex makes `Journal` `Sync` and serialises this process's writes.
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

/// The schema, one entry per version; `PRAGMA user_version` says how many have been applied.
const MIGRATIONS: &[&str] = &[
    // Version 1.
    "CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        note TEXT NOT NULL,
        claimed_at_ms INTEGER NOT NULL,
        ended_at_ms INTEGER,
        final_state TEXT
    );
    CREATE INDEX runs_open ON runs (note) WHERE ended_at_ms IS NULL;

    CREATE TABLE calls (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs (id),
        call_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        effect TEXT,
        params_json TEXT,
        started_at_ms INTEGER,
        ended_at_ms INTEGER,
        result_json TEXT,
        error_code TEXT,
        written_at_ms INTEGER
    );
    CREATE INDEX calls_by_run ON calls (run_id, call_id);
    CREATE INDEX calls_by_tool ON calls (tool, started_at_ms);

    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        at_ms INTEGER NOT NULL,
        event TEXT NOT NULL,
        run_id INTEGER,
        note TEXT NOT NULL,
        call_id TEXT,
        tool TEXT,
        outcome TEXT,
        duration_ms INTEGER,
        detail TEXT
    );
    CREATE INDEX events_at ON events (at_ms);
    CREATE INDEX events_kind ON events (event, id);

    CREATE TABLE approvals (
        call_id TEXT NOT NULL,
        params_hash TEXT NOT NULL,
        note TEXT NOT NULL,
        decision TEXT NOT NULL,
        at_ms INTEGER NOT NULL,
        consumed_at_ms INTEGER,
        PRIMARY KEY (call_id, params_hash)
    );",
    // Version 2: note identity (DESIGN §9.2, §9.6).
    "ALTER TABLE runs ADD COLUMN note_id TEXT;
    ALTER TABLE runs ADD COLUMN claimed_from TEXT;
    ALTER TABLE runs ADD COLUMN copy_of TEXT;
    ALTER TABLE runs ADD COLUMN copy_within_grace INTEGER;
    CREATE INDEX runs_by_note_id ON runs (note_id);
    CREATE INDEX runs_by_claimed_from ON runs (claimed_from);",
    // Version 3: the first name a hard-link claim leaves behind for `moved_in_grace`.
    "ALTER TABLE runs ADD COLUMN left_behind TEXT;",
];

/// An error inside a transaction, before the journal's path is attached.
enum Failure {
    Sql(rusqlite::Error),
    Other(String),
}

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        Failure::Sql(e)
    }
}

type Tx<'a> = Transaction<'a>;

impl Journal {
    /// Opens (creating if needed) `state_dir/journal.sqlite` and brings its schema up to date.
    ///
    /// The journal holds what calls sent (email bodies): the state dir is created 0700 and the
    /// database 0600 whatever the umask (§9.5); SQLite gives its `-wal`/`-shm` the mode of the
    /// database. Files an older release left readable by others are narrowed.
    pub fn open(state_dir: &Path) -> Result<Journal, JournalError> {
        crate::private::create_dir(state_dir).map_err(|e| JournalError::Other {
            path: state_dir.to_path_buf(),
            message: format!("cannot create the state directory: {e}"),
        })?;
        let path = state_dir.join("journal.sqlite");
        crate::private::touch_file(&path).map_err(|e| JournalError::Other {
            path: path.clone(),
            message: format!("cannot create the journal: {e}"),
        })?;
        for suffix in ["-wal", "-shm"] {
            let mut side = path.clone().into_os_string();
            side.push(suffix);
            crate::private::narrow(Path::new(&side));
        }
        let wrap = |f: Failure| attach(&path, f);
        let mut conn = Connection::open(&path).map_err(|e| wrap(e.into()))?;
        configure(&mut conn).map_err(wrap)?;
        conn.execute_batch(catalog::TABLES)
            .map_err(|e| wrap(e.into()))?;
        undo::ensure_schema(&conn).map_err(wrap)?;
        conn.execute_batch(runners::TABLES)
            .map_err(|e| wrap(e.into()))?;
        Ok(Journal {
            path,
            conn: Mutex::new(conn),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records the claim of `note` (its vault-relative path in In_Progress).
    ///
    /// An open run already at that path is stale (its note moved out without the move being
    /// recorded, as a crash between rename and record leaves it): it is closed as
    /// `superseded`, since one path holds one note.
    pub fn begin_run(&self, note: &str) -> Result<RunId, JournalError> {
        self.begin_note_run(note, None, None, None)
    }

    /// [`begin_run`](Self::begin_run) of the note with identity `note_id`, claimed from the
    /// vault-relative path `claimed_from` (None for a note found in In_Progress); `copy_of`
    /// is the note a stale copy stands for, and whether it came within the grace (§9.6).
    pub fn begin_note_run(
        &self,
        note: &str,
        note_id: Option<&str>,
        claimed_from: Option<&str>,
        copy_of: Option<(&str, bool)>,
    ) -> Result<RunId, JournalError> {
        self.begin_claim(note, note_id, claimed_from, copy_of, None)
    }

    /// [`begin_note_run`](Self::begin_note_run) of a note claimed by hard link, whose first
    /// name (`claimed_from`) still names the file `left_behind` (a `FileKey` encoded by the
    /// vault) until the daemon drops it. Recorded with the claim, so that a restart after a
    /// crash in between knows that name for what it is: the claimed note, not a new one.
    pub fn begin_linked_run(
        &self,
        note: &str,
        note_id: &str,
        claimed_from: &str,
        copy_of: Option<(&str, bool)>,
        left_behind: &str,
    ) -> Result<RunId, JournalError> {
        self.begin_claim(
            note,
            Some(note_id),
            Some(claimed_from),
            copy_of,
            Some(left_behind),
        )
    }

    /// Names left behind by link claims since `since`: (the vault-relative name, its file
    /// key). The daemon checks them at start-up (see [`begin_linked_run`](Self::begin_linked_run)).
    pub fn left_behind_since(
        &self,
        since: SystemTime,
    ) -> Result<Vec<(String, String)>, JournalError> {
        self.read(|tx| {
            let mut st = tx.prepare_cached(
                "SELECT claimed_from, left_behind FROM runs
                 WHERE left_behind IS NOT NULL AND claimed_at_ms >= ?1",
            )?;
            let rows = st.query_map(params![to_ms(since)], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn begin_claim(
        &self,
        note: &str,
        note_id: Option<&str>,
        claimed_from: Option<&str>,
        copy_of: Option<(&str, bool)>,
        left_behind: Option<&str>,
    ) -> Result<RunId, JournalError> {
        self.write(|tx| {
            let now = now_ms();
            let stale = exec(
                tx,
                "UPDATE runs SET ended_at_ms = ?1, final_state = 'superseded'
                 WHERE note = ?2 AND ended_at_ms IS NULL",
                params![now, note],
            )?;
            if stale > 0 {
                tracing::warn!(note, "journal: closing a stale open run of the same note");
            }
            exec(
                tx,
                "INSERT INTO runs (note, claimed_at_ms, note_id, claimed_from, copy_of,
                                   copy_within_grace, left_behind)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    note,
                    now,
                    note_id,
                    claimed_from,
                    copy_of.map(|c| c.0),
                    copy_of.map(|c| c.1),
                    left_behind
                ],
            )?;
            let run = tx.last_insert_rowid();
            event(tx, now, "claim", Some(run), note, &EventFields::default())?;
            Ok(run)
        })
    }

    /// Records that a call is about to run. Committed before it returns: only then may the
    /// tool run. `params` are stored as given: the caller redacts them.
    pub fn call_started(
        &self,
        run: RunId,
        call_id: &str,
        tool: &str,
        effect: Effect,
        params: &Value,
    ) -> Result<(), JournalError> {
        self.write(|tx| insert_start(tx, now_ms(), run, call_id, tool, effect, params))
    }

    /// [`call_started`](Self::call_started) unless a rate limit of `tool` is full, checked in
    /// the same transaction so concurrent calls cannot both take the last slot. When limited,
    /// nothing is recorded; the caller records the RATE_LIMITED result with `call_finished`.
    pub fn call_started_within(
        &self,
        run: RunId,
        call_id: &str,
        tool: &str,
        effect: Effect,
        params: &Value,
        limits: &[RateWindow],
    ) -> Result<StartAdmission, JournalError> {
        self.write(|tx| {
            let now = now_ms();
            let mut worst: Option<(RateWindow, i64)> = None;
            for &window in limits {
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
        })
    }

    /// Records a call's outcome. A call that never started (validation, policy, quota, rate
    /// limit) gets a row of its own that rate limits do not count.
    pub fn call_finished(&self, run: RunId, result: &CallResult) -> Result<(), JournalError> {
        self.write(|tx| record_outcome(tx, run, result))
    }

    /// [`call_finished`](Self::call_finished) for many results in one transaction: the
    /// results of calls that never started (validation, policy, quota), which need no
    /// durability of their own before the note is written.
    pub fn calls_finished(&self, run: RunId, results: &[CallResult]) -> Result<(), JournalError> {
        if results.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            for result in results {
                record_outcome(tx, run, result)?;
            }
            Ok(())
        })
    }

    /// Records that the result blocks of `call_ids` are in the note. Ids without a recorded
    /// outcome are skipped with a warning: there is nothing of theirs that was written.
    pub fn results_written(&self, run: RunId, call_ids: &[&str]) -> Result<(), JournalError> {
        self.write(|tx| mark_written(tx, run, call_ids))
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
        self.write(|tx| {
            mark_written(tx, run, call_ids)?;
            record_move(tx, run, to, ends_run)
        })
    }

    /// Records a rename of the run's note to `to` (vault-relative). `ends_run` closes the run
    /// (Done, Failed, Rejected, Pending_Approval): a later claim of the note is a new run.
    /// Otherwise the run stays open at its new path.
    pub fn note_moved(&self, run: RunId, to: &str, ends_run: bool) -> Result<(), JournalError> {
        self.write(|tx| record_move(tx, run, to, ends_run))
    }

    /// Closes a run whose note is gone from In_Progress without a recorded move (a person
    /// moved or deleted it), recording `reason` as a problem.
    pub fn abandon_run(&self, run: RunId, reason: &str) -> Result<(), JournalError> {
        self.write(|tx| {
            let note = run_note(tx, run)?;
            let now = now_ms();
            exec(
                tx,
                "UPDATE runs SET ended_at_ms = ?1, final_state = 'abandoned'
                 WHERE id = ?2 AND ended_at_ms IS NULL",
                params![now, run],
            )?;
            let fields = EventFields {
                detail: Some(reason),
                ..EventFields::default()
            };
            event(tx, now, "problem", Some(run), &note, &fields)
        })
    }

    /// Every run not yet moved out of In_Progress, oldest first, with its calls in start order.
    pub fn open_runs(&self) -> Result<Vec<OpenRun>, JournalError> {
        self.read(|tx| {
            let runs: Vec<(RunId, String, Option<String>)> = {
                let mut stmt = tx.prepare(
                    "SELECT id, note, note_id FROM runs WHERE ended_at_ms IS NULL ORDER BY id",
                )?;
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<Result<_, _>>()?
            };
            runs.into_iter()
                .map(|(run_id, note, note_id)| {
                    Ok(OpenRun {
                        run_id,
                        note,
                        note_id,
                        calls: run_calls(tx, run_id)?,
                    })
                })
                .collect()
        })
    }

    /// The open run whose note is now at `note`, if any.
    pub fn run_for_note(&self, note: &str) -> Result<Option<OpenRun>, JournalError> {
        self.read(|tx| {
            let run: Option<(RunId, Option<String>)> = query_one(
                tx,
                "SELECT id, note_id FROM runs WHERE note = ?1 AND ended_at_ms IS NULL
                     ORDER BY id DESC LIMIT 1",
                params![note],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
            run.map(|(run_id, note_id)| {
                Ok(OpenRun {
                    run_id,
                    note: note.to_string(),
                    note_id,
                    calls: run_calls(tx, run_id)?,
                })
            })
            .transpose()
        })
    }

    /// Gives a run recorded without a note id (a version 1 journal) the identity its note now
    /// carries, so its calls are found by note id from now on.
    pub fn adopt_run(&self, run: RunId, note_id: &str) -> Result<(), JournalError> {
        self.write(|tx| {
            exec(
                tx,
                "UPDATE runs SET note_id = ?1 WHERE id = ?2 AND note_id IS NULL",
                params![note_id, run],
            )?;
            Ok(())
        })
    }

    /// Every call the journal holds for the note `note_id`, across all its runs, each at the
    /// progress of its newest row (DESIGN §9.3).
    pub fn note_calls(&self, note_id: &str) -> Result<Vec<JournalCall>, JournalError> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT c.call_id, c.tool, c.effect, c.result_json, c.written_at_ms,
                        c.started_at_ms, r.note
                 FROM calls c JOIN runs r ON r.id = c.run_id
                 WHERE r.note_id = ?1 ORDER BY c.id",
            )?;
            let rows = stmt.query_map(params![note_id], call_row)?;
            collect_calls(rows)
        })
    }

    /// How many calls have started for the note `note_id`, across all its runs (the note
    /// budget, DESIGN §12.2).
    pub fn calls_started_for_note(&self, note_id: &str) -> Result<u64, JournalError> {
        self.read(|tx| {
            let n: i64 = query_one(
                tx,
                "SELECT count(*) FROM calls c JOIN runs r ON r.id = c.run_id
                 WHERE r.note_id = ?1 AND c.started_at_ms IS NOT NULL",
                params![note_id],
                |r| r.get(0),
            )?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    /// The newest claim of a note with an identity from the vault-relative path `from`.
    pub fn last_claim_from(&self, from: &str) -> Result<Option<Claim>, JournalError> {
        self.read(|tx| {
            let row: Option<(String, i64, String)> = query_one(
                tx,
                "SELECT note_id, claimed_at_ms, note FROM runs
                 WHERE claimed_from = ?1 AND note_id IS NOT NULL ORDER BY id DESC LIMIT 1",
                params![from],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
            Ok(row.map(|(note_id, at, note)| Claim {
                note_id,
                claimed_at: from_ms(at),
                note,
            }))
        })
    }

    /// The note the note `note_id` is a stale copy of, if it is one (its first claim said so),
    /// and whether it came within the grace (DESIGN §9.6).
    pub fn copy_of(&self, note_id: &str) -> Result<Option<(String, bool)>, JournalError> {
        self.read(|tx| {
            Ok(query_one(
                tx,
                "SELECT copy_of, copy_within_grace FROM runs
                 WHERE note_id = ?1 AND copy_of IS NOT NULL ORDER BY id LIMIT 1",
                params![note_id],
                |r| Ok((r.get(0)?, r.get::<_, Option<bool>>(1)?.unwrap_or(false))),
            )
            .optional()?)
        })
    }

    /// The path the note `note_id` had at its newest run's last recorded move or claim.
    pub fn note_path(&self, note_id: &str) -> Result<Option<String>, JournalError> {
        self.read(|tx| {
            Ok(query_one(
                tx,
                "SELECT note FROM runs WHERE note_id = ?1 ORDER BY id DESC LIMIT 1",
                params![note_id],
                |r| r.get(0),
            )
            .optional()?)
        })
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

    /// Records a note that could not be processed (too big, not UTF-8, unreadable). The same
    /// problem found again by a later scan, with nothing else recorded about the note in
    /// between, is not recorded twice.
    pub fn record_problem(&self, note: &str, message: &str) -> Result<(), JournalError> {
        self.write(|tx| {
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

    /// Records a person's decision on the held call `call_id` with exactly the parameters
    /// hashed to `params_hash`. The latest decision wins.
    pub fn record_approval(
        &self,
        note: &str,
        call_id: &str,
        params_hash: &str,
        decision: Decision,
    ) -> Result<(), JournalError> {
        self.write(|tx| {
            let now = now_ms();
            exec(
                tx,
                "INSERT INTO approvals (call_id, params_hash, note, decision, at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (call_id, params_hash) DO UPDATE SET
                    note = excluded.note, decision = excluded.decision,
                    at_ms = excluded.at_ms, consumed_at_ms = NULL",
                params![call_id, params_hash, note, decision.as_str(), now],
            )?;
            let fields = EventFields {
                call_id: Some(call_id),
                outcome: Some(decision.as_str()),
                detail: Some(params_hash),
                ..EventFields::default()
            };
            event(tx, now, "approval", None, note, &fields)
        })
    }

    /// The latest unconsumed decision on `call_id` with these exact parameters.
    pub fn approval(
        &self,
        call_id: &str,
        params_hash: &str,
    ) -> Result<Option<Decision>, JournalError> {
        self.read(|tx| lookup_approval(tx, call_id, params_hash))
    }

    /// Whether `call_id` has an unconsumed `Approved` decision, whatever parameters it is bound
    /// to: the daemon then looks at the note even if the call was edited since (to ask again).
    pub fn approved_any(&self, call_id: &str) -> Result<bool, JournalError> {
        self.read(|tx| {
            Ok(tx
                .query_row(
                    "SELECT 1 FROM approvals
                     WHERE call_id = ?1 AND decision = 'approved' AND consumed_at_ms IS NULL
                     LIMIT 1",
                    params![call_id],
                    |_| Ok(()),
                )
                .optional()?
                .is_some())
        })
    }

    /// Takes the decision on `call_id` with these parameters, so it counts once: call it when
    /// the held call starts (or gets its REJECTED result). A call run again later (its result
    /// block deleted) needs a new decision.
    pub fn consume_approval(
        &self,
        call_id: &str,
        params_hash: &str,
    ) -> Result<Option<Decision>, JournalError> {
        self.write(|tx| {
            let decision = lookup_approval(tx, call_id, params_hash)?;
            if decision.is_some() {
                exec(
                    tx,
                    "UPDATE approvals SET consumed_at_ms = ?1
                     WHERE call_id = ?2 AND params_hash = ?3",
                    params![now_ms(), call_id, params_hash],
                )?;
            }
            Ok(decision)
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

    /// The newest `limit` call outcomes that are not ok, newest first.
    pub fn recent_failures(&self, limit: usize) -> Result<Vec<LogEntry>, JournalError> {
        self.read(|tx| {
            let mut stmt = tx.prepare(&format!(
                "SELECT {EVENT_COLUMNS} FROM events
                 WHERE event = 'call_end' AND outcome IS NOT 'ok'
                 ORDER BY id DESC LIMIT ?1"
            ))?;
            let rows = stmt.query_map(params![sql_limit(Some(limit))], log_entry)?;
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

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while the lock was held dropped its transaction, which rolled back: the
        // connection is fine to use again.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One write transaction, `BEGIN IMMEDIATE` so a second writer waits for the busy timeout
    /// instead of failing when it upgrades a read lock.
    fn write<T>(&self, f: impl FnOnce(&Tx<'_>) -> Result<T, Failure>) -> Result<T, JournalError> {
        self.transaction(TransactionBehavior::Immediate, f)
    }

    /// One read transaction: one consistent snapshot across its queries.
    fn read<T>(&self, f: impl FnOnce(&Tx<'_>) -> Result<T, Failure>) -> Result<T, JournalError> {
        self.transaction(TransactionBehavior::Deferred, f)
    }

    fn transaction<T>(
        &self,
        behavior: TransactionBehavior,
        f: impl FnOnce(&Tx<'_>) -> Result<T, Failure>,
    ) -> Result<T, JournalError> {
        let mut conn = self.lock();
        let run = || {
            let tx = conn.transaction_with_behavior(behavior)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        };
        run().map_err(|e| attach(&self.path, e))
    }
}

fn attach(path: &Path, failure: Failure) -> JournalError {
    match failure {
        Failure::Sql(source) => JournalError::Sqlite {
            path: path.to_path_buf(),
            source,
        },
        Failure::Other(message) => JournalError::Other {
            path: path.to_path_buf(),
            message,
        },
    }
}

/// Pragmas, then the migrations the file has not seen yet.
fn configure(conn: &mut Connection) -> Result<(), Failure> {
    // First, so that everything after it waits for a CLI or daemon holding the lock.
    conn.busy_timeout(Duration::from_secs(5))?;
    // Room for every statement of the hot paths (about 15), so none is prepared twice.
    conn.set_prepared_statement_cache_capacity(32);
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Failure::Other(format!(
            "cannot switch to WAL mode (the file system gave {mode})"
        )));
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", true)?;

    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(Failure::Other(format!(
            "schema version {version} was written by a newer vaultd (this one knows up to {known})"
        )));
    }
    for migration in &MIGRATIONS[version as usize..] {
        tx.execute_batch(migration)?;
    }
    if version < known {
        tx.pragma_update(None, "user_version", known)?;
    }
    tx.commit()?;
    Ok(())
}

/// The optional columns of an event row.
#[derive(Default)]
struct EventFields<'a> {
    call_id: Option<&'a str>,
    tool: Option<&'a str>,
    outcome: Option<&'a str>,
    duration_ms: Option<u64>,
    detail: Option<&'a str>,
}

fn event(
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

const EVENT_COLUMNS: &str = "at_ms, event, note, call_id, tool, outcome, duration_ms, detail";

fn log_entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<LogEntry> {
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
fn sql_limit(limit: Option<usize>) -> i64 {
    limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX))
}

/// Runs one statement through the connection's statement cache. The hot paths run the same
/// dozen statements for every note; preparing them anew each time was a tenth of the CPU
/// of `vaultd once` (BENCHMARKS.md).
/// Records one call's outcome (see [`Journal::call_finished`]).
fn record_outcome(tx: &Tx<'_>, run: RunId, result: &CallResult) -> Result<(), Failure> {
    let note = run_note(tx, run)?;
    let stored = serde_json::to_string(&StoredResult::from_result(result))
        .map_err(|e| Failure::Other(format!("cannot encode result: {e}")))?;
    let (outcome, message) = match &result.outcome {
        Ok(_) => ("ok", None),
        Err(e) => (e.code.as_str(), Some(e.message.clone())),
    };
    let error_code = result.outcome.as_ref().err().map(|e| e.code.as_str());
    let ended = to_ms(result.ended_at);
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
        Some(id) => exec(
            tx,
            "UPDATE calls SET ended_at_ms = ?1, result_json = ?2, error_code = ?3
             WHERE id = ?4",
            params![ended, stored, error_code, id],
        )?,
        None => exec(
            tx,
            "INSERT INTO calls (run_id, call_id, tool, ended_at_ms, result_json, error_code)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![run, result.call_id, result.name, ended, stored, error_code],
        )?,
    };
    if let Ok(ToolOutput {
        undo: Some(record), ..
    }) = &result.outcome
    {
        undo::confirm(tx, &result.call_id, &note, &result.name, record)?;
    }
    let fields = EventFields {
        call_id: Some(&result.call_id),
        tool: Some(&result.name),
        outcome: Some(outcome),
        duration_ms: Some(result.duration_ms()),
        detail: message.as_deref(),
    };
    event(tx, now_ms(), "call_end", Some(run), &note, &fields)
}

/// Marks the newest recorded outcome of each call as written into the note: of the note
/// (by its id, whichever run recorded it, §9.3), or of the run for a note without an id.
fn mark_written(tx: &Tx<'_>, run: RunId, call_ids: &[&str]) -> Result<(), Failure> {
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
            call_id: Some(call_id),
            tool: Some(&tool),
            ..EventFields::default()
        };
        event(tx, now, "written", Some(run), &note, &fields)?;
    }
    Ok(())
}

/// Records the run's note now at `to`; `ends_run` closes the run.
fn record_move(tx: &Tx<'_>, run: RunId, to: &str, ends_run: bool) -> Result<(), Failure> {
    let from = run_note(tx, run)?;
    let now = now_ms();
    if ends_run {
        let state = to.split('/').next().unwrap_or(to);
        exec(
            tx,
            "UPDATE runs SET note = ?1, ended_at_ms = ?2, final_state = ?3 WHERE id = ?4",
            params![to, now, state, run],
        )?;
    } else {
        exec(
            tx,
            "UPDATE runs SET note = ?1 WHERE id = ?2",
            params![to, run],
        )?;
    }
    let fields = EventFields {
        detail: Some(to),
        ..EventFields::default()
    };
    event(tx, now, "move", Some(run), &from, &fields)
}

fn exec(tx: &Tx<'_>, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<usize> {
    tx.prepare_cached(sql)?.execute(params)
}

/// `query_row` through the statement cache (see [`exec`]).
fn query_one<T>(
    tx: &Tx<'_>,
    sql: &str,
    params: impl rusqlite::Params,
    f: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    tx.prepare_cached(sql)?.query_row(params, f)
}

fn run_note(tx: &Tx<'_>, run: RunId) -> Result<String, Failure> {
    query_one(
        tx,
        "SELECT note FROM runs WHERE id = ?1",
        params![run],
        |r| r.get(0),
    )
    .optional()?
    .ok_or_else(|| Failure::Other(format!("no run {run}")))
}

fn insert_start(
    tx: &Tx<'_>,
    now: i64,
    run: RunId,
    call_id: &str,
    tool: &str,
    effect: Effect,
    params: &Value,
) -> Result<(), Failure> {
    let note = run_note(tx, run)?;
    exec(
        tx,
        "INSERT INTO calls (run_id, call_id, tool, effect, params_json, started_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![run, call_id, tool, effect.as_str(), params.to_string(), now],
    )?;
    let fields = EventFields {
        call_id: Some(call_id),
        tool: Some(tool),
        ..EventFields::default()
    };
    event(tx, now, "call_start", Some(run), &note, &fields)
}

/// The calls of one run in order of first appearance, each at the progress of its newest row.
fn run_calls(tx: &Tx<'_>, run: RunId) -> Result<Vec<JournalCall>, Failure> {
    let mut stmt = tx.prepare_cached(
        "SELECT c.call_id, c.tool, c.effect, c.result_json, c.written_at_ms, c.started_at_ms,
                r.note
         FROM calls c JOIN runs r ON r.id = c.run_id WHERE c.run_id = ?1 ORDER BY c.id",
    )?;
    let rows = stmt.query_map(params![run], call_row)?;
    collect_calls(rows)
}

type CallRow = (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    String,
);

fn call_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CallRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
    ))
}

/// Calls in order of first appearance, each at the progress of its newest row.
fn collect_calls(
    rows: impl Iterator<Item = rusqlite::Result<CallRow>>,
) -> Result<Vec<JournalCall>, Failure> {
    let mut calls: Vec<JournalCall> = Vec::new();
    for row in rows {
        let (call_id, tool, effect, result, written, started, note) = row?;
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
        };
        match calls.iter_mut().find(|c| c.call_id == call.call_id) {
            Some(earlier) => *earlier = call,
            None => calls.push(call),
        }
    }
    Ok(calls)
}

fn count_since(tx: &Tx<'_>, tool: &str, since_ms: i64) -> rusqlite::Result<u64> {
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
fn window_reset(
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

fn lookup_approval(
    tx: &Tx<'_>,
    call_id: &str,
    params_hash: &str,
) -> Result<Option<Decision>, Failure> {
    let decision: Option<String> = query_one(
        tx,
        "SELECT decision FROM approvals
             WHERE call_id = ?1 AND params_hash = ?2 AND consumed_at_ms IS NULL",
        params![call_id, params_hash],
        |r| r.get(0),
    )
    .optional()?;
    decision
        .map(|d| {
            Decision::parse(&d).ok_or_else(|| Failure::Other(format!("unknown decision {d:?}")))
        })
        .transpose()
}

/// `calls.result_json`: a [`CallResult`] with its times in nanoseconds, so it comes back
/// exactly as it went in.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredResult {
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

fn decode_result(call_id: &str, tool: &str, json: &str) -> Result<CallResult, Failure> {
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

fn now_ms() -> i64 {
    to_ms(SystemTime::now())
}

/// Unix milliseconds, negative before 1970 (clocks set that far back still order correctly).
fn to_ms(t: SystemTime) -> i64 {
    to_ns(t).div_euclid(1_000_000)
}

fn from_ms(ms: i64) -> SystemTime {
    from_ns(ms.saturating_mul(1_000_000))
}

fn to_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

fn from_ns(ns: i64) -> SystemTime {
    let d = Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}

fn rfc3339(ms: i64) -> String {
    // humantime cannot format times before 1970; a clock that wrong shows as the epoch.
    humantime::format_rfc3339_millis(from_ms(ms.max(0))).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::ErrorCode;
    use serde_json::json;
    use tempfile::TempDir;

    /// A journal in a fresh state dir; keep the dir alive as long as the journal.
    fn shape(calls: &[JournalCall]) -> Vec<(String, String, Effect, CallProgress)> {
        calls
            .iter()
            .map(|c| {
                (
                    c.call_id.clone(),
                    c.tool.clone(),
                    c.effect,
                    c.progress.clone(),
                )
            })
            .collect()
    }

    fn fresh_journal() -> (TempDir, Journal) {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal = Journal::open(dir.path()).expect("open journal");
        (dir, journal)
    }

    fn search_ok(call_id: &str) -> CallResult {
        // Odd nanoseconds, to prove the times survive exactly.
        let started = UNIX_EPOCH + Duration::new(1_790_000_000, 123_456_789);
        CallResult {
            call_id: call_id.to_string(),
            name: "search_web".to_string(),
            outcome: Ok(ToolOutput {
                data: json!({ "results": [ { "title": "t", "url": "https://x.test/", "snippet": "ünï" } ] }),
                summary: "1 result".to_string(),
                undo: None,
            }),
            started_at: started,
            ended_at: started + Duration::from_nanos(412_000_001),
        }
    }

    fn invalid_params(call_id: &str) -> CallResult {
        CallResult::failed_now(
            call_id,
            "search_web",
            CallError::new(ErrorCode::InvalidParams, "parameters do not match").with_details(
                json!({ "violations": [ { "pointer": "/query", "message": "is required" } ] }),
            ),
        )
    }

    fn timed_out(call_id: &str) -> CallResult {
        CallResult::failed_now(
            call_id,
            "search_web",
            CallError::new(ErrorCode::Timeout, "no answer within 30 s"),
        )
    }

    fn progress_of(journal: &Journal, note: &str) -> Vec<(String, CallProgress)> {
        journal
            .run_for_note(note)
            .expect("query")
            .expect("open run")
            .calls
            .into_iter()
            .map(|c| (c.call_id, c.progress))
            .collect()
    }

    fn start_search(journal: &Journal, run: RunId, call_id: &str) {
        journal
            .call_started(
                run,
                call_id,
                "search_web",
                Effect::ReadOnly,
                &json!({ "query": "q" }),
            )
            .expect("call_started");
    }

    fn start_send(journal: &Journal, run: RunId, call_id: &str) {
        journal
            .call_started(
                run,
                call_id,
                "send_notification",
                Effect::ExternalSideEffect,
                &json!({ "recipient": "me@example.com" }),
            )
            .expect("call_started");
    }

    #[test]
    fn open_sets_wal_and_schema_version() {
        let (dir, journal) = fresh_journal();
        assert_eq!(journal.path(), dir.path().join("journal.sqlite"));
        let conn = journal.lock();
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
    }

    #[test]
    fn a_version_1_journal_is_migrated_in_place_keeping_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(dir.path().join("journal.sqlite")).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.execute(
                "INSERT INTO runs (id, note, claimed_at_ms) VALUES (7, 'In_Progress/a.md', 1)",
                [],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO calls (run_id, call_id, tool, effect, started_at_ms)
                 VALUES (7, 'c-send', 'send_notification', 'external_side_effect', 2)",
                [],
            )
            .unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
        }
        let journal = Journal::open(dir.path()).unwrap();
        let version: i64 = journal
            .lock()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
        let open = journal.open_runs().unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].note_id, None);
        assert!(journal.note_calls("n-a").unwrap().is_empty());
        journal.adopt_run(7, "n-a").unwrap();
        let calls = journal.note_calls("n-a").unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].effect, Effect::ExternalSideEffect);
        assert_eq!(calls[0].progress, CallProgress::Started);
        assert_eq!(journal.calls_started_for_note("n-a").unwrap(), 1);
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
    fn the_journal_is_private_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, journal) = fresh_journal();
        start_search(
            &journal,
            journal.begin_run("In_Progress/a.md").unwrap(),
            "c-1",
        );
        for name in ["journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm"] {
            let mode = std::fs::metadata(dir.path().join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
    }

    #[test]
    fn open_creates_missing_state_dir() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("a/b/state");
        Journal::open(&state).expect("open");
        assert!(state.join("journal.sqlite").is_file());
    }

    #[test]
    fn open_refuses_a_newer_schema() {
        let (dir, journal) = fresh_journal();
        journal
            .lock()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        drop(journal);
        let err = Journal::open(dir.path()).expect_err("newer schema");
        let text = err.to_string();
        assert!(text.contains("journal.sqlite"), "{text}");
        assert!(text.contains("newer vaultd"), "{text}");
    }

    #[test]
    fn errors_name_the_journal_file() {
        let (dir, journal) = fresh_journal();
        let err = journal
            .call_finished(42, &timed_out("c-1"))
            .expect_err("no such run");
        assert!(
            err.to_string()
                .contains(&dir.path().join("journal.sqlite").display().to_string()),
            "{err}"
        );
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

    #[test]
    fn ending_move_closes_the_run_and_a_new_claim_starts_another() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        start_search(&journal, run, "c-1");
        journal
            .note_moved(run, "Done/a.md", true)
            .expect("note_moved");
        assert!(journal.open_runs().unwrap().is_empty());
        assert!(journal.run_for_note("In_Progress/a.md").unwrap().is_none());
        assert!(journal.run_for_note("Done/a.md").unwrap().is_none());
        assert!(journal.running_calls().unwrap().is_empty());

        let again = journal.begin_run("In_Progress/a.md").unwrap();
        assert_ne!(again, run);
        let open = journal.open_runs().unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].run_id, again);
        assert!(open[0].calls.is_empty());
    }

    #[test]
    fn non_ending_move_keeps_the_run_at_its_new_path() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        start_search(&journal, run, "c-1");
        journal
            .note_moved(run, "In_Progress/a (2).md", false)
            .unwrap();
        let open = journal.open_runs().unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].note, "In_Progress/a (2).md");
        assert!(journal.run_for_note("In_Progress/a.md").unwrap().is_none());
        let found = journal
            .run_for_note("In_Progress/a (2).md")
            .unwrap()
            .expect("open run at new path");
        assert_eq!(found.run_id, run);
        assert_eq!(found.calls.len(), 1);

        let moves: Vec<_> = journal
            .log(&LogFilter::default())
            .unwrap()
            .into_iter()
            .filter(|e| e.event == "move")
            .map(|e| (e.note, e.detail))
            .collect();
        assert_eq!(
            moves,
            vec![(
                "In_Progress/a.md".to_string(),
                Some("In_Progress/a (2).md".to_string())
            )]
        );
    }

    #[test]
    fn a_second_claim_of_the_same_path_supersedes_a_stale_run() {
        let (_dir, journal) = fresh_journal();
        let stale = journal.begin_run("In_Progress/a.md").unwrap();
        let fresh = journal.begin_run("In_Progress/a.md").unwrap();
        let open = journal.open_runs().unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].run_id, fresh);
        assert_ne!(stale, fresh);
    }

    #[test]
    fn abandoned_run_is_closed_and_reported() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/gone.md").unwrap();
        journal
            .abandon_run(run, "note no longer in In_Progress")
            .unwrap();
        assert!(journal.open_runs().unwrap().is_empty());
        let problems = journal.problems(10).unwrap();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].note, "In_Progress/gone.md");
    }

    #[test]
    fn everything_survives_a_restart() {
        let (dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        start_send(&journal, run, "c-send");
        start_search(&journal, run, "c-search");
        let result = search_ok("c-search");
        journal.call_finished(run, &result).unwrap();
        journal
            .record_approval("Pending_Approval/b.md", "c-b", "h1", Decision::Approved)
            .unwrap();
        journal
            .record_problem("Needs_Action/big.md", "over max_note_bytes")
            .unwrap();
        let before = journal.log(&LogFilter::default()).unwrap();
        drop(journal); // the daemon is killed

        let journal = Journal::open(dir.path()).expect("reopen");
        let open = journal.open_runs().unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(
            shape(&open[0].calls),
            vec![
                (
                    "c-send".to_string(),
                    "send_notification".to_string(),
                    Effect::ExternalSideEffect,
                    CallProgress::Started
                ),
                (
                    "c-search".to_string(),
                    "search_web".to_string(),
                    Effect::ReadOnly,
                    CallProgress::Finished(result)
                ),
            ]
        );
        assert_eq!(
            journal.approval("c-b", "h1").unwrap(),
            Some(Decision::Approved)
        );
        assert_eq!(journal.problems(5).unwrap().len(), 1);
        assert_eq!(journal.log(&LogFilter::default()).unwrap(), before);
        assert_eq!(
            journal
                .calls_started_since("send_notification", UNIX_EPOCH)
                .unwrap(),
            1
        );
        // And the run carries on after the restart.
        journal.results_written(run, &["c-search"]).unwrap();
        journal.note_moved(run, "Failed/a.md", true).unwrap();
        assert!(journal.open_runs().unwrap().is_empty());
    }

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

    #[test]
    fn approvals_latest_wins_and_are_bound_to_the_params_hash() {
        let (_dir, journal) = fresh_journal();
        let note = "Pending_Approval/a.md";
        assert_eq!(journal.approval("c-1", "hash-a").unwrap(), None);
        journal
            .record_approval(note, "c-1", "hash-a", Decision::Approved)
            .unwrap();
        assert_eq!(
            journal.approval("c-1", "hash-a").unwrap(),
            Some(Decision::Approved)
        );
        // Changed parameters need approving again; another call is another call.
        assert_eq!(journal.approval("c-1", "hash-b").unwrap(), None);
        assert_eq!(journal.approval("c-2", "hash-a").unwrap(), None);

        journal
            .record_approval(note, "c-1", "hash-a", Decision::Rejected)
            .unwrap();
        assert_eq!(
            journal.approval("c-1", "hash-a").unwrap(),
            Some(Decision::Rejected)
        );
        journal
            .record_approval(note, "c-1", "hash-a", Decision::Approved)
            .unwrap();
        assert_eq!(
            journal.approval("c-1", "hash-a").unwrap(),
            Some(Decision::Approved)
        );

        let events: Vec<_> = journal
            .log(&LogFilter::default())
            .unwrap()
            .into_iter()
            .map(|e| (e.event, e.call_id, e.outcome))
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[1],
            (
                "approval".to_string(),
                Some("c-1".to_string()),
                Some("rejected".to_string())
            )
        );
    }

    #[test]
    fn an_approval_counts_once() {
        let (_dir, journal) = fresh_journal();
        journal
            .record_approval("Pending_Approval/a.md", "c-1", "h", Decision::Approved)
            .unwrap();
        assert_eq!(
            journal.consume_approval("c-1", "h").unwrap(),
            Some(Decision::Approved)
        );
        assert_eq!(journal.approval("c-1", "h").unwrap(), None);
        assert_eq!(journal.consume_approval("c-1", "h").unwrap(), None);
        assert!(!journal.approved_any("c-1").unwrap());
        // A new decision is usable again.
        journal
            .record_approval("Pending_Approval/a.md", "c-1", "h", Decision::Approved)
            .unwrap();
        assert_eq!(
            journal.approval("c-1", "h").unwrap(),
            Some(Decision::Approved)
        );
    }

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
            .map(|e| e.outcome.clone().unwrap())
            .collect();
        assert_eq!(codes, vec!["TIMEOUT", "EXECUTION_ERROR"]);
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

    #[test]
    fn two_handles_on_one_file_write_and_read_concurrently() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = Journal::open(dir.path()).unwrap();
        let cli = Journal::open(dir.path()).unwrap();
        const CALLS: usize = 100;
        std::thread::scope(|s| {
            s.spawn(|| {
                let run = daemon.begin_run("In_Progress/a.md").unwrap();
                for i in 0..CALLS {
                    let id = format!("c-{i}");
                    start_search(&daemon, run, &id);
                    daemon.call_finished(run, &search_ok(&id)).unwrap();
                }
            });
            s.spawn(|| {
                // The CLI reads while the daemon writes, and writes too (`vaultd approve`).
                for i in 0..CALLS {
                    cli.log(&LogFilter::default()).unwrap();
                    cli.open_runs().unwrap();
                    cli.record_approval(
                        "Pending_Approval/b.md",
                        &format!("c-{i}"),
                        "h",
                        Decision::Approved,
                    )
                    .unwrap();
                }
            });
        });
        assert_eq!(
            cli.calls_started_since("search_web", UNIX_EPOCH).unwrap(),
            CALLS as u64
        );
        assert_eq!(
            daemon.approval("c-99", "h").unwrap(),
            Some(Decision::Approved)
        );
        let runs = cli.open_runs().unwrap();
        assert_eq!(runs[0].calls.len(), CALLS);
    }

    #[test]
    fn journal_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Journal>();
    }
}
