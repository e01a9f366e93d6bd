//! Pure: note text -> the tool calls it holds (with ids, lines, byte spans), the results and
//! approval notices already written, and the frontmatter span (found by `frontmatter`).
//! Parsed with pulldown-cmark.

use crate::call::{CallError, ErrorCode};
use crate::note::frontmatter;
pub use crate::note::text::LineEnding;
use crate::note::text::detect_line_ending;
use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::ops::Range;

/// One `json` fenced block that is (or tried to be) a tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct CallBlock {
    /// Explicit `id`, or `c-` + 12 hex of SHA-256 of the canonical JSON; `-n` for the n-th duplicate.
    pub call_id: String,
    /// The tool name when one could be read (for broken blocks: None).
    pub name: Option<String>,
    /// 1-based line of the opening fence in the file (frontmatter included).
    pub line: usize,
    /// Byte span of the block in the text (opening fence to end of closing fence).
    pub span: Range<usize>,
    pub body: CallBody,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CallBody {
    /// Well-formed: name and parameters (absent parameters = `{}`). Not yet schema-checked.
    Call {
        name: String,
        parameters: Map<String, Value>,
    },
    /// INVALID_JSON or INVALID_CALL, ready to be written as the result.
    Broken(CallError),
}

/// A `tool_result` already in the note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultRef {
    pub call_id: String,
    pub ok: bool,
    /// A failed result's `error.code` and `error.message`, as written (for `vaultd check`).
    pub error: Option<(String, String)>,
}

/// The parse of one note.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedNote {
    /// The text starts with a UTF-8 BOM (kept on write).
    pub bom: bool,
    /// The note's line ending (of its first line break; LF when it has none).
    pub line_ending: LineEnding,
    /// Byte span of the YAML frontmatter, from the opening `---` to the end of the closing
    /// `---` line including its line break; None when the note has none.
    pub frontmatter: Option<Range<usize>>,
    /// Every call block outside blockquotes, in document order.
    pub calls: Vec<CallBlock>,
    /// Every `tool_result` block (inside callouts), in document order.
    pub results: Vec<ResultRef>,
    /// Every `[!question]` approval notice (`tool_approval` block) in the note.
    pub held: Vec<HeldRef>,
    /// Every `tool_answer` block (outside blockquotes): a person's answer to a server's
    /// question (docs/design.md §10.4), by call id, in document order.
    pub answers: Vec<(String, Result<Value, String>)>,
}

/// A `[!question]` approval notice: which call it asks about, and with what parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRef {
    pub call_id: String,
    /// [`params_hash`] of the `name` and `parameters` the question shows, so an approval
    /// counts only for exactly what the person saw. None when the notice does not show them.
    pub params_hash: Option<String>,
    /// For a server's question (docs/design.md §10.4): [`question_hash`] of the notice's
    /// `reason` and `question`, so the same question is written once and a new one (the
    /// next round's, or one asked again with why) is written beside it.
    pub question_hash: Option<String>,
}

impl ParsedNote {
    /// Calls with no result block: the ones to run.
    pub fn pending_calls(&self) -> impl Iterator<Item = &CallBlock> {
        // A set, not a scan per call: a note may hold thousands of calls and results.
        let done: std::collections::HashSet<&str> =
            self.results.iter().map(|r| r.call_id.as_str()).collect();
        self.calls
            .iter()
            .filter(move |c| !done.contains(c.call_id.as_str()))
    }

    /// True when the note holds calls and every one has a result: vaultd leaves it where it
    /// is, and says so ([`NOTHING_PENDING`]).
    pub fn nothing_pending(&self) -> bool {
        !self.calls.is_empty() && self.pending_calls().next().is_none()
    }

    pub fn has_result(&self, call_id: &str) -> bool {
        self.results.iter().any(|r| r.call_id == call_id)
    }

    pub fn is_held(&self, call_id: &str) -> bool {
        self.held.iter().any(|h| h.call_id == call_id)
    }

    /// The person's answer to the question of `call_id`: the last `tool_answer` block for it
    /// (or a broken one whose call id cannot be read), `Err` saying what is wrong with a
    /// broken one.
    pub fn answer_for(&self, call_id: &str) -> Option<Result<&Value, &str>> {
        self.answers
            .iter()
            .rev()
            .find(|(id, _)| id == call_id || id.is_empty())
            .map(|(_, a)| a.as_ref().map_err(String::as_str))
    }

    /// This parse of `old`, for `new`: a text that differs from `old` only in its frontmatter
    /// (the identity stamp adds one or changes it), so its calls' spans and lines move by
    /// what the frontmatter gained. None when anything after the frontmatter differs, or when
    /// a call is broken (its error names a line): `new` is then parsed afresh.
    pub fn restamped(mut self, old: &str, new: &str) -> Option<ParsedNote> {
        if self
            .calls
            .iter()
            .any(|c| matches!(c.body, CallBody::Broken(_)))
        {
            return None;
        }
        let (from, to) = (body_start(old), body_start(new));
        if old[from..] != new[to..] || old.starts_with('\u{FEFF}') != new.starts_with('\u{FEFF}') {
            return None;
        }
        let lines_before = |prefix: &str| prefix.bytes().filter(|&b| b == b'\n').count();
        let (old_lines, new_lines) = (lines_before(&old[..from]), lines_before(&new[..to]));
        for call in &mut self.calls {
            call.span = call.span.start - from + to..call.span.end - from + to;
            call.line = call.line - old_lines + new_lines;
        }
        self.frontmatter = frontmatter::span(new);
        self.line_ending = detect_line_ending(new);
        Some(self)
    }

    /// True when a question in the note asks about `call_id` with exactly the parameters
    /// hashed to `params_hash`: a call edited after its question was written is not.
    pub fn is_held_as(&self, call_id: &str, params_hash: &str) -> bool {
        self.held
            .iter()
            .any(|h| h.call_id == call_id && h.params_hash.as_deref() == Some(params_hash))
    }
}

/// What vaultd says of a note whose every call has a result (a finished note moved back
/// into a watched folder): the daemon's log once, `vaultd check` with the note.
pub const NOTHING_PENDING: &str =
    "nothing pending: every call has a result; delete a result to run it again";

/// Parses a note. Never fails: broken calls are `CallBody::Broken`.
pub fn parse_note(text: &str) -> ParsedNote {
    analyze(text).note
}

