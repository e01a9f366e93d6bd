//! The daemon: [`run_vault`] takes the vault lock, opens the journal, makes the start-up
//! check and starts the tool sources; [`run`] takes those [`Services`] and supervises:
//! recovery of what a previous daemon left in In_Progress ([`recover`]), then scans and
//! watcher hints become queued notes ([`intake`]), each note task is spawned with its note
//! slot, claims its note ([`claim`]) and hands it to the [`pipeline`](crate::pipeline).
//! Shutdown stops claiming and lets running calls finish within the grace period (drain).

use crate::config::{ApprovalVia, Config};
use crate::guard::breaker::Breakers;
use crate::guard::hold_alert::HoldAlerts;
use crate::journal::{Claim, Journal, JournalCall, JournalError};
use crate::results::ResultStore;
use crate::runner::Runner;
use crate::secret::Redactor;
use crate::synced::{RunnerId, RunnerWatch};
use crate::tools::Registry;
use crate::tools::mcp::McpSource;
use crate::vault::{State, Vault, VaultError};
use crate::watch::{self, Hint};
use std::collections::VecDeque;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

pub(crate) mod claim;
mod execute;
mod folders;
pub(crate) mod intake;
mod lock;
mod preview;
pub(crate) mod recover;
pub(crate) mod reload;
pub(crate) mod storage;
pub(crate) mod write_back;

pub use lock::{VaultLock, lock_vault, running_daemon};
pub use reload::BuildTools;

/// Folders only vaultd moves notes into: another runner's claims and finished notes show up
/// here by sync (docs/design.md §9.9).
pub(crate) const RUNNER_STATES: [State; 4] = [
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
    /// Another runner's recent notes are in the vault (docs/design.md §9.9).
    #[error("{0}")]
    SecondRunner(String),
    #[error("cannot read or create this daemon's runner id in {dir}: {source}")]
    RunnerId {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// An fsync of the journal failed: what it wrote since may not be on disk, and only a
    /// new process reads back what is (docs/reliability.md). `run` stops once its running
    /// notes are done, so that a service manager starts it again.
    #[error(
        "stopped: the journal {path} cannot be made durable ({why}); start vaultd again (under systemd, Restart=on-failure does): its start-up recovery reads what the disk holds"
    )]
    StorageLost { path: PathBuf, why: String },
}

/// Called once `run` stops by itself after a failed fsync of the journal, as a signal's
/// shutdown future is: the command arms its backstop for a stop that hangs (a dying disk
/// can hold the last folder fsyncs) there.
static ON_STORAGE_STOP: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>> =
    std::sync::OnceLock::new();

/// Sets what [`ON_STORAGE_STOP`] calls (the first setting stays).
pub fn on_storage_stop(f: impl Fn() + Send + Sync + 'static) {
    let _ = ON_STORAGE_STOP.set(Box::new(f));
}

/// `run` watches until shut down; `once` processes everything pending and returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Run,
    Once,
}

pub(crate) use crate::pipeline::Pass;

/// Who a claimed note is and what the journal knows of its calls (docs/design.md §9.2, §9.3, §9.6).
#[derive(Debug, Clone, Default)]
pub(crate) struct Identity {
    /// The note's `tool_note`.
    pub(crate) note_id: String,
    /// The newest record of each call of this note (or, for a stale copy, of the note it
    /// copies), by call id.
    pub(crate) prior: HashMap<String, JournalCall>,
    /// Calls recorded by the run being continued (recovery): results of theirs already in the
    /// note count for Done or Failed.
    pub(crate) this_run: HashSet<String>,
    /// A note without `tool_note` found at a path a note was recently claimed from.
    pub(crate) stale: Option<StaleCopy>,
    /// A copy whose calls are still pending, not started, in the note it copies (this note
    /// id): it waits until they have run there, then gets their outcomes (docs/design.md
    /// §9.10). Run now, the copy and that note would both send.
    pub(crate) wait_for: Option<String>,
}

