//! `vault_append` (state_change): text added at the end of a note, or at the end of one
//! heading's section, in the note's own line endings.

use super::paths::Access;
use super::{
    Planned, ToolDef, VaultCall, VaultContext, changed, check_if_sha256, edit_note, opt_param,
    param, path_and_hash, read_text,
};
use crate::call::{CallError, ErrorCode, ToolOutput};
use crate::tools::{ApprovalRule, Effect};
use serde_json::json;

pub fn tool() -> ToolDef {
    ToolDef {
        description: "Append text to a note, at its end or at the end of the section under a heading. if_sha256 makes it fail with CONFLICT when the note changed since it was read.",
        effect: Effect::StateChange,
        approval: ApprovalRule::Never,
        schema: json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "minLength": 1, "maxLength": 1024 },
                "text": { "type": "string", "minLength": 1, "maxLength": 1048576 },
                "heading": { "type": "string", "minLength": 1, "maxLength": 500, "description": "Heading text (without #); the text goes at the end of its section" },
                "if_sha256": { "type": "string", "pattern": "^[0-9a-fA-F]{64}$" }
            },
            "required": ["path", "text"],
            "additionalProperties": false
        }),
        run,
        plan: Some(planned),
    }
}

pub fn run(context: &VaultContext, call: &VaultCall) -> Result<ToolOutput, CallError> {
    let note = context.paths.note(param(call, "path"), Access::Write)?;
    let addition = param(call, "text");
    let heading = opt_param(call, "heading");
    let (change, written) = edit_note(context, call, "vault_append", &note, |current| {
        check_if_sha256(call, &note.rel, current)?;
        append(current, addition, heading)
    })?;
    Ok(changed(
        path_and_hash(&note.rel, &written),
        format!("appended to {}", note.rel),
        vec![change],
    ))
}

/// The edit `run` would make, for a preview (docs/design.md §12.1); nothing is written.
pub fn planned(context: &VaultContext, call: &VaultCall) -> Result<Vec<Planned>, CallError> {
    let note = context.paths.note(param(call, "path"), Access::Write)?;
    let current = read_text(&note)?;
    check_if_sha256(call, &note.rel, &current)?;
    let after = append(&current, param(call, "text"), opt_param(call, "heading"))?;
    Ok(vec![Planned::edited(&note.rel, current, after)])
}

/// Pure: `text` with `addition` appended (at the end, or at the end of `heading`'s section).
pub fn append(text: &str, addition: &str, heading: Option<&str>) -> Result<String, CallError> {
    let eol = crate::note::parse::parse_note(text).line_ending.as_str();
    let mut block = addition.replace("\r\n", "\n");
    if !block.ends_with('\n') {
        block.push('\n');
    }
    let block = if eol == "\r\n" {
        block.replace('\n', "\r\n")
    } else {
        block
    };
    let at = match heading {
        None => text.len(),
        Some(h) => section_end(text, h).ok_or_else(|| {
            CallError::new(ErrorCode::NotFound, format!("no heading `{h}` in the note"))
        })?,
    };
    let mut out = String::with_capacity(text.len() + block.len() + 2);
    out.push_str(&text[..at]);
    if at > 0 && !text[..at].ends_with('\n') {
        out.push_str(eol);
    }
    out.push_str(&block);
    out.push_str(&text[at..]);
    Ok(out)
}

/// Byte offset where the section under heading `h` ends: the start of the next heading of
/// the same or a higher level, or the end of the text.
fn section_end(text: &str, h: &str) -> Option<usize> {
    let mut offset = 0;
    let mut level: Option<usize> = None;
    let mut in_code = false;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let l = line.trim_end();
        if l.trim_start().starts_with("```") || l.trim_start().starts_with("~~~") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let hashes = l.len() - l.trim_start_matches('#').len();
        let is_heading = (1..=6).contains(&hashes) && l[hashes..].starts_with(' ');
        match level {
            None if is_heading && l[hashes..].trim() == h.trim() => level = Some(hashes),
            Some(n) if is_heading && hashes <= n => return Some(start),
            _ => {}
        }
    }
    level.map(|_| text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_at_the_end_in_the_notes_line_endings() {
        assert_eq!(append("a\n", "b", None).unwrap(), "a\nb\n");
        assert_eq!(append("a", "b", None).unwrap(), "a\nb\n");
        assert_eq!(append("a\r\n", "b\nc", None).unwrap(), "a\r\nb\r\nc\r\n");
        assert_eq!(append("", "b", None).unwrap(), "b\n");
    }

    #[test]
    fn appends_at_the_end_of_a_section() {
        let text = "# Top\nintro\n## Log\n- one\n### Sub\nx\n## Next\ny\n";
        assert_eq!(
            append(text, "- two", Some("Log")).unwrap(),
            "# Top\nintro\n## Log\n- one\n### Sub\nx\n- two\n## Next\ny\n"
        );
        assert_eq!(
            append(text, "z", Some("Next")).unwrap(),
            format!("{text}z\n")
        );
        let e = append(text, "z", Some("Missing")).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        // A heading inside a code block is not a heading.
        assert!(append("```\n# Log\n```\n", "z", Some("Log")).is_err());
    }
}
