//! Dry run (docs/design.md §12.1): every pending call of a note in `Dry_Run/` gets, once, a folded
//! `[!example]-` callout holding a `tool_preview` — call id, tool, validated parameters,
//! effect, the decision and what would happen — and nothing runs: no request, no rate limit,
//! no journal record. `vaultd check --preview` prints the same previews.
//!
//! The decision is not made here: the caller plans the note with the daemon's own
//! [`plan`](crate::pipeline::plan::plan), its rules and the journal's facts
//! ([`journal_facts`]), and this module only says what each step would come to. So a preview
//! never says "run" where the daemon would hold, deny, or write a result it recorded before.

use crate::call::CallResult;
use crate::guard::breaker::{CircuitStatus, circuit_key};
use crate::guard::budget;
use crate::journal::{Decision, Journal, JournalError};
use crate::note::{CallBody, ParsedNote};
use crate::pipeline::plan::{Facts, Plan, Step};
use crate::secret::Redactor;
use crate::tools::{RegisteredTool, Registry, ToolCall};
use serde_json::{Map, Value, json};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// The title of a preview callout starts with this; the call id ends it.
use crate::note::render::TITLE_PREFIX;

/// What the journal records about a note, read for its preview as the daemon reads it for a
/// run (docs/design.md §12.1): the newest record of each of its calls (§9.3), how many calls it
/// started (the note budget, §12.2) and, for `questions` (`approval_via = "cli"`), the
/// decisions `vaultd approve`/`reject` recorded. `note_id` is the note's `tool_note`; a note
/// without one has never run and the journal knows nothing of it.
pub fn journal_facts(
    journal: &Journal,
    note_id: Option<&str>,
    questions: &[(String, String)],
) -> Result<Facts, JournalError> {
    let mut facts = Facts::default();
    if let Some(id) = note_id {
        // Oldest first: the newest record of a call id is the one kept.
        facts.prior = journal
            .note_calls(id)?
            .into_iter()
            .map(|c| (c.call_id.clone(), c))
            .collect();
        facts.calls_started = budget::calls_started(journal, id)?;
    }
    let mut decisions: HashMap<(String, String), Decision> = HashMap::new();
    for (call_id, hash) in questions {
        if let Some(d) = journal.approval(call_id, hash)? {
            decisions.insert((call_id.clone(), hash.clone()), d);
        }
    }
    facts.decisions = decisions;
    Ok(facts)
}

/// What previews show beside the plan.
pub struct Shown<'a> {
    pub registry: &'a Registry,
    pub redactor: &'a Redactor,
    /// The note's vault-relative path (tools may show it).
    pub note: &'a str,
    /// The circuits that are not closed: a call that would run fails at once (§12.3).
    pub circuits: &'a [CircuitStatus],
    /// `max_calls_per_note`, named when a call is left for a later round.
    pub max_calls: usize,
}

/// The `tool_preview` objects of the pending calls of `parsed` whose call id is not in
/// `already` (the previews a note shows; see [`previewed_ids`]), in call order. `plan` is the
/// daemon's plan of this very note.
pub fn previews(
    shown: &Shown<'_>,
    parsed: &ParsedNote,
    plan: &Plan,
    already: &HashSet<String>,
) -> Vec<Value> {
    let steps: HashMap<&str, &Step> = plan.steps.iter().map(|(id, s)| (id.as_str(), s)).collect();
    parsed
        .pending_calls()
        .filter(|c| !already.contains(&c.call_id))
        .map(|c| {
            let name = c.name.clone().unwrap_or_else(|| "tool_call".to_string());
            let mut preview = json!({ "call_id": c.call_id, "name": name });
            if let CallBody::Call { parameters, .. } = &c.body {
                if let Some(tool) = shown.registry.get(&name) {
                    preview["effect"] = json!(tool.spec().effect.as_str());
                }
                preview["parameters"] = Value::Object(parameters.clone());
            }
            let (decision, mut would) = match steps.get(c.call_id.as_str()) {
                Some(step) => decide(shown, &c.call_id, step),
                // Past twice max_calls_per_note: no result this round (§9.8).
                None => (
                    json!({
                        "action": "later",
                        "reason": format!(
                            "only the first {max} pending calls of a note run per round and the next {max} get QUOTA_EXCEEDED (max_calls_per_note): this call stays pending for a later round",
                            max = shown.max_calls
                        ),
                    }),
                    json!({ "description": "nothing this round" }),
                ),
            };
            if matches!(c.body, CallBody::Broken(_)) {
                would = json!({ "description": "nothing: the call block is not a valid tool call" });
            }
            preview["decision"] = decision;
            preview["would"] = would;
            redact(shown.redactor, preview)
        })
        .collect()
}