/// The content of every fenced block whose info string's first word is `json` (any case)
/// outside blockquotes, in document order, closed or not, as CommonMark defines it (indent
/// and container prefixes stripped, LF line breaks). The blocks [`parse_note`] reads calls
/// from; public for differential tests against other CommonMark implementations.
pub fn json_block_contents(text: &str) -> Vec<String> {
    scan_blocks(&text[body_start(text)..])
        .fences
        .into_iter()
        .filter(|f| f.is_json() && !f.in_quote)
        .map(|f| f.content)
        .collect()
}

/// A parse plus what the renderer must know to append safely.
pub(crate) struct Analysis {
    pub note: ParsedNote,
    /// A line to append (before any result) so that appended text is not swallowed by a
    /// construct the note leaves open at its very end: an unclosed top-level fence, or an
    /// unterminated `<!--`, `<pre>`, `<?`, `<!X`, `<![CDATA[` HTML block. Inside a
    /// blockquote or list item nothing is needed: the blank line before a callout ends them.
    pub tail_closer: Option<String>,
}

/// Where a note's body starts: after its frontmatter, else after its BOM.
fn body_start(text: &str) -> usize {
    let content_start = if text.starts_with('\u{FEFF}') {
        '\u{FEFF}'.len_utf8()
    } else {
        0
    };
    frontmatter::span(text).map_or(content_start, |r| r.end)
}

/// The full parse behind [`parse_note`].
pub(crate) fn analyze(text: &str) -> Analysis {
    let bom = text.starts_with('\u{FEFF}');
    // Frontmatter is cut off by hand and the rest parsed on its own, instead of letting
    // pulldown-cmark's YAML option find it: that option also turns a `---` hr in the middle
    // of a note (followed later by another `---`) into a "metadata block" and would hide
    // every call between them. Obsidian only knows frontmatter at the very top.
    let frontmatter = frontmatter::span(text);
    let body_start = body_start(text);
    let body = &text[body_start..];
    let lines = LineIndex::new(text);
    let scan = scan_blocks(body);

    let mut calls = Vec::new();
    let mut results = Vec::new();
    let mut held = Vec::new();
    let mut answers = Vec::new();
    let mut found_calls = Vec::new();
    for fence in scan.fences.iter().filter(|f| f.is_json()) {
        if fence.in_quote {
            record_notice(fence, &mut results, &mut held);
            continue;
        }
        if let Some(answer) = record_answer(fence) {
            answers.push(answer);
            continue;
        }
        if let Some(found) = classify_call(fence, body_start, &lines, text) {
            found_calls.push((fence, found));
        }
    }
    // §9.4: the n-th use of an id gets `-n`, skipping every id already used in the note, so
    // an explicit `x-2` and the second `x` never share an id.
    let mut used: std::collections::HashSet<String> =
        found_calls.iter().map(|(_, f)| f.base_id.clone()).collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (fence, found) in found_calls {
        let n = seen.entry(found.base_id.clone()).or_insert(0);
        *n += 1;
        let call_id = if *n == 1 {
            found.base_id
        } else {
            let mut candidate = format!("{}-{}", found.base_id, n);
            while used.contains(&candidate) {
                *n += 1;
                candidate = format!("{}-{}", found.base_id, n);
            }
            used.insert(candidate.clone());
            candidate
        };
        let span = fence.range.start + body_start..fence.range.end + body_start;
        calls.push(CallBlock {
            call_id,
            name: found.name,
            line: lines.line_of(span.start),
            span,
            body: found.body,
        });
    }

    Analysis {
        note: ParsedNote {
            bom,
            line_ending: detect_line_ending(text),
            frontmatter,
            calls,
            results,
            held,
            answers,
        },
        tail_closer: scan.tail_closer,
    }
}

/// Byte offset -> 1-based line number, for the whole file.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex { starts }
    }

    fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset)
    }

    fn start_of(&self, line: usize) -> usize {
        self.starts[line.saturating_sub(1).min(self.starts.len() - 1)]
    }
}

/// One fenced code block as pulldown-cmark saw it.
struct Fence {
    /// Body-relative span: opening fence to the end of the closing fence (or of the container).
    range: Range<usize>,
    info: String,
    /// The Text events concatenated: indentation and `> ` prefixes stripped, LF line breaks.
    content: String,
    /// (offset in `content`, body-relative source range) of each Text event, to map a JSON
    /// error position back to the file.
    pieces: Vec<(usize, Range<usize>)>,
    in_quote: bool,
    /// Not inside any blockquote or list item.
    top_level: bool,
    fence_char: u8,
    fence_len: usize,
    closed: bool,
}

impl Fence {
    /// The info string's first word is `json`, in any case (`JSON`, `json tool`; not `jsonc`).
    fn is_json(&self) -> bool {
        self.info
            .split_whitespace()
            .next()
            .is_some_and(|w| w.eq_ignore_ascii_case("json"))
    }

    fn closing_line(&self) -> String {
        (self.fence_char as char)
            .to_string()
            .repeat(self.fence_len.max(3))
    }
}

struct Scan {
    fences: Vec<Fence>,
    tail_closer: Option<String>,
}

