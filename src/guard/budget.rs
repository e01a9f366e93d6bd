//! The note budget (docs/design.md §12.2): at most `note_budget` calls ever run for one note, across
//! rounds, so a runaway agent loop stops by itself. The count comes from the journal.

use crate::call::{CallError, ErrorCode};
use crate::journal::{Journal, JournalError};

/// How many calls have ever started for the note with identity `note_id` (its `tool_note`,
/// docs/design.md §9.2), across all its rounds and whatever it was renamed to meanwhile.
pub fn calls_started(journal: &Journal, note_id: &str) -> Result<u64, JournalError> {
    journal.calls_started_for_note(note_id)
}

/// How many more calls may start, given the budget and the calls already started.
pub fn remaining(budget: u64, started: u64) -> u64 {
    budget.saturating_sub(started)
}

/// The result of a call over the budget.
pub fn spent(budget: u64) -> CallError {
    CallError::new(
        ErrorCode::QuotaExceeded,
        format!(
            "note budget spent: at most {budget} calls run for one note (note_budget); start a new note to go on"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::CallResult;
    use crate::tools::Effect;

    #[test]
    fn counts_started_calls_of_every_run_of_the_note() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        for round in 0..3 {
            // The agent renames the note between rounds: its identity stays.
            let run = j
                .begin_note_run(
                    &format!("In_Progress/loop-{round}.md"),
                    Some("n-00000000loop"),
                    None,
                    None,
                )
                .unwrap();
            j.call_started(
                run,
                &format!("c-{round}"),
                "search_web",
                Effect::ReadOnly,
                &serde_json::json!({}),
            )
            .unwrap();
            // A call that never started (a quota result) does not count.
            j.call_finished(
                run,
                &CallResult::failed_now(&format!("q-{round}"), "search_web", spent(1)),
            )
            .unwrap();
            j.note_moved(run, "Done/loop.md", true).unwrap();
        }
        let other = j
            .begin_note_run("In_Progress/other.md", Some("n-0000000other"), None, None)
            .unwrap();
        j.call_started(
            other,
            "c-x",
            "search_web",
            Effect::ReadOnly,
            &serde_json::json!({}),
        )
        .unwrap();
        // A read_only start is not waited for (journal module doc): visible once flushed.
        j.flush().unwrap();
        assert_eq!(calls_started(&j, "n-00000000loop").unwrap(), 3);
        assert_eq!(calls_started(&j, "n-0000000other").unwrap(), 1);
        assert_eq!(remaining(2, 3), 0);
        assert_eq!(remaining(100, 3), 97);
        assert!(spent(100).message.starts_with("note budget spent"));
    }
}
