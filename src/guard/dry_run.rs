//! Dry run (docs/design.md §12.1): every pending call of a note in `Dry_Run/` gets, once, a folded
//! `[!example]-` callout holding a `tool_preview` — call id, tool, validated parameters,
//! effect, the policy's decision and what would happen — and nothing runs: no request, no
//! rate limit, no journal record. `vaultd check --preview` prints the same previews.

use crate::guard::breaker::{CircuitStatus, circuit_key};
use crate::guard::budget;
use crate::note::{CallBody, ParsedNote};
use crate::secret::Redactor;
use crate::tools::{Admission, Registry, ToolCall};
use serde_json::{Map, Value, json};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// The title of a preview callout starts with this; the call id ends it.
use crate::note::render::TITLE_PREFIX;

/// What stops calls now beyond their policy: the note's budget and open circuits. The
/// daemon knows both; `vaultd check --preview` knows what the state dir records.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// How many more calls the note may start (`note_budget`); `None` when unknown.
    pub budget_left: Option<u64>,
    pub note_budget: u64,
    /// The circuits that are not closed.
    pub circuits: Vec<CircuitStatus>,
}

/// The `tool_preview` objects of the pending calls of `parsed` that have none in the note
/// yet, in call order. `note` is the note's vault-relative path (tools may show it).
pub fn previews(
    registry: &Registry,
    redactor: &Redactor,
    parsed: &ParsedNote,
    text: &str,
    note: &str,
    facts: &Facts,
) -> Vec<Value> {
    let shown = previewed_ids(text);
    let mut budget_left = facts.budget_left;
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
                    let mut p = preview_call(registry, &c.call_id, name, parameters, note);
                    apply_facts(&mut p, registry, name, facts, &mut budget_left);
                    p
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
        // A dry run has no note identity yet (nothing is claimed).
        note_id: "",
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

/// Turns a `run` or `hold` decision into the denial the budget or an open circuit would give,
/// in call order, as the daemon would.
fn apply_facts(
    preview: &mut Value,
    registry: &Registry,
    name: &str,
    facts: &Facts,
    budget_left: &mut Option<u64>,
) {
    let action = preview["decision"]["action"].as_str().unwrap_or("");
    if action != "run" && action != "hold" {
        return;
    }
    if *budget_left == Some(0) {
        let e = budget::spent(facts.note_budget);
        preview["decision"] =
            json!({ "action": "deny", "code": e.code.as_str(), "reason": e.message });
        return;
    }
    if action == "hold" {
        return;
    }
    if let Some(left) = budget_left.as_mut() {
        *left -= 1;
    }
    let Some(key) = registry.get(name).map(|t| circuit_key(t.spec())) else {
        return;
    };
    let now = crate::call::rfc3339_seconds(std::time::SystemTime::now());
    // RFC 3339 UTC strings of one format compare like the times they name.
    if let Some(c) = facts
        .circuits
        .iter()
        .find(|c| c.key == key && c.until.as_deref().is_none_or(|u| u > now.as_str()))
    {
        let until = c.until.as_deref().unwrap_or("a trial call decides");
        preview["decision"] = json!({
            "action": "deny",
            "code": "EXECUTION_ERROR",
            "reason": format!(
                "circuit {key} is {} (until {until}) after {} failures in a row; the call would fail at once (retryable)",
                c.state, c.failures
            ),
        });
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::note::parse_note;
    use crate::note::render::preview_callout;

    fn registry() -> Registry {
        Registry::from_config(
            &crate::config::ToolsConfig::defaults(),
            reqwest::Client::new(),
            None,
        )
        .unwrap()
    }

    fn three_searches() -> String {
        (0..3)
            .map(|i| {
                format!(
                    "```json\n{{\"tool_call\": {{\"name\": \"search_web\", \"parameters\": {{\"query\": \"q{i}\"}}}}}}\n```\n"
                )
            })
            .collect()
    }

    fn actions(previews: &[Value]) -> Vec<(String, String)> {
        previews
            .iter()
            .map(|p| {
                (
                    p["decision"]["action"].as_str().unwrap().to_string(),
                    p["decision"]["code"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn the_budget_and_open_circuits_show_in_the_decision() {
        let registry = registry();
        let redactor = Redactor::new(Vec::new(), &[]);
        let text = three_searches();
        let parsed = parse_note(&text);
        let run =
            |facts: &Facts| actions(&previews(&registry, &redactor, &parsed, "", "n.md", facts));
        let free = run(&Facts::default());
        assert!(free.iter().all(|(a, _)| a == "run"), "{free:?}");
        let one_left = run(&Facts {
            budget_left: Some(1),
            note_budget: 5,
            circuits: Vec::new(),
        });
        assert_eq!(one_left[0].0, "run");
        assert_eq!(
            one_left[1],
            ("deny".to_string(), "QUOTA_EXCEEDED".to_string())
        );
        assert_eq!(
            one_left[2],
            ("deny".to_string(), "QUOTA_EXCEEDED".to_string())
        );
        let open = |until: &str| CircuitStatus {
            key: "search_web".into(),
            state: "open".into(),
            until: Some(until.into()),
            failures: 5,
            last_error: "EXECUTION_ERROR: 503".into(),
        };
        let broken = run(&Facts {
            circuits: vec![open("2999-01-01T00:00:00Z")],
            ..Facts::default()
        });
        assert!(
            broken
                .iter()
                .all(|d| d == &("deny".to_string(), "EXECUTION_ERROR".to_string()))
        );
        // A cool-down that is over lets the trial run.
        let over = run(&Facts {
            circuits: vec![open("2000-01-01T00:00:00Z")],
            ..Facts::default()
        });
        assert!(over.iter().all(|(a, _)| a == "run"), "{over:?}");
    }

    #[test]
    fn a_call_previewed_once_is_not_previewed_again() {
        let registry = registry();
        let redactor = Redactor::new(Vec::new(), &[]);
        let text = three_searches();
        let parsed = parse_note(&text);
        let first = previews(
            &registry,
            &redactor,
            &parsed,
            &text,
            "n.md",
            &Facts::default(),
        );
        let written = format!("{text}\n{}\n", preview_callout(&first[0]).join("\n"));
        let again = previews(
            &registry,
            &redactor,
            &parse_note(&written),
            &written,
            "n.md",
            &Facts::default(),
        );
        assert_eq!(again.len(), 2);
        assert_ne!(again[0]["call_id"], first[0]["call_id"]);
    }

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
