//! The tool registry: name -> tool (description, JSON Schema, effect) with its policy
//! (enabled, timeout, rate limit, approval), and dispatch. The schema is the one source of
//! truth: validation and `vaultd tools` both come from it.
//!
//! Tools come from sources (docs/design.md §10.1), one folder each: [`builtin`] (`search_web`,
//! `send_notification`); vault, command and MCP sources register the same way. A source is a
//! `register(config, …, &mut Registry)` function called from [`Registry::from_config`]. Each
//! source reads its own `[tools.*]` / `[mcp.*]` tables and names its secrets for the one
//! redactor ([`crate::secret::SecretHolder`]). Adding a built-in tool is one file plus one
//! line in `builtin::builtin_tools!` (see [`builtin`]).

pub mod builtin;
pub mod command;
pub mod http;
pub mod mcp;
pub mod sandbox;
pub mod sources;
pub mod vault;

/// The effect and the approval rule are the vocabulary of every stage ([`crate::call`]);
/// named here too, where tools declare them.
pub use crate::call::{ApprovalRule, Effect};
use crate::call::{CallError, ErrorCode, ToolOutput};
use crate::config::table::RateLimit;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a tool comes from (docs/design.md §10.1); shown by `vaultd tools`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Builtin,
    Vault,
    Command,
    /// An MCP server, by its config name (`[mcp.NAME]`).
    Mcp(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Builtin => f.write_str("builtin"),
            Source::Vault => f.write_str("vault"),
            Source::Command => f.write_str("command"),
            Source::Mcp(server) => write!(f, "mcp:{server}"),
        }
    }
}

/// The static description of a tool.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub source: Source,
    pub effect: Effect,
    /// JSON Schema of `parameters`; must set `additionalProperties: false`.
    pub schema: Value,
}

/// One validated call handed to a tool.
#[derive(Debug, Clone, Copy)]
pub struct ToolCall<'a> {
    /// Stable id of the call: used for Message-ID and as Slack's message_id.
    pub call_id: &'a str,
    /// The vault-relative path of the note the call comes from, as claimed.
    pub note: &'a str,
    /// The note's identity (its `tool_note` property, docs/design.md §9.2): stable across moves and
    /// renames. Command tools export it as `VAULTD_NOTE_ID`; undo and the note budget key on it.
    pub note_id: &'a str,
    /// Parameters that passed the tool's schema.
    pub parameters: &'a Map<String, Value>,
    /// When the runner will give up: tools that retry must stop retrying before it.
    pub deadline: Instant,
    /// A person's answer to the question this call's tool asked at its last run (an MCP
    /// server's elicitation, docs/design.md §10.4): the next round, from
    /// [`mcp::question::resume`]. None for every other call.
    pub answer: Option<&'a Value>,
}

/// A violation message quotes the value at fault; a 900 KB parameter must not come back
/// into the note two or three times (docs/design.md §9.8). Long messages keep their start.
fn bounded_message(message: String) -> String {
    const MAX: usize = 300;
    if message.len() <= MAX {
        return message;
    }
    let mut cut = 200;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes in all)", &message[..cut], message.len())
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

    /// What `vaultd tools` shows beyond name, effect and schema (a command tool's sandbox).
    fn details(&self) -> Option<Value> {
        None
    }

    /// Runs the call. The runner enforces the deadline too; tools use it to bound retries.
    fn run<'a>(&'a self, call: ToolCall<'a>) -> ToolFuture<'a>;

    /// What running this validated call would do, without doing any of it (docs/design.md §12.1):
    /// the `would` object of a dry run's `tool_preview`. Pure: no request, no file written,
    /// no journal record. Secrets may appear only as references; the caller redacts the
    /// result once more. Tools override it to show the exact effect: the email as it would be
    /// sent, a webhook's JSON body, a command's argv and sandbox, a vault write's unified
    /// diff. The default describes the call.
    fn preview(&self, _call: ToolCall<'_>) -> Value {
        let spec = self.spec();
        json!({
            "description": format!(
                "would call {} ({} tool, {}) with the parameters above",
                spec.name,
                spec.source,
                spec.effect.as_str()
            ),
        })
    }
}

/// A tool with everything compiled once: its schema validator and its limits.
pub struct RegisteredTool {
    pub tool: Box<dyn Tool>,
    pub validator: jsonschema::Validator,
    pub policy: Policy,
}

/// Per-tool policy, read from the tool's config table by its source (docs/design.md §10.3).
#[derive(Debug, Clone)]
pub struct Policy {
    pub enabled: bool,
    pub timeout: Duration,
    pub rate_limit: RateLimit,
    /// `approval = "never" | "always"`; `None` leaves the decision to the tool's own
    /// [`Tool::admit`] (send_notification's recipient rules).
    pub approval: Option<ApprovalRule>,
}

impl RegisteredTool {
    pub fn spec(&self) -> &ToolSpec {
        self.tool.spec()
    }

