//! Pure: a note's frontmatter properties read into JSON, and edits that touch only the named
//! properties' lines (every other byte — line endings, BOM, comments, odd YAML, a missing
//! final newline — stays as it was).
//!
//! There is no YAML library among vaultd's dependencies, and Obsidian properties are a small
//! subset of YAML: top-level `key: value` lines, with lists either `[a, b]` or `- item` lines
//! below the key. That subset is read; anything else (nested maps, block scalars) is read as
//! the raw text of its first line. Values are written as JSON, which is valid YAML (lists of
//! scalars as `- item` lines, as Obsidian writes them).

use crate::note::parse::parse_note;
use serde_json::{Map, Value};

/// The frontmatter properties of `text` (empty when it has none).
pub fn read_properties(text: &str) -> Map<String, Value> {
    let mut out = Map::new();
    let note = parse_note(text);
    let Some(span) = note.frontmatter else {
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
    let note = parse_note(text);
    let eol = note.line_ending.as_str();
    let mut out = String::with_capacity(text.len() + 64);
    let Some(span) = note.frontmatter else {
        let adds: Vec<(&String, &Value)> = props.iter().filter(|(_, v)| !v.is_null()).collect();
        if adds.is_empty() {
            return text.to_string();
        }
        let at = if note.bom { 3 } else { 0 };
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
}
