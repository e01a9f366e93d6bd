//! The MCP tool source (docs/design.md §10.4): one [`McpServer`] per `[mcp.NAME]`, its allowed tools
//! registered as `mcp__SERVER__TOOL` with the effect, approval, rate limit and timeout from
//! the config (annotations are shown, never trusted), the server's `inputSchema` as the
//! schema, and calls denied while a definition differs from the pinned one.

pub mod config;
mod discover;
pub mod edit;
mod ids;
pub mod import;
pub mod oauth;
pub mod pin;
pub mod question;
pub mod server;

use crate::call::{CallError, ErrorCode, ToolOutput};
use crate::journal::Journal;
use crate::journal::catalog::PinState;
use crate::results::ResultStore;
use crate::tools::{
    Admission, Policy, Registry, RegistryError, Source, Tool, ToolCall, ToolFuture, ToolSpec,
};
use base64::Engine;
use config::McpServerConfig;
use serde_json::{Map, Value, json};
use server::McpServer;
use std::sync::Arc;

/// `mcp__SERVER__TOOL`.
pub fn tool_name(server: &str, tool: &str) -> String {
    format!("mcp__{server}__{tool}")
}

/// `mcp__SERVER__TOOL` -> (SERVER, TOOL). Server names never contain `__`.
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix("mcp__")?.split_once("__")
}

/// Every configured server.
pub struct McpSource {
    servers: Vec<Arc<McpServer>>,
    store: Option<ResultStore>,
}

impl McpSource {
    /// No servers.
    pub fn none() -> McpSource {
        McpSource {
            servers: Vec::new(),
            store: None,
        }
    }

    /// The servers with their tools as the journal's catalog last saw them; nothing is
    /// started (`vaultd tools`, `vaultd check`).
    pub fn offline(configs: &[McpServerConfig], journal: Arc<Journal>) -> McpSource {
        McpSource {
            servers: configs
                .iter()
                .map(|c| {
                    McpServer::new(
                        c.clone(),
                        journal.clone(),
                        reqwest::Client::new(),
                        std::env::temp_dir(),
                    )
                })
                .collect(),
            store: None,
        }
    }

    /// Starts every server in parallel and waits until each has listed its tools (or failed
    /// to start twice: its first start and one retry), at most its `start_timeout`. A server
    /// not up by then keeps starting in the background; its tools are registered from the
    /// catalog.
    /// `redactor`: the daemon's, taught every OAuth token a server's refresh saves.
    pub async fn start(
        configs: &[McpServerConfig],
        journal: Arc<Journal>,
        http: reqwest::Client,
        state_dir: &std::path::Path,
        store: ResultStore,
        redactor: Arc<crate::secret::Redactor>,
    ) -> McpSource {
        let servers: Vec<Arc<McpServer>> = configs
            .iter()
            .map(|c| {
                McpServer::new(
                    c.clone().teaching(redactor.clone()),
                    journal.clone(),
                    http.clone(),
                    state_dir.join("mcp").join(&c.name),
                )
            })
            .collect();
        for s in &servers {
            s.spawn();
        }
        let waits = servers
            .iter()
            .map(|s| {
                let s = s.clone();
                tokio::spawn(async move { s.wait_up(s.config.start_timeout).await })
            })
            .collect::<Vec<_>>();
        for w in waits {
            let _ = w.await;
        }
        for s in &servers {
            if !s.is_up() {
                tracing::warn!(
                    server = s.name(),
                    "MCP server not up within its start_timeout of {}; its calls fail (retryable) until it is",
                    humantime::format_duration(s.config.start_timeout)
                );
            }
        }
        McpSource {
            servers,
            store: Some(store),
        }
    }