/// The decision and the `would` of one planned step.
fn decide(shown: &Shown<'_>, call_id: &str, step: &Step) -> (Value, Value) {
    match step {
        Step::Run(call) => {
            let would = tool_preview(&call.tool, call_id, &call.parameters, shown.note);
            let decision =
                open_circuit(shown, &call.tool).unwrap_or_else(|| json!({ "action": "run" }));
            (decision, would)
        }
        Step::Ask(held) | Step::Waiting(held) => {
            let decision = json!({
                "action": "hold",
                "reason": format!("{}; it would wait in Pending_Approval/ for a person", held.reason),
            });
            // What the call would do once approved.
            let would = match shown.registry.get(&held.name) {
                Some(tool) => tool_preview(tool, call_id, &held.parameters, shown.note),
                None => json!({ "description": "nothing until a person approves it" }),
            };
            (decision, would)
        }
        Step::Denied(r) | Step::Fail(r) => {
            let (code, reason) = match &r.outcome {
                Err(e) => (e.code.as_str(), e.message.clone()),
                Ok(_) => ("", String::new()),
            };
            (
                json!({ "action": "deny", "code": code, "reason": reason }),
                json!({ "description": format!("nothing: the call would get {code}") }),
            )
        }
        Step::Recorded(r) => (
            recorded(r),
            json!({ "description": "nothing runs: the recorded result is written into the note again" }),
        ),
    }
}

/// A call the journal holds a result for: the daemon writes that result, never runs it again
/// (§9.3).
fn recorded(r: &CallResult) -> Value {
    let ended = crate::call::rfc3339_seconds(r.ended_at);
    let mut d = json!({
        "action": "recorded",
        "reason": format!("this call already ran (result recorded at {ended}); it is not run again"),
        "ok": r.outcome.is_ok(),
    });
    if let Err(e) = &r.outcome {
        d["code"] = json!(e.code.as_str());
    }
    d
}

/// The tool's own `would` (docs/design.md §12.1): the email, the webhook's JSON, the argv and
/// sandbox, the unified diff.
fn tool_preview(
    tool: &RegisteredTool,
    call_id: &str,
    parameters: &Map<String, Value>,
    note: &str,
) -> Value {
    tool.tool.preview(ToolCall {
        call_id,
        note,
        // A dry run has no note identity yet (nothing is claimed).
        note_id: "",
        parameters,
        deadline: Instant::now() + tool.policy.timeout.max(Duration::from_millis(1)),
        answer: None,
    })
}

