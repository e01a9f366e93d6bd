//! `approve_tool_use` (read_only): Claude Code's `--permission-prompt-tool` contract
//! (docs/design.md §14 item 6). Claude Code asks it whether a tool use may go ahead; the rules of
//! `[gateway.permissions]` (Claude Code's own syntax, [`rules`]) answer at once with
//! `{"behavior": "allow", "updatedInput": …}` or `{"behavior": "deny", "message": …}`, and a use
//! they ask about (or none names) is held for a person in `Pending_Approval/` like any held
//! call: approved, it answers allow; rejected, `vaultd mcp serve` answers deny. Every decision
//! is a journaled call, so `vaultd log --tool approve_tool_use` lists them all.

pub mod rules;
mod shell;

use crate::call::ToolOutput;
use crate::config::table::{ConfigError, TableContext};
use crate::secret::{Secret, SecretHolder};
use crate::tools::{Admission, Effect, Source, Tool, ToolCall, ToolFuture, ToolSpec};
use rules::{Decision, Rule, Rules};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::time::Duration;

/// The tool's name, as Claude Code is given it (`mcp__vaultd__approve_tool_use`).
pub const NAME: &str = "approve_tool_use";

/// `[gateway.permissions]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPermissions {
    pub enabled: Option<bool>,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    #[serde(default)]
    pub ask: Vec<String>,
}

/// The rules, parsed.
#[derive(Debug, Clone)]
pub struct PermissionsConfig {
    pub enabled: bool,
    pub rules: Rules,
}

impl SecretHolder for PermissionsConfig {
    fn secrets(&self) -> Vec<&Secret> {
        Vec::new()
    }
}

pub struct ApproveToolUse {
    spec: ToolSpec,
    rules: Rules,
}

/// The use the call asks about: Claude Code's `tool_name` and `input`.
fn asked(parameters: &Map<String, Value>) -> (&str, Map<String, Value>) {
    let tool = parameters
        .get("tool_name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let input = parameters
        .get("input")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    (tool, input)
}

/// Claude Code's answer for `decision`, as the call's data (shown as JSON text to the client).
pub fn answer(behavior: &str, input: &Map<String, Value>, message: &str) -> Value {
    if behavior == "allow" {
        json!({"behavior": "allow", "updatedInput": input})
    } else {
        json!({"behavior": "deny", "message": message})
    }
}

impl Tool for ApproveToolUse {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn admit(&self, parameters: &Map<String, Value>) -> Admission {
        let (tool, input) = asked(parameters);
        match self.rules.decide(tool, &input) {
            Decision::Ask(rule) => Admission::Hold {
                reason: match rule {
                    Some(rule) => format!(
                        "Claude Code asks to use {tool} with {}; the rule `{rule}` of [gateway.permissions] asks a person",
                        Value::Object(input)
                    ),
                    None => format!(
                        "Claude Code asks to use {tool} with {}; no rule of [gateway.permissions] names it",
                        Value::Object(input)
                    ),
                },
            },
            Decision::Allow(_) | Decision::Deny(_) => Admission::Run,
        }
    }

    fn run<'a>(&'a self, call: ToolCall<'a>) -> ToolFuture<'a> {
        Box::pin(async move {
            let (tool, input) = asked(call.parameters);
            let data = match self.rules.decide(tool, &input) {
                Decision::Allow(rule) => {
                    let mut a = answer("allow", &input, "");
                    a["rule"] = json!(rule);
                    a
                }
                Decision::Deny(rule) => {
                    let mut a = answer(
                        "deny",
                        &input,
                        &format!("denied by the rule `{rule}` of vaultd's [gateway.permissions]"),
                    );
                    a["rule"] = json!(rule);
                    a
                }
                // Held, then approved by a person: this run is the approval.
                Decision::Ask(_) => {
                    let mut a = answer("allow", &input, "");
                    a["approved_by"] = json!("a person, in the vault");
                    a
                }
            };
            let summary = format!(
                "{} {tool}",
                data["behavior"].as_str().unwrap_or_default()
            );
            Ok(ToolOutput {
                data,
                summary,
                undo: None,
            })
        })
    }
}

impl crate::tools::builtin::BuiltinTool for ApproveToolUse {
    type Raw = RawPermissions;
    type Config = PermissionsConfig;

    fn config(raw: RawPermissions, cx: &TableContext) -> Result<PermissionsConfig, ConfigError> {
        let parse = |key: &str, list: &[String]| -> Result<Vec<Rule>, ConfigError> {
            list.iter()
                .map(|r| Rule::parse(r).map_err(|e| cx.invalid(&format!("gateway.permissions.{key}"), e)))
                .collect()
        };
        Ok(PermissionsConfig {
            enabled: raw.enabled.unwrap_or(true),
            rules: Rules {
                allow: parse("allow", &raw.allow)?,
                deny: parse("deny", &raw.deny)?,
                ask: parse("ask", &raw.ask)?,
            },
        })
    }

    fn describe(config: &PermissionsConfig) -> Value {
        let texts = |l: &[Rule]| l.iter().map(|r| r.text().to_string()).collect::<Vec<_>>();
        json!({
            "enabled": config.enabled,
            "allow": texts(&config.rules.allow),
            "deny": texts(&config.rules.deny),
            "ask": texts(&config.rules.ask),
        })
    }

    fn policy(config: &PermissionsConfig) -> crate::tools::Policy {
        crate::tools::Policy {
            enabled: config.enabled,
            timeout: Duration::from_secs(10),
            rate_limit: crate::config::table::RateLimit {
                per_hour: None,
                per_day: None,
            },
            // The rules decide (`admit`).
            approval: None,
        }
    }

    fn build(
        config: &PermissionsConfig,
        _http: reqwest::Client,
    ) -> Result<ApproveToolUse, crate::tools::RegistryError> {
        Ok(ApproveToolUse {
            spec: ToolSpec {
                name: NAME.to_string(),
                description: "Claude Code's permission prompt (--permission-prompt-tool): may this tool use go ahead? Decided by the rules of [gateway.permissions], or by a person in the vault.".to_string(),
                source: Source::Builtin,
                effect: Effect::ReadOnly,
                schema: json!({
                    "type": "object",
                    "properties": {
                        "tool_name": {"type": "string", "minLength": 1, "maxLength": 200,
                                      "description": "The tool Claude Code wants to use"},
                        "input": {"type": "object", "description": "Its input"},
                        "tool_use_id": {"type": "string", "maxLength": 200}
                    },
                    "required": ["tool_name", "input"],
                    "additionalProperties": false
                }),
            },
            rules: config.rules.clone(),
        })
    }
}