/// One claimed note's run, carried through the stages (claim, execute, write back) as one
/// value beside the shared [`Daemon`], instead of its parts threaded by hand (mini-redis keeps
/// the per-connection `Handler` apart from the shared `Listener`).
pub(crate) struct NoteRun {
    /// The journal's run of this claim: every start, outcome and move is recorded under it.
    pub(crate) run: crate::journal::RunId,
    /// Where the note is now: its name in In_Progress/.
    pub(crate) path: PathBuf,
    /// Why it runs now (a new claim, an approval, recovery): planning differs by it.
    pub(crate) pass: Pass,
    /// Who the note is and what the journal knew of its calls at the claim.
    pub(crate) ident: Identity,
    /// The config and tools this run keeps to its end, whatever a reload does meanwhile.
    pub(crate) live: Arc<reload::Live>,
    /// The note's text as claimed is in the journal with the claim record, committed, and
    /// durable once a durable write after it is (a note likely to be stamped before its side
    /// effects run, "The stamp" in `journal/mod.rs`).
    pub(crate) text_kept: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct StaleCopy {
    /// The claim it is a copy of.
    pub(crate) of: Claim,
    /// Within `stale_copy_grace`: it is that note; later: its started side effects are held.
    pub(crate) within_grace: bool,
}

/// Everything a note task needs, shared.
pub struct Daemon {
    /// The config and the runner with its tools; replaced as one by a reload, and taken once
    /// per note run ([`Daemon::live`]), so a run keeps the config it started with.
    pub(crate) live: std::sync::RwLock<Arc<reload::Live>>,
    /// How a reload builds the tools of a new config; `None`: the config is not reloaded.
    pub(crate) build_tools: Option<BuildTools>,
    /// Where results too big for a note go (§10.6), also used to keep a note under
    /// `max_note_bytes` (§9.8).
    pub(crate) results: ResultStore,
    pub(crate) vault: Vault,
    pub(crate) journal: Arc<Journal>,
    /// Notes being looked at now; `true` = another hint came meanwhile, look again after.
    pub(crate) inflight: Mutex<HashMap<PathBuf, bool>>,
    /// Bounds how many notes are held in memory and processed at once (`workers * 4`).
    pub(crate) note_slots: intake::NoteSlots,
    /// Notes waiting for a note slot, in the order they were found: a note task is spawned
    /// only with its slot in hand (STYLE habit 3), so a backlog of 10,000 notes is 10,000
    /// paths here, not 10,000 tasks.
    pub(crate) queue: Mutex<VecDeque<PathBuf>>,
    /// Woken when a note is queued.
    pub(crate) queued: tokio::sync::Notify,
    /// Set on shutdown: no new claims.
    pub(crate) stopping: AtomicBool,
    /// Note looks finished since start, for start-up progress reports.
    pub(crate) looked_at: std::sync::atomic::AtomicUsize,
    /// Woken by `once` when no note is left: the progress report draws its last line then,
    /// not at its next tick (up to 100 ms of the run's time spent waiting for it).
    pub(crate) backlog_over: tokio::sync::Notify,
    /// Problems already reported, so a periodic scan does not repeat them.
    pub(crate) reported: Mutex<HashSet<(PathBuf, u64, SystemTime)>>,
    /// Notes left where they are whose reason was logged (nothing pending, an unfinished
    /// last block): once per version of the note, not at every look.
    pub(crate) explained: Mutex<HashSet<(PathBuf, u64, SystemTime)>>,
    /// Note ids with a run in this daemon now; woken when it ends. A note that comes back
    /// (moved back by hand, or an editor's stale copy) waits for its running calls (§9.3).
    pub(crate) active: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
    /// Notes being waited on until their writer is done (§9.1): one wait per path.
    pub(crate) settling: Mutex<HashSet<PathBuf>>,
    /// Copies waiting for the note they copy to run the calls they share (§9.10), by that
    /// note's id: looked at again when its run here ends (and at every rescan).
    pub(crate) waiting_copies: Mutex<HashMap<String, HashSet<PathBuf>>>,
    /// `once` judges an unfinished last block at once: it is run when the writer is done.
    pub(crate) mode: Mode,
    /// `[notify] on_hold`: one message per held note (docs/design.md §12.4).
    pub(crate) hold_alerts: HoldAlerts,
    /// This daemon's `tool_runner`, and whether a second runner paused claiming (§9.9).
    pub(crate) runners: RunnerWatch,
    /// Notes renamed in: claimed by hard link, first name dropped after `moved_in_grace`.
    pub(crate) arrivals: crate::arrivals::Arrivals,
    /// Set while a state folder is a symlink: nothing is claimed (§9.13).
    pub(crate) folder_pause: folders::FolderPause,
}

/// The shared HTTP client: one connection pool for every tool.
pub fn http_client() -> Result<reqwest::Client, DaemonError> {
    crate::tools::http::client().map_err(|e| DaemonError::Http(e.without_url().to_string()))
}

/// The redactor for every secret in the config.
pub fn redactor_for(config: &Config) -> Redactor {
    config.redactor()
}

/// What the daemon runs with, passed in (STYLE habit 2): [`run_vault`] builds it from the
/// config; a test builds its own, with a temp vault and a tool source of its own.
pub struct Services {
    /// Folders, limits, timeouts, approval mode: the settings every stage reads.
    pub config: Config,
    /// `run` watches until shut down; `once` processes what is pending and returns.
    pub mode: Mode,
    /// The prepared vault (its folders exist and are not symlinks).
    pub vault: Vault,
    pub journal: Arc<Journal>,
    /// Every tool of every source, with its policy.
    pub registry: Registry,
    /// The one redactor for every secret of every source.
    pub redactor: Arc<Redactor>,
}

/// Runs the daemon on `config` until `shutdown` resolves (Mode::Run) or until everything
/// pending is processed (Mode::Once): takes the vault lock, opens the journal, makes the
/// start-up check of §9.9 (with `take_over`, `--take-over`: another runner's notes up to now
/// are history), starts the MCP servers, then [`run`]s; no server outlives it. `ready` hears
/// when the servers have started and their tools are registered.
pub async fn run_vault(
    config: Config,
    mode: Mode,
    take_over: bool,
    new_journal: bool,
    redactor: Arc<Redactor>,
    ready: Option<tokio::sync::oneshot::Sender<()>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    storage::ignore_file_size_signal();
    let vault = Vault::new(config.vault.clone(), config.folders.clone());
    // Before `prepare`, which would create missing folders through a symlink.
    vault.refuse_symlinked_folders()?;
    vault.prepare()?;
    let _lock = lock_vault(vault.root())?;
    let journal = Arc::new(crate::state::open_journal(&config)?);
    let me =
        RunnerId::load_or_create(&config.state_dir).map_err(|source| DaemonError::RunnerId {
            dir: config.state_dir.clone(),
            source,
        })?;
    // One read of each note serves both start-up checks: the journal's continuity (§9.12)
    // and another runner's recent notes (§9.9).
    let oldest = crate::synced::recent_since(config.runner_window, SystemTime::now());
    let scanned = crate::synced::stamped_notes(
        &vault,
        config.max_note_bytes,
        storage::start_up_read(storage::continuity_unknown(&journal)?, oldest),
    );
    storage::journal_continuity(&vault, &journal, &me, new_journal, &scanned)?;
    one_runner(&config, &vault, &journal, &me, take_over, &scanned)?;
    let http = http_client()?;
    // Servers start in parallel; each delays start-up by at most its start_timeout.
    let mcp = McpSource::start(
        &config.mcp,
        journal.clone(),
        http.clone(),
        &config.state_dir,
        result_store(&config),
        redactor.clone(),
    )
    .await;
    let mcp = Arc::new(mcp);
    // A reload builds the tools of the new config the same way, with the servers started here.
    let build_tools: BuildTools = {
        let (mcp, journal) = (mcp.clone(), journal.clone());
        Box::new(move |config: &Config| {
            Registry::from_config(&config.tools, http.clone(), Some(journal.clone()), &mcp)
        })
    };
    let outcome = match build_tools(&config) {
        Ok(registry) => {
            // Its servers started and their tools registered: what `ready` waits for.
            if let Some(ready) = ready {
                let _ = ready.send(());
            }
            let services = Services {
                config,
                mode,
                vault,
                journal,
                registry,
                redactor,
            };
            run_reloading(services, Some(build_tools), shutdown).await
        }
        Err(e) => Err(e.into()),
    };
    // No server outlives vaultd.
    mcp.shutdown().await;
    outcome
}

/// Runs the daemon on `services` until `shutdown` resolves (Mode::Run) or until everything
/// pending is processed (Mode::Once). The vault must be prepared and locked by the caller.
pub async fn run(
    services: Services,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    run_reloading(services, None, shutdown).await
}

/// [`run`], reloading the config on SIGHUP and changes of its file with `build_tools`.
async fn run_reloading(
    services: Services,
    build_tools: Option<BuildTools>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    let Services {
        config,
        mode,
        vault,
        journal,
        registry,
        redactor,
    } = services;
    let me =
        RunnerId::load_or_create(&config.state_dir).map_err(|source| DaemonError::RunnerId {
            dir: config.state_dir.clone(),
            source,
        })?;
    tracing::debug!(runner = %me, "this daemon's tool_runner");
    let runners = RunnerWatch::new(me, config.runner_window, journal.taken_over_at()?);
    let results = result_store(&config);
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
    let arrivals = crate::arrivals::Arrivals::new(config.moved_in_grace);
    let daemon = Arc::new(Daemon {
        build_tools,
        arrivals,
        results,
        hold_alerts,
        note_slots: intake::NoteSlots::new(config.workers * 4),
        queue: Mutex::new(VecDeque::new()),
        queued: tokio::sync::Notify::new(),
        live: std::sync::RwLock::new(Arc::new(reload::Live { config, runner })),
        vault,
        journal,
        inflight: Mutex::new(HashMap::new()),
        stopping: AtomicBool::new(false),
        looked_at: std::sync::atomic::AtomicUsize::new(0),
        backlog_over: tokio::sync::Notify::new(),
        reported: Mutex::new(HashSet::new()),
        explained: Mutex::new(HashSet::new()),
        active: Mutex::new(HashMap::new()),
        settling: Mutex::new(HashSet::new()),
        waiting_copies: Mutex::new(HashMap::new()),
        mode,
        runners,
        folder_pause: Default::default(),
    });
    let outcome = daemon.supervise(mode, shutdown).await;
    // The moves of the last notes, made durable soon (`journal/mod.rs`), are durable now.
    tokio::task::spawn_blocking(crate::files::flush_folders)
        .await
        .expect("folder flush does not panic");
    outcome
}

/// Where results too big for a note go (§10.6).
fn result_store(config: &Config) -> ResultStore {
    ResultStore::new(
        config.vault.clone(),
        config.tool_results.clone(),
        config.max_result_bytes,
    )
}

/// The start-up check of docs/design.md §9.9: with `take_over`, records that other runners' notes up
/// to now are history; then refuses to start while a note of another runner is younger than
/// `runner_window`. `scanned`: the start-up scan's stamped notes, with every note whose mtime
/// is inside the window.
fn one_runner(
    config: &Config,
    vault: &Vault,
    journal: &Journal,
    me: &RunnerId,
    take_over: bool,
    scanned: &[crate::synced::StampedNote],
) -> Result<(), DaemonError> {
    let foreign = |taken_over_at| {
        crate::synced::foreign_among(
            scanned,
            me,
            config.runner_window,
            taken_over_at,
            SystemTime::now(),
        )
    };
    if take_over {
        // §9.14: the other runner's notes as they are now, future-dated ones included, become
        // history whatever its clock says; `--take-over` always works.
        let newest_foreign = foreign(journal.taken_over_at()?)
            .into_iter()
            .map(|f| f.updated)
            .max();
        let at = journal.record_take_over(me.as_str(), newest_foreign)?;
        tracing::warn!(
            runner = %me,
            "--take-over: notes other runners updated up to {} are history; this daemon runs the vault",
            humantime::format_rfc3339_seconds(at)
        );
    }
    let found = foreign(journal.taken_over_at()?);
    if !found.is_empty() {
        return Err(DaemonError::SecondRunner(crate::synced::refusal(
            &found,
            vault,
            config.runner_window,
        )));
    }
    journal.clear_pause()?;
    Ok(())
}

impl Daemon {
    /// Recovers, scans, then feeds note tasks until everything pending is done (`once`) or
    /// until `shutdown` (`run`, watching the folders meanwhile); then drains.
    pub(crate) async fn supervise(
        self: &Arc<Self>,
        mode: Mode,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), DaemonError> {
        let mut tasks: JoinSet<()> = JoinSet::new();
        tokio::pin!(shutdown);
        // Watch before the first scan, so nothing that arrives during the scan is missed.
        let (tx, rx) = mpsc::channel::<Hint>(4096);
        let watcher = match mode {
            Mode::Run => Some(self.start_watcher(tx)?),
            Mode::Once => None,
        };
        // SIGHUP and config file changes are caught from now on, acted on once watching.
        let reloads = match mode {
            Mode::Run => self.catch_reloads(),
            Mode::Once => None,
        };
        self.recover(&mut tasks).await?;
        let progress = self.start_up_scan(&mut tasks);
        if mode == Mode::Once {
            self.until_all_done(&mut tasks, shutdown).await;
            // The report draws its finished bar or line now; bounded, as the count of notes
            // still runs in the background on a long backlog.
            self.backlog_over.notify_one();
            let _ = tokio::time::timeout(Duration::from_millis(500), progress).await;
            if let Some(why) = self.journal.storage_failure() {
                tracing::error!(
                    "the journal {} cannot be written: {why}; the notes not claimed wait where they are",
                    self.journal.path().display()
                );
            }
            return self.storage_lost();
        }
        let reloading = reloads.map(|r| r.start(self));
        self.watch_until(&mut tasks, rx, watcher.as_ref(), shutdown)
            .await;
        drop(reloading);
        // Ask systemd for the grace period plus a margin, so a `shutdown_grace` above the
        // unit's TimeoutStopSec= does not get running calls killed.
        let extend = (self.live().config.shutdown_grace + Duration::from_secs(5)).as_micros();
        let _ = sd_notify::notify(&[
            sd_notify::NotifyState::Stopping,
            sd_notify::NotifyState::ExtendTimeoutUsec(u32::try_from(extend).unwrap_or(u32::MAX)),
            sd_notify::NotifyState::Status("stopping: letting running calls finish"),
        ]);
        drop(watcher);
        self.drain(&mut tasks).await;
        self.storage_lost()
    }

