//! `vaultd mcp serve`: the vault's tools offered to any MCP client (docs/design.md §14).
//!
//! The gateway is a client of the daemon through the vault itself: a `tools/call` becomes a
//! call note in `Needs_Action/` ([`courier`]), which the daemon claims, plans, journals, runs
//! and moves like any note; the gateway waits for it in `Done/`, `Failed/` or
//! `Pending_Approval/` and answers with the outcome the journal recorded. So the gateway never
//! writes the journal (one writer per vault), every guarantee of a note holds for a call made
//! over MCP (validation, policy, budgets, rate limits, the worker cap, at-most-once, undo), and
//! a held call waits for a person exactly as a note does. `vaultd mcp serve` runs the daemon in
//! its own process when none runs on the vault ([`crate::cli`]), and is its client otherwise.
//! Each client session's calls are also appended to a session note ([`session`]).

pub(crate) mod courier;
pub mod http;
pub(crate) mod session;

use crate::call::{CallResult, ToolOutput};
use crate::config::GatewayConfig;
use crate::journal::Journal;
use crate::tools::builtin::approve_tool_use;
use crate::vault::Vault;
use courier::{Arrivals, Whereabouts};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig, SubscriptionFilter, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};
use session::Session;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a waiting client hears that its call is still held.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How often the offered tools are read again while a client listens for changes to them
/// (a definition accepted, a server come up: both land in the journal, possibly written by a
/// daemon in another process, so a look is the one signal that sees every change).
const LIST_EVERY: Duration = Duration::from_secs(2);

/// The tools to offer now, as `vaultd tools --json` describes them (only those whose calls may
/// run): read again for every `tools/list`, so a tool accepted or a server come up since shows.
pub type ListTools = Box<dyn Fn() -> Result<Vec<Value>, String> + Send + Sync>;

/// The gateway of one `vaultd mcp serve`: shared by every client session it serves (stdio:
/// one; HTTP: each `Mcp-Session-Id`, or each client name for stateless 2026-07-28 requests).
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    vault: Vault,
    config: GatewayConfig,
    journal: Journal,
    list: ListTools,
    arrivals: Arrivals,
    limits: Limits,
    /// Each client session, by its key, created by its first call.
    clients: Mutex<HashMap<String, Arc<Client>>>,
    /// Bumped each time the offered tools change; each listening client holds a receiver.
    changes: tokio::sync::watch::Sender<u64>,
    /// The tools last read, to tell a change.
    last_list: Mutex<Option<Vec<Tool>>>,
    /// Set once the task that looks for changes runs (started by the first listener).
    looking: std::sync::OnceLock<()>,
}

/// What the gateway checks before it writes a call note.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// At most this many calls per client session (`note_budget`: a session is one note's
    /// worth of calls, docs/design.md §12.2).
    pub session_budget: u64,
    /// `max_note_bytes`: the daemon leaves a bigger note untouched, so a call whose note would
    /// be bigger is refused here instead of waiting for ever.
    pub max_note_bytes: u64,
}

/// One client session: its note, its call count, its held calls.
struct Client {
    note: Session,
    calls: AtomicU64,
    /// Calls whose note was written and has not been answered with its outcome (running,
    /// held, or given up by a client that cancelled), by tool and arguments: asking again
    /// waits for that note instead of writing a second one (which a person could approve too).
    held: Mutex<HashMap<String, String>>,
    /// Held from looking a call up in `held` to recording its new note there, so two identical
    /// calls at once write one note.
    sending: tokio::sync::Mutex<()>,
}

impl Gateway {
    pub fn new(
        vault: Vault,
        config: GatewayConfig,
        journal: Journal,
        list: ListTools,
        limits: Limits,
    ) -> Self {
        let arrivals = Arrivals::watch(&vault);
        Gateway {
            inner: Arc::new(Inner {
                vault,
                config,
                journal,
                list,
                arrivals,
                limits,
                clients: Mutex::new(HashMap::new()),
                changes: tokio::sync::watch::Sender::new(0),
                last_list: Mutex::new(None),
                looking: std::sync::OnceLock::new(),
            }),
        }
    }

