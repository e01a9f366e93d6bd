//! Write back and next state, decided: which blocks a run appends to its note and with which
//! properties ([`append_results`]), where the note goes next ([`next_state`]) and why
//! ([`outcome_reason`]). The daemon does the writing and the move (`daemon::write_back`).

use crate::call::{CallResult, HeldCall};
use crate::note::{self, Block};
use crate::vault::State;
use std::time::SystemTime;

/// Where a run's note goes next and why; `foreign`: ids of outcomes another run owns, written
/// into the note but not recorded as this run's.
pub(crate) struct Ending<'a> {
    pub next: State,
    pub reason: &'a str,
    pub foreign: &'a std::collections::HashSet<String>,
    /// Ids whose result blocks were already in the note while the journal had them only as
    /// recorded: the "written" mark a crash took (it is not waited for), recorded now.
    pub in_note: &'a [String],
    /// The run's outcomes still committing (`Journal::call_finished_later`):
    /// settled after the results write, before the move.
    pub committed: Vec<crate::journal::Committed>,
    /// The note's text as the run last read or wrote it: the results write takes it for the
    /// note's without reading it again, unless the note changed since
    /// (`note::update_note_settling`).
    pub last_seen: &'a str,
    /// The results write's temp file, made while the calls ran (`Daemon::temp_ahead`).
    pub ahead: Option<crate::note::TempFile>,
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
    use crate::note::parse_note;
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
