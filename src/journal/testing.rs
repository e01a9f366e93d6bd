//! Helpers shared by the journal's unit tests.

use super::*;
use crate::call::Effect;
use crate::call::{CallError, CallResult, ErrorCode, ToolOutput};
use serde_json::json;
use std::time::{Duration, UNIX_EPOCH};
use tempfile::TempDir;

/// A journal in a fresh state dir; keep the dir alive as long as the journal.
pub(super) fn shape(calls: &[JournalCall]) -> Vec<(String, String, Effect, CallProgress)> {
    calls
        .iter()
        .map(|c| {
            (
                c.call_id.clone(),
                c.tool.clone(),
                c.effect,
                c.progress.clone(),
            )
        })
        .collect()
}

pub(super) fn fresh_journal() -> (TempDir, Journal) {
    let dir = tempfile::tempdir().expect("temp dir");
    let journal = Journal::open(dir.path()).expect("open journal");
    (dir, journal)
}

pub(super) fn search_ok(call_id: &str) -> CallResult {
    // Odd nanoseconds, to prove the times survive exactly.
    let started = UNIX_EPOCH + Duration::new(1_790_000_000, 123_456_789);
    CallResult {
        call_id: call_id.to_string(),
        name: "search_web".to_string(),
        outcome: Ok(ToolOutput {
            data: json!({ "results": [ { "title": "t", "url": "https://x.test/", "snippet": "ünï" } ] }),
            summary: "1 result".to_string(),
            undo: None,
        }),
        started_at: started,
        ended_at: started + Duration::from_nanos(412_000_001),
    }
}

pub(super) fn invalid_params(call_id: &str) -> CallResult {
    CallResult::failed_now(
        call_id,
        "search_web",
        CallError::new(ErrorCode::InvalidParams, "parameters do not match").with_details(
            json!({ "violations": [ { "pointer": "/query", "message": "is required" } ] }),
        ),
    )
}

pub(super) fn timed_out(call_id: &str) -> CallResult {
    CallResult::failed_now(
        call_id,
        "search_web",
        CallError::new(ErrorCode::Timeout, "no answer within 30 s"),
    )
}

pub(super) fn progress_of(journal: &Journal, note: &str) -> Vec<(String, CallProgress)> {
    journal
        .run_for_note(note)
        .expect("query")
        .expect("open run")
        .calls
        .into_iter()
        .map(|c| (c.call_id, c.progress))
        .collect()
}

pub(super) fn start_search(journal: &Journal, run: RunId, call_id: &str) {
    journal
        .call_started(
            run,
            call_id,
            "search_web",
            Effect::ReadOnly,
            &json!({ "query": "q" }),
        )
        .expect("call_started");
}

pub(super) fn start_send(journal: &Journal, run: RunId, call_id: &str) {
    journal
        .call_started(
            run,
            call_id,
            "send_notification",
            Effect::ExternalSideEffect,
            &json!({ "recipient": "me@example.com" }),
        )
        .expect("call_started");
}
