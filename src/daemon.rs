//! The pipeline. Start-up takes the vault lock, prepares the folders, opens the journal and
//! finishes whatever a previous daemon left in `In_Progress/`; then the watcher and periodic
//! scans feed note tasks. A note task claims its note by rename, runs its pending calls
//! (through the [`Runner`]), writes the results back and moves the note to its new state.
//! Shutdown stops claiming and lets running calls finish within the grace period.

use crate::arrivals::Arrivals;
use crate::call::{CallError, CallResult, ErrorCode, HeldCall};
use crate::config::{ApprovalVia, Config};
use crate::guard::breaker::Breakers;
use crate::guard::hold_alert::{HeldSummary, HoldAlerts};
use crate::guard::{budget, dry_run};
use crate::journal::{CallProgress, Claim, Decision, Journal, JournalCall, JournalError, RunId};
use crate::note::{self, Block, CallBody, ParsedNote, parse_note};
use crate::results::ResultStore;
use crate::runner::Runner;
use crate::secret::Redactor;
use crate::synced::{ForeignNote, RunnerId, RunnerWatch};
use crate::tools::mcp::McpSource;
use crate::tools::{Admission, Registry};
use crate::vault::{LeftBehind, LinkError, State, Vault, VaultError};
use crate::watch::{self, Hint};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

/// Folders only vaultd moves notes into: another runner's claims and finished notes show up
/// here by sync (DESIGN §9.9).
const RUNNER_STATES: [State; 4] = [
    State::InProgress,
    State::PendingApproval,
    State::Done,
    State::Failed,
];

/// A start-up backlog this large gets progress reports in the log.
const PROGRESS_FROM: usize = 500;

/// On a terminal, a backlog this large gets a progress bar (indicatif) instead.
const PROGRESS_BAR_FROM: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Vault(#[from] VaultError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Watch(#[from] watch::WatchError),
    #[error(transparent)]
    Registry(#[from] crate::tools::RegistryError),
    #[error("{0}")]
    Locked(String),
    #[error("cannot lock the vault ({path}): {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot build the HTTP client: {0}")]
    Http(String),
    /// Another runner's recent notes are in the vault (DESIGN §9.9).
    #[error("{0}")]
    SecondRunner(String),
    #[error("cannot read or create this daemon's runner id in {dir}: {source}")]
    RunnerId {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// `run` watches until shut down; `once` processes everything pending and returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Run,
    Once,
}

/// How appending a run's results into its note went.
#[derive(Debug, Clone, PartialEq, Eq)]
enum WriteBack {
    /// The results of these call ids are in the note.
    Written(Vec<String>),
    /// The note is no longer where the run left it.
    Gone,
    /// Not written (the note keeps changing, the folder is read-only, …): retried later.
    Failed,
}

/// What a note task is doing with a note.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Claimed from Needs_Action.
    Fresh,
    /// Claimed from Approved: the held calls run.
    Approved,
    /// Found in In_Progress at start-up; `known` when the journal has its run.
    Recover { known: bool },
}

/// Who a claimed note is and what the journal knows of its calls (DESIGN §9.2, §9.3, §9.6).
#[derive(Debug, Clone, Default)]
struct Identity {
    /// The note's `tool_note`.
    note_id: String,
    /// The newest record of each call of this note (or, for a stale copy, of the note it
    /// copies), by call id.
    prior: HashMap<String, JournalCall>,
    /// Calls recorded by the run being continued (recovery): results of theirs already in the
    /// note count for Done or Failed.
    this_run: HashSet<String>,
    /// A note without `tool_note` found at a path a note was recently claimed from.
    stale: Option<StaleCopy>,
}

#[derive(Debug, Clone)]
struct StaleCopy {
    /// The claim it is a copy of.
    of: Claim,
    /// Within `stale_copy_grace`: it is that note; later: its started side effects are held.
    within_grace: bool,
}

/// What becomes of a held call in this pass.
enum HeldDecision {
    Run,
    Rejected,
    /// Asked already, with these exact parameters; no decision yet.
    Waiting,
    /// Not asked yet with these parameters: write a `[!question]`.
    Ask,
}

/// Everything a note task needs, shared.
pub struct Daemon {
    config: Config,
    /// Where results too big for a note go (§10.6), also used to keep a note under
    /// `max_note_bytes` (§9.8).
    results: ResultStore,
    vault: Vault,
    runner: Runner,
    journal: Arc<Journal>,
    /// Notes being looked at now; `true` = another hint came meanwhile, look again after.
    inflight: Mutex<HashMap<PathBuf, bool>>,
    /// Bounds how many notes are held in memory and processed at once.
    note_slots: Semaphore,
    /// Set on shutdown: no new claims.
    stopping: AtomicBool,
    /// Note looks finished since start, for start-up progress reports.
    looked_at: std::sync::atomic::AtomicUsize,
    /// Problems already reported, so a periodic scan does not repeat them.
    reported: Mutex<HashSet<(PathBuf, u64, SystemTime)>>,
    /// Note ids with a run in this daemon now; woken when it ends. A note that comes back
    /// (moved back by hand, or an editor's stale copy) waits for its running calls (§9.3).
    active: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
    /// Notes being waited on until their writer is done (§9.1): one wait per path.
    settling: Mutex<HashSet<PathBuf>>,
    /// `once` judges an unfinished last block at once: it is run when the writer is done.
    mode: Mode,
    /// `[notify] on_hold`: one message per held note (DESIGN §12.4).
    hold_alerts: HoldAlerts,
    /// This daemon's `tool_runner`, and whether a second runner paused claiming (§9.9).
    runners: RunnerWatch,
    /// Notes renamed in: claimed by hard link, first name dropped after `moved_in_grace`.
    arrivals: Arrivals,
}

/// Holds the vault lock while alive; removes the lock file when dropped (DESIGN §9.5).
pub struct VaultLock {
    file: std::fs::File,
    path: PathBuf,
}

impl Drop for VaultLock {
    fn drop(&mut self) {
        // Removed while still locked, so no other daemon can hold a lock on this file; one
        // that opened it meanwhile sees the path gone (or another file) and starts over.
        let _ = std::fs::remove_file(&self.path);
        let _ = &self.file;
    }
}

/// Takes the one-daemon-per-vault lock (`flock` on `<vault>/.vaultd.lock`, which holds the
/// PID). A second daemon gets an error naming the PID of the first. The lock file is opened
/// without following a symlink (one planted there is an error, never written through) and is
/// private (0600).
pub fn lock_vault(vault: &Path) -> Result<VaultLock, DaemonError> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let path = vault.join(".vaultd.lock");
    let lock_error = |source| DaemonError::Lock {
        path: path.clone(),
        source,
    };
    for _ in 0..100 {
        let mut file = crate::private::open_file(&path).map_err(lock_error)?;
        // SAFETY: flock on a valid, open file descriptor.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(DaemonError::Locked(format!(
                    "another vaultd (PID {}) is already running on {}; stop it first",
                    if pid.is_empty() { "unknown" } else { pid },
                    vault.display()
                )));
            }
            return Err(lock_error(err));
        }
        // The daemon before us may have removed the file between our open and our flock:
        // our lock is then on a file nobody else will ever look at. Start over.
        let ours = file.metadata().map_err(lock_error)?;
        match std::fs::symlink_metadata(&path) {
            Ok(named) if named.ino() == ours.ino() && named.dev() == ours.dev() => {}
            _ => continue,
        }
        let _ = file.set_len(0);
        let _ = file.rewind();
        let _ = writeln!(file, "{}", std::process::id());
        let _ = file.sync_all();
        return Ok(VaultLock { file, path });
    }
    Err(lock_error(std::io::Error::other(
        "the lock file keeps being replaced",
    )))
}

/// The PID of the daemon holding the vault lock, if one is running.
pub fn running_daemon(vault: &Path) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let path = vault.join(".vaultd.lock");
    let file = std::fs::File::open(&path).ok()?;
    // SAFETY: flock on a valid, open file descriptor; a shared lock is released on drop.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if rc == 0 {
        return None;
    }
    std::fs::read_to_string(&path).ok()?.trim().parse().ok()
}