    /// A receiver that wakes each time the offered tools change (`notifications/tools/
    /// list_changed`). The first one starts the task that reads the list every
    /// [`LIST_EVERY`] while anyone listens; it stops with the gateway.
    fn tool_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        let changes = self.inner.changes.subscribe();
        self.inner.looking.get_or_init(|| {
            let inner = Arc::downgrade(&self.inner);
            tokio::spawn(async move {
                let mut listened = false;
                loop {
                    let Some(gateway) = inner.upgrade().map(|inner| Gateway { inner }) else {
                        return;
                    };
                    let listening = gateway.inner.changes.receiver_count() > 0;
                    if listening != listened {
                        listened = listening;
                        if listening {
                            tracing::debug!("a client listens for tool changes: the offered tools are read every {}", humantime::format_duration(LIST_EVERY));
                        } else {
                            tracing::debug!("no client listens for tool changes any more: the offered tools are not read until one does");
                        }
                    }
                    if listening {
                        let looked = gateway.clone();
                        match tokio::task::spawn_blocking(move || looked.tools()).await {
                            Ok(Ok(_)) => {}
                            Ok(Err(e)) => tracing::warn!("cannot read the vault's tools: {e}"),
                            Err(e) => tracing::warn!("reading the vault's tools failed: {e}"),
                        }
                    }
                    drop(gateway);
                    tokio::time::sleep(LIST_EVERY).await;
                }
            });
        });
        changes
    }

    /// The tools as MCP `Tool`s, read now. A list unlike the last one read (by a client's
    /// `tools/list` or the look for changes) wakes every listening client. Read and compared
    /// under one lock: two reads at once cannot store the older list last (which woke every
    /// client twice for nothing).
    fn tools(&self) -> Result<Vec<Tool>, String> {
        let mut last = self
            .inner
            .last_list
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let described = (self.inner.list)()?;
        let now: Vec<Tool> = described.iter().filter_map(offered).collect();
        if last.as_ref().is_some_and(|last| *last != now) {
            tracing::info!("the offered tools changed: telling listening clients");
            self.inner.changes.send_modify(|n| *n += 1);
        }
        *last = Some(now.clone());
        Ok(now)
    }

    /// The session of the request's client: by its HTTP session id when it has one, else by
    /// the client's name (stdio has one client; a stateless HTTP client is one per name).
    fn client(&self, context: &RequestContext<RoleServer>) -> Arc<Client> {
        // 2026-07-28 clients name themselves in each request's `_meta`; older ones once, in
        // `initialize`.
        let name = context
            .meta
            .client_info()
            .map(|info| info.name)
            .or_else(|| context.peer.peer_info().map(|i| i.client_info.name.clone()))
            .unwrap_or_default();
        let http_session = context
            .extensions
            .get::<::http::request::Parts>()
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .map(|id| format!("session {id}"));
        let key = http_session.unwrap_or_else(|| format!("client {name}"));
        let mut clients = self.inner.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Client {
                    note: Session::new(
                        &self.inner.vault.root().join(&self.inner.config.sessions),
                        &name,
                    ),
                    calls: AtomicU64::new(0),
                    held: Mutex::new(HashMap::new()),
                    sending: tokio::sync::Mutex::new(()),
                })
            })
            .clone()
    }

    async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let tool = request.name.to_string();
        // Written into a note as a heading and inside the call: a name with anything but
        // these characters could end the heading or the block and add calls of its own.
        if tool.is_empty()
            || tool.len() > 128
            || !tool
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            return failure(
                "UNKNOWN_TOOL",
                &format!(
                    "no tool is named {:?}: tool names have only letters, digits, `_`, `-` and `.`",
                    tool.chars().take(200).collect::<String>()
                ),
            );
        }
        let call = json!({"tool_call": {
            "name": tool,
            "parameters": Value::Object(request.arguments.clone().unwrap_or_default()),
        }});
        let key = call.to_string();
        let call_json = serde_json::to_string_pretty(&call).unwrap_or_default();
        let client = self.client(&context);
        let session = &client.note;
        let sending = client.sending.lock().await;
        let waiting = client
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let (name, body) = match waiting {
            Some(name) => (name, None),
            None => match self.send_call_note(&client, &tool, &key, &call_json) {
                Ok((name, body)) => (name, Some(body)),
                Err(refused) => return refused,
            },
        };
        drop(sending);
        let (result, outcome_line, added) = tokio::select! {
            r = self.follow(&client, &name, &key, &context) => r,
            () = context.ct.cancelled() => {
                tracing::info!(note = %name, "the client cancelled a gateway call; its note runs on");
                (failure("CANCELLED", "cancelled by the client"), "cancelled by the client (the call note runs on)".to_string(), String::new())
            }
        };
        let result = if tool == approve_tool_use::NAME {
            permission_answer(result)
        } else {
            result
        };
        if (body.is_some() || !added.is_empty())
            && let Err(e) = session.append(&tool, &name, &outcome_line, &call_json, &added)
        {
            tracing::warn!(note = %session.path().display(), "cannot append to the session note: {e}");
        }
        result
    }

    /// call's sending stage: a new call checked (a daemon runs, the session's budget, the
    /// note's size) and written into Needs_Action/ as a call note of its own: the note's name
    /// and text, or the failure that answers the call.
    fn send_call_note(
        &self,
        client: &Client,
        tool: &str,
        key: &str,
        call_json: &str,
    ) -> Result<(String, String), CallToolResult> {
        let inner = &self.inner;
        let session = &client.note;
        if crate::daemon::running_daemon(inner.vault.root()).is_none() {
            return Err(failure(
                "NO_DAEMON",
                &format!(
                    "no vaultd runs on the vault {}: start `vaultd run --vault {}` (or its systemd unit), or restart `vaultd mcp serve`, which runs one when none does",
                    inner.vault.root().display(),
                    inner.vault.root().display()
                ),
            ));
        }
        let n = client.calls.load(Ordering::Relaxed) + 1;
        if n > inner.limits.session_budget {
            return Err(failure(
                "QUOTA_EXCEEDED",
                &format!(
                    "this session has made its {} calls (note_budget): start a new session",
                    inner.limits.session_budget
                ),
            ));
        }
        let body = format!(
            "# {tool}\n\nA call made through `vaultd mcp serve`, session [[{}]].\n\n```json\n{call_json}\n```\n",
            session.stem
        );
        if body.len() as u64 > inner.limits.max_note_bytes {
            return Err(failure(
                "INVALID_PARAMS",
                &format!(
                    "the call is {} bytes as a note, more than max_note_bytes ({}): send less, or raise max_note_bytes",
                    body.len(),
                    inner.limits.max_note_bytes
                ),
            ));
        }
        let sent = send_under_free_name(&inner.vault, &session.stem, n, &body);
        let name = match sent {
            Some(Ok(name)) => {
                // Counted once it is sent (a refused call is no call); recorded as in
                // flight until answered with its outcome.
                client.calls.fetch_add(1, Ordering::Relaxed);
                client
                    .held
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.to_string(), name.clone());
                name
            }
            Some(Err(e)) => {
                return Err(failure(
                    "EXECUTION_ERROR",
                    &format!("cannot write the call note into Needs_Action/: {e}"),
                ));
            }
            None => {
                return Err(failure(
                    "EXECUTION_ERROR",
                    "cannot find a free name for the call note in 100 tries",
                ));
            }
        };
        Ok((name, body))
    }

    /// Waits for the call note `name` and answers with its outcome; a held note is waited for
    /// up to `approval_wait`, with a progress notification every few seconds.
    async fn follow(
        &self,
        client: &Client,
        name: &str,
        key: &str,
        context: &RequestContext<RoleServer>,
    ) -> (CallToolResult, String, String) {
        let inner = &self.inner;
        let mut place = inner.arrivals.wait(&inner.vault, name, None).await;
        if let Whereabouts::Held(held) = place.clone() {
            place = match self.wait_while_held(client, name, key, context, held).await {
                Ok(place) => place,
                Err(held_answer) => return held_answer,
            };
        }
        // Answered with its outcome (or gone): the same call again is a new call. A note that
        // waits for a daemon stays recorded: asking again waits for it, it runs once.
        if matches!(place, Whereabouts::Finished(_) | Whereabouts::Gone) {
            client
                .held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(key);
        }
        let path = match place {
            Whereabouts::Finished(path) => path,
            Whereabouts::Gone => {
                let message = format!(
                    "the call note {name} was deleted or moved out of vaultd's folders (by a person, or to {}/): it does not run from there; `vaultd log` shows whether it ran before",
                    inner.vault.folder_name(crate::vault::State::DryRun),
                );
                return (
                    failure("REJECTED", &message),
                    "the call note was taken away: not run".to_string(),
                    String::new(),
                );
            }
            _ => {
                let message = format!(
                    "no vaultd runs on the vault any more: the call note {name} stays where it is and runs, at most once, when vaultd runs again (`vaultd run`, or a new `vaultd mcp serve`)"
                );
                return (
                    failure("NO_DAEMON", &message),
                    "no daemon: the call note waits".to_string(),
                    String::new(),
                );
            }
        };
        let rejected =
            path.parent() == Some(inner.vault.folder(crate::vault::State::Rejected).as_path());
        let found = courier::outcome(&inner.journal, &path, rejected).await;
        // Read after the outcome: a rejected note's results are written while it is waited for.
        let processed = std::fs::read_to_string(&path).unwrap_or_default();
        let added = added_after_call(&processed);
        match found {
            Some(result) => {
                let line = outcome_line(&result);
                (answer(result), line, added)
            }
            None => {
                let shown = path
                    .strip_prefix(inner.vault.root())
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                if rejected {
                    return (
                        failure(
                            "REJECTED",
                            &format!("a person rejected the call: the note is in {shown}"),
                        ),
                        format!("rejected ({shown})"),
                        added,
                    );
                }
                (
                    failure(
                        "EXECUTION_ERROR",
                        &format!(
                            "the call note ended in {shown} with no outcome in the journal: see the note"
                        ),
                    ),
                    format!("no outcome recorded; see {shown}"),
                    added,
                )
            }
        }
    }

    /// follow's held stage: a held call note waited for up to `approval_wait`, with a
    /// progress notification every few seconds; where it went, or the answer that it is
    /// still held.
    async fn wait_while_held(
        &self,
        client: &Client,
        name: &str,
        key: &str,
        context: &RequestContext<RoleServer>,
        held: std::path::PathBuf,
    ) -> Result<Whereabouts, (CallToolResult, String, String)> {
        let inner = &self.inner;
        let shown = held
            .strip_prefix(inner.vault.root())
            .unwrap_or(&held)
            .display()
            .to_string();
        let until = tokio::time::Instant::now() + inner.config.approval_wait;
        let token = context.meta.get_progress_token();
        let wait = inner.arrivals.wait(&inner.vault, name, Some(until));
        tokio::pin!(wait);
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        let mut step = 0.0;
        let place = loop {
            tokio::select! {
                p = &mut wait => break p,
                _ = tick.tick() => {
                    if let Some(token) = &token {
                        step += 1.0;
                        let note = ProgressNotificationParam::new(token.clone(), step)
                            .with_message(format!("held: waiting for a person to approve {shown}"));
                        let _ = context.peer.notify_progress(note).await;
                    }
                }
            }
        };
        if let Whereabouts::Held(_) = place {
            client
                .held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.to_string(), name.to_string());
            let message = format!(
                "the call is held for a person's approval in {shown} (waited {}). Approve it (move it to {}/, or `vaultd approve \"{name}\"`) or reject it, then call again with the same arguments: the gateway then answers from that note, and the call is not sent twice",
                humantime::format_duration(inner.config.approval_wait),
                inner.vault.folder_name(crate::vault::State::Approved),
            );
            let added = std::fs::read_to_string(&held)
                .map(|t| added_after_call(&t))
                .unwrap_or_default();
            return Err((
                failure("HELD", &message),
                format!("held for approval in {shown}"),
                added,
            ));
        }
        Ok(place)
    }
}

