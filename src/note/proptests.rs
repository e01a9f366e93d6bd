//! Property tests across parse and render: whatever the note, appending results keeps every
//! original byte and marks exactly the pending calls done.

use crate::call::{CallError, CallResult, ErrorCode, HeldCall, ToolOutput};
use crate::note::parse::{CallBody, parse_note};
use crate::note::render::{Block, append_blocks};
use proptest::prelude::*;
use std::collections::HashSet;
use std::time::{Duration, UNIX_EPOCH};

/// Pieces of markdown, single lines or whole blocks (`\n` becomes the note's line ending).
const PIECES: &[&str] = &[
    "",
    "",
    "   ",
    "\t",
    "Some text with `code` and *emphasis*.",
    "é ü 😀 \u{200B}",
    "# Heading",
    "---",
    "***",
    "===",
    "- item",
    "  - nested item",
    "1. step",
    "   continued",
    "    indented code",
    "> quote",
    "> > nested quote",
    "> [!note] callout",
    ">",
    "<div>",
    "</div>",
    "<!--",
    "-->",
    "<pre>",
    "</pre>",
    "<?php",
    "<![CDATA[",
    "<!DOCTYPE",
    "```",
    "````",
    "~~~",
    "```json",
    "~~~json",
    "  ```json",
    "- ```json",
    "> ```json",
    "```python",
    "  ```",
    "   ~~~",
    "- <!--",
    "> <pre>",
    "- \t```json",
    "* [ ] task",
    "```JSON tool",
    "```jsonc",
    r#"{"tool_call": {"name": "t", "parameters": {"k": 1}}}"#,
    r#"{"tool_call": {"name": "t", "id": "fixed"}}"#,
    r#"{"tool_call": {"name": "#,
    r#"{"tool_call": 5}"#,
    r#"{"a": 1}"#,
    r#"  {"tool_call": {"name": "u"}}"#,
    r#"> {"tool_result": {"call_id": "fixed", "ok": true}}"#,
    "```json\n{\"tool_call\": {\"name\": \"t\"}}\n```",
    "```json\n{\"tool_call\": {\"name\": \"t\"}}\n```",
    "~~~json\n{\"tool_call\": {\"name\": \"v\", \"parameters\": {\"q\": \"x\"}}}\n~~~",
    "- ```json\n  {\"tool_call\": {\"name\": \"w\"}}\n  ```",
    "```json\n{\"tool_call\": {\"name\": \"t\" \"x\"}}\n```",
    "> ```json\n> {\"tool_call\": {\"name\": \"quoted\"}}\n> ```",
];

fn note_text() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        any::<bool>(),
        prop_oneof![
            Just(""),
            Just("---\ntitle: x\n---\n"),
            Just("---\ntool_status: old\ntool_calls:\n  - a\n---\n")
        ],
        prop::collection::vec(
            prop_oneof![
                4 => prop::sample::select(PIECES).prop_map(str::to_string),
                1 => "[ -~]{0,12}",
            ],
            0..24,
        ),
        any::<bool>(),
    )
        .prop_map(|(bom, crlf, frontmatter, lines, final_newline)| {
            let eol = if crlf { "\r\n" } else { "\n" };
            let mut text = String::new();
            if bom {
                text.push('\u{FEFF}');
            }
            text.push_str(frontmatter);
            text.push_str(&lines.join("\n"));
            if final_newline {
                text.push('\n');
            }
            text.replace('\n', eol)
        })
}

/// A call block of the tool `t` with the given query.
fn fence(query: &str) -> String {
    format!(
        "```json\n{{\"tool_call\": {{\"name\": \"t\", \"parameters\": {{\"q\": \"{query}\"}}}}}}\n```"
    )
}

fn result_for(call_id: &str, ok: bool) -> CallResult {
    let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    CallResult {
        call_id: call_id.to_string(),
        name: "t".to_string(),
        outcome: if ok {
            Ok(ToolOutput {
                data: serde_json::json!({"s": "```\n> x\n\"tool_call\""}),
                summary: "ok".into(),
                undo: None,
            })
        } else {
            Err(CallError::new(ErrorCode::InvalidCall, "bad"))
        },
        started_at: t,
        ended_at: t,
    }
}

