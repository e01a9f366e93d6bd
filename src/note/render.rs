//! Pure: results and approval notices -> callout text, appended to a note; the four
//! frontmatter properties set without touching any other line.

use crate::call::{CallError, CallResult, HeldCall, rfc3339_millis, rfc3339_seconds};
use crate::note::parse::{ParsedNote, analyze, parse_note};
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
}

/// Appends `blocks` to `text` (DESIGN §3, §8.11) and sets `tool_status` to `status`,
/// `tool_calls`/`tool_errors` counted from the result blocks of the new text, and
/// `tool_updated` to `now`. With no blocks this is [`set_properties`].
pub fn append_blocks(text: &str, blocks: &[Block<'_>], status: &str, now: SystemTime) -> String {
    if blocks.is_empty() {
        return set_properties(text, status, now);
    }
    let analysis = analyze(text);
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
        };
        for line in lines {
            out.push_str(&line);
            out.push_str(eol);
        }
    }
    set_properties(&out, status, now)
}

/// Counts the result blocks of `text` and sets the four frontmatter properties (creating the
/// frontmatter when the note has none); appends nothing.
pub fn set_properties(text: &str, status: &str, now: SystemTime) -> String {
    let note = parse_note(text);
    let calls = note.results.len();
    let errors = note.results.iter().filter(|r| !r.ok).count();
    let props = [
        ("tool_status", one_line(status)),
        ("tool_calls", calls.to_string()),
        ("tool_errors", errors.to_string()),
        ("tool_updated", rfc3339_seconds(now)),
    ];
    set_frontmatter(text, &note, &props)
}

/// Replaces the line of each property (and its indented continuation lines), inserts the
/// missing ones before the closing `---`; every other byte stays as it was.
fn set_frontmatter(text: &str, note: &ParsedNote, props: &[(&str, String)]) -> String {
    let eol = note.line_ending.as_str();
    let mut out = String::with_capacity(text.len() + 160);
    let Some(span) = note.frontmatter.clone() else {
        let at = if note.bom { 3 } else { 0 };
        out.push_str(&text[..at]);
        out.push_str("---");
        out.push_str(eol);
        for (key, value) in props {
            push_property(&mut out, key, value, eol);
        }
        out.push_str("---");
        out.push_str(eol);
        out.push_str(&text[at..]);
        return out;
    };

    let lines: Vec<&str> = text[span.clone()].split_inclusive('\n').collect();
    let closer = lines.len() - 1;
    let mut written = vec![false; props.len()];
    out.push_str(&text[..span.start]);
    out.push_str(lines[0]);
    let mut i = 1;
    while i < closer {
        let line = lines[i];
        let hit = props.iter().position(|(key, _)| {
            line.strip_prefix(key)
                .is_some_and(|rest| rest.starts_with(':'))
        });
        match hit {
            Some(k) => {
                push_property(&mut out, props[k].0, &props[k].1, eol);
                written[k] = true;
                i += 1;
                while i < closer && is_continuation(lines[i]) {
                    i += 1;
                }
            }
            None => {
                out.push_str(line);
                i += 1;
            }
        }
    }
    for ((key, value), done) in props.iter().zip(&written) {
        if !done {
            push_property(&mut out, key, value, eol);
        }
    }
    out.push_str(lines[closer]);
    out.push_str(&text[span.end..]);
    out
}

fn push_property(out: &mut String, key: &str, value: &str, eol: &str) {
    out.push_str(key);
    out.push_str(": ");
    out.push_str(value);
    out.push_str(eol);
}

/// A line that belongs to the YAML value above it: indented, or a `- item` of a sequence.
fn is_continuation(line: &str) -> bool {
    line.starts_with([' ', '\t'])
        || line == "-\n"
        || line == "-\r\n"
        || line.starts_with("- ")
        || line.starts_with("-\t")
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
            format!("[!failure]- {} · {} · {ms} ms", result.name, error.code),
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
    let mut lines = vec![format!("> {}", one_line(&title))];
    push_json_fence(&mut lines, &doc);
    lines
}

/// The lines of an open `[!question]` callout: what will run and why it waits for a person.
fn held_callout(held: &HeldCall) -> Vec<String> {
    let title = format!(
        "[!question] Approval needed · {} · {}",
        held.name, held.call_id
    );
    let mut lines = vec![format!("> {}", one_line(&title))];
    for line in held.reason.lines() {
        lines.push(format!("> {}", inert_line(line)));
    }
    let doc = ApprovalDoc {
        tool_approval: ApprovalBody {
            call_id: &held.call_id,
            name: &held.name,
            parameters: &held.parameters,
            reason: &held.reason,
        },
    };
    push_json_fence(&mut lines, &doc);
    lines
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
/// can close the fence early.
fn push_json_fence(lines: &mut Vec<String>, doc: &impl Serialize) {
    let json = serde_json::to_string_pretty(doc).expect("maps with string keys always serialize");
    lines.push("> ```json".to_string());
    lines.extend(json.split('\n').map(|l| format!("> {l}")));
    lines.push("> ```".to_string());
}
