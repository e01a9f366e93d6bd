//! Fuzzes the note parser and renderer: any UTF-8 text parses without panicking, appending a
//! result for each pending call keeps the original bytes, and afterwards nothing is pending.
//! Run: `cargo +nightly fuzz run parse_note -- -dict=fuzz/markdown.dict` (see README).
//! Crashers go into `tests/corpus/`, where `cargo test` replays them.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::time::SystemTime;
use vaultd::call::{CallError, CallResult, ErrorCode};
use vaultd::note::{Block, append_blocks, json_block_contents, parse_note};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = parse_note(text);
    let _ = json_block_contents(text);
    let results: Vec<CallResult> = parsed
        .pending_calls()
        .map(|c| {
            CallResult::failed_now(
                &c.call_id,
                c.name.as_deref().unwrap_or("tool_call"),
                CallError::new(ErrorCode::InvalidCall, "fuzz"),
            )
        })
        .collect();
    let blocks: Vec<Block<'_>> = results.iter().map(Block::Result).collect();
    let out = append_blocks(text, &blocks, "failed", SystemTime::UNIX_EPOCH);
    let kept = match &parsed.frontmatter {
        Some(fm) => &text[fm.end..],
        None => text.strip_prefix('\u{feff}').unwrap_or(text),
    };
    assert!(out.contains(kept), "original bytes lost");
    let after = parse_note(&out);
    assert!(
        after.pending_calls().next().is_none(),
        "a call is still pending"
    );
    assert_eq!(after.results.len(), parsed.results.len() + results.len());
});
