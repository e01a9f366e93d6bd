//! Write back and next state, done: the results and questions are appended to the note (one
//! atomic write), the note is moved to Done, Failed, Pending_Approval or Rejected, and the
//! run is closed in the journal. What is written and where the note goes are decided in
//! [`crate::pipeline::next_state`].

use crate::call::{CallResult, ErrorCode, HeldCall};
use crate::daemon::Daemon;
use crate::daemon::DaemonError;
use crate::journal::{CallProgress, RunId};
use crate::note::{self, parse_note};
use crate::pipeline::plan;
use crate::vault::State;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::pipeline::next_state::{Ending, WriteBack, append_results};

/// How [`Daemon::write_back_and_finish`] went.
#[derive(Debug)]
pub(crate) enum Finished {
    /// Written, then moved on and recorded: where the note is now, or why not.
    Moved(Result<PathBuf, DaemonError>),
    /// The note is no longer where the run left it.
    Gone,
    /// Not written: retried later.
    Failed,
}

/// A run's results, to append to its note in the blocking pool.
struct Appender {
    /// The vault root: the note's folder is reached from it without a symlink (§9.13).
    root: PathBuf,
    path: PathBuf,
    note_id: String,
    results: Vec<CallResult>,
    held: Vec<HeldCall>,
    next: State,
    runner: crate::synced::RunnerId,
    now: SystemTime,
    /// The note moves on right after: the rename's folder fsync is left to that move.
    moves_on: bool,
    /// The note's text as the run last saw it (`Ending::last_seen`).
    last_seen: Option<String>,
    /// Its temp file, made beforehand (`Ending::ahead`).
    ahead: Option<note::TempFile>,
}

impl Appender {
    /// The results write; `Gone` when the note at the path carries another `tool_note`.
    /// `before_rename` runs once the new text is written and fsynced, before it replaces the
    /// note ([`note::update_note_settling`]).
    fn write(self, before_rename: &mut dyn FnMut()) -> Result<String, note::WriteError> {
        let other_note = std::cell::Cell::new(false);
        let build = |current: &str| {
            let appended = append_results(
                current,
                &self.note_id,
                &self.results,
                &self.held,
                self.next,
                self.runner.as_str(),
                self.now,
            );
            other_note.set(appended.is_none());
            appended.unwrap_or_else(|| current.to_string())
        };
        let written = note::update_note_settling(
            &self.root,
            &self.path,
            build,
            self.moves_on,
            before_rename,
            self.last_seen.as_deref(),
            self.ahead,
        );
        if other_note.get() {
            return Err(note::WriteError::Gone(self.path));
        }
        written
    }
}

/// Where a finished note is, whether this trip moved it, and whether the journal took the record.
struct Moved {
    dest: PathBuf,
    moved: bool,
    recorded: Result<(), crate::journal::JournalError>,
}

/// Where a move noted before it was made meant to put the note, when it did not put it there.
fn missed_target(
    vault: &crate::vault::Vault,
    path: &Path,
    next: State,
    moved: &Result<Moved, DaemonError>,
) -> Option<PathBuf> {
    let target = vault.target(path, next)?;
    match moved {
        Ok(m) if !m.moved || m.dest == target => None,
        _ => Some(target),
    }
}

/// The note's move to `next` (unless it is already there or gone) and its journal record: the
/// written ids and the end of the run, in one commit. Blocking.
fn move_and_record(
    vault: &crate::vault::Vault,
    own: &crate::synced::OwnWrites,
    journal: &crate::journal::Journal,
    run: RunId,
    p: PathBuf,
    next: State,
    written: &[String],
) -> Result<Moved, DaemonError> {
    let here = vault.locate(&p).map(|(s, _)| s);
    let moves = here != Some(next) && p.exists();
    let dest = if moves {
        // Noted before the rename, so that its event finds it noted (`on_hint`).
        if let Some(target) = vault.target(&p, next) {
            own.wrote(&target);
        }
        match vault.move_soon(&p, next) {
            Ok(dest) => dest,
            Err(e) => {
                if let Some(folder) = p.parent() {
                    // The results write left this folder's fsync to the move (`write_back`).
                    crate::vault::fsync_dir(folder);
                }
                return Err(DaemonError::from(e));
            }
        }
    } else {
        p
    };
    let ids: Vec<&str> = written.iter().map(String::as_str).collect();
    let recorded = journal.written_and_moved(run, &ids, &vault.relative(&dest), true);
    Ok(Moved {
        dest,
        moved: moves,
        recorded,
    })
}