    pub fn name(&self) -> &str {
        &self.tool.spec().name
    }

    /// Policy on validated parameters: the tool's approval rule first, then its own checks.
    pub fn admit(&self, parameters: &Map<String, Value>) -> Admission {
        match self.policy.approval {
            Some(ApprovalRule::Always) => Admission::Hold {
                reason: format!(
                    "{} needs approval for every call (approval = \"always\")",
                    self.name()
                ),
            },
            Some(ApprovalRule::Never) | None => self.tool.admit(parameters),
        }
    }

    /// Every schema violation, with pointers relative to `parameters` (docs/design.md §8.3).
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
                vec![(pointer, bounded_message(e.to_string()))]
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
                // RFC 6901: "" is the parameters object itself; "/" would name a member "".
                .map(|(p, m)| json!({ "pointer": p, "message": m }))
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

/// A call validated once, into a type (STYLE habit 5): its tool resolved by name, its
/// parameters checked against that tool's schema and its tool enabled. Planning makes it; the
/// runner takes it; nothing downstream looks the tool up by name again or re-checks.
#[derive(Clone)]
pub struct ValidCall {
    /// The call's id in its note (docs/design.md §2): keys its journal record and its result block.
    pub call_id: String,
    /// The tool the name resolved to when the call was planned; its spec gives the effect
    /// recorded at the start (§9.3), its policy the timeout and rate limit.
    pub tool: Arc<RegisteredTool>,
    /// Parameters that passed the tool's schema.
    pub parameters: Map<String, Value>,
    /// Set by the plan when a person answered the question the call's last run asked
    /// ([`ToolCall::answer`]).
    pub answer: Option<Value>,
}

impl ValidCall {
    pub fn name(&self) -> &str {
        self.tool.name()
    }

    pub fn effect(&self) -> Effect {
        self.tool.spec().effect
    }

    /// The tool's policy on these parameters: run, hold for a person, or deny.
    pub fn admit(&self) -> Admission {
        self.tool.admit(&self.parameters)
    }
}

impl std::fmt::Debug for ValidCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValidCall")
            .field("call_id", &self.call_id)
            .field("tool", &self.name())
            .field("parameters", &self.parameters)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("tool {tool}: its JSON Schema does not compile: {message}")]
    Schema { tool: String, message: String },
    #[error("tool {tool}: {message}")]
    Setup { tool: String, message: String },
    /// A library refused the setting (a URL, an address, TLS); its error is kept as the
    /// source, and printed once after the message by the `{:#}` chain.
    #[error("tool {tool}: {message}")]
    SetupFailed {
        tool: String,
        message: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Says why an unregistered name is refused (`POLICY_DENIED` for an MCP tool left out of
/// `allow`) instead of UNKNOWN_TOOL; None: not this rule's name.
pub type Denial = Box<dyn Fn(&str) -> Option<CallError> + Send + Sync>;

pub struct Registry {
    /// In registration order, which is the order `vaultd tools` lists them in.
    /// Shared with the [`ValidCall`]s made from them.
    tools: Vec<Arc<RegisteredTool>>,
    by_name: HashMap<String, usize>,
    /// Names a source knows but denies; they are not listed.
    denials: Vec<Denial>,
}

impl Registry {
    pub fn empty() -> Registry {
        Registry {
            tools: Vec::new(),
            by_name: HashMap::new(),
            denials: Vec::new(),
        }
    }

    /// Adds one tool, compiling its schema once. A second tool of the same name is an error.
    pub fn add(&mut self, tool: Box<dyn Tool>, policy: Policy) -> Result<(), RegistryError> {
        let name = tool.spec().name.clone();
        if self.by_name.contains_key(&name) {
            return Err(RegistryError::Setup {
                tool: name,
                message: "a tool of this name is already registered".to_string(),
            });
        }
        let mut options = jsonschema::options().should_validate_formats(true);
        if matches!(tool.spec().source, Source::Builtin | Source::Vault) {
            // vaultd's own schemas are draft-07 documents: the keywords they use mean the same
            // in 2020-12, and checking a schema against draft 7's metaschema keeps ~190 KB for
            // the daemon's life where 2020-12's kept ~600 KB (of idle RSS). A command
            // tool's or an MCP server's schema keeps JSON Schema's default, 2020-12, unless
            // its `$schema` says otherwise.
            options = options.with_draft(jsonschema::Draft::Draft7);
        }
        let validator = options
            .build(&tool.spec().schema)
            .map_err(|e| RegistryError::Schema {
                tool: name.clone(),
                message: e.to_string(),
            })?;
        self.by_name.insert(name, self.tools.len());
        self.tools.push(Arc::new(RegisteredTool {
            tool,
            validator,
            policy,
        }));
        Ok(())
    }

    /// Adds a rule for names a source knows but refuses (see [`Denial`]).
    pub fn add_denial(&mut self, denial: Denial) {
        self.denials.push(denial);
    }

    pub fn get(&self, name: &str) -> Option<&RegisteredTool> {
        self.by_name.get(name).map(|&i| &*self.tools[i])
    }

    pub fn tools(&self) -> impl Iterator<Item = &RegisteredTool> {
        self.tools.iter().map(|t| &**t)
    }

    /// [`Registry::resolve`], into a [`ValidCall`] for the runner.
    pub fn valid_call(
        &self,
        call_id: &str,
        name: &str,
        parameters: &Map<String, Value>,
    ) -> Result<ValidCall, CallError> {
        self.resolve(name, parameters)?;
        let tool = self.tools[self.by_name[name]].clone();
        Ok(ValidCall {
            call_id: call_id.to_string(),
            tool,
            parameters: parameters.clone(),
            answer: None,
        })
    }

    /// Looks a call's tool up and checks it may run: UNKNOWN_TOOL, POLICY_DENIED (disabled),
    /// INVALID_PARAMS.
    pub fn resolve(
        &self,
        name: &str,
        parameters: &Map<String, Value>,
    ) -> Result<&RegisteredTool, CallError> {
        let Some(tool) = self.get(name) else {
            if let Some(denied) = self.denials.iter().find_map(|d| d(name)) {
                return Err(denied);
            }
            let known: Vec<&str> = self.tools.iter().map(|t| t.name()).collect();
            return Err(CallError::new(
                ErrorCode::UnknownTool,
                format!("no tool named `{name}`; known tools: {}", known.join(", ")),
            ));
        };
        if !tool.policy.enabled {
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
                    let mut d = json!({
                        "name": s.name,
                        "description": s.description,
                        "source": s.source.to_string(),
                        "effect": s.effect.as_str(),
                        "approval": t.policy.approval.map_or("by tool rules", ApprovalRule::as_str),
                        "parameters": s.schema,
                    });
                    if let Some(details) = t.tool.details() {
                        d["details"] = details;
                    }
                    d
                })
                .collect(),
        )
    }
}