/// The denial an open circuit gives a call that would run (the daemon's runner fails it at
/// once, §12.3).
fn open_circuit(shown: &Shown<'_>, tool: &RegisteredTool) -> Option<Value> {
    let key = circuit_key(tool.spec());
    let now = crate::call::rfc3339_seconds(std::time::SystemTime::now());
    // RFC 3339 UTC strings of one format compare like the times they name.
    let c = shown
        .circuits
        .iter()
        .find(|c| c.key == key && c.until.as_deref().is_none_or(|u| u > now.as_str()))?;
    let until = c.until.as_deref().unwrap_or("a trial call decides");
    Some(json!({
        "action": "deny",
        "code": "EXECUTION_ERROR",
        "reason": format!(
            "circuit {key} is {} (until {until}) after {} failures in a row; the call would fail at once (retryable)",
            c.state, c.failures
        ),
    }))
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
    use crate::call::ToolOutput;
    use crate::journal::{CallProgress, JournalCall};
    use crate::note::render::preview_callout;
    use crate::note::{Block, append_blocks, parse_note};
    use crate::pipeline::plan::{Approval, Rules, plan};
    use crate::tools::{ApprovalRule, Effect};
    use std::time::SystemTime;

    /// `look` (read_only) and `send` (external, always held).
    fn registry() -> Registry {
        crate::tools::idle::registry(&[
            ("look", Effect::ReadOnly, Some(ApprovalRule::Never), true),
            (
                "send",
                Effect::ExternalSideEffect,
                Some(ApprovalRule::Always),
                true,
            ),
        ])
    }

    fn calls(calls: &[(&str, &str)]) -> String {
        calls
            .iter()
            .map(|(name, q)| {
                format!(
                    "```json\n{}\n```\n",
                    json!({ "tool_call": { "name": name, "parameters": { "q": q } } })
                )
            })
            .collect()
    }

    fn rules(note_budget: u64, approval: Approval) -> Rules {
        Rules {
            max_calls: 10,
            note_budget: Some(note_budget),
            approval,
        }
    }

    const FOLDER: Approval = Approval::Folder { in_approved: false };

    /// The previews of `text` as the daemon would plan it with `rules` and `facts`.
    fn preview_all(
        text: &str,
        rules: &Rules,
        facts: &Facts,
        circuits: &[CircuitStatus],
    ) -> Vec<Value> {
        let registry = registry();
        let redactor = Redactor::new(Vec::new(), &[]);
        let parsed = parse_note(text);
        let plan = plan(&parsed, &registry, rules, facts);
        let shown = Shown {
            registry: &registry,
            redactor: &redactor,
            note: "n.md",
            circuits,
            max_calls: rules.max_calls,
        };
        previews(&shown, &parsed, &plan, &previewed_ids(text))
    }

    fn actions(previews: &[Value]) -> Vec<String> {
        previews
            .iter()
            .map(|p| {
                let d = &p["decision"];
                match d["code"].as_str() {
                    Some(code) => format!("{} {code}", d["action"].as_str().unwrap()),
                    None => d["action"].as_str().unwrap().to_string(),
                }
            })
            .collect()
    }

    #[test]
    fn a_spent_note_budget_denies_what_would_run_or_be_asked() {
        let text = calls(&[("look", "a"), ("look", "b"), ("send", "c")]);
        let facts = Facts {
            calls_started: 4,
            ..Facts::default()
        };
        let p = preview_all(&text, &rules(5, FOLDER), &facts, &[]);
        assert_eq!(
            actions(&p),
            ["run", "deny QUOTA_EXCEEDED", "deny QUOTA_EXCEEDED"]
        );
        assert!(
            p[1]["decision"]["reason"]
                .as_str()
                .unwrap()
                .starts_with("note budget spent")
        );
    }

    #[test]
    fn an_open_circuit_denies_a_call_that_would_run_and_a_closed_one_lets_it() {
        let text = calls(&[("look", "a")]);
        let open = |until: &str| CircuitStatus {
            key: "look".into(),
            state: "open".into(),
            until: Some(until.into()),
            failures: 5,
            last_error: "EXECUTION_ERROR: 503".into(),
        };
        let r = rules(100, FOLDER);
        let broken = preview_all(
            &text,
            &r,
            &Facts::default(),
            &[open("2999-01-01T00:00:00Z")],
        );
        assert_eq!(actions(&broken), ["deny EXECUTION_ERROR"]);
        // A cool-down that is over lets the trial run.
        let over = preview_all(
            &text,
            &r,
            &Facts::default(),
            &[open("2000-01-01T00:00:00Z")],
        );
        assert_eq!(actions(&over), ["run"]);
    }

    /// The note with the question of its held call written, as the daemon writes it.
    fn asked(text: &str) -> String {
        let parsed = parse_note(text);
        let p = plan(&parsed, &registry(), &rules(100, FOLDER), &Facts::default());
        let held: Vec<_> = p
            .steps
            .iter()
            .filter_map(|(_, s)| match s {
                Step::Ask(h) => Some(h.clone()),
                _ => None,
            })
            .collect();
        let blocks: Vec<Block<'_>> = held.iter().map(Block::Held).collect();
        append_blocks(text, &blocks, "pending_approval", SystemTime::now())
    }

    #[test]
    fn a_held_call_previews_as_held_and_a_recorded_cli_decision_decides_it() {
        let text = calls(&[("send", "a")]);
        let fresh = preview_all(&text, &rules(100, Approval::Cli), &Facts::default(), &[]);
        assert_eq!(actions(&fresh), ["hold"]);
        assert!(
            fresh[0]["decision"]["reason"]
                .as_str()
                .unwrap()
                .contains("needs approval for every call"),
            "{}",
            fresh[0]
        );
        let shown = asked(&text);
        let question = Facts::questions(&parse_note(&shown)).remove(0);
        for (decision, expected) in [
            (Decision::Approved, "run"),
            (Decision::Rejected, "deny REJECTED"),
        ] {
            let facts = Facts {
                decisions: HashMap::from([(question.clone(), decision)]),
                ..Facts::default()
            };
            let p = preview_all(&shown, &rules(100, Approval::Cli), &facts, &[]);
            assert_eq!(actions(&p), [expected]);
        }
        // With approval_via = "folder", only the move to Approved/ decides.
        let p = preview_all(
            &shown,
            &rules(100, Approval::Folder { in_approved: true }),
            &Facts::default(),
            &[],
        );
        assert_eq!(actions(&p), ["run"]);
    }

    #[test]
    fn a_call_the_journal_recorded_previews_as_its_recorded_result() {
        let text = calls(&[("look", "a"), ("send", "b")]);
        let ids: Vec<String> = parse_note(&text)
            .pending_calls()
            .map(|c| c.call_id.clone())
            .collect();
        let record = |id: &str, effect, progress| JournalCall {
            call_id: id.to_string(),
            tool: "x".into(),
            effect,
            progress,
            recorded: None,
            started_at: Some(SystemTime::UNIX_EPOCH),
            note: "Done/n.md".into(),
            not_run: false,
        };
        let finished = CallResult {
            call_id: ids[0].clone(),
            name: "look".into(),
            outcome: Ok(ToolOutput {
                data: json!({}),
                summary: String::new(),
                undo: None,
            }),
            started_at: SystemTime::UNIX_EPOCH,
            ended_at: SystemTime::UNIX_EPOCH,
        };
        let mut facts = Facts::default();
        facts.prior.insert(
            ids[0].clone(),
            record(&ids[0], Effect::ReadOnly, CallProgress::Finished(finished)),
        );
        // Started and never finished: its side effect is not repeated (§9.3).
        facts.prior.insert(
            ids[1].clone(),
            record(&ids[1], Effect::ExternalSideEffect, CallProgress::Started),
        );
        let p = preview_all(&text, &rules(100, FOLDER), &facts, &[]);
        assert_eq!(actions(&p), ["recorded", "deny UNKNOWN_OUTCOME"]);
        assert_eq!(p[0]["decision"]["ok"], true);
    }

    #[test]
    fn calls_past_twice_the_cap_wait_for_a_later_round() {
        let text = calls(&[("look", "a"), ("look", "b"), ("look", "c")]);
        let r = Rules {
            max_calls: 1,
            ..rules(100, FOLDER)
        };
        let p = preview_all(&text, &r, &Facts::default(), &[]);
        assert_eq!(actions(&p), ["run", "deny QUOTA_EXCEEDED", "later"]);
    }

    #[test]
    fn a_call_previewed_once_is_not_previewed_again() {
        let text = calls(&[("look", "a"), ("look", "b"), ("look", "c")]);
        let r = rules(100, FOLDER);
        let first = preview_all(&text, &r, &Facts::default(), &[]);
        let written = format!("{text}\n{}\n", preview_callout(&first[0]).join("\n"));
        let again = preview_all(&written, &r, &Facts::default(), &[]);
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
