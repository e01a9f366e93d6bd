//! Pure: the one reader and editor of a note's frontmatter (docs/design.md §15.3). It finds
//! the frontmatter, reads one property's value or every property as JSON, and sets
//! properties touching only their lines (every other byte — line endings, BOM, comments, odd
//! YAML, a missing final newline — stays as it was). The vault tools' JSON values and
//! vaultd's own one-line values (`tool_status`, `tool_note`, …) are read and written by the
//! same rules; only how a value is rendered differs ([`NewValue`]).
//!
//! There is no YAML library among vaultd's dependencies, and Obsidian properties are a small
//! subset of YAML: top-level `key: value` lines, with lists either `[a, b]` or `- item` lines
//! below the key. That subset is read; anything else (nested maps, block scalars) is read as
//! the raw text of its first line. Values are written as JSON, which is valid YAML (lists of
//! scalars as `- item` lines, as Obsidian writes them).

use crate::note::text::detect_line_ending;
use serde_json::{Map, Value};
use std::ops::Range;

/// The length of a UTF-8 BOM at the start of `text` (0 or 3).
fn bom_len(text: &str) -> usize {
    if text.starts_with('\u{FEFF}') { 3 } else { 0 }
}

/// Byte span of the frontmatter of `text` (after a BOM), from the opening `---` to the end of
/// the closing line including its line break.
pub fn span(text: &str) -> Option<Range<usize>> {
    let at = bom_len(text);
    find(&text[at..], false).map(|(r, _)| r.start + at..r.end + at)
}

/// The next line at `pos`: (line without its line break, start of the following line).
fn next_line(s: &str, pos: usize) -> Option<(&str, usize)> {
    if pos >= s.len() {
        return None;
    }
    let end = s[pos..].find('\n').map_or(s.len(), |i| pos + i + 1);
    let line = s[pos..end].strip_suffix('\n').unwrap_or(&s[pos..end]);
    Some((line.strip_suffix('\r').unwrap_or(line), end))
}

/// YAML frontmatter at the start of `s` (BOM already removed): a `---` line, at least one
/// line, a closing `---` or `...` line. Agrees with pulldown-cmark's YAML metadata rule at
/// the top of a document (the first inner line may not be blank), except that an empty
/// `---`/`---` pair also counts, as it does in Obsidian. With `head` (`s` is only the first
/// bytes of a note), a frontmatter not closed within `s` reaches to its end. Returns the span
/// and whether it has its closing line.
fn find(s: &str, head: bool) -> Option<(Range<usize>, bool)> {
    let (first, mut pos) = next_line(s, 0)?;
    let opener = first.strip_prefix("---")?;
    if !opener.bytes().all(|b| b.is_ascii_whitespace()) {
        return None;
    }
    let mut first_inner = true;
    while let Some((line, next)) = next_line(s, pos) {
        let trimmed = line.trim_end_matches([' ', '\t']);
        if trimmed == "---" || trimmed == "..." {
            return Some((0..next, true));
        }
        if first_inner && line.trim().is_empty() {
            return None;
        }
        first_inner = false;
        pos = next;
    }
    head.then_some((0..s.len(), false))
}

/// The lines between the opening and the closing line of the frontmatter of `text` (each
/// with its line break); empty without frontmatter.
fn inner_lines(text: &str, head: bool) -> Vec<&str> {
    let at = bom_len(text);
    let Some((span, closed)) = find(&text[at..], head) else {
        return Vec::new();
    };
    let mut lines: Vec<&str> = text[at + span.start..at + span.end]
        .split_inclusive('\n')
        .skip(1)
        .collect();
    if closed {
        lines.pop();
    }
    lines
}

/// One top-level property: its key, the text after its colon on the key's line (without the
/// line break), and the lines it takes (the key's and the continuation lines below it), as
/// indices into the frontmatter's inner lines.
struct Entry<'t> {
    key: &'t str,
    value: &'t str,
    lines: Range<usize>,
}

