//! Group commit: the one thread that owns the journal's write connection. Writes arrive as
//! jobs on a bounded channel; every job that arrived while the previous commit was on its way
//! to the disk joins the next transaction, so many notes in flight share one fsync.
//!
//! Each job runs inside its own `SAVEPOINT`: a job that fails is rolled back alone and its
//! error goes to its caller only; the others of its group commit. A commit that fails reaches
//! every caller waiting on that group. The thread ends when the channel closes (the
//! [`Journal`](super::Journal) was dropped), after the jobs still queued have run and
//! committed, and closes the connection.

use super::Wait;
use super::rates::{RateCache, RateRoom};
use super::{Failure, StorageHealth, Tx, fsync_error, fsync_failed};
use rusqlite::Connection;
use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{
    Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError, sync_channel,
};
use std::thread::JoinHandle;

/// Jobs that may wait for the writer before a caller blocks on sending: backpressure, so a
/// flood of writes nobody waits for cannot grow without bound.
const QUEUE: usize = 1024;

/// At most this many jobs share one transaction, so one group's latency stays bounded.
const MAX_GROUP: usize = 512;

/// Called once the group's commit is known: `Ok` when it is durable.
type AfterCommit = Box<dyn FnOnce(Result<(), Failure>) + Send>;

/// What a job did inside the group's transaction.
enum Ran {
    /// It succeeded; its caller may still be waiting for the commit.
    Done(Option<AfterCommit>),
    /// It failed and its caller has the error: roll back its savepoint.
    Failed,
    /// It failed and nobody waits for it (a queued job, already logged): roll back its
    /// savepoint, and note a storage failure here, as a caller would (§9.12).
    Unheard(Failure),
}

/// The runs the writer's groups recorded, for [`Tx`]'s `run_floor`, `recorded_run` and
/// `refuse_lost`.
///
/// A claim record answered once it ran (`Wait::Executed`, a `read_only` note's) gives its
/// caller the run's id before its group commits. If that commit then fails, the run is not
/// in the journal, yet the daemon goes on with its id. `runs.id` is a rowid: the next run
/// recorded would take the same id, and the daemon's later writes under it (its call's
/// start and outcome, its note's move) would land under that other run. So this writer
/// never gives an id out twice (a claim's id is above every id it recorded, lost or not),
/// and the runs of a failed group are lost: every write under one is refused, whichever
/// run another process (`vaultd reject`, while the daemon runs) may have recorded with its
/// id since (see "The claim" in `journal/mod.rs` for what the daemon then does).
#[derive(Default)]
pub(super) struct GroupRuns {
    /// Recorded by the group in its transaction now.
    this_group: Vec<super::RunId>,
    /// Lost with a failed commit, for as long as this writer runs (its daemon's note tasks
    /// hold their ids no longer).
    lost: std::collections::HashSet<super::RunId>,
    /// The highest id recorded, lost or not.
    highest: super::RunId,
    /// The runs the newest claim records with a ticket made, newest last: a `read_only`
    /// start queued behind its claim record names its run by the record's ticket. That start
    /// is queued by the same note task right after the record, so at most the records of the
    /// notes in flight come between them: far fewer than [`TICKETS_KEPT`].
    claimed: std::collections::VecDeque<(super::ClaimTicket, super::RunId)>,
}

/// How many claim records' tickets the writer remembers ([`GroupRuns`]).
const TICKETS_KEPT: usize = 1024;

impl GroupRuns {
    pub(super) fn claimed(&mut self, ticket: super::ClaimTicket, run: super::RunId) {
        if self.claimed.len() == TICKETS_KEPT {
            self.claimed.pop_front();
        }
        self.claimed.push_back((ticket, run));
    }

    /// The run the claim record of `ticket` made, if it ran (a lost one included: writes
    /// under it are refused as under any lost run).
    pub(super) fn claimed_as(&self, ticket: super::ClaimTicket) -> Option<super::RunId> {
        self.claimed
            .iter()
            .rev()
            .find(|(t, _)| *t == ticket)
            .map(|(_, run)| *run)
    }

    pub(super) fn recorded(&mut self, run: super::RunId) {
        self.this_group.push(run);
        self.highest = self.highest.max(run);
    }

    pub(super) fn highest(&self) -> super::RunId {
        self.highest
    }

    pub(super) fn is_lost(&self, run: super::RunId) -> bool {
        self.lost.contains(&run)
    }

    /// Where the group's runs are before a job, for [`rolled_back`](Self::rolled_back).
    fn mark(&self) -> usize {
        self.this_group.len()
    }

    /// A job rolled back to its savepoint: the runs it recorded are not in the journal, and
    /// nobody was given their ids (its caller got its error). Their ids stay below the
    /// floor all the same.
    fn rolled_back(&mut self, mark: usize) {
        self.this_group.truncate(mark);
    }

    /// The group's commit went as `committed` says.
    fn ended(&mut self, committed: bool) {
        if committed {
            self.this_group.clear();
        } else {
            self.lost.extend(self.this_group.drain(..));
        }
    }
}

/// One write: given the group's transaction (or the reason there is none), it runs and says
/// how it went.
struct Job {
    /// Its caller waits until the commit is durable: the group commits with an fsync
    /// (`synchronous=FULL`). A group with no such job commits with `synchronous=NORMAL`, no
    /// fsync; the next durable group's fsync, or the writer's flush once idle for
    /// [`FLUSH_LINGER`](crate::files::FLUSH_LINGER), makes it durable (the WAL is one file,
    /// appended in order: its fsync covers every commit before).
    durable: bool,
    /// Refused before it runs after a failed fsync (`Wait::Durable`; not `Wait::Recorded`).
    refusable: bool,
    run: RunJob,
    /// Its number among the writes sent to this writer, from 1 (see `fail_commit_of`).
    #[cfg(test)]
    seq: u64,
}

