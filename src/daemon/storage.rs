//! vaultd's own storage failing is not the note's failure (docs/design.md §9.12): while the journal
//! cannot be written (disk full, read-only, I/O error, a file size limit) nothing new is
//! claimed, a note whose calls could not start goes back (with the results of those that did
//! run) to `Needs_Action/`, or to `Approved/` when a move there approved it, the log, `vaultd status` and systemd's `STATUS=` say why, and
//! claiming resumes by itself once a probe write succeeds (after a failed fsync of the
//! journal, only at a restart: `journal::StorageHealth`).
//!
//! The journal notices the failure itself (any write that fails so, see `journal::StorageHealth`);
//! this module acts on it: [`StorageWatch`] is polled by the daemon's main loop.

use super::{Daemon, NoteRun, Pass};
use crate::call::CallResult;
use crate::daemon::DaemonError;
use crate::state::StoragePauseBoard;
use crate::vault::State;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinSet;

/// A file size limit (`ulimit -f`, `LimitFSIZE=`) reached by the journal is a storage failure
/// like a full disk (the write fails with EFBIG), not a reason to die: SIGXFSZ's default action
/// would kill the daemon in the middle of a write.
pub(crate) fn ignore_file_size_signal() {
    // SAFETY: setting a signal's disposition to SIG_IGN has no handler to run.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// How often the main loop looks at the journal's storage, and probes it while it fails.
pub(crate) const STORAGE_CHECK: Duration = Duration::from_secs(2);

/// The main loop's view of the journal's storage: what it last reported, and whether a probe
/// is on its way.
pub(crate) struct StorageWatch {
    reported: Option<String>,
    probing: Arc<AtomicBool>,
    board: Option<StoragePauseBoard>,
}

impl StorageWatch {
    pub(crate) fn new(state_dir: &Path) -> StorageWatch {
        let board = StoragePauseBoard::create(state_dir)
            .inspect_err(|e| {
                tracing::warn!(
                    "cannot reserve {}/storage_pause ({e}); `vaultd status` will not show a storage pause",
                    state_dir.display()
                );
            })
            .ok();
        StorageWatch {
            reported: None,
            probing: Arc::new(AtomicBool::new(false)),
            board,
        }
    }

    /// Reports a new failure, or the end of one (then rescans: the notes that waited are
    /// claimed now), and probes the storage while it fails.
    pub(crate) fn check(&mut self, daemon: &Arc<Daemon>, tasks: &mut JoinSet<()>) {
        let now = daemon.journal.storage_failure();
        match (&self.reported, &now) {
            // New, or a different failure (a failed fsync after a full disk): said again.
            (reported, Some(why)) if reported.as_ref() != Some(why) => {
                let resumes = if daemon.journal.storage_failure_until_restart() {
                    "claiming resumes when vaultd is restarted"
                } else {
                    "claiming resumes by itself once it can be written"
                };
                let message = format!(
                    "paused: the journal {} cannot be written: {why}; nothing new is claimed, notes wait where they are; {resumes}",
                    daemon.journal.path().display()
                );
                tracing::error!("{message}");
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&message)]);
                self.say(&message);
                self.reported = now.clone();
            }
            (Some(_), None) => {
                tracing::warn!("the journal can be written again; claiming resumes");
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&format!(
                    "watching {}",
                    daemon.vault.root().display()
                ))]);
                self.say("");
                self.reported = None;
                daemon.scan_all(tasks);
            }
            _ => {}
        }
        if now.is_some() && !self.probing.swap(true, Ordering::SeqCst) {
            let (journal, probing) = (daemon.journal.clone(), self.probing.clone());
            tokio::task::spawn_blocking(move || {
                journal.storage_recovered();
                probing.store(false, Ordering::SeqCst);
            });
        }
    }

    fn say(&self, why: &str) {
        if let Some(board) = &self.board
            && let Err(e) = board.write(why)
        {
            tracing::warn!("cannot update the storage pause for `vaultd status`: {e}");
        }
    }
}

