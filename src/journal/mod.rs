//! The journal: one SQLite file (WAL, synchronous=FULL) in the state dir recording every
//! claim, call start, call outcome, result write and move, so a daemon killed at any instant
//! restarts without losing a note, running a side effect twice or writing a result twice.
//! The only SQL in the crate lives here.
//!
//! Every write method is committed (and on disk) before it returns, unless it says otherwise
//! (below): a "call started" row exists before the tool runs. Writes go through one writer thread that
//! owns the write connection ([`writer`], group commit): the writes that arrive while a commit
//! is on its way to the disk share the next transaction, each in its own savepoint, and each
//! caller returns once its group's commit is durable. Reads run on a second connection and
//! see every write whose method has returned. Methods are synchronous; the daemon calls them
//! from `spawn_blocking`. The CLI (`status`, `log`, `approve`) opens the same file while the
//! daemon runs: WAL lets it read while the daemon writes, and the 5 s busy timeout plus
//! `BEGIN IMMEDIATE` for every group serialise two writers instead of failing.
//!
//! # Per-effect durability
//! A call's start record exists so that recovery never runs a side effect twice (docs/design.md §9.3):
//! "started, no outcome" turns an `external_side_effect` or `state_change` call into
//! UNKNOWN_OUTCOME (or a §11.3 undo record) instead of a second run. Those starts stay durable
//! before the tool runs. A `read_only` call needs no such guard: started with no outcome,
//! recovery runs it again anyway, and a call with no start record at all is simply pending in
//! its note (recovery of a run, §8.15, and the next claim both run pending calls). So its
//! start is queued and not waited for (it joins the next group commit); a kill before that
//! commit loses the record and the call runs again — never lost. Its outcome is not waited
//! for either before its results write begins (`call_finished_later`, like every outcome; see
//! below): it commits while the new text is written, and is settled before that text
//! replaces the note.
//!
//! # Commits without an fsync
//! A group of writes none of whose callers waits for durability (queued, `Executed` or
//! `Committed` ones: the `read_only` starts and outcomes, the claim of a note with only
//! `read_only` calls, "written and moved") that came to an idle writer, or while the daemon
//! works on one note alone ([`Journal::set_one_note`]: a note's start and outcome can come
//! right after each other's commit), commits with `synchronous=NORMAL`: no fsync. Every
//! other group commits with `synchronous=FULL` (under load, the fsync's time is what gathers
//! the next writes into one group), and its fsync of the WAL (one file, appended in order)
//! makes every commit before it durable too; the writer fsyncs the WAL itself once it has
//! been idle for 50 ms after a commit without one. So a search note's path to Done waits for
//! no journal fsync at all, and what a power loss can take is what a kill before those
//! commits could: the cases argued here and below. When an fsync of the WAL fails (the
//! writer's own or SQLite's at a commit), what it held may be gone from the disk while this
//! process still reads it from memory, and Linux reports the error once: a later fsync can
//! succeed without writing it, and SQLite's recovery stops at the first frame missing from
//! the WAL's checksum chain. So from then on a durable write is refused before it runs (its
//! error means "not recorded"; the record of something already done, `Wait::Recorded`, still
//! commits, and its caller hears the error), and claiming pauses until vaultd is restarted (§9.12;
//! [`StorageHealth`]). The writer checkpoints itself (SQLite's automatic checkpoint would
//! drop the error); a failed fsync that only a CLI process met is not seen here.
//!
//! Rate limits count start records. A `read_only` call with limits waits until its start ran
//! in the writer's transaction (admission check and insert in one job, serialised with every
//! other start and seen by the next one in the same transaction: exact), just not for the
//! commit. What a kill can cost is the starts of the last, uncommitted group: those calls ran
//! once without being counted, and run again (and count) on recovery. The note budget (§12.2)
//! counts the same way. Far from its limits such a start does not wait at all: while each of
//! its windows is at most half full by the writer's last count (with the starts so admitted
//! and not yet inserted), it is admitted on that count and its insert queued
//! ([`rates::RateRoom`]); it cannot find a window full. Near a limit the writer decides. Reads (another connection) see a `read_only` start once its group
//! committed: at the latest when any later durable write has returned ([`Journal::flush`]).
//!
//! # The claim
//! The daemon's claim record (`begin_claim_async`) is waited for until it ran in the writer's
//! transaction (its run id is known), not until it commits. Nothing a crash could
//! then repeat depends on it alone: every call that must not run twice has a durable start
//! record, and the single writer commits jobs in order, so that start's commit carries the
//! claim's too. A kill before that commit is the case of a kill between the claim's rename and
//! its record, which recovery always handled: the note is found in In_Progress unknown to the
//! journal (docs/design.md §8.15: `read_only` calls run, others get UNKNOWN_OUTCOME; none of them can
//! have started), and a name a link claim left behind is still recognised by the inode it
//! shares with the claimed note (`daemon/recover.rs`). The fsync it saved was on every note's
//! path to Done.
//!
//! A note whose calls are all fresh `read_only` ones does not wait even for that: its calls
//! start while the record is still queued (`Daemon::execute_while_claiming`). The record was
//! given a ticket ([`ClaimTicket`]) before it was queued, and a start queued behind it names
//! its run by that ticket ([`RunRef::Claimed`]); the writer runs jobs in order, so the record
//! has run when the start does, and the writer resolves the ticket to the id the record got
//! (`writer::GroupRuns`). What is recorded after the tool ran (its outcome) waits for the id.
//! Nothing here can repeat a side effect: the calls are `read_only`, so what a crash can do is
//! what it can do to a queued `read_only` start (above): the call runs again. A record that
//! fails to run names no run, so the start behind it is refused (recorded under no run, never
//! under another's), the calls are stopped, their results dropped, and the note goes back to
//! where it was claimed from, as when a record fails before anything started. A record that
//! ran but whose commit failed is a lost run like any other: the start, the outcome and the
//! move under it are refused, and the note's result blocks stand (below). What the early
//! start saves is the writer's round trip for the record (its run and the answer's wake-up)
//! on every search note's way to Done.
//!
//! A commit that fails (a full disk, an I/O error) after the record ran leaves the daemon
//! with the id of a run the journal does not hold. The writer never gives that id out again,
//! and refuses every later write under it, even once another process's run has taken it as
//! the next rowid (`writer::GroupRuns`). So nothing of the note is recorded under another
//! run: each write under it fails ([`JournalError::RunLost`]). A start the daemon waits for,
//! or the claimed text kept before the identity stamp ("The stamp": nothing of the note ran
//! yet), sends the note back (to Approved/ when a move there approved it), to be claimed again
//! (docs/design.md §9.12), with the results of what ran written into it; the writes nobody
//! waits for (a `read_only` start with room in its window, the outcome, the move) are logged
//! as not recorded, and the note's result blocks stand. The outcomes of calls that never
//! start (`calls_finished`) come after the stamp, so under a lost run they are never reached.
//!
//! # The stamp
//! A note whose calls include a side effect gets its identity (`tool_note`, docs/design.md §9.2)
//! before any of them runs, so that a note moved by hand mid-run carries it. That write
//! replaces the claimed note and has no fsync of its own (`note::update_note_unsynced`): first
//! the note's text as claimed is made durable with its run, then the stamped text is renamed
//! over the note. For a note whose calls are not all known `read_only` ones the claim record
//! itself carries the text, and is waited for until it committed (not for its fsync). When a
//! side effect of the note runs, the stamp is written by the first one's call after its
//! start record and before its tool runs (`runner::BeforeRun`): that start's commit must be
//! durable before the tool runs anyway, and the single writer commits in order, so its fsync
//! makes the claim record and the text durable too. One commit's fsync less on a send
//! note's way to Done: what it costs is that a kill between that commit and the stamp's
//! rename (a write without an fsync: a fraction of a millisecond) leaves the first case
//! below with a start recorded, so that call gets `UNKNOWN_OUTCOME` though its tool never ran,
//! as a kill while the tool runs gives it; never a second run. A note gone by then runs none
//! of its side effects (each gets a recorded "did not run"). Otherwise (no side effect runs,
//! or the note carries another note's id, whose results write must find its own) the text is
//! made durable first ([`Journal::flush`], or `keep_claimed_text` when the claim record did
//! not carry it). The stamp is written unsynced only on the text kept: a note changed since
//! its claim is stamped with its temp file fsynced (recovery would put back the kept text).
//! What a power loss can leave (a kill leaves the page cache, so only the first two):
//! - the note as claimed (the rename was lost, or not made yet): recovery knows it by the
//!   run's path and gives it the run's id (`daemon/recover.rs`); a claim rename lost too
//!   leaves it at the path it was claimed from, where the stale-copy rule (§9.6) knows it;
//! - the note as stamped;
//! - on a file system that does not flush a file renamed over another (ext4 does, with its
//!   default `auto_da_alloc`; others need not), an empty or zero-filled note: recovery puts the
//!   run's claimed text back (`restore_note`) and goes on from there, as from the first case.
//!
//! Every later write of the note (its results) is a full durable write, so the stamp's
//! window is from the claim to the first result; but that write's rename, and the move
//! after it, are made durable by the flusher (below), so the text is kept a minute past the
//! run's end (`forget_claimed_texts`, at each full scan and after start-up recovery), and
//! recovery finds it by the note's name in any state folder, the run open or not. The
//! kill -9 stress test empties such notes after some of its kills (`tests/recovery.rs`).
//!
//! # Durability soon
//! Some renames are made durable by the flusher (`files::fsync_dir_soon`: every marked folder
//! fsynced once per round, a round 50 ms after its first mark) instead of by the caller: the
//! claim's rename into In_Progress, the move of a finished note out of it (and with it the
//! rename of its results write), and the folder of a new `.eml` in the outbox. Under load one
//! round covers dozens of notes. What a crash can undo of them, and why that is safe:
//! - the claim's rename or hard link: the note is back at the path it was claimed from (a
//!   link's first name is dropped live only once the link's folder mark is durable, a flush
//!   through that mark (`files::flush_folders_through`: by the grace's end a round has
//!   most often covered it, and it waits for nothing), and at start-up only while the
//!   claimed note is found, so a record that outlived its link never drops the note's only
//!   name: `arrivals::settle_after_crash`); a call that started has a
//!   durable start record, so the stale-copy rule (§9.6) gives it its recorded outcome or
//!   `UNKNOWN_OUTCOME` (or, after `stale_copy_grace`, holds it), never a second run;
//! - the results write and the move: the note is back in In_Progress, as stamped or with its
//!   results; recovery writes what is missing (the recorded outcome, or `UNKNOWN_OUTCOME`
//!   for a side effect started with none) and moves it on. The "written and moved" record
//!   itself is not waited for: the note's own result blocks say what was written (§9.3);
//! - a call's outcome (`call_finished_later`): committed while the note's new text is
//!   written to its temp file and fsynced, and waited for (a side effect's with its fsync)
//!   before that file is renamed over the note (`note::update_note_settling`). So a result
//!   block is never in the note before its outcome is in the journal, as when the outcome was
//!   waited for before the write began, and the two fsyncs overlap. A crash before the
//!   commit leaves no block: a `read_only` call runs again (§9.3), a side effect, whose start
//!   is durable, gets `UNKNOWN_OUTCOME`, never a second run;
//! - the `.eml`: it is a new file, written unnamed and linked whole (`private::create_whole`:
//!   a reader never finds it in part), fsynced after the link and before its send is recorded, and on the journaling
//!   file systems Linux runs on (ext4, XFS, btrfs) that fsync also commits its name; the
//!   folder's fsync, which POSIX asks for, follows within a round.
//!
//! `once` and `run` wait for the last round before they exit (`files::flush_folders`).
//!
//! # Tables (schema version 7, kept in `PRAGMA user_version`)
//! - `runs`: one claim of one note, from the rename into In_Progress to the move out of it.
//!   `note` is the note's *current* path, so recovery finds it where it now is; `note_id` is
//!   the note's identity (its `tool_note` property, docs/design.md §9.2) and `claimed_from` the path it
//!   was claimed from (the stale-copy rule, §9.6); `copy_of` the note a stale copy stands for
//!   (kept, so a copy killed or moved mid-run still never runs that note's calls again).
//!   Version 1 journals get these columns, empty, in place; a run without a note id is given one when its note is next seen.
//!   `claimed_sha256` (version 5) is the note's text as claimed, by which a sync client's
//!   duplicate of it under another name is known (§9.10); `claimed_text` (version 6) the text
//!   itself while an unsynced identity stamp could be undone by a crash ("The stamp").
//!   Calls are keyed by (note id, call id) through their run: what a note's call did is known
//!   whatever path the note has now.
//! - `calls`: one row per start (or per outcome recorded without a start: validation, policy,
//!   quota, rate limit). Rate limits and note budgets count rows with a `started_at_ms` and no
//!   `not_run` (version 7: a start stopped before its tool ran, `runner::BeforeRun`). A call run again in the
//!   same run (a `read_only` call after a crash) gets a new row; the newest row per call id is
//!   its progress.
//! - `events`: what `vaultd log` shows, in order.
//! - `approvals`: `vaultd approve`/`reject` decisions, bound to the call id and the hash of the
//!   exact parameters shown.
//! - `undo_records`/`undo_changes`, `mcp_*`, `runner_*`, `vault_owner`, `journal_origin`,
//!   `storage_probe`: self-contained tables, created at open (see their modules).
//!
//! # Layout
//! One file per table, its queries and its tests: `runs.rs`, `calls.rs`, `rates.rs` (rate
//! limits, counted from the start records in `calls`), `events.rs` (`vaultd log` and `status`),
//! `approvals.rs`, `undo.rs`, `catalog.rs` (MCP pins), `runners.rs` (synced vaults), `owner.rs` (the vault it belongs to, §9.11);
//! `schema.rs` holds the migrations and pragmas; `writer.rs` the group commit; this file the
//! handle and its transactions.

