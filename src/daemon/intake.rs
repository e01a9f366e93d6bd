//! Intake and settle: scans and watcher hints become note tasks (bounded by the note slots);
//! a note written in place is looked at once its writer is done (docs/design.md §9.1); a note that
//! cannot be read is reported once and left alone.

use super::Daemon;
use crate::call::ErrorCode;
use crate::daemon::{DaemonError, Mode, Pass, RUNNER_STATES};
use crate::note::{self, CallBody, ParsedNote};
use crate::synced::{ForeignNote, OwnWrites};
use crate::vault::{State, Vault};
use crate::watch::Hint;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// A hint that `on_hint` drops without a look: an event of this daemon's own claim, write or
/// move where only vaultd puts notes (§9.9; noted before the rename, so its event finds it
/// noted), or a change of a file that is not a note (a temp file, a hidden name). The
/// watcher's thread drops these before they wake the daemon: a note's own claim, results
/// write and move made a dozen of them.
pub(crate) fn needs_no_look(vault: &Vault, own: &OwnWrites, hint: &Hint) -> bool {
    let (Hint::Ready(path) | Hint::Closed(path) | Hint::Changed(path)) = hint else {
        return false;
    };
    match vault.locate(path) {
        Some((state, _)) => RUNNER_STATES.contains(&state) && own.just_wrote(path),
        None => !matches!(hint, Hint::Ready(_)),
    }
}

impl Daemon {
    /// Queues every note of the watched folders. Returns how many notes were looked at and
    /// how many of them hold a pending call (the "queued" of the start-up line: a note
    /// without calls waits for its agent, not for vaultd).
    /// Dispatches every note of the watched folders; returns their paths.
    pub(crate) fn scan_all(self: &Arc<Self>, tasks: &mut JoinSet<()>) -> Vec<PathBuf> {
        let me = self.clone();
        tasks.spawn(async move { me.resume_stranded().await });
        let mut seen = Vec::new();
        for folder in self.watched_states() {
            for path in self.vault.scan(folder) {
                self.dispatch(path.clone());
                seen.push(path);
            }
        }
        seen
    }

    pub(crate) fn watched_folders(&self) -> Vec<PathBuf> {
        self.watched_states()
            .into_iter()
            .map(|s| self.vault.folder(s))
            .collect()
    }

    /// With `approval_via = "cli"`, Approved/ is watched only for the notes `vaultd approve`
    /// moves there (a note moved in by hand is left alone, see `claim_and_run`), and
    /// Rejected/ not at all: `vaultd reject` writes the REJECTED results itself.
    pub(crate) fn watched_states(&self) -> Vec<State> {
        let mut v = vec![State::NeedsAction, State::Approved, State::DryRun];
        if !self.approval_via_cli() {
            v.push(State::Rejected);
        }
        v
    }