/// A job's work, given the group's transaction (or the reason there is none).
type RunJob = Box<dyn FnOnce(Result<&Tx<'_>, Failure>) -> Ran + Send>;

/// The sending side, held by the [`Journal`](super::Journal).
pub(super) struct Writer {
    /// None once dropped: closing it ends the thread.
    jobs: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
    counts: Arc<Counts>,
    /// Set while the daemon works on one note alone ([`Writer::set_one_note`]).
    one_note: Arc<AtomicBool>,
}

/// What the thread has done, for tests to prove grouping and fsyncs with, and how long it
/// waits, idle after a commit without an fsync, before it fsyncs the WAL.
struct Counts {
    /// Group transactions run.
    groups: AtomicU64,
    /// fsyncs of the WAL: by a durable group's commit, or by the writer itself.
    wal_syncs: AtomicU64,
    /// Checkpoints the writer ran without an error (ones a reader held back included).
    checkpoints: AtomicU64,
    linger_ms: AtomicU64,
    /// How long the queue must stay empty before a due checkpoint runs (`CHECKPOINT_IDLE`).
    checkpoint_idle_ms: AtomicU64,
    /// Jobs numbered for the thread's queue (one `try_enqueue` then drops on a full queue too).
    #[cfg(test)]
    sent: AtomicU64,
    /// The number of the job whose group's commit is made to fail (0: none).
    #[cfg(test)]
    fail_group_of: AtomicU64,
    /// The number of the job before whose group an fsync of the journal is taken to have
    /// failed (0: none).
    #[cfg(test)]
    lose_before_group_of: AtomicU64,
    /// The writer's own fsyncs of the WAL fail, as a failing disk's would.
    #[cfg(test)]
    fail_wal_syncs: std::sync::atomic::AtomicBool,
    /// The writer cannot open the WAL to fsync it, as with no descriptor left.
    #[cfg(test)]
    fail_wal_opens: std::sync::atomic::AtomicBool,
    /// The writer's checkpoints fail as a failed fsync would fail them.
    #[cfg(test)]
    fail_checkpoints: std::sync::atomic::AtomicBool,
    /// Times the writer opened the WAL to fsync it.
    #[cfg(test)]
    wal_opens: AtomicU64,
}

impl Default for Counts {
    fn default() -> Counts {
        Counts {
            groups: AtomicU64::new(0),
            wal_syncs: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            linger_ms: AtomicU64::new(
                u64::try_from(crate::files::FLUSH_LINGER.as_millis()).unwrap_or(50),
            ),
            checkpoint_idle_ms: AtomicU64::new(
                u64::try_from(CHECKPOINT_IDLE.as_millis()).unwrap_or(20),
            ),
            #[cfg(test)]
            sent: AtomicU64::new(0),
            #[cfg(test)]
            fail_group_of: AtomicU64::new(0),
            #[cfg(test)]
            lose_before_group_of: AtomicU64::new(0),
            #[cfg(test)]
            fail_wal_syncs: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            fail_wal_opens: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            fail_checkpoints: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            wal_opens: AtomicU64::new(0),
        }
    }
}

impl Writer {
    /// Starts the writer thread on `conn` (already configured and migrated).
    pub(super) fn start(
        conn: Connection,
        path: PathBuf,
        storage: Arc<StorageHealth>,
        room: Arc<RateRoom>,
    ) -> std::io::Result<Writer> {
        let (jobs, queue) = sync_channel::<Job>(QUEUE);
        let counts = Arc::new(Counts::default());
        let counter = counts.clone();
        let one_note = Arc::new(AtomicBool::new(false));
        let alone = one_note.clone();
        let thread = std::thread::Builder::new()
            .name("journal-writer".into())
            .spawn(move || {
                write_groups(&conn, &queue, &path, &counter, &alone, &storage, room);
            })?;
        Ok(Writer {
            jobs: Some(jobs),
            thread: Some(thread),
            counts,
            one_note,
        })
    }

    /// Whether the daemon works on one note alone now: while it does, a group none of whose
    /// callers waits for durability commits without an fsync even when it comes right after
    /// another commit (see [`IDLE_BEFORE_NO_FSYNC`]). The fsync that gathers writes under load
    /// only delays a note alone: its call's outcome, queued while its start's group commits,
    /// would wait for that group's fsync and then fsync again, before its results replace
    /// the note. What a crash can lose is the same either way (`journal/mod.rs`, "Commits
    /// without an fsync").
    pub(super) fn set_one_note(&self, alone: bool) {
        self.one_note.store(alone, Ordering::Relaxed);
    }

    #[cfg(test)]
    pub(super) fn groups(&self) -> u64 {
        self.counts.groups.load(Ordering::SeqCst)
    }

    #[cfg(test)]
    pub(super) fn wal_syncs(&self) -> u64 {
        self.counts.wal_syncs.load(Ordering::SeqCst)
    }

    #[cfg(test)]
    pub(super) fn sent(&self) -> u64 {
        self.counts.sent.load(Ordering::SeqCst)
    }

    /// Makes the commit of the group that holds the `seq`th job sent fail, as a full disk
    /// would fail it (by a write of its own added to that group: [`violate_a_deferred_key`]).
    #[cfg(test)]
    pub(super) fn fail_commit_of(&self, seq: u64) {
        self.counts.fail_group_of.store(seq, Ordering::SeqCst);
    }

    /// Makes the writer's own fsyncs of the WAL fail (`true`) or work again.
    #[cfg(test)]
    pub(super) fn fail_wal_syncs(&self, fail: bool) {
        self.counts.fail_wal_syncs.store(fail, Ordering::SeqCst);
    }

    /// Takes an fsync of the journal to have failed right before the group that holds the
    /// `seq`th job sent (as SQLite's failed fsync at the commit before would be noted).
    #[cfg(test)]
    pub(super) fn lose_before_group_of(&self, seq: u64) {
        self.counts
            .lose_before_group_of
            .store(seq, Ordering::SeqCst);
    }

    #[cfg(test)]
    pub(super) fn wal_opens(&self) -> u64 {
        self.counts.wal_opens.load(Ordering::SeqCst)
    }

    #[cfg(test)]
    pub(super) fn checkpoints(&self) -> u64 {
        self.counts.checkpoints.load(Ordering::SeqCst)
    }

    /// Makes the writer's checkpoints fail (`true`) as a failed fsync would, or work again.
    #[cfg(test)]
    pub(super) fn fail_checkpoints(&self, fail: bool) {
        self.counts.fail_checkpoints.store(fail, Ordering::SeqCst);
    }

    /// Makes the writer's opens of the WAL (to fsync it) fail (`true`) or work again.
    #[cfg(test)]
    pub(super) fn fail_wal_opens(&self, fail: bool) {
        self.counts.fail_wal_opens.store(fail, Ordering::SeqCst);
    }

    /// Numbers `job` as the next one sent.
    #[cfg(test)]
    fn number(&self, job: &mut Job) {
        job.seq = self.counts.sent.fetch_add(1, Ordering::SeqCst) + 1;
    }

    /// The idle linger before the writer's own fsync, from the next wait on.
    #[cfg(test)]
    pub(super) fn set_linger(&self, linger: std::time::Duration) {
        let ms = u64::try_from(linger.as_millis()).unwrap_or(u64::MAX);
        self.counts.linger_ms.store(ms, Ordering::SeqCst);
    }

    /// How long the queue must stay empty before a due checkpoint runs, from the next wait on.
    #[cfg(test)]
    pub(super) fn set_checkpoint_idle(&self, idle: std::time::Duration) {
        let ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        self.counts.checkpoint_idle_ms.store(ms, Ordering::SeqCst);
    }

    /// Runs `f` in the writer's next group transaction and returns its answer once `wait`
    /// is met.
    pub(super) fn submit<T: Send + 'static>(
        &self,
        wait: Wait,
        f: impl FnOnce(&Tx<'_>) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, Failure> {
        let (reply, answer) = sync_channel::<Result<T, Failure>>(1);
        self.send(answering(wait, f, move |r| {
            let _ = reply.send(r);
        }))?;
        answer.recv().map_err(|_| stopped())?
    }

    /// [`submit`](Self::submit) for async callers: the job is queued from the caller's task
    /// and its answer awaited, with no thread blocked meanwhile (a blocking-pool thread per
    /// write cost two context switches more, measured in a CPU profile under load).
    pub(super) async fn submit_async<T: Send + 'static>(
        &self,
        wait: Wait,
        f: impl FnOnce(&Tx<'_>) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, Failure> {
        let (reply, answer) = tokio::sync::oneshot::channel::<Result<T, Failure>>();
        self.send_async(answering(wait, f, move |r| {
            let _ = reply.send(r);
        }))
        .await?;
        answer.await.map_err(|_| stopped())?
    }

    /// Queues `f` for the next group from an async caller and returns at once with its
    /// [`Later`] answer: the caller goes on with its own work (a file's fsync, say) while the
    /// group commits, and takes the answer when it needs it.
    pub(super) async fn submit_later<T: Send + 'static>(
        &self,
        wait: Wait,
        f: impl FnOnce(&Tx<'_>) -> Result<T, Failure> + Send + 'static,
    ) -> Result<Later<T>, Failure> {
        let (reply, answer) = sync_channel::<Result<T, Failure>>(1);
        self.send_async(answering(wait, f, move |r| {
            let _ = reply.send(r);
        }))
        .await?;
        Ok(Later(answer))
    }

    /// [`submit_later`](Self::submit_later) for a caller on a blocking thread: queued at once
    /// (waiting for room when the queue is full), answered when the caller asks.
    pub(super) fn submit_later_blocking<T: Send + 'static>(
        &self,
        wait: Wait,
        f: impl FnOnce(&Tx<'_>) -> Result<T, Failure> + Send + 'static,
    ) -> Result<Later<T>, Failure> {
        let (reply, answer) = sync_channel::<Result<T, Failure>>(1);
        self.send(answering(wait, f, move |r| {
            let _ = reply.send(r);
        }))?;
        Ok(Later(answer))
    }

    /// Queues `job` without blocking an async worker (backpressure waits in the blocking pool).
    async fn send_async(&self, #[allow(unused_mut)] mut job: Job) -> Result<(), Failure> {
        let jobs = self.jobs.as_ref().ok_or_else(stopped)?;
        #[cfg(test)]
        self.number(&mut job);
        match jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Disconnected(_)) => Err(stopped()),
            // The queue is full (backpressure): wait for room off the async workers.
            Err(TrySendError::Full(job)) => {
                let jobs = jobs.clone();
                tokio::task::spawn_blocking(move || jobs.send(job))
                    .await
                    .map_err(|_| stopped())?
                    .map_err(|_| stopped())
            }
        }
    }

    /// Queues `f` and returns at once: it joins the next group commit. Its errors, and a
    /// failed commit, are logged, since nobody waits for them.
    pub(super) fn enqueue(
        &self,
        what: &'static str,
        f: impl FnOnce(&Tx<'_>) -> Result<(), Failure> + Send + 'static,
    ) -> Result<(), Failure> {
        self.send(queued(what, f))
    }

    /// [`enqueue`](Self::enqueue) that never waits: `Ok(false)`, and `f` dropped unrun, when
    /// the queue is full.
    pub(super) fn try_enqueue(
        &self,
        what: &'static str,
        f: impl FnOnce(&Tx<'_>) -> Result<(), Failure> + Send + 'static,
    ) -> Result<bool, Failure> {
        let jobs = self.jobs.as_ref().ok_or_else(stopped)?;
        #[allow(unused_mut)]
        let mut job = queued(what, f);
        #[cfg(test)]
        self.number(&mut job);
        match jobs.try_send(job) {
            Ok(()) => Ok(true),
            Err(TrySendError::Full(_)) => Ok(false),
            Err(TrySendError::Disconnected(_)) => Err(stopped()),
        }
    }

    fn send(&self, #[allow(unused_mut)] mut job: Job) -> Result<(), Failure> {
        let jobs = self.jobs.as_ref().ok_or_else(stopped)?;
        #[cfg(test)]
        self.number(&mut job);
        jobs.send(job).map_err(|_| stopped())
    }
}

/// A job nobody waits for; its error is logged as `what`.
fn queued(
    what: &'static str,
    f: impl FnOnce(&Tx<'_>) -> Result<(), Failure> + Send + 'static,
) -> Job {
    Job {
        durable: false,
        refusable: false,
        #[cfg(test)]
        seq: 0,
        run: Box::new(move |tx| match tx.and_then(f) {
            Ok(()) => Ran::Done(None),
            Err(e) => {
                tracing::error!("journal: {what} not recorded: {e}");
                Ran::Unheard(e)
            }
        }),
    }
}

impl Drop for Writer {
    /// Closes the channel and waits for the thread: the jobs still queued commit, and the
    /// connection is closed when `drop` returns (a reopen sees everything).
    fn drop(&mut self) {
        drop(self.jobs.take());
        tracing::debug!(
            groups = self.counts.groups.load(Ordering::SeqCst),
            "journal: writer stopping"
        );
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("journal: the writer thread panicked");
        }
    }
}

/// A job running `f` that gives its answer to `reply` once `wait` is met (or its error, or
/// the failed commit's).
fn answering<T: Send + 'static>(
    wait: Wait,
    f: impl FnOnce(&Tx<'_>) -> Result<T, Failure> + Send + 'static,
    reply: impl FnOnce(Result<T, Failure>) + Send + 'static,
) -> Job {
    Job {
        durable: matches!(wait, Wait::Durable | Wait::Recorded),
        refusable: wait == Wait::Durable,
        #[cfg(test)]
        seq: 0,
        run: Box::new(move |tx| match tx.and_then(f) {
            Err(e) => {
                reply(Err(e));
                Ran::Failed
            }
            Ok(out) if wait == Wait::Executed => {
                reply(Ok(out));
                Ran::Done(None)
            }
            Ok(out) => Ran::Done(Some(Box::new(move |commit: Result<(), Failure>| {
                reply(commit.map(|()| out));
            }))),
        }),
    }
}

/// The answer of a job queued by [`Writer::submit_later`], taken with [`Later::wait`].
#[derive(Debug)]
pub(super) struct Later<T>(Receiver<Result<T, Failure>>);

impl<T> Later<T> {
    /// Blocks until the job's wait is met (at once when it already is).
    pub(super) fn wait(self) -> Result<T, Failure> {
        self.0.recv().map_err(|_| stopped())?
    }
}

fn stopped() -> Failure {
    Failure::Other("the journal's writer has stopped".to_string())
}

/// The writer thread: one transaction per group of jobs, until the channel closes.
fn write_groups(
    conn: &Connection,
    queue: &Receiver<Job>,
    path: &std::path::Path,
    counts: &Counts,
    one_note: &AtomicBool,
    storage: &StorageHealth,
    room: Arc<RateRoom>,
) {
    let rates = RefCell::new(RateCache::new(room));
    let runs = RefCell::new(GroupRuns::default());
    let mut sync = WalSync::default();
    sync.keep_open(path);
    // SQLite's automatic checkpoint runs inside a commit and drops its error, a failed fsync
    // among them (which Linux reports once: the next fsync would not say it). This thread
    // checkpoints instead, after `CHECKPOINT_EVERY` groups once its queue is quiet, and hears it.
    if let Err(e) = conn.pragma_update(None, "wal_autocheckpoint", 0) {
        tracing::warn!("journal: cannot turn SQLite's automatic checkpoint off: {e}");
    }
    let mut since_checkpoint = 0u32;
    // A checkpoint is due (`CHECKPOINT_EVERY` groups since the last) and waits for the queue
    // to stay empty for `CHECKPOINT_IDLE`, or for `CHECKPOINT_LATEST` groups.
    let mut checkpoint_due = false;
    loop {
        let waiting_since = std::time::Instant::now();
        let ms = |a: &AtomicU64| std::time::Duration::from_millis(a.load(Ordering::SeqCst));
        // Commits not durable yet: flushed once the queue has been idle for a linger (or
        // sooner, with a due checkpoint). A due checkpoint: run once it has been idle for
        // `CHECKPOINT_IDLE`, between notes rather than in front of the next write of the
        // note at work (BENCHMARKS.md, issue 31).
        let first = if sync.behind || checkpoint_due {
            let linger = ms(&counts.linger_ms);
            let wait = match (checkpoint_due, sync.behind) {
                (true, true) => linger.min(ms(&counts.checkpoint_idle_ms)),
                (true, false) => ms(&counts.checkpoint_idle_ms),
                _ => linger,
            };
            match queue.recv_timeout(wait) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => {
                    let due = std::mem::take(&mut checkpoint_due);
                    let state = (&mut sync, &mut since_checkpoint);
                    when_quiet(conn, path, counts, storage, state, due);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match queue.recv() {
                Ok(job) => job,
                Err(_) => break,
            }
        };
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(job) => group.push(job),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        #[cfg(test)]
        {
            let doomed = counts.fail_group_of.load(Ordering::SeqCst);
            if doomed != 0 && group.iter().any(|job| job.seq == doomed) {
                group.push(queued("a write whose commit fails", violate_a_deferred_key));
            }
            let lost = counts.lose_before_group_of.load(Ordering::SeqCst);
            if lost != 0 && group.iter().any(|job| job.seq == lost) {
                storage.note_error(&fsync_error("an fsync failed (a test's)"));
            }
        }
        // SQLite's own failed fsync at a commit is noted in `storage` (a CLI's is not seen
        // here: its process reported it, `docs/reliability.md`).
        sync.lost |= storage.until_restart();
        // Without an fsync only a group that came to an idle writer, or one of a note worked on
        // alone: under load every group fsyncs, and the fsync's time is what gathers the next
        // writes into one group.
        let idle =
            waiting_since.elapsed() >= IDLE_BEFORE_NO_FSYNC || one_note.load(Ordering::Relaxed);
        // After a failed fsync no commit is made durable (its durable callers hear the error):
        // an fsync would only fail again.
        let full = !sync.lost && (!idle || group.iter().any(|job| job.durable));
        sync.set(conn, full);
        let changes = conn.total_changes();
        // Counted before its callers are answered: one who reads the count after its write
        // returned sees its own group (the tests count groups so).
        counts.groups.fetch_add(1, Ordering::SeqCst);
        let refused = sync.lost;
        commit_group(
            conn,
            group,
            path,
            (&rates, &runs),
            (storage, refused),
            &mut || {
                if sync.lost {
                    // An fsync failed before: nothing is known durable since (`flush_wal`);
                    // only the group's durable callers hear it.
                    return Err(WalSync::lost_error());
                }
                if !full {
                    return Ok(());
                }
                if sync.full != Some(true) {
                    // `synchronous` could not be set to FULL: this commit had no fsync.
                    sync.flush_wal(conn, path, counts)
                } else if conn.total_changes() != changes {
                    counts.wal_syncs.fetch_add(1, Ordering::SeqCst); // SQLite's, at the commit
                    sync.behind = false;
                    Ok(())
                } else if sync.behind {
                    // A durable group that wrote nothing (`Journal::flush`) commits no WAL
                    // frame, so SQLite fsyncs nothing: the commits before it are made durable here.
                    sync.flush_wal(conn, path, counts)
                } else {
                    Ok(())
                }
            },
        );
        if !full {
            sync.behind = true;
        }
        since_checkpoint += 1;
        // Not after a failed fsync (SQLite's at this group's commit included): what it would
        // copy may be lost; the WAL then grows with the few writes that still commit.
        checkpoint_due =
            since_checkpoint >= CHECKPOINT_EVERY && !sync.lost && !storage.until_restart();
        if checkpoint_due && since_checkpoint >= CHECKPOINT_LATEST {
            // Never idle for long (under load): now, as the groups keep coming.
            checkpoint_due = false;
            try_checkpoint(
                conn,
                path,
                counts,
                storage,
                &mut sync,
                &mut since_checkpoint,
            );
        }
    }
    // A due checkpoint is not left to SQLite's at close, which drops its errors.
    let state = (&mut sync, &mut since_checkpoint);
    when_quiet(conn, path, counts, storage, state, checkpoint_due);
}

/// What the writer does once its queue is quiet, and at its end: a due checkpoint, then the
/// flush of the commits made without an fsync. The flush is promised within a linger of
/// quiet, so it is not left to a further one after the checkpoint (which fsyncs nothing
/// when a reader held it back).
fn when_quiet(
    conn: &Connection,
    path: &std::path::Path,
    counts: &Counts,
    storage: &StorageHealth,
    (sync, since_checkpoint): (&mut WalSync, &mut u32),
    checkpoint_due: bool,
) {
    if checkpoint_due {
        try_checkpoint(conn, path, counts, storage, sync, since_checkpoint);
    }
    if sync.behind
        && let Err(Failure::Sql(e)) = sync.flush_wal(conn, path, counts)
    {
        storage.note_error(&e);
    }
}

/// Groups between the writer's checkpoints: SQLite's automatic one came at 1,000 WAL pages,
/// about 60 groups of a note's writes.
const CHECKPOINT_EVERY: u32 = 64;

/// How long the queue must stay empty before a due checkpoint runs. A checkpoint takes a few
/// milliseconds (the database's fsync among them), and a write queued meanwhile waits for it:
/// run at once after the 64th group, it came just before the next write of the note at work
/// for about one lone note in 25. A note's own writes come a call apart; 20 ms of quiet is
/// almost always between notes (or during a slow call, which it does not delay).
const CHECKPOINT_IDLE: std::time::Duration = std::time::Duration::from_millis(20);

/// Groups by which a due checkpoint runs however busy the queue. Under load, or with notes
/// coming back to back, the queue is never empty for `CHECKPOINT_IDLE`: the checkpoint then
/// runs little later than it did at once, since a later one copies a longer WAL and keeps the
/// write behind it waiting longer (at twice `CHECKPOINT_EVERY`, drop-to-Done p99 of notes
/// 4 ms apart went from 15–22 ms to 22–38 ms, BENCHMARKS.md).
const CHECKPOINT_LATEST: u32 = CHECKPOINT_EVERY + 8;

/// Runs a checkpoint and takes in its outcome: a failed fsync in it is one like any other.
/// None after a failed fsync (noted since the checkpoint fell due, too): what it would copy
/// may be lost.
fn try_checkpoint(
    conn: &Connection,
    path: &std::path::Path,
    counts: &Counts,
    storage: &StorageHealth,
    sync: &mut WalSync,
    since_checkpoint: &mut u32,
) {
    if sync.lost || storage.until_restart() {
        return;
    }
    match checkpoint(conn, counts) {
        // A reader held part of it back: tried again after the next group.
        Ok(false) => {}
        Ok(true) => *since_checkpoint = 0,
        Err(e) => {
            *since_checkpoint = 0;
            if fsync_failed(&e) {
                sync.lost = true;
            }
            storage.note_error(&e);
            tracing::warn!(path = %path.display(), "journal: checkpoint failed: {e}");
        }
    }
}

/// Copies the WAL's commits into the database without waiting for readers (`PASSIVE`); its
/// fsyncs' failures are returned, not dropped. True when it copied every commit.
fn checkpoint(conn: &Connection, counts: &Counts) -> rusqlite::Result<bool> {
    #[cfg(test)]
    if counts.fail_checkpoints.load(Ordering::SeqCst) {
        return Err(fsync_error("a checkpoint's fsync failed (a test's)"));
    }
    // One row: busy (1 when held back), pages in the WAL, pages copied.
    let (busy, log, copied): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
    counts.checkpoints.fetch_add(1, Ordering::SeqCst);
    Ok(busy == 0 && copied >= log)
}

/// How long the writer must have waited for a group's first write for the group to commit
/// without an fsync (when none of its callers waits for durability): notes arriving one at a
/// time. Busier, a commit comes sooner after the last, every group fsyncs, and the fsync's
/// time gathers the next writes into one group (without it, groups of one write each cost
/// a fifth of the throughput: the same pages written to the WAL for every write).
const IDLE_BEFORE_NO_FSYNC: std::time::Duration = std::time::Duration::from_micros(200);

/// The write connection's `synchronous` setting, switched per group (it cannot change
/// inside a transaction), and whether commits since the last fsync are not durable yet.
#[derive(Default)]
struct WalSync {
    /// `Some(true)`: FULL (every commit fsyncs the WAL); `Some(false)`: NORMAL.
    full: Option<bool>,
    behind: bool,
    /// An fsync of the WAL failed: nothing is known durable from then on (`flush_wal`).
    lost: bool,
    /// The WAL could not be opened to fsync it (said once, until it can).
    cannot_open: bool,
    /// The WAL, open since its first fsync here, and its (device, inode): kept, so that a
    /// writeback error of its pages is reported to this descriptor whoever met it first.
    /// Linux reports such an error once to each open file that was open when it happened
    /// (and to the first one opened after, while nobody has seen it): a WAL opened afresh
    /// for each fsync would miss the error that a `vaultd approve` in its own process, or
    /// SQLite's own fsync, had already been told of.
    kept: Option<(std::fs::File, (u64, u64))>,
}

impl WalSync {
    fn set(&mut self, conn: &Connection, full: bool) {
        if self.full == Some(full) {
            return;
        }
        let sql = if full {
            "PRAGMA synchronous = FULL"
        } else {
            "PRAGMA synchronous = NORMAL"
        };
        match fixed(conn, sql) {
            Ok(()) => self.full = Some(full),
            // Left as it was: FULL is only slower, NORMAL is then flushed by `behind`.
            Err(e) => tracing::error!("journal: cannot set synchronous: {e}"),
        }
    }

    /// fsyncs the WAL file: every commit so far is durable. An fsync that failed may have
    /// left WAL pages unwritten that a later fsync, succeeding, does not write again (Linux
    /// reports a writeback error once), and SQLite's recovery stops at the first frame missing
    /// from the WAL's checksum chain: from the first failure on, every call fails (`lost`),
    /// with the error SQLite gives for a failed fsync, which pauses claiming until a restart
    /// (`StorageHealth`). A WAL that cannot be opened (no descriptor left) is fsynced through
    /// SQLite's own handle instead: a small write committed with `synchronous=FULL`.
    fn flush_wal(
        &mut self,
        conn: &Connection,
        path: &std::path::Path,
        counts: &Counts,
    ) -> Result<(), Failure> {
        if self.lost {
            self.behind = false; // nothing to try again: no idle linger either
            return Err(WalSync::lost_error());
        }
        counts.wal_syncs.fetch_add(1, Ordering::SeqCst);
        let wal = wal_path(path);
        // The one kept, while it is still the file at the path (SQLite reuses its WAL; a
        // removed one is made anew). A path that cannot be looked at now (a stale handle, an
        // I/O error) keeps it: reopening would lose what it has yet to report.
        let current = std::fs::metadata(&wal).map(|m| wal_identity(&m));
        let kept = self.kept.take().filter(|(_, id)| match &current {
            Ok(now) => now == id,
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        });
        #[cfg(test)]
        let kept = kept.filter(|_| !counts.fail_wal_opens.load(Ordering::SeqCst));
        let opened = match kept {
            Some(kept) => Ok(kept),
            None => {
                #[cfg(test)]
                counts.wal_opens.fetch_add(1, Ordering::SeqCst);
                #[cfg(test)]
                let opened = if counts.fail_wal_opens.load(Ordering::SeqCst) {
                    Err(std::io::Error::from_raw_os_error(libc::EMFILE))
                } else {
                    std::fs::File::open(&wal)
                };
                #[cfg(not(test))]
                let opened = std::fs::File::open(&wal);
                opened.and_then(|f| {
                    let id = wal_identity(&f.metadata()?);
                    Ok((f, id))
                })
            }
        };
        let (wal, id) = match opened {
            Ok(wal) => wal,
            // No WAL: checkpointed and removed, and a checkpoint fsyncs the database.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.behind = false;
                return Ok(());
            }
            Err(e) => {
                // Out of descriptors, say: SQLite's own handle fsyncs a small write's commit
                // instead, and with it every commit before.
                if !std::mem::replace(&mut self.cannot_open, true) {
                    tracing::warn!(path = %path.display(), "journal: cannot open the WAL to fsync it ({e}); a small write fsyncs it instead");
                }
                let cannot = |why: String| {
                    Failure::Sql(rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                        Some(why),
                    ))
                };
                if !conn.is_autocommit() {
                    // A rollback that failed left a transaction open: the write would join it.
                    return Err(cannot(format!(
                        "cannot open the journal's WAL to fsync it: {e}"
                    )));
                }
                self.set(conn, true);
                let probe = conn.execute(
                    "INSERT INTO storage_probe (id, at_ms) VALUES (1, ?1)
                     ON CONFLICT (id) DO UPDATE SET at_ms = excluded.at_ms",
                    [super::now_ms()],
                );
                return match probe {
                    Ok(_) if self.full == Some(true) => {
                        self.behind = false;
                        Ok(())
                    }
                    // A storage failure that pauses claiming until a probe write works.
                    Ok(_) => Err(cannot(format!(
                        "cannot fsync the journal's WAL: it cannot be opened ({e})"
                    ))),
                    Err(e) => {
                        if fsync_failed(&e) {
                            self.lost = true;
                            self.behind = false;
                        }
                        Err(Failure::Sql(e))
                    }
                };
            }
        };
        self.cannot_open = false;
        #[cfg(test)]
        let synced = if counts.fail_wal_syncs.load(Ordering::SeqCst) {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        } else {
            wal.sync_data()
        };
        #[cfg(not(test))]
        let synced = wal.sync_data();
        self.kept = Some((wal, id));
        if let Err(e) = synced {
            tracing::error!(path = %path.display(), "journal: cannot fsync the WAL: {e}");
            self.lost = true;
            self.behind = false;
            return Err(WalSync::lost_error());
        }
        self.behind = false;
        Ok(())
    }

    /// Opens the WAL of the journal at `path` and keeps it, where there is one: from the
    /// writer's start, so that no writeback error before its first fsync goes unheard.
    fn keep_open(&mut self, path: &std::path::Path) {
        if let Ok(file) = std::fs::File::open(wal_path(path))
            && let Ok(meta) = file.metadata()
        {
            self.kept = Some((file, wal_identity(&meta)));
        }
    }

    /// What every durable caller hears once an fsync of the WAL failed.
    fn lost_error() -> Failure {
        Failure::Sql(fsync_error("an fsync of the WAL failed"))
    }
}

