//! Dry run (DESIGN §12.1): every pending call of a note in `Dry_Run/` gets, once, a folded
//! `[!example]-` callout holding a `tool_preview` — call id, tool, validated parameters,
//! effect, the policy's decision and what would happen — and nothing runs: no request, no
//! rate limit, no journal record. `vaultd check --preview` prints the same previews.

use crate::note::{CallBody, ParsedNote};
use crate::secret::Redactor;
use crate::tools::{Admission, Registry, ToolCall};
use serde_json::{Map, Value, json};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// The title of a preview callout starts with this; the call id ends it.
const TITLE_PREFIX: &str = "> [!example]- preview · ";

/// The `tool_preview` objects of the pending calls of `parsed` that have none in the note
/// yet, in call order. `note` is the note's vault-relative path (tools may show it).
pub fn previews(
    registry: &Registry,
    redactor: &Redactor,
    parsed: &ParsedNote,
    text: &str,
    note: &str,
) -> Vec<Value> {
    let shown = previewed_ids(text);
    parsed
        .pending_calls()
        .filter(|c| !shown.contains(&c.call_id))
        .map(|c| {
            let preview = match &c.body {
                CallBody::Broken(e) => json!({
                    "call_id": c.call_id,
                    "name": c.name.clone().unwrap_or_else(|| "tool_call".to_string()),
                    "decision": { "action": "deny", "code": e.code.as_str(), "reason": e.message },
                    "would": { "description": "nothing: the call block is not a valid tool call" },
                }),
                CallBody::Call { name, parameters } => {
                    preview_call(registry, &c.call_id, name, parameters, note)
                }
            };
            redact(redactor, preview)
        })
        .collect()
}

/// One call's `tool_preview`.
fn preview_call(
    registry: &Registry,
    call_id: &str,
    name: &str,
    parameters: &Map<String, Value>,
    note: &str,
) -> Value {
    let tool = match registry.resolve(name, parameters) {
        Ok(tool) => tool,
        Err(e) => {
            return json!({
                "call_id": call_id,
                "name": name,
                "parameters": parameters,
                "decision": { "action": "deny", "code": e.code.as_str(), "reason": e.message },
                "would": { "description": format!("nothing: the call would get {}", e.code) },
            });
        }
    };
    let decision = match tool.admit(parameters) {
        Admission::Run => json!({ "action": "run" }),
        Admission::Hold { reason } => json!({
            "action": "hold",
            "reason": format!("{reason}; it would wait in Pending_Approval/ for a person"),
        }),
        Admission::Deny(e) => {
            json!({ "action": "deny", "code": e.code.as_str(), "reason": e.message })
        }
    };
    let would = tool.tool.preview(ToolCall {
        call_id,
        note,
        parameters,
        deadline: Instant::now() + tool.policy.timeout.max(Duration::from_millis(1)),
    });
    json!({
        "call_id": call_id,
        "name": name,
        "effect": tool.spec().effect.as_str(),
        "parameters": parameters,
        "decision": decision,
        "would": would,
    })
}

fn redact(redactor: &Redactor, v: Value) -> Value {
    if redactor.is_empty() {
        return v;
    }
    let text = v.to_string();
    let clean = redactor.redact(&text);
    if clean == text {
        v
    } else {
        serde_json::from_str(&clean).unwrap_or(Value::String(clean))
    }
}

/// Call ids that already have a preview callout in the note: previews are written once.
pub fn previewed_ids(text: &str) -> HashSet<String> {
    text.lines()
        .filter_map(|l| l.trim_end().strip_prefix(TITLE_PREFIX))
        .filter_map(|rest| rest.rsplit(" · ").next())
        .map(str::to_string)
        .collect()
}

/// The lines of one folded `[!example]-` callout (without line breaks).
pub fn preview_callout(preview: &Value) -> Vec<String> {
    let name = preview["name"].as_str().unwrap_or("tool_call");
    let call_id = preview["call_id"].as_str().unwrap_or("");
    let action = preview["decision"]["action"].as_str().unwrap_or("?");
    let title = format!("{name} · would {action} · {call_id}").replace(['\r', '\n'], " ");
    let mut lines = vec![format!(
        "{TITLE_PREFIX}{}",
        crate::guard::text::escape_untrusted(&title)
    )];
    crate::note::render::push_json_fence(&mut lines, &json!({ "tool_preview": preview }));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::note::parse_note;

    #[test]
    fn a_written_preview_is_recognised_and_stays_inert() {
        let preview = json!({
            "call_id": "c-1", "name": "search_web",
            "decision": { "action": "run" },
            "would": { "description": "```\n> x\n\u{202e}" },
        });
        let lines = preview_callout(&preview);
        assert!(lines[0].starts_with("> [!example]- preview · search_web · would run · c-1"));
        let text = format!("# n\n\n{}\n", lines.join("\n"));
        assert!(previewed_ids(&text).contains("c-1"));
        let parsed = parse_note(&text);
        assert!(parsed.calls.is_empty());
        assert!(parsed.results.is_empty());
        assert!(!text.contains('\u{202e}'));
        assert!(lines.iter().all(|l| l.starts_with("> ")));
    }
}