    pub(crate) fn on_hint(self: &Arc<Self>, hint: Hint, tasks: &mut JoinSet<()>) {
        if needs_no_look(&self.vault, &self.runners.own(), &hint) {
            return;
        }
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
                // Files created with the folder before its watch was in place have no events
                // of their own (notify #727); the hint comes once the watch is there
                // (`watch::watch_new_folders`), so a scan now finds them.
                for s in self.watched_states() {
                    if dir.starts_with(self.vault.folder(s)) {
                        let base = self.vault.folder(s);
                        for path in self.vault.scan(s) {
                            if path.starts_with(&dir) && path.starts_with(&base) {
                                self.dispatch(path);
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
                self.dispatch_now(path, tasks);
            }
        }
    }

    /// A note appeared or changed where only vaultd puts notes (§9.9): unless this daemon just
    /// put it there, its head is read; another runner's recent activity pauses claiming.
    pub(crate) fn look_for_second_runner(self: &Arc<Self>, path: PathBuf, tasks: &mut JoinSet<()>) {
        if self.runners.is_paused() || self.runners.just_wrote(&path) {
            return;
        }
        let me = self.clone();
        tasks.spawn(async move { me.read_for_second_runner(path).await });
    }

    /// Reads the note at `path` off the async workers; another runner's recent activity there
    /// pauses claiming.
    async fn read_for_second_runner(&self, path: PathBuf) {
        let check = self.runners.checker();
        let found = tokio::task::spawn_blocking(move || check.check(&path))
            .await
            .ok()
            .flatten();
        if let Some(found) = found {
            self.pause_for(found).await;
        }
    }

    /// A path noted as this daemon's own before a rename that then failed or put the note
    /// under another name: noted no longer, and its note read now, as its event (dropped
    /// while it was noted) would have had it read: another runner may have put it there
    /// (§9.9; a sync client brings that runner's claim of the same note, say).
    pub(crate) async fn look_again(&self, path: PathBuf) {
        self.runners.own().forget(&path);
        if !self.runners.is_paused() {
            self.read_for_second_runner(path).await;
        }
    }

    /// Stops claiming because another runner works on this vault: running calls finish,
    /// nothing new is claimed; logged once, recorded for `vaultd status`, alerted (§12.4).
    pub(crate) async fn pause_for(&self, found: ForeignNote) {
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
                &self.live().runner.registry,
                &note,
                &format!(
                    "vaultd on {} paused: a second runner on {host} (vaultd {other}) works on a synced copy of this vault ({note}). Nothing new is claimed here. To resume, {how}.",
                    self.runners.me.host()
                ),
            )
            .await;
    }

    /// Queues a note task unless one is already looking at this path (then it looks again).
    pub(crate) fn dispatch(&self, path: PathBuf) {
        if !self.mark_inflight(&path) {
            return;
        }
        tracing::debug!(note = %self.vault.relative(&path), "queued");
        self.queue
            .lock()
            .expect("queue lock poisoned")
            .push_back(path);
        self.queued.notify_one();
    }

    /// [`dispatch`](Self::dispatch) from the intake loop itself: with nothing queued and a
    /// note slot free, the note's task is spawned here and now, without the trip through the
    /// queue and the loop's next turn (`next_queued`), which a lone note's time to Done paid.
    pub(crate) fn dispatch_now(self: &Arc<Self>, path: PathBuf, tasks: &mut JoinSet<()>) {
        let free = self
            .nothing_queued()
            .then(|| self.note_slots.try_take())
            .flatten();
        let Some(slot) = free else {
            return self.dispatch(path);
        };
        if self.mark_inflight(&path) {
            tracing::debug!(note = %self.vault.relative(&path), "started at once");
            self.start_note_task(slot, path, tasks);
        }
    }

    pub(crate) fn nothing_queued(&self) -> bool {
        self.queue.lock().expect("queue lock poisoned").is_empty()
    }

    /// The next queued note, with a note slot for it. Cancel-safe: dropped before it returns,
    /// it gives the slot back and takes no note off the queue.
    pub(crate) async fn next_queued(&self) -> (OwnedSemaphorePermit, PathBuf) {
        let slot = self.note_slot().await;
        let _ahead = self.note_slots.ahead();
        loop {
            if let Some(path) = self.queue.lock().expect("queue lock poisoned").pop_front() {
                return (slot, path);
            }
            self.queued.notified().await;
        }
    }

    /// One of the `workers * 4` note slots: how many notes are held and worked on at once.
    pub(crate) async fn note_slot(&self) -> OwnedSemaphorePermit {
        self.note_slots.take().await
    }

    /// Spawns a note task with its slot, which moves into the task.
    pub(crate) fn start_note_task(
        self: &Arc<Self>,
        slot: OwnedSemaphorePermit,
        path: PathBuf,
        tasks: &mut JoinSet<()>,
    ) {
        let me = self.clone();
        tasks.spawn(async move { me.note_task(path, slot).await });
    }

    /// docs/design.md §9.1: a note written in place is looked at once no process has it open for
    /// writing and it stayed unchanged for `settle`. A note that keeps changing is waited for
    /// (logged once), never failed or claimed meanwhile. One wait per path.
    pub(crate) async fn settle_then_look(self: Arc<Self>, path: PathBuf) {
        if !self
            .settling
            .lock()
            .expect("settling lock poisoned")
            .insert(path.clone())
        {
            tracing::debug!(note = %self.vault.relative(&path), "already waiting for its writer");
            return;
        }
        tracing::debug!(note = %self.vault.relative(&path), "waiting for its writer");
        let settle = self.live().config.settle;
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
            if self.mode == Mode::Once && began.elapsed() >= self.live().config.settle_max {
                // `once` does not wait for an editor that keeps the note open all day.
                tracing::warn!(
                    note = %self.vault.relative(&path),
                    "note still open for writing after settle_max; left where it is for the next run"
                );
                break false;
            }
            if !logged && began.elapsed() >= self.live().config.settle_max {
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
        tracing::debug!(
            note = %self.vault.relative(&path),
            settled,
            "done waiting for its writer"
        );
        if settled {
            self.dispatch(path);
        }
    }

    /// Whether `path` must wait before it is judged (docs/design.md §9.1): a writer had it open when
    /// it was read (`writer_busy`), or its last call block is unfinished and its last change
    /// younger than `settle_max`. Then a wait is started (a settle, or a look again when
    /// `settle_max` has passed).
    pub(crate) async fn still_being_written(
        self: &Arc<Self>,
        path: &Path,
        text: &str,
        parsed: &ParsedNote,
        writer_busy: bool,
    ) -> bool {
        if writer_busy {
            let settle = self.clone().settle_then_look(path.to_path_buf());
            if self.mode == Mode::Once {
                // `once` ends when no note task runs and none is queued: this task waits for
                // the writer itself, and the settled note is queued before it ends.
                settle.await;
            } else {
                tokio::spawn(settle);
            }
            return true;
        }
        if self.mode == Mode::Once {
            return false;
        }
        let Some(unfinished) = unfinished_tail(text, parsed) else {
            return false;
        };
        // §9.1: a note that arrived by rename is complete: its broken last block is a typo,
        // judged at once, not a writer still at work.
        if self.arrivals.arrived_whole(path) {
            return false;
        }
        let Some(age) = modified_age(path) else {
            return true; // gone
        };
        let max = self.live().config.settle_max;
        if age >= max {
            return false;
        }
        let until = SystemTime::now() + (max - age);
        self.explain_once(
            path,
            &format!(
                "not judged before {} (settle_max = {} after its last change): its last call \
                 block is unfinished ({unfinished}) and the note was written in place, so its \
                 writer may still be at it. A note moved in by rename is judged at once",
                humantime::format_rfc3339_seconds(until),
                humantime::format_duration(max),
            ),
        );
        let me = self.clone();
        let p = path.to_path_buf();
        tokio::spawn(async move {
            tokio::time::sleep(max - age + Duration::from_millis(50)).await;
            me.dispatch(p);
        });
        true
    }

    /// Logs why the note at `path` is left where it is for now, once per version of it (size
    /// and mtime): a rescan or another look at the same note does not repeat it.
    pub(crate) fn explain_once(&self, path: &Path, why: &str) {
        let (len, mtime) = size_and_mtime(path);
        if !self
            .explained
            .lock()
            .expect("explained lock poisoned")
            .insert((path.to_path_buf(), len, mtime))
        {
            return;
        }
        tracing::info!(note = %self.vault.relative(path), "{why}");
    }

    /// True when the caller should start a task for `path`.
    pub(crate) fn mark_inflight(&self, path: &Path) -> bool {
        if self.vault.locate(path).is_none() {
            return false;
        }
        let mut inflight = self.inflight.lock().expect("inflight lock poisoned");
        if let Some(again) = inflight.get_mut(path) {
            *again = true;
            tracing::debug!(
                note = %self.vault.relative(path),
                "already queued or being looked at: looked at again after that look"
            );
            return false;
        }
        inflight.insert(path.to_path_buf(), false);
        true
    }

    pub(crate) async fn note_task(self: Arc<Self>, path: PathBuf, _slot: OwnedSemaphorePermit) {
        let _unwinding = ForgetOnPanic::new(&self.inflight, &path);
        loop {
            if !self.stopping.load(Ordering::SeqCst)
                && let Err(e) = self.look_at(&path).await
            {
                tracing::error!(note = %self.vault.relative(&path), "{e}");
            }
            tracing::debug!(note = %self.vault.relative(&path), "looked at");
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
    pub(crate) async fn report_progress(self: Arc<Self>, queued: usize, bar: bool) {
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
            // Over: `once` has run every note (one that left its folder meanwhile was not
            // looked at, so the count may stay short of `queued`).
            let over = tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(100)) => false,
                () = self.backlog_over.notified() => true,
            };
            let done = self.looked_at.load(Ordering::Relaxed).min(queued);
            if let Some(b) = &bar {
                b.set_position(done as u64);
            }
            if over || done >= queued || self.stopping.load(Ordering::SeqCst) {
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
    pub(crate) async fn look_at(self: &Arc<Self>, path: &Path) -> Result<(), DaemonError> {
        let Some((state, _)) = self.vault.locate(path) else {
            return Ok(());
        };
        if self.runners.is_paused() {
            return Ok(()); // a second runner: nothing new is claimed (§9.9)
        }
        if !self.folders_safe() {
            return Ok(()); // a state folder is a symlink: nothing is claimed (§9.13)
        }
        if self.storage_paused() {
            return Ok(()); // the journal cannot be written: the note waits (§9.12)
        }
        let looked = match state {
            State::NeedsAction => self.claim_and_run(path, Pass::Fresh).await,
            State::Approved => self.claim_and_run(path, Pass::Approved).await,
            State::Rejected => self.reject_held(path).await,
            State::DryRun => self.preview_note(path).await,
            _ => Ok(()),
        };
        match looked {
            Err(e) if self.pause_if_symlinked_error(&e) => Ok(()),
            other => other,
        }
    }

    /// Reads a note for processing; `None` (with the problem recorded once) when it is not a
    /// regular file, too big, unreadable or not UTF-8. Such notes are left exactly as they are.
    pub(crate) fn read_note(&self, path: &Path) -> Option<String> {
        self.read_note_noting_writer(path).map(|(text, _)| text)
    }

    /// [`read_note`](Self::read_note), and whether another process may still be writing the
    /// note (`note::write::writer_busy`), both from one open of it.
    pub(crate) fn read_note_noting_writer(&self, path: &Path) -> Option<(String, bool)> {
        use std::os::unix::fs::OpenOptionsExt;
        // Neither through a symlink nor waiting for a FIFO's writer: only a regular file is read.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path);
        let mut file = match opened {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return None, // a symlink
            Err(e) => {
                let meta = std::fs::symlink_metadata(path).ok()?;
                let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                if meta.file_type().is_file() && !self.acceptable(path, &meta, mtime) {
                    return None;
                }
                let message = format!("note cannot be read: {e}; left untouched");
                self.problem(path, meta.len(), mtime, message);
                return None;
            }
        };
        let meta = file.metadata().ok()?;
        if !meta.file_type().is_file() {
            return None;
        }
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if !self.acceptable(path, &meta, mtime) {
            return None;
        }
        match note::write::read_noting_writer(&mut file) {
            Ok((bytes, busy)) => match String::from_utf8(bytes) {
                Ok(s) => Some((s, busy)),
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

    /// False (the problem recorded once) for a note vaultd must not touch: read-only, or over
    /// `max_note_bytes`.
    fn acceptable(&self, path: &Path, meta: &std::fs::Metadata, mtime: SystemTime) -> bool {
        if meta.permissions().readonly() {
            // Nobody may write it: a person made it read-only on purpose (root included).
            self.problem(
                path,
                meta.len(),
                mtime,
                "note is read-only (no write permission); left untouched".to_string(),
            );
            return false;
        }
        if meta.len() > self.live().config.max_note_bytes {
            self.problem(
                path,
                meta.len(),
                mtime,
                format!(
                    "note is {} bytes, over max_note_bytes = {}; left untouched",
                    meta.len(),
                    self.live().config.max_note_bytes
                ),
            );
            return false;
        }
        true
    }

    /// [`problem`](Self::problem) for the note as it is now on disk (its size and mtime read
    /// here): reported once per version of the note.
    pub(crate) fn problem_now(&self, path: &Path, message: String) {
        let (len, mtime) = size_and_mtime(path);
        self.problem(path, len, mtime, message);
    }

    pub(crate) fn problem(&self, path: &Path, len: u64, mtime: SystemTime, message: String) {
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
}

/// Size and mtime of a file, for de-duplicating problem reports.
pub(crate) fn size_and_mtime(path: &Path) -> (u64, SystemTime) {
    std::fs::symlink_metadata(path)
        .map(|m| (m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
        .unwrap_or((0, SystemTime::UNIX_EPOCH))
}

/// How long ago a file was last modified (zero for a clock stepped back); None when gone.
pub(crate) fn modified_age(path: &Path) -> Option<Duration> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    Some(
        meta.modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .unwrap_or_default(),
    )
}

/// docs/design.md §9.1: the note's last call block is unfinished — a fence not closed, or a block
/// with `"tool_call"` that does not parse — with nothing but blank space after it. Some with
/// what is wrong with it (the message its result would get).
pub(crate) fn unfinished_tail<'a>(text: &str, parsed: &'a ParsedNote) -> Option<&'a str> {
    let last = parsed.calls.last()?;
    let CallBody::Broken(e) = &last.body else {
        return None;
    };
    let broken = e.code == ErrorCode::InvalidJson
        || (e.code == ErrorCode::InvalidCall && e.message.contains("fence not closed"));
    let at_end = text
        .get(last.span.end..)
        .is_none_or(|rest| rest.trim().is_empty());
    (broken && at_end).then_some(e.message.as_str())
}

/// Whether the note at `path` holds a call without a result; None when it is no longer there
/// (read errors: false; the note task reports them).
pub(crate) fn has_pending_call(path: &Path) -> Option<bool> {
    match crate::vault::read_regular_text(path) {
        Ok(text) => Some(
            crate::note::parse_note(&text)
                .pending_calls()
                .next()
                .is_some(),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => Some(false),
    }
}

/// Takes a path's in-flight entry away when the task holding it panics. Without it a note
/// whose look panicked stayed "already queued or being looked at" for good: every later event
/// and rescan marked it to be looked at again and nothing ever did. A normal end leaves the
/// entry to its task, which checks "look again" and removes it under one lock.
pub(crate) struct ForgetOnPanic<'a> {
    inflight: &'a Mutex<HashMap<PathBuf, bool>>,
    path: &'a Path,
}

impl<'a> ForgetOnPanic<'a> {
    pub(crate) fn new(inflight: &'a Mutex<HashMap<PathBuf, bool>>, path: &'a Path) -> Self {
        ForgetOnPanic { inflight, path }
    }
}

impl Drop for ForgetOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Never a second panic while unwinding (that aborts the daemon): a lock poisoned
            // by the panic is still the map.
            let mut inflight = self
                .inflight
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            inflight.remove(self.path);
        }
    }
}

/// The note slots: how many notes are held and worked on at once, and whether one is alone.
pub(crate) struct NoteSlots {
    slots: Arc<Semaphore>,
    total: usize,
    /// Slots the intake loop took for a note not queued yet (`next_queued`), waiting for one.
    ahead: AtomicUsize,
}

impl NoteSlots {
    pub(crate) fn new(total: usize) -> NoteSlots {
        NoteSlots {
            slots: Arc::new(Semaphore::new(total)),
            total,
            ahead: AtomicUsize::new(0),
        }
    }

    pub(crate) async fn take(&self) -> OwnedSemaphorePermit {
        self.slots
            .clone()
            .acquire_owned()
            .await
            .expect("the note slots are never closed")
    }

    /// A slot, if one is free now.
    pub(crate) fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Marks one slot as taken ahead, for a note not found yet, until the guard drops.
    pub(crate) fn ahead(&self) -> Ahead<'_> {
        self.ahead.fetch_add(1, Ordering::SeqCst);
        Ahead(&self.ahead)
    }

    /// True when at most one note holds a slot (the caller's): a slot taken ahead for the
    /// next note, which the intake loop holds while it waits for one, is no note.
    pub(crate) fn one_note(&self) -> bool {
        let held = self.total - self.slots.available_permits();
        held <= 1 + self.ahead.load(Ordering::SeqCst)
    }
}

/// A slot counted as taken ahead while this lives (cancel-safe: dropped with its future).
pub(crate) struct Ahead<'a>(&'a AtomicUsize);

impl Drop for Ahead<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Folders;
    use crate::note::parse_note;
    use crate::synced::{RunnerId, RunnerWatch};

    #[test]
    fn only_own_writes_where_vaultd_puts_notes_and_files_that_are_no_notes_need_no_look() {
        let vault = Vault::new(PathBuf::from("/v"), Folders::default());
        let runners = RunnerWatch::new(
            RunnerId::parse("alpha-0a1b").unwrap(),
            Duration::from_secs(3600),
            None,
        );
        let own = runners.own();
        let done = vault.folder(State::Done).join("a.md");
        let inbox = vault.folder(State::NeedsAction).join("a.md");
        let look = |hint: Hint| !needs_no_look(&vault, &own, &hint);
        assert!(
            look(Hint::Ready(done.clone())),
            "not ours: read for a second runner"
        );
        runners.wrote(&done);
        assert!(!look(Hint::Ready(done.clone())), "our own move into Done/");
        assert!(!look(Hint::Closed(done.clone())));
        // A rename noted before it was made that failed: the name is someone else's again.
        own.forget(&done);
        assert!(look(Hint::Ready(done.clone())));
        // The inbox is always looked at, even where vaultd itself just put a note back.
        runners.wrote(&inbox);
        assert!(look(Hint::Ready(inbox.clone())));
        assert!(look(Hint::Changed(inbox)));
        // A temp file (hidden name) is no note: its writes need no look, its rename in does
        // (the note task judges the name).
        let temp = vault.folder(State::InProgress).join(".a.md.vaultd-1-1.tmp");
        assert!(!look(Hint::Changed(temp.clone())));
        assert!(!look(Hint::Closed(temp.clone())));
        assert!(look(Hint::Ready(temp)));
        assert!(look(Hint::Rescan));
        assert!(look(Hint::NewFolder(vault.folder(State::Done).join("sub"))));
    }

    #[test]
    fn a_panicking_task_leaves_no_inflight_entry_and_a_finished_one_keeps_its_own() {
        let inflight = Mutex::new(HashMap::new());
        let path = PathBuf::from("/v/In_Progress/a.md");
        inflight.lock().unwrap().insert(path.clone(), false);
        let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _guard = ForgetOnPanic::new(&inflight, &path);
            // Poisons the lock too, as a panic inside the look could.
            let _held = inflight.lock().unwrap();
            panic!("a tool panicked");
        }));
        assert!(ended.is_err());
        let map = inflight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert!(
            !map.contains_key(&path),
            "the panicked task's entry is gone"
        );
        drop(map);

        let inflight = Mutex::new(HashMap::from([(path.clone(), true)]));
        drop(ForgetOnPanic::new(&inflight, &path));
        assert_eq!(
            inflight.lock().unwrap().get(&path),
            Some(&true),
            "left to its task"
        );
    }

    #[test]
    fn only_an_unfinished_last_block_counts_as_unfinished() {
        let call = "```json\n{\"tool_call\": {\"name\": \"a\"}}\n```\n";
        let unfinished = |t: &str| unfinished_tail(t, &parse_note(t)).is_some();
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

    #[tokio::test]
    async fn a_slot_the_intake_loop_took_ahead_leaves_a_note_alone() {
        let slots = NoteSlots::new(8);
        // The intake loop, waiting for the next note with a slot in hand (`next_queued`).
        let waiting = slots.take().await;
        let ahead = slots.ahead();
        let first = slots.take().await;
        assert!(slots.one_note(), "one note and the loop's slot taken ahead");
        let second = slots.take().await;
        assert!(!slots.one_note(), "two notes");
        drop(second);
        // The loop found a note: its slot is that note's now.
        drop(ahead);
        assert!(!slots.one_note(), "the loop's slot went to a second note");
        drop(waiting);
        assert!(slots.one_note());
        drop(first);
        assert!(slots.one_note(), "no note at all");
    }
}