    /// Registers every allowed tool each server offers, and denies the rest of its names.
    pub fn register(&self, registry: &mut Registry) -> Result<(), RegistryError> {
        for server in &self.servers {
            let s = server.clone();
            let registered: std::collections::HashSet<String> =
                server.tools().into_keys().collect();
            registry.add_denial(Box::new(move |name| {
                let (srv, tool) = split_name(name)?;
                if srv != s.name() {
                    return None;
                }
                if !s.config.allow.allows(tool) {
                    return Some(CallError::new(
                        ErrorCode::PolicyDenied,
                        format!(
                            "`{tool}` of MCP server `{srv}` is not allowed; add it to `mcp.{srv}.allow` to use it"
                        ),
                    ));
                }
                if s.tool(tool).is_some() && !registered.contains(tool) {
                    // Listed after start-up: the registry is built once, at start.
                    return Some(CallError::new(
                        ErrorCode::PolicyDenied,
                        format!(
                            "definition changed since accepted: MCP server `{srv}` started offering `{tool}` after vaultd started; accept it with `vaultd tools accept {name}` and restart vaultd"
                        ),
                    ));
                }
                if registered.is_empty() && !s.is_up() {
                    let why = s.down_reason().map(|w| format!(" ({w})")).unwrap_or_default();
                    return Some(
                        CallError::new(
                            ErrorCode::ExecutionError,
                            format!(
                                "MCP server `{srv}` is not running{why} and has never listed its tools, so `{tool}` is not known yet; vaultd keeps starting it, try again later"
                            ),
                        )
                        .retryable(true),
                    );
                }
                None
            }));
            let mut tools: Vec<_> = server.tools().into_iter().collect();
            tools.sort_by(|a, b| a.0.cmp(&b.0));
            for (tool, listed) in tools {
                let policy = server.config.policy(&tool);
                let raw_schema = listed
                    .definition
                    .get("inputSchema")
                    .cloned()
                    .unwrap_or_else(|| json!({ "type": "object" }));
                let broken = jsonschema::options()
                    .should_validate_formats(true)
                    .build(&raw_schema)
                    .err()
                    .map(|e| e.to_string());
                if let Some(why) = &broken {
                    tracing::error!(
                        tool = %tool_name(server.name(), &tool),
                        "the server's inputSchema does not compile ({why}); the tool is unusable"
                    );
                }
                let spec = ToolSpec {
                    name: tool_name(server.name(), &tool),
                    description: listed
                        .definition
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    source: Source::Mcp(server.name().to_string()),
                    effect: policy.effect,
                    // A schema that does not compile is replaced so the registry can hold the
                    // tool; `admit` refuses every call to it.
                    schema: if broken.is_some() {
                        json!({ "type": "object" })
                    } else {
                        raw_schema
                    },
                };
                registry.add(
                    Box::new(McpTool {
                        spec,
                        server: server.clone(),
                        tool: tool.clone(),
                        registered_hash: listed.listed.hash.clone(),
                        broken_schema: broken,
                        store: self.store.clone(),
                    }),
                    Policy {
                        enabled: true,
                        timeout: policy.timeout,
                        rate_limit: policy.rate_limit,
                        approval: Some(policy.approval),
                    },
                )?;
            }
        }
        Ok(())
    }

    /// What `vaultd tools` shows beside an MCP tool: server, annotations, pin state with the
    /// diff of a changed definition, and when the catalog was refreshed.
    pub fn describe(&self, journal: &Journal, name: &str) -> Option<Value> {
        let (srv, tool) = split_name(name)?;
        let server = self.servers.iter().find(|s| s.name() == srv)?;
        let listed = server.tool(tool)?;
        let catalog = journal.mcp_catalog(srv).ok().flatten();
        let pin_state = journal.mcp_pin_state(srv, &listed.listed);
        // What `check_pin` lets run: `--format openai|anthropic` lists only these (§10.4).
        let may_run = matches!(pin_state, Ok(PinState::Accepted));
        let (pin, diff) = match pin_state {
            Ok(PinState::Accepted) => ("accepted", None),
            Ok(PinState::New) => ("new: run `vaultd tools accept` to allow calls", None),
            Ok(PinState::Changed {
                accepted_definition,
            }) => (
                "changed since accepted: run `vaultd tools accept` to allow calls",
                Some(pin::diff(&accepted_definition, &listed.listed.definition)),
            ),
            Err(_) => ("unknown", None),
        };
        Some(json!({
            "server": srv,
            "annotations": listed.definition.get("annotations").cloned().unwrap_or(Value::Null),
            "pin": pin,
            "may_run": may_run,
            "diff": diff,
            "catalog_refreshed_at": catalog.map(|c| c.listed_at),
        }))
    }

