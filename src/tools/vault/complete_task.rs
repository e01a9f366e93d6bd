//! `vault_complete_task` (state_change): ticks (or unticks) one task line, named by line
//! number *and* text so a note edited meanwhile is a `CONFLICT`, not a wrong tick.

use super::paths::Access;
use super::tasks::parse_task;
use super::{
    Planned, ToolDef, VaultCall, VaultContext, changed, conflict, edit_note, param, path_and_hash,
    read_text,
};
use crate::call::{CallError, ToolOutput};
use crate::tools::{ApprovalRule, Effect};
use serde_json::{Value, json};

pub fn tool() -> ToolDef {
    ToolDef {
        description: "Mark a task (- [ ] line) done or not done. Give its line number and text as vault_tasks returned them; a line whose text differs is a CONFLICT.",
        effect: Effect::StateChange,
        approval: ApprovalRule::Never,
        schema: json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "minLength": 1, "maxLength": 1024 },
                "line": { "type": "integer", "minimum": 1 },
                "text": { "type": "string", "maxLength": 10000 },
                "done": { "type": "boolean", "default": true }
            },
            "required": ["path", "line", "text"],
            "additionalProperties": false
        }),
        run,
        plan: Some(planned),
    }
}

/// The `line`, `text` and `done` parameters.
fn task_params(call: &VaultCall) -> (usize, String, bool) {
    let line = call
        .parameters
        .get("line")
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize;
    let want_text = param(call, "text").trim().to_string();
    let done = call
        .parameters
        .get("done")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    (line, want_text, done)
}

/// The edit `run` would make, for a preview (docs/design.md §12.1); nothing is written.
pub fn planned(context: &VaultContext, call: &VaultCall) -> Result<Vec<Planned>, CallError> {
    let note = context.paths.note(param(call, "path"), Access::Write)?;
    let (line, want_text, done) = task_params(call);
    let current = read_text(&note)?;
    let after = set_task(&current, line, &want_text, done)?;
    Ok(vec![Planned::edited(&note.rel, current, after)])
}

pub fn run(context: &VaultContext, call: &VaultCall) -> Result<ToolOutput, CallError> {
    let note = context.paths.note(param(call, "path"), Access::Write)?;
    let (line, want_text, done) = task_params(call);
    let (change, written) = edit_note(context, call, "vault_complete_task", &note, |current| {
        set_task(current, line, &want_text, done)
    })?;
    Ok(changed(
        path_and_hash(&note.rel, &written),
        format!("task {}", if done { "done" } else { "reopened" }),
        vec![change],
    ))
}

/// Pure: `text` with the task on 1-based `line` set to `done`, if its text is `want`.
pub fn set_task(text: &str, line: usize, want: &str, done: bool) -> Result<String, CallError> {
    let mut offset = 0;
    for (i, raw) in text.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            let content = raw.trim_end_matches(['\n', '\r']);
            let Some(task) = parse_task(content) else {
                return Err(conflict(format!("line {line} is not a task: `{content}`"))
                    .with_details(json!({ "line": line, "found": content })));
            };
            if task.text != want {
                return Err(conflict(format!(
                    "line {line} is the task `{}`, not `{want}`; list the tasks again",
                    task.text
                ))
                .with_details(json!({ "line": line, "found": task.text })));
            }
            let at = offset + task.mark_at;
            let mark_len = text[at..].chars().next().map_or(1, char::len_utf8);
            let mut out = String::with_capacity(text.len());
            out.push_str(&text[..at]);
            out.push(if done { 'x' } else { ' ' });
            out.push_str(&text[at + mark_len..]);
            return Ok(out);
        }
        offset += raw.len();
    }
    Err(conflict(format!("the note has no line {line}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::ErrorCode;

    #[test]
    fn ticks_only_the_checkbox() {
        let text = "# T\r\n1. [ ] buy milk  \r\n  - [x] nested\r\n";
        assert_eq!(
            set_task(text, 2, "buy milk", true).unwrap(),
            "# T\r\n1. [x] buy milk  \r\n  - [x] nested\r\n"
        );
        assert_eq!(
            set_task(text, 3, "nested", false).unwrap(),
            "# T\r\n1. [ ] buy milk  \r\n  - [ ] nested\r\n"
        );
    }

    #[test]
    fn a_different_line_is_a_conflict() {
        let text = "- [ ] a\n- [ ] b\nplain\n";
        for (line, want) in [(1, "b"), (3, "plain"), (9, "a")] {
            assert_eq!(
                set_task(text, line, want, true).unwrap_err().code,
                ErrorCode::Conflict
            );
        }
    }
}
