//! Pure: results and approval notices -> callout text, appended to a note; the four
//! frontmatter properties (and `tool_note`, `tool_runner`) set through `frontmatter`, without
//! touching any other line.

use crate::call::{CallError, CallResult, HeldCall, rfc3339_millis, rfc3339_seconds};
use crate::note::frontmatter::{self, NewValue};
use crate::note::parse::{Analysis, ParsedNote, analyze, parse_note};
use crate::note::text::escape_untrusted;
use serde::Serialize;
use serde_json::{Map, Value};
use std::time::SystemTime;

/// One block vaultd appends to a note.
#[derive(Debug, Clone, Copy)]
pub enum Block<'a> {
    /// `> [!success]-` / `> [!failure]-` with a `tool_result` JSON.
    Result(&'a CallResult),
    /// `> [!question]` with a `tool_approval` JSON: what will run and why it is held.
    Held(&'a HeldCall),
    /// `> [!example]-` with a `tool_preview` JSON: what a dry run would do (docs/design.md §12.1).
    Preview(&'a Value),
}

/// Appends `blocks` to `text` (docs/design.md §3, §8.11) and sets `tool_status` to `status`,
/// `tool_calls`/`tool_errors` counted from the result blocks of the new text, and
/// `tool_updated` to `now`. With no blocks this is [`set_properties`].
pub fn append_blocks(text: &str, blocks: &[Block<'_>], status: &str, now: SystemTime) -> String {
    if blocks.is_empty() {
        return set_properties(text, status, now);
    }
    append_analyzed(text, &analyze(text), blocks, status, now, &[])
}

/// A results write in one pass over the note: the blocks `pick` chooses from the note as it
/// is are appended as [`append_blocks`] does, and the `extra` properties (`tool_runner`,
/// `tool_note`) are set with the four, after them. The note is parsed once, as it is: the
/// counts of the note as written follow from that parse and the blocks ([`Counts::after`]),
/// where appending and setting each property parsed it anew, five times per note (a tenth of
/// the daemon's CPU, as a profile under load showed).
pub fn append_and_set<'b>(
    text: &str,
    pick: impl FnOnce(&ParsedNote) -> Vec<Block<'b>>,
    status: &str,
    now: SystemTime,
    extra: &[(&str, &str)],
) -> String {
    let analysis = analyze(text);
    let blocks = pick(&analysis.note);
    if blocks.is_empty() {
        return set_parsed(text, &analysis.note, status, now, extra);
    }
    append_analyzed(text, &analysis, &blocks, status, now, extra)
}

fn append_analyzed(
    text: &str,
    analysis: &Analysis,
    blocks: &[Block<'_>],
    status: &str,
    now: SystemTime,
    extra: &[(&str, &str)],
) -> String {
    let appended = append_only(text, analysis, blocks);
    // Counted from the note as it was and the blocks, not by parsing what was written: each
    // block is one callout, parsed as such after the note (`append_only` closes what the
    // note leaves open), and adds nothing else that is counted.
    let counts = Counts::after(&analysis.note, blocks);
    set_counted(&appended, counts, status, now, extra)
}

/// What the four properties count: the note's result blocks, the failed ones, and its calls
/// without a result that a `[!question]` holds for a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    results: usize,
    errors: usize,
    held: usize,
}

impl Counts {
    /// The counts of a note parsed as `note`.
    pub(crate) fn of(note: &ParsedNote) -> Counts {
        Counts::after(note, &[])
    }

    /// The counts of a note parsed as `note` once `blocks` are appended to it.
    pub(crate) fn after(note: &ParsedNote, blocks: &[Block<'_>]) -> Counts {
        let new_results: Vec<&CallResult> = blocks
            .iter()
            .filter_map(|b| match b {
                Block::Result(r) => Some(*r),
                _ => None,
            })
            .collect();
        let done: std::collections::HashSet<&str> = note
            .results
            .iter()
            .map(|r| r.call_id.as_str())
            .chain(new_results.iter().map(|r| r.call_id.as_str()))
            .collect();
        let questions: std::collections::HashSet<&str> = note
            .held
            .iter()
            .map(|h| h.call_id.as_str())
            .chain(blocks.iter().filter_map(|b| match b {
                Block::Held(h) => Some(h.call_id.as_str()),
                _ => None,
            }))
            .collect();
        Counts {
            results: note.results.len() + new_results.len(),
            errors: note.results.iter().filter(|r| !r.ok).count()
                + new_results.iter().filter(|r| r.outcome.is_err()).count(),
            held: note
                .calls
                .iter()
                .filter(|c| !done.contains(c.call_id.as_str()))
                .filter(|c| questions.contains(c.call_id.as_str()))
                .count(),
        }
    }
}

/// How many lines a results write of `blocks` (with the `extra` properties) adds above the
/// body of `text`: the frontmatter properties it creates or adds. Every call block of the
/// note moves down by this much when it is written back.
pub fn lines_added_above(text: &str, blocks: &[Block<'_>], extra: &[(&str, &str)]) -> usize {
    let analysis = analyze(text);
    let appended = append_only(text, &analysis, blocks);
    // Any status and time: each property is one line whatever its value.
    let written = set_counted(
        &appended,
        Counts::after(&analysis.note, blocks),
        "failed",
        SystemTime::UNIX_EPOCH,
        extra,
    );
    written.matches('\n').count() - appended.matches('\n').count()
}

/// INVALID_JSON's (line, column) in `result`, when it is such a result.
pub fn json_position(result: &CallResult) -> Option<(u64, u64)> {
    let e = result.outcome.as_ref().err()?;
    if e.code != crate::call::ErrorCode::InvalidJson {
        return None;
    }
    let d = e.details.as_ref()?;
    Some((d.get("line")?.as_u64()?, d.get("column")?.as_u64()?))
}

/// The result with its INVALID_JSON line moved down by `added` lines, message and details
/// alike (docs/design.md §8.3: the line is counted in the note as written back, and the lines a
/// write adds above the call move it). The one place a position is moved.
pub fn moved_down(result: &CallResult, added: usize) -> CallResult {
    let mut r = result.clone();
    if added > 0
        && let Some((line, column)) = json_position(result)
        && let Err(e) = &mut r.outcome
    {
        let moved = line + added as u64;
        e.message = e.message.replacen(
            &format!("at line {line}, column {column}"),
            &format!("at line {moved}, column {column}"),
            1,
        );
        e.details = Some(serde_json::json!({ "line": moved, "column": column }));
    }
    r
}

/// `text` with the blocks appended and the frontmatter not yet touched.
pub(crate) fn append_only(text: &str, analysis: &Analysis, blocks: &[Block<'_>]) -> String {
    let eol = analysis.note.line_ending.as_str();
    let mut out = String::with_capacity(text.len() + 1024 * blocks.len());
    out.push_str(text);
    let bom_len = if analysis.note.bom { 3 } else { 0 };
    // §8.11: the original bytes stay a prefix; an empty note needs no line break first.
    if text.len() > bom_len && !text.ends_with('\n') {
        out.push_str(eol);
    }
    // An unclosed top-level fence (or unterminated `<!--`) would swallow every result.
    if let Some(closer) = &analysis.tail_closer {
        out.push_str(closer);
        out.push_str(eol);
    }
    for block in blocks {
        out.push_str(eol);
        let lines = match block {
            Block::Result(result) => result_callout(result),
            Block::Held(held) => held_callout(held),
            Block::Preview(preview) => preview_callout(preview),
        };
        for line in lines {
            out.push_str(&line);
            out.push_str(eol);
        }
    }
    out
}

/// Counts the result blocks of `text` and sets the four frontmatter properties (creating the
/// frontmatter when the note has none); appends nothing.
pub fn set_properties(text: &str, status: &str, now: SystemTime) -> String {
    set_parsed(text, &parse_note(text), status, now, &[])
}

/// [`set_properties`] of `text` parsed as `note`, and the `extra` properties after the four.
fn set_parsed(
    text: &str,
    note: &ParsedNote,
    status: &str,
    now: SystemTime,
    extra: &[(&str, &str)],
) -> String {
    set_counted(text, Counts::of(note), status, now, extra)
}

/// [`set_parsed`] with the note's [`Counts`].
fn set_counted(
    text: &str,
    counts: Counts,
    status: &str,
    now: SystemTime,
    extra: &[(&str, &str)],
) -> String {
    let Counts {
        results,
        errors,
        held,
    } = counts;
    let mut props = vec![
        ("tool_status", one_line(status)),
        ("tool_calls", results.to_string()),
        ("tool_errors", errors.to_string()),
    ];
    // Calls waiting for a person (a `[!question]` each, no result yet): shown once a note
    // has any, and kept up to date (back to 0) from then on.
    if held > 0 || frontmatter::has_property(text, "tool_held") {
        props.push(("tool_held", held.to_string()));
    }
    props.push(("tool_updated", rfc3339_seconds(now)));
    props.extend(extra.iter().map(|(key, value)| (*key, one_line(value))));
    set_lines(text, &props)
}

/// Sets the `tool_note` property (docs/design.md §9.2), creating the frontmatter when the note has
/// none; every other byte stays as it was.
pub fn set_note_id(text: &str, note_id: &str) -> String {
    set_lines(text, &[("tool_note", one_line(note_id))])
}

/// Sets `tool_runner` (docs/design.md §9.9): which daemon wrote the note last.
pub fn set_runner(text: &str, runner: &str) -> String {
    set_lines(text, &[("tool_runner", one_line(runner))])
}

/// What a claim writes (docs/design.md §9.2, §9.9): `tool_note`, `tool_runner`, and `tool_updated`
/// (so a replica's daemon sees a fresh claim, not the note's last round).
pub fn stamp_claim(text: &str, note_id: &str, runner: &str, now: SystemTime) -> String {
    set_lines(
        text,
        &[
            ("tool_note", one_line(note_id)),
            ("tool_runner", one_line(runner)),
            ("tool_updated", rfc3339_seconds(now)),
        ],
    )
}

/// Sets vaultd's own one-line properties (each value already one line).
fn set_lines(text: &str, props: &[(&str, String)]) -> String {
    let props: Vec<(&str, NewValue<'_>)> = props
        .iter()
        .map(|(key, value)| (*key, NewValue::Line(value)))
        .collect();
    frontmatter::set(text, &props)
}

/// Titles and property values are one line.
fn one_line(s: &str) -> String {
    s.replace("\r\n", " ").replace(['\r', '\n'], " ")
}

#[derive(Serialize)]
struct ResultDoc<'a> {
    tool_result: ResultBody<'a>,
}

/// Field order is the order in the note: call_id, name, ok, data | error, meta.
#[derive(Serialize)]
struct ResultBody<'a> {
    call_id: &'a str,
    name: &'a str,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a CallError>,
    meta: Meta,
}

#[derive(Serialize)]
struct Meta {
    started_at: String,
    ended_at: String,
    duration_ms: u64,
}

#[derive(Serialize)]
struct ApprovalDoc<'a> {
    tool_approval: ApprovalBody<'a>,
}

#[derive(Serialize)]
struct ApprovalBody<'a> {
    call_id: &'a str,
    name: &'a str,
    parameters: &'a Map<String, Value>,
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    question: Option<&'a Value>,
}

/// The lines of a folded `[!success]-` / `[!failure]-` callout, without line breaks.
fn result_callout(result: &CallResult) -> Vec<String> {
    let ms = result.duration_ms();
    let (title, data, error) = match &result.outcome {
        Ok(output) => {
            let title = if output.summary.trim().is_empty() {
                format!("[!success]- {} · {ms} ms", result.name)
            } else {
                format!("[!success]- {} · {} · {ms} ms", result.name, output.summary)
            };
            (title, Some(&output.data), None)
        }
        Err(error) => (
            format!("[!failure]- {}", failure_title(result, error, ms)),
            None,
            Some(error),
        ),
    };
    let doc = ResultDoc {
        tool_result: ResultBody {
            call_id: &result.call_id,
            name: &result.name,
            ok: result.outcome.is_ok(),
            data,
            error,
            meta: Meta {
                started_at: rfc3339_millis(result.started_at),
                ended_at: rfc3339_millis(result.ended_at),
                duration_ms: ms,
            },
        },
    };
    // The title quotes tool output (the summary): untrusted text, escaped (docs/design.md §12.5).
    let mut lines = vec![format!("> {}", escape_untrusted(&one_line(&title)))];
    push_json_fence(&mut lines, &doc);
    lines
}

/// What the agent needs first: which call, what went wrong, where. A block that never became
/// a call is a "broken call", named by its position: "broken call · INVALID_JSON at 12:5".
fn failure_title(result: &CallResult, error: &CallError, ms: u64) -> String {
    use crate::call::ErrorCode;
    let broken = matches!(error.code, ErrorCode::InvalidJson | ErrorCode::InvalidCall);
    if !broken {
        return format!("{} · {} · {ms} ms", result.name, error.code);
    }
    let name = if result.name == "tool_call" {
        "broken call"
    } else {
        result.name.as_str()
    };
    match json_position(result) {
        Some((line, column)) => format!("{name} · {} at {line}:{column}", error.code),
        None => format!("{name} · {}", error.code),
    }
}

/// The lines of an open `[!question]` callout: what will run and why it waits for a person.
/// A server's question (docs/design.md §10.4) is followed, outside the callout, by the
/// `tool_answer` block the person fills in.
fn held_callout(held: &HeldCall) -> Vec<String> {
    let title = match &held.question {
        None => format!(
            "[!question] Approval needed · {} · {}",
            held.name, held.call_id
        ),
        Some(_) => format!(
            "[!question] Answer needed · {} · {}",
            held.name, held.call_id
        ),
    };
    let mut lines = vec![format!("> {}", one_line(&title))];
    // The reason may quote a server's question: untrusted text (§12.5).
    for line in held.reason.lines() {
        lines.push(format!("> {}", escape_untrusted(&inert_line(line))));
    }
    let doc = ApprovalDoc {
        tool_approval: ApprovalBody {
            call_id: &held.call_id,
            name: &held.name,
            parameters: &held.parameters,
            reason: &held.reason,
            question: held.question.as_ref(),
        },
    };
    push_json_fence(&mut lines, &doc);
    if let Some(question) = &held.question {
        let answer = serde_json::json!({ "tool_answer": {
            "call_id": held.call_id,
            "answer": answer_template(question),
        }});
        let json = serde_json::to_string_pretty(&answer).expect("JSON values serialize");
        // A blank line ends the callout: the answer is plain note text, easy to edit.
        lines.push(String::new());
        lines.push("```json".to_string());
        lines.extend(escape_untrusted(&json).split('\n').map(str::to_string));
        lines.push("```".to_string());
    }
    lines
}

/// The `answer` a person fills in below a server's question (docs/design.md §10.4): each
/// field with its default (or null); one object per ask when the server asked several.
pub fn answer_template(question: &Value) -> Value {
    let fields = |ask: &Value| -> Value {
        let mut out = Map::new();
        if let Some(props) = ask["schema"]["properties"].as_object() {
            for (field, p) in props {
                out.insert(
                    field.clone(),
                    p.get("default").cloned().unwrap_or(Value::Null),
                );
            }
        }
        Value::Object(out)
    };
    match question["asks"].as_array().map_or(&[][..], Vec::as_slice) {
        [one] => fields(one),
        several => Value::Object(
            several
                .iter()
                .map(|a| (a["key"].as_str().unwrap_or("").to_string(), fields(a)))
                .collect(),
        ),
    }
}

/// A reason line can quote note text (a recipient, a tool name). Escaping a leading
/// punctuation character keeps it plain paragraph text: it cannot open a fence or an HTML
/// block that would swallow the JSON below it.
fn inert_line(line: &str) -> String {
    let trimmed = line.trim_start();
    if trimmed.starts_with(|c: char| c.is_ascii_punctuation()) {
        format!("\\{trimmed}")
    } else {
        trimmed.to_string()
    }
}

/// "> ```json", the pretty JSON with every line quoted, "> ```". Pretty JSON lines start
/// with spaces and a JSON token and strings carry no raw line breaks, so nothing in them
/// can close the fence early. Bidi controls and zero-width characters are written as `\uXXXX`
/// escapes (the same JSON value), so the text cannot disguise what it says (docs/design.md §12.5).
pub(crate) fn push_json_fence(lines: &mut Vec<String>, doc: &impl Serialize) {
    let json = serde_json::to_string_pretty(doc).expect("maps with string keys always serialize");
    let json = escape_untrusted(&json);
    lines.push("> ```json".to_string());
    lines.extend(json.split('\n').map(|l| format!("> {l}")));
    lines.push("> ```".to_string());
}

/// The title line of a dry-run preview callout, up to the call's name.
pub const TITLE_PREFIX: &str = "> [!example]- preview · ";

/// The lines of one folded `[!example]-` callout (without line breaks).
pub fn preview_callout(preview: &Value) -> Vec<String> {
    let name = preview["name"].as_str().unwrap_or("tool_call");
    let call_id = preview["call_id"].as_str().unwrap_or("");
    let said = match preview["decision"]["action"].as_str().unwrap_or("?") {
        // The journal holds its result: written again, not run (docs/design.md §12.1).
        "recorded" => "already ran".to_string(),
        "later" => "would wait for a later round".to_string(),
        action => format!("would {action}"),
    };
    let title = format!("{name} · {said} · {call_id}").replace(['\r', '\n'], " ");
    let mut lines = vec![format!("{TITLE_PREFIX}{}", escape_untrusted(&title))];
    push_json_fence(&mut lines, &serde_json::json!({ "tool_preview": preview }));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{ErrorCode, ToolOutput};
    use crate::note::parse::{CallBody, LineEnding};
    use serde_json::json;
    use std::time::{Duration, UNIX_EPOCH};

    const CALL: &str = "```json\n{\"tool_call\": {\"name\": \"search_web\", \"parameters\": {\"query\": \"AI agents\", \"num_results\": 3}}}\n```\n";

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    /// 2023-11-14T22:14:20Z
    fn now() -> SystemTime {
        at(1_700_000_060_000)
    }

    fn success(call_id: &str, data: Value) -> CallResult {
        CallResult {
            call_id: call_id.into(),
            name: "search_web".into(),
            outcome: Ok(ToolOutput {
                data,
                summary: "1 result".into(),
                undo: None,
            }),
            started_at: at(1_700_000_000_104),
            ended_at: at(1_700_000_000_516),
        }
    }

    fn failure(call_id: &str) -> CallResult {
        CallResult {
            call_id: call_id.into(),
            name: "search_web".into(),
            outcome: Err(CallError::new(
                ErrorCode::InvalidJson,
                "invalid JSON at line 3, column 5: expected `,` or `}`",
            )
            .with_details(json!({"line": 3, "column": 5}))),
            started_at: at(1_700_000_000_104),
            ended_at: at(1_700_000_000_104),
        }
    }

    fn results_for(text: &str) -> Vec<CallResult> {
        parse_note(text)
            .pending_calls()
            .map(|c| match &c.body {
                CallBody::Call { .. } => success(&c.call_id, json!({"n": 1})),
                CallBody::Broken(_) => failure(&c.call_id),
            })
            .collect()
    }

    fn append_all(text: &str, results: &[CallResult]) -> String {
        let blocks: Vec<Block> = results.iter().map(Block::Result).collect();
        append_blocks(text, &blocks, "done", now())
    }

    #[test]
    fn success_block_exact() {
        let result = success(
            "c-3f2a9c1b0d4e",
            json!({"results": [{"title": "T", "url": "https://x"}]}),
        );
        let out = append_blocks("# Note\n", &[Block::Result(&result)], "done", now());
        let expected = "\
---
tool_status: done
tool_calls: 1
tool_errors: 0
tool_updated: 2023-11-14T22:14:20Z
---
# Note

> [!success]- search_web · 1 result · 412 ms
> ```json
> {
>   \"tool_result\": {
>     \"call_id\": \"c-3f2a9c1b0d4e\",
>     \"name\": \"search_web\",
>     \"ok\": true,
>     \"data\": {
>       \"results\": [
>         {
>           \"title\": \"T\",
>           \"url\": \"https://x\"
>         }
>       ]
>     },
>     \"meta\": {
>       \"started_at\": \"2023-11-14T22:13:20.104Z\",
>       \"ended_at\": \"2023-11-14T22:13:20.516Z\",
>       \"duration_ms\": 412
>     }
>   }
> }
> ```
";
        assert_eq!(out, expected);
    }

    #[test]
    fn an_invalid_json_line_counts_every_property_the_write_adds_above_it() {
        // The four properties and tool_runner and tool_note go above line 3: it moves to 9.
        let result = failure("c-1");
        let extra = [("tool_runner", "vaultd@h"), ("tool_note", "n-0123456789ab")];
        let text = "---\na: 1\n---\nx\n";
        let added = lines_added_above(text, &[Block::Result(&result)], &extra);
        assert_eq!(added, 6);
        let placed = moved_down(&result, added);
        let out = append_and_set(
            text,
            |_| vec![Block::Result(&placed)],
            "failed",
            now(),
            &extra,
        );
        assert!(out.contains("INVALID_JSON at 9:5"), "{out}");
        assert!(out.contains("invalid JSON at line 9, column 5"), "{out}");
        assert_eq!(
            lines_added_above(&out, &[], &extra),
            0,
            "written back again, nothing moves"
        );
        // A note without frontmatter gets `---` twice more; a held call adds `tool_held`.
        assert_eq!(
            lines_added_above("x\n", &[Block::Result(&result)], &extra),
            8
        );
        assert_eq!(
            moved_down(&success("c-2", json!(1)), 4),
            success("c-2", json!(1))
        );
    }

    #[test]
    fn failure_block_exact() {
        // The four properties go above line 3: INVALID_JSON's line, placed as written back,
        // is 7 (§8.3).
        let result = moved_down(&failure("c-1"), 4);
        let out = append_blocks(
            "---\na: 1\n---\nx\n",
            &[Block::Result(&result)],
            "failed",
            now(),
        );
        let expected = "\
---
a: 1
tool_status: failed
tool_calls: 1
tool_errors: 1
tool_updated: 2023-11-14T22:14:20Z
---
x

> [!failure]- search_web · INVALID_JSON at 7:5
> ```json
> {
>   \"tool_result\": {
>     \"call_id\": \"c-1\",
>     \"name\": \"search_web\",
>     \"ok\": false,
>     \"error\": {
>       \"code\": \"INVALID_JSON\",
>       \"message\": \"invalid JSON at line 7, column 5: expected `,` or `}`\",
>       \"retryable\": false,
>       \"details\": {
>         \"column\": 5,
>         \"line\": 7
>       }
>     },
>     \"meta\": {
>       \"started_at\": \"2023-11-14T22:13:20.104Z\",
>       \"ended_at\": \"2023-11-14T22:13:20.104Z\",
>       \"duration_ms\": 0
>     }
>   }
> }
> ```
";
        assert_eq!(out, expected);
    }

    #[test]
    fn held_block_exact_and_detected() {
        let mut parameters = Map::new();
        parameters.insert("recipient".into(), json!("bob@x.org"));
        let held = HeldCall {
            call_id: "c-9".into(),
            name: "send_notification".into(),
            parameters,
            reason: "recipient bob@x.org is not in allowed_recipients\n```json".into(),
            question: None,
        };
        let out = append_blocks(
            "---\ntool_status: in_progress\n---\n",
            &[Block::Held(&held)],
            "pending_approval",
            now(),
        );
        let expected = "\
---
tool_status: pending_approval
tool_calls: 0
tool_errors: 0
tool_updated: 2023-11-14T22:14:20Z
---

> [!question] Approval needed · send_notification · c-9
> recipient bob@x.org is not in allowed_recipients
> \\```json
> ```json
> {
>   \"tool_approval\": {
>     \"call_id\": \"c-9\",
>     \"name\": \"send_notification\",
>     \"parameters\": {
>       \"recipient\": \"bob@x.org\"
>     },
>     \"reason\": \"recipient bob@x.org is not in allowed_recipients\\n```json\"
>   }
> }
> ```
";
        assert_eq!(out, expected);
        let parsed = parse_note(&out);
        let hash = crate::note::params_hash("send_notification", &held.parameters);
        assert!(parsed.is_held("c-9"));
        assert!(parsed.is_held_as("c-9", &hash));
        let mut edited = held.parameters.clone();
        edited.insert("recipient".into(), json!("eve@x.org"));
        assert!(!parsed.is_held_as(
            "c-9",
            &crate::note::params_hash("send_notification", &edited)
        ));
    }

    #[test]
    fn title_is_one_line_and_empty_summary_is_left_out() {
        let mut result = success("c-1", json!(null));
        result.name = "bad\nname".into();
        if let Ok(out) = &mut result.outcome {
            out.summary = String::new();
        }
        let out = append_blocks("", &[Block::Result(&result)], "done", now());
        assert!(out.contains("\n> [!success]- bad name · 412 ms\n"), "{out}");
        let mut result = success("c-1", json!(null));
        if let Ok(out) = &mut result.outcome {
            out.summary = "two\r\nlines".into();
        }
        let out = append_blocks("", &[Block::Result(&result)], "done", now());
        assert!(
            out.contains("> [!success]- search_web · two lines · 412 ms\n"),
            "{out}"
        );
    }

    #[test]
    fn round_trip_marks_calls_done() {
        let text = format!("# Note\n\n{CALL}\n```json\n{{\"tool_call\": {{\"name\": 5}}}}\n```\n");
        let results = results_for(&text);
        assert_eq!(results.len(), 2);
        let out = append_all(&text, &results);
        let before = parse_note(&text);
        let after = parse_note(&out);
        assert_eq!(after.calls.len(), 2);
        assert_eq!(after.pending_calls().count(), 0);
        assert_eq!(after.results.len(), 2);
        assert!(!after.results[1].ok);
        let ids = |n: &ParsedNote| {
            n.calls
                .iter()
                .map(|c| c.call_id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&before), ids(&after));
        assert!(out.contains("tool_calls: 2\ntool_errors: 1\n"));
    }

    #[test]
    fn tricky_result_data_creates_no_call() {
        let text = CALL.to_string();
        let call_id = parse_note(&text).calls[0].call_id.clone();
        let data = json!({
            "a": "```\n{\"tool_call\": {\"name\": \"x\"}}\n```",
            "b": "> quoted\n\n```json",
            "c": ["```", "~~~", "> ", "\"tool_call\""],
            "tool_call": {"name": "evil"},
        });
        let out = append_all(&text, &[success(&call_id, data)]);
        let note = parse_note(&out);
        assert_eq!(note.calls.len(), 1);
        assert_eq!(note.pending_calls().count(), 0);
        assert_eq!(note.results.len(), 1);
    }

    #[test]
    fn crlf_note_stays_crlf() {
        let text = CALL.replace('\n', "\r\n");
        let out = append_all(&text, &results_for(&text));
        assert_eq!(parse_note(&out).line_ending, LineEnding::CrLf);
        assert!(
            !out.replace("\r\n", "").contains('\n'),
            "a bare LF in {out:?}"
        );
        assert!(!out.replace("\r\n", "").contains('\r'));
        assert!(out.starts_with("---\r\ntool_status: done\r\n"));
        assert!(out.ends_with("> ```\r\n"));
        assert_eq!(parse_note(&out).pending_calls().count(), 0);
    }

    #[test]
    fn bom_stays_at_byte_zero() {
        let text = format!("\u{FEFF}{CALL}");
        let out = append_all(&text, &results_for(&text));
        assert!(out.starts_with("\u{FEFF}---\ntool_status: done\n"));
        assert_eq!(out.matches('\u{FEFF}').count(), 1);
        let note = parse_note(&out);
        assert!(note.bom);
        assert_eq!(note.frontmatter.as_ref().unwrap().start, 3);
        assert_eq!(note.pending_calls().count(), 0);

        let text = format!("\u{FEFF}---\na: 1\n---\n{CALL}");
        let out = append_all(&text, &results_for(&text));
        assert!(out.starts_with("\u{FEFF}---\na: 1\ntool_status: done\n"));
    }

    #[test]
    fn missing_final_newline_is_added_and_original_stays_prefix() {
        let text = CALL.trim_end_matches('\n').to_string();
        let out = append_all(&text, &results_for(&text));
        let body = &out[parse_note(&out).frontmatter.unwrap().end..];
        assert!(
            body.starts_with(&format!("{text}\n\n> [!success]- ")),
            "{body}"
        );
        assert!(out.ends_with("> ```\n"));
    }

    #[test]
    fn each_block_follows_one_blank_line() {
        let a = success("a", json!(1));
        let b = failure("b");
        let out = append_blocks(
            "x\n",
            &[Block::Result(&a), Block::Result(&b)],
            "failed",
            now(),
        );
        assert!(out.contains("x\n\n> [!success]-"));
        assert!(out.contains("> ```\n\n> [!failure]-"));
        assert!(!out.contains("\n\n\n"));
    }

    #[test]
    fn frontmatter_edit_touches_only_the_four_keys() {
        let text = "\
---
title: My note
# a comment
tool_status: needs_action
tags:
  - a
  - b
tool_calls: 7
tool_errors:
  - old
- older
tool_statuses: keep me
aliases: [x]
---
Body with
tool_status: this is body text
";
        let out = set_properties(text, "done", now());
        let expected = "\
---
title: My note
# a comment
tool_status: done
tags:
  - a
  - b
tool_calls: 0
tool_errors: 0
tool_statuses: keep me
aliases: [x]
tool_updated: 2023-11-14T22:14:20Z
---
Body with
tool_status: this is body text
";
        assert_eq!(out, expected);
        // Setting again changes only the values.
        let again = set_properties(&out, "failed", now() + Duration::from_secs(1));
        assert_eq!(
            again,
            expected
                .replace("tool_status: done", "tool_status: failed")
                .replace("22:14:20Z", "22:14:21Z")
        );
    }

    #[test]
    fn frontmatter_created_when_missing() {
        assert_eq!(
            set_properties("", "done", now()),
            "---\ntool_status: done\ntool_calls: 0\ntool_errors: 0\ntool_updated: 2023-11-14T22:14:20Z\n---\n"
        );
        let out = set_properties("# Hi\r\nthere", "done", now());
        assert_eq!(
            out,
            "---\r\ntool_status: done\r\ntool_calls: 0\r\ntool_errors: 0\r\ntool_updated: 2023-11-14T22:14:20Z\r\n---\r\n# Hi\r\nthere"
        );
        // A leading hr is not frontmatter; the new one goes above it and the hr survives.
        let out = set_properties("---\n\ntext\n", "done", now());
        assert!(out.ends_with("---\n---\n\ntext\n"));
        assert_eq!(
            parse_note(&out).frontmatter.unwrap().end,
            out.len() - "---\n\ntext\n".len()
        );
    }

    #[test]
    fn frontmatter_at_end_of_file_without_newline() {
        let out = set_properties("---\na: 1\n---", "done", now());
        assert_eq!(
            out,
            "---\na: 1\ntool_status: done\ntool_calls: 0\ntool_errors: 0\ntool_updated: 2023-11-14T22:14:20Z\n---"
        );
    }

    #[test]
    fn unclosed_top_level_fence_is_closed_before_results() {
        for text in [
            format!("{CALL}\n```python\nprint(1)\n"),
            format!("{CALL}\n````\ncode"),
            format!("{CALL}\n~~~~\n"),
            "```json\n{\"tool_call\": {\"name\": \"x\"}}\n".to_string(),
            "```json\n{\"tool_call\": {\"name\": \"x\"}}".to_string(),
            // Found by the proptest: a blank last line without a line break.
            "```json\ntext\n{\"tool_call\": {\"name\": \"t\"}}\n   ".to_string(),
        ] {
            let results = results_for(&text);
            assert!(!results.is_empty());
            let out = append_all(&text, &results);
            let before = parse_note(&text);
            let after = parse_note(&out);
            assert_eq!(after.results.len(), results.len(), "{out}");
            assert_eq!(after.pending_calls().count(), 0, "{out}");
            assert_eq!(before.calls.len(), after.calls.len());
        }
    }

    #[test]
    fn unterminated_html_at_the_end_is_terminated_before_results() {
        for (tail, closer) in [
            ("<!-- note to self\n", "-->"),
            ("<pre>\nsome", "</pre>"),
            ("<?php\n", "?>"),
        ] {
            let text = format!("{CALL}\n{tail}");
            let out = append_all(&text, &results_for(&text));
            assert!(
                out.contains(&format!("\n{closer}\n\n> [!success]-")),
                "{out}"
            );
            assert_eq!(parse_note(&out).pending_calls().count(), 0, "{out}");
        }
        // Terminated HTML needs nothing.
        let text = format!("{CALL}\n<!-- done -->\n");
        let out = append_all(&text, &results_for(&text));
        assert!(out.contains("<!-- done -->\n\n> [!success]-"));
    }

    #[test]
    fn results_after_open_containers_are_found() {
        for tail in [
            "- item\n  ```json\n  {\"tool_call\": {\"name\": \"x\"}}\n",
            "> quote\n> ```\n> open",
            "- list\n  continued",
            "    indented code",
            "<div>\nhtml",
            "| a | b |\n|---|---|",
            "[ref]: https://example.com",
        ] {
            let text = format!("{CALL}\n{tail}");
            let results = results_for(&text);
            let out = append_all(&text, &results);
            let note = parse_note(&out);
            assert_eq!(note.pending_calls().count(), 0, "{out}");
            assert_eq!(note.results.len(), results.len(), "{out}");
        }
    }

    #[test]
    fn note_id_is_added_once_and_nothing_else_changes() {
        let text = "# A\r\nbody\r\n";
        let with = set_note_id(text, "n-0123456789ab");
        assert_eq!(
            with,
            "---\r\ntool_note: n-0123456789ab\r\n---\r\n# A\r\nbody\r\n"
        );
        assert_eq!(set_note_id(&with, "n-0123456789ab"), with, "idempotent");
        let fm = "---\ntitle: t\n---\nx";
        assert_eq!(
            set_note_id(fm, "n-1"),
            "---\ntitle: t\ntool_note: n-1\n---\nx"
        );
        // Later writes keep it.
        let later = append_blocks(&with, &[], "done", now());
        assert!(later.contains("tool_note: n-0123456789ab\r\n"), "{later}");
    }

    #[test]
    fn no_blocks_only_sets_properties() {
        assert_eq!(
            append_blocks("x", &[], "done", now()),
            set_properties("x", "done", now())
        );
    }
}