/// The shared HTTP client: one connection pool for every tool.
pub fn http_client() -> Result<reqwest::Client, DaemonError> {
    reqwest::Client::builder()
        .user_agent(concat!("vaultd/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| DaemonError::Http(e.without_url().to_string()))
}

/// The redactor for every secret in the config.
pub fn redactor_for(config: &Config) -> Redactor {
    config.redactor()
}

/// Runs the daemon on `config` until `shutdown` resolves (Mode::Run) or until everything
/// pending is processed (Mode::Once).
pub async fn run(
    config: Config,
    mode: Mode,
    redactor: Arc<Redactor>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    run_with(config, mode, false, redactor, shutdown).await
}

/// [`run`], with `take_over` (`--take-over`, DESIGN §9.9): another runner's notes up to now
/// are history.
pub async fn run_with(
    config: Config,
    mode: Mode,
    take_over: bool,
    redactor: Arc<Redactor>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    let vault = Vault::new(config.vault.clone(), config.folders.clone());
    // Before `prepare`, which would create missing folders through a symlink.
    vault.refuse_symlinked_folders()?;
    vault.prepare()?;
    let _lock = lock_vault(vault.root())?;
    let journal = Arc::new(Journal::open(&config.state_dir)?);
    let runners = one_runner(&config, &vault, &journal, take_over)?;
    let http = http_client()?;
    let results = ResultStore::new(
        config.vault.clone(),
        config.tool_results.clone(),
        config.max_result_bytes,
    );
    // Servers start in parallel; each delays start-up by at most its start_timeout.
    let mcp = McpSource::start(
        &config.mcp,
        journal.clone(),
        http.clone(),
        &config.state_dir,
        results.clone(),
    )
    .await;
    let mut registry = Registry::from_config(&config.tools, http, Some(journal.clone()))?;
    mcp.register(&mut registry)?;
    let mut runner = Runner::new(
        Arc::new(registry),
        journal.clone(),
        redactor,
        config.workers,
    )
    .with_results(results.clone());
    runner.breakers =
        Arc::new(Breakers::new(config.guard.breaker).with_state_file(&config.state_dir));
    let hold_alerts = HoldAlerts::new(config.guard.on_hold.clone(), config.guard.on_hold_per_hour);
    let arrivals = Arrivals::new(config.moved_in_grace);
    let daemon = Arc::new(Daemon {
        results,
        hold_alerts,
        note_slots: Semaphore::new(config.workers * 4),
        config,
        vault,
        runner,
        journal,
        inflight: Mutex::new(HashMap::new()),
        stopping: AtomicBool::new(false),
        looked_at: std::sync::atomic::AtomicUsize::new(0),
        reported: Mutex::new(HashSet::new()),
        active: Mutex::new(HashMap::new()),
        settling: Mutex::new(HashSet::new()),
        arrivals,
        mode,
        runners,
    });
    let outcome = daemon.supervise(mode, shutdown).await;
    // No server outlives vaultd.
    mcp.shutdown().await;
    outcome
}

/// The start-up check of DESIGN §9.9: with `take_over`, records that other runners' notes up
/// to now are history; then refuses to start while a note of another runner is younger than
/// `runner_window`. Reads only notes whose mtime is inside the window.
fn one_runner(
    config: &Config,
    vault: &Vault,
    journal: &Journal,
    take_over: bool,
) -> Result<RunnerWatch, DaemonError> {
    let me =
        RunnerId::load_or_create(&config.state_dir).map_err(|source| DaemonError::RunnerId {
            dir: config.state_dir.clone(),
            source,
        })?;
    if take_over {
        let at = journal.record_take_over(me.as_str())?;
        tracing::warn!(
            runner = %me,
            "--take-over: notes other runners updated up to {} are history; this daemon runs the vault",
            humantime::format_rfc3339_seconds(at)
        );
    }
    let taken_over_at = journal.taken_over_at()?;
    let found = crate::synced::foreign_notes(
        vault,
        &me,
        config.runner_window,
        taken_over_at,
        config.max_note_bytes,
        SystemTime::now(),
    );
    if !found.is_empty() {
        return Err(DaemonError::SecondRunner(crate::synced::refusal(
            &found,
            vault,
            config.runner_window,
        )));
    }
    journal.clear_pause()?;
    tracing::debug!(runner = %me, "this daemon's tool_runner");
    Ok(RunnerWatch::new(me, config.runner_window, taken_over_at))
}

impl Daemon {
    async fn supervise(
        self: &Arc<Self>,
        mode: Mode,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), DaemonError> {
        let mut tasks: JoinSet<()> = JoinSet::new();
        tokio::pin!(shutdown);

        // Watch before the first scan, so nothing that arrives during the scan is missed.
        let (tx, mut rx) = mpsc::channel::<Hint>(4096);
        let watcher = if mode == Mode::Run {
            let mut folders = self.watched_folders();
            // Where another runner's claims and finished notes show up (§9.9).
            folders.extend(RUNNER_STATES.iter().map(|s| self.vault.folder(*s)));
            Some(watch::start(&folders, self.config.watch, tx.clone())?)
        } else {
            None
        };

        self.recover(&mut tasks).await?;
        let (looked, queued) = self.scan_all(&mut tasks);
        tracing::info!(
            vault = %self.vault.root().display(),
            queued,
            "vaultd started"
        );
        let bar = std::io::IsTerminal::is_terminal(&std::io::stderr())
            && std::env::var_os("JOURNAL_STREAM").is_none();
        let progress = if (bar && queued >= PROGRESS_BAR_FROM) || queued >= PROGRESS_FROM {
            Some(tokio::spawn(self.clone().report_progress(looked, bar)))
        } else {
            None
        };

        if mode == Mode::Once {
            tokio::select! {
                _ = async { while tasks.join_next().await.is_some() {} } => {}
                _ = &mut shutdown => { self.drain(&mut tasks).await; }
            }
            // The next tick draws the finished bar; bounded, since a note that no task
            // looked at (it left its folder meanwhile) would keep the count short.
            if let Some(p) = progress {
                let _ = tokio::time::timeout(Duration::from_millis(500), p).await;
            }
            return Ok(());
        }

        let _ = sd_notify::notify(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(&format!("watching {}", self.vault.root().display())),
        ]);
        let watchdog = sd_notify::watchdog_enabled().map(|d| d / 2);
        let mut watchdog_tick =
            tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
        let mut rescan_tick = tokio::time::interval(self.config.rescan_interval);
        rescan_tick.tick().await; // the first tick is immediate; the start-up scan just ran

        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                Some(hint) = rx.recv() => self.on_hint(hint, &mut tasks),
                _ = rescan_tick.tick() => { self.scan_all(&mut tasks); }
                _ = watchdog_tick.tick(), if watchdog.is_some() => {
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(e) = done && e.is_panic() {
                        tracing::error!("a note task panicked: {e}");
                    }
                }
            }
            if let Some(w) = &watcher
                && w.overflowed.swap(false, Ordering::SeqCst)
            {
                tracing::warn!("too many file events at once; scanning all folders");
                self.scan_all(&mut tasks);
            }
        }
        // Ask systemd for the grace period plus a margin, so a `shutdown_grace` above the
        // unit's TimeoutStopSec= does not get running calls killed.
        let extend = (self.config.shutdown_grace + Duration::from_secs(5)).as_micros();
        let _ = sd_notify::notify(&[
            sd_notify::NotifyState::Stopping,
            sd_notify::NotifyState::ExtendTimeoutUsec(u32::try_from(extend).unwrap_or(u32::MAX)),
            sd_notify::NotifyState::Status("stopping: letting running calls finish"),
        ]);
        drop(watcher);
        self.drain(&mut tasks).await;
        Ok(())
    }

    /// Stops claiming and waits for running notes up to the grace period; what is still
    /// running then is left to start-up recovery (the journal knows which calls started).
    async fn drain(&self, tasks: &mut JoinSet<()>) {
        self.stopping.store(true, Ordering::SeqCst);
        let grace = self.config.shutdown_grace;
        let finished =
            tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if finished.is_err() {
            tracing::warn!(
                left = tasks.len(),
                "shutdown grace of {} passed; interrupted calls are finished at the next start",
                humantime::format_duration(grace)
            );
            tasks.abort_all();
        }
        self.arrivals.drop_all(&self.vault);
        tracing::info!("vaultd stopped");
    }

    fn watched_folders(&self) -> Vec<PathBuf> {
        self.watched_states()
            .into_iter()
            .map(|s| self.vault.folder(s))
            .collect()
    }

    /// Queues every note of the watched folders. Returns how many notes were looked at and
    /// how many of them hold a pending call (the "queued" of the start-up line: a note
    /// without calls waits for its agent, not for vaultd).
    fn scan_all(self: &Arc<Self>, tasks: &mut JoinSet<()>) -> (usize, usize) {
        let me = self.clone();
        tasks.spawn(async move { me.resume_stranded().await });
        let (mut looked, mut queued) = (0, 0);
        for folder in self.watched_states() {
            for path in self.vault.scan(folder) {
                queued += usize::from(has_pending_call(&path));
                self.dispatch(path, tasks);
                looked += 1;
            }
        }
        (looked, queued)
    }

    /// With `approval_via = "cli"`, Approved/ is watched only for the notes `vaultd approve`
    /// moves there (a note moved in by hand is left alone, see `claim_and_run`), and
    /// Rejected/ not at all: `vaultd reject` writes the REJECTED results itself.
    fn watched_states(&self) -> Vec<State> {
        let mut v = vec![State::NeedsAction, State::Approved, State::DryRun];
        if !self.approval_via_cli() {
            v.push(State::Rejected);
        }
        v
    }

    fn approval_via_cli(&self) -> bool {
        self.config.approval_via == ApprovalVia::Cli
    }

    fn on_hint(self: &Arc<Self>, hint: Hint, tasks: &mut JoinSet<()>) {
        if let Hint::Ready(path) | Hint::Closed(path) | Hint::Changed(path) = &hint
            && self
                .vault
                .locate(path)
                .is_some_and(|(s, _)| RUNNER_STATES.contains(&s))
        {
            self.look_for_second_runner(path.clone(), tasks);
            return;
        }
        if let Hint::NewFolder(dir) = &hint
            && RUNNER_STATES
                .iter()
                .any(|s| dir.starts_with(self.vault.folder(*s)))
        {
            return;
        }
        match hint {
            Hint::Closed(path) | Hint::Changed(path) => {
                if self.vault.locate(&path).is_none() {
                    return;
                }
                let me = self.clone();
                tasks.spawn(async move { me.settle_then_look(path).await });
            }
            Hint::NewFolder(dir) => {
                // Files created with the folder may have no events of their own (notify #727).
                for s in self.watched_states() {
                    if dir.starts_with(self.vault.folder(s)) {
                        let base = self.vault.folder(s);
                        for path in self.vault.scan(s) {
                            if path.starts_with(&dir) && path.starts_with(&base) {
                                self.dispatch(path, tasks);
                            }
                        }
                    }
                }
            }
            Hint::Rescan => {
                self.scan_all(tasks);
            }
            Hint::Ready(path) => {
                self.arrivals.arrived(&path);
                self.dispatch(path, tasks);
            }
        }
    }

    /// A note appeared or changed where only vaultd puts notes (§9.9): unless this daemon just
    /// put it there, its head is read; another runner's recent activity pauses claiming.
    fn look_for_second_runner(self: &Arc<Self>, path: PathBuf, tasks: &mut JoinSet<()>) {
        if self.runners.is_paused() || self.runners.just_wrote(&path) {
            return;
        }
        let me = self.clone();
        tasks.spawn(async move {
            let judge = me.clone();
            let found = tokio::task::spawn_blocking(move || judge.runners.check(&path))
                .await
                .ok()
                .flatten();
            if let Some(found) = found {
                me.pause_for(found).await;
            }
        });
    }

    /// Stops claiming because another runner works on this vault: running calls finish,
    /// nothing new is claimed; logged once, recorded for `vaultd status`, alerted (§12.4).
    async fn pause_for(&self, found: ForeignNote) {
        let note = self.vault.relative(&found.path);
        let other = found.runner.clone();
        if !self.runners.pause(found) {
            return;
        }
        let host = crate::synced::host_of(&other).to_string();
        let how = crate::synced::how_to_resume(&host);
        tracing::error!(
            note = %note,
            runner = %other,
            "paused: second runner on {host}: {note} was updated by vaultd {other}; nothing new is claimed here until a restart. To resume, {how}"
        );
        let (me, o, n) = (self.runners.me.to_string(), other.clone(), note.clone());
        if let Err(e) = self.blocking(move |j| j.record_pause(&me, &o, &n)).await {
            tracing::error!("journal: {e}");
        }
        self.hold_alerts
            .second_runner(
                &self.runner.registry,
                &note,
                &format!(
                    "vaultd on {} paused: a second runner on {host} (vaultd {other}) works on a synced copy of this vault ({note}). Nothing new is claimed here. To resume, {how}.",
                    self.runners.me.host()
                ),
            )
            .await;
    }

    /// Starts a note task unless one is already looking at this path (then it looks again).
    fn dispatch(self: &Arc<Self>, path: PathBuf, tasks: &mut JoinSet<()>) {
        if !self.mark_inflight(&path) {
            return;
        }
        let me = self.clone();
        tasks.spawn(async move { me.note_task(path).await });
    }

    /// DESIGN §9.1: a note written in place is looked at once no process has it open for
    /// writing and it stayed unchanged for `settle`. A note that keeps changing is waited for
    /// (logged once), never failed or claimed meanwhile. One wait per path.
    async fn settle_then_look(self: Arc<Self>, path: PathBuf) {
        if !self
            .settling
            .lock()
            .expect("settling lock poisoned")
            .insert(path.clone())
        {
            return;
        }
        let settle = self.config.settle;
        let began = std::time::Instant::now();
        let mut logged = false;
        let settled = loop {
            if self.stopping.load(Ordering::SeqCst) {
                break false;
            }
            let Some(age) = modified_age(&path) else {
                break false; // gone
            };
            let busy = note::write::writer_busy(&path).unwrap_or(false);
            if !busy && age >= settle {
                break true;
            }
            if !logged && began.elapsed() >= self.config.settle_max {
                logged = true;
                tracing::warn!(
                    note = %self.vault.relative(&path),
                    "note keeps changing (or stays open for writing); waiting until its writer is done"
                );
            }
            let wait = if busy {
                Duration::from_millis(100)
            } else {
                settle.saturating_sub(age)
            };
            tokio::time::sleep(wait.max(Duration::from_millis(20))).await;
        };
        self.settling
            .lock()
            .expect("settling lock poisoned")
            .remove(&path);
        if settled {
            self.spawn_note(path).await;
        }
    }

    /// Whether `path` must wait before it is judged (DESIGN §9.1): a writer has it open, or
    /// its last call block is unfinished and its last change younger than `settle_max`. Then
    /// a wait is started (a settle, or a look again when `settle_max` has passed).
    fn still_being_written(self: &Arc<Self>, path: &Path, text: &str, parsed: &ParsedNote) -> bool {
        if note::write::writer_busy(path).unwrap_or(false) {
            let me = self.clone();
            let p = path.to_path_buf();
            tokio::spawn(async move { me.settle_then_look(p).await });
            return true;
        }
        if self.mode == Mode::Once || !unfinished_tail(text, parsed) {
            return false;
        }
        let Some(age) = modified_age(path) else {
            return true; // gone
        };
        let max = self.config.settle_max;
        if age >= max {
            return false;
        }
        tracing::info!(
            note = %self.vault.relative(path),
            "the last call block is unfinished; waiting up to settle_max for its writer"
        );
        let me = self.clone();
        let p = path.to_path_buf();
        tokio::spawn(async move {
            tokio::time::sleep(max - age + Duration::from_millis(50)).await;
            me.spawn_note(p).await;
        });
        true
    }

    async fn spawn_note(self: Arc<Self>, path: PathBuf) {
        if self.mark_inflight(&path) {
            self.note_task(path).await;
        }
    }

    /// True when the caller should start a task for `path`.
    fn mark_inflight(&self, path: &Path) -> bool {
        if self.vault.locate(path).is_none() {
            return false;
        }
        let mut inflight = self.inflight.lock().expect("inflight lock poisoned");
        if let Some(again) = inflight.get_mut(path) {
            *again = true;
            return false;
        }
        inflight.insert(path.to_path_buf(), false);
        true
    }

    async fn note_task(self: Arc<Self>, path: PathBuf) {
        let _slot = self.note_slots.acquire().await;
        loop {
            if !self.stopping.load(Ordering::SeqCst)
                && let Err(e) = self.look_at(&path).await
            {
                tracing::error!(note = %self.vault.relative(&path), "{e}");
            }
            let mut inflight = self.inflight.lock().expect("inflight lock poisoned");
            if inflight.get(&path) == Some(&true) {
                inflight.insert(path.clone(), false);
                continue;
            }
            inflight.remove(&path);
            break;
        }
        self.looked_at.fetch_add(1, Ordering::Relaxed);
    }

    /// Shows how far a long start-up backlog has got until it is done: a progress bar on a
    /// terminal, else a log line (and systemd's STATUS=) every few seconds.
    async fn report_progress(self: Arc<Self>, queued: usize, bar: bool) {
        let start = std::time::Instant::now();
        let bar = bar.then(|| {
            let b = indicatif::ProgressBar::new(queued as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {pos}/{len} notes ({elapsed})",
                )
                .expect("the template is valid")
                .progress_chars("=> "),
            );
            b.set_message("start-up backlog");
            b
        });
        let mut last_line = std::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let done = self.looked_at.load(Ordering::Relaxed).min(queued);
            if let Some(b) = &bar {
                b.set_position(done as u64);
            }
            if done >= queued || self.stopping.load(Ordering::SeqCst) {
                match &bar {
                    Some(b) => b.finish_with_message("start-up backlog done"),
                    None => tracing::info!(
                        queued,
                        "start-up backlog done in {:.1} s",
                        start.elapsed().as_secs_f64()
                    ),
                }
                return;
            }
            if last_line.elapsed() < Duration::from_secs(2) {
                continue;
            }
            last_line = std::time::Instant::now();
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&format!(
                "start-up backlog: {done} of {queued} notes"
            ))]);
            if bar.is_none() {
                tracing::info!(
                    "start-up backlog: {done} of {queued} notes ({}%)",
                    done * 100 / queued
                );
            }
        }
    }

    /// One look at a note in a watched folder.
    async fn look_at(self: &Arc<Self>, path: &Path) -> Result<(), DaemonError> {
        let Some((state, _)) = self.vault.locate(path) else {
            return Ok(());
        };
        if self.runners.is_paused() {
            return Ok(()); // a second runner: nothing new is claimed (§9.9)
        }
        match state {
            State::NeedsAction => self.claim_and_run(path, Pass::Fresh).await,
            State::Approved => self.claim_and_run(path, Pass::Approved).await,
            State::Rejected => self.reject_held(path).await,
            State::DryRun => self.preview_note(path).await,
            _ => Ok(()),
        }
    }

    /// Reads a note for processing; `None` (with the problem recorded once) when it is not a
    /// regular file, too big, unreadable or not UTF-8. Such notes are left exactly as they are.
    fn read_note(&self, path: &Path) -> Option<String> {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(_) => return None, // gone: moved or deleted meanwhile
        };
        if !meta.file_type().is_file() {
            return None;
        }
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if meta.permissions().readonly() {
            // Nobody may write it: a person made it read-only on purpose (root included).
            self.problem(
                path,
                meta.len(),
                mtime,
                "note is read-only (no write permission); left untouched".to_string(),
            );
            return None;
        }
        if meta.len() > self.config.max_note_bytes {
            self.problem(
                path,
                meta.len(),
                mtime,
                format!(
                    "note is {} bytes, over max_note_bytes = {}; left untouched",
                    meta.len(),
                    self.config.max_note_bytes
                ),
            );
            return None;
        }
        match std::fs::read(path) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(s) => Some(s),
                Err(e) => {
                    self.problem(
                        path,
                        meta.len(),
                        mtime,
                        format!(
                            "note is not UTF-8 (invalid byte at offset {}); left untouched",
                            e.utf8_error().valid_up_to()
                        ),
                    );
                    None
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                self.problem(
                    path,
                    meta.len(),
                    mtime,
                    format!("note cannot be read: {e}; left untouched"),
                );
                None
            }
        }
    }

    fn problem(&self, path: &Path, len: u64, mtime: SystemTime, message: String) {
        let key = (path.to_path_buf(), len, mtime);
        if !self
            .reported
            .lock()
            .expect("reported lock poisoned")
            .insert(key)
        {
            return;
        }
        let note = self.vault.relative(path);
        tracing::warn!(note = %note, "{message}");
        if let Err(e) = self.journal.record_problem(&note, &message) {
            tracing::error!("journal: {e}");
        }
    }

    /// Claims a note (rename into In_Progress) if it has pending calls, then runs it.
    async fn claim_and_run(self: &Arc<Self>, path: &Path, pass: Pass) -> Result<(), DaemonError> {
        loop {
            if self.arrivals.is_left_behind(path) {
                return Ok(()); // the first name of a note claimed by link, about to go
            }
            let Some(text) = self.read_note(path) else {
                return Ok(());
            };
            let parsed = parse_note(&text);
            if parsed.pending_calls().next().is_none()
                || self.stopping.load(Ordering::SeqCst)
                || self.runners.is_paused()
            {
                return Ok(()); // waiting for the agent, not for us: left exactly as it is
            }
            if self.still_being_written(path, &text, &parsed) {
                return Ok(());
            }
            if pass == Pass::Approved
                && self.approval_via_cli()
                && !self.cli_approved_any(&parsed).await?
            {
                return Ok(()); // moved into Approved/ by hand: only `vaultd approve` counts
            }
            let mut ident = self.identify(path, &text).await?;
            // A note whose calls still run here (it was moved back by hand mid-run, or is an
            // editor's copy of a note being claimed) waits for them: their outcomes are then
            // in the journal and are written, not run again (§9.3, §9.6).
            let copy_of = ident
                .stale
                .as_ref()
                .filter(|s| s.within_grace)
                .map(|s| s.of.note_id.clone());
            if let Some(busy) = copy_of.filter(|id| self.is_active(id)) {
                self.wait_inactive(&busy).await;
                continue;
            }
            if !self.activate(&ident.note_id) {
                self.wait_inactive(&ident.note_id).await;
                continue;
            }
            let note_id = ident.note_id.clone();
            let outcome = self.claim_identified(path, pass, &mut ident).await;
            self.deactivate(&note_id);
            return outcome;
        }
    }

    async fn claim_identified(
        self: &Arc<Self>,
        path: &Path,
        pass: Pass,
        ident: &mut Identity,
    ) -> Result<(), DaemonError> {
        let (claimed, left) = match self.claim_note(path).await {
            Ok(p) => p,
            Err(VaultError::Move { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(()); // moved away meanwhile
            }
            Err(e) => {
                // A read-only folder, say: reported once, the note stays where it is.
                let (len, mtime) = stamp(path);
                self.problem(path, len, mtime, format!("cannot claim the note: {e}"));
                return Ok(());
            }
        };
        self.runners.wrote(&claimed);
        // Marked before the run is recorded, so a rescan never resumes it as stranded.
        self.mark_inflight(&claimed);
        let from = self.vault.relative(path);
        let outcome = self
            .begin_and_execute(&claimed, &from, pass, ident, left.as_ref())
            .await;
        self.inflight
            .lock()
            .expect("inflight lock poisoned")
            .remove(&claimed);
        outcome
    }

    async fn begin_and_execute(
        self: &Arc<Self>,
        claimed: &Path,
        from: &str,
        pass: Pass,
        ident: &mut Identity,
        left: Option<&LeftBehind>,
    ) -> Result<(), DaemonError> {
        let note = self.vault.relative(claimed);
        let (id, from) = (ident.note_id.clone(), from.to_string());
        let copy_of = ident
            .stale
            .as_ref()
            .map(|s| (s.of.note_id.clone(), s.within_grace));
        let left_key = left.map(|l| l.file.encode());
        let run = self
            .blocking(move |j| {
                let copy_of = copy_of.as_ref().map(|(id, grace)| (id.as_str(), *grace));
                match &left_key {
                    Some(key) => j.begin_linked_run(&note, &id, &from, copy_of, key),
                    None => j.begin_note_run(&note, Some(&id), Some(&from), copy_of),
                }
            })
            .await?;
        tracing::debug!(note = %self.vault.relative(claimed), note_id = %ident.note_id, "claimed");
        if !self.write_identity(run, claimed, &ident.note_id).await? {
            return Ok(());
        }
        self.execute(run, claimed, pass, std::mem::take(ident))
            .await
    }

    /// Moves a note into In_Progress. A note renamed in within `moved_in_grace` is claimed by
    /// hard link instead, its first name dropped when the grace is over (`arrivals.rs`); on a
    /// file system without hard links it waits out the grace, then is renamed.
    async fn claim_note(
        self: &Arc<Self>,
        path: &Path,
    ) -> Result<(PathBuf, Option<LeftBehind>), VaultError> {
        if let Some(keep) = self.arrivals.keep_first_name_for(path) {
            let (vault, p) = (self.vault.clone(), path.to_path_buf());
            let linked = tokio::task::spawn_blocking(move || vault.link_to(&p, State::InProgress))
                .await
                .expect("claim task does not panic");
            match linked {
                Ok((claimed, left)) => {
                    self.arrivals.hold(&left);
                    let (me, l) = (self.clone(), left.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(keep).await;
                        let _ = tokio::task::spawn_blocking(move || {
                            me.arrivals.drop_one(&me.vault, &l)
                        })
                        .await;
                    });
                    return Ok((claimed, Some(left)));
                }
                Err(LinkError::Unsupported) => tokio::time::sleep(keep).await,
                Err(LinkError::Vault(e)) => return Err(e),
            }
        }
        let (vault, p) = (self.vault.clone(), path.to_path_buf());
        tokio::task::spawn_blocking(move || vault.move_to(&p, State::InProgress))
            .await
            .expect("claim task does not panic")
            .map(|claimed| (claimed, None))
    }

    /// Stamps a claimed note with `tool_note` (DESIGN §9.2), `tool_runner` and `tool_updated`
    /// (§9.9). False when the note is gone (the run is then abandoned). Any other failure is
    /// logged: the results write adds them later.
    async fn write_identity(
        &self,
        run: RunId,
        path: &Path,
        note_id: &str,
    ) -> Result<bool, DaemonError> {
        let (p, id) = (path.to_path_buf(), note_id.to_string());
        let runner = self.runners.me.to_string();
        let written = tokio::task::spawn_blocking(move || {
            note::update_note(&p, |current| {
                note::stamp_claim(current, &id, &runner, SystemTime::now())
            })
        })
        .await
        .expect("write task does not panic");
        match written {
            Ok(_) => {
                self.runners.wrote(path);
                Ok(true)
            }
            Err(note::WriteError::Gone(_)) => {
                self.abandon(run, path).await?;
                Ok(false)
            }
            Err(e) => {
                tracing::warn!(note = %self.vault.relative(path), "cannot add tool_note yet: {e}");
                Ok(true)
            }
        }
    }

    /// Decides a note's identity at its claim: the `tool_note` it carries unless another note
    /// in the vault carries it too (a copy gets a new id), else a new one; a note without one
    /// at a path a note was claimed from within `stale_copy_window` is a stale copy (§9.6).
    async fn identify(&self, path: &Path, text: &str) -> Result<Identity, DaemonError> {
        let rel = self.vault.relative(path);
        if let Some(id) =
            note::frontmatter_property(text, "tool_note").filter(|id| valid_note_id(id))
        {
            let id = id.to_string();
            let q = id.clone();
            let last = self.blocking(move |j| j.note_path(&q)).await?;
            let copy = last.is_some_and(|p| {
                p != rel
                    && std::fs::read_to_string(self.vault.root().join(&p))
                        .is_ok_and(|t| note::frontmatter_property(&t, "tool_note") == Some(&id))
            });
            if !copy {
                let (prior, stale) = self.prior_for(&id).await?;
                return Ok(Identity {
                    note_id: id,
                    prior,
                    stale,
                    ..Identity::default()
                });
            }
            tracing::info!(note = %rel, copy_of = %id, "a copy of another note: it gets its own tool_note");
        }
        let mut ident = Identity {
            note_id: new_note_id(),
            ..Identity::default()
        };
        let q = rel.clone();
        let Some(claim) = self.blocking(move |j| j.last_claim_from(&q)).await? else {
            return Ok(ident);
        };
        let age = SystemTime::now()
            .duration_since(claim.claimed_at)
            .unwrap_or_default();
        if age > self.config.stale_copy_window {
            return Ok(ident);
        }
        // A copy of a copy stands for the first note: the chain is followed to it.
        let (prior, root) = self.prior_for(&claim.note_id).await?;
        let claim = match root {
            Some(root) => Claim {
                note_id: root.of.note_id,
                claimed_at: claim.claimed_at,
                note: root.of.note,
            },
            None => claim,
        };
        let parsed = parse_note(text);
        let within_grace = age <= self.config.stale_copy_grace;
        let shares_started_call = parsed.pending_calls().any(|c| {
            prior
                .get(&c.call_id)
                .is_some_and(|r| r.started_at.is_some() || r.recorded.is_some())
        });
        // That note may not have started its calls yet: while it runs here, the copy waits
        // for it (and is judged again after).
        let still_running = within_grace && self.is_active(&claim.note_id);
        if !shares_started_call && !still_running {
            return Ok(ident); // shares no started call with that note: a note of its own
        }
        tracing::warn!(
            note = %rel,
            copy_of = %claim.note,
            within_grace,
            "a note without tool_note where {} was claimed from: a stale copy; its calls that already ran are not run again",
            claim.note
        );
        ident.prior = prior;
        ident.stale = Some(StaleCopy {
            of: claim,
            within_grace,
        });
        Ok(ident)
    }

    /// What the journal holds for the calls of `note_id` (§9.3); for a stale copy (§9.6) the
    /// calls of the note it stands for too, its own records first.
    async fn prior_for(
        &self,
        note_id: &str,
    ) -> Result<(HashMap<String, JournalCall>, Option<StaleCopy>), DaemonError> {
        let q = note_id.to_string();
        let own = by_call_id(self.blocking(move |j| j.note_calls(&q)).await?);
        let q = note_id.to_string();
        let Some((of, within_grace)) = self.blocking(move |j| j.copy_of(&q)).await? else {
            return Ok((own, None));
        };
        let q = of.clone();
        let mut prior = by_call_id(self.blocking(move |j| j.note_calls(&q)).await?);
        let q = of.clone();
        let note = self
            .blocking(move |j| j.note_path(&q))
            .await?
            .unwrap_or_default();
        prior.extend(own);
        let stale = StaleCopy {
            of: Claim {
                note_id: of,
                claimed_at: SystemTime::now(),
                note,
            },
            within_grace,
        };
        Ok((prior, Some(stale)))
    }

    fn is_active(&self, note_id: &str) -> bool {
        self.active
            .lock()
            .expect("active lock poisoned")
            .contains_key(note_id)
    }

    /// Marks `note_id` as having a run here; false when it already has one.
    fn activate(&self, note_id: &str) -> bool {
        let mut active = self.active.lock().expect("active lock poisoned");
        if active.contains_key(note_id) {
            return false;
        }
        active.insert(note_id.to_string(), Arc::new(tokio::sync::Notify::new()));
        true
    }

    fn deactivate(&self, note_id: &str) {
        if let Some(n) = self
            .active
            .lock()
            .expect("active lock poisoned")
            .remove(note_id)
        {
            n.notify_waiters();
        }
    }

    /// Waits until `note_id` has no run here.
    async fn wait_inactive(&self, note_id: &str) {
        tracing::info!(
            note_id,
            "the note's calls are still running: waiting for them"
        );
        loop {
            let notify = self
                .active
                .lock()
                .expect("active lock poisoned")
                .get(note_id)
                .cloned();
            let Some(notify) = notify else { return };
            // Re-checked every so often: a wake-up between the check and the wait is not lost.
            let _ = tokio::time::timeout(Duration::from_millis(200), notify.notified()).await;
        }
    }

    /// Runs the pending calls of a claimed note, writes the results, moves the note on.
    async fn execute(
        self: &Arc<Self>,
        run: RunId,
        path: &Path,
        pass: Pass,
        ident: Identity,
    ) -> Result<(), DaemonError> {
        let prior = &ident.prior;
        let read = {
            let path = path.to_path_buf();
            tokio::task::spawn_blocking(move || note::read_settled(&path))
                .await
                .expect("read task does not panic")
        };
        let text = match read {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(s) => s,
                Err(e) => {
                    // Became non-UTF-8 after the claim: give it back untouched.
                    let (len, mtime) = stamp(path);
                    self.problem(
                        path,
                        len,
                        mtime,
                        format!(
                            "note is not UTF-8 (invalid byte at offset {}); left untouched",
                            e.utf8_error().valid_up_to()
                        ),
                    );
                    return self
                        .finish_run(
                            run,
                            path,
                            State::Failed,
                            Vec::new(),
                            "the note is not UTF-8",
                        )
                        .await
                        .map(|_| ());
                }
            },
            Err(note::WriteError::Gone(_)) => {
                return self.abandon(run, path).await;
            }
            Err(e) => {
                // Unreadable now (permissions changed?): leave it, the run stays open and is
                // retried at the next scan.
                tracing::error!(note = %self.vault.relative(path), "cannot read the claimed note: {e}");
                return Ok(());
            }
        };
        let parsed = parse_note(&text);
        let registry = &self.runner.registry;
        let max = self.config.max_calls_per_note;

        enum Step {
            /// A result to write; `recorded` when the journal already holds it.
            Done(CallResult),
            Recorded(CallResult),
            Run {
                call_id: String,
                name: String,
                parameters: Map<String, Value>,
            },
            Hold(HeldCall),
            StillHeld,
        }
        let mut steps = Vec::new();
        let mut left_pending = 0usize;
        for (i, call) in parsed.pending_calls().enumerate() {
            let call_id = call.call_id.clone();
            let shown_name = call.name.clone().unwrap_or_else(|| "tool_call".to_string());
            if i >= 2 * max {
                // §9.8: past twice the cap, calls stay pending (no result block each), so a
                // note of 10,000 calls does not grow by 9,990 QUOTA_EXCEEDED blocks.
                left_pending += 1;
                continue;
            }
            if i >= max {
                steps.push(Step::Done(CallResult::failed_now(
                    &call_id,
                    &shown_name,
                    CallError::new(
                        ErrorCode::QuotaExceeded,
                        format!(
                            "only the first {max} pending calls of a note run per round (max_calls_per_note); write this call again to run it"
                        ),
                    ),
                )));
                continue;
            }
            let (name, parameters) = match &call.body {
                CallBody::Broken(e) => {
                    steps.push(Step::Done(CallResult::failed_now(
                        &call_id,
                        &shown_name,
                        e.clone(),
                    )));
                    continue;
                }
                CallBody::Call { name, parameters } => (name, parameters),
            };
            // §9.3: what the journal recorded for this call of this note decides, by the
            // effect recorded at its start, never by what the registry says now.
            let record = prior.get(&call_id);
            let same_note = ident.stale.is_none();
            let within_grace = ident.stale.as_ref().is_some_and(|s| s.within_grace);
            let mut stale_reason = None;
            match record {
                Some(r) if same_note || within_grace => match (&r.progress, &r.recorded) {
                    (CallProgress::Finished(result), _) => {
                        steps.push(Step::Recorded(result.clone()));
                        continue;
                    }
                    // Written once and since deleted from the note: run again (§2), unless
                    // this is a stale copy, which gets what the note it copies got.
                    (CallProgress::Written, Some(result)) if !same_note => {
                        steps.push(Step::Recorded(result.clone()));
                        continue;
                    }
                    (CallProgress::Started, _) if !r.effect.safe_to_repeat() => {
                        steps.push(Step::Done(unknown_outcome(&call_id, name)));
                        continue;
                    }
                    _ => {}
                },
                Some(r) if r.started_at.is_some() && !r.effect.safe_to_repeat() => {
                    // A stale copy past the grace: held, saying when and where it ran.
                    let when = r
                        .started_at
                        .map(crate::call::rfc3339_seconds)
                        .unwrap_or_default();
                    stale_reason = Some(format!(
                        "this call already ran at {when} from {} (this note looks like an old copy of it)",
                        r.note
                    ));
                }
                Some(_) => {}
                None if pass == (Pass::Recover { known: false })
                    && registry
                        .get(name)
                        .is_some_and(|t| !t.spec().effect.safe_to_repeat()) =>
                {
                    // §8.15: the journal knows nothing of the note; it may have run.
                    steps.push(Step::Done(unknown_outcome(&call_id, name)));
                    continue;
                }
                None => {}
            }
            let tool = match registry.resolve(name, parameters) {
                Ok(t) => t,
                Err(e) => {
                    steps.push(Step::Done(CallResult::failed_now(&call_id, name, e)));
                    continue;
                }
            };
            let admission = match stale_reason {
                Some(reason) => Admission::Hold { reason },
                None => tool.admit(parameters),
            };
            match admission {
                Admission::Run => steps.push(Step::Run {
                    call_id,
                    name: name.clone(),
                    parameters: parameters.clone(),
                }),
                Admission::Deny(e) => {
                    steps.push(Step::Done(CallResult::failed_now(&call_id, name, e)))
                }
                Admission::Hold { reason } => {
                    match self
                        .held_call_decision(pass, &parsed, &call_id, name, parameters)
                        .await?
                    {
                        HeldDecision::Run => steps.push(Step::Run {
                            call_id,
                            name: name.clone(),
                            parameters: parameters.clone(),
                        }),
                        HeldDecision::Rejected => {
                            steps.push(Step::Done(crate::approval::rejected_result(&call_id, name)))
                        }
                        HeldDecision::Waiting => steps.push(Step::StillHeld),
                        HeldDecision::Ask => steps.push(Step::Hold(HeldCall {
                            call_id,
                            name: name.clone(),
                            parameters: parameters.clone(),
                            reason: format!("{reason}. {}", self.how_to_decide()),
                        })),
                    }
                }
            }
        }

        if left_pending > 0 {
            let message = format!(
                "{left_pending} more pending calls left for a later round (at most {max} run and {max} get QUOTA_EXCEEDED per claim, max_calls_per_note)"
            );
            tracing::warn!(note = %self.vault.relative(path), "{message}");
            let rel = self.vault.relative(path);
            let _ = self
                .blocking(move |j| j.record_problem(&rel, &message))
                .await;
        }
        self.apply_note_budget(
            &ident.note_id,
            &mut steps,
            prior,
            |step| match step {
                Step::Run { call_id, name, .. } => Some((call_id.clone(), name.clone(), true)),
                Step::Hold(h) => Some((h.call_id.clone(), h.name.clone(), false)),
                _ => None,
            },
            |call_id, name, e| Step::Done(CallResult::failed_now(call_id, name, e)),
        )
        .await?;

        // Run what may run, concurrently; results stay in call order. Vault changes
        // (`state_change`) of one note run one after another in call order, so a note can
        // create a note and then append to it.
        let mut handles = Vec::with_capacity(steps.len());
        let mut previous_change: Option<tokio::sync::oneshot::Receiver<()>> = None;
        for step in &steps {
            if let Step::Run {
                call_id,
                name,
                parameters,
            } = step
            {
                let me = self.clone();
                let (call_id, name, parameters) =
                    (call_id.clone(), name.clone(), parameters.clone());
                let note = self.vault.relative(path);
                let changes_vault = self
                    .runner
                    .registry
                    .get(&name)
                    .is_some_and(|t| t.spec().effect == crate::tools::Effect::StateChange);
                let (after, finished) = if changes_vault {
                    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                    (previous_change.replace(rx), Some(tx))
                } else {
                    (None, None)
                };
                let note_id = ident.note_id.clone();
                handles.push(Some(tokio::spawn(async move {
                    if let Some(previous) = after {
                        // Resolves when the previous change finished (its sender dropped).
                        let _ = previous.await;
                    }
                    let result = me
                        .runner
                        .run_call(run, &note, &note_id, &call_id, &name, &parameters)
                        .await;
                    drop(finished);
                    result
                })));
            } else {
                handles.push(None);
            }
        }
        let mut results: Vec<CallResult> = Vec::new();
        let mut held: Vec<HeldCall> = Vec::new();
        let mut waiting = false;
        let mut foreign: HashSet<String> = HashSet::new();
        // Results of calls that never ran, journaled together in one commit below.
        let mut unrecorded: Vec<CallResult> = Vec::new();
        for (step, handle) in steps.into_iter().zip(handles) {
            match (step, handle) {
                (_, Some(h)) => match h.await {
                    Ok(r) => results.push(r),
                    Err(e) => tracing::error!("call task failed: {e}"),
                },
                (Step::Done(r), None) => {
                    let r = self.redact_result(r);
                    unrecorded.push(r.clone());
                    results.push(r)
                }
                (Step::Recorded(r), None) => {
                    if ident.stale.is_some() {
                        // Recorded for the note this copies, not for this one.
                        foreign.insert(r.call_id.clone());
                    }
                    results.push(r)
                }
                (Step::Hold(h), None) => {
                    held.push(h);
                    waiting = true;
                }
                (Step::StillHeld, None) => waiting = true,
                (Step::Run { .. }, None) => unreachable!("every Run step has a handle"),
            }
        }

        if !unrecorded.is_empty() {
            self.blocking(move |j| j.calls_finished(run, &unrecorded))
                .await?;
        }

        // Results this run wrote before a crash count for Done or Failed (§8.5) as much as the
        // ones written now: a kill between the write and the move must not turn Failed into Done.
        let failed_before_crash = parsed
            .results
            .iter()
            .any(|r| !r.ok && ident.this_run.contains(&r.call_id));
        let next = if waiting {
            State::PendingApproval
        } else if failed_before_crash || results.iter().any(|r| !r.is_ok()) {
            State::Failed
        } else {
            State::Done
        };
        let reason = outcome_reason(&results, &held, waiting);
        let results = self.fit_results(path, &text, &ident.note_id, results);
        let newly_held: Vec<HeldSummary> = held
            .iter()
            .map(|h| HeldSummary {
                call_id: h.call_id.clone(),
                name: h.name.clone(),
                reason: h.reason.clone(),
            })
            .collect();
        match self
            .write_back(path, &ident.note_id, results, held, next)
            .await?
        {
            WriteBack::Written(mut ids) => {
                ids.retain(|id| !foreign.contains(id));
                let finished = self.finish_run(run, path, next, ids, &reason).await;
                if let Ok(dest) = &finished
                    && !newly_held.is_empty()
                {
                    let note = self.vault.relative(dest);
                    self.hold_alerts
                        .note_held(
                            &self.runner.registry,
                            &note,
                            &newly_held,
                            &self.how_to_decide(),
                        )
                        .await;
                }
                if let Err(e) = finished {
                    // A read-only destination, say: the results are in the note; the run stays
                    // open and the move is retried at the next scan.
                    let rel = self.vault.relative(path);
                    let message = format!("{e}; retried at the next scan");
                    let _ = self
                        .blocking(move |j| j.record_problem(&rel, &message))
                        .await;
                    return Err(e);
                }
            }
            WriteBack::Gone => self.abandon(run, path).await?,
            // The note stays in In_Progress with its run open; the next periodic scan (or
            // start-up) writes the recorded results from the journal and moves it on.
            WriteBack::Failed => {}
        }
        Ok(())
    }

    /// DESIGN §9.8: vaultd's additions never push a note past `max_note_bytes`. The biggest
    /// results' data go, whole, to `Tool_Results/<note id>/<call id>.md` (the §10.6 shape)
    /// until the note fits; the callout keeps a preview and a link.
    fn fit_results(
        &self,
        path: &Path,
        text: &str,
        note_id: &str,
        mut results: Vec<CallResult>,
    ) -> Vec<CallResult> {
        let limit = usize::try_from(self.config.max_note_bytes).unwrap_or(usize::MAX);
        // Callout framing, meta and frontmatter: generously 1 KiB per result.
        let size = |r: &CallResult| {
            1024 + match &r.outcome {
                Ok(out) => out.data.to_string().len() * 2 + out.summary.len(),
                Err(e) => {
                    e.message.len() * 2 + e.details.as_ref().map_or(0, |d| d.to_string().len() * 2)
                }
            }
        };
        let mut total = text.len() + results.iter().map(size).sum::<usize>();
        if total <= limit {
            return results;
        }
        let mut order: Vec<usize> = (0..results.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(size(&results[i])));
        for i in order {
            if total <= limit {
                break;
            }
            let r = &mut results[i];
            let before = size(r);
            let Ok(out) = &mut r.outcome else { continue };
            match self.results.save_whole(note_id, &r.call_id, &out.data) {
                Ok(stand_in) => out.data = stand_in,
                Err(e) => {
                    tracing::error!(note = %self.vault.relative(path), "{e}");
                    continue;
                }
            }
            total = total - before + size(r);
        }
        results
    }

    /// What becomes of a call the policy holds (DESIGN §4). A question the note shows binds
    /// the decision to the exact parameters it lists: a call edited since is asked about
    /// again. With `approval_via = "folder"` the note being in Approved/ decides; with
    /// `"cli"` only a decision `vaultd approve`/`reject` recorded in the journal does, and it
    /// is consumed here so it counts once.
    async fn held_call_decision(
        &self,
        pass: Pass,
        parsed: &ParsedNote,
        call_id: &str,
        name: &str,
        parameters: &Map<String, Value>,
    ) -> Result<HeldDecision, DaemonError> {
        let hash = note::params_hash(name, parameters);
        if !parsed.is_held_as(call_id, &hash) {
            return Ok(HeldDecision::Ask);
        }
        let id = call_id.to_string();
        if !self.approval_via_cli() {
            if pass != Pass::Approved {
                return Ok(HeldDecision::Waiting);
            }
            // Moving the note decided; a `vaultd approve` record, if any, is spent with it.
            self.blocking(move |j| j.consume_approval(&id, &hash))
                .await?;
            return Ok(HeldDecision::Run);
        }
        Ok(
            match self
                .blocking(move |j| j.consume_approval(&id, &hash))
                .await?
            {
                Some(Decision::Approved) => HeldDecision::Run,
                Some(Decision::Rejected) => HeldDecision::Rejected,
                None => HeldDecision::Waiting,
            },
        )
    }

    /// CLI mode: whether `vaultd approve` approved any held call of the note (not consumed),
    /// with any parameters: a call edited after its approval is then asked about again.
    async fn cli_approved_any(&self, parsed: &ParsedNote) -> Result<bool, DaemonError> {
        for call in parsed.pending_calls() {
            if !parsed.is_held(&call.call_id) {
                continue;
            }
            let id = call.call_id.clone();
            if self.blocking(move |j| j.approved_any(&id)).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The note budget (DESIGN §12.2): once the calls this note ever started reach
    /// `note_budget`, every further call that would run or be held gets QUOTA_EXCEEDED. Calls
    /// already started (recovery) are not charged again.
    async fn apply_note_budget<S>(
        &self,
        note_id: &str,
        steps: &mut [S],
        prior: &HashMap<String, JournalCall>,
        charged: impl Fn(&S) -> Option<(String, String, bool)>,
        spent: impl Fn(&str, &str, CallError) -> S,
    ) -> Result<(), DaemonError> {
        let budget = self.config.guard.note_budget;
        let key = note_id.to_string();
        let started = self
            .blocking(move |j| budget::calls_started(j, &key))
            .await?;
        let mut left = budget::remaining(budget, started);
        for step in steps.iter_mut() {
            let Some((call_id, name, runs)) = charged(step) else {
                continue;
            };
            if prior.contains_key(&call_id) {
                continue;
            }
            if left == 0 {
                *step = spent(&call_id, &name, budget::spent(budget));
            } else if runs {
                left -= 1;
            }
        }
        Ok(())
    }

    /// A note in Dry_Run/: each pending call gets its preview, once; nothing runs, nothing is
    /// journaled, the note stays where it is (DESIGN §12.1).
    async fn preview_note(&self, path: &Path) -> Result<(), DaemonError> {
        let Some(text) = self.read_note(path) else {
            return Ok(());
        };
        let registry = self.runner.registry.clone();
        let redactor = self.runner.redactor.clone();
        let note = self.vault.relative(path);
        // A note that ran before carries its id; a new one has spent nothing yet.
        let started = match note::frontmatter_property(&text, "tool_note") {
            Some(id) => {
                let key = id.to_string();
                self.blocking(move |j| budget::calls_started(j, &key))
                    .await?
            }
            None => 0,
        };
        let facts = dry_run::Facts {
            budget_left: Some(budget::remaining(self.config.guard.note_budget, started)),
            note_budget: self.config.guard.note_budget,
            circuits: self.runner.breakers.snapshot(),
        };
        let path_buf = path.to_path_buf();
        let now = SystemTime::now();
        let runner = self.runners.me.clone();
        let written = tokio::task::spawn_blocking(move || {
            note::update_note(&path_buf, |current| {
                let parsed = parse_note(current);
                let previews =
                    dry_run::previews(&registry, &redactor, &parsed, current, &note, &facts);
                if previews.is_empty() {
                    return current.to_string();
                }
                let blocks: Vec<Block<'_>> = previews.iter().map(Block::Preview).collect();
                let text = note::append_blocks(current, &blocks, State::DryRun.as_str(), now);
                note::set_runner(&text, runner.as_str())
            })
        })
        .await
        .expect("write task does not panic");
        match written {
            Ok(_) | Err(note::WriteError::Gone(_)) => Ok(()),
            Err(e) => {
                let (len, mtime) = stamp(path);
                self.problem(
                    path,
                    len,
                    mtime,
                    format!("dry-run previews not written: {e}"),
                );
                Ok(())
            }
        }
    }

    /// The last sentence of a `[!question]`: how a person decides, in this vault's mode.
    fn how_to_decide(&self) -> String {
        if self.approval_via_cli() {
            "To send it, run `vaultd approve NOTE` with this note's path; to refuse, `vaultd reject NOTE`. Moving the note does not approve it.".to_string()
        } else {
            format!(
                "To send it, move this note to `{}/`; to refuse, move it to `{}/`.",
                self.vault.folder_name(State::Approved),
                self.vault.folder_name(State::Rejected)
            )
        }
    }

    /// The note left In_Progress during its run (a person deleted or moved it): the run is
    /// closed as abandoned and nothing is recreated.
    async fn abandon(&self, run: RunId, path: &Path) -> Result<(), DaemonError> {
        let rel = self.vault.relative(path);
        tracing::warn!(
            note = %rel,
            "note was deleted or moved out of In_Progress while its calls ran; their results are in the journal (vaultd log), not in a note"
        );
        self.blocking(move |j| {
            j.abandon_run(
                run,
                "note deleted or moved out of In_Progress during its run; results not written",
            )
        })
        .await
    }

    fn redact_result(&self, mut r: CallResult) -> CallResult {
        r.outcome = r.outcome.map_err(|e| self.runner.redact_error(e));
        r
    }

    /// Appends the results and notices into the note (atomically, keeping any edit made
    /// meanwhile). Returns the ids written, for `finish_run` to record.
    /// A note at `path` that carries another `tool_note` than `note_id` is another note (this
    /// one was moved away and another claimed to the same path): nothing is written, `Gone`.
    async fn write_back(
        &self,
        path: &Path,
        note_id: &str,
        results: Vec<CallResult>,
        held: Vec<HeldCall>,
        next: State,
    ) -> Result<WriteBack, DaemonError> {
        let path_buf = path.to_path_buf();
        let ids: Vec<String> = results.iter().map(|r| r.call_id.clone()).collect();
        let now = SystemTime::now();
        let note_id = note_id.to_string();
        let runner = self.runners.me.clone();
        let written = tokio::task::spawn_blocking(move || {
            let other_note = std::cell::Cell::new(false);
            let written = note::update_note(&path_buf, |current| {
                if note::frontmatter_property(current, "tool_note")
                    .is_some_and(|id| !note_id.is_empty() && id != note_id)
                {
                    other_note.set(true);
                    return current.to_string();
                }
                other_note.set(false);
                let cur = parse_note(current);
                let written: HashSet<&str> =
                    cur.results.iter().map(|r| r.call_id.as_str()).collect();
                let mut blocks: Vec<Block<'_>> = Vec::new();
                for r in &results {
                    if !written.contains(r.call_id.as_str()) {
                        blocks.push(Block::Result(r));
                    }
                }
                for h in &held {
                    let shown =
                        cur.is_held_as(&h.call_id, &note::params_hash(&h.name, &h.parameters));
                    if !shown && !cur.has_result(&h.call_id) {
                        blocks.push(Block::Held(h));
                    }
                }
                let text = note::append_blocks(current, &blocks, next.as_str(), now);
                // §9.9: whoever updates a note is its runner from now on.
                let text = note::set_runner(&text, runner.as_str());
                if note::frontmatter_property(&text, "tool_note").is_none() && !note_id.is_empty() {
                    note::set_note_id(&text, &note_id)
                } else {
                    text
                }
            });
            if other_note.get() {
                return Err(note::WriteError::Gone(path_buf));
            }
            written
        })
        .await
        .expect("write task does not panic");
        match written {
            // Recorded with the move that follows (`finish_run`), in one journal commit.
            Ok(_) => {
                self.runners.wrote(path);
                Ok(WriteBack::Written(ids))
            }
            Err(note::WriteError::Gone(_)) => Ok(WriteBack::Gone),
            Err(e) => {
                let rel = self.vault.relative(path);
                let message = format!(
                    "results not written yet ({e}); the note stays in {}/ and is retried at the next scan",
                    self.vault.folder_name(State::InProgress)
                );
                tracing::error!(note = %rel, "{message}");
                let _ = self
                    .blocking(move |j| j.record_problem(&rel, &message))
                    .await;
                Ok(WriteBack::Failed)
            }
        }
    }

    /// Moves the note to `next` (unless it is already there) and closes the run.
    async fn finish_run(
        &self,
        run: RunId,
        path: &Path,
        next: State,
        written: Vec<String>,
        reason: &str,
    ) -> Result<PathBuf, DaemonError> {
        let here = self.vault.locate(path).map(|(s, _)| s);
        let dest = if here == Some(next) || !path.exists() {
            path.to_path_buf()
        } else {
            let (vault, p) = (self.vault.clone(), path.to_path_buf());
            let dest = tokio::task::spawn_blocking(move || vault.move_to(&p, next))
                .await
                .expect("move task does not panic")?;
            self.runners.wrote(&dest);
            dest
        };
        let rel = self.vault.relative(&dest);
        // One line per finished note, with its outcome and why (point 10 of issue 10); a held
        // note's line says what to do next (§13).
        match next {
            State::Failed => {
                tracing::warn!(note = %rel, state = next.as_str(), "note failed: {reason}")
            }
            State::PendingApproval => {
                // Every refusal says what to do next (§13); a held call's reason already does.
                let how = self.how_to_decide();
                let why = if reason.contains(&how) {
                    reason.to_string()
                } else {
                    format!("{reason}. {how}")
                };
                tracing::warn!(note = %rel, state = next.as_str(), "note held for approval: {why}")
            }
            _ => tracing::info!(note = %rel, state = next.as_str(), "note processed: {reason}"),
        }
        self.blocking(move |j| {
            let ids: Vec<&str> = written.iter().map(String::as_str).collect();
            j.written_and_moved(run, &ids, &rel, true)
        })
        .await?;
        Ok(dest)
    }

    /// A note moved into Rejected: its held calls get REJECTED results; it stays there.
    async fn reject_held(self: &Arc<Self>, path: &Path) -> Result<(), DaemonError> {
        let Some(text) = self.read_note(path) else {
            return Ok(());
        };
        let parsed = parse_note(&text);
        let rejected: Vec<CallResult> = parsed
            .pending_calls()
            .filter(|c| parsed.is_held(&c.call_id))
            .map(|c| {
                crate::approval::rejected_result(
                    &c.call_id,
                    c.name.as_deref().unwrap_or("tool_call"),
                )
            })
            .collect();
        if rejected.is_empty() {
            return Ok(());
        }
        let note = self.vault.relative(path);
        let run = self.blocking(move |j| j.begin_run(&note)).await?;
        if let WriteBack::Written(ids) = self
            .write_back(path, "", rejected, Vec::new(), State::Rejected)
            .await?
        {
            let reason = format!("{} held call(s) rejected", ids.len());
            self.finish_run(run, path, State::Rejected, ids, &reason)
                .await?;
        } else {
            let reason = "results not written into the rejected note";
            self.blocking(move |j| j.abandon_run(run, reason)).await?;
        }
        Ok(())
    }

    /// Finishes open runs whose note sits in In_Progress with no task on it: their results
    /// could not be written or the note not moved (it kept changing, a folder was read-only).
    async fn resume_stranded(self: Arc<Self>) {
        if self.stopping.load(Ordering::SeqCst) || self.runners.is_paused() {
            return;
        }
        let open = match self.blocking(|j| j.open_runs()).await {
            Ok(open) => open,
            Err(e) => {
                tracing::error!("journal: {e}");
                return;
            }
        };
        for r in open {
            let path = self.vault.root().join(&r.note);
            if self.vault.locate(&path).map(|(s, _)| s) != Some(State::InProgress)
                || !path.is_file()
                || !self.mark_inflight(&path)
            {
                continue;
            }
            let _slot = self.note_slots.acquire().await;
            // The list may be stale: the run's own task may have closed it meanwhile, and a
            // new file may sit at the same path. Take the journal's word now.
            let note = r.note.clone();
            let current = self.blocking(move |j| j.run_for_note(&note)).await;
            match current {
                Ok(Some(now)) if now.run_id == r.run_id => {
                    tracing::info!(note = %r.note, "retrying a run whose note was not finished");
                    if let Err(e) = self.recover_note(&path, Some(now)).await {
                        tracing::error!(note = %r.note, "{e}");
                    }
                }
                _ => {}
            }
            self.inflight
                .lock()
                .expect("inflight lock poisoned")
                .remove(&path);
        }
    }

    /// Finishes a note found in In_Progress (DESIGN §5, §8.15, §9.3): continues its open run
    /// `open` if the journal has one at this path, else starts one. Its identity is the
    /// `tool_note` it carries, else the run's, else a new one (written into it).
    async fn recover_note(
        self: &Arc<Self>,
        path: &Path,
        open: Option<crate::journal::OpenRun>,
    ) -> Result<(), DaemonError> {
        let rel = self.vault.relative(path);
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let carried = note::frontmatter_property(&text, "tool_note")
            .filter(|id| valid_note_id(id))
            .map(str::to_string);
        let note_id = carried
            .clone()
            .or_else(|| open.as_ref().and_then(|r| r.note_id.clone()))
            .unwrap_or_else(new_note_id);
        if !self.activate(&note_id) {
            // Its own task runs it right now.
            return Ok(());
        }
        let outcome = async {
            let (prior, stale) = self.prior_for(&note_id).await?;
            let (run, known, this_run) = match open {
                Some(r) => {
                    if r.note_id.is_none() {
                        // A run from a version 1 journal: keyed by note id from now on.
                        let id = note_id.clone();
                        self.blocking(move |j| j.adopt_run(r.run_id, &id)).await?;
                    }
                    tracing::info!(note = %rel, "recovering an interrupted run");
                    let this_run = r.calls.iter().map(|c| c.call_id.clone()).collect();
                    (r.run_id, true, this_run)
                }
                None => {
                    let known = !prior.is_empty();
                    if !known {
                        tracing::warn!(note = %rel, "note in In_Progress unknown to the journal: treating it as interrupted");
                    }
                    let (note, id) = (rel.clone(), note_id.clone());
                    let run = self
                        .blocking(move |j| j.begin_note_run(&note, Some(&id), None, None))
                        .await?;
                    (run, known, HashSet::new())
                }
            };
            // Runs recorded by a version 1 journal have their calls under the run only.
            let mut prior = prior;
            if prior.is_empty() {
                let note = rel.clone();
                if let Some(r) = self.blocking(move |j| j.run_for_note(&note)).await? {
                    prior = by_call_id(r.calls);
                }
            }
            if carried.is_none() && !self.write_identity(run, path, &note_id).await? {
                return Ok(());
            }
            let ident = Identity {
                note_id: note_id.clone(),
                prior,
                this_run,
                stale,
            };
            self.execute(run, path, Pass::Recover { known }, ident).await
        }
        .await;
        self.deactivate(&note_id);
        outcome
    }

    /// Start-up: finishes every note left in In_Progress from the journal (DESIGN §5, §8.15).
    async fn recover(self: &Arc<Self>, tasks: &mut JoinSet<()>) -> Result<(), DaemonError> {
        // Temp files of writes a killed daemon never finished (the note itself is intact).
        let swept = self.vault.remove_temp_files(note::write::is_stale_temp);
        if swept > 0 {
            tracing::info!(swept, "removed temp files of interrupted writes");
        }
        let open = self.blocking(|j| j.open_runs()).await?;
        let notes = self.vault.scan(State::InProgress);
        let since = SystemTime::now() - Duration::from_secs(24 * 3600);
        let recorded = self.blocking(move |j| j.left_behind_since(since)).await?;
        crate::arrivals::settle_after_crash(&self.vault, &recorded, &notes);
        let mut seen = HashSet::new();
        for path in notes {
            let rel = self.vault.relative(&path);
            let known = open.iter().rev().find(|r| r.note == rel).cloned();
            if let Some(r) = &known {
                seen.insert(r.run_id);
            }
            if !self.mark_inflight(&path) {
                continue;
            }
            let me = self.clone();
            tasks.spawn(async move {
                let _slot = me.note_slots.acquire().await;
                if let Err(e) = me.recover_note(&path, known).await {
                    tracing::error!(note = %rel, "recovery failed: {e}");
                }
                me.inflight
                    .lock()
                    .expect("inflight lock poisoned")
                    .remove(&path);
            });
        }
        // Runs whose note is no longer in In_Progress were moved before the journal heard of
        // it (or by hand while the daemon was down): closed; their calls stay recorded under
        // the note's id, so the note is not run twice wherever it comes back (§9.3).
        for r in open.into_iter().filter(|r| !seen.contains(&r.run_id)) {
            let note = r.note.clone();
            self.blocking(move |j| j.note_moved(r.run_id, &note, true))
                .await?;
        }
        // Recovery must finish before the inbox is scanned: a recovered note may be claimed
        // again from Needs_Action only after its run is closed.
        while tasks.join_next().await.is_some() {}
        Ok(())
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Journal) -> Result<T, JournalError> + Send + 'static,
    ) -> Result<T, DaemonError> {
        let j = self.journal.clone();
        Ok(tokio::task::spawn_blocking(move || f(&j))
            .await
            .expect("journal task does not panic")?)
    }
}