    /// `StorageLost` when an fsync of the journal failed (claiming resumes only in a new
    /// process): `run` stops for it, and `once` ends saying so.
    fn storage_lost(&self) -> Result<(), DaemonError> {
        if !self.journal.storage_failure_until_restart() {
            return Ok(());
        }
        Err(DaemonError::StorageLost {
            path: self.journal.path().to_path_buf(),
            why: self.journal.storage_failure().unwrap_or_default(),
        })
    }

    fn start_watcher(&self, tx: mpsc::Sender<Hint>) -> Result<watch::WatchHandle, DaemonError> {
        let mut folders = self.watched_folders();
        // Where another runner's claims and finished notes show up (§9.9).
        folders.extend(RUNNER_STATES.iter().map(|s| self.vault.folder(*s)));
        let (vault, own) = (self.vault.clone(), self.runners.own());
        let ignore = move |hint: &Hint| intake::needs_no_look(&vault, &own, hint);
        Ok(watch::start(
            &folders,
            self.live().config.watch,
            tx,
            ignore,
        )?)
    }

    /// The first scan; a long backlog gets progress reports until it is done.
    /// The notes are dispatched first and counted beside them (reading every note to count
    /// its pending calls took ~60 ms for 2,000 notes before the first claim).
    fn start_up_scan(self: &Arc<Self>, tasks: &mut JoinSet<()>) -> JoinHandle<()> {
        let seen = self.scan_all(tasks);
        let looked = seen.len();
        let me = self.clone();
        tokio::spawn(async move {
            // A note gone since the scan was claimed by the tasks already running (or moved
            // away): it counts, as it was queued when vaultd started.
            let queued = tokio::task::spawn_blocking(move || {
                seen.iter()
                    .filter(|p| intake::has_pending_call(p).unwrap_or(true))
                    .count()
            })
            .await
            .unwrap_or(0);
            tracing::info!(
                vault = %me.vault.root().display(),
                queued,
                "vaultd started"
            );
            let bar = std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("JOURNAL_STREAM").is_none();
            if (bar && queued >= PROGRESS_BAR_FROM) || queued >= PROGRESS_FROM {
                me.report_progress(looked, bar).await;
            }
        })
    }