fn scan_blocks(body: &str) -> Scan {
    let mut fences = Vec::new();
    let mut quote_depth = 0usize;
    let mut container_depth = 0usize;
    let mut current: Option<Fence> = None;
    let mut last_top_html: Option<Range<usize>> = None;
    for (event, range) in Parser::new_ext(body, Options::empty()).into_offset_iter() {
        match event {
            Event::Start(Tag::BlockQuote(_)) => {
                quote_depth += 1;
                container_depth += 1;
            }
            Event::End(TagEnd::BlockQuote(_)) => {
                quote_depth = quote_depth.saturating_sub(1);
                container_depth = container_depth.saturating_sub(1);
            }
            Event::Start(Tag::Item) => container_depth += 1,
            Event::End(TagEnd::Item) => container_depth = container_depth.saturating_sub(1),
            Event::Start(Tag::HtmlBlock) if container_depth == 0 => {
                last_top_html = Some(range);
            }
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) => {
                let opener = &body.as_bytes()[range.start..];
                let fence_char = opener.first().copied().unwrap_or(b'`');
                let fence_len = opener.iter().take_while(|&&b| b == fence_char).count();
                current = Some(Fence {
                    range,
                    info: info.to_string(),
                    content: String::new(),
                    pieces: Vec::new(),
                    in_quote: quote_depth > 0,
                    top_level: container_depth == 0,
                    fence_char,
                    fence_len,
                    closed: false,
                });
            }
            Event::Text(t) => {
                if let Some(f) = current.as_mut() {
                    f.pieces.push((f.content.len(), range));
                    f.content.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => {
                if let Some(mut f) = current.take() {
                    f.range = f.range.start..f.range.end.max(range.end);
                    f.closed = is_closed(body, &f);
                    fences.push(f);
                }
            }
            _ => {}
        }
    }
    // A fence still open when the events ran out (cannot happen, but never lose a block).
    if let Some(f) = current.take() {
        fences.push(f);
    }

    let tail_closer = match fences.iter().rev().find(|f| f.top_level && !f.closed) {
        Some(f) => Some(f.closing_line()),
        None => last_top_html.and_then(|r| html_terminator(&body[r])),
    };
    Scan {
        fences,
        tail_closer,
    }
}

/// REFERENCE §3: a closed block's span ends with its closing fence line: same char, at least
/// as long as the opener, nothing else on it, and not itself content (a would-be closer
/// indented too far arrives as a Text event).
fn is_closed(body: &str, f: &Fence) -> bool {
    let block = &body[f.range.clone()];
    let Some(nl) = block.rfind('\n') else {
        return false;
    };
    let last_line_start = f.range.start + nl + 1;
    if f.pieces.iter().any(|(_, r)| r.end > last_line_start) {
        return false;
    }
    let last = block[nl + 1..].trim_start_matches([' ', '\t']).trim_end();
    let run = last.bytes().take_while(|&b| b == f.fence_char).count();
    run >= f.fence_len && run == last.len()
}

/// For an HTML block of CommonMark types 1–5 that runs to the end of the note unterminated,
/// the line that ends it; None for any other block.
fn html_terminator(block: &str) -> Option<String> {
    let t = block.trim_start_matches(' ');
    let lower = t.to_ascii_lowercase();
    let unterminated = |rest: &str, end: &str| (!rest.contains(end)).then(|| end.to_string());
    if let Some(rest) = t.strip_prefix("<!--") {
        return unterminated(rest, "-->");
    }
    if let Some(rest) = t.strip_prefix("<?") {
        return unterminated(rest, "?>");
    }
    if let Some(rest) = t.strip_prefix("<![CDATA[") {
        return unterminated(rest, "]]>");
    }
    if let Some(rest) = t.strip_prefix("<!")
        && rest.starts_with(|c: char| c.is_ascii_alphabetic())
    {
        return unterminated(rest, ">");
    }
    for tag in ["pre", "script", "style", "textarea"] {
        let Some(rest) = lower.strip_prefix('<').and_then(|r| r.strip_prefix(tag)) else {
            continue;
        };
        if !rest.is_empty() && !rest.starts_with(|c: char| c.is_ascii_whitespace() || c == '>') {
            continue;
        }
        let ended = ["</pre>", "</script>", "</style>", "</textarea>"]
            .iter()
            .any(|end| lower.contains(end));
        return (!ended).then(|| format!("</{tag}>"));
    }
    None
}

/// A `tool_answer` block: `{"tool_answer": {"call_id": "c-1", "answer": …}}`, closed and
/// with nothing else in it (an open block, or one that also says `"tool_call"`, is left to
/// the call parser, which says what is wrong with it if it is a call). A block that means to
/// be an answer but is broken (invalid JSON, another shape) is an answer too, an `Err` saying
/// what is wrong: it must not let an older answer count in its place. Its call id is read
/// leniently; with none to be found it stands for every call's answer (`""`).
fn record_answer(f: &Fence) -> Option<(String, Result<Value, String>)> {
    if !f.closed || !f.content.contains("\"tool_answer\"") || f.content.contains("\"tool_call\"") {
        return None;
    }
    let broken = |why: String| Some((lenient_call_id(&f.content).unwrap_or_default(), Err(why)));
    let mut map = match serde_json::from_str::<Value>(&f.content) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return broken("the `tool_answer` block is not a JSON object".into()),
        Err(e) => return broken(format!("the `tool_answer` block is not valid JSON ({e})")),
    };
    let shape = "the `tool_answer` block must be {\"tool_answer\": {\"call_id\": …, \"answer\": …}} and nothing else";
    if map.len() != 1 {
        return broken(shape.into());
    }
    let Some(Value::Object(mut a)) = map.remove("tool_answer") else {
        return broken(shape.into());
    };
    let Some(call_id) = a.get("call_id").and_then(Value::as_str).map(str::to_string) else {
        return broken("the `tool_answer` block has no \"call_id\" string".into());
    };
    Some((call_id, Ok(a.remove("answer").unwrap_or(Value::Null))))
}

/// The `"call_id": "…"` of a block that does not parse, if it can be read.
fn lenient_call_id(content: &str) -> Option<String> {
    let after = &content[content.find("\"call_id\"")? + "\"call_id\"".len()..];
    let after = after
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    let id = &after[..after.find('"')?];
    (!id.is_empty()).then(|| id.to_string())
}

/// A `tool_result` or `tool_approval` block inside a callout.
fn record_notice(f: &Fence, results: &mut Vec<ResultRef>, held: &mut Vec<HeldRef>) {
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&f.content) else {
        return;
    };
    if let Some(Value::Object(r)) = map.get("tool_result")
        && let (Some(call_id), Some(ok)) = (
            r.get("call_id").and_then(Value::as_str),
            r.get("ok").and_then(Value::as_bool),
        )
    {
        let error = r.get("error").map(|e| {
            let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            (text("code"), text("message"))
        });
        results.push(ResultRef {
            call_id: call_id.to_string(),
            ok,
            error: error.filter(|_| !ok),
        });
    }
    if let Some(Value::Object(a)) = map.get("tool_approval")
        && let Some(call_id) = a.get("call_id").and_then(Value::as_str)
    {
        let params_hash = match (a.get("name"), a.get("parameters")) {
            (Some(Value::String(name)), Some(Value::Object(parameters))) => {
                Some(params_hash(name, parameters))
            }
            _ => None,
        };
        let question_hash = match (a.get("reason"), a.get("question")) {
            (Some(Value::String(reason)), Some(question)) => Some(question_hash(reason, question)),
            _ => None,
        };
        held.push(HeldRef {
            call_id: call_id.to_string(),
            params_hash,
            question_hash,
        });
    }
}

/// What one `json` block outside callouts turned out to be.
struct FoundCall {
    /// The id before duplicate numbering.
    base_id: String,
    name: Option<String>,
    body: CallBody,
}

/// A well-formed `tool_call` value.
struct WellFormedCall {
    id: String,
    name: String,
    parameters: Map<String, Value>,
}