/// The top-level properties of the frontmatter's inner lines, in order (a key written twice
/// is there twice).
fn entries<'t>(inner: &[&'t str]) -> Vec<Entry<'t>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < inner.len() {
        let start = i;
        let line = inner[i].trim_end_matches(['\n', '\r']);
        i += 1;
        let Some((key, value)) = top_level_key(line) else {
            continue;
        };
        while i < inner.len() && is_continuation(inner[i]) {
            i += 1;
        }
        out.push(Entry {
            key,
            value,
            lines: start..i,
        });
    }
    out
}

/// The value of the top-level frontmatter property `key` as one line, for vaultd's own
/// one-word values (`tool_note`, `tool_runner`): the first line that starts with `key:`
/// (exactly: `key : v` or an indented `key:` is another key), its value trimmed and quote
/// characters taken off its ends; None when the note has no frontmatter or no such line
/// with a value. The rule of every release before this module, kept on purpose: which
/// identity a note has must not change with an upgrade (a note with two `tool_note` lines,
/// a sync merge's, keeps the one it was claimed by).
pub fn frontmatter_property<'t>(text: &'t str, key: &str) -> Option<&'t str> {
    one_line_value(&inner_lines(text, false), key)
}

/// [`frontmatter_property`] of `head`, the first bytes of a note (a read cut short): a
/// frontmatter not closed within the head reaches to its end.
pub fn head_property<'t>(head: &'t str, key: &str) -> Option<&'t str> {
    one_line_value(&inner_lines(head, true), key)
}

/// Whether the frontmatter of `text` has the top-level property `key` (empty or not).
pub fn has_property(text: &str, key: &str) -> bool {
    entries(&inner_lines(text, false))
        .iter()
        .any(|e| e.key == key)
}

fn one_line_value<'t>(inner: &[&'t str], key: &str) -> Option<&'t str> {
    inner.iter().find_map(|line| {
        let rest = own_key_line(line, key)?;
        let v = rest.trim().trim_matches(|c| c == '"' || c == '\'');
        (!v.is_empty()).then_some(v)
    })
}

/// What follows `key:` on a line that starts with it (vaultd's own rule for its keys, the
/// one its readers and writer have always used).
fn own_key_line<'l>(line: &'l str, key: &str) -> Option<&'l str> {
    line.strip_prefix(key)?.strip_prefix(':')
}

/// The frontmatter properties of `text` (empty when it has none).
pub fn read_properties(text: &str) -> Map<String, Value> {
    let mut out = Map::new();
    let inner = inner_lines(text, false);
    for entry in entries(&inner) {
        let value = entry.value.trim();
        let value = if value.is_empty() {
            let items: Vec<Value> = inner[entry.lines.start + 1..entry.lines.end]
                .iter()
                .filter_map(|line| line.trim().strip_prefix('-'))
                .map(|rest| scalar(rest.trim()))
                .collect();
            if items.is_empty() {
                Value::Null
            } else {
                Value::Array(items)
            }
        } else {
            flow(value)
        };
        out.insert(entry.key.to_string(), value);
    }
    out
}

/// `key: value` at the top level (not indented, not a list item, not a comment).
fn top_level_key(line: &str) -> Option<(&str, &str)> {
    if line.starts_with([' ', '\t', '-', '#']) || line.is_empty() {
        return None;
    }
    let (key, value) = line.split_once(':')?;
    if !(value.is_empty() || value.starts_with([' ', '\t'])) {
        return None;
    }
    let key = key.trim();
    let key = key
        .strip_prefix('"')
        .and_then(|k| k.strip_suffix('"'))
        .unwrap_or(key);
    Some((key, value))
}

/// A line that belongs to the value above it: indented, or a `- item`.
fn is_continuation(line: &str) -> bool {
    line.starts_with([' ', '\t'])
        || line.trim_end_matches(['\n', '\r']) == "-"
        || line.starts_with("- ")
        || line.starts_with("-\t")
}

fn flow(value: &str) -> Value {
    if value.starts_with('[') && value.ends_with(']') {
        if let Ok(v) = serde_json::from_str::<Value>(value) {
            return v;
        }
        let inner = &value[1..value.len() - 1];
        if inner.trim().is_empty() {
            return Value::Array(Vec::new());
        }
        return Value::Array(inner.split(',').map(|s| scalar(s.trim())).collect());
    }
    if value.starts_with('{')
        && value.ends_with('}')
        && let Ok(v) = serde_json::from_str::<Value>(value)
    {
        return v;
    }
    scalar(value)
}