    /// `once`: runs queued notes until no task runs and none is queued, or until shutdown.
    async fn until_all_done(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) {
        while !tasks.is_empty() || !self.nothing_queued() {
            tokio::select! {
                (slot, path) = self.next_queued() => self.start_note_task(slot, path, tasks),
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                _ = &mut shutdown => {
                    self.drain(tasks).await;
                    return;
                }
            }
        }
    }

    /// `run`: turns hints, rescans and queued notes into note tasks until shutdown.
    async fn watch_until(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        mut rx: mpsc::Receiver<Hint>,
        watcher: Option<&watch::WatchHandle>,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) {
        let _ = sd_notify::notify(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(&format!("watching {}", self.vault.root().display())),
        ]);
        let watchdog = sd_notify::watchdog_enabled().map(|d| d / 2);
        let mut watchdog_tick =
            tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
        let mut rescan_tick = tokio::time::interval(self.live().config.rescan_interval);
        rescan_tick.tick().await; // the first tick is immediate; the start-up scan just ran
        let mut storage = storage::StorageWatch::new(&self.live().config.state_dir);
        let mut storage_tick = tokio::time::interval(storage::STORAGE_CHECK);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                Some(hint) = rx.recv() => self.on_hint(hint, tasks),
                (slot, path) = self.next_queued() => self.start_note_task(slot, path, tasks),
                _ = rescan_tick.tick() => { self.scan_all(tasks); }
                _ = storage_tick.tick() => {
                    storage.check(self, tasks);
                    // Paused until a restart: stop (after the notes running now), so that
                    // a service manager restarts vaultd.
                    if self.journal.storage_failure_until_restart() {
                        tracing::error!(
                            "stopping: an fsync of the journal failed; the running notes finish first"
                        );
                        if let Some(backstop) = ON_STORAGE_STOP.get() {
                            backstop();
                        }
                        break;
                    }
                }
                _ = watchdog_tick.tick(), if watchdog.is_some() => {
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(e) = done && e.is_panic() {
                        tracing::error!("a note task panicked: {e}");
                    }
                }
            }
            if let Some(w) = watcher
                && w.overflowed.swap(false, Ordering::SeqCst)
            {
                tracing::warn!("too many file events at once; scanning all folders");
                self.scan_all(tasks);
            }
        }
    }

    /// Stops claiming and waits for running notes up to the grace period; what is still
    /// running then is left to start-up recovery (the journal knows which calls started).
    pub(crate) async fn drain(&self, tasks: &mut JoinSet<()>) {
        self.stopping.store(true, Ordering::SeqCst);
        let grace = self.live().config.shutdown_grace;
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

    pub(crate) fn approval_via_cli(&self) -> bool {
        self.live().config.approval_via == ApprovalVia::Cli
    }

    /// A journal read, run right here on the async worker instead of in the blocking pool.
    /// Reads are indexed lookups on their own connection that take microseconds and, in WAL
    /// mode, never wait for the writer: the hop to a pool thread and back (two context
    /// switches) cost more than the read (a CPU profile under load, BENCHMARKS.md). Writes, which
    /// wait for a commit, go through [`blocking`](Self::blocking).
    pub(crate) fn read_journal<T>(
        &self,
        f: impl FnOnce(&Journal) -> Result<T, JournalError>,
    ) -> Result<T, DaemonError> {
        Ok(f(&self.journal)?)
    }

    /// Runs blocking file work on a note's path (its claim, its results write) off the async
    /// workers' duties, so a hung network or FUSE mount stops none of them. A note worked on
    /// alone runs it on this very thread (`block_in_place`: the worker's other tasks, its LIFO
    /// slot and the duty of driving timers and I/O go to another thread first), without the
    /// hop to a pool thread and back: on an idle machine each hop wakes a sleeping thread.
    /// Not simply here, on the worker, without the hand-over: 0.1 ms faster a note, but the
    /// other worker may then sleep on its condition variable, not on the I/O driver, and no
    /// thread drives timers or I/O until the work ends (BENCHMARKS.md, twenty-sixth pass; the
    /// tests below caught it). With other notes in flight the pool's threads are awake and a
    /// hop is cheap, while handing the worker over for every note costs throughput: there,
    /// and on a current-thread runtime (some tests), which cannot hand its tasks over, the
    /// pool.
    pub(crate) async fn on_this_thread<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        file_work(self.note_slots.one_note(), f).await
    }

    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Journal) -> Result<T, JournalError> + Send + 'static,
    ) -> Result<T, DaemonError> {
        let j = self.journal.clone();
        Ok(tokio::task::spawn_blocking(move || f(&j))
            .await
            .expect("journal task does not panic")?)
    }
}

