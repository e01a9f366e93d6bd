//! The pipeline. Start-up takes the vault lock, prepares the folders, opens the journal and
//! finishes whatever a previous daemon left in `In_Progress/`; then the watcher and periodic
//! scans feed note tasks. A note task claims its note by rename, runs its pending calls
//! (through the [`Runner`]), writes the results back and moves the note to its new state.
//! Shutdown stops claiming and lets running calls finish within the grace period.

use crate::call::{CallError, CallResult, ErrorCode, HeldCall};
use crate::config::{ApprovalVia, Config};
use crate::journal::{CallProgress, Decision, Journal, JournalError, RunId};
use crate::note::{self, Block, CallBody, ParsedNote, parse_note};
use crate::runner::Runner;
use crate::secret::Redactor;
use crate::tools::{Admission, Registry};
use crate::vault::{State, Vault, VaultError};
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

/// How long a note that changed (without a close or rename event) must stay unchanged before
/// it is read: an editor may still be writing it.
const SETTLE: Duration = Duration::from_millis(150);

/// A start-up backlog this large gets progress reports in the log.
const PROGRESS_FROM: usize = 500;

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
}

/// Holds the vault lock while alive.
pub struct VaultLock {
    _file: std::fs::File,
}

/// Takes the one-daemon-per-vault lock (`flock` on `<vault>/.vaultd.lock`, which holds the
/// PID). A second daemon gets an error naming the PID of the first.
pub fn lock_vault(vault: &Path) -> Result<VaultLock, DaemonError> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let path = vault.join(".vaultd.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|source| DaemonError::Lock {
            path: path.clone(),
            source,
        })?;
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
        return Err(DaemonError::Lock { path, source: err });
    }
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = writeln!(file, "{}", std::process::id());
    let _ = file.sync_all();
    Ok(VaultLock { _file: file })
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
    let t = &config.tools;
    let mut secrets = Vec::new();
    secrets.extend(t.search_web.api_key.iter());
    let mut usernames = Vec::new();
    if let crate::config::EmailTransport::Smtp {
        password, username, ..
    } = &t.send_notification.email.transport
    {
        secrets.extend(password.iter());
        usernames.extend(username.iter().map(String::as_str));
    }
    secrets.extend(t.send_notification.slack.values());
    secrets.extend(t.send_notification.discord.values());
    Redactor::new(secrets, &usernames)
}