/// Tools for tests that validate and plan calls but never run them.
#[cfg(test)]
pub(crate) mod idle {
    use super::*;

    /// A tool that is only validated against, never run.
    pub struct Idle(pub ToolSpec);

    impl Tool for Idle {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn run<'a>(&'a self, _call: ToolCall<'a>) -> ToolFuture<'a> {
            Box::pin(async { Err(CallError::new(ErrorCode::ExecutionError, "not run")) })
        }
    }

    /// A registry of idle built-in tools, each taking one string `q`:
    /// (name, effect, approval, enabled).
    pub fn registry(tools: &[(&str, Effect, Option<ApprovalRule>, bool)]) -> Registry {
        registry_limited(tools, RateLimit::default())
    }

    /// [`registry`] with `rate_limit` on every tool.
    pub fn registry_limited(
        tools: &[(&str, Effect, Option<ApprovalRule>, bool)],
        rate_limit: RateLimit,
    ) -> Registry {
        let mut r = Registry::empty();
        for &(name, effect, approval, enabled) in tools {
            let spec = ToolSpec {
                name: name.to_string(),
                description: String::new(),
                source: Source::Builtin,
                effect,
                schema: json!({
                    "type": "object",
                    "properties": { "q": { "type": "string" } },
                    "additionalProperties": false
                }),
            };
            let policy = Policy {
                enabled,
                timeout: Duration::from_secs(1),
                rate_limit,
                approval,
            };
            r.add(Box::new(Idle(spec)), policy)
                .expect("an idle tool registers");
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::idle::Idle;
    use super::*;

    /// `dependentRequired` means something in 2020-12 only: a schema from outside (a command
    /// tool's, an MCP server's) keeps it; vaultd's own are read as draft 7 (`Registry::add`).
    #[test]
    fn a_schema_from_outside_is_read_as_2020_12_and_vaultds_own_as_draft_7() {
        let mut registry = Registry::empty();
        for (name, source) in [("outside", Source::Command), ("own", Source::Builtin)] {
            let spec = ToolSpec {
                name: name.into(),
                description: String::new(),
                source,
                effect: Effect::ReadOnly,
                schema: json!({
                    "type": "object",
                    "properties": { "a": {}, "b": {} },
                    "dependentRequired": { "a": ["b"] },
                    "additionalProperties": false
                }),
            };
            let policy = Policy {
                enabled: true,
                timeout: Duration::from_secs(1),
                rate_limit: RateLimit::default(),
                approval: None,
            };
            registry.add(Box::new(Idle(spec)), policy).unwrap();
        }
        let only_a = json!({ "a": 1 }).as_object().unwrap().clone();
        let err = registry
            .get("outside")
            .unwrap()
            .validate(&only_a)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParams);
        assert!(registry.get("own").unwrap().validate(&only_a).is_ok());
    }
}