mod approvals;
mod calls;
pub mod catalog;
mod events;
pub mod owner;
mod rates;
pub mod runners;
mod runs;
mod schema;

#[cfg(test)]
mod testing;
pub mod undo;
mod writer;

pub use approvals::Decision;

/// The journal's schema version (`PRAGMA user_version` of a journal this vaultd opened).
pub const SCHEMA_VERSION: i64 = schema::MIGRATIONS.len() as i64;
pub use calls::{CallProgress, JournalCall};
pub use events::{LogEntry, LogFilter, RecentFailure};
pub use rates::{RateUse, RateWindow, StartAdmission};
#[cfg(test)]
pub(crate) use runs::claim_hook;
pub use runs::{Claim, ClaimTicket, LinkClaim, OpenRun, RunId, RunRef};

use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
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
    /// A write under a run whose claim record a failed commit lost ("The claim").
    #[error("journal {path}: {}", run_lost(*run))]
    RunLost {
        path: std::path::PathBuf,
        run: RunId,
    },
}

impl JournalError {
    /// Whether this is a write refused because its run's claim record was lost with a failed
    /// commit: nothing of the note is recorded under that run, whatever the storage does now.
    pub fn is_run_lost(&self) -> bool {
        matches!(self, JournalError::RunLost { .. })
    }
}