/// call's naming stage: the call note written as `<stem> call <n>.md`, with a suffix when
/// a note already has that name; None when 100 names are taken.
fn send_under_free_name(
    vault: &Vault,
    stem: &str,
    n: u64,
    body: &str,
) -> Option<std::io::Result<String>> {
    // A name some note already has (a copy synced in, a session of another
    // gateway that drew the same stem) gets a suffix: a call never shares a note.
    let mut sent = None;
    for k in 0..100 {
        let name = match k {
            0 => format!("{} call {n}.md", stem),
            k => format!("{} call {n}-{k}.md", stem),
        };
        match courier::send(vault, &name, body) {
            Ok(_) => {
                sent = Some(Ok(name));
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                sent = Some(Err(e));
                break;
            }
        }
    }
    sent
}

/// What the daemon appended below the call block of a processed call note.
fn added_after_call(processed: &str) -> String {
    match processed.find("\n```\n") {
        Some(at) => processed[at + 5..].trim().to_string(),
        None => String::new(),
    }
}

/// One line for the session note.
fn outcome_line(result: &CallResult) -> String {
    match &result.outcome {
        Ok(out) => format!("ok: {}", out.summary),
        Err(e) => format!("{}: {}", e.code.as_str(), e.message),
    }
}

/// An error result with vaultd's code.
fn failure(code: &str, message: &str) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(format!("{code}: {message}"))]);
    r.structured_content = Some(json!({"error": {"code": code, "message": message}}));
    r
}