impl Daemon {
    /// docs/design.md §9.8: vaultd's additions never push a note past `max_note_bytes`. The biggest
    /// results' data go, whole, to `Tool_Results/<note id>/<call id>.md` (the §10.6 shape)
    /// until the note fits; the callout keeps a preview and a link.
    pub(crate) fn fit_results(
        &self,
        path: &Path,
        text: &str,
        note_id: &str,
        mut results: Vec<CallResult>,
    ) -> Vec<CallResult> {
        let limit = usize::try_from(self.live().config.max_note_bytes).unwrap_or(usize::MAX);
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

    /// The last sentence of a `[!question]`: how a person decides, in this vault's mode.
    pub(crate) fn how_to_decide(&self) -> String {
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
    pub(crate) async fn abandon(&self, run: RunId, path: &Path) -> Result<(), DaemonError> {
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

    /// Appends the results and notices into the note (atomically, keeping any edit made
    /// meanwhile). Returns the ids written, for `finish_run` to record.
    /// A note at `path` that carries another `tool_note` than `note_id` is another note (this
    /// one was moved away and another claimed to the same path): nothing is written, `Gone`.
    pub(crate) async fn write_back(
        &self,
        path: &Path,
        note_id: &str,
        results: Vec<CallResult>,
        held: Vec<HeldCall>,
        next: State,
    ) -> Result<WriteBack, DaemonError> {
        let ids: Vec<String> = results.iter().map(|r| r.call_id.clone()).collect();
        let append = self.appender(path, note_id, results, held, next);
        // Noted before the write's rename, so that its event finds it noted (`on_hint`).
        self.runners.wrote(path);
        let written = tokio::task::spawn_blocking(move || append.write(&mut || {}))
            .await
            .expect("write task does not panic");
        self.written(path, ids, written).await
    }

    /// [`write_back`](Self::write_back), then [`finish_run`](Self::finish_run) once the results
    /// are in, in one trip to the blocking pool (the note's last two steps, for every run).
    /// `Finished` carries what `finish_run` returned.
    pub(crate) async fn write_back_and_finish(
        &self,
        run: RunId,
        path: &Path,
        note_id: &str,
        (results, held): (Vec<CallResult>, Vec<HeldCall>),
        ending: Ending<'_>,
    ) -> Result<Finished, DaemonError> {
        let Ending {
            next,
            reason,
            foreign,
            in_note,
            committed,
            last_seen,
            ahead,
        } = ending;
        let ids: Vec<String> = results.iter().map(|r| r.call_id.clone()).collect();
        let mut recorded_ids: Vec<String> = ids
            .iter()
            .filter(|id| !foreign.contains(*id))
            .cloned()
            .collect();
        recorded_ids.extend(in_note.iter().filter(|id| !ids.contains(id)).cloned());
        let append = Appender {
            last_seen: Some(last_seen.to_owned()),
            ahead,
            ..self.appender(path, note_id, results, held, next)
        };
        // Noted before the write's rename, so that its event finds it noted (`on_hint`).
        self.runners.wrote(path);
        let (vault, journal, p) = (self.vault.clone(), self.journal.clone(), path.to_path_buf());
        let own = self.runners.own();
        let (written, moved) = self
            .on_this_thread(move || {
                // The outcomes committing meanwhile (a side effect's durable) are waited for
                // once the new text is fsynced, before it replaces the note: a result block
                // is never in the note before its outcome is in the journal, and the two
                // fsyncs overlap (`journal/mod.rs`, "Durability soon").
                let mut committed = committed;
                let mut settle = || journal.settle_all(committed.drain(..));
                let written = append.write(&mut settle);
                settle(); // a write that ended before its rename
                let moved = written
                    .is_ok()
                    .then(|| move_and_record(&vault, &own, &journal, run, p, next, &recorded_ids));
                (written, moved)
            })
            .await;
        match self.written(path, ids, written).await? {
            WriteBack::Written(_) => {
                let moved = moved.expect("a written note was moved on");
                self.look_again_unless_moved(path, next, &moved).await;
                Ok(Finished::Moved(self.after_move(moved, next, reason)))
            }
            WriteBack::Gone => Ok(Finished::Gone),
            WriteBack::Failed => Ok(Finished::Failed),
        }
    }

    /// What appends this run's results to the note at `path`, ready to run off the workers.
    fn appender(
        &self,
        path: &Path,
        note_id: &str,
        results: Vec<CallResult>,
        held: Vec<HeldCall>,
        next: State,
    ) -> Appender {
        Appender {
            root: self.vault.root().to_path_buf(),
            path: path.to_path_buf(),
            note_id: note_id.to_string(),
            results,
            held,
            next,
            runner: self.runners.me.clone(),
            now: SystemTime::now(),
            // Moved on right after (`finish_run`): that move's folder fsyncs cover this rename.
            moves_on: self
                .vault
                .locate(path)
                .is_some_and(|(here, _)| here != next),
            last_seen: None,
            ahead: None,
        }
    }

    /// The results write's outcome as a [`WriteBack`]; a failure is logged and recorded.
    async fn written(
        &self,
        path: &Path,
        ids: Vec<String>,
        written: Result<String, note::WriteError>,
    ) -> Result<WriteBack, DaemonError> {
        match written {
            // Recorded with the move that follows (`finish_run`), in one journal commit.
            Ok(_) => Ok(WriteBack::Written(ids)),
            Err(note::WriteError::Gone(_)) => Ok(WriteBack::Gone),
            Err(e) => {
                if e.is_symlink_refusal() {
                    // §9.13: claiming pauses (logged once) until the folder is real again.
                    self.pause_if_symlinked(&crate::vault::VaultError::SymlinkedFolder {
                        path: path.parent().unwrap_or(path).to_path_buf(),
                        why: "was swapped for a symlink while vaultd ran".into(),
                    });
                }
                let rel = self.vault.relative(path);
                // The folder it is in: In_Progress for a run, Rejected for `reject_held`.
                let folder = self
                    .vault
                    .locate(path)
                    .map_or(State::InProgress, |(state, _)| state);
                let message = format!(
                    "results not written yet ({e}); the note stays in {}/ and is retried at the next scan",
                    self.vault.folder_name(folder)
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
    pub(crate) async fn finish_run(
        &self,
        run: RunId,
        path: &Path,
        next: State,
        written: Vec<String>,
        reason: &str,
    ) -> Result<PathBuf, DaemonError> {
        let (vault, journal, p) = (self.vault.clone(), self.journal.clone(), path.to_path_buf());
        let own = self.runners.own();
        // The move and its journal record in one trip to the blocking pool.
        let moved = tokio::task::spawn_blocking(move || {
            move_and_record(&vault, &own, &journal, run, p, next, &written)
        })
        .await
        .expect("move task does not panic");
        self.look_again_unless_moved(path, next, &moved).await;
        self.after_move(moved, next, reason)
    }

    /// A finished note's move is noted as this daemon's own before it is made: where it then
    /// failed or went to another name, its first name is looked at again (`look_again`).
    async fn look_again_unless_moved(
        &self,
        path: &Path,
        next: State,
        moved: &Result<Moved, DaemonError>,
    ) {
        if let Some(target) = missed_target(&self.vault, path, next, moved) {
            self.look_again(target).await;
        }
    }

    /// The log line of a finished note, with its outcome and why; the move's or the record's
    /// error, if any.
    fn after_move(
        &self,
        moved: Result<Moved, DaemonError>,
        next: State,
        reason: &str,
    ) -> Result<PathBuf, DaemonError> {
        let Moved {
            dest,
            moved,
            recorded,
        } = moved?;
        if moved {
            self.runners.wrote(&dest);
        }
        let rel = self.vault.relative(&dest);
        // One line per finished note, with its outcome and why, so the log alone tells what
        // became of each note; a held note's line says what to do next (§13).
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
        recorded?;
        Ok(dest)
    }

    /// A note moved into Rejected: its held calls get REJECTED results; it stays there.
    /// The rejections are recorded first, under the note's identity, as `vaultd reject`
    /// records them (`approval::reject`): a call's newest record is its rejection, which
    /// `vaultd log`, a copy of the note and `vaultd mcp serve` waiting for it read.
    pub(crate) async fn reject_held(self: &Arc<Self>, path: &Path) -> Result<(), DaemonError> {
        let Some(text) = self.read_note(path) else {
            return Ok(());
        };
        let parsed = parse_note(&text);
        let rejected = plan::rejections(&parsed);
        if rejected.is_empty() {
            return Ok(());
        }
        let note = self.vault.relative(path);
        let note_id = crate::note::frontmatter_property(&text, "tool_note");
        let (id, outcomes) = (note_id.map(str::to_string), rejected.clone());
        let run = self
            .blocking(move |j| {
                // A rejection recorded at an earlier look whose write failed is not recorded
                // again: only the calls whose newest record is not that rejection, still
                // unwritten. One written and then deleted (asked anew, rejected again) is.
                let recorded: HashSet<String> = match &id {
                    Some(id) => j
                        .note_calls(id)?
                        .into_iter()
                        .filter(|c| {
                            matches!(&c.progress, CallProgress::Finished(r)
                                if matches!(&r.outcome, Err(e) if e.code == ErrorCode::Rejected))
                        })
                        .map(|c| c.call_id)
                        .collect(),
                    None => HashSet::new(),
                };
                let outcomes: Vec<_> = outcomes
                    .into_iter()
                    .filter(|r| !recorded.contains(&r.call_id))
                    .collect();
                let run = j.begin_note_run(&note, id.as_deref(), None, None)?;
                j.calls_finished(run, &outcomes)?;
                Ok(run)
            })
            .await?;
        if let WriteBack::Written(ids) = self
            .write_back(
                path,
                note_id.unwrap_or_default(),
                rejected,
                Vec::new(),
                State::Rejected,
            )
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Folders, WatchMode};
    use crate::journal::Journal;
    use crate::synced::{RunnerId, RunnerWatch};
    use crate::vault::Vault;
    use crate::watch::{self, Hint};
    use std::time::Duration;

    /// A prepared vault, its journal, and this daemon's runner watch.
    fn fixture() -> (tempfile::TempDir, Vault, Journal, RunnerWatch) {
        let dir = tempfile::tempdir().unwrap();
        let vault = Vault::new(dir.path().join("vault"), Folders::default());
        vault.prepare().unwrap();
        let journal = Journal::open(&dir.path().join("state")).unwrap();
        let runners = RunnerWatch::new(
            RunnerId::parse("alpha-0a1b").unwrap(),
            Duration::from_secs(3600),
            None,
        );
        (dir, vault, journal, runners)
    }

    /// A move noted before it was made that found its name taken (another runner's note, say)
    /// put the note under another name: the name it meant is looked at again
    /// (`look_again_unless_moved`); a move to the name it meant is not.
    #[test]
    fn a_move_to_a_taken_name_misses_its_target() {
        let (_dir, vault, journal, runners) = fixture();
        let own = runners.own();
        let (x, y) = (
            vault.folder(State::InProgress).join("x.md"),
            vault.folder(State::InProgress).join("y.md"),
        );
        for p in [&x, &y] {
            std::fs::write(p, "# ours\n").unwrap();
        }
        let taken = vault.folder(State::Done).join("x.md");
        std::fs::write(&taken, "# theirs\n").unwrap();
        let run = journal.begin_run("In_Progress/x.md").unwrap();
        let moved = move_and_record(&vault, &own, &journal, run, x.clone(), State::Done, &[]);
        assert_ne!(moved.as_ref().unwrap().dest, taken);
        assert_eq!(
            missed_target(&vault, &x, State::Done, &moved),
            Some(taken.clone())
        );
        let run = journal.begin_run("In_Progress/y.md").unwrap();
        let moved = move_and_record(&vault, &own, &journal, run, y.clone(), State::Done, &[]);
        assert_eq!(missed_target(&vault, &y, State::Done, &moved), None);
    }

    /// A finished note's move into Done/ is noted as this daemon's own before its rename, so
    /// that the watcher's thread drops the rename's event instead of waking the daemon to read
    /// the note for a second runner (§9.9). Noted after the rename, as it was, the event could
    /// (and under load mostly did) come first.
    #[tokio::test]
    async fn a_finished_notes_move_is_noted_before_its_event_reaches_the_watcher() {
        let (_dir, vault, journal, runners) = fixture();
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let (v, own) = (vault.clone(), runners.own());
        let _watching = watch::start(
            &[vault.folder(State::Done)],
            WatchMode::Events,
            tx,
            move |hint| crate::daemon::intake::needs_no_look(&v, &own, hint),
        )
        .unwrap();
        let (ours, theirs) = (
            vault.folder(State::InProgress).join("ours.md"),
            vault.folder(State::InProgress).join("theirs.md"),
        );
        std::fs::write(&ours, "# ours\n").unwrap();
        std::fs::write(&theirs, "# theirs\n").unwrap();
        let run = journal.begin_run("In_Progress/ours.md").unwrap();

        let moved = move_and_record(
            &vault,
            &runners.own(),
            &journal,
            run,
            ours,
            State::Done,
            &[],
        )
        .unwrap();
        assert!(moved.moved && moved.recorded.is_ok());
        // Then a move nobody noted (another runner's): its hint comes, so the watch works,
        // and every event before it (ours) has been through the watcher's thread.
        let theirs_done = vault.folder(State::Done).join("theirs.md");
        std::fs::rename(&theirs, &theirs_done).unwrap();
        let mut seen = Vec::new();
        while !seen.contains(&Hint::Ready(theirs_done.clone())) {
            let hint = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("the other move's event within 10 s")
                .expect("the watcher is alive");
            seen.push(hint);
        }
        let ours_done = vault.folder(State::Done).join("ours.md");
        assert!(
            !seen.iter().any(|h| matches!(h, Hint::Ready(p) | Hint::Closed(p) | Hint::Changed(p) if *p == ours_done)),
            "our own move woke the daemon: {seen:?}"
        );
    }

    /// A held call whose rejection an earlier look recorded (its write into the note then
    /// failed) is not recorded a second time when the note in Rejected/ is looked at again:
    /// one REJECTED outcome in the journal, and the block in the note.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rejection_recorded_before_is_not_recorded_again() {
        use crate::daemon::storage::tests::{InProcess, call_of};
        let d = InProcess::start_with(
            "",
            &[(
                "act",
                crate::tools::Effect::ExternalSideEffect,
                Some(crate::call::ApprovalRule::Always),
                true,
            )],
        );
        tokio::task::block_in_place(|| {
            let text = format!("# r\n\n{}", call_of("act", r#"{"q": "x"}"#));
            std::fs::write(d.vault.folder(State::NeedsAction).join("r.md"), text).unwrap();
            let held = d.vault.folder(State::PendingApproval).join("r.md");
            d.wait_for("r.md held", &|| held.exists());
            let text = std::fs::read_to_string(&held).unwrap();
            let note_id = note::frontmatter_property(&text, "tool_note").unwrap();
            let parsed = parse_note(&text);
            let rejected = plan::rejections(&parsed);
            assert_eq!(rejected.len(), 1, "{text}");
            // What the earlier look recorded before its write failed.
            let run = d
                .journal
                .begin_note_run("Rejected/r.md", Some(note_id), None, None)
                .unwrap();
            d.journal.calls_finished(run, &rejected).unwrap();
            d.journal.abandon_run(run, "results not written").unwrap();
            // REJECTED outcomes in the journal, every write so far in.
            let rejections = || {
                d.journal.flush().unwrap();
                d.journal
                    .log(&Default::default())
                    .unwrap()
                    .into_iter()
                    .filter(|e| e.event == "call_end" && e.outcome.as_deref() == Some("REJECTED"))
                    .count()
            };
            let to = d.vault.folder(State::Rejected).join("r.md");
            std::fs::rename(&held, &to).unwrap();
            d.wait_for("the REJECTED block", &|| {
                std::fs::read_to_string(&to).is_ok_and(|t| t.contains("REJECTED"))
            });
            assert_eq!(rejections(), 1, "the rejection recorded once");
            // Written, then deleted by a person (asked anew) and rejected again: recorded.
            let again = d.vault.folder(State::Rejected).join("r2.md");
            let written = d
                .journal
                .begin_note_run("Rejected/r2.md", Some(note_id), None, None)
                .unwrap();
            d.journal.calls_finished(written, &rejected).unwrap();
            let ids: Vec<&str> = rejected.iter().map(|r| r.call_id.as_str()).collect();
            d.journal.results_written(written, &ids).unwrap();
            d.journal.abandon_run(written, "moved on").unwrap();
            std::fs::rename(&to, &again).unwrap();
            std::fs::write(&again, &text).unwrap(); // the REJECTED block deleted
            d.wait_for("the second REJECTED block", &|| {
                std::fs::read_to_string(&again).is_ok_and(|t| t.contains("REJECTED"))
            });
            assert_eq!(
                rejections(),
                3,
                "the rejection after the written one recorded"
            );
        });
        d.stop().await;
    }
}
