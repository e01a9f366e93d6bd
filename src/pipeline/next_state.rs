//! Write back and next state: the results and questions are appended to the note (one
//! atomic write), the note is moved to Done, Failed, Pending_Approval or Rejected, and the
//! run is closed in the journal.

use crate::call::{CallResult, HeldCall};
use crate::daemon::Daemon;
use crate::daemon::DaemonError;
use crate::journal::RunId;
use crate::note::{self, Block, parse_note};
use crate::pipeline::plan;
use crate::vault::State;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

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

/// Where a run's note goes next and why; `foreign`: ids of outcomes another run owns, written
/// into the note but not recorded as this run's.
pub(crate) struct Ending<'a> {
    pub next: State,
    pub reason: &'a str,
    pub foreign: &'a std::collections::HashSet<String>,
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
}

impl Appender {
    /// The results write; `Gone` when the note at the path carries another `tool_note`.
    fn write(self) -> Result<String, note::WriteError> {
        let other_note = std::cell::Cell::new(false);
        let update = if self.moves_on {
            note::update_note_then_move
        } else {
            note::update_note_beneath
        };
        let written = update(&self.root, &self.path, &|current: &str| {
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
        });
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

/// The note's move to `next` (unless it is already there or gone) and its journal record: the
/// written ids and the end of the run, in one commit. Blocking.
fn move_and_record(
    vault: &crate::vault::Vault,
    journal: &crate::journal::Journal,
    run: RunId,
    p: PathBuf,
    next: State,
    written: &[String],
) -> Result<Moved, DaemonError> {
    let here = vault.locate(&p).map(|(s, _)| s);
    let moves = here != Some(next) && p.exists();
    let dest = if moves {
        match vault.move_to(&p, next) {
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

/// How appending a run's results into its note went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WriteBack {
    /// The results of these call ids are in the note.
    Written(Vec<String>),
    /// The note is no longer where the run left it.
    Gone,
    /// Not written (the note keeps changing, the folder is read-only, …): retried later.
    Failed,
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
        let written = tokio::task::spawn_blocking(move || append.write())
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
        } = ending;
        let ids: Vec<String> = results.iter().map(|r| r.call_id.clone()).collect();
        let recorded_ids: Vec<String> = ids
            .iter()
            .filter(|id| !foreign.contains(*id))
            .cloned()
            .collect();
        let append = self.appender(path, note_id, results, held, next);
        let (vault, journal, p) = (self.vault.clone(), self.journal.clone(), path.to_path_buf());
        let (written, moved) = tokio::task::spawn_blocking(move || {
            let written = append.write();
            let moved = written
                .is_ok()
                .then(|| move_and_record(&vault, &journal, run, p, next, &recorded_ids));
            (written, moved)
        })
        .await
        .expect("write task does not panic");
        match self.written(path, ids, written).await? {
            WriteBack::Written(_) => {
                let moved = moved.expect("a written note was moved on");
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
            Ok(_) => {
                self.runners.wrote(path);
                Ok(WriteBack::Written(ids))
            }
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
    pub(crate) async fn finish_run(
        &self,
        run: RunId,
        path: &Path,
        next: State,
        written: Vec<String>,
        reason: &str,
    ) -> Result<PathBuf, DaemonError> {
        let (vault, journal, p) = (self.vault.clone(), self.journal.clone(), path.to_path_buf());
        // The move and its journal record in one trip to the blocking pool.
        let moved = tokio::task::spawn_blocking(move || {
            move_and_record(&vault, &journal, run, p, next, &written)
        })
        .await
        .expect("move task does not panic");
        self.after_move(moved, next, reason)
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
}

/// The blocks a results write appends to the note `cur`: results not in it yet, then the
/// questions it does not show yet (with exactly these parameters).
fn blocks_to_write<'r>(
    cur: &note::ParsedNote,
    results: &'r [CallResult],
    held: &'r [HeldCall],
) -> Vec<Block<'r>> {
    let mut blocks: Vec<Block<'r>> = results
        .iter()
        .filter(|r| !cur.has_result(&r.call_id))
        .map(Block::Result)
        .collect();
    for h in held {
        let shown = match &h.question {
            // A server's question: this one exactly (a new round's, or one asked again with
            // why, is written beside the old one).
            Some(q) => {
                let hash = note::question_hash(&h.reason, q);
                cur.held
                    .iter()
                    .any(|r| r.call_id == h.call_id && r.question_hash.as_ref() == Some(&hash))
            }
            None => cur.is_held_as(&h.call_id, &note::params_hash(&h.name, &h.parameters)),
        };
        if !shown && !cur.has_result(&h.call_id) {
            blocks.push(Block::Held(h));
        }
    }
    blocks
}

/// The identity a results write sets beside the four properties: `tool_runner`, and
/// `tool_note` when the note has none yet.
fn extra_properties<'a>(
    current: &str,
    note_id: &'a str,
    runner: &'a str,
) -> Vec<(&'static str, &'a str)> {
    let mut extra = vec![("tool_runner", runner)];
    if note::frontmatter_property(current, "tool_note").is_none() && !note_id.is_empty() {
        extra.push(("tool_note", note_id));
    }
    extra
}

/// docs/design.md §8.3: an INVALID_JSON position is counted in the note as the person sees it, that
/// is as written back, so the frontmatter lines the results write adds above the call move
/// it down. Done once, before the results are journaled, logged or written: the note, the
/// log line, `vaultd log` and `vaultd status` then all say the same line. `fresh` are the
/// results whose position was read from `current` now (not recorded ones).
pub(crate) fn place_as_written(
    current: &str,
    note_id: &str,
    runner: &str,
    results: &mut [CallResult],
    fresh: &[usize],
    held: &[HeldCall],
) {
    if !fresh
        .iter()
        .any(|i| note::render::json_position(&results[*i]).is_some())
    {
        return;
    }
    let added = {
        let blocks = blocks_to_write(&note::parse_note(current), results, held);
        note::render::lines_added_above(
            current,
            &blocks,
            &extra_properties(current, note_id, runner),
        )
    };
    for i in fresh {
        results[*i] = note::render::moved_down(&results[*i], added);
    }
}

/// `current` with the results and the questions of `held` appended (what it shows already is
/// not repeated), `tool_status` set to `next`, `runner` stamped as its `tool_runner` (§9.9:
/// whoever updates a note is its runner from now on) and `tool_note` added when missing. None
/// when it carries another `tool_note` than `note_id` (empty: any): another note.
pub fn append_results(
    current: &str,
    note_id: &str,
    results: &[CallResult],
    held: &[HeldCall],
    next: State,
    runner: &str,
    now: SystemTime,
) -> Option<String> {
    if note::frontmatter_property(current, "tool_note")
        .is_some_and(|id| !note_id.is_empty() && id != note_id)
    {
        return None;
    }
    let pick = |cur: &note::ParsedNote| blocks_to_write(cur, results, held);
    let extra = extra_properties(current, note_id, runner);
    Some(note::append_and_set(
        current,
        pick,
        next.as_str(),
        now,
        &extra,
    ))
}

/// Where a note goes after its run: Pending_Approval while a call waits for a person, Failed
/// when a result failed (now, or before a crash in the run being continued: a kill between
/// the write and the move must not turn Failed into Done, §8.5), else Done.
pub(crate) fn next_state(
    waiting: bool,
    failed_before_crash: bool,
    results: &[CallResult],
) -> State {
    if waiting {
        State::PendingApproval
    } else if failed_before_crash || results.iter().any(|r| !r.is_ok()) {
        State::Failed
    } else {
        State::Done
    }
}

/// Why a note ends where it ends, for its one log line.
pub(crate) fn outcome_reason(results: &[CallResult], held: &[HeldCall], waiting: bool) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{CallError, ErrorCode};
    use crate::pipeline::plan::rejected_result;

    const CALL: &str = "# A\n```json\n{\"tool_call\": {\"name\": \"t\", \"parameters\": {}, \"id\": \"a\"}}\n```\n";

    fn failed(call_id: &str) -> CallResult {
        CallResult::failed_now(call_id, "t", CallError::new(ErrorCode::Timeout, "slow"))
    }

    fn append(current: &str, note_id: &str, results: &[CallResult]) -> Option<String> {
        append_results(
            current,
            note_id,
            results,
            &[],
            State::Failed,
            "host-beef",
            SystemTime::now(),
        )
    }

    #[test]
    fn results_are_appended_once_with_status_runner_and_note_id() {
        let once = append(CALL, "n-000000000001", &[failed("a")]).unwrap();
        let parsed = parse_note(&once);
        assert!(parsed.has_result("a"), "{once}");
        assert_eq!(
            note::frontmatter_property(&once, "tool_status"),
            Some("failed")
        );
        assert_eq!(
            note::frontmatter_property(&once, "tool_runner"),
            Some("host-beef")
        );
        assert_eq!(
            note::frontmatter_property(&once, "tool_note"),
            Some("n-000000000001")
        );
        let twice = append(&once, "n-000000000001", &[failed("a")]).unwrap();
        assert_eq!(parse_note(&twice).results.len(), 1, "{twice}");
    }

    #[test]
    fn another_notes_text_is_not_written_into() {
        let theirs = note::set_note_id(CALL, "n-00000000000f");
        assert_eq!(append(&theirs, "n-000000000001", &[failed("a")]), None);
        // Without an id of our own (a rejection), any note takes the results.
        let rejected = append(&theirs, "", &[rejected_result("a", "t")]).unwrap();
        assert_eq!(
            note::frontmatter_property(&rejected, "tool_note"),
            Some("n-00000000000f")
        );
        assert_eq!(
            note::frontmatter_property(&rejected, "tool_runner"),
            Some("host-beef")
        );
    }

    #[test]
    fn a_waiting_call_goes_to_pending_approval_a_failure_to_failed() {
        let ok = Vec::new();
        assert_eq!(
            next_state(true, true, &[failed("a")]),
            State::PendingApproval
        );
        assert_eq!(next_state(false, false, &[failed("a")]), State::Failed);
        assert_eq!(next_state(false, true, &ok), State::Failed);
        assert_eq!(next_state(false, false, &ok), State::Done);
    }
}