impl Daemon {
    /// Why the side effects of the note `text` may already have run although the journal
    /// knows none of its calls: it carries this machine's `tool_runner` from before the journal
    /// was started afresh (`--new-journal`, docs/design.md §9.12). None for every other note.
    pub(crate) fn journal_lost(
        &self,
        text: &str,
        facts: &crate::pipeline::plan::Facts,
    ) -> Result<Option<String>, DaemonError> {
        if !facts.prior.is_empty() {
            return Ok(None);
        }
        let Some(at) = self.read_journal(|j| j.new_journal_at())? else {
            return Ok(None);
        };
        let Some(stamp) = crate::synced::runner_stamp(text) else {
            return Ok(None);
        };
        if !stamped_here(&stamp.runner, &self.runners.me) || stamp.updated.is_some_and(|u| u >= at)
        {
            return Ok(None);
        }
        Ok(Some(format!(
            "this call may already have run: vaultd {} ran this note before its journal was lost (vaultd started with --new-journal at {}), so nothing records whether it did",
            stamp.runner,
            crate::call::rfc3339_seconds(at)
        )))
    }

    /// Whether claiming waits for the journal's storage (docs/design.md §9.12).
    pub(crate) fn storage_paused(&self) -> bool {
        self.journal.storage_failure().is_some()
    }

    /// A run some of whose calls could not start because the journal could not record their
    /// start, or whose claimed text it could not keep before the stamp (nothing ran then):
    /// they are not failures of the note (docs/design.md §9.12). The results of the calls that
    /// did run are written into the note, then the note goes back (to `Approved/` when a move
    /// there approved it, else to `Needs_Action/`) with the rest pending, to be claimed again
    /// once the journal takes writes. Not left waiting in In_Progress: the failed commit may
    /// have taken the claim's record with it, and a note there unknown to the journal would
    /// be recovered with its unstarted sends turned into UNKNOWN_OUTCOME (§8.15).
    pub(crate) async fn wait_for_storage(
        &self,
        note: &NoteRun,
        ran: &HashSet<String>,
        results: Vec<CallResult>,
    ) -> Result<(), DaemonError> {
        use crate::pipeline::next_state::WriteBack;
        let (run, path, note_id) = (note.run, note.path.as_path(), note.ident.note_id.as_str());
        // Where a link claim left the note's first name, and where the note goes back to:
        // Approved/ keeps the approval a move there gave (`approval_via = "folder"`); with
        // `"cli"` the folder approves nothing, and only Needs_Action/ is looked at for calls
        // not yet decided.
        let claimed_from = match note.pass {
            Pass::Approved => State::Approved,
            Pass::Fresh | Pass::Recover { .. } => State::NeedsAction,
        };
        let back_to = if self.approval_via_cli() {
            State::NeedsAction
        } else {
            claimed_from
        };
        let rel = self.vault.relative(path);
        let started: Vec<CallResult> = results
            .into_iter()
            .filter(|r| ran.contains(&r.call_id) && !crate::runner::start_not_recorded(r))
            .collect();
        let some_ran = !started.is_empty();
        if some_ran {
            match self
                .write_back(path, note_id, started, Vec::new(), State::InProgress)
                .await?
            {
                WriteBack::Written(_) => {}
                WriteBack::Gone => return self.abandon(run, path).await,
                // Logged; the note and its open run wait in In_Progress for the next scan.
                WriteBack::Failed => return Ok(()),
            }
        }
        // A link claim still within `moved_in_grace` left the note's first name in the
        // folder it was claimed from: the unstamped text as it arrived. The note going back is the claimed
        // one (its identity, the results of what ran), so the first name goes first and the
        // note takes its name back, instead of coming back as `a (2).md` beside it.
        if let Some(first) = self
            .vault
            .locate(path)
            .map(|(_, rel)| self.vault.folder(claimed_from).join(rel))
            .and_then(|first| self.arrivals.held(&first))
        {
            self.arrivals.drop_one(&self.vault, &first);
            self.arrivals.leave_first_name(&first);
        }
        let (vault, p) = (self.vault.clone(), path.to_path_buf());
        let back = tokio::task::spawn_blocking(move || vault.move_to(&p, back_to))
            .await
            .expect("move task does not panic");
        match back {
            Ok(to) => {
                tracing::warn!(
                    note = %rel,
                    "the journal cannot record this note's calls: {}; the note went back to {} and runs {}",
                    if some_ran { "the results of those that ran are written" } else { "nothing ran" },
                    self.vault.relative(&to),
                    // A run lost with a failed commit, the storage fine: claimed again now.
                    if self.storage_paused() { "once the journal can be written" } else { "under a run of its own" }
                );
                // Recorded if the journal takes it; an open run whose note is not in
                // In_Progress is never resumed, and the note's next claim opens its own.
                let reason = format!(
                    "the journal could not record the note's calls; the note went back to {}",
                    self.vault.folder_name(back_to)
                );
                let _ = self.blocking(move |j| j.abandon_run(run, &reason)).await;
            }
            Err(e) => tracing::error!(
                note = %rel,
                "the journal cannot record this note's calls and the note cannot go back ({e}); it waits in In_Progress"
            ),
        }
        Ok(())
    }
}

