//! `vault_tasks` (read_only): Obsidian tasks (`- [ ]`, `- [x]`, also `*`/`+` bullets,
//! numbered lists `1.`/`1)`, and nested) of the notes the read policy allows. Lines inside
//! fenced code blocks are not tasks.

use super::list::walk_notes;
use super::{ToolDef, VaultCall, VaultContext, opt_param};
use crate::call::{CallError, ToolOutput};
use crate::tools::{ApprovalRule, Effect};
use serde_json::{Value, json};

/// At most this many tasks in one result.
const MAX_TASKS: usize = 500;

pub fn tool() -> ToolDef {
    ToolDef {
        description: "List the tasks (- [ ] / - [x] items, also numbered and nested) of the vault's notes, with note path and line number.",
        effect: Effect::ReadOnly,
        approval: ApprovalRule::Never,
        schema: json!({
            "type": "object",
            "properties": {
                "folder": { "type": "string", "maxLength": 1024, "description": "Only notes under this vault-relative folder" },
                "done": { "type": "boolean", "description": "Only done (true) or only open (false) tasks; absent: both" }
            },
            "additionalProperties": false
        }),
        run,
        plan: None,
    }
}

/// One task line: where its checkbox character is, whether it is ticked, and its text.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskLine<'a> {
    /// Byte offset of the character between `[` and `]`.
    pub mark_at: usize,
    pub done: bool,
    pub text: &'a str,
}

/// Parses one line (without its line break) as a task.
pub fn parse_task(line: &str) -> Option<TaskLine<'_>> {
    let indent = line.len() - line.trim_start_matches([' ', '\t', '>']).len();
    let rest = &line[indent..];
    let after_marker = if let Some(r) = rest.strip_prefix(['-', '*', '+']) {
        r
    } else {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 || digits > 9 {
            return None;
        }
        rest[digits..].strip_prefix(['.', ')'])?
    };
    let spaces = after_marker.len() - after_marker.trim_start_matches([' ', '\t']).len();
    if spaces == 0 {
        return None;
    }
    let boxed = &after_marker[spaces..];
    let mut chars = boxed.char_indices();
    if chars.next()?.1 != '[' {
        return None;
    }
    let (_, mark) = chars.next()?;
    if boxed.get(1 + mark.len_utf8()..2 + mark.len_utf8())? != "]" {
        return None;
    }
    let done = match mark {
        ' ' => false,
        'x' | 'X' => true,
        _ => return None,
    };
    let text = &boxed[2 + mark.len_utf8()..];
    if !(text.is_empty() || text.starts_with([' ', '\t'])) {
        return None;
    }
    let mark_at = line.len() - boxed.len() + 1;
    Some(TaskLine {
        mark_at,
        done,
        text: text.trim(),
    })
}

/// Every task of `text`, with 1-based line numbers; fenced code is skipped.
pub fn tasks_of(text: &str) -> Vec<(usize, TaskLine<'_>)> {
    let mut fence: Option<(char, usize)> = None;
    let mut out = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim_start();
        let opener = trimmed
            .chars()
            .next()
            .filter(|c| *c == '`' || *c == '~')
            .map(|c| (c, trimmed.len() - trimmed.trim_start_matches(c).len()));
        match (fence, opener) {
            (None, Some((c, n))) if n >= 3 => {
                fence = Some((c, n));
                continue;
            }
            (Some((c, n)), Some((c2, m)))
                if c == c2 && m >= n && trimmed.trim_start_matches(c).trim().is_empty() =>
            {
                fence = None;
                continue;
            }
            (Some(_), _) => continue,
            _ => {}
        }
        if let Some(task) = parse_task(line) {
            out.push((i + 1, task));
        }
    }
    out
}

pub fn run(context: &VaultContext, call: &VaultCall) -> Result<ToolOutput, CallError> {
    let (_, dir) = context.paths.folder(opt_param(call, "folder"))?;
    let want = call.parameters.get("done").and_then(Value::as_bool);
    let mut tasks = Vec::new();
    let mut truncated = false;
    if dir.is_dir() {
        'notes: for rel in walk_notes(context, &dir, true) {
            let Ok(text) = crate::vault::read_regular_text(&context.paths.root().join(&rel)) else {
                continue;
            };
            for (line, task) in tasks_of(&text) {
                if want.is_some_and(|w| w != task.done) {
                    continue;
                }
                if tasks.len() == MAX_TASKS {
                    truncated = true;
                    break 'notes;
                }
                tasks.push(
                    json!({ "path": rel, "line": line, "text": task.text, "done": task.done }),
                );
            }
        }
    }
    let n = tasks.len();
    Ok(ToolOutput {
        data: json!({ "tasks": tasks, "truncated": truncated }),
        summary: format!("{n} tasks"),
        undo: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_syntax_in_bullets_numbered_lists_and_nesting() {
        let text = "- [ ] one\n* [x] two\n+ [X] three\n1. [ ] four\n12) [x] five\n    - [ ] nested six\n\t- [x] tab seven\n- [-] not a task\n-[ ] no space\n- [ ]glued\n- plain\n```\n- [ ] in code\n```\n> - [ ] quoted eight\n- [ ]\r\n";
        let got: Vec<(usize, bool, &str)> = tasks_of(text)
            .into_iter()
            .map(|(l, t)| (l, t.done, t.text))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, false, "one"),
                (2, true, "two"),
                (3, true, "three"),
                (4, false, "four"),
                (5, true, "five"),
                (6, false, "nested six"),
                (7, true, "tab seven"),
                (15, false, "quoted eight"),
                (16, false, ""),
            ]
        );
    }

    #[test]
    fn the_mark_offset_points_at_the_checkbox() {
        for line in ["- [ ] a", "  10. [x] b", "\t* [X] c"] {
            let t = parse_task(line).unwrap();
            assert!(
                matches!(&line[t.mark_at..t.mark_at + 1], " " | "x" | "X"),
                "{line}"
            );
            assert_eq!(&line[t.mark_at - 1..t.mark_at], "[");
        }
    }
}