/// Runs the daemon on `config` until `shutdown` resolves (Mode::Run) or until everything
/// pending is processed (Mode::Once).
pub async fn run(
    config: Config,
    mode: Mode,
    redactor: Arc<Redactor>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    let vault = Vault::new(config.vault.clone(), config.folders.clone());
    vault.prepare()?;
    let _lock = lock_vault(vault.root())?;
    let journal = Arc::new(Journal::open(&config.state_dir)?);
    let registry = Arc::new(Registry::from_config(
        &config.tools,
        http_client()?,
        Some(journal.clone()),
    )?);
    let runner = Runner::new(registry, journal.clone(), redactor, config.workers);
    let daemon = Arc::new(Daemon {
        note_slots: Semaphore::new(config.workers * 4),
        config,
        vault,
        runner,
        journal,
        inflight: Mutex::new(HashMap::new()),
        stopping: AtomicBool::new(false),
        looked_at: std::sync::atomic::AtomicUsize::new(0),
        reported: Mutex::new(HashSet::new()),
    });
    daemon.supervise(mode, shutdown).await
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
            let folders = self.watched_folders();
            Some(watch::start(&folders, self.config.watch, tx.clone())?)
        } else {
            None
        };

        self.recover(&mut tasks).await?;
        let queued = self.scan_all(&mut tasks);
        tracing::info!(
            vault = %self.vault.root().display(),
            queued,
            "vaultd started"
        );
        if queued >= PROGRESS_FROM {
            // Detached: `once` must not wait for the next progress tick to exit.
            tokio::spawn(self.clone().report_progress(queued));
        }

        if mode == Mode::Once {
            tokio::select! {
                _ = async { while tasks.join_next().await.is_some() {} } => {}
                _ = &mut shutdown => { self.drain(&mut tasks).await; }
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
        tracing::info!("vaultd stopped");
    }

    fn watched_folders(&self) -> Vec<PathBuf> {
        self.watched_states()
            .into_iter()
            .map(|s| self.vault.folder(s))
            .collect()
    }

    /// Queues every note of the watched folders. Returns how many were queued.
    fn scan_all(self: &Arc<Self>, tasks: &mut JoinSet<()>) -> usize {
        let me = self.clone();
        tasks.spawn(async move { me.resume_stranded().await });
        let mut n = 0;
        for folder in self.watched_states() {
            for path in self.vault.scan(folder) {
                self.dispatch(path, tasks);
                n += 1;
            }
        }
        n
    }

    /// With `approval_via = "cli"`, Approved/ is watched only for the notes `vaultd approve`
    /// moves there (a note moved in by hand is left alone, see `claim_and_run`), and
    /// Rejected/ not at all: `vaultd reject` writes the REJECTED results itself.
    fn watched_states(&self) -> Vec<State> {
        let mut v = vec![State::NeedsAction, State::Approved];
        if !self.approval_via_cli() {
            v.push(State::Rejected);
        }
        v
    }

    fn approval_via_cli(&self) -> bool {
        self.config.tools.send_notification.approval_via == ApprovalVia::Cli
    }

    fn on_hint(self: &Arc<Self>, hint: Hint, tasks: &mut JoinSet<()>) {
        match hint {
            Hint::Ready(path) => self.dispatch(path, tasks),
            Hint::Changed(path) => {
                let me = self.clone();
                tasks.spawn(async move {
                    if wait_until_settled(&path).await {
                        me.spawn_note(path).await;
                    }
                });
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
        }
    }

    /// Starts a note task unless one is already looking at this path (then it looks again).
    fn dispatch(self: &Arc<Self>, path: PathBuf, tasks: &mut JoinSet<()>) {
        if !self.mark_inflight(&path) {
            return;
        }
        let me = self.clone();
        tasks.spawn(async move { me.note_task(path).await });
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

    /// Logs how far a long start-up backlog has got, every few seconds, until it is done.
    async fn report_progress(self: Arc<Self>, queued: usize) {
        let start = std::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let done = self.looked_at.load(Ordering::Relaxed).min(queued);
            if done >= queued || self.stopping.load(Ordering::SeqCst) {
                tracing::info!(
                    queued,
                    "start-up backlog done in {:.1} s",
                    start.elapsed().as_secs_f64()
                );
                return;
            }
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&format!(
                "start-up backlog: {done} of {queued} notes"
            ))]);
            tracing::info!(
                "start-up backlog: {done} of {queued} notes ({}%)",
                done * 100 / queued
            );
        }
    }

    /// One look at a note in a watched folder.
    async fn look_at(self: &Arc<Self>, path: &Path) -> Result<(), DaemonError> {
        let Some((state, _)) = self.vault.locate(path) else {
            return Ok(());
        };
        match state {
            State::NeedsAction => self.claim_and_run(path, Pass::Fresh).await,
            State::Approved => self.claim_and_run(path, Pass::Approved).await,
            State::Rejected => self.reject_held(path).await,
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
        let Some(text) = self.read_note(path) else {
            return Ok(());
        };
        let parsed = parse_note(&text);
        if parsed.pending_calls().next().is_none() || self.stopping.load(Ordering::SeqCst) {
            return Ok(()); // waiting for the agent, not for us: left exactly as it is
        }
        if pass == Pass::Approved
            && self.approval_via_cli()
            && !self.cli_approved_any(&parsed).await?
        {
            return Ok(()); // moved into Approved/ by hand: only `vaultd approve` counts
        }
        let claimed = match self.vault.move_to(path, State::InProgress) {
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
        // Marked before the run is recorded, so a rescan never resumes it as stranded.
        self.mark_inflight(&claimed);
        let outcome = self.begin_and_execute(&claimed, pass).await;
        self.inflight
            .lock()
            .expect("inflight lock poisoned")
            .remove(&claimed);
        outcome
    }

    async fn begin_and_execute(
        self: &Arc<Self>,
        claimed: &Path,
        pass: Pass,
    ) -> Result<(), DaemonError> {
        let note = self.vault.relative(claimed);
        let run = self.blocking(move |j| j.begin_run(&note)).await?;
        tracing::debug!(note = %self.vault.relative(claimed), "claimed");
        self.execute(run, claimed, pass, HashMap::new()).await
    }

    /// Runs the pending calls of a claimed note, writes the results, moves the note on.
    async fn execute(
        self: &Arc<Self>,
        run: RunId,
        path: &Path,
        pass: Pass,
        prior: HashMap<String, CallProgress>,
    ) -> Result<(), DaemonError> {
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
                        .finish_run(run, path, State::Failed, Vec::new())
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
            Done(CallResult),
            Run {
                call_id: String,
                name: String,
                parameters: Map<String, Value>,
            },
            Hold(HeldCall),
            StillHeld,
        }
        let mut steps = Vec::new();
        for (i, call) in parsed.pending_calls().enumerate() {
            let call_id = call.call_id.clone();
            let shown_name = call.name.clone().unwrap_or_else(|| "tool_call".to_string());
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
            let effect = registry.get(name).map(|t| t.spec().effect);
            match (prior.get(&call_id), pass) {
                (Some(CallProgress::Finished(result)), _) => {
                    steps.push(Step::Done(result.clone()));
                    continue;
                }
                (Some(_), _) | (None, Pass::Recover { known: false })
                    if effect.is_some_and(|e| !e.safe_to_repeat()) =>
                {
                    steps.push(Step::Done(CallResult::failed_now(
                        &call_id,
                        name,
                        CallError::new(
                            ErrorCode::UnknownOutcome,
                            "vaultd stopped while this call was running and its outcome was not recorded; it is not sent again. Check whether it arrived; write the call again to send it once more",
                        ),
                    )));
                    continue;
                }
                _ => {}
            }
            let tool = match registry.resolve(name, parameters) {
                Ok(t) => t,
                Err(e) => {
                    steps.push(Step::Done(CallResult::failed_now(&call_id, name, e)));
                    continue;
                }
            };
            match tool.admit(parameters) {
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
                handles.push(Some(tokio::spawn(async move {
                    if let Some(previous) = after {
                        // Resolves when the previous change finished (its sender dropped).
                        let _ = previous.await;
                    }
                    let result = me
                        .runner
                        .run_call(run, &note, &call_id, &name, &parameters)
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
                    if !matches!(prior.get(&r.call_id), Some(CallProgress::Finished(_))) {
                        unrecorded.push(r.clone());
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
            .any(|r| !r.ok && prior.contains_key(&r.call_id));
        let next = if waiting {
            State::PendingApproval
        } else if failed_before_crash || results.iter().any(|r| !r.is_ok()) {
            State::Failed
        } else {
            State::Done
        };
        match self.write_back(path, results, held, next).await? {
            WriteBack::Written(ids) => {
                if let Err(e) = self.finish_run(run, path, next, ids).await {
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
    async fn write_back(
        &self,
        path: &Path,
        results: Vec<CallResult>,
        held: Vec<HeldCall>,
        next: State,
    ) -> Result<WriteBack, DaemonError> {
        let path_buf = path.to_path_buf();
        let ids: Vec<String> = results.iter().map(|r| r.call_id.clone()).collect();
        let now = SystemTime::now();
        let written = tokio::task::spawn_blocking(move || {
            note::update_note(&path_buf, |current| {
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
                note::append_blocks(current, &blocks, next.as_str(), now)
            })
        })
        .await
        .expect("write task does not panic");
        match written {
            // Recorded with the move that follows (`finish_run`), in one journal commit.
            Ok(_) => Ok(WriteBack::Written(ids)),
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
    ) -> Result<PathBuf, DaemonError> {
        let here = self.vault.locate(path).map(|(s, _)| s);
        let dest = if here == Some(next) || !path.exists() {
            path.to_path_buf()
        } else {
            self.vault.move_to(path, next)?
        };
        let rel = self.vault.relative(&dest);
        tracing::info!(note = %rel, state = next.as_str(), "note processed");
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
            .write_back(path, rejected, Vec::new(), State::Rejected)
            .await?
        {
            self.finish_run(run, path, State::Rejected, ids).await?;
        } else {
            let reason = "results not written into the rejected note";
            self.blocking(move |j| j.abandon_run(run, reason)).await?;
        }
        Ok(())
    }

    /// Finishes open runs whose note sits in In_Progress with no task on it: their results
    /// could not be written or the note not moved (it kept changing, a folder was read-only).
    async fn resume_stranded(self: Arc<Self>) {
        if self.stopping.load(Ordering::SeqCst) {
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
            let r = match current {
                Ok(Some(now)) if now.run_id == r.run_id => now,
                _ => {
                    self.inflight
                        .lock()
                        .expect("inflight lock poisoned")
                        .remove(&path);
                    continue;
                }
            };
            let prior = r
                .calls
                .into_iter()
                .map(|c| (c.call_id, c.progress))
                .collect();
            tracing::info!(note = %r.note, "retrying a run whose note was not finished");
            if let Err(e) = self
                .execute(r.run_id, &path, Pass::Recover { known: true }, prior)
                .await
            {
                tracing::error!(note = %r.note, "{e}");
            }
            self.inflight
                .lock()
                .expect("inflight lock poisoned")
                .remove(&path);
        }
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
                let outcome = match known {
                    Some(r) => {
                        let prior = r
                            .calls
                            .into_iter()
                            .map(|c| (c.call_id, c.progress))
                            .collect();
                        tracing::info!(note = %rel, "recovering an interrupted run");
                        me.execute(r.run_id, &path, Pass::Recover { known: true }, prior)
                            .await
                    }
                    None => {
                        tracing::warn!(note = %rel, "note in In_Progress unknown to the journal: treating it as interrupted");
                        let note = rel.clone();
                        match me.blocking(move |j| j.begin_run(&note)).await {
                            Ok(run) => {
                                me.execute(run, &path, Pass::Recover { known: false }, HashMap::new())
                                    .await
                            }
                            Err(e) => Err(e),
                        }
                    }
                };
                if let Err(e) = outcome {
                    tracing::error!(note = %rel, "recovery failed: {e}");
                }
                me.inflight.lock().expect("inflight lock poisoned").remove(&path);
            });
        }
        // Runs whose note is no longer in In_Progress were moved before the journal heard of it.
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

/// Size and mtime of a file, for de-duplicating problem reports.
fn stamp(path: &Path) -> (u64, SystemTime) {
    std::fs::symlink_metadata(path)
        .map(|m| (m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
        .unwrap_or((0, SystemTime::UNIX_EPOCH))
}

/// Waits until a file has stopped changing (same size and mtime over one settle period).
/// False when it disappeared.
async fn wait_until_settled(path: &Path) -> bool {
    let stamp = |p: &Path| {
        std::fs::symlink_metadata(p)
            .ok()
            .map(|m| (m.len(), m.modified().ok()))
    };
    let mut last = stamp(path);
    for _ in 0..200 {
        tokio::time::sleep(SETTLE).await;
        let now = stamp(path);
        if now.is_none() {
            return false;
        }
        if now == last {
            return true;
        }
        last = now;
    }
    true
}