fn classify_call(f: &Fence, body_start: usize, lines: &LineIndex, text: &str) -> Option<FoundCall> {
    let parsed = serde_json::from_str::<Value>(&f.content);
    if !f.closed {
        // The same test as for a closed block that does not parse: the quoted key. A `json`
        // block left open whose text only mentions tool_call in passing is not a call.
        if !f.content.contains("\"tool_call\"") {
            return None;
        }
        let closer = f.closing_line();
        // A top-level unclosed fence is closed by vaultd when it appends the result (else the
        // result would land inside it). Give the block now the id it will have once closed,
        // so the result written now still belongs to it and it does not run on the next round.
        let once_closed = match &parsed {
            Ok(Value::Object(map)) if map.len() == 1 => {
                map.get("tool_call").map(validate_tool_call)
            }
            _ => None,
        };
        let name = match &once_closed {
            Some(Ok(valid)) => Some(valid.name.clone()),
            _ => readable_name(parsed.as_ref().ok()),
        };
        let base_id = match once_closed {
            Some(Ok(valid)) if f.top_level => valid.id,
            _ => raw_id(&f.content),
        };
        let message = if f.top_level {
            format!(
                "fence not closed: add a closing {closer} line (vaultd closed it after the block; \
                 write the call again to run it)"
            )
        } else {
            format!("fence not closed: add a closing {closer} line")
        };
        return Some(FoundCall {
            base_id,
            name,
            body: CallBody::Broken(CallError::new(ErrorCode::InvalidCall, message)),
        });
    }

    match parsed {
        Ok(Value::Object(map)) => {
            let tool_call = map.get("tool_call")?;
            let name = tool_call
                .get("name")
                .and_then(Value::as_str)
                .map(str::to_string);
            if map.len() > 1 {
                let others: Vec<String> = map
                    .keys()
                    .filter(|k| *k != "tool_call")
                    .map(|k| format!("`{}`", shorten(k)))
                    .collect();
                return Some(broken_call(
                    &f.content,
                    name,
                    format!(
                        "a call block holds only `tool_call`; found also {}",
                        others.join(", ")
                    ),
                ));
            }
            match validate_tool_call(tool_call) {
                Ok(valid) => Some(FoundCall {
                    base_id: valid.id,
                    name: Some(valid.name.clone()),
                    body: CallBody::Call {
                        name: valid.name,
                        parameters: valid.parameters,
                    },
                }),
                Err(problems) => Some(broken_call(&f.content, name, problems)),
            }
        }
        Ok(_) => None,
        Err(e) => {
            if !f.content.contains("\"tool_call\"") {
                return None;
            }
            let (line, column) = json_error_position(f, &e, body_start, lines, text);
            let position = format!(" at line {} column {}", e.line(), e.column());
            let full = e.to_string();
            let reason = full.strip_suffix(&position).unwrap_or(&full);
            let error = CallError::new(
                ErrorCode::InvalidJson,
                format!("invalid JSON at line {line}, column {column}: {reason}"),
            )
            .with_details(serde_json::json!({ "line": line, "column": column }));
            Some(FoundCall {
                base_id: raw_id(&f.content),
                name: None,
                body: CallBody::Broken(error),
            })
        }
    }
}

fn broken_call(content: &str, name: Option<String>, message: String) -> FoundCall {
    FoundCall {
        base_id: raw_id(content),
        name,
        body: CallBody::Broken(CallError::new(ErrorCode::InvalidCall, message)),
    }
}

/// §8.1: a broken block's id hashes its raw content, trailing whitespace aside: an unclosed
/// block at the end of a note or of a list item gains a line break and blank lines when vaultd
/// appends after it, and its id (so the result written for it) must not change with them.
fn raw_id(content: &str) -> String {
    let trimmed = content.trim_end();
    if trimmed.is_empty() {
        hash_id(b"")
    } else {
        hash_id(format!("{trimmed}\n").as_bytes())
    }
}

/// `tool_call.name` when it is a string, whatever else is wrong with the block.
fn readable_name(block: Option<&Value>) -> Option<String> {
    block?
        .get("tool_call")?
        .get("name")?
        .as_str()
        .map(str::to_string)
}

/// §8.2. Every problem is reported at once, so the agent can fix the call in one round.
fn validate_tool_call(tool_call: &Value) -> Result<WellFormedCall, String> {
    let Value::Object(obj) = tool_call else {
        return Err(format!(
            "`tool_call` must be an object, not {}",
            kind(tool_call)
        ));
    };
    let mut problems = Vec::new();
    let name = match obj.get("name") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            problems.push(format!("`name` must be a string, not {}", kind(other)));
            None
        }
        None => {
            problems.push("`name` is missing".to_string());
            None
        }
    };
    let id = match obj.get("id") {
        None => None,
        Some(Value::String(s)) if is_valid_id(s) => Some(s.clone()),
        Some(Value::String(s)) => {
            problems.push(format!(
                "`id` {:?} must be 1-64 characters of A-Z, a-z, 0-9, `_`, `.`, `-`",
                shorten(s)
            ));
            None
        }
        Some(other) => {
            problems.push(format!("`id` must be a string, not {}", kind(other)));
            None
        }
    };
    let parameters = match obj.get("parameters") {
        None => Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(other) => {
            problems.push(format!(
                "`parameters` must be an object, not {}",
                kind(other)
            ));
            Map::new()
        }
    };
    // A misspelt `parameter` would otherwise run the tool silently without its parameters.
    for key in obj.keys() {
        if !matches!(key.as_str(), "name" | "parameters" | "id") {
            problems.push(format!(
                "unknown key `{}` (a tool_call has only `name`, `parameters` and `id`)",
                shorten(key)
            ));
        }
    }
    match name {
        Some(name) if problems.is_empty() => Ok(WellFormedCall {
            id: id.unwrap_or_else(|| hash_id(canonical_json(tool_call).as_bytes())),
            name,
            parameters,
        }),
        _ => Err(format!("invalid tool_call: {}", problems.join("; "))),
    }
}