pub struct Journal {
    /// The database file, named in every error.
    path: PathBuf,
    /// Why the journal's storage refuses writes now, if it does (docs/design.md §9.12): set by the
    /// writer on a full disk, a read-only file or an I/O error, cleared by a write that
    /// succeeds again ([`Journal::probe_storage`]), except after a failed fsync: then only a
    /// restart clears it ([`StorageHealth`]). The daemon stops claiming meanwhile.
    storage: Arc<StorageHealth>,
    /// The writer thread, owner of the write connection: every write goes through it.
    writer: writer::Writer,
    /// The connection reads use (WAL: they never wait for the writer); the mutex makes
    /// `Journal` `Sync`.
    reader: Mutex<Connection>,
    /// The writer's last counts of the rate-limit windows, shared with it: a `read_only` start
    /// far from its limits is admitted on them without waiting for the writer
    /// ([`rates::RateRoom`]).
    room: Arc<rates::RateRoom>,
    /// When this journal was started afresh (`--new-journal`), once read: asked for every new
    /// note (`Daemon::journal_lost`), recorded only before a daemon starts (and by this handle).
    origin: Mutex<Option<Option<std::time::SystemTime>>>,
    /// The last [`ClaimTicket`] given out.
    tickets: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

/// Whether the journal's storage takes writes (docs/design.md §9.12), shared by the handle and its
/// writer thread.
#[derive(Debug, Default)]
pub(crate) struct StorageHealth {
    failure: Mutex<Option<String>>,
    /// An fsync of the journal failed: what it held since the last good one may be gone from
    /// the disk while SQLite and this process still read it from memory, and a later fsync
    /// can succeed without writing it (Linux reports a writeback error once). No probe can
    /// tell, so only a restart, whose recovery reads what the disk holds, ends the pause.
    until_restart: std::sync::atomic::AtomicBool,
}

impl StorageHealth {
    fn failure(&self) -> MutexGuard<'_, Option<String>> {
        // Only ever holds a plain value: a panic while it was held left it consistent.
        self.failure.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `e` when it says the storage refuses writes (not a bug, a constraint or a busy
    /// lock): the first reason is kept until a write succeeds again.
    pub(crate) fn note_error(&self, e: &rusqlite::Error) {
        let Some(reason) = storage_failure(e) else {
            return;
        };
        let mut failure = self.failure();
        if fsync_failed(e) {
            if !self
                .until_restart
                .swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                let reason = format!(
                    "{reason}; what it held since its last fsync may not be on the disk: restart vaultd once the disk is sound (its recovery reads what the disk holds)"
                );
                tracing::error!("journal: an fsync failed: {reason}; nothing new is claimed");
                *failure = Some(reason);
            }
        } else if failure.is_none() {
            tracing::error!("journal: cannot write: {reason}; nothing new is claimed until it can");
            *failure = Some(reason);
        }
    }