/// A trimmed scalar without its trailing comment (` #…`), which is not part of a plain one.
fn uncommented(s: &str) -> &str {
    match s.find(" #") {
        Some(at) if !s.starts_with(['"', '\'']) => s[..at].trim_end(),
        _ => s,
    }
}

fn scalar(s: &str) -> Value {
    let s = uncommented(s);
    if s.starts_with('"')
        && let Ok(v) = serde_json::from_str::<String>(s)
    {
        return Value::String(v);
    }
    if let Some(inner) = s.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        return Value::String(inner.replace("''", "'"));
    }
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    if let Ok(i) = s.parse::<i64>() {
        return Value::from(i);
    }
    if s.contains('.')
        && let Ok(f) = s.parse::<f64>()
        && f.is_finite()
    {
        return Value::from(f);
    }
    Value::String(s.to_string())
}

/// A property's new value, as [`set`] renders it.
#[derive(Debug, Clone, Copy)]
pub enum NewValue<'a> {
    /// One of vaultd's own values (`tool_status: done`): one line, written as it is.
    Line(&'a str),
    /// A vault tool's value, written as YAML (a list of scalars as `- item` lines, a string
    /// quoted when it would read back as something else); `null` removes the property.
    Json(&'a Value),
}

impl NewValue<'_> {
    fn removes(&self) -> bool {
        matches!(self, NewValue::Json(Value::Null))
    }
}

