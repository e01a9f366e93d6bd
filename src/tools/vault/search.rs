//! `vault_search` (read_only): word search over every note the read policy allows.
//!
//! Built on ripgrep's library crates rather than an index: `ignore` walks the vault (no
//! symlinks followed, hidden folders skipped), `grep-regex` builds one case-insensitive
//! literal-alternation matcher of the query words, `grep-searcher` scans each file (memory
//! maps, line counting). Nothing to keep fresh, nothing stale after an editor's save, and a
//! full scan of a 50 MB vault stays well inside the call budget (BENCHMARKS.md).

use super::list::walk_notes;
use super::{ToolDef, VaultCall, VaultContext, execution, opt_param};
use crate::call::{CallError, ErrorCode, ToolOutput};
use crate::note::frontmatter::read_properties;
use crate::tools::{ApprovalRule, Effect};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::sinks::Lossy;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use serde_json::{Value, json};

/// A matching line is cut to this many characters in the result.
const MAX_LINE_CHARS: usize = 300;

pub fn tool() -> ToolDef {
    ToolDef {
        description: "Search the vault's notes for words (all must occur in a note; case-insensitive). Returns matching lines with their note path and line number.",
        effect: Effect::ReadOnly,
        approval: ApprovalRule::Never,
        schema: json!({
            "type": "object",
            "properties": {
                "query": { "type": "string", "minLength": 1, "maxLength": 500, "description": "Words; a note matches when it contains all of them" },
                "folder": { "type": "string", "maxLength": 1024, "description": "Only notes under this vault-relative folder" },
                "tag": { "type": "string", "minLength": 1, "maxLength": 200, "description": "Only notes with this tag (#tag in the text or in the tags property)" },
                "limit": { "type": "integer", "minimum": 1, "maximum": 100, "default": 20 }
            },
            "required": ["query"],
            "additionalProperties": false
        }),
        run,
        plan: None,
    }
}

pub fn run(context: &VaultContext, call: &VaultCall) -> Result<ToolOutput, CallError> {
    let query = opt_param(call, "query").unwrap_or_default();
    let limit = call
        .parameters
        .get("limit")
        .and_then(Value::as_u64)
        .unwrap_or(20) as usize;
    let tag = opt_param(call, "tag").map(|t| t.trim_start_matches('#').to_lowercase());
    let (_, dir) = context.paths.folder(opt_param(call, "folder"))?;
    let (matches, truncated) = search(context, query, &dir, tag.as_deref(), limit)?;
    let n = matches.len();
    Ok(ToolOutput {
        data: json!({ "matches": matches, "truncated": truncated }),
        summary: format!("{n} matches{}", if truncated { " (more)" } else { "" }),
        undo: None,
    })
}

/// The matching lines, at most `limit`, and whether there were more.
pub fn search(
    context: &VaultContext,
    query: &str,
    dir: &std::path::Path,
    tag: Option<&str>,
    limit: usize,
) -> Result<(Vec<Value>, bool), CallError> {
    let mut words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
    words.sort();
    words.dedup();
    if words.is_empty() {
        return Err(CallError::new(
            ErrorCode::InvalidParams,
            "query has no words",
        ));
    }
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(true)
        .fixed_strings(true)
        .build_literals(&words)
        .map_err(|e| execution(format!("cannot build the search: {e}")))?;
    let mut searcher = SearcherBuilder::new()
        .line_number(true)
        .binary_detection(BinaryDetection::quit(0))
        .build();
    let root = context.paths.root();
    let mut out = Vec::new();
    let mut truncated = false;
    if !dir.is_dir() {
        return Ok((out, false));
    }
    for rel in walk_notes(context, dir, true) {
        let mut lines: Vec<(u64, String)> = Vec::new();
        let path = root.join(&rel);
        // Opened as a regular file first: a FIFO put there after the walk is skipped, never
        // waited on (docs/design.md §9.15).
        let Ok(file) = crate::vault::open_regular(&path) else {
            continue;
        };
        let searched = searcher.search_file(
            &matcher,
            &file,
            Lossy(|n, line| {
                lines.push((n, line.trim_end_matches(['\n', '\r']).to_string()));
                Ok(true)
            }),
        );
        if searched.is_err() || lines.is_empty() {
            continue;
        }
        let all_words = words.iter().all(|w| {
            lines
                .iter()
                .any(|(_, l)| l.to_lowercase().contains(w.as_str()))
        });
        if !all_words {
            continue;
        }
        if let Some(tag) = tag
            && !has_tag(&path, tag)
        {
            continue;
        }
        for (n, line) in lines {
            if out.len() == limit {
                truncated = true;
                break;
            }
            let text: String = line.trim().chars().take(MAX_LINE_CHARS).collect();
            out.push(json!({ "path": rel, "line": n, "text": text }));
        }
        if truncated {
            break;
        }
    }
    Ok((out, truncated))
}

/// `#tag` (or `#tag/sub`) in the text, or `tag` in the `tags` property.
fn has_tag(path: &std::path::Path, tag: &str) -> bool {
    let Ok(text) = crate::vault::read_regular_text(path) else {
        return false;
    };
    let in_property = match read_properties(&text).get("tags") {
        Some(Value::Array(items)) => items.iter().any(|t| {
            t.as_str()
                .is_some_and(|t| t.trim_start_matches('#').eq_ignore_ascii_case(tag))
        }),
        Some(Value::String(s)) => s
            .split([',', ' '])
            .any(|t| t.trim_start_matches('#').eq_ignore_ascii_case(tag)),
        _ => false,
    };
    if in_property {
        return true;
    }
    let lower = text.to_lowercase();
    let needle = format!("#{tag}");
    lower.match_indices(&needle).any(|(at, _)| {
        let before_ok = at == 0 || !lower[..at].ends_with(|c: char| c.is_alphanumeric());
        let after = &lower[at + needle.len()..];
        let after_ok = after
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '-'));
        before_ok && after_ok
    })
}