/// The MCP result of a recorded outcome: an upstream MCP tool's content as it came (binary
/// items saved as attachments, as in a note), any other tool's `data` as JSON text and as
/// `structuredContent`; an error as `isError` with its code and message.
fn answer(result: CallResult) -> CallToolResult {
    match result.outcome {
        Ok(ToolOutput { data, .. }) => {
            if let Some(content) = data.get("content")
                && let Ok(items) = serde_json::from_value::<Vec<ContentBlock>>(content.clone())
            {
                let mut r = CallToolResult::success(items);
                r.structured_content = data.get("structuredContent").cloned();
                return r;
            }
            let text = serde_json::to_string_pretty(&data).unwrap_or_default();
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            if data.is_object() {
                r.structured_content = Some(data);
            }
            r
        }
        Err(e) => {
            let mut r = failure(e.code.as_str(), &e.message);
            if let Some(details) = e.details {
                r.structured_content = Some(json!({"error": {
                    "code": e.code.as_str(), "message": e.message, "details": details,
                }}));
            }
            r
        }
    }
}

/// `approve_tool_use` answers Claude Code in its permission-prompt contract: one text item, the
/// JSON `{"behavior": "allow", "updatedInput": …}` or `{"behavior": "deny", "message": …}`,
/// never an error. A call that ended in an error (rejected by a person, still held when
/// `approval_wait` ran out, malformed) denies, saying why.
fn permission_answer(result: CallToolResult) -> CallToolResult {
    let data = result.structured_content.clone().unwrap_or(Value::Null);
    let decided = if result.is_error == Some(true) {
        let why = data["error"]["message"]
            .as_str()
            .unwrap_or("the call failed");
        let code = data["error"]["code"].as_str().unwrap_or("EXECUTION_ERROR");
        approve_tool_use::answer("deny", &Default::default(), &format!("{code}: {why}"))
    } else {
        match data["behavior"].as_str() {
            Some("allow") => json!({"behavior": "allow", "updatedInput": data["updatedInput"]}),
            _ => json!({"behavior": "deny", "message": data["message"]}),
        }
    };
    let mut r = CallToolResult::success(vec![ContentBlock::text(decided.to_string())]);
    r.structured_content = Some(decided);
    r
}