    /// Whether the failure lasts until a restart (a failed fsync).
    pub(super) fn until_restart(&self) -> bool {
        self.until_restart.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn clear(&self) -> bool {
        // Under the lock `note_error` sets `until_restart` under: a failed fsync noted while
        // a probe succeeds is never cleared.
        let mut failure = self.failure();
        !self.until_restart() && failure.take().is_some()
    }
}

/// SQLite's error for a failed fsync of a file (its own at a commit, or the writer's,
/// `writer.rs`). Not a folder's (`SQLITE_IOERR_DIR_FSYNC`, only from deleting a rollback
/// journal): that loses no WAL page.
fn fsync_failed(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(code, _)
        if code.extended_code == rusqlite::ffi::SQLITE_IOERR_FSYNC)
}

/// The error SQLite gives for a failed fsync, saying `why`: what [`fsync_failed`] recognises.
fn fsync_error(why: &str) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR_FSYNC),
        Some(why.to_string()),
    )
}

/// What a SQLite error says about the storage, when it is the storage's fault.
fn storage_failure(e: &rusqlite::Error) -> Option<String> {
    use rusqlite::ErrorCode as C;
    let rusqlite::Error::SqliteFailure(code, message) = e else {
        return None;
    };
    let what = match code.code {
        C::DiskFull => "the disk is full",
        C::SystemIoFailure => "an I/O error",
        C::ReadOnly => "the file or its folder is read-only",
        C::CannotOpen => "the file cannot be opened",
        _ => return None,
    };
    Some(match message {
        Some(m) => format!("{what} ({m})"),
        None => what.to_string(),
    })
}

