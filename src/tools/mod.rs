//! The tool registry: name -> spec (description, JSON Schema, effect, timeout) and dispatch.
//! The schema is the one source of truth: validation and `vaultd tools` both come from it.
//!
//! Adding a tool is one new module under `tools/` implementing [`Tool`] plus one line in
//! [`Registry::from_config`].

pub mod search_web;
pub mod send_notification;

use crate::call::{CallError, ErrorCode, ToolOutput};
use crate::config::{RateLimit, ToolsConfig};
use serde_json::{Map, Value, json};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// What a tool does to the world; decides recovery after a crash (DESIGN §8.15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Safe to run again after a crash.
    ReadOnly,
    /// Never run twice: an unrecorded outcome becomes UNKNOWN_OUTCOME.
    ExternalSideEffect,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::ReadOnly => "read_only",
            Effect::ExternalSideEffect => "external_side_effect",
        }
    }
}

/// The static description of a tool.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub effect: Effect,
    /// JSON Schema of `parameters`; must set `additionalProperties: false`.
    pub schema: Value,
}

/// One validated call handed to a tool.
#[derive(Debug, Clone, Copy)]
pub struct ToolCall<'a> {
    /// Stable id of the call: used for Message-ID and as Slack's message_id.
    pub call_id: &'a str,
    /// Parameters that passed the tool's schema.
    pub parameters: &'a Map<String, Value>,
    /// When the runner will give up: tools that retry must stop retrying before it.
    pub deadline: Instant,
}

/// What policy says about a call before it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    Run,
    /// Held for a person; the reason is shown in the `[!question]` callout.
    Hold {
        reason: String,
    },
    Deny(CallError),
}

pub type ToolFuture<'a> = Pin<Box<dyn Future<Output = Result<ToolOutput, CallError>> + Send + 'a>>;

pub trait Tool: Send + Sync {
    fn spec(&self) -> &ToolSpec;

    /// Policy checks on validated parameters (approval, allowlists, configured names).
    fn admit(&self, _parameters: &Map<String, Value>) -> Admission {
        Admission::Run
    }

    /// Runs the call. The runner enforces the deadline too; tools use it to bound retries.
    fn run<'a>(&'a self, call: ToolCall<'a>) -> ToolFuture<'a>;
}

/// A tool with everything compiled once: its schema validator and its limits.
pub struct RegisteredTool {
    pub tool: Box<dyn Tool>,
    pub validator: jsonschema::Validator,
    pub enabled: bool,
    pub timeout: Duration,
    pub rate_limit: RateLimit,
}

impl RegisteredTool {
    pub fn spec(&self) -> &ToolSpec {
        self.tool.spec()
    }

    /// Every schema violation, with pointers relative to `parameters` (DESIGN §8.3).
    pub fn validate(&self, parameters: &Map<String, Value>) -> Result<(), CallError> {
        let instance = Value::Object(parameters.clone());
        let mut violations: Vec<(String, String)> = self
            .validator
            .iter_errors(&instance)
            .flat_map(|e| {
                let pointer = e.instance_path().to_string();
                // A misspelt parameter is reported at its own pointer, one violation each.
                if let jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } =
                    e.kind()
                {
                    return unexpected
                        .iter()
                        .map(|key| {
                            (
                                format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1")),
                                format!("unknown parameter `{key}` (not in the schema)"),
                            )
                        })
                        .collect::<Vec<_>>();
                }
                vec![(pointer, e.to_string())]
            })
            .collect();
        if violations.is_empty() {
            return Ok(());
        }
        violations.sort();
        let message = violations
            .iter()
            .map(|(p, m)| {
                if p.is_empty() {
                    m.clone()
                } else {
                    format!("{p}: {m}")
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
        let details = json!({
            "violations": violations
                .iter()
                .map(|(p, m)| json!({ "pointer": if p.is_empty() { "/" } else { p.as_str() }, "message": m }))
                .collect::<Vec<_>>()
        });
        Err(CallError::new(
            ErrorCode::InvalidParams,
            format!(
                "parameters do not match the {} schema: {message}",
                self.spec().name
            ),
        )
        .with_details(details))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("tool {tool}: its JSON Schema does not compile: {message}")]
    Schema { tool: String, message: String },
    #[error("tool {tool}: {message}")]
    Setup { tool: String, message: String },
}

pub struct Registry {
    tools: Vec<RegisteredTool>,
}

impl Registry {
    /// Builds every tool from the config. The one HTTP client is shared so connections are
    /// reused across calls.
    pub fn from_config(
        config: &ToolsConfig,
        http: reqwest::Client,
    ) -> Result<Registry, RegistryError> {
        let mut registry = Registry { tools: Vec::new() };
        let s = &config.search_web;
        registry.add(
            Box::new(search_web::SearchWeb::new(s, http.clone())),
            s.enabled,
            s.timeout,
            s.rate_limit,
        )?;
        let n = &config.send_notification;
        registry.add(
            Box::new(send_notification::SendNotification::new(n, http)?),
            n.enabled,
            n.timeout,
            n.rate_limit,
        )?;
        Ok(registry)
    }

    pub fn add(
        &mut self,
        tool: Box<dyn Tool>,
        enabled: bool,
        timeout: Duration,
        rate_limit: RateLimit,
    ) -> Result<(), RegistryError> {
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&tool.spec().schema)
            .map_err(|e| RegistryError::Schema {
                tool: tool.spec().name.to_string(),
                message: e.to_string(),
            })?;
        self.tools.push(RegisteredTool {
            tool,
            validator,
            enabled,
            timeout,
            rate_limit,
        });
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&RegisteredTool> {
        self.tools.iter().find(|t| t.spec().name == name)
    }

    pub fn tools(&self) -> impl Iterator<Item = &RegisteredTool> {
        self.tools.iter()
    }

    /// Looks a call's tool up and checks it may run: UNKNOWN_TOOL, POLICY_DENIED (disabled),
    /// INVALID_PARAMS.
    pub fn resolve(
        &self,
        name: &str,
        parameters: &Map<String, Value>,
    ) -> Result<&RegisteredTool, CallError> {
        let Some(tool) = self.get(name) else {
            let known: Vec<&str> = self.tools.iter().map(|t| t.spec().name).collect();
            return Err(CallError::new(
                ErrorCode::UnknownTool,
                format!("no tool named `{name}`; known tools: {}", known.join(", ")),
            ));
        };
        if !tool.enabled {
            return Err(CallError::new(
                ErrorCode::PolicyDenied,
                format!("tool `{name}` is disabled in the config (tools.{name}.enabled = false)"),
            ));
        }
        tool.validate(parameters)?;
        Ok(tool)
    }

    /// `vaultd tools --json`: `[{ name, description, effect, parameters }]`.
    pub fn describe(&self) -> Value {
        Value::Array(
            self.tools
                .iter()
                .map(|t| {
                    let s = t.spec();
                    json!({
                        "name": s.name,
                        "description": s.description,
                        "effect": s.effect.as_str(),
                        "parameters": s.schema,
                    })
                })
                .collect(),
        )
    }
}