    /// Stops every server (in parallel); returns when their processes are gone.
    pub async fn shutdown(&self) {
        let stops: Vec<_> = self
            .servers
            .iter()
            .map(|s| {
                let s = s.clone();
                tokio::spawn(async move { s.shutdown().await })
            })
            .collect();
        for s in stops {
            let _ = s.await;
        }
    }
}

/// One allowed tool of one server.
struct McpTool {
    spec: ToolSpec,
    server: Arc<McpServer>,
    /// The tool's name on its server.
    tool: String,
    /// The definition hash whose schema the registry compiled.
    registered_hash: String,
    /// Why the server's schema does not compile, if it does not.
    broken_schema: Option<String>,
    /// Where binary content goes (None for commands that never run tools).
    store: Option<ResultStore>,
}

impl McpTool {
    /// POLICY_DENIED unless the current definition is the pinned one.
    fn check_pin(&self) -> Result<(), CallError> {
        if let Some(why) = &self.broken_schema {
            return Err(CallError::new(
                ErrorCode::PolicyDenied,
                format!(
                    "{} is unusable: its inputSchema from the server does not compile: {why}",
                    self.spec.name
                ),
            ));
        }
        match self.server.pin_state(&self.tool) {
            None => Err(CallError::new(
                ErrorCode::ExecutionError,
                format!(
                    "MCP server `{}` no longer offers `{}`",
                    self.server.name(),
                    self.tool
                ),
            )),
            Some(Ok(PinState::Accepted)) => Ok(()),
            Some(Ok(PinState::Changed { .. } | PinState::New)) => Err(CallError::new(
                ErrorCode::PolicyDenied,
                format!(
                    "definition changed since accepted: {name} differs from the definition a person accepted (or appeared after the first listing); see the diff with `vaultd tools`, then accept it with `vaultd tools accept {name}`",
                    name = self.spec.name
                ),
            )),
            Some(Err(e)) => Err(CallError::new(
                ErrorCode::ExecutionError,
                format!("cannot read the pinned definition: {e}"),
            )
            .retryable(true)),
        }
    }

    /// An accepted new definition whose schema the registry did not compile: validate
    /// against the schema the server offers now.
    fn validate_current(&self, parameters: &Map<String, Value>) -> Result<(), CallError> {
        let Some(listed) = self.server.tool(&self.tool) else {
            return Ok(());
        };
        if listed.listed.hash == self.registered_hash {
            return Ok(());
        }
        let schema = listed
            .definition
            .get("inputSchema")
            .cloned()
            .unwrap_or_else(|| json!({ "type": "object" }));
        let validator = jsonschema::options().build(&schema).map_err(|e| {
            CallError::new(
                ErrorCode::PolicyDenied,
                format!(
                    "{}: the server's inputSchema does not compile: {e}",
                    self.spec.name
                ),
            )
        })?;
        let instance = Value::Object(parameters.clone());
        let violations: Vec<Value> = validator
            .iter_errors(&instance)
            .map(|e| json!({ "pointer": e.instance_path().to_string(), "message": e.to_string() }))
            .collect();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(CallError::new(
                ErrorCode::InvalidParams,
                format!("parameters do not match the {} schema", self.spec.name),
            )
            .with_details(json!({ "violations": violations })))
        }
    }
}

impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// A schema that does not compile makes the tool unusable: `vaultd tools` says so and
    /// `--format openai|anthropic` leaves it out.
    fn details(&self) -> Option<Value> {
        let mut details = Map::new();
        if let config::Transport::Stdio { sandbox, .. } = &self.server.config.transport {
            details.insert("sandbox".into(), json!(sandbox.describe()));
        }
        if let Some(why) = &self.broken_schema {
            details.insert(
                "unusable".into(),
                json!(format!(
                    "its inputSchema from the server does not compile: {why}"
                )),
            );
        }
        (!details.is_empty()).then_some(Value::Object(details))
    }

    fn admit(&self, _parameters: &Map<String, Value>) -> Admission {
        match self.check_pin() {
            Ok(()) => Admission::Run,
            Err(e) => Admission::Deny(e),
        }
    }

    fn run<'a>(&'a self, call: ToolCall<'a>) -> ToolFuture<'a> {
        Box::pin(async move {
            // Checked again here: approval (`approval = "always"`) skips `admit`, and the
            // definition may have changed while the call was held.
            self.check_pin()?;
            self.validate_current(call.parameters)?;
            let result = self
                .server
                .call(
                    &self.tool,
                    call.parameters.clone(),
                    self.spec.effect.safe_to_repeat(),
                    call.deadline,
                    call.answer,
                )
                .await?;
            let mut content = serde_json::to_value(&result.content).unwrap_or(Value::Array(vec![]));
            if result.is_error == Some(true) {
                let text = texts(&content);
                return Err(CallError::new(
                    ErrorCode::ExecutionError,
                    if text.is_empty() {
                        format!("{} reported an error without text", self.spec.name)
                    } else {
                        text
                    },
                )
                .with_details(json!({
                    "content": content,
                    "structuredContent": result.structured_content,
                })));
            }
            if let Some(store) = &self.store {
                move_binary_out(&mut content, store, call.note_id, call.call_id)?;
            }
            let items = content.as_array().map_or(0, Vec::len);
            let mut data = json!({ "content": content });
            if let Some(s) = result.structured_content {
                data["structuredContent"] = s;
            }
            Ok(ToolOutput {
                data,
                summary: format!("{items} item{}", if items == 1 { "" } else { "s" }),
                undo: None,
            })
        })
    }
}

/// The text items of a result's content, joined.
fn texts(content: &Value) -> String {
    content
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Binary content (image and audio `data`, resource `blob`) is saved as an attachment and
/// replaced by a wikilink to it: base64 in a note helps nobody and bloats it.
fn move_binary_out(
    content: &mut Value,
    store: &ResultStore,
    note_id: &str,
    call_id: &str,
) -> Result<(), CallError> {
    let Some(items) = content.as_array_mut() else {
        return Ok(());
    };
    let mut n = 0;
    for item in items.iter_mut() {
        let (holder, key) = match item.get("type").and_then(Value::as_str) {
            Some("image" | "audio") => (item as &mut Value, "data"),
            Some("resource") if item.pointer("/resource/blob").is_some() => (
                item.get_mut("resource").expect("checked just above"),
                "blob",
            ),
            _ => continue,
        };
        let Some(b64) = holder.get(key).and_then(Value::as_str) else {
            continue;
        };
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(b64) else {
            continue;
        };
        n += 1;
        let mime = holder
            .get("mimeType")
            .and_then(Value::as_str)
            .unwrap_or("application/octet-stream");
        let ext = extension_for(mime);
        let rel = store
            .attach(note_id, call_id, n, ext, &bytes)
            .map_err(|e| CallError::new(ErrorCode::ExecutionError, e.to_string()))?;
        if let Some(obj) = holder.as_object_mut() {
            obj.remove(key);
            obj.insert("attachment".into(), Value::String(format!("[[{rel}]]")));
            obj.insert("bytes".into(), json!(bytes.len()));
        }
    }
    Ok(())
}

fn extension_for(mime: &str) -> &'static str {
    match mime {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/svg+xml" => "svg",
        "audio/wav" | "audio/x-wav" => "wav",
        "audio/mpeg" => "mp3",
        "application/pdf" => "pdf",
        _ => "bin",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(tool_name("files", "read_file"), "mcp__files__read_file");
        assert_eq!(
            split_name("mcp__files__read__file"),
            Some(("files", "read__file"))
        );
        assert_eq!(split_name("search_web"), None);
    }

    #[test]
    fn binary_content_becomes_an_attachment() {
        let dir = tempfile::tempdir().unwrap();
        let store = ResultStore::new(dir.path().to_path_buf(), "Tool_Results".into(), 65_536);
        let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG fake");
        let mut content = json!([
            { "type": "text", "text": "hi" },
            { "type": "image", "data": png, "mimeType": "image/png" },
        ]);
        move_binary_out(&mut content, &store, "n", "c-1").unwrap();
        assert_eq!(content[1]["attachment"], "[[Tool_Results/n/c-1-1.png]]");
        assert!(content[1].get("data").is_none());
        assert_eq!(
            std::fs::read(dir.path().join("Tool_Results/n/c-1-1.png")).unwrap(),
            b"\x89PNG fake"
        );
    }
}