/// Why a write under a lost run is refused.
fn run_lost(run: RunId) -> String {
    format!(
        "run {run} is not in the journal: its claim record was lost with a failed commit, and nothing more is recorded under it"
    )
}

/// An error inside a transaction, before the journal's path is attached.
enum Failure {
    Sql(rusqlite::Error),
    Other(String),
    /// Refused: the run's claim record was lost ([`Tx::refuse_lost`]).
    Lost(RunId),
}

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        Failure::Sql(e)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Sql(e) => e.fmt(f),
            Failure::Other(message) => f.write_str(message),
            Failure::Lost(run) => f.write_str(&run_lost(*run)),
        }
    }
}

/// The connection a journal query runs on, inside its transaction (a savepoint of the
/// writer's group transaction, or a read transaction). In the writer, it also carries the
/// rate-limit windows the writer keeps ([`rates::RateCache`]).
struct Tx<'a> {
    conn: &'a Connection,
    rates: Option<&'a std::cell::RefCell<rates::RateCache>>,
    /// In the writer: the runs its groups recorded, and those a failed commit lost.
    runs: Option<&'a std::cell::RefCell<writer::GroupRuns>>,
}

impl<'a> Tx<'a> {
    fn read(conn: &'a Connection) -> Tx<'a> {
        Tx {
            conn,
            rates: None,
            runs: None,
        }
    }

    /// The id a new run's must be above (0 outside the writer): see [`writer::GroupRuns`].
    fn run_floor(&self) -> RunId {
        self.runs.map_or(0, |runs| runs.borrow().highest())
    }

    /// Notes a run this group's transaction recorded: if the group's commit fails, the run
    /// is lost (see [`writer::GroupRuns`]).
    fn recorded_run(&self, run: RunId) {
        if let Some(runs) = self.runs {
            runs.borrow_mut().recorded(run);
        }
    }

    /// The run `run` names: a claim record's ticket names the run that record made, once it
    /// ran in this writer (and was not rolled back); refused before it ran, or outside the
    /// writer.
    fn run_of(&self, run: RunRef) -> Result<RunId, Failure> {
        match run {
            RunRef::Known(id) => Ok(id),
            RunRef::Claimed(ticket) => self
                .runs
                .and_then(|runs| runs.borrow().claimed_as(ticket))
                .ok_or_else(|| {
                    Failure::Other(format!("the claim record of {ticket} was not made"))
                }),
        }
    }

    /// Notes that the claim record of `ticket` made `run` ([`run_of`](Self::run_of)).
    fn claimed_as(&self, ticket: ClaimTicket, run: RunId) {
        if let Some(runs) = self.runs {
            runs.borrow_mut().claimed(ticket, run);
        }
    }

    /// Refuses a write under a run whose record a failed commit lost: its id may be another
    /// run's by now (see [`writer::GroupRuns`]).
    fn refuse_lost(&self, run: RunId) -> Result<(), Failure> {
        match self.runs {
            Some(runs) if runs.borrow().is_lost(run) => Err(Failure::Lost(run)),
            _ => Ok(()),
        }
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

/// The tables outside the numbered migrations (`CREATE … IF NOT EXISTS`), in one transaction:
/// a new journal's cost one commit (one WAL fsync), not one per table; an existing one's, none.
fn create_tables(conn: &mut Connection) -> Result<(), Failure> {
    let tx = conn.transaction()?;
    tx.execute_batch(catalog::TABLES)?;
    undo::ensure_schema(&tx)?;
    tx.execute_batch(runners::TABLES)?;
    tx.execute_batch(owner::TABLES)?;
    Ok(tx.commit()?)
}

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
        schema::page_cache_on_demand();
        let mut conn = Connection::open(&path).map_err(|e| wrap(e.into()))?;
        schema::configure(&mut conn).map_err(wrap)?;
        create_tables(&mut conn).map_err(wrap)?;
        // Opened after the writer's connection set WAL mode and migrated the schema.
        let reader = Connection::open(&path).map_err(|e| wrap(e.into()))?;
        schema::configure_reader(&reader).map_err(wrap)?;
        let storage = Arc::new(StorageHealth::default());
        let room = Arc::new(rates::RateRoom::default());
        let writer = writer::Writer::start(conn, path.clone(), storage.clone(), room.clone())
            .map_err(|e| JournalError::Other {
                path: path.clone(),
                message: format!("cannot start the journal's writer thread: {e}"),
            })?;
        Ok(Journal {
            path,
            storage,
            writer,
            reader: Mutex::new(reader),
            room,
            origin: Mutex::new(None),
            tickets: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Tells the writer whether the daemon works on one note alone now (the daemon, at each
    /// claim): a note alone commits its writes that nobody waits to be durable without an
    /// fsync, however soon they follow each other (`writer.rs`, `Writer::set_one_note`). A
    /// snapshot, kept until the next claim: a stale answer costs an fsync, or the grouping
    /// an fsync gives under load, never a record.
    pub fn set_one_note(&self, alone: bool) {
        self.writer.set_one_note(alone);
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the journal cannot be written now (disk full, read-only, I/O error), if a write
    /// failed so and none has succeeded since (docs/design.md §9.12); after a failed fsync,
    /// until a restart.
    pub fn storage_failure(&self) -> Option<String> {
        self.storage.failure().clone()
    }

    /// The storage failure is a failed fsync: only a restart ends it, not a write that works.
    pub fn storage_failure_until_restart(&self) -> bool {
        self.storage.until_restart()
    }

    /// A real write ([`probe_storage`](Self::probe_storage)) while the storage is failing:
    /// true when it took it again (the failure is then forgotten and logged as over).
    pub fn storage_recovered(&self) -> bool {
        if self.storage_failure().is_none() || self.storage.until_restart() {
            return false;
        }
        match self.probe_storage() {
            Ok(()) => {
                if self.storage.clear() {
                    tracing::warn!("journal: writes succeed again; claiming resumes");
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Returns once every write made before it is durable, `read_only` starts included
    /// (whose methods return before their group commits): what a read made after it sees.
    pub fn flush(&self) -> Result<(), JournalError> {
        self.write(|_| Ok(()))
    }

    fn reader(&self) -> MutexGuard<'_, Connection> {
        // A panic while the lock was held left its transaction open: the next read rolls it
        // back first (`read`), and the connection is fine to use again.
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One write, returning once it is durable: it runs in the writer thread's next group
    /// transaction (`BEGIN IMMEDIATE`, so another process's writer waits for the busy timeout
    /// instead of failing) and the caller waits for that group's commit.
    fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, JournalError> {
        self.writer
            .submit(Wait::Durable, f)
            .map_err(|e| self.failed(e))
    }

    /// [`write`](Self::write) returning as soon as it ran, before its group commits.
    fn write_executed<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, JournalError> {
        self.writer
            .submit(Wait::Executed, f)
            .map_err(|e| self.failed(e))
    }

    /// [`write`](Self::write) (`Durable`) or [`write_executed`](Self::write_executed) for an
    /// async caller, awaited without a blocking thread.
    async fn write_async<T: Send + 'static>(
        &self,
        wait: Wait,
        f: impl FnOnce(&Tx<'_>) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, JournalError> {
        self.writer
            .submit_async(wait, f)
            .await
            .map_err(|e| self.failed(e))
    }

    /// One write nobody waits for: queued, it joins the next group commit; its errors are
    /// logged as `what`.
    fn write_queued(
        &self,
        what: &'static str,
        f: impl FnOnce(&Tx<'_>) -> Result<(), Failure> + Send + 'static,
    ) -> Result<(), JournalError> {
        self.writer.enqueue(what, f).map_err(|e| self.failed(e))
    }

    /// One read transaction: one consistent snapshot across its queries, on the reader
    /// connection. It sees every write whose method has returned, except those of
    /// [`write_queued`](Self::write_queued) and [`write_executed`](Self::write_executed)
    /// (`read_only` starts) until their group commits: at the latest, once any later
    /// durable write has returned.
    ///
    /// `BEGIN` and `COMMIT` come from the statement cache (`writer::fixed`): rusqlite's
    /// `Transaction` prepares both anew each time, two of the three statements a typical read
    /// prepared (three reads per note). A failed `COMMIT` is rolled back at once; a
    /// transaction a panic left open, before the next read begins.
    fn read<T>(&self, f: impl FnOnce(&Tx<'_>) -> Result<T, Failure>) -> Result<T, JournalError> {
        let conn = self.reader();
        let run = || {
            if !conn.is_autocommit() {
                writer::fixed(&conn, "ROLLBACK")?;
            }
            writer::fixed(&conn, "BEGIN DEFERRED")?;
            let out = f(&Tx::read(&conn));
            match out {
                Ok(out) => {
                    if let Err(e) = writer::fixed(&conn, "COMMIT") {
                        // Not left open: its snapshot would hold back every checkpoint.
                        let _ = writer::fixed(&conn, "ROLLBACK");
                        return Err(e.into());
                    }
                    Ok(out)
                }
                Err(e) => {
                    let _ = writer::fixed(&conn, "ROLLBACK");
                    Err(e)
                }
            }
        };
        run().map_err(|e| self.failed(e))
    }
}

impl Journal {
    /// `failure` with the journal's path attached; one that says the storage refuses writes
    /// is noted first (see [`StorageHealth`]).
    fn failed(&self, failure: Failure) -> JournalError {
        if let Failure::Sql(e) = &failure {
            self.storage.note_error(e);
        }
        attach(&self.path, failure)
    }
}

/// What tests of the journal and of the daemon need to make a commit fail on cue.
#[cfg(test)]
impl Journal {
    /// Holds the writer inside a group of its own until the returned sender sends (or is
    /// dropped): the writes queued meanwhile make the next group, in the order they came.
    pub(crate) fn hold_writer(
        self: &Arc<Self>,
    ) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (running, is_running) = std::sync::mpsc::channel::<()>();
        let j = self.clone();
        let holder = std::thread::spawn(move || {
            j.write(move |_tx| {
                running.send(()).unwrap();
                let _ = released.recv();
                Ok(())
            })
            .unwrap();
        });
        is_running.recv().expect("the holding job runs");
        (release, holder)
    }

    /// Queues a write whose group's COMMIT fails ([`writer::violate_a_deferred_key`]).
    pub(crate) fn queue_a_failing_commit(&self) {
        self.write_queued("a write whose commit fails", writer::violate_a_deferred_key)
            .unwrap();
    }

    /// Takes an fsync of the journal to have failed right before the group holding the
    /// `seq`th write sent ([`writer::Writer::lose_before_group_of`]).
    pub(crate) fn lose_fsync_before_write(&self, seq: u64) {
        self.writer.lose_before_group_of(seq);
    }

    /// How many writes were handed to the writer so far.
    pub(crate) fn writes_sent(&self) -> u64 {
        self.writer.sent()
    }

    /// Makes the commit of the group holding the `seq`th write sent fail, as
    /// [`queue_a_failing_commit`](Self::queue_a_failing_commit) would in that group.
    pub(crate) fn fail_commit_of_write(&self, seq: u64) {
        self.writer.fail_commit_of(seq);
    }

    /// The ids of every run recorded, in order: a gap is a run a failed commit lost.
    pub(crate) fn run_ids(&self) -> Vec<RunId> {
        self.read(|tx| {
            let mut stmt = tx.prepare("SELECT id FROM runs ORDER BY id")?;
            let ids = stmt.query_map([], |r| r.get(0))?;
            Ok(ids.collect::<Result<Vec<RunId>, _>>()?)
        })
        .unwrap()
    }
}

/// A call's outcome queued by [`Journal::call_finished_later`], not yet known committed:
/// [`Journal::settle`] waits for it.
#[derive(Debug)]
pub struct Committed(writer::Later<()>);

/// A write-ahead undo record queued by [`Journal::undo_prepare_later`], not yet known durable:
/// [`Journal::undo_prepared`] waits for it.
#[derive(Debug)]
pub struct UndoPrepared(writer::Later<i64>);

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
        Failure::Lost(run) => JournalError::RunLost {
            path: path.to_path_buf(),
            run,
        },
    }
}

/// Runs one statement through the connection's statement cache. The hot paths run the same
/// dozen statements for every note; preparing them anew each time was a tenth of the CPU
/// of `vaultd once` (BENCHMARKS.md).
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

// Shared by the table files (calls, runs, rates) and the writer, kept here so that none of
// them needs another's internals in both directions.

use events::{EventFields, event};
use rusqlite::{OptionalExtension, params};

/// What a caller waits for before its journal method returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Until the transaction holding the write is durable (`synchronous=FULL`): the default,
    /// and what every record that must precede a side effect needs.
    Durable,
    /// As `Durable`, for the record of something already done (a call's outcome, a note's
    /// move): after a failed fsync it still commits, and its caller hears the error (a restart
    /// may still find it), where a `Durable` write is refused before it runs (`writer.rs`).
    Recorded,
    /// Until the transaction holding the write committed (readers see it), not until it is
    /// durable: a group of such writes commits without an fsync (the writer's `WalSync`).
    Committed,
    /// Until the write ran in the writer's open transaction (its answer, such as a rate-limit
    /// admission, is known and is atomic with every other write), not until it commits.
    Executed,
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

fn run_note(tx: &Tx<'_>, run: RunId) -> Result<String, Failure> {
    tx.refuse_lost(run)?;
    query_one(
        tx,
        "SELECT note FROM runs WHERE id = ?1",
        params![run],
        |r| r.get(0),
    )
    .optional()?
    .ok_or_else(|| Failure::Other(format!("no run {run}")))
}

#[cfg(test)]
mod tests {
    use super::schema::MIGRATIONS;
    use super::testing::*;
    use super::*;
    use crate::call::Effect;

    #[test]
    fn open_sets_wal_and_schema_version() {
        let (dir, journal) = fresh_journal();
        assert_eq!(journal.path(), dir.path().join("journal.sqlite"));
        let conn = journal.reader();
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
