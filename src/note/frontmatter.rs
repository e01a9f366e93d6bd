//! Pure: a note's frontmatter, found, read and edited (docs/design.md §15.3): its span, one
//! property's one-line value, every property as JSON, and edits that touch only the named
//! properties' lines (every other byte — line endings, BOM, comments, odd YAML, a missing
//! final newline — stays as it was).
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
    find_frontmatter(&text[at..]).map(|r| r.start + at..r.end + at)
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
/// `---`/`---` pair also counts, as it does in Obsidian.
pub(crate) fn find_frontmatter(s: &str) -> Option<Range<usize>> {
    let (first, mut pos) = next_line(s, 0)?;
    let opener = first.strip_prefix("---")?;
    if !opener.bytes().all(|b| b.is_ascii_whitespace()) {
        return None;
    }
    let mut first_inner = true;
    while let Some((line, next)) = next_line(s, pos) {
        let trimmed = line.trim_end_matches([' ', '\t']);
        if trimmed == "---" || trimmed == "..." {
            return Some(0..next);
        }
        if first_inner && line.trim().is_empty() {
            return None;
        }
        first_inner = false;
        pos = next;
    }
    None
}

/// The value of the top-level frontmatter property `key` (one line, trimmed; quotes
/// removed), if the note has frontmatter with that key. For vaultd's own one-word values
/// (`tool_note`), not a YAML parser.
pub fn frontmatter_property<'t>(text: &'t str, key: &str) -> Option<&'t str> {
    let start = if text.starts_with('\u{FEFF}') { 3 } else { 0 };
    let span = find_frontmatter(&text[start..])?;
    let fm = &text[start..start + span.end];
    fm.lines().skip(1).find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let v = rest.trim().trim_matches(|c| c == '"' || c == '\'');
        (!v.is_empty()).then_some(v)
    })
}

/// The value of a top-level `key: value` line, unquoted.
pub fn line_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(key)?.strip_prefix(':')?;
    let v = rest.trim();
    let v = v
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
        .unwrap_or(v);
    (!v.is_empty()).then_some(v)
}

/// The frontmatter properties of `text` (empty when it has none).
pub fn read_properties(text: &str) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(span) = span(text) else {
        return out;
    };
    let lines: Vec<&str> = text[span].split_inclusive('\n').collect();
    if lines.len() < 2 {
        return out;
    }
    let body = &lines[1..lines.len() - 1];
    let mut i = 0;
    while i < body.len() {
        let line = body[i].trim_end_matches(['\n', '\r']);
        i += 1;
        let Some((key, value)) = top_level_key(line) else {
            continue;
        };
        let value = value.trim();
        if value.is_empty() {
            let mut items = Vec::new();
            while i < body.len() && is_continuation(body[i]) {
                let item = body[i].trim();
                if let Some(rest) = item.strip_prefix('-') {
                    items.push(scalar(rest.trim()));
                }
                i += 1;
            }
            out.insert(
                key.to_string(),
                if items.is_empty() {
                    Value::Null
                } else {
                    Value::Array(items)
                },
            );
        } else {
            while i < body.len() && is_continuation(body[i]) {
                i += 1;
            }
            out.insert(key.to_string(), flow(value));
        }
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
        && let Ok(v) = serde_json::from_str::<Value>(value)
    {
        return v;
    }
    scalar(value)
}

fn scalar(s: &str) -> Value {
    // A trailing comment (` #…`) is not part of a plain scalar.
    let s = match s.find(" #") {
        Some(at) if !s.starts_with(['"', '\'']) => s[..at].trim_end(),
        _ => s,
    };
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

/// Sets (or, for `null`, removes) the named top-level properties of `text`, touching only
/// their lines; a note without frontmatter gets one (after a BOM). New keys go before the
/// closing `---`, in the order given.
pub fn set_properties(text: &str, props: &Map<String, Value>) -> String {
    let eol = detect_line_ending(text).as_str();
    let mut out = String::with_capacity(text.len() + 64);
    let Some(span) = span(text) else {
        let adds: Vec<(&String, &Value)> = props.iter().filter(|(_, v)| !v.is_null()).collect();
        if adds.is_empty() {
            return text.to_string();
        }
        let at = bom_len(text);
        out.push_str(&text[..at]);
        out.push_str("---");
        out.push_str(eol);
        for (k, v) in adds {
            push_property(&mut out, k, v, eol);
        }
        out.push_str("---");
        out.push_str(eol);
        out.push_str(&text[at..]);
        return out;
    };
    let lines: Vec<&str> = text[span.clone()].split_inclusive('\n').collect();
    let closer = lines.len() - 1;
    let mut done: Vec<&str> = Vec::new();
    out.push_str(&text[..span.start]);
    out.push_str(lines[0]);
    let mut i = 1;
    while i < closer {
        let line = lines[i];
        let key = top_level_key(line.trim_end_matches(['\n', '\r'])).map(|(k, _)| k);
        match key.and_then(|k| props.get_key_value(k)) {
            Some((k, v)) if !done.contains(&k.as_str()) => {
                if !v.is_null() {
                    push_property(&mut out, k, v, eol);
                }
                done.push(k);
                i += 1;
                while i < closer && is_continuation(lines[i]) {
                    i += 1;
                }
            }
            _ => {
                out.push_str(line);
                i += 1;
            }
        }
    }
    // A frontmatter whose last line has no line break before the closer cannot happen (the
    // closer is its own line); new keys go right before the closer.
    for (k, v) in props {
        if !v.is_null() && !done.contains(&k.as_str()) {
            push_property(&mut out, k, v, eol);
        }
    }
    out.push_str(lines[closer]);
    out.push_str(&text[span.end..]);
    out
}

fn push_property(out: &mut String, key: &str, value: &Value, eol: &str) {
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

/// Replaces the line of each property (and its indented continuation lines), inserts the
/// missing ones before the closing `---`; every other byte stays as it was.
pub(crate) fn set_frontmatter(text: &str, props: &[(&str, String)]) -> String {
    let eol = detect_line_ending(text).as_str();
    let mut out = String::with_capacity(text.len() + 160);
    let Some(span) = span(text) else {
        let at = bom_len(text);
        out.push_str(&text[..at]);
        out.push_str("---");
        out.push_str(eol);
        for (key, value) in props {
            push_line(&mut out, key, value, eol);
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
                push_line(&mut out, props[k].0, &props[k].1, eol);
                written[k] = true;
                i += 1;
                while i < closer && is_continuation_line(lines[i]) {
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
            push_line(&mut out, key, value, eol);
        }
    }
    out.push_str(lines[closer]);
    out.push_str(&text[span.end..]);
    out
}

fn push_line(out: &mut String, key: &str, value: &str, eol: &str) {
    out.push_str(key);
    out.push_str(": ");
    out.push_str(value);
    out.push_str(eol);
}

/// A line that belongs to the YAML value above it: indented, or a `- item` of a sequence.
fn is_continuation_line(line: &str) -> bool {
    line.starts_with([' ', '\t'])
        || line == "-\n"
        || line == "-\r\n"
        || line.starts_with("- ")
        || line.starts_with("-\t")
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
        let out = set_properties(
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
            set_properties("Hello", &map(json!({ "a": "b: c" }))),
            "---\na: \"b: c\"\n---\nHello"
        );
        assert_eq!(set_properties("Hello", &map(json!({ "a": null }))), "Hello");
    }

    #[test]
    fn strings_that_would_read_back_differently_are_quoted() {
        for s in ["true", "12", "", "a: b", "#x", "- x", "null", "x #y"] {
            let out = set_properties("---\n---\n", &map(json!({ "k": s })));
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
}
