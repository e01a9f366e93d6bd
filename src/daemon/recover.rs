//! Recovery: notes a previous daemon left in In_Progress, and runs whose results could not
//! be written or whose note could not be moved, are finished from the journal (docs/design.md §5, §8.15).

use super::Daemon;
use crate::daemon::claim::{IdentityWrite, Stamp, by_call_id, new_note_id, valid_note_id};
use crate::daemon::{DaemonError, Identity, NoteRun, Pass};
use crate::note::{self};
use crate::vault::State;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::task::JoinSet;

impl Daemon {
    /// Finishes open runs whose note sits in In_Progress with no task on it: their results
    /// could not be written or the note not moved (it kept changing, a folder was read-only).
    pub(crate) async fn resume_stranded(self: Arc<Self>) {
        if self.stopping.load(Ordering::SeqCst) || self.runners.is_paused() || self.storage_paused()
        {
            return;
        }
        self.forget_old_claimed_texts();
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
            let _unwinding = super::intake::ForgetOnPanic::new(&self.inflight, &path);
            let _slot = self.note_slot().await;
            // The list may be stale: the run's own task may have closed it meanwhile, and a
            // new file may sit at the same path. Take the journal's word now.
            let note = r.note.clone();
            let current = self.blocking(move |j| j.run_for_note(&note)).await;
            match current {
                Ok(Some(now)) if now.run_id == r.run_id => {
                    tracing::info!(note = %r.note, "retrying a run whose note was not finished");
                    if let Err(e) = self.recover_note(&path, Some(now), false).await {
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

    /// Finishes a note found in In_Progress (docs/design.md §5, §8.15, §9.3): continues its open run
    /// `open` if the journal has one at this path, else starts one. Its identity is the
    /// `tool_note` it carries, else the run's, else a new one (written into it). `at_start`:
    /// start-up recovery, the only pass that puts back a note a crash damaged (later, an
    /// empty note may be an editor's save in progress).
    pub(crate) async fn recover_note(
        self: &Arc<Self>,
        path: &Path,
        open: Option<crate::journal::OpenRun>,
        at_start: bool,
    ) -> Result<(), DaemonError> {
        let rel = self.vault.relative(path);
        let Some(text) = self
            .read_or_restore(path, &rel, open.as_ref(), at_start)
            .await?
        else {
            return Ok(());
        };
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
        let outcome = self
            .recover_run(path, &rel, &note_id, carried.as_deref(), open)
            .await;
        self.deactivate(&note_id);
        outcome
    }

    /// recover_note's reading stage: the note's text; at start, a note a crash damaged is put
    /// back as it was claimed, from the journal. None when it cannot be put back yet.
    async fn read_or_restore(
        self: &Arc<Self>,
        path: &Path,
        rel: &str,
        open: Option<&crate::journal::OpenRun>,
        at_start: bool,
    ) -> Result<Option<String>, DaemonError> {
        let read = crate::vault::read_regular_text(path);
        let is_damaged = match &read {
            Ok(text) => damaged(text),
            Err(e) => e.kind() == std::io::ErrorKind::InvalidData, // not UTF-8
        };
        let mut text = read.unwrap_or_default();
        let claimed = match open.and_then(|r| r.claimed_text.clone()) {
            Some(text) => Some(text),
            // The run may have ended before the crash undid its note's last rename and move
            // (they were the flusher's): its text is found by the note's name.
            None if at_start && is_damaged => {
                let names = self.names_in_every_state(path);
                self.read_journal(|j| j.claimed_text_at(&names))?
            }
            None => None,
        };
        let busy = || crate::note::write::writer_busy(path).unwrap_or(true);
        if let Some(claimed) = claimed.as_deref()
            && at_start
            && is_damaged
            && !busy()
        {
            // The stamp's write had no fsync of its own (`journal/mod.rs`, "The stamp"): a
            // crash can leave the note empty or zero-filled. The journal kept its text.
            let (root, p, t) = (
                self.vault.root().to_path_buf(),
                path.to_path_buf(),
                claimed.to_string(),
            );
            let restored = tokio::task::spawn_blocking(move || note::restore_note(&root, &p, &t))
                .await
                .expect("restore task does not panic");
            match restored {
                Ok(()) => {
                    tracing::warn!(note = %rel, "the note was damaged by a crash: put back as it was claimed, from the journal");
                    text = claimed.to_string();
                }
                Err(e) => {
                    tracing::error!(note = %rel, "the note was damaged by a crash and cannot be put back yet: {e}");
                    return Ok(None);
                }
            }
        }
        Ok(Some(text))
    }

    /// recover_note's run stage: the note's prior calls found, the open run continued (or a
    /// new one begun), its identity written when it carries none, and the run executed.
    async fn recover_run(
        self: &Arc<Self>,
        path: &Path,
        rel: &str,
        note_id: &str,
        carried: Option<&str>,
        open: Option<crate::journal::OpenRun>,
    ) -> Result<(), DaemonError> {
        let (prior, stale) = self.prior_for(note_id).await?;
        let (run, known, this_run) = match open {
            Some(r) => {
                if r.note_id.is_none() {
                    // A run from a version 1 journal: keyed by note id from now on.
                    let id = note_id.to_string();
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
                let (note, id) = (rel.to_string(), note_id.to_string());
                let run = self
                    .blocking(move |j| j.begin_note_run(&note, Some(&id), None, None))
                    .await?;
                (run, known, HashSet::new())
            }
        };
        // Runs recorded by a version 1 journal have their calls under the run only.
        let mut prior = prior;
        if prior.is_empty() {
            let note = rel.to_string();
            if let Some(r) = self.blocking(move |j| j.run_for_note(&note)).await? {
                prior = by_call_id(r.calls);
            }
        }
        if carried.is_none()
            && matches!(
                self.write_identity(
                    run,
                    path,
                    note_id,
                    Stamp::Durable,
                    std::time::SystemTime::now()
                )
                .await?,
                IdentityWrite::Gone
            )
        {
            return self.abandon(run, path).await;
        }
        let ident = Identity {
            note_id: note_id.to_string(),
            prior,
            this_run,
            stale,
            wait_for: None,
        };
        let run = NoteRun {
            run,
            path: path.to_path_buf(),
            pass: Pass::Recover { known },
            ident,
            live: self.live(),
            text_kept: false,
        };
        self.execute(run, None).await
    }

    /// `path`'s vault-relative name in each state folder: where the journal may know it.
    fn names_in_every_state(&self, path: &Path) -> Vec<String> {
        let Some((_, inner)) = self.vault.locate(path) else {
            return vec![self.vault.relative(path)];
        };
        State::ALL
            .iter()
            .map(|s| self.vault.relative(&self.vault.folder(*s).join(&inner)))
            .collect()
    }

    /// Start-up: finishes every note left in In_Progress from the journal (docs/design.md §5, §8.15).
    pub(crate) async fn recover(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
    ) -> Result<(), DaemonError> {
        // Temp files of writes a killed daemon never finished (the note itself is intact):
        // note writes in the state folders, and vault tools' writes where they may write
        // (a vault edit's new file waits there for its undo record: journal/undo.rs).
        // A walk of folders (all of the vault for `write = ["**"]`): off the async workers.
        let (vault, tools) = (self.vault.clone(), self.live().config.tools.vault.clone());
        let swept = tokio::task::spawn_blocking(move || {
            vault.remove_temp_files(&tools.write_roots(), note::write::is_stale_temp)
        })
        .await
        .expect("the sweep does not panic");
        if swept > 0 {
            tracing::info!(swept, "removed temp files of interrupted writes");
        }
        let open = self.blocking(|j| j.open_runs()).await?;
        let notes = self.vault.scan(State::InProgress);
        let since = std::time::SystemTime::now() - std::time::Duration::from_secs(24 * 3600);
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
            let slot = self.note_slot().await;
            let me = self.clone();
            tasks.spawn(async move {
                let _slot = slot;
                let _unwinding = super::intake::ForgetOnPanic::new(&me.inflight, &path);
                if let Err(e) = me.recover_note(&path, known, true).await {
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
        self.forget_old_claimed_texts();
        Ok(())
    }

    /// The claimed texts of runs that ended over a minute ago: their notes' last writes are
    /// durable (the flusher's rounds are 50 ms), so recovery will not need them ("The stamp"
    /// in `journal/mod.rs`).
    pub(crate) fn forget_old_claimed_texts(&self) {
        let before = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        if let Err(e) = self.journal.forget_claimed_texts(before) {
            tracing::warn!("journal: {e}");
        }
    }
}

/// What a crash can leave of a note replaced without an fsync (empty, or its length in
/// zeros; old blocks that are not UTF-8 are caught by the read), never a note anyone wrote:
/// markdown holds no NUL byte.
fn damaged(text: &str) -> bool {
    text.is_empty() || text.contains('\0')
}