/// Whether a note's `tool_runner` is this state dir's runner. Only the runner id counts, not
/// the host: two state dirs on one host (two replicas of a synced vault, each with its own
/// daemon) are two runners, and one's notes say nothing about the other's journal.
pub(crate) fn stamped_here(runner: &str, me: &crate::synced::RunnerId) -> bool {
    runner == me.as_str()
}

/// The start-up check of docs/design.md §9.12: a journal with no claim at all (deleted, emptied, or
/// new) while the vault holds notes this machine's vaultd stamped does not know what those
/// notes ran. Refused unless `new_journal` (`--new-journal`), which records that the journal
/// starts afresh: the pending side effects of those notes are then held (`journal_lost`).
/// `scanned`: the start-up scan's stamped notes, of every folder but DryRun's while
/// [`continuity_unknown`].
pub(crate) fn journal_continuity(
    vault: &crate::vault::Vault,
    journal: &crate::journal::Journal,
    me: &crate::synced::RunnerId,
    new_journal: bool,
    scanned: &[crate::synced::StampedNote],
) -> Result<(), DaemonError> {
    if !continuity_unknown(journal)? {
        return Ok(());
    }
    let stamped = notes_stamped_here(scanned, me, 3);
    if stamped.is_empty() {
        return Ok(());
    }
    let shown: Vec<String> = stamped.iter().map(|p| vault.relative(p)).collect();
    if !new_journal {
        return Err(crate::journal::JournalError::Other {
            path: journal.path().to_path_buf(),
            message: format!(
                "holds no record of any note, but this vault holds notes vaultd ran on this machine ({}{}): the journal was deleted, emptied or replaced, and without it vaultd cannot tell what those notes already did. \
                 Put the journal back if you can; otherwise start once with `vaultd run --new-journal` (or `vaultd once --new-journal`): the pending send/write calls of those notes are then held for approval, never run silently",
                shown.join(", "),
                if stamped.len() >= 3 { ", …" } else { "" }
            ),
        }
        .into());
    }
    let at = journal.record_new_journal(me.as_str())?;
    tracing::warn!(
        "--new-journal: the journal starts afresh at {}; pending side effects of notes vaultd ran here before ({}) are held for approval",
        crate::call::rfc3339_seconds(at),
        shown.join(", ")
    );
    Ok(())
}

/// Whether the journal knows no note at all: then the start-up scan reads every note, for
/// [`journal_continuity`].
pub(crate) fn continuity_unknown(
    journal: &crate::journal::Journal,
) -> Result<bool, crate::journal::JournalError> {
    Ok(!journal.has_runs()? && journal.new_journal_at()?.is_none())
}

/// Whether the start-up scan reads a note of `state` for [`journal_continuity`]: any but
/// DryRun's. A dry run stamps nothing that the journal records (docs/design.md §12.1): its
/// notes say nothing about a lost journal.
fn continuity_reads(state: State) -> bool {
    state != State::DryRun
}

/// How much of a note the start-up scan reads, by its folder and mtime: while the journal
/// knows no note (`continuity_unknown`), every note but DryRun's whole, for
/// [`journal_continuity`]; else the head of a note changed since `oldest`, for the
/// second-runner check (§9.9).
pub(crate) fn start_up_read(
    continuity_unknown: bool,
    oldest: std::time::SystemTime,
) -> impl Fn(State, std::time::SystemTime) -> crate::synced::ScanRead + Sync {
    use crate::synced::ScanRead;
    move |state, modified| {
        if continuity_unknown && continuity_reads(state) {
            ScanRead::Whole
        } else if modified >= oldest {
            ScanRead::Head
        } else {
            ScanRead::Skip
        }
    }
}