/// `n-` + 12 random hex digits (DESIGN §9.2).
fn new_note_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS's randomness once per process, then stepped; mixed
    // with the time and a counter, two ids never repeat within or across processes.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    format!("n-{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// What vaultd writes as `tool_note`: `n-` and 1–64 of `[A-Za-z0-9_-]` (a person may pick one).
fn valid_note_id(id: &str) -> bool {
    id.strip_prefix("n-").is_some_and(|rest| {
        !rest.is_empty()
            && rest.len() <= 64
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

fn by_call_id(calls: Vec<JournalCall>) -> HashMap<String, JournalCall> {
    calls.into_iter().map(|c| (c.call_id.clone(), c)).collect()
}

fn unknown_outcome(call_id: &str, name: &str) -> CallResult {
    CallResult::failed_now(
        call_id,
        name,
        CallError::new(
            ErrorCode::UnknownOutcome,
            "vaultd stopped (or the note was moved) while this call was running and its outcome was not recorded; it is not sent again. Check whether it arrived; write the call again to send it once more",
        ),
    )
}

/// Why a note ends where it ends, for its one log line.
fn outcome_reason(results: &[CallResult], held: &[HeldCall], waiting: bool) -> String {
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| {
            r.outcome.as_ref().err().map(|e| {
                format!(
                    "{} {} {}: {}",
                    r.call_id,
                    r.name,
                    e.code.as_str(),
                    e.message
                )
            })
        })
        .collect();
    if waiting {
        let mut parts: Vec<String> = held
            .iter()
            .map(|h| format!("{} {}: {}", h.call_id, h.name, h.reason))
            .collect();
        if parts.is_empty() {
            parts.push("waiting for a decision on its held calls".to_string());
        }
        return parts.join("; ");
    }
    if failed.is_empty() {
        format!("{} result(s), all ok", results.len())
    } else {
        format!(
            "{} of {} failed: {}",
            failed.len(),
            results.len(),
            failed.join("; ")
        )
    }
}

/// Size and mtime of a file, for de-duplicating problem reports.
fn stamp(path: &Path) -> (u64, SystemTime) {
    std::fs::symlink_metadata(path)
        .map(|m| (m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
        .unwrap_or((0, SystemTime::UNIX_EPOCH))
}

/// How long ago a file was last modified (zero for a clock stepped back); None when gone.
fn modified_age(path: &Path) -> Option<Duration> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    Some(
        meta.modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .unwrap_or_default(),
    )
}

/// DESIGN §9.1: the note's last call block is unfinished — a fence not closed, or a block
/// with `"tool_call"` that does not parse — with nothing but blank space after it.
fn unfinished_tail(text: &str, parsed: &ParsedNote) -> bool {
    let Some(last) = parsed.calls.last() else {
        return false;
    };
    let CallBody::Broken(e) = &last.body else {
        return false;
    };
    let broken = e.code == ErrorCode::InvalidJson
        || (e.code == ErrorCode::InvalidCall && e.message.contains("fence not closed"));
    broken
        && text
            .get(last.span.end..)
            .is_none_or(|rest| rest.trim().is_empty())
}

/// True when the note holds a call without a result (read errors: false; the note task
/// reports them).
fn has_pending_call(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| {
        let note = crate::note::parse_note(&text);
        note.pending_calls().next().is_some()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn note_ids_are_n_and_12_hex_digits_and_do_not_repeat() {
        let ids: HashSet<String> = (0..1000).map(|_| new_note_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            assert!(valid_note_id(id), "{id}");
            assert_eq!(id.len(), 14, "{id}");
        }
        assert!(!valid_note_id("x-1"));
        assert!(!valid_note_id("n-"));
        assert!(!valid_note_id("n-a b"));
    }

    #[test]
    fn only_an_unfinished_last_block_counts_as_unfinished() {
        let call = "```json\n{\"tool_call\": {\"name\": \"a\"}}\n```\n";
        let unfinished = |t: &str| unfinished_tail(t, &parse_note(t));
        assert!(!unfinished(call));
        assert!(unfinished("```json\n{\"tool_call\": {\"name\""));
        assert!(unfinished(&format!(
            "{call}\n```json\n{{\"tool_call\": {{\n```\n\n"
        )));
        assert!(
            !unfinished(&format!("```json\n{{\"tool_call\": {{\n```\n\n{call}")),
            "a broken block before a good one is finished"
        );
        assert!(
            !unfinished("```json\n{\"tool_call\": {\n```\nmore text after it\n"),
            "text after it: the writer went on"
        );
    }
}