/// The WAL of the journal at `path`.
fn wal_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    wal.into()
}

/// A file's (device, inode).
fn wal_identity(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Runs `group` in one `BEGIN IMMEDIATE` transaction, each job in its own savepoint, then
/// commits and tells every waiting caller how the commit went.
///
/// `rates` mirrors the start records the jobs insert: whatever is rolled back (a failed job, a
/// failed commit) empties it, and it is emptied too when another process committed since the
/// last group (it reloads from the table when next asked).
fn commit_group(
    conn: &Connection,
    group: Vec<Job>,
    path: &std::path::Path,
    (rates, runs): (&RefCell<RateCache>, &RefCell<GroupRuns>),
    (storage, lost): (&StorageHealth, bool),
    before_answers: &mut dyn FnMut() -> Result<(), Failure>,
) {
    // After a failed fsync nothing can be made durable: a durable write is refused before it
    // runs, so its error always means "not recorded", as when the storage refuses writes (a
    // start committed but answered with an error would read as a call that may have run).
    // The record of something already done (`Wait::Recorded`) still commits.
    let (group, refused): (Vec<Job>, Vec<Job>) =
        group.into_iter().partition(|job| !(lost && job.refusable));
    for job in refused {
        (job.run)(Err(WalSync::lost_error()));
    }
    if group.is_empty() {
        return;
    }
    let begun = fixed(conn, "BEGIN IMMEDIATE").and_then(|()| rates.borrow_mut().check(conn));
    if let Err(e) = begun {
        storage.note_error(&e);
        tracing::error!(path = %path.display(), "journal: cannot begin a transaction: {e}");
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for job in group {
            (job.run)(Err(shared(&e)));
        }
        return;
    }
    let tx = Tx {
        conn,
        rates: Some(rates),
        runs: Some(runs),
    };
    // Each caller still waiting, and whether it waits for durability.
    let mut waiting: Vec<(bool, AfterCommit)> = Vec::with_capacity(group.len());
    for job in group {
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back on an earlier job's error (a full
            // disk, an I/O error): a job run now would commit on its own, while the group's
            // COMMIT fails and tells its callers otherwise.
            (job.run)(Err(Failure::Other(
                "the group's transaction was rolled back after an earlier write's error"
                    .to_string(),
            )));
            continue;
        }
        if let Err(e) = fixed(conn, "SAVEPOINT job") {
            (job.run)(Err(shared(&e)));
            continue;
        }
        let runs_before = runs.borrow().mark();
        let durable = job.durable;
        // A panicking job (a bug) is rolled back like a failed one; its caller sees the
        // writer drop its reply.
        let ran = catch_unwind(AssertUnwindSafe(|| (job.run)(Ok(&tx)))).unwrap_or_else(|_| {
            tracing::error!("journal: a write panicked; rolled back");
            Ran::Failed
        });
        let end = match ran {
            Ran::Done(after) => {
                waiting.extend(after.map(|after| (durable, after)));
                fixed(conn, "RELEASE job")
            }
            failed => {
                if let Ran::Unheard(Failure::Sql(e)) = &failed {
                    storage.note_error(e);
                }
                rates.borrow_mut().clear();
                runs.borrow_mut().rolled_back(runs_before);
                if conn.is_autocommit() {
                    // SQLite rolled the whole transaction back: no savepoint is left to end.
                    Ok(())
                } else {
                    fixed(conn, "ROLLBACK TO job").and_then(|()| fixed(conn, "RELEASE job"))
                }
            }
        };
        if let Err(e) = end {
            tracing::error!("journal: cannot end a savepoint: {e}");
        }
    }
    let commit = fixed(conn, "COMMIT");
    if let Err(e) = &commit {
        storage.note_error(e);
        tracing::error!(path = %path.display(), "journal: commit failed: {e}");
        rates.borrow_mut().clear();
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
    }
    runs.borrow_mut().ended(commit.is_ok());
    // Committed, but not durable when the fsync after it failed: only a caller who waits
    // for durability hears that (its write is in the journal, and stays there).
    let synced = match &commit {
        Ok(()) => before_answers(),
        Err(_) => Ok(()),
    };
    if let Err(Failure::Sql(e)) = &synced {
        storage.note_error(e);
    }
    for (durable, after) in waiting {
        after(match (&commit, &synced) {
            (Err(e), _) => Err(shared(e)),
            (Ok(()), Err(f)) if durable => Err(again(f)),
            _ => Ok(()),
        });
    }
}