/// Up to `max` of the scanned notes whose `tool_runner` is this machine's vaultd.
fn notes_stamped_here(
    scanned: &[crate::synced::StampedNote],
    me: &crate::synced::RunnerId,
    max: usize,
) -> Vec<std::path::PathBuf> {
    scanned
        .iter()
        .filter(|n| continuity_reads(n.state))
        .filter(|n| {
            n.whole
                .as_ref()
                .is_some_and(|s| stamped_here(&s.runner, me))
        })
        .take(max)
        .map(|n| n.path.clone())
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::Folders;
    use crate::synced::{RunnerId, stamped_notes};
    use crate::vault::Vault;

    /// The notes the continuity check names, from the start-up scan as `run_vault` makes it
    /// while the journal knows none (and no note is recent enough for §9.9's read).
    fn named(vault: &Vault, me: &RunnerId) -> Vec<String> {
        let after_every_note = std::time::SystemTime::now() + Duration::from_secs(3600);
        let scanned = stamped_notes(vault, 1 << 20, start_up_read(true, after_every_note));
        notes_stamped_here(&scanned, me, 3)
            .iter()
            .map(|p| vault.relative(p))
            .collect()
    }

    /// A daemon run in process on a temp vault, with idle tools (never run: each call fails
    /// with "not run"): by [`start`](Self::start) one, `look` (`read_only`), held for
    /// approval when `approval`. `drop_note` and the warm-up note of `fail_nth_write_after`
    /// call `look`, so every tool list has it.
    pub(crate) struct InProcess {
        _dir: tempfile::TempDir,
        pub(crate) vault: Vault,
        pub(crate) config: crate::config::Config,
        pub(crate) journal: std::sync::Arc<crate::journal::Journal>,
        stop: tokio::sync::oneshot::Sender<()>,
        daemon: tokio::task::JoinHandle<Result<(), crate::daemon::DaemonError>>,
    }

    impl InProcess {
        fn start(approval: Option<crate::call::ApprovalRule>) -> InProcess {
            use crate::tools::Effect;
            InProcess::start_with("", &[("look", Effect::ReadOnly, approval, true)])
        }

        /// [`start`](Self::start) with `top` (top-level config lines, each ending in a
        /// newline) and these idle tools (`tools::idle::registry`).
        pub(crate) fn start_with(
            top: &str,
            tools: &[(
                &str,
                crate::tools::Effect,
                Option<crate::call::ApprovalRule>,
                bool,
            )],
        ) -> InProcess {
            InProcess::start_with_registry(top, crate::tools::idle::registry(tools))
        }

        /// [`start_with`](Self::start_with) these tools.
        pub(crate) fn start_with_registry(
            top: &str,
            registry: crate::tools::Registry,
        ) -> InProcess {
            let dir = tempfile::tempdir().unwrap();
            let (root, state) = (dir.path().join("vault"), dir.path().join("state"));
            std::fs::create_dir(&root).unwrap();
            let toml = dir.path().join("vaultd.toml");
            let quoted = |p: &std::path::Path| format!("{:?}", p.display().to_string());
            let config = format!(
                "{top}vault = {}\nstate_dir = {}\n",
                quoted(&root),
                quoted(&state)
            );
            std::fs::write(&toml, config).unwrap();
            let config = crate::config::load(&crate::config::Overrides {
                config: Some(toml),
                ..Default::default()
            })
            .unwrap();
            let vault = Vault::new(config.vault.clone(), config.folders.clone());
            vault.prepare().unwrap();
            InProcess::spawn(dir, vault, config, registry)
        }

        /// A daemon on `vault` with `config`'s state dir, whose journal it opens.
        fn spawn(
            dir: tempfile::TempDir,
            vault: Vault,
            config: crate::config::Config,
            registry: crate::tools::Registry,
        ) -> InProcess {
            use crate::daemon::{Mode, Services, run};
            use crate::journal::Journal;
            use std::sync::Arc;
            let journal = Arc::new(Journal::open(&config.state_dir).unwrap());
            let services = Services {
                mode: Mode::Run,
                vault: vault.clone(),
                journal: journal.clone(),
                registry,
                redactor: Arc::new(crate::secret::Redactor::new([], &[])),
                config: config.clone(),
            };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let daemon = tokio::spawn(run(services, async {
                let _ = stopped.await;
            }));
            InProcess {
                _dir: dir,
                vault,
                config,
                journal,
                stop,
                daemon,
            }
        }

        fn drop_note(&self, state: State, name: &str, parameters: &str) {
            let to = self.vault.folder(state).join(name);
            std::fs::write(to, format!("# {name}\n{}", call_of("look", parameters))).unwrap();
        }

        pub(crate) fn wait_for(&self, what: &str, done: &dyn Fn() -> bool) {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while !done() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "waited in vain for {what}"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }

        pub(crate) fn events_of(&self, name: &str, event: &str) -> usize {
            let log = self.journal.log(&Default::default()).unwrap();
            log.into_iter()
                .filter(|e| e.note.ends_with(name) && e.event == event)
                .count()
        }

        pub(crate) fn in_state(&self, state: State, name: &str) -> bool {
            self.vault.folder(state).join(name).exists()
        }

        /// `arrive` puts a note where the daemon claims it; the `nth` write the daemon sends
        /// after that (e.g. the note's claim record) goes in a group whose COMMIT fails (the
        /// storage fine: nothing is paused). After a first note has been through: the daemon
        /// is up, idle and sends nothing else meanwhile.
        fn fail_nth_write_after(&self, nth: u64, arrive: &dyn Fn()) {
            self.drop_note(State::NeedsAction, "warm.md", r#"{"z": 1}"#);
            self.wait_for("warm.md moved and recorded", &|| {
                self.journal.flush().unwrap();
                self.events_of("warm.md", "move") == 1
            });
            self.journal
                .fail_commit_of_write(self.journal.writes_sent() + nth);
            arrive();
        }

        /// Its daemon's stop and task, for a caller that runs it from now on (the gateway's
        /// `beside`): [`stop`](Self::stop) and [`restart`](Self::restart) no longer reach it.
        #[allow(clippy::type_complexity)]
        pub(crate) fn hand_over(
            &mut self,
        ) -> (
            tokio::sync::oneshot::Sender<()>,
            tokio::task::JoinHandle<Result<(), crate::daemon::DaemonError>>,
        ) {
            let (stop, _) = tokio::sync::oneshot::channel();
            (
                std::mem::replace(&mut self.stop, stop),
                std::mem::replace(&mut self.daemon, tokio::spawn(async { Ok(()) })),
            )
        }

        /// Lets a warm-up note through, then makes every fsync of the journal fail from the
        /// group of the claim record of the note `arrive` drops (the claim itself commits: it
        /// waits only for that) on. A note that calls an external side effect then has its
        /// start refused, and the daemon stops by itself with `StorageLost`.
        pub(crate) fn lose_fsync_from_the_claim_of(&self, arrive: &dyn Fn()) {
            self.drop_note(State::NeedsAction, "warm.md", r#"{"z": 1}"#);
            self.wait_for("warm.md moved and recorded", &|| {
                self.journal.flush().unwrap();
                self.events_of("warm.md", "move") == 1
            });
            self.journal
                .lose_fsync_before_write(self.journal.writes_sent() + 1);
            arrive();
        }

        /// Whether a run was lost: its id is missing from the journal's runs.
        fn a_run_was_lost(&self) -> bool {
            let ids = self.journal.run_ids();
            ids.last()
                .is_some_and(|last| usize::try_from(*last).unwrap() > ids.len())
        }

        pub(crate) async fn stop(self) {
            // Ignored for a daemon handed over (`hand_over`): its stand-in has no receiver.
            let _ = self.stop.send(());
            self.daemon.await.unwrap().unwrap();
        }

        /// Stops the daemon (unless it stopped by itself) and starts another on the same
        /// vault and state dir, with `registry`: a restart. Returns how the first one ended.
        async fn restart(
            self,
            registry: crate::tools::Registry,
        ) -> (Result<(), crate::daemon::DaemonError>, InProcess) {
            let InProcess {
                _dir,
                vault,
                config,
                journal,
                stop,
                daemon,
            } = self;
            let _ = stop.send(());
            let ended = daemon.await.unwrap();
            // The last handle (a storage probe task may hold one a moment longer): its
            // writer stops and the file is closed before the next daemon opens it.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::sync::Arc::strong_count(&journal) > 1 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the journal is still held"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            drop(journal);
            (ended, InProcess::spawn(_dir, vault, config, registry))
        }
    }

    /// A ```json block calling `tool`.
    pub(crate) fn call_of(tool: &str, parameters: &str) -> String {
        format!(
            "```json\n{{\"tool_call\": {{\"name\": \"{tool}\", \"parameters\": {parameters}}}}}\n```\n"
        )
    }

    /// A note whose claim record a failed commit lost, the storage fine (nothing paused): the
    /// journal refuses to keep its claimed text before its identity stamp (the note's invalid
    /// call makes it stamp), and nothing of it has run. It goes back to Needs_Action and is
    /// claimed again under a run of its own, instead of waiting in In_Progress, unknown to the
    /// journal, for the next start ("The claim" in `journal/mod.rs`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_note_whose_run_a_failed_commit_lost_is_not_left_in_in_progress() {
        let d = InProcess::start(None);
        tokio::task::block_in_place(|| {
            // A call that breaks the tool's schema: it never starts, and its note is stamped.
            // Its claim record is the first write the daemon makes for it.
            d.fail_nth_write_after(1, &|| {
                d.drop_note(State::NeedsAction, "a.md", r#"{"z": 1}"#)
            });
            d.wait_for("a.md in Failed", &|| d.in_state(State::Failed, "a.md"));
            // Its move is recorded after the rename (flushes only now: each is a write, and
            // the failing one is counted from the start).
            d.wait_for("a.md's move recorded", &|| {
                d.journal.flush().unwrap();
                d.events_of("a.md", "move") >= 1
            });
            let text = std::fs::read_to_string(d.vault.folder(State::Failed).join("a.md")).unwrap();
            assert_eq!(text.matches("tool_result").count(), 1, "{text}");
            assert!(text.contains("INVALID_PARAMS"), "{text}");
            // The failed commit took the first claim with it: the journal knows the second.
            assert!(d.a_run_was_lost(), "{:?}", d.journal.run_ids());
            assert_eq!(d.events_of("a.md", "claim"), 1);
            assert_eq!(d.events_of("a.md", "move"), 1);
            assert!(d.journal.open_runs().unwrap().is_empty());
        });
        d.stop().await;
    }

    /// A read_only note's call starts behind its claim record, under the record's ticket
    /// ("The claim" in `journal/mod.rs`), and that record's group fails to commit (the
    /// storage fine). The run is lost: the start, the outcome and the move under it are
    /// refused, none of them lands under another run, and the note's result block stands: it
    /// ends in Failed (the idle tool's own failure) with one result, the journal holding no
    /// start for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_only_start_behind_a_claim_whose_commit_failed_is_recorded_under_no_run() {
        let d = InProcess::start(None);
        tokio::task::block_in_place(|| {
            d.fail_nth_write_after(1, &|| {
                d.drop_note(State::NeedsAction, "r.md", r#"{"q": "x"}"#)
            });
            d.wait_for("r.md in Failed", &|| d.in_state(State::Failed, "r.md"));
            let text = std::fs::read_to_string(d.vault.folder(State::Failed).join("r.md")).unwrap();
            assert_eq!(text.matches("tool_result").count(), 1, "{text}");
            assert!(text.contains("not run"), "the tool's own failure: {text}");
            d.journal.flush().unwrap();
            assert_eq!(
                d.journal.run_ids(),
                vec![1],
                "warm.md's run alone: r.md's was lost"
            );
            assert_eq!(d.events_of("r.md", "claim"), 0);
            assert_eq!(d.events_of("r.md", "call_start"), 0);
            // Nor under another run (warm.md's call broke its schema: it never started).
            let starts = d.journal.log(&Default::default()).unwrap();
            assert_eq!(starts.iter().filter(|e| e.event == "call_start").count(), 0);
        });
        d.stop().await;
    }

    /// An fsync of the journal fails between a note's claim and its side effect's start: the
    /// start is refused before it is recorded (not committed and then answered with an error),
    /// so the call does not run, the note goes back to Needs_Action, and claiming waits for a
    /// restart. After it, the call runs once, its own result: not UNKNOWN_OUTCOME, as a start
    /// the journal kept would make it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_start_refused_after_a_failed_fsync_runs_once_after_the_restart() {
        use crate::tools::Effect;
        let tools = [
            ("look", Effect::ReadOnly, None, true),
            ("send", Effect::ExternalSideEffect, None, true),
        ];
        let d = InProcess::start_with("", &tools);
        let send_note = |d: &InProcess| {
            let to = d.vault.folder(State::NeedsAction).join("s.md");
            std::fs::write(to, format!("# s\n{}", call_of("send", r#"{"q": "x"}"#))).unwrap();
        };
        tokio::task::block_in_place(|| {
            d.lose_fsync_from_the_claim_of(&|| send_note(&d));
            // Claimed (moved away, then recorded), paused, then back: in that order.
            d.wait_for("s.md back in Needs_Action, claiming paused", &|| {
                d.events_of("s.md", "claim") == 1
                    && d.journal.storage_failure().is_some()
                    && d.in_state(State::NeedsAction, "s.md")
            });
            let why = d.journal.storage_failure().unwrap();
            assert!(why.contains("restart vaultd"), "{why}");
            assert_eq!(
                d.events_of("s.md", "call_start"),
                0,
                "the start was refused"
            );
            let text =
                std::fs::read_to_string(d.vault.folder(State::NeedsAction).join("s.md")).unwrap();
            assert!(!text.contains("tool_result"), "{text}");
            // It stops by itself, for a service manager to start it again.
            d.wait_for("the daemon stopped by itself", &|| d.daemon.is_finished());
        });
        let (ended, d) = d.restart(crate::tools::idle::registry(&tools)).await;
        match ended {
            Err(crate::daemon::DaemonError::StorageLost { why, .. }) => {
                assert!(why.contains("restart vaultd"), "{why}")
            }
            other => panic!("ended with {other:?}"),
        }
        tokio::task::block_in_place(|| {
            d.wait_for("s.md in Failed (the idle tool's own failure)", &|| {
                d.in_state(State::Failed, "s.md")
            });
            let text = std::fs::read_to_string(d.vault.folder(State::Failed).join("s.md")).unwrap();
            assert_eq!(text.matches("tool_result").count(), 1, "{text}");
            assert!(text.contains("not run"), "{text}");
            assert!(!text.contains("UNKNOWN_OUTCOME"), "{text}");
            d.journal.flush().unwrap();
            assert_eq!(d.events_of("s.md", "call_start"), 1, "ran once");
        });
        d.stop().await;
    }

    /// The same for a note claimed from Approved (its call was held for approval, and an
    /// approved run stamps): it goes back to Approved, keeping the approval its move there
    /// gave, and runs from there, instead of being held again from Needs_Action.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_approved_note_whose_run_a_failed_commit_lost_goes_back_to_approved() {
        let d = InProcess::start(Some(crate::call::ApprovalRule::Always));
        tokio::task::block_in_place(|| {
            d.drop_note(State::NeedsAction, "b.md", r#"{"q": "x"}"#);
            d.wait_for("b.md held", &|| d.in_state(State::PendingApproval, "b.md"));
            let (held, approved) = (
                d.vault.folder(State::PendingApproval).join("b.md"),
                d.vault.folder(State::Approved).join("b.md"),
            );
            // A person approves it: the move into Approved/. The daemon's first write for it
            // is a flush (the note is not where the journal last saw it), its second the
            // claim record.
            d.fail_nth_write_after(2, &|| std::fs::rename(&held, &approved).unwrap());
            d.wait_for("b.md in Failed or Pending_Approval", &|| {
                d.in_state(State::Failed, "b.md") || d.in_state(State::PendingApproval, "b.md")
            });
            assert!(
                d.in_state(State::Failed, "b.md"),
                "held again instead of run: {:?}",
                d.journal.log(&Default::default()).unwrap()
            );
            // It ran (the test tool fails every call it runs), once.
            let text = std::fs::read_to_string(d.vault.folder(State::Failed).join("b.md")).unwrap();
            assert!(text.contains("not run"), "{text}");
            d.journal.flush().unwrap();
            assert!(d.a_run_was_lost(), "{:?}", d.journal.run_ids());
            // The hold's claim, and the approved one the journal kept.
            assert_eq!(d.events_of("b.md", "claim"), 2);
        });
        d.stop().await;
    }

    /// With `approval_via = "cli"`, a note `vaultd approve` sent to Approved/ whose approved
    /// call ran, but whose next call could not start (its start's commit failed), goes back
    /// to Needs_Action, not to Approved/: there, its one approval spent, nothing would claim
    /// it again (with `"cli"` a note in Approved/ runs only on an unspent `vaultd approve`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_cli_approval_a_note_whose_next_call_could_not_start_goes_back_to_needs_action() {
        use crate::call::ApprovalRule;
        use crate::tools::Effect;
        let d = InProcess::start_with(
            "approval_via = \"cli\"\n",
            &[
                ("look", Effect::ReadOnly, None, true),
                ("act", Effect::StateChange, Some(ApprovalRule::Always), true),
                ("more", Effect::StateChange, None, true),
            ],
        );
        tokio::task::block_in_place(|| {
            let held = d.vault.folder(State::PendingApproval).join("c.md");
            let first = format!("# c\n{}", call_of("act", r#"{"q": "a"}"#));
            std::fs::write(d.vault.folder(State::NeedsAction).join("c.md"), first).unwrap();
            d.wait_for("c.md held", &|| held.exists());
            // The agent adds a call to the held note, one that needs no approval.
            let mut text = std::fs::read_to_string(&held).unwrap();
            text.push_str(&call_of("more", r#"{"q": "b"}"#));
            std::fs::write(&held, text).unwrap();
            // `vaultd approve` (its own connection: no write of the daemon's) moves it to
            // Approved/. The daemon's writes for it: a flush (the note is not where the
            // journal last saw it), the claim record, `act`'s start (which spends the
            // approval) and outcome, then `more`'s start, which fails. `act`'s outcome is
            // queued, not waited for, so it may share that group and be lost with it; either
            // way the note goes back with `act`'s result. Had another write failed instead,
            // the note would not go back: two claims, not three (below).
            d.fail_nth_write_after(5, &|| {
                crate::approval::approve(&d.config, &held).unwrap();
            });
            d.wait_for("c.md in Failed", &|| d.in_state(State::Failed, "c.md"));
            let text = std::fs::read_to_string(d.vault.folder(State::Failed).join("c.md")).unwrap();
            // Each call ran once (the test tools fail every call they run).
            assert_eq!(text.matches("not run").count(), 2, "{text}");
            d.journal.flush().unwrap();
            // The hold's claim, the approved one (whose run was abandoned), and the claim
            // from Needs_Action.
            assert_eq!(
                d.events_of("c.md", "claim"),
                3,
                "{:?}",
                d.journal.log(&Default::default()).unwrap()
            );
        });
        d.stop().await;
    }

    #[test]
    fn notes_stamped_here_are_found_whole_and_only_when_vaultd_could_have_run_them() {
        let dir = tempfile::tempdir().unwrap();
        let vault = Vault::new(dir.path().to_path_buf(), Folders::default());
        vault.prepare().unwrap();
        let me = RunnerId::parse("alpha-0a1b").unwrap();
        let stamped = |extra: &str| {
            format!(
                "---\n{extra}tool_runner: alpha-0a1b\ntool_updated: 2026-01-01T00:00:00Z\n---\nbody\n"
            )
        };
        let write = |state: State, name: &str, bytes: &[u8]| {
            std::fs::write(vault.folder(state).join(name), bytes).unwrap();
        };
        // A frontmatter longer than any head read: its `tool_runner` (added last) is found.
        let long = format!("notes: {}\n", "x".repeat(100 * 1024));
        write(State::Done, "long.md", stamped(&long).as_bytes());
        // Not UTF-8: vaultd never ran it, whatever its frontmatter says.
        let mut latin1 = stamped("").into_bytes();
        latin1.extend_from_slice(b"caf\xe9\n");
        write(State::Done, "latin1.md", &latin1);
        // A dry run records nothing in the journal (docs/design.md §12.1).
        write(State::DryRun, "dry.md", stamped("").as_bytes());
        write(State::Failed, "another.md", stamped("").as_bytes());
        write(
            State::Failed,
            "theirs.md",
            stamped("").replace("alpha", "beta").as_bytes(),
        );
        assert_eq!(named(&vault, &me), ["Done/long.md", "Failed/another.md"]);
    }
}