/// Sets (or, for a JSON `null`, removes) the named top-level properties of `text`, touching
/// only their lines: every line of a key written twice, with the continuation lines below it.
/// New keys go before the closing line, in the order given, with the note's line ending; a
/// note without frontmatter gets one (after a BOM) when something is to be added.
pub fn set(text: &str, props: &[(&str, NewValue<'_>)]) -> String {
    let eol = detect_line_ending(text).as_str();
    let mut out = String::with_capacity(text.len() + 160);
    let Some(span) = span(text) else {
        if props.iter().all(|(_, v)| v.removes()) {
            return text.to_string();
        }
        let at = bom_len(text);
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
    let inner = &lines[1..closer];
    let mut written = vec![false; props.len()];
    out.push_str(&text[..span.start]);
    out.push_str(lines[0]);
    // The lines of each property set: its key's lines, and for vaultd's own one-line values
    // also a line that starts with `key:` (no space: `tool_status:done` by hand or an older
    // tool), which its readers take for that key and its writer always replaced.
    let mut hits: Vec<(std::ops::Range<usize>, usize)> = entries(inner)
        .into_iter()
        .filter_map(|e| {
            let k = props.iter().position(|(key, _)| *key == e.key)?;
            Some((e.lines, k))
        })
        .collect();
    for (i, line) in inner.iter().enumerate() {
        if hits.iter().any(|(lines, _)| lines.contains(&i)) {
            continue;
        }
        let own = props.iter().position(|(key, value)| {
            matches!(value, NewValue::Line(_)) && own_key_line(line, key).is_some()
        });
        if let Some(k) = own {
            let mut end = i + 1;
            while end < inner.len() && is_continuation(inner[end]) {
                end += 1;
            }
            hits.push((i..end, k));
        }
    }
    hits.sort_by_key(|(lines, _)| lines.start);
    let mut copied = 0;
    for (lines, k) in hits {
        if lines.start < copied {
            continue; // inside a property already replaced
        }
        inner[copied..lines.start]
            .iter()
            .for_each(|l| out.push_str(l));
        copied = lines.end;
        push_property(&mut out, props[k].0, &props[k].1, eol);
        written[k] = true;
    }
    inner[copied..].iter().for_each(|l| out.push_str(l));
    for ((key, value), done) in props.iter().zip(&written) {
        if !done {
            push_property(&mut out, key, value, eol);
        }
    }
    out.push_str(lines[closer]);
    out.push_str(&text[span.end..]);
    out
}

/// [`set`] with a vault tool's JSON values.
pub fn set_json(text: &str, props: &Map<String, Value>) -> String {
    let props: Vec<(&str, NewValue<'_>)> = props
        .iter()
        .map(|(k, v)| (k.as_str(), NewValue::Json(v)))
        .collect();
    set(text, &props)
}

/// The lines of one property (none for a removal).
fn push_property(out: &mut String, key: &str, value: &NewValue<'_>, eol: &str) {
    let value = match value {
        NewValue::Line(line) => {
            out.push_str(key);
            out.push_str(": ");
            out.push_str(line);
            out.push_str(eol);
            return;
        }
        NewValue::Json(Value::Null) => return,
        NewValue::Json(value) => *value,
    };
    out.push_str(key);
    out.push(':');
    match value {
        Value::Array(items)
            if !items.is_empty() && items.iter().all(|v| !v.is_object() && !v.is_array()) =>
        {
            out.push_str(eol);
            for item in items {
                out.push_str("  - ");
                out.push_str(&yaml_scalar(item));
                out.push_str(eol);
            }
            return;
        }
        Value::Array(_) | Value::Object(_) => {
            out.push(' ');
            out.push_str(&value.to_string());
        }
        other => {
            out.push(' ');
            out.push_str(&yaml_scalar(other));
        }
    }
    out.push_str(eol);
}

/// A scalar as YAML: plain when it reads back as the same string, JSON-quoted otherwise.
fn yaml_scalar(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let plain = !s.is_empty()
                && s.chars()
                    .all(|c| c.is_alphanumeric() || " _-./()".contains(c))
                && !s.starts_with([' ', '-', '.'])
                && !s.ends_with(' ')
                && scalar(s) == Value::String(s.clone());
            if plain {
                s.clone()
            } else {
                Value::String(s.clone()).to_string()
            }
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn reads_the_obsidian_subset() {
        let text = "---\ntitle: Plan B\ncount: 3\nratio: 0.5\ndone: false\ntags:\n  - a\n  - \"b c\"\naliases: [x, y]\nquoted: 'it''s'\nempty:\n# comment\nnested:\n  k: v\n---\nbody\n";
        let p = read_properties(text);
        assert_eq!(p["title"], "Plan B");
        assert_eq!(p["count"], 3);
        assert_eq!(p["ratio"], 0.5);
        assert_eq!(p["done"], false);
        assert_eq!(p["tags"], json!(["a", "b c"]));
        assert_eq!(p["aliases"], json!(["x", "y"]));
        assert_eq!(p["quoted"], "it's");
        assert_eq!(p["empty"], Value::Null);
        assert!(p.contains_key("nested"));
        assert!(read_properties("no frontmatter\n").is_empty());
    }

    #[test]
    fn edits_touch_only_the_named_keys_with_crlf_bom_and_no_final_newline() {
        let text = "\u{feff}---\r\ntitle: Old\r\n# keep me\r\nweird:   {a: [1, 2]}   \r\ntags:\r\n  - x\r\nstatus: draft\r\n---\r\nBody  \r\nend";
        let out = set_json(
            text,
            &map(json!({ "status": "final", "tags": ["y", "z w"], "title": null, "new": 7 })),
        );
        assert_eq!(
            out,
            "\u{feff}---\r\n# keep me\r\nweird:   {a: [1, 2]}   \r\ntags:\r\n  - y\r\n  - z w\r\nstatus: final\r\nnew: 7\r\n---\r\nBody  \r\nend"
        );
        let p = read_properties(&out);
        assert_eq!(p["tags"], json!(["y", "z w"]));
        assert_eq!(p["new"], 7);
        assert!(!p.contains_key("title"));
    }

    #[test]
    fn a_note_without_frontmatter_gets_one() {
        assert_eq!(
            set_json("Hello", &map(json!({ "a": "b: c" }))),
            "---\na: \"b: c\"\n---\nHello"
        );
        assert_eq!(set_json("Hello", &map(json!({ "a": null }))), "Hello");
    }

    #[test]
    fn strings_that_would_read_back_differently_are_quoted() {
        for s in ["true", "12", "", "a: b", "#x", "- x", "null", "x #y"] {
            let out = set_json("---\n---\n", &map(json!({ "k": s })));
            assert_eq!(read_properties(&out)["k"], s, "{out}");
        }
    }

    #[test]
    fn frontmatter_property_reads_one_line_values() {
        let text = "---\ntitle: x\ntool_note: n-0123456789ab\n---\n# body\ntool_note: no\n";
        assert_eq!(
            frontmatter_property(text, "tool_note"),
            Some("n-0123456789ab")
        );
        assert_eq!(frontmatter_property(text, "tool"), None, "whole keys only");
        assert_eq!(
            frontmatter_property("# no frontmatter\ntool_note: n-1\n", "tool_note"),
            None
        );
        assert_eq!(
            frontmatter_property("\u{FEFF}---\r\ntool_note: \"n-1\"\r\n---\r\n", "tool_note"),
            Some("n-1")
        );
    }

    #[test]
    fn frontmatter_variants() {
        assert_eq!(span("---\na: 1\n...\nbody"), Some(0..13));
        assert_eq!(span("---\na: 1\n---"), Some(0..12));
        assert_eq!(span("---\r\na: 1\r\n---  \r\nx"), Some(0..18));
        assert_eq!(span("---\n---\nx"), Some(0..8));
        assert_eq!(span("---\na: 1\n"), None, "never closed");
        assert_eq!(span("---\n\na: 1\n---\n"), None, "blank first line");
        assert_eq!(span("----\na: 1\n----\n"), None);
        assert_eq!(span("x\n---\na: 1\n---\n"), None, "not at the top");
        assert_eq!(span(" ---\na: 1\n---\n"), None, "indented");
    }

    #[test]
    fn a_head_cut_short_is_read_as_far_as_it_goes() {
        let head = "---\ntool_runner: a-1\ntitle: a long";
        assert_eq!(head_property(head, "tool_runner"), Some("a-1"));
        assert_eq!(
            frontmatter_property(head, "tool_runner"),
            None,
            "not closed"
        );
        assert_eq!(
            head_property("# x\ntool_runner: a-1\n", "tool_runner"),
            None
        );
    }

    /// vaultd's own one-line values are read as every release read them: the first line
    /// with a value (a note a sync merge left with two `tool_note` lines keeps the identity
    /// it was claimed by); the properties a vault tool reads, as YAML does: the last.
    #[test]
    fn every_line_of_a_key_written_twice_is_set_the_first_is_vaultds_and_the_last_yamls() {
        let text = "---\na: 1\nb: 2\na: 3\n---\n";
        assert_eq!(frontmatter_property(text, "a"), Some("1"));
        assert_eq!(
            frontmatter_property("---\ntool_note:\ntool_note: n-2\n---\n", "tool_note"),
            Some("n-2"),
            "an empty line is skipped"
        );
        assert_eq!(read_properties(text)["a"], 3);
        let out = set(text, &[("a", NewValue::Line("x"))]);
        assert_eq!(out, "---\na: x\nb: 2\na: x\n---\n");
        assert_eq!(
            set_json(text, &map(json!({ "a": null }))),
            "---\nb: 2\n---\n"
        );
    }

    #[test]
    fn own_values_and_json_values_find_their_key_lines() {
        // For YAML a quoted key and a space before the colon are the key's line, `k:v` is
        // not; vaultd's own values also replace `k:v` (its readers take it for `k`).
        let text = "---\n\"k\": 1\nk : 2\nk:v\n---\n";
        let line = set(text, &[("k", NewValue::Line("x"))]);
        assert_eq!(line, "---\nk: x\nk: x\nk: x\n---\n");
        assert_eq!(
            set_json(text, &map(json!({ "k": "x" }))),
            "---\nk: x\nk: x\nk:v\n---\n"
        );
        assert!(has_property(text, "k") && !has_property(text, "k:v"));
        // vaultd's reader: exactly `k:` at the start of a line.
        assert_eq!(frontmatter_property("---\nk:v\n---\n", "k"), Some("v"));
        assert_eq!(frontmatter_property("---\nk : 2\n---\n", "k"), None);
        assert_eq!(frontmatter_property("---\n  k: 2\n---\n", "k"), None);
    }
}
