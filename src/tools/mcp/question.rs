//! A server that asks a person (docs/design.md §10.4): the question an MCP server puts in an
//! `input_required` result (SEP-2322, protocol 2026-07-28), as vaultd keeps it between the
//! round that asked and the round that answers, and the answer a person writes in the note.
//!
//! A 2026 server keeps nothing between rounds: everything it needs comes back in
//! `requestState`. So the call does not wait in memory for a person: the round that asks ends
//! the call's run with NEEDS_ANSWER and this question (journaled, shown in a `[!question]`),
//! and approving the note runs the call again as the next round, with the answers and the
//! state. A restart in between loses nothing.
//!
//! The question (the `details` of the NEEDS_ANSWER error, and `question` in the note's
//! `tool_approval` block):
//!
//! ```json
//! { "server": "files",
//!   "asks": [ { "key": "confirm", "message": "Overwrite a.txt?",
//!               "schema": { "type": "object", "properties": { "ok": { "type": "boolean" } } } } ],
//!   "request_state": "opaque, echoed unchanged",
//!   "answered": { "roots": { "roots": [] } } }
//! ```
//!
//! The answer, a block the person fills in below the question, outside the callout:
//! `{"tool_answer": {"call_id": "c-1", "answer": {"ok": true}}}` — the fields of the one
//! question, or `{"KEY": {fields}, …}` when the server asked several at once; `"decline"`
//! declines (the server is told, and answers as it sees fit).

use serde_json::{Map, Value, json};

/// The question of a round that asked a person (see the module doc for its shape).
pub fn question(
    server: &str,
    asks: Vec<(String, String, Value)>,
    request_state: Option<String>,
    answered: Map<String, Value>,
) -> Value {
    json!({
        "server": server,
        "asks": asks
            .into_iter()
            .map(|(key, message, schema)| json!({ "key": key, "message": message, "schema": schema }))
            .collect::<Vec<_>>(),
        "request_state": request_state,
        "answered": answered,
    })
}

fn asks(question: &Value) -> &[Value] {
    question["asks"].as_array().map_or(&[], Vec::as_slice)
}

/// What the person reads: each message, and the fields it asks for with their type and
/// description. Untrusted text (the server wrote it): the renderer escapes it.
pub fn describe(question: &Value) -> String {
    let server = question["server"].as_str().unwrap_or("?");
    let mut out = format!("MCP server `{server}` asks:");
    for ask in asks(question) {
        out.push_str(&format!("\n{}", ask["message"].as_str().unwrap_or("")));
        let required: Vec<&str> = ask["schema"]["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(props) = ask["schema"]["properties"].as_object() {
            for (field, p) in props {
                let kind = p["type"].as_str().unwrap_or("any");
                let options = p["enum"]
                    .as_array()
                    .map(|e| {
                        let v: Vec<String> = e.iter().map(Value::to_string).collect();
                        format!(", one of {}", v.join(", "))
                    })
                    .unwrap_or_default();
                let about = p["description"]
                    .as_str()
                    .or(p["title"].as_str())
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default();
                let needed = if required.contains(&field.as_str()) {
                    ", required"
                } else {
                    ""
                };
                out.push_str(&format!("\n- `{field}` ({kind}{options}{needed}){about}"));
            }
        }
    }
    out.push_str(
        "\nFill in the `tool_answer` block below (or write \"decline\" as the answer), then approve the note; rejecting it ends the call unanswered.",
    );
    out
}