/// An MCP `Tool` of one `vaultd tools --json` entry: name, description, schema, and hints from
/// its effect (`readOnlyHint` for read_only, `destructiveHint` for external side effects).
fn offered(described: &Value) -> Option<Tool> {
    let effect = described["effect"].as_str().unwrap_or("");
    let mut schema = described["parameters"].clone();
    if !schema.is_object() {
        schema = json!({"type": "object"});
    }
    serde_json::from_value(json!({
        "name": described["name"],
        "description": described["description"],
        "inputSchema": schema,
        "annotations": {
            "readOnlyHint": effect == "read_only",
            "destructiveHint": effect == "external_side_effect",
            "idempotentHint": effect == "read_only",
            "openWorldHint": effect != "state_change",
        },
    }))
    .ok()
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("vaultd", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "The vault's tools, run by vaultd: every call is journaled, runs at most once, and may be held for a person's approval in the vault (the call then waits, with progress notifications).",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self.tools().map_err(|e| {
            ErrorData::internal_error(format!("cannot list the vault's tools: {e}"), None)
        })?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(self.call(request, context).await.into())
    }

    /// A 2025 client (one that sent `initialize`) hears `notifications/tools/list_changed` on
    /// its session for as long as it lasts. A session that ends is let go within
    /// [`LIST_EVERY`], not at the next change: while it counted as a listener, the look for
    /// changes went on reading the vault's tools every 2 s for a client long gone.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let changes = self.tool_changes();
        tokio::spawn(tell_of_changes(context.peer, changes));
    }

    /// A 2026-07-28 client listens with `subscriptions/listen`: only tool list changes are
    /// offered (the gateway has no prompts or resources).
    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut tools = SubscriptionFilter::new();
        tools.tools_list_changed = Some(true);
        Some(tools)
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        let mut changes = self.tool_changes();
        loop {
            tokio::select! {
                () = subscription.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() || subscription.sink().notify_tool_list_changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// Sends `notifications/tools/list_changed` to `peer` at each change, until its session
/// ends (looked at every [`LIST_EVERY`] as well as at each change).
async fn tell_of_changes(
    peer: rmcp::Peer<RoleServer>,
    mut changes: tokio::sync::watch::Receiver<u64>,
) {
    let mut look = tokio::time::interval(LIST_EVERY);
    loop {
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err()
                    || peer.is_transport_closed()
                    || peer.notify_tool_list_changed().await.is_err()
                {
                    return;
                }
            }
            _ = look.tick() => {
                if peer.is_transport_closed() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{CallError, ErrorCode};
    use std::time::SystemTime;

    fn result(outcome: Result<ToolOutput, CallError>) -> CallResult {
        CallResult {
            call_id: "c-1".into(),
            name: "t".into(),
            outcome,
            started_at: SystemTime::now(),
            ended_at: SystemTime::now(),
        }
    }

    #[test]
    fn effects_become_hints() {
        let t = offered(&json!({"name": "send_notification", "description": "d",
            "parameters": {"type": "object"}, "effect": "external_side_effect"}))
        .unwrap();
        let a = t.annotations.unwrap();
        assert_eq!(
            (a.read_only_hint, a.destructive_hint),
            (Some(false), Some(true))
        );
        let t = offered(&json!({"name": "search_web", "parameters": null, "effect": "read_only"}))
            .unwrap();
        assert_eq!(t.annotations.unwrap().read_only_hint, Some(true));
        assert_eq!(t.input_schema.get("type"), Some(&json!("object")));
    }

    #[test]
    fn outcomes_become_results() {
        let ok = answer(result(Ok(ToolOutput {
            data: json!({"results": [1]}),
            summary: "1 result".into(),
            undo: None,
        })));
        assert_eq!(ok.is_error, Some(false));
        assert_eq!(ok.structured_content, Some(json!({"results": [1]})));

        let upstream = answer(result(Ok(ToolOutput {
            data: json!({"content": [{"type": "text", "text": "hi"}], "structuredContent": {"a": 1}}),
            summary: "1 item".into(),
            undo: None,
        })));
        let v = serde_json::to_value(&upstream).unwrap();
        assert_eq!(v["content"][0]["text"], "hi");
        assert_eq!(v["structuredContent"], json!({"a": 1}));

        let err = answer(result(Err(CallError::new(
            ErrorCode::PolicyDenied,
            "not allowed",
        ))));
        let v = serde_json::to_value(&err).unwrap();
        assert_eq!(v["isError"], true);
        assert_eq!(v["content"][0]["text"], "POLICY_DENIED: not allowed");
        assert_eq!(v["structuredContent"]["error"]["code"], "POLICY_DENIED");
    }

    #[test]
    fn what_follows_the_call_block_is_kept() {
        let note = "---\ntool_note: n\n---\n# t\n\n```json\n{}\n```\n\n> [!success]- ok\n";
        assert_eq!(added_after_call(note), "> [!success]- ok");
    }
}