/// [`Daemon::on_this_thread`]'s choice, for a note that is `alone` or not.
async fn file_work<T: Send + 'static>(alone: bool, f: impl FnOnce() -> T + Send + 'static) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    let runtime = Handle::current();
    if !alone || runtime.runtime_flavor() != RuntimeFlavor::MultiThread {
        return tokio::task::spawn_blocking(f)
            .await
            .expect("blocking file work does not panic");
    }
    tokio::task::block_in_place(f)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// Whether the runtime still runs its other tasks (a timer's, here) while a lone note's
    /// file work is stuck, as on a hung file system, for up to 10 s.
    fn others_run_while_stuck(workers: usize) -> bool {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            tokio::spawn(async {
                let (tx, rx) = std::sync::mpsc::channel();
                // Fires only if some thread drives the timers and runs this task meanwhile.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let _ = tx.send(());
                });
                super::file_work(true, move || {
                    rx.recv_timeout(Duration::from_secs(10)).is_ok()
                })
                .await
            })
            .await
            .unwrap()
        })
    }

    /// With two workers, timers and tasks go on while a lone note's file work is stuck. Run
    /// on the worker without handing it over, this failed in CI (not on every run: only when
    /// the other worker sleeps on its condition variable rather than on the I/O driver).
    #[test]
    fn a_lone_notes_stuck_file_work_leaves_the_runtime_serving() {
        for _ in 0..20 {
            assert!(others_run_while_stuck(2));
        }
    }

    /// With a single worker (a one-CPU machine), the work hands the worker over: done on the
    /// worker itself, it would stop the whole daemon.
    #[test]
    fn with_one_worker_a_lone_notes_stuck_file_work_stops_nothing() {
        assert!(others_run_while_stuck(1));
    }
}