/// Where the body starts: after the BOM and the frontmatter.
fn body(text: &str) -> &str {
    let note = parse_note(text);
    let start = match note.frontmatter {
        Some(span) => span.end,
        None if note.bom => 3,
        None => 0,
    };
    &text[start..]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn appending_keeps_the_note_and_completes_its_calls(text in note_text()) {
        let before = parse_note(&text);
        let results: Vec<CallResult> = before
            .pending_calls()
            .map(|c| result_for(&c.call_id, matches!(c.body, CallBody::Call { .. })))
            .collect();
        let blocks: Vec<Block> = results.iter().map(Block::Result).collect();
        let out = append_blocks(&text, &blocks, "done", UNIX_EPOCH + Duration::from_secs(1_800_000_000));
        let after = parse_note(&out);

        prop_assert_eq!(after.bom, before.bom);
        prop_assert_eq!(after.line_ending, before.line_ending);
        prop_assert!(after.frontmatter.is_some());
        prop_assert!(body(&out).starts_with(body(&text)), "original body is not a prefix:\n{:?}\n{:?}", text, out);
        if !blocks.is_empty() {
            prop_assert!(out.ends_with(before.line_ending.as_str()));
        }

        let old_ids: HashSet<&str> = before.calls.iter().map(|c| c.call_id.as_str()).collect();
        for call in &after.calls {
            prop_assert!(old_ids.contains(call.call_id.as_str()), "new call {} in\n{:?}", call.call_id, out);
        }
        for call in before.pending_calls() {
            prop_assert!(after.has_result(&call.call_id), "no result for {} in\n{:?}", call.call_id, out);
        }
        prop_assert_eq!(after.pending_calls().count(), 0, "pending left in\n{:?}", out);
        prop_assert_eq!(after.results.len(), before.results.len() + results.len());
    }

    #[test]
    fn the_one_pass_results_write_is_the_step_by_step_one(text in note_text()) {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let results: Vec<CallResult> = parse_note(&text)
            .pending_calls()
            .map(|c| result_for(&c.call_id, matches!(c.body, CallBody::Call { .. })))
            .collect();
        let blocks: Vec<Block> = results.iter().map(Block::Result).collect();
        let steps = append_blocks(&text, &blocks, "done", now);
        let steps = crate::note::set_runner(&steps, "vaultd@host");
        let steps = crate::note::set_note_id(&steps, "n-0123456789ab");
        let one = crate::note::append_and_set(
            &text,
            |_| blocks.clone(),
            "done",
            now,
            &[("tool_runner", "vaultd@host"), ("tool_note", "n-0123456789ab")],
        );
        prop_assert_eq!(one, steps);
    }

    #[test]
    fn the_counts_of_a_results_write_are_those_of_the_note_written(
        text in note_text(),
        kinds in prop::collection::vec(0u8..5, 24),
    ) {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        // Most generated notes hold no call: each gets two more (which a fence it leaves
        // open swallows, as it would in a note).
        let text = format!("{text}\n\n{}\n\n{}\n", fence("a"), fence("b"));
        let before = parse_note(&text);
        let pending: Vec<_> = before.pending_calls().collect();
        let results: Vec<CallResult> = pending
            .iter()
            .zip(&kinds)
            .map(|(c, k)| result_for(&c.call_id, *k == 0))
            .collect();
        // Every other one a server's question, which a `tool_answer` block follows.
        let held: Vec<HeldCall> = pending
            .iter()
            .enumerate()
            .map(|(i, c)| HeldCall {
                call_id: c.call_id.clone(),
                name: "t".into(),
                parameters: serde_json::Map::new(),
                reason: "held > `x`\n```".into(),
                question: (i % 2 == 1).then(|| serde_json::json!({
                    "message": "Which one?\n```json",
                    "requestedSchema": {"type": "object", "properties": {"pick": {"type": "string"}}}
                })),
            })
            .collect();
        let preview = serde_json::json!({"would": "```\n> [!success]-"});
        // Per pending call: a result (ok or failed), a question, a preview, or nothing.
        let blocks: Vec<Block> = kinds
            .iter()
            .zip(0..pending.len())
            .filter_map(|(k, i)| match k {
                0 | 1 => Some(Block::Result(&results[i])),
                2 => Some(Block::Held(&held[i])),
                3 => Some(Block::Preview(&preview)),
                _ => None,
            })
            .collect();
        let written = append_blocks(&text, &blocks, "done", now);
        let appended = if blocks.is_empty() {
            text.clone()
        } else {
            crate::note::render::append_only(&text, &crate::note::parse::analyze(&text), &blocks)
        };
        prop_assert_eq!(written, crate::note::render::set_properties(&appended, "done", now));
    }

    #[test]
    fn a_parse_moved_onto_the_stamped_note_is_its_own_parse(text in note_text()) {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let stamped = crate::note::stamp_claim(&text, "n-0123456789ab", "vaultd@host", now);
        let parsed = parse_note(&text);
        let broken = parsed.calls.iter().any(|c| matches!(c.body, CallBody::Broken(_)));
        match parsed.restamped(&text, &stamped) {
            Some(moved) => prop_assert_eq!(moved, parse_note(&stamped)),
            // Only a broken call (its error names a line) or a changed body is parsed again.
            None => prop_assert!(broken || body(&stamped) != body(&text), "{:?}", text),
        }
    }

    #[test]
    fn parse_never_panics(text in "(?s).{0,400}") {
        let _ = parse_note(&text);
    }

    #[test]
    fn set_properties_twice_is_stable(text in note_text()) {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let once = crate::note::render::set_properties(&text, "done", now);
        let twice = crate::note::render::set_properties(&once, "done", now);
        prop_assert_eq!(&once, &twice);
        prop_assert_eq!(body(&once), body(&text));
    }
}

#[test]
fn deeply_nested_markdown_does_not_overflow() {
    for unit in ["> ", "- ", "1. ", "[", "*", "<a>", "`", "~~~\n"] {
        let text = format!(
            "{}```json\n{{\"tool_call\": {{\"name\": \"t\"}}}}\n```\n",
            unit.repeat(20_000)
        );
        let _ = parse_note(&text);
    }
}