/// One of the statements every group (and every read, `Journal::read`) runs, prepared once:
/// parsing them anew for every job was ~7% of the daemon's CPU under load (measured in a CPU
/// profile).
pub(super) fn fixed(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// A write whose group's COMMIT fails: a foreign key checked only at the commit, after every
/// job of the group ran, as a full disk or an I/O error would fail it (but not a failure of
/// the storage: nothing is paused).
#[cfg(test)]
pub(super) fn violate_a_deferred_key(tx: &Tx<'_>) -> Result<(), Failure> {
    tx.execute_batch("PRAGMA defer_foreign_keys = ON")?;
    tx.execute(
        "INSERT INTO calls (run_id, call_id, tool) VALUES (999, 'c-x', 't')",
        [],
    )?;
    Ok(())
}

/// A copy of `f` for each caller it must reach.
fn again(f: &Failure) -> Failure {
    match f {
        Failure::Sql(e) => shared(e),
        Failure::Other(s) => Failure::Other(s.clone()),
        Failure::Lost(run) => Failure::Lost(*run),
    }
}

/// A copy of `e` for each caller it must reach (`rusqlite::Error` is not `Clone`).
fn shared(e: &rusqlite::Error) -> Failure {
    match e {
        rusqlite::Error::SqliteFailure(code, message) => {
            Failure::Sql(rusqlite::Error::SqliteFailure(*code, message.clone()))
        }
        other => Failure::Other(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use crate::journal::testing::*;
    use crate::journal::{Failure, Journal, JournalError, LogFilter};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    /// Holds the writer thread inside a job until the returned sender is dropped or sent
    /// to, so that the writes made meanwhile all queue for the next group.
    fn hold_the_writer(journal: &Arc<Journal>) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        journal.hold_writer()
    }

    /// Starts `n` threads, each running `write(i)`, and returns once every one of them is
    /// about to call into the journal (and a little longer, for the send itself).
    fn writers<T: Send + 'static>(
        n: usize,
        write: impl Fn(usize) -> Result<T, JournalError> + Send + Sync + 'static,
    ) -> Vec<std::thread::JoinHandle<Result<T, JournalError>>> {
        let write = Arc::new(write);
        let entered = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let (write, entered) = (write.clone(), entered.clone());
                std::thread::spawn(move || {
                    entered.fetch_add(1, Ordering::SeqCst);
                    write(i)
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while entered.load(Ordering::SeqCst) < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(200));
        threads
    }

    fn shared_journal() -> (tempfile::TempDir, Arc<Journal>) {
        let (dir, journal) = fresh_journal();
        (dir, Arc::new(journal))
    }

    /// The async path: answers after the commit (`Durable`) or the run (`Executed`), and a
    /// full queue makes the caller wait for room (off the async worker) instead of failing.
    /// Writes nobody waits to be durable commit without an fsync; a durable write's commit
    /// fsyncs the WAL (and with it every commit before), one that wrote nothing
    /// (`flush`) has the writer fsync it, and so has a linger of idleness after a commit
    /// without one.
    #[tokio::test]
    async fn only_durable_writes_wait_for_an_fsync_and_the_rest_follow_within_a_linger() {
        let (_dir, journal) = fresh_journal();
        journal.writer.set_linger(Duration::from_secs(3600)); // no idle fsync until the end
        let run = journal.begin_run("In_Progress/a.md").unwrap(); // durable
        let synced = || journal.writer.wal_syncs();
        let at_start = synced();
        for id in ["c-1", "c-2", "c-3"] {
            outcome_alone(&journal, run, id).await;
            assert_eq!(synced(), at_start, "no fsync for a commit nobody waits on");
        }
        journal.flush().unwrap();
        assert_eq!(synced(), at_start + 1, "a flush makes them durable");
        journal.flush().unwrap();
        assert_eq!(synced(), at_start + 1, "nothing left to make durable");
        // Durable write after a non-durable one: its own commit's fsync covers both.
        std::thread::sleep(Duration::from_millis(5));
        let committed = journal
            .call_finished_later(run, &search_ok("c-4"), false)
            .await
            .unwrap();
        journal.settle(committed).unwrap();
        journal.begin_run("In_Progress/b.md").unwrap();
        assert_eq!(synced(), at_start + 2);
        // Idle after a commit without an fsync: the writer makes it durable itself.
        journal.writer.set_linger(Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(5));
        let committed = journal
            .call_finished_later(run, &search_ok("c-5"), false)
            .await
            .unwrap();
        journal.settle(committed).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while synced() == at_start + 2 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(synced(), at_start + 3, "fsynced once idle for a linger");
    }

    /// Records call `id`'s outcome, nobody waiting for it to be durable, one note at a
    /// time (the writer idle before it: busy, every group fsyncs), and waits until readers
    /// see it.
    async fn outcome_alone(journal: &Journal, run: crate::journal::RunId, id: &str) {
        std::thread::sleep(Duration::from_millis(5));
        let committed = journal
            .call_finished_later(run, &search_ok(id), false)
            .await
            .unwrap();
        journal.settle(committed).unwrap();
    }

    /// The writer's own fsyncs of the WAL go through one descriptor, kept open from the
    /// first: Linux reports a writeback error to each file open when it happened, and a WAL
    /// opened afresh for each fsync would not hear of one another process saw first.
    #[tokio::test]
    async fn the_writer_fsyncs_the_wal_through_one_descriptor_it_keeps() {
        let (_dir, journal) = fresh_journal();
        journal.writer.set_linger(Duration::from_secs(3600)); // no idle fsync meanwhile
        journal.set_one_note(true); // what nobody waits on commits without an fsync
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let (syncs, opens) = (journal.writer.wal_syncs(), journal.writer.wal_opens());
        for id in ["c-1", "c-2", "c-3"] {
            outcome_alone(&journal, run, id).await;
            journal.flush().unwrap();
        }
        assert_eq!(
            journal.writer.wal_syncs(),
            syncs + 3,
            "three fsyncs by the writer"
        );
        // Open since the writer started: not opened again for them.
        assert_eq!(
            journal.writer.wal_opens(),
            opens,
            "the WAL was opened again for its fsyncs"
        );
    }

    /// A journal with a run of a.md, whose outcome c-1 committed without an fsync: the writer
    /// is behind, and only a flush (no idle linger) makes c-1 durable.
    async fn behind_by_one_outcome() -> (tempfile::TempDir, Journal, crate::journal::RunId) {
        let (dir, journal) = fresh_journal();
        journal.writer.set_linger(Duration::from_secs(3600)); // no idle fsync meanwhile
        journal.set_one_note(true); // what nobody waits on commits without an fsync
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let committed = journal
            .call_finished_later(run, &search_ok("c-1"), false)
            .await
            .unwrap();
        journal.settle(committed).unwrap();
        (dir, journal, run)
    }

    /// The writer's own fsync of the WAL fails (a failing disk): the durable caller it was for
    /// is told so, not that its writes are durable, and so is every durable caller after it,
    /// even once fsyncs work again (a later fsync need not write what the failed one lost);
    /// claiming pauses until a restart, whose journal takes writes again.
    #[tokio::test]
    async fn after_an_fsync_of_the_wal_fails_nothing_is_told_durable_until_a_restart() {
        let (dir, journal, run) = behind_by_one_outcome().await;
        journal.writer.fail_wal_syncs(true);
        let err = journal
            .flush()
            .expect_err("the fsync that makes c-1 durable failed");
        assert!(err.to_string().contains("fsync of the WAL failed"), "{err}");
        let why = journal.storage_failure().expect("claiming pauses");
        assert!(why.contains("restart vaultd"), "{why}");
        assert!(journal.storage_failure_until_restart());
        journal.writer.fail_wal_syncs(false);
        assert!(journal.flush().is_err(), "not durable after a failed fsync");
        let err = journal
            .begin_run("In_Progress/b.md")
            .expect_err("a durable write that SQLite would fsync itself is refused too");
        assert!(err.to_string().contains("fsync of the WAL failed"), "{err}");
        assert!(!journal.storage_recovered(), "a probe does not end it");
        assert!(journal.storage_failure().is_some());
        // The outcome of a call that ran (a side effect's, waited durable) still commits: its
        // caller hears the error, and a restart finds it.
        let recorded = journal
            .call_finished_later(run, &search_ok("c-2"), true)
            .await
            .unwrap();
        assert!(journal.settle(recorded).is_err(), "not known durable");
        // A restart: the journal opened again takes writes, and c-1 (in the page cache here,
        // not lost) is read back.
        drop(journal);
        let journal = Journal::open(dir.path()).expect("open again");
        assert_eq!(journal.storage_failure(), None);
        journal.flush().unwrap();
        journal.begin_run("In_Progress/c.md").unwrap();
        let log = journal.log(&LogFilter::default()).unwrap();
        let ends = log.iter().filter(|e| e.event == "call_end").count();
        assert_eq!(ends, 2, "c-1 and c-2 committed, and kept");
        assert_eq!(
            journal.run_ids().len(),
            2,
            "a.md's and c.md's runs; b.md's was refused"
        );
    }

    /// SQLite's own fsync failing at a commit makes the failure last until a restart as the
    /// writer's own does, and from then on a durable write is refused before it runs: its
    /// error means "not recorded" (a start answered with an error but committed would, after
    /// the restart, read as a call that may have run). Writes nobody waits on still commit.
    #[test]
    fn after_sqlite_reports_a_failed_fsync_durable_writes_are_refused_unrecorded() {
        let (_dir, journal) = shared_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        journal.storage.note_error(&rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR_FSYNC),
            None,
        ));
        assert!(journal.storage_failure_until_restart());
        let err = journal
            .begin_run("In_Progress/b.md")
            .expect_err("a durable write after a failed fsync");
        assert!(err.to_string().contains("fsync of the WAL failed"), "{err}");
        assert!(journal.flush().is_err());
        assert_eq!(journal.run_ids(), vec![run], "b.md's run was not recorded");
        journal
            .write_queued("a write nobody waits on", |tx| {
                tx.execute(
                    "INSERT INTO events (at_ms, event, note) VALUES (0, 'kept', 'x')",
                    [],
                )?;
                Ok(())
            })
            .unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        let kept = || {
            journal
                .log(&LogFilter::default())
                .unwrap()
                .iter()
                .any(|e| e.event == "kept")
        };
        while !kept() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(kept(), "committed");
        assert!(!journal.storage_recovered());
    }

    /// A WAL the writer cannot open to fsync it (no descriptor left) is fsynced through
    /// SQLite's own handle instead: the flush is durable, and nothing pauses.
    #[tokio::test]
    async fn a_wal_that_cannot_be_opened_is_made_durable_by_a_small_write() {
        let (_dir, journal, _run) = behind_by_one_outcome().await;
        journal.writer.fail_wal_opens(true);
        let before = journal.writer.wal_syncs();
        journal.flush().expect("durable through SQLite's handle");
        assert_eq!(journal.writer.wal_syncs(), before + 1);
        assert_eq!(journal.storage_failure(), None, "nothing pauses");
        let probed: i64 = journal
            .read(|tx| Ok(tx.query_row("SELECT count(*) FROM storage_probe", [], |r| r.get(0))?))
            .unwrap();
        assert_eq!(probed, 1, "the small write");
        journal.flush().expect("nothing left to make durable");
        assert_eq!(journal.writer.wal_syncs(), before + 1);
    }

    /// Polls `cond` every millisecond for up to 10 s; true once it holds.
    fn within_10s(cond: impl Fn() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while !cond() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        cond()
    }

    /// SQLite's automatic checkpoint is off on the writer's connection (it drops its errors);
    /// the writer checkpoints every `CHECKPOINT_EVERY` groups itself (once its queue is idle),
    /// and a checkpoint whose fsync fails is a failed fsync like any other: claiming pauses
    /// until a restart.
    #[test]
    fn the_writer_checkpoints_itself_and_hears_a_failed_fsync() {
        let (_dir, journal) = shared_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let before = journal.writer.checkpoints();
        for i in 0..super::CHECKPOINT_EVERY {
            journal
                .call_finished(run, &search_ok(&format!("c-{i}")))
                .unwrap();
        }
        assert!(
            within_10s(|| journal.writer.checkpoints() > before),
            "checkpointed"
        );
        let wal = crate::journal::writer::wal_path(journal.path());
        assert!(wal.exists());
        journal.writer.fail_checkpoints(true);
        for i in 0..super::CHECKPOINT_EVERY {
            let _ = journal.call_finished(run, &search_ok(&format!("d-{i}")));
        }
        assert!(
            within_10s(|| journal.storage_failure().is_some()),
            "claiming pauses"
        );
        let why = journal.storage_failure().unwrap();
        assert!(why.contains("restart vaultd"), "{why}");
        assert!(journal.begin_run("In_Progress/b.md").is_err());
    }

    /// A due checkpoint waits for the queue to stay empty (`CHECKPOINT_IDLE`), so that it does
    /// not come between a lone note's writes; groups that keep coming get one by
    /// `CHECKPOINT_LATEST` all the same.
    #[test]
    fn a_due_checkpoint_waits_for_a_quiet_queue_or_for_the_latest_group() {
        let (_dir, journal) = shared_journal();
        // Never quiet enough: only the latest group can bring the checkpoint (nor any idle
        // fsync of the WAL, whose wait a due checkpoint shares).
        journal
            .writer
            .set_checkpoint_idle(Duration::from_secs(3600));
        journal.writer.set_linger(Duration::from_secs(3600));
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let groups = || journal.writer.groups();
        let before = journal.writer.checkpoints();
        let mut i = 0;
        let mut write = || {
            i += 1;
            journal
                .call_finished(run, &search_ok(&format!("c-{i}")))
                .unwrap();
        };
        // Up to the latest group but one: due since `CHECKPOINT_EVERY`, never run.
        while groups() < u64::from(super::CHECKPOINT_LATEST) - 1 {
            write();
        }
        assert!(groups() > u64::from(super::CHECKPOINT_EVERY), "due");
        assert_eq!(journal.writer.checkpoints(), before, "put off");
        write();
        write(); // queued behind the checkpoint of the group before it
        assert_eq!(journal.writer.checkpoints(), before + 1, "at the latest");
        // Due again, and quiet: it runs with no write after it.
        journal.writer.set_checkpoint_idle(Duration::from_millis(1));
        let from = groups();
        while groups() < from + u64::from(super::CHECKPOINT_EVERY) {
            write();
        }
        assert!(
            within_10s(|| journal.writer.checkpoints() == before + 2),
            "run once the queue was quiet"
        );
    }

    /// Commits made without an fsync are flushed within a linger of quiet: a due checkpoint,
    /// whose shorter wait comes first, does not push the flush a whole linger further.
    #[test]
    fn a_due_checkpoint_does_not_put_off_the_flush_of_commits_without_an_fsync() {
        let (_dir, journal) = shared_journal();
        journal
            .writer
            .set_checkpoint_idle(Duration::from_secs(3600));
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        for i in 0..super::CHECKPOINT_EVERY {
            journal
                .call_finished(run, &search_ok(&format!("c-{i}")))
                .unwrap();
        }
        // Due now. The next group commits without an fsync (a note alone, nobody waits), and
        // a flush of it after its linger would not come within this test.
        journal.writer.set_linger(Duration::from_secs(3600));
        journal.writer.set_checkpoint_idle(Duration::from_millis(1));
        journal.set_one_note(true);
        let (checkpoints, synced) = (journal.writer.checkpoints(), journal.writer.wal_syncs());
        start_search(&journal, run, "not-waited-for");
        assert!(
            within_10s(|| journal.writer.checkpoints() > checkpoints),
            "the due checkpoint ran once the queue was quiet"
        );
        assert!(
            within_10s(|| journal.writer.wal_syncs() > synced),
            "and the commit without an fsync was flushed with it"
        );
    }

    /// A group that comes right after another commit fsyncs (under load, that fsync gathers the
    /// next writes), unless the daemon works on one note alone: then only a durable write
    /// makes a group fsync.
    #[test]
    fn a_note_alone_commits_what_nobody_waits_on_without_an_fsync_however_soon() {
        let (_dir, journal) = shared_journal();
        journal.writer.set_linger(Duration::from_secs(3600)); // no idle fsync meanwhile
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let synced = || journal.writer.wal_syncs();
        // Not alone, the group fsyncs (unless the writer thread was held up for longer than
        // `IDLE_BEFORE_NO_FSYNC` right before it: not asserted, a loaded machine may do that).
        for (alone, fsyncs) in [(false, 1), (true, 0), (false, 1)] {
            journal.set_one_note(alone);
            journal.flush().unwrap(); // what an earlier round left not durable
            let at_start = synced();
            // The held write writes nothing (no fsync); the queued start forms the next group
            // the moment it is done: the writer was not idle before it.
            let (release, holder) = hold_the_writer(&journal);
            let call_id = format!("c-{alone}-{fsyncs}-{at_start}");
            start_search(&journal, run, &call_id);
            release.send(()).unwrap();
            holder.join().unwrap();
            let until = Instant::now() + Duration::from_secs(10);
            let seen = || {
                let run = journal.run_for_note("In_Progress/a.md").unwrap().unwrap();
                run.calls.iter().any(|c| c.call_id == call_id)
            };
            while !seen() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(seen(), "the queued start committed");
            if alone {
                assert_eq!(synced() - at_start, fsyncs, "alone: no fsync");
            } else {
                assert!(synced() - at_start <= fsyncs, "not alone");
            }
        }
    }

    /// A side effect's outcome, queued like any other, is settled only once its commit is
    /// fsynced (a `read_only` one's once committed): the note's move waits for that, its
    /// results write does not.
    #[tokio::test]
    async fn a_side_effect_outcome_settles_only_once_fsynced() {
        let (_dir, journal) = fresh_journal();
        journal.writer.set_linger(Duration::from_secs(3600)); // no idle fsync meanwhile
        let run = journal
            .begin_note_run("In_Progress/a.md", Some("n-a"), None, None)
            .unwrap();
        let synced = || journal.writer.wal_syncs();
        let at_start = synced();
        let mut sent = search_ok("c-send");
        sent.name = "send_notification".into();
        // An idle writer, as for a note alone: only the wait makes the group fsync.
        std::thread::sleep(Duration::from_millis(5));
        let committed = journal.call_finished_later(run, &sent, true).await.unwrap();
        journal.settle(committed).unwrap();
        assert_eq!(synced(), at_start + 1, "settled once fsynced");
        std::thread::sleep(Duration::from_millis(5));
        let committed = journal
            .call_finished_later(run, &search_ok("c-search"), false)
            .await
            .unwrap();
        journal.settle(committed).unwrap();
        assert_eq!(
            synced(),
            at_start + 1,
            "a read_only outcome: committed, no fsync"
        );
        let calls = journal.note_calls("n-a").unwrap();
        for id in ["c-send", "c-search"] {
            let c = calls.iter().find(|c| c.call_id == id).expect("recorded");
            assert!(c.recorded.is_some(), "{id}: its outcome is in the journal");
        }
    }

    #[test]
    fn async_writes_are_answered_and_wait_for_room_in_a_full_queue() {
        let (_dir, journal) = shared_journal();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let (release, holder) = hold_the_writer(&journal);
        for _ in 0..super::QUEUE {
            journal.write_queued("filler", |_| Ok(())).unwrap();
        }
        let j = journal.clone();
        let waiting = rt.spawn(async move {
            let result = crate::call::CallResult::failed_now(
                "c-1",
                "search_web",
                crate::call::CallError::new(crate::call::ErrorCode::Timeout, "slow"),
            );
            j.call_finished_async(run, &result).await
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !waiting.is_finished(),
            "the queue is full and the writer held"
        );
        release.send(()).unwrap();
        holder.join().unwrap();
        rt.block_on(waiting)
            .unwrap()
            .expect("recorded once there was room");
        let calls = journal.open_runs().unwrap()[0].calls.len();
        assert_eq!(
            calls, 1,
            "the outcome is in, and reads see it: it was durable"
        );
    }

    #[test]
    fn many_threads_writing_at_once_each_see_their_own_writes() {
        let (_dir, journal) = shared_journal();
        const THREADS: usize = 8;
        const CALLS: usize = 25;
        let before = journal.writer.groups();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let journal = &journal;
                s.spawn(move || {
                    let note = format!("In_Progress/{t}.md");
                    let run = journal.begin_run(&note).unwrap();
                    for c in 0..CALLS {
                        // A side effect's start: durable, so on the other connection, when
                        // the method returns.
                        start_send(journal, run, &format!("s-{t}-{c}"));
                        let calls = journal.run_for_note(&note).unwrap().unwrap().calls;
                        assert_eq!(calls.len(), 2 * c + 1, "s-{t}-{c}");
                        // A read_only start is not waited for; the outcome recorded after it
                        // is, and commits it too.
                        let id = format!("c-{t}-{c}");
                        start_search(journal, run, &id);
                        journal.call_finished(run, &search_ok(&id)).unwrap();
                        let calls = journal.run_for_note(&note).unwrap().unwrap().calls;
                        assert_eq!(calls.len(), 2 * c + 2, "{id}");
                        assert!(
                            matches!(
                                calls[2 * c + 1].progress,
                                crate::journal::CallProgress::Finished(_)
                            ),
                            "{id}"
                        );
                    }
                });
            }
        });
        let writes = (THREADS * (1 + 3 * CALLS)) as u64;
        let groups = journal.writer.groups() - before;
        assert!(groups <= writes, "{groups} groups for {writes} writes");
        let log = journal.log(&LogFilter::default()).unwrap();
        assert_eq!(log.len() as u64, writes);
    }

    #[test]
    fn writes_that_arrive_during_a_commit_share_the_next_one() {
        let (_dir, journal) = shared_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let before = journal.writer.groups();
        let (release, holder) = hold_the_writer(&journal);
        let j = journal.clone();
        let threads = writers(16, move |i| {
            j.call_started(
                run,
                &format!("c-{i}"),
                "send_notification",
                crate::call::Effect::ExternalSideEffect,
                &serde_json::json!({}),
            )
        });
        release.send(()).unwrap();
        holder.join().unwrap();
        for t in threads {
            t.join().unwrap().expect("each write committed");
        }
        // The holding job's group, then one group for all sixteen.
        assert_eq!(journal.writer.groups() - before, 2);
        assert_eq!(journal.open_runs().unwrap()[0].calls.len(), 16);
    }

    #[test]
    fn a_failing_write_is_rolled_back_alone_and_its_group_commits() {
        let (_dir, journal) = shared_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let (release, holder) = hold_the_writer(&journal);
        let j = journal.clone();
        let threads = writers(9, move |i| {
            if i == 4 {
                // Writes, then fails: what it wrote must go with it.
                return j.write(|tx| {
                    tx.execute(
                        "INSERT INTO events (at_ms, event, note) VALUES (0, 'doomed', 'x')",
                        [],
                    )?;
                    Err(Failure::Other("this job fails".into()))
                });
            }
            j.call_finished(run, &search_ok(&format!("c-{i}")))
        });
        release.send(()).unwrap();
        holder.join().unwrap();
        for (i, t) in threads.into_iter().enumerate() {
            let result = t.join().unwrap();
            if i == 4 {
                let err = result.expect_err("the failing job gets its error");
                assert!(err.to_string().contains("this job fails"), "{err}");
            } else {
                result.expect("the others commit");
            }
        }
        let log = journal.log(&LogFilter::default()).unwrap();
        assert!(log.iter().all(|e| e.event != "doomed"), "rolled back");
        assert_eq!(log.iter().filter(|e| e.event == "call_end").count(), 8);
    }

    #[test]
    fn a_queued_write_that_fails_for_its_storage_pauses_claiming_as_an_answered_one_does() {
        let (_dir, journal) = shared_journal();
        journal
            .write_queued("a queued write", |tx| {
                tx.execute(
                    "INSERT INTO events (at_ms, event, note) VALUES (0, 'doomed', 'x')",
                    [],
                )?;
                Err(Failure::Sql(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                    None,
                )))
            })
            .unwrap();
        journal.flush().unwrap();
        let why = journal
            .storage_failure()
            .expect("noted, though nobody waited");
        assert!(why.contains("disk is full"), "{why}");
        let log = journal.log(&LogFilter::default()).unwrap();
        assert!(log.iter().all(|e| e.event != "doomed"), "rolled back");
    }

    #[test]
    fn a_failed_commit_reaches_every_caller_of_its_group() {
        let (_dir, journal) = shared_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let (release, holder) = hold_the_writer(&journal);
        let j = journal.clone();
        let threads = writers(6, move |i| {
            if i == 0 {
                // A real commit failure: a foreign key checked only at COMMIT, as a full
                // disk or an I/O error would fail it, after every job of the group ran.
                return j.write(|tx| {
                    tx.execute_batch("PRAGMA defer_foreign_keys = ON")?;
                    tx.execute(
                        "INSERT INTO calls (run_id, call_id, tool) VALUES (999, 'c-x', 't')",
                        [],
                    )?;
                    Ok(())
                });
            }
            j.call_finished(run, &search_ok(&format!("c-{i}")))
        });
        release.send(()).unwrap();
        holder.join().unwrap();
        for t in threads {
            let err = t.join().unwrap().expect_err("the commit failed for all");
            assert!(err.to_string().contains("FOREIGN KEY"), "{err}");
        }
        let log = journal.log(&LogFilter::default()).unwrap();
        assert_eq!(log.iter().filter(|e| e.event == "call_end").count(), 0);
        // The writer carries on with the next group.
        journal.call_finished(run, &search_ok("c-after")).unwrap();
        assert_eq!(journal.open_runs().unwrap()[0].calls.len(), 1);
    }

    /// A `read_only` note's claim, answered once it ran (`Wait::Executed`), in a group whose
    /// commit then fails; the run id its caller was given.
    fn lose_a_claim(journal: &Arc<Journal>) -> crate::journal::RunId {
        use std::future::Future;
        use std::task::Poll;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (release, holder) = hold_the_writer(journal);
        let mut claim = std::pin::pin!(journal.begin_claim_async(
            "In_Progress/a.md",
            "n-0123456789ab",
            "Needs_Action/a.md",
            None,
            None,
            None,
            None,
            None,
        ));
        // Polled once, it is queued (as `begin_and_execute` does); behind it, in the same
        // group, a write whose COMMIT fails, as a full disk or an I/O error would fail it.
        let first = rt.block_on(std::future::poll_fn(|cx| {
            Poll::Ready(claim.as_mut().poll(cx).is_pending())
        }));
        assert!(first, "the claim waits for the writer");
        journal.queue_a_failing_commit();
        release.send(()).unwrap();
        holder.join().unwrap();
        let lost = rt
            .block_on(claim)
            .expect("a read_only claim is answered before its commit");
        journal.flush().unwrap();
        assert!(
            journal
                .open_runs()
                .unwrap()
                .iter()
                .all(|r| r.run_id != lost),
            "the failed commit took the claim with it"
        );
        lost
    }

    /// A write whose error makes SQLite roll the whole group's transaction back (a full
    /// disk): the writes queued behind it in the group are not committed on their own, and
    /// their callers hear that they failed, which they did.
    #[test]
    fn writes_after_sqlite_rolled_the_group_back_fail_and_are_not_committed() {
        let (_dir, journal) = shared_journal();
        let (release, holder) = hold_the_writer(&journal);
        journal
            .write_queued("a write that fills the disk", |tx| {
                let pages: i64 = tx.query_row("PRAGMA page_count", [], |r| r.get(0))?;
                tx.execute_batch(&format!("PRAGMA max_page_count = {pages}"))?;
                tx.execute(
                    "INSERT INTO events (at_ms, event, note, detail) VALUES (0, 'big', 'x', ?1)",
                    [("y".repeat(1 << 20))],
                )?;
                Ok(())
            })
            .unwrap();
        let j = journal.clone();
        let behind = writers(1, move |_| {
            j.write(|tx| {
                tx.execute(
                    "INSERT INTO events (at_ms, event, note) VALUES (0, 'behind', 'x')",
                    [],
                )?;
                Ok(())
            })
        });
        release.send(()).unwrap();
        holder.join().unwrap();
        let answer = behind.into_iter().next().unwrap().join().unwrap();
        journal
            .write(|tx| {
                tx.execute_batch("PRAGMA max_page_count = 1073741823")?;
                Ok(())
            })
            .unwrap();
        let log = journal.log(&LogFilter::default()).unwrap();
        let committed = log.iter().any(|e| e.event == "behind");
        assert_eq!(
            answer.is_ok(),
            committed,
            "the caller heard {answer:?}; the write is committed: {committed}"
        );
    }

    /// The next run another process records (`vaultd reject`, while the daemon runs) takes
    /// the lost claim's id, as a rowid is taken: nothing the daemon writes under the id lands
    /// in that run.
    #[test]
    fn writes_under_a_run_whose_claim_a_failed_commit_lost_are_refused() {
        let (dir, journal) = shared_journal();
        journal.begin_run("Done/earlier.md").unwrap();
        let lost = lose_a_claim(&journal);
        let other = Journal::open(dir.path()).unwrap();
        let theirs = other.begin_run("Rejected/b.md").unwrap();
        assert_eq!(theirs, lost, "the id is taken again");
        let err = journal
            .call_finished(lost, &search_ok("c-1"))
            .expect_err("no outcome under a lost run");
        assert!(
            err.to_string().contains("lost with a failed commit"),
            "{err}"
        );
        assert!(journal.note_moved(lost, "Done/a.md", true).is_err());
        assert!(journal.keep_claimed_text(lost, "text").is_err());
        let runs = other.open_runs().unwrap();
        let b = runs.iter().find(|r| r.run_id == theirs).expect("their run");
        assert!(b.calls.is_empty(), "{:?}", b.calls);
        assert_eq!(b.note, "Rejected/b.md");
    }

    /// The daemon's own next claim gets a new id, not the lost one (which a rowid would
    /// give it), and its writes are recorded.
    #[test]
    fn the_next_claim_after_a_lost_one_gets_an_id_of_its_own() {
        let (_dir, journal) = shared_journal();
        let lost = lose_a_claim(&journal);
        let next = journal.begin_run("In_Progress/c.md").unwrap();
        assert!(next > lost, "{next} after {lost}");
        journal.call_finished(next, &search_ok("c-2")).unwrap();
        let runs = journal.open_runs().unwrap();
        let c = runs.iter().find(|r| r.run_id == next).expect("the new run");
        assert_eq!(c.calls.len(), 1);
    }

    #[test]
    fn dropping_the_journal_ends_the_writer_and_closes_the_file() {
        let (dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        start_search(&journal, run, "c-1");
        drop(journal);
        // Closed by the last connection: SQLite checkpointed and removed the WAL.
        assert!(!dir.path().join("journal.sqlite-wal").exists());
        let journal = Journal::open(dir.path()).unwrap();
        assert_eq!(journal.open_runs().unwrap()[0].calls.len(), 1);
    }
}