/// The next round's `inputResponses` and `requestState` from the person's `answer`
/// (`{"request_state": …, "responses": {KEY: ElicitResult, …}}`, what
/// [`super::McpServer::call`] sends). Every answer is checked against the schema the server
/// gave; Err says what does not fit, for the person.
pub fn resume(question: &Value, answer: &Value) -> Result<Value, String> {
    let mut responses = question["answered"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let asks = asks(question);
    let declined = answer
        .as_str()
        .is_some_and(|a| a.eq_ignore_ascii_case("decline"));
    for ask in asks {
        let key = ask["key"].as_str().unwrap_or("");
        let response = if declined {
            json!({ "action": "decline" })
        } else {
            let content = match asks {
                [_] => answer,
                _ => answer.get(key).ok_or_else(|| {
                    format!("the answer has no `{key}` (the server asked several questions)")
                })?,
            };
            check(&ask["schema"], content).map_err(|e| match asks {
                [_] => e,
                _ => format!("`{key}`: {e}"),
            })?;
            json!({ "action": "accept", "content": content })
        };
        responses.insert(key.to_string(), response);
    }
    Ok(json!({
        "request_state": question["request_state"],
        "responses": responses,
    }))
}

/// An accepted answer is an object of the fields asked for, each filled in (a `null` left
/// from the template is not an answer), and valid against the server's schema.
fn check(schema: &Value, content: &Value) -> Result<(), String> {
    let Some(fields) = content.as_object() else {
        return Err(
            "the answer must be an object with the fields asked for, or \"decline\"".into(),
        );
    };
    if let Some((field, _)) = fields.iter().find(|(_, v)| v.is_null()) {
        return Err(format!(
            "`{field}` is not filled in (null; an optional field can be deleted)"
        ));
    }
    // Formats (`email`, `date`, `uri`) are checked as the call's own parameters are.
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .map_err(|e| format!("the server's schema is not valid: {e}"))?;
    let problems: Vec<String> = validator
        .iter_errors(content)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("{at}: {e}")
            }
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::note::render::answer_template;

    fn asked() -> Value {
        question(
            "t",
            vec![(
                "confirm".into(),
                "Overwrite a.txt?".into(),
                json!({ "type": "object", "properties": {
                    "ok": { "type": "boolean", "description": "Overwrite?" },
                    "why": { "type": "string", "default": "asked" } },
                    "required": ["ok"] }),
            )],
            Some("s-1".into()),
            Map::from_iter([("roots".to_string(), json!({ "roots": [] }))]),
        )
    }

    #[test]
    fn the_template_shows_each_field_and_the_text_says_how_to_answer() {
        assert_eq!(
            answer_template(&asked()),
            json!({ "ok": null, "why": "asked" })
        );
        let text = describe(&asked());
        assert!(
            text.contains("Overwrite a.txt?")
                && text.contains("`ok` (boolean, required): Overwrite?")
                && text.contains("tool_answer"),
            "{text}"
        );
    }

    #[test]
    fn an_answer_resumes_with_the_state_and_a_wrong_one_says_why() {
        let next = resume(&asked(), &json!({ "ok": true, "why": "yes" })).unwrap();
        assert_eq!(next["request_state"], "s-1");
        assert_eq!(
            next["responses"]["confirm"],
            json!({ "action": "accept", "content": { "ok": true, "why": "yes" } })
        );
        assert_eq!(next["responses"]["roots"], json!({ "roots": [] }));
        let declined = resume(&asked(), &json!("decline")).unwrap();
        assert_eq!(declined["responses"]["confirm"]["action"], "decline");
        let err = resume(&asked(), &json!({ "ok": null, "why": "x" })).unwrap_err();
        assert!(err.contains("`ok` is not filled in"), "{err}");
        let err = resume(&asked(), &json!({ "ok": "yes" })).unwrap_err();
        assert!(err.contains("/ok"), "{err}");
    }

    #[test]
    fn an_answer_is_checked_against_the_formats_the_server_asks_for() {
        let q = question(
            "t",
            vec![(
                "who".into(),
                "Whom to invite?".into(),
                json!({ "type": "object", "properties": {
                    "email": { "type": "string", "format": "email" } } }),
            )],
            None,
            Map::new(),
        );
        let err = resume(&q, &json!({ "email": "not an address" })).unwrap_err();
        assert!(err.contains("/email"), "{err}");
        assert!(resume(&q, &json!({ "email": "ann@example.org" })).is_ok());
    }

    #[test]
    fn several_questions_are_answered_by_key() {
        let two = question(
            "t",
            vec![
                (
                    "a".into(),
                    "A?".into(),
                    json!({ "type": "object", "properties": { "x": { "type": "integer" } } }),
                ),
                (
                    "b".into(),
                    "B?".into(),
                    json!({ "type": "object", "properties": { "y": { "type": "string" } } }),
                ),
            ],
            None,
            Map::new(),
        );
        assert_eq!(
            answer_template(&two),
            json!({ "a": { "x": null }, "b": { "y": null } })
        );
        let next = resume(&two, &json!({ "a": { "x": 1 }, "b": { "y": "z" } })).unwrap();
        assert_eq!(next["responses"]["b"]["content"]["y"], "z");
        assert!(next["request_state"].is_null());
        let err = resume(&two, &json!({ "a": { "x": 1 } })).unwrap_err();
        assert!(err.contains("no `b`"), "{err}");
    }
}