fn is_valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// User text quoted in an error message, cut to a readable length.
fn shorten(s: &str) -> String {
    const MAX: usize = 64;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// §8.1: keys sorted at every level, no whitespace, non-ASCII unescaped. Written by hand
/// rather than trusting `serde_json::to_string`, whose key order would silently change if
/// any crate in the build enabled serde_json's `preserve_order` feature.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(value, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// serde_json's error position (1-based line, 1-based byte column; column 0 = at the line
/// start) in the block content -> (line, column) in the file, column in characters.
fn json_error_position(
    f: &Fence,
    e: &serde_json::Error,
    body_start: usize,
    lines: &LineIndex,
    text: &str,
) -> (usize, usize) {
    let content = &f.content;
    let line_start = match e.line() {
        0 | 1 => 0,
        l => content
            .match_indices('\n')
            .nth(l - 2)
            .map_or(content.len(), |(i, _)| i + 1),
    };
    let offset = (line_start + e.column().saturating_sub(1)).min(content.len());
    let source = match f.pieces.iter().rev().find(|(start, _)| *start <= offset) {
        Some((start, range)) => range.start + (offset - start).min(range.len()),
        None => f.range.start,
    };
    let mut at = (body_start + source).min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let line = lines.line_of(at);
    let column = text[lines.start_of(line)..at].chars().count() + 1;
    (line, column)
}

/// What an approval is bound to: the full hex SHA-256 of the canonical JSON of
/// `{ "name", "parameters" }`. Any change to the call's tool or parameters changes it.
pub fn params_hash(name: &str, parameters: &Map<String, Value>) -> String {
    use sha2::{Digest, Sha256};
    let mut call = Map::new();
    call.insert("name".to_string(), Value::String(name.to_string()));
    call.insert("parameters".to_string(), Value::Object(parameters.clone()));
    let digest = Sha256::digest(canonical_json(&Value::Object(call)).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Identifies one written question notice: its reason and the server's question.
pub fn question_hash(reason: &str, question: &Value) -> String {
    use sha2::{Digest, Sha256};
    let doc = serde_json::json!({ "reason": reason, "question": question });
    let digest = Sha256::digest(canonical_json(&doc).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// `c-` + the first 12 hex digits of SHA-256 over `bytes`.
pub fn hash_id(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(14);
    s.push_str("c-");
    for b in &digest[..6] {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_parse_is_moved_onto_a_note_whose_frontmatter_alone_changed() {
        let old = format!("Intro\n\n{}", fenced(CALL));
        let new = format!("---\ntool_note: n-0123456789ab\n---\n{old}");
        let moved = parse_note(&old).restamped(&old, &new).unwrap();
        assert_eq!(moved, parse_note(&new));
        assert_eq!(moved.calls[0].line, 6);
        assert_eq!(&new[moved.calls[0].span.clone()], fenced(CALL).trim_end());
        // Anything else changed, or a broken call whose error names its line: parsed afresh.
        let edited = new.replace("Intro", "Intro, edited");
        assert!(parse_note(&old).restamped(&old, &edited).is_none());
        let broken = format!("Intro\n\n{}", fenced(r#"{"tool_call": {"name": "x" "y"}}"#));
        let stamped = format!("---\ntool_note: n-0123456789ab\n---\n{broken}");
        assert!(parse_note(&broken).restamped(&broken, &stamped).is_none());
    }

    const CALL: &str = r#"{"tool_call": {"name": "search_web", "parameters": {"query": "AI agents", "num_results": 3}}}"#;

    fn fenced(body: &str) -> String {
        format!("```json\n{body}\n```\n")
    }

    fn only_call(text: &str) -> CallBlock {
        let note = parse_note(text);
        assert_eq!(
            note.calls.len(),
            1,
            "expected one call in {text:?}: {note:#?}"
        );
        note.calls.into_iter().next().unwrap()
    }

    fn broken(call: &CallBlock) -> &CallError {
        match &call.body {
            CallBody::Broken(e) => e,
            other => panic!("expected a broken call, got {other:?}"),
        }
    }

    fn no_calls(text: &str) {
        let note = parse_note(text);
        assert!(
            note.calls.is_empty(),
            "expected no call in {text:?}: {:#?}",
            note.calls
        );
    }

    #[test]
    fn a_plain_call_has_name_parameters_line_and_span() {
        let text = format!("# Title\n\nSome text.\n\n{}after\n", fenced(CALL));
        let call = only_call(&text);
        assert_eq!(call.name.as_deref(), Some("search_web"));
        assert_eq!(call.line, 5);
        assert_eq!(&text[call.span.clone()], format!("```json\n{CALL}\n```"));
        let CallBody::Call { name, parameters } = &call.body else {
            panic!("not a call: {call:?}")
        };
        assert_eq!(name, "search_web");
        assert_eq!(
            Value::Object(parameters.clone()),
            json!({"query": "AI agents", "num_results": 3})
        );
    }

    #[test]
    fn call_id_is_sha256_of_canonical_tool_call() {
        use sha2::{Digest, Sha256};
        let canonical =
            r#"{"name":"search_web","parameters":{"num_results":3,"query":"AI agents"}}"#;
        let digest = Sha256::digest(canonical.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let expected = format!("c-{}", &hex[..12]);
        assert_eq!(expected, "c-c0048a1b8a2c");
        assert_eq!(only_call(&fenced(CALL)).call_id, expected);
    }

    #[test]
    fn call_id_ignores_key_order_and_whitespace() {
        let reordered = "{\n  \"tool_call\": {\n    \"parameters\": { \"num_results\": 3,\n \"query\": \"AI agents\" },\n    \"name\": \"search_web\"\n  }\n}";
        assert_eq!(only_call(&fenced(reordered)).call_id, "c-c0048a1b8a2c");
    }

    #[test]
    fn call_id_keeps_non_ascii_unescaped() {
        use sha2::{Digest, Sha256};
        let text = fenced(r#"{"tool_call":{"name":"t","parameters":{"q":"café \u00e9"}}}"#);
        let digest = Sha256::digest(r#"{"name":"t","parameters":{"q":"café é"}}"#.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(only_call(&text).call_id, format!("c-{}", &hex[..12]));
    }

    #[test]
    fn absent_parameters_are_empty() {
        let call = only_call(&fenced(r#"{"tool_call": {"name": "ping"}}"#));
        assert_eq!(
            call.body,
            CallBody::Call {
                name: "ping".into(),
                parameters: Map::new()
            }
        );
    }

    #[test]
    fn explicit_id_is_used() {
        let call = only_call(&fenced(
            r#"{"tool_call": {"name": "ping", "id": "step-1.a_B"}}"#,
        ));
        assert_eq!(call.call_id, "step-1.a_B");
        assert!(matches!(call.body, CallBody::Call { .. }));
    }

    #[test]
    fn duplicate_calls_get_numbered() {
        let text = format!("{}\n{}\n{}", fenced(CALL), fenced(CALL), fenced(CALL));
        let ids: Vec<_> = parse_note(&text)
            .calls
            .into_iter()
            .map(|c| c.call_id)
            .collect();
        assert_eq!(
            ids,
            ["c-c0048a1b8a2c", "c-c0048a1b8a2c-2", "c-c0048a1b8a2c-3"]
        );
    }

    #[test]
    fn duplicate_explicit_ids_get_numbered() {
        let a = fenced(r#"{"tool_call": {"name": "a", "id": "myid"}}"#);
        let b = fenced(r#"{"tool_call": {"name": "b", "id": "myid"}}"#);
        let ids: Vec<_> = parse_note(&format!("{a}\n{b}"))
            .calls
            .into_iter()
            .map(|c| c.call_id)
            .collect();
        assert_eq!(ids, ["myid", "myid-2"]);
    }

    #[test]
    fn derived_suffixes_skip_ids_used_explicitly_before_or_after() {
        let call = |id: &str| {
            fenced(&format!(
                r#"{{"tool_call": {{"name": "a", "id": "{id}"}}}}"#
            ))
        };
        let ids = |parts: &[&str]| -> Vec<String> {
            let text = parts
                .iter()
                .map(|id| call(id))
                .collect::<Vec<_>>()
                .join("\n");
            parse_note(&text)
                .calls
                .into_iter()
                .map(|c| c.call_id)
                .collect()
        };
        assert_eq!(ids(&["x", "x-2", "x"]), ["x", "x-2", "x-3"]);
        assert_eq!(ids(&["x", "x", "x-2"]), ["x", "x-3", "x-2"]);
        assert_eq!(ids(&["x", "x", "x", "x-3"]), ["x", "x-2", "x-4", "x-3"]);
    }

    #[test]
    fn crlf_note() {
        let text = "intro\r\n\r\n```json\r\n{\"tool_call\": {\"name\": \"ping\"}}\r\n```\r\n";
        let note = parse_note(text);
        assert_eq!(note.line_ending, LineEnding::CrLf);
        assert_eq!(note.calls.len(), 1);
        assert_eq!(note.calls[0].line, 3);
        assert_eq!(
            only_call(text).call_id,
            only_call(&fenced(r#"{"tool_call": {"name": "ping"}}"#)).call_id
        );
    }

    #[test]
    fn lf_when_no_line_break_or_first_is_lf() {
        assert_eq!(parse_note("").line_ending, LineEnding::Lf);
        assert_eq!(parse_note("a\nb\r\n").line_ending, LineEnding::Lf);
        assert_eq!(parse_note("a\r\nb\n").line_ending, LineEnding::CrLf);
    }

    #[test]
    fn bom_then_call_on_first_line() {
        let text = format!("\u{FEFF}{}", fenced(CALL));
        let note = parse_note(&text);
        assert!(note.bom);
        assert_eq!(note.calls.len(), 1);
        assert_eq!(note.calls[0].line, 1);
        assert_eq!(note.calls[0].span.start, 3);
        assert!(text[note.calls[0].span.clone()].starts_with("```json"));
    }

    #[test]
    fn bom_then_frontmatter() {
        let text = format!("\u{FEFF}---\ntitle: x\n---\n{}", fenced(CALL));
        let note = parse_note(&text);
        assert_eq!(note.frontmatter, Some(3..20));
        assert_eq!(&text[3..20], "---\ntitle: x\n---\n");
        assert_eq!(note.calls[0].line, 4);
    }

    #[test]
    fn frontmatter_span_and_call_line_counts_it() {
        let text = format!("---\ntitle: x\ntags: [a]\n---\n\n{}", fenced(CALL));
        let note = parse_note(&text);
        assert_eq!(note.frontmatter, Some(0..27));
        assert_eq!(note.calls[0].line, 6);
    }

    #[test]
    fn frontmatter_is_not_parsed_as_markdown() {
        let text = format!("---\nexample: |\n{}---\n", fenced(CALL));
        no_calls(&text);
    }

    #[test]
    fn horizontal_rules_around_a_call_do_not_hide_it() {
        // pulldown-cmark's YAML option would make this a "metadata block".
        let text = format!("Intro\n\n---\n## Section\n{}\n---\nMore\n", fenced(CALL));
        assert_eq!(parse_note(&text).calls.len(), 1);
    }

    #[test]
    fn pulldown_yaml_option_would_hide_that_call() {
        // Pins why frontmatter is cut by hand: with the option, the section is metadata.
        let text = format!("Intro\n\n---\n## Section\n{}\n---\nMore\n", fenced(CALL));
        let parser = Parser::new_ext(&text, Options::ENABLE_YAML_STYLE_METADATA_BLOCKS);
        let events: Vec<Event> = parser.collect();
        assert!(
            events
                .iter()
                .any(|e| matches!(e, Event::Start(Tag::MetadataBlock(_))))
        );
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::Start(Tag::CodeBlock(_))))
        );
    }

    #[test]
    fn call_without_final_newline() {
        let text = format!("text\n\n```json\n{CALL}\n```");
        let call = only_call(&text);
        assert_eq!(call.span.end, text.len());
        assert!(matches!(call.body, CallBody::Call { .. }));
    }

    #[test]
    fn tilde_fences_count() {
        let call = only_call(&format!("~~~json\n{CALL}\n~~~\n"));
        assert_eq!(call.call_id, "c-c0048a1b8a2c");
        let call = only_call(&format!("~~~~ json\n{CALL}\n~~~~~\n"));
        assert!(matches!(call.body, CallBody::Call { .. }));
    }

    #[test]
    fn indented_fences_count() {
        let call = only_call(&format!("   ```json\n   {CALL}\n   ```\n"));
        assert_eq!(call.call_id, "c-c0048a1b8a2c");
    }

    #[test]
    fn fences_in_list_items_count() {
        let text = format!("1. first\n2. run this:\n   ```json\n   {CALL}\n   ```\n3. done\n");
        let call = only_call(&text);
        assert_eq!(call.line, 3);
        assert!(matches!(call.body, CallBody::Call { .. }));
        let nested = format!("- a\n  - b\n    ```json\n    {CALL}\n    ```\n");
        assert!(matches!(only_call(&nested).body, CallBody::Call { .. }));
        let marker = format!("- ```json\n  {CALL}\n  ```\n");
        assert!(matches!(only_call(&marker).body, CallBody::Call { .. }));
    }

    #[test]
    fn blockquotes_and_callouts_never_run() {
        no_calls(&format!("> ```json\n> {CALL}\n> ```\n"));
        no_calls(&format!("> > ```json\n> > {CALL}\n> > ```\n"));
        no_calls(&format!(
            "> [!example]- Example\n> ```json\n> {CALL}\n> ```\n"
        ));
        no_calls(&format!(
            "> [!note]\n> > [!tip]\n> > - ```json\n> >   {CALL}\n> >   ```\n"
        ));
        no_calls(&format!("- item\n  > ```json\n  > {CALL}\n  > ```\n"));
    }

    #[test]
    fn indented_code_and_html_never_run() {
        no_calls(&format!("text\n\n    ```json\n    {CALL}\n    ```\n"));
        no_calls(&format!("<div>\n```json\n{CALL}\n```\n</div>\n"));
        no_calls(&format!("<!--\n```json\n{CALL}\n```\n-->\n"));
    }

    #[test]
    fn info_string_first_word_is_json_in_any_case() {
        assert_eq!(
            parse_note(&format!("```JSON\n{CALL}\n```\n")).calls.len(),
            1
        );
        assert_eq!(
            parse_note(&format!("```Json tool\n{CALL}\n```\n"))
                .calls
                .len(),
            1
        );
        assert_eq!(
            parse_note(&format!("``` json\n{CALL}\n```\n")).calls.len(),
            1
        );
        no_calls(&format!("```jsonc\n{CALL}\n```\n"));
        no_calls(&format!("```js\n{CALL}\n```\n"));
        no_calls(&format!("```\n{CALL}\n```\n"));
        no_calls(&format!("```tool json\n{CALL}\n```\n"));
    }

    #[test]
    fn unclosed_fence_with_tool_call_is_invalid_call() {
        let text = format!("intro\n\n```json\n{CALL}\n");
        let call = only_call(&text);
        let e = broken(&call);
        assert_eq!(e.code, ErrorCode::InvalidCall);
        assert!(
            e.message
                .starts_with("fence not closed: add a closing ``` line"),
            "{}",
            e.message
        );
        assert_eq!(call.name.as_deref(), Some("search_web"));
        assert_eq!(call.line, 3);
    }

    #[test]
    fn unclosed_fence_without_tool_call_is_ignored() {
        no_calls("```json\n{\"a\": 1}\n");
        no_calls("```json");
    }

    #[test]
    fn longer_opener_needs_longer_closer() {
        let call = only_call(&format!("````json\n{CALL}\n```\n"));
        let e = broken(&call);
        assert!(
            e.message.contains("add a closing ```` line"),
            "{}",
            e.message
        );
        let call = only_call(&format!("````json\n{CALL}\n````\n"));
        assert!(matches!(call.body, CallBody::Call { .. }));
    }

    #[test]
    fn closer_indented_four_spaces_is_content() {
        let call = only_call(&format!("```json\n{CALL}\n    ```"));
        assert_eq!(broken(&call).code, ErrorCode::InvalidCall);
    }

    #[test]
    fn unclosed_fence_in_list_item_is_invalid_call() {
        let text = format!("- ```json\n  {CALL}\n- next\n");
        let call = only_call(&text);
        assert!(broken(&call).message.starts_with("fence not closed"));
    }

    #[test]
    fn unclosed_top_level_fence_keeps_its_id_once_closed() {
        for text in [format!("```json\n{CALL}\n"), format!("```json\n{CALL}")] {
            let before = only_call(&text);
            let sep = if text.ends_with('\n') { "" } else { "\n" };
            let after = only_call(&format!("{text}{sep}```\n"));
            assert_eq!(before.call_id, after.call_id);
            assert!(matches!(after.body, CallBody::Call { .. }));
        }
        let bad = "```json\n{\"tool_call\": {\"name\": 1}}\n";
        assert_eq!(
            only_call(bad).call_id,
            only_call(&format!("{bad}```\n")).call_id
        );
    }

    #[test]
    fn invalid_json_has_line_and_column_in_the_file() {
        let text = "---\ntitle: t\n---\n# Note\n\n```json\n{\n  \"tool_call\": {\n    \"name\": \"x\"\n    \"parameters\": {}\n  }\n}\n```\n";
        let call = only_call(text);
        let e = broken(&call);
        assert_eq!(e.code, ErrorCode::InvalidJson);
        assert_eq!(e.details, Some(json!({"line": 10, "column": 5})));
        assert_eq!(
            e.message,
            "invalid JSON at line 10, column 5: expected `,` or `}`"
        );
        assert_eq!(call.name, None);
        assert_eq!(
            call.call_id,
            hash_id(
                b"{\n  \"tool_call\": {\n    \"name\": \"x\"\n    \"parameters\": {}\n  }\n}\n"
            )
        );
    }

    #[test]
    fn invalid_json_column_counts_stripped_indentation() {
        let text = "- step\n  ```json\n  {\"tool_call\": {\"name\" \"x\"}}\n  ```\n";
        let e = broken(&only_call(text)).clone();
        assert_eq!(e.details, Some(json!({"line": 3, "column": 25})));
        assert_eq!(&text.lines().nth(2).unwrap()[24..27], "\"x\"");
    }

    #[test]
    fn invalid_json_in_crlf_note() {
        let text = "a\r\n```json\r\n{\"tool_call\": \r\n  {\"name\": x}}\r\n```\r\n";
        let e = broken(&only_call(text)).clone();
        assert_eq!(e.details, Some(json!({"line": 4, "column": 12})));
    }

    #[test]
    fn invalid_json_at_end_points_at_closing_fence() {
        let text = "```json\n{\"tool_call\": {\"name\": \"x\"}\n```\n";
        let e = broken(&only_call(text)).clone();
        assert_eq!(e.details, Some(json!({"line": 3, "column": 1})));
        assert!(e.message.contains("EOF while parsing"), "{}", e.message);
    }

    #[test]
    fn invalid_json_column_counts_characters() {
        let text = "```json\n{\"tool_call\": \"é\" x}\n```\n";
        let e = broken(&only_call(text)).clone();
        // `x` is the 19th character (the 20th byte) of the line.
        assert_eq!(e.details, Some(json!({"line": 2, "column": 19})));
    }

    #[test]
    fn invalid_json_without_tool_call_is_ignored() {
        no_calls("```json\n{\"a\": 1,}\n```\n");
        no_calls("```json\n{tool_call: 1}\n```\n");
    }

    #[test]
    fn non_call_json_is_ignored() {
        no_calls("```json\n{\"a\": 1}\n```\n");
        no_calls("```json\n[{\"tool_call\": {\"name\": \"x\"}}]\n```\n");
        no_calls("```json\n\"tool_call\"\n```\n");
        no_calls("```json\n{\"x\": \"tool_call\"}\n```\n");
        no_calls("```json\n```\n");
    }

    fn invalid_call_message(body: &str) -> String {
        let call = only_call(&fenced(body));
        let e = broken(&call);
        assert_eq!(e.code, ErrorCode::InvalidCall, "{body}");
        assert!(!e.retryable);
        assert_eq!(call.call_id, hash_id(format!("{body}\n").as_bytes()));
        e.message.clone()
    }

    #[test]
    fn invalid_call_cases() {
        let cases = [
            (
                r#"{"tool_call": "search"}"#,
                "`tool_call` must be an object, not a string",
            ),
            (r#"{"tool_call": {"parameters": {}}}"#, "`name` is missing"),
            (
                r#"{"tool_call": {"name": 3}}"#,
                "`name` must be a string, not a number",
            ),
            (
                r#"{"tool_call": {"name": "x", "id": "has space"}}"#,
                "`id` \"has space\" must be 1-64 characters",
            ),
            (
                r#"{"tool_call": {"name": "x", "id": ""}}"#,
                "`id` \"\" must be",
            ),
            (
                r#"{"tool_call": {"name": "x", "id": 7}}"#,
                "`id` must be a string, not a number",
            ),
            (
                r#"{"tool_call": {"name": "x", "parameters": [1]}}"#,
                "`parameters` must be an object, not an array",
            ),
            (
                r#"{"tool_call": {"name": "x", "parameters": null}}"#,
                "`parameters` must be an object, not null",
            ),
            (
                r#"{"tool_call": {"name": "x", "parameter": {"q": 1}}}"#,
                "unknown key `parameter`",
            ),
            (
                r#"{"tool_call": {"name": "x"}, "note": 1}"#,
                "found also `note`",
            ),
        ];
        for (body, expected) in cases {
            let message = invalid_call_message(body);
            assert!(message.contains(expected), "{body}: {message}");
        }
        let long = "a".repeat(65);
        let message = invalid_call_message(&format!(
            r#"{{"tool_call": {{"name": "x", "id": "{long}"}}}}"#
        ));
        assert!(message.contains("must be 1-64"), "{message}");
        assert!(is_valid_id(&"a".repeat(64)));
    }

    #[test]
    fn invalid_call_reports_every_problem_and_keeps_the_name() {
        let call = only_call(&fenced(
            r#"{"tool_call": {"name": "x", "id": "a b", "parameters": 1, "extra": 2}}"#,
        ));
        let message = &broken(&call).message;
        assert!(
            message.contains("`id`")
                && message.contains("`parameters`")
                && message.contains("`extra`"),
            "{message}"
        );
        assert_eq!(call.name.as_deref(), Some("x"));
    }

    #[test]
    fn params_hash_ignores_key_order_and_sees_every_change() {
        let p = |v: Value| match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        let a = params_hash(
            "send",
            &p(serde_json::json!({"to": "a@x.org", "n": [1, 2]})),
        );
        let b = params_hash(
            "send",
            &p(serde_json::json!({"n": [1, 2], "to": "a@x.org"})),
        );
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        assert_ne!(
            a,
            params_hash(
                "send",
                &p(serde_json::json!({"to": "b@x.org", "n": [1, 2]}))
            )
        );
        assert_ne!(
            a,
            params_hash(
                "other",
                &p(serde_json::json!({"to": "a@x.org", "n": [1, 2]}))
            )
        );
    }

    #[test]
    fn results_and_held_are_found_in_callouts() {
        let text = "\
> [!success]- ping · 1 ms
> ```json
> {\"tool_result\": {\"call_id\": \"c-1\", \"name\": \"ping\", \"ok\": true}}
> ```

> [!failure]- ping · TIMEOUT · 1 ms
> ```json
> {\"tool_result\": {\"call_id\": \"c-2\", \"ok\": false}}
> ```

> [!question] Approval needed · send · c-3
> ```json
> {\"tool_approval\": {\"call_id\": \"c-3\"}}
> ```

```json
{\"tool_result\": {\"call_id\": \"outside\", \"ok\": true}}
```
";
        let note = parse_note(text);
        assert_eq!(
            note.results,
            [
                ResultRef {
                    call_id: "c-1".into(),
                    ok: true,
                    error: None,
                },
                ResultRef {
                    call_id: "c-2".into(),
                    ok: false,
                    error: None,
                }
            ]
        );
        assert_eq!(
            note.held,
            [HeldRef {
                call_id: "c-3".into(),
                params_hash: None,
                question_hash: None,
            }]
        );
        assert!(note.is_held("c-3") && !note.is_held("c-1"));
        assert!(note.calls.is_empty());
    }

    #[test]
    fn pending_calls_are_those_without_a_result() {
        let a = fenced(r#"{"tool_call": {"name": "a", "id": "a"}}"#);
        let b = fenced(r#"{"tool_call": {"name": "b", "id": "b"}}"#);
        let result = "> ```json\n> {\"tool_result\": {\"call_id\": \"a\", \"ok\": true}}\n> ```\n";
        let note = parse_note(&format!("{a}\n{b}\n{result}"));
        let pending: Vec<_> = note.pending_calls().map(|c| c.call_id.as_str()).collect();
        assert_eq!(pending, ["b"]);
        assert!(note.has_result("a"));
    }

    #[test]
    fn never_panics_on_odd_input() {
        let deep = format!(
            "```json\n{{\"tool_call\": {}{}}}\n```\n",
            "[".repeat(5000),
            "]".repeat(5000)
        );
        let e = broken(&only_call(&deep)).clone();
        assert_eq!(e.code, ErrorCode::InvalidJson);
        for text in [
            "\u{FEFF}",
            "\u{FEFF}---",
            "\0\0```json\n\0\"tool_call\"\0\n```",
            "```json\n\"tool_call\" \u{1F600}\u{200B}\r\r\n```",
            "> ```json\n> {\"tool_result\": 5}\n",
            "```json\n{\"tool_call\": \"\u{10FFFF}\" é}\n```",
            "\r\n\r",
            "~~~",
            "```json\n\t{\"tool_call\" 1}\n```",
            "- \t```json\n  \t{\"tool_call\" 1}\n  ```",
        ] {
            let _ = parse_note(text);
        }
    }
}