#[cfg(test)]
mod per_effect {
    use crate::call::Effect;
    use crate::journal::testing::*;
    use crate::journal::{Journal, RateWindow, StartAdmission};
    use serde_json::json;
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn queued_read_only_starts_commit_before_the_journal_closes() {
        let (dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        for i in 0..50 {
            start_search(&journal, run, &format!("c-{i}"));
        }
        drop(journal);
        let journal = Journal::open(dir.path()).unwrap();
        assert_eq!(journal.open_runs().unwrap()[0].calls.len(), 50);
        assert_eq!(
            journal
                .calls_started_since("search_web", UNIX_EPOCH)
                .unwrap(),
            50
        );
    }

    #[test]
    fn read_only_admissions_stay_exact_under_concurrency() {
        let (_dir, journal) = fresh_journal();
        let journal = Arc::new(journal);
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        let hour = RateWindow {
            max: 7,
            length: Duration::from_secs(3600),
        };
        let threads: Vec<_> = (0..24)
            .map(|i| {
                let j = journal.clone();
                std::thread::spawn(move || {
                    j.call_started_within(
                        run,
                        &format!("c-{i}"),
                        "search_web",
                        Effect::ReadOnly,
                        &json!({}),
                        &[hour],
                    )
                    .unwrap()
                })
            })
            .collect();
        let admitted = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|a| *a == StartAdmission::Started)
            .count();
        assert_eq!(admitted, 7);
        journal.flush().unwrap();
        assert_eq!(
            journal
                .calls_started_since("search_web", UNIX_EPOCH)
                .unwrap(),
            7
        );
    }

    #[test]
    fn a_read_only_start_is_seen_once_a_later_durable_write_returns() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        start_search(&journal, run, "c-1");
        start_send(&journal, run, "c-2");
        let calls = journal.run_for_note("In_Progress/a.md").unwrap().unwrap();
        assert_eq!(
            calls.calls.len(),
            2,
            "the send waited, and the search before it"
        );
        assert_eq!(calls.calls[0].effect, Effect::ReadOnly);
    }
}
