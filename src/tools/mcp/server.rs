//! One MCP server under supervision: started (a child process in its own process group that
//! dies with vaultd, or a streamable HTTP session), its tools listed to the last page and
//! pinned, restarted with backoff when it fails or exits, its stderr sent to the log, and
//! stopped on shutdown (close stdin, SIGTERM, SIGKILL after 2 s).
//!
//! Pins are checked at every call (twice: at admission and at run), so the accepted ones are
//! cached in memory, by definition hash. Only a pin that was found accepted is cached: every
//! other answer (changed, new) is read from the journal again at the next call, so a
//! `vaultd tools accept` made by another process while the daemon runs counts at once. What
//! can make an accepted definition unaccepted is a new listing, which this daemon records
//! itself (start, restart, `notifications/tools/list_changed`): the cache is rebuilt from that
//! listing's pin states. A cached hash that no longer matches the listed definition is a miss.
//! (This assumes one daemon records a state dir's catalog, as one daemon runs per vault.)

use super::config::{INHERITED_ENV, McpSandbox, McpServerConfig, ServerSandbox, Transport};
use super::discover::{self, Era};
use super::ids::FreshIds;
use super::pin;
use crate::call::{CallError, ErrorCode};
use crate::journal::Journal;
use crate::journal::catalog::{ListedTool, LiveEvent, PinState};
use crate::tools::command::config::SandboxMode;
use crate::tools::command::sandbox::{self as command_sandbox, Limits, Support};
use crate::tools::sandbox::{seccomp, supervise};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    DEFAULT_MRTR_MAX_ROUNDS, ElicitResult, ElicitationAction, Implementation, InputRequest,
    InputRequiredResult, InputResponses, ProtocolVersion,
};
use rmcp::service::{
    ClientInitializeError, NotificationContext, Peer, RoleClient, RunningService, ServiceError,
};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;

/// Restart backoff: from 1 s, doubling, up to 60 s (docs/design.md §10.4).
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A server that stayed up this long starts its next backoff from the minimum again.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// After stdin is closed, how long a server gets to exit before SIGTERM.
const EXIT_ON_EOF: Duration = Duration::from_secs(1);
/// After SIGTERM, how long before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);
/// The first pause before answering a state-only `input_required` round (then 100, 200 ms):
/// the values of rmcp's own driver.
const STATE_ONLY_PAUSE: Duration = Duration::from_millis(50);

/// How a session over HTTP starts (docs/design.md §10.4): `server/discover` at the newest
/// revision rmcp speaks (2026-07-28: per-request `_meta`, the SEP-2243 headers), and a server
/// that answers discovery with a JSON-RPC error (it predates it), or leaves it unanswered for
/// 10 s (rmcp's wait), gets the `initialize` handshake at 2025-11-25. Over HTTP each answer
/// comes back on its own request, so a late answer to discovery cannot be taken for the
/// answer to `initialize`. Over stdio it can, so there vaultd asks first and waits for the
/// answer itself: see [`super::discover`].
fn lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
    }
}

/// How [`McpServer::open`] starts a session.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Discovery first, `initialize` for a server that predates it.
    Discover,
    /// `initialize` only, on a fresh connection (see [`HandshakeError::Again`]).
    InitializeOnly,
}

/// Why a handshake failed. `Again`: the server is to be connected again, from scratch, with
/// `initialize` only (it answered `server/discover` with a result that is not a discovery
/// result, as servers that answer every unknown method with `{}` do, or, over stdio, did not
/// answer it at all in time); the reason, for the log.
enum HandshakeError {
    Again(String),
    Other(String),
}

impl From<ClientInitializeError> for HandshakeError {
    fn from(e: ClientInitializeError) -> HandshakeError {
        match e {
            // Not the response's Debug dump: it can be anything the server sent.
            ClientInitializeError::ExpectedInitResult(_) => HandshakeError::Again(
                "it answered server/discover with a result that is not a discovery result (some servers answer every method they do not know with {})".into(),
            ),
            other => HandshakeError::Other(format!("the MCP handshake failed: {other}")),
        }
    }
}

/// How a session of [`McpServer::serve_session`] ended.
enum SessionEnd {
    /// A new OAuth login: connect again at once.
    Renewed,
    /// vaultd is stopping.
    Stopped,
    /// The server exited: restart it after the backoff.
    Exited,
}

/// The connection as calls see it.
#[derive(Clone, Default)]
struct Link {
    /// Set while the server is up.
    peer: Option<Peer<RoleClient>>,
    /// Counts connections; a call that saw connection `n` fail waits for `n + 1`.
    generation: u64,
    /// Counts start attempts (successful or not), so start-up can stop waiting early.
    attempts: u64,
    /// Why the server is down, for the EXECUTION_ERROR of calls meanwhile.
    error: Option<String>,
}

/// One tool as last listed: the definition as sent and its pin identity.
#[derive(Debug, Clone)]
pub struct Listed {
    pub definition: Value,
    pub listed: ListedTool,
}

pub struct McpServer {
    pub config: McpServerConfig,
    journal: Arc<Journal>,
    link: watch::Sender<Link>,
    /// The allowed tools of the last listing (or of the catalog, before the first).
    tools: Mutex<HashMap<String, Listed>>,
    /// Tool name -> the definition hash found accepted: the pin check without SQLite (see the
    /// module doc for when it is refreshed).
    accepted: Mutex<HashMap<String, String>>,
    /// Set on shutdown.
    stop: watch::Sender<bool>,
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    http: reqwest::Client,
    /// Working directory of a stdio server without `cwd`.
    default_cwd: std::path::PathBuf,
    /// Asks the supervisor to end the session and connect again at once: a call was refused
    /// for want of a login, and the token file changed since the session began (a `vaultd
    /// mcp login` made while the daemon runs), so a new session sends the new tokens.
    renew: tokio::sync::Notify,
    /// The OAuth token file as it was when the current session began (size and mtime):
    /// whether a login happened since.
    login_seen: Mutex<Option<(u64, std::time::SystemTime)>>,
}

impl McpServer {
    pub fn new(
        config: McpServerConfig,
        journal: Arc<Journal>,
        http: reqwest::Client,
        default_cwd: std::path::PathBuf,
    ) -> Arc<McpServer> {
        let server = Arc::new(McpServer {
            config,
            journal,
            link: watch::channel(Link::default()).0,
            tools: Mutex::new(HashMap::new()),
            accepted: Mutex::new(HashMap::new()),
            stop: watch::channel(false).0,
            supervisor: Mutex::new(None),
            http,
            default_cwd,
            renew: tokio::sync::Notify::new(),
            login_seen: Mutex::new(None),
        });
        server.load_catalog();
        server
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Why the server is down, when it is and vaultd knows.
    pub fn down_reason(&self) -> Option<String> {
        self.link.borrow().error.clone()
    }

    /// Fills the tool list from the journal's catalog (what the server listed last time).
    fn load_catalog(&self) {
        match self.journal.mcp_catalog(self.name()) {
            Ok(Some(catalog)) => {
                let mut tools = self.tools.lock().expect("tools lock");
                for entry in catalog.tools {
                    if !self.config.allow.allows(&entry.tool.tool) {
                        continue;
                    }
                    let definition =
                        serde_json::from_str(&entry.tool.definition).unwrap_or(Value::Null);
                    tools.insert(
                        entry.tool.tool.clone(),
                        Listed {
                            definition,
                            listed: entry.tool,
                        },
                    );
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(server = self.name(), "cannot read the tool catalog: {e}"),
        }
    }

    /// The allowed tools as last listed, by name.
    pub fn tools(&self) -> HashMap<String, Listed> {
        self.tools.lock().expect("tools lock").clone()
    }

    pub fn tool(&self, name: &str) -> Option<Listed> {
        self.tools.lock().expect("tools lock").get(name).cloned()
    }

    /// Starts the supervisor task (start, list, watch, restart).
    pub fn spawn(self: &Arc<Self>) {
        let me = self.clone();
        let handle = tokio::spawn(async move { me.supervise().await });
        *self.supervisor.lock().expect("supervisor lock") = Some(handle);
    }

    /// Waits until the server is up, or its first start failed and the one retry after the
    /// shortest backoff did too, or `limit` passed. A server whose first start fails for a
    /// passing reason (a package cache being filled, a port still held) is up for `vaultd
    /// once` and the first notes of `vaultd run`; one that cannot start costs start-up about
    /// `BACKOFF_MIN` more, not the whole `limit`.
    pub async fn wait_up(&self, limit: Duration) {
        let mut rx = self.link.subscribe();
        let _ =
            tokio::time::timeout(limit, rx.wait_for(|l| l.peer.is_some() || l.attempts >= 2)).await;
    }

    pub fn is_up(&self) -> bool {
        self.link.borrow().peer.is_some()
    }

    /// Stops the server and its supervisor; returns when the process is gone.
    pub async fn shutdown(&self) {
        self.stop.send_replace(true);
        let handle = self.supervisor.lock().expect("supervisor lock").take();
        if let Some(h) = handle {
            let _ = h.await;
        }
    }

    async fn supervise(self: Arc<Self>) {
        let mut stop = self.stop.subscribe();
        let mut backoff = BACKOFF_MIN;
        loop {
            if *stop.borrow() {
                break;
            }
            let started = Instant::now();
            // A server that never answers must not hold its supervisor forever.
            let connected = tokio::time::timeout(self.config.start_timeout, self.connect())
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "no answer to initialize and tools/list within its start_timeout of {}",
                        humantime::format_duration(self.config.start_timeout)
                    ))
                });
            match connected {
                Ok(conn) => match self.serve_session(conn, &mut stop).await {
                    SessionEnd::Renewed => continue,
                    SessionEnd::Stopped => break,
                    SessionEnd::Exited => {
                        tracing::warn!(
                            server = self.name(),
                            "MCP server exited; restarting in {}",
                            humantime::format_duration(backoff)
                        );
                        self.record_live(LiveEvent::Down {
                            error: "the server exited".into(),
                        });
                        if started.elapsed() >= HEALTHY_AFTER {
                            backoff = BACKOFF_MIN;
                        }
                    }
                },
                Err(e) => {
                    tracing::error!(
                        server = self.name(),
                        "MCP server did not start: {e}; retrying in {}",
                        humantime::format_duration(backoff)
                    );
                    self.record_live(LiveEvent::Down {
                        error: format!("it did not start: {e}"),
                    });
                    self.link.send_modify(|l| {
                        l.attempts += 1;
                        l.error = Some(format!("it did not start: {e}"));
                    });
                }
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
        self.record_live(LiveEvent::Stopped);
    }

    /// supervise's session stage: the server marked up, its session served until it ends,
    /// vaultd stops or a new login asks for a new session; then the server stopped.
    async fn serve_session(
        &self,
        conn: Connection,
        stop: &mut watch::Receiver<bool>,
    ) -> SessionEnd {
        let Connection { service, child } = conn;
        let up = service.peer().clone();
        self.link.send_modify(|l| {
            l.peer = Some(up);
            l.generation += 1;
            l.attempts += 1;
            l.error = None;
        });
        // One short line (rmcp's own INFO line dumps the whole ServerPeerInfo;
        // the default log filter keeps rmcp at warn).
        let about = service
            .peer()
            .peer_info()
            .map(|i| {
                let who = i.server_info.as_ref().map_or_else(
                    || "unnamed server".to_string(),
                    |s| format!("{} {}", s.name, s.version),
                );
                format!(": {who}, MCP protocol {}", i.protocol_version)
            })
            .unwrap_or_default();
        tracing::info!(server = self.name(), "MCP server is up{about}");
        self.record_live(LiveEvent::Up {
            about: about.trim_start_matches(": ").to_string(),
        });
        let ct = service.cancellation_token();
        let session = service.waiting();
        tokio::pin!(session);
        let (stopped, renewed) = tokio::select! {
            _ = stop.wait_for(|s| *s) => (true, false),
            _ = &mut session => (false, false),
            () = self.renew.notified() => (false, true),
        };
        if renewed {
            tracing::info!(
                server = self.name(),
                "a new OAuth login since the session began: connecting again with its tokens"
            );
            self.link.send_modify(|l| {
                l.peer = None;
                l.error = Some("connecting again with a new login".into());
            });
            ct.cancel();
            let _ = tokio::time::timeout(EXIT_ON_EOF, &mut session).await;
            if let Some(child) = child {
                stop_child(self.name(), child).await;
            }
            return SessionEnd::Renewed;
        }
        self.link.send_modify(|l| {
            l.peer = None;
            l.error = Some(if stopped {
                "vaultd is stopping".into()
            } else {
                "the server exited; restarting".into()
            });
        });
        if stopped {
            // Closing the session closes the server's stdin.
            ct.cancel();
            let _ = tokio::time::timeout(EXIT_ON_EOF, &mut session).await;
        }
        if let Some(child) = child {
            stop_child(self.name(), child).await;
        }
        if stopped {
            SessionEnd::Stopped
        } else {
            SessionEnd::Exited
        }
    }

    /// Tells the journal, for `vaultd status`; a journal that cannot take it is logged by
    /// its writer and the server goes on.
    fn record_live(&self, event: LiveEvent) {
        static DAEMON_STARTED_MS: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
        let started = *DAEMON_STARTED_MS.get_or_init(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64)
        });
        if let Err(e) = self.journal.record_mcp_live(self.name(), started, event) {
            tracing::warn!(
                server = self.name(),
                "cannot record the server's state: {e}"
            );
        }
    }

    /// Starts the server, opens the session (discovery, else `initialize`: see
    /// [`super::discover`] and [`lifecycle`]) and lists its tools.
    async fn connect(self: &Arc<Self>) -> Result<Connection, String> {
        match self.open(Start::Discover).await {
            Ok(conn) => Ok(conn),
            Err(HandshakeError::Again(why)) => {
                tracing::info!(
                    server = self.name(),
                    "MCP server did not answer server/discover with a discovery result: {why}; connecting again with initialize only"
                );
                self.open(Start::InitializeOnly).await.map_err(|e| match e {
                    HandshakeError::Again(_) => {
                        "initialize failed: the server's answer is not an initialize result"
                            .to_string()
                    }
                    HandshakeError::Other(e) => e,
                })
            }
            Err(HandshakeError::Other(e)) => Err(e),
        }
    }

    /// One connection attempt.
    async fn open(self: &Arc<Self>, start: Start) -> Result<Connection, HandshakeError> {
        let handler = VaultdClient {
            server: Arc::downgrade(self),
            asks_in_rounds: true,
        };
        let (service, child) = match &self.config.transport {
            Transport::Stdio {
                program,
                args,
                env,
                cwd,
                sandbox,
            } => {
                let spawned = spawn_child(
                    self.name(),
                    program,
                    args,
                    env,
                    cwd.as_deref().unwrap_or(&self.default_cwd),
                    &self.default_cwd,
                    sandbox,
                )
                .map_err(HandshakeError::Other)?;
                let (service, spawned) = self.open_stdio(start, handler, spawned).await?;
                (service, Some(spawned))
            }
            Transport::Http {
                url,
                headers,
                oauth,
            } => {
                let service = self.open_http(start, handler, url, headers, oauth).await?;
                (service, None)
            }
        };
        let conn = Connection { service, child };
        if let Err(e) = self.relist(conn.service.peer()).await {
            conn.stop(self.name()).await;
            return Err(HandshakeError::Other(e));
        }
        Ok(conn)
    }

    /// open's stdio stage: the session over the started server's stdin and stdout (its
    /// stderr sent to the log); on a failed handshake the server is stopped.
    async fn open_stdio(
        self: &Arc<Self>,
        start: Start,
        mut handler: VaultdClient,
        mut spawned: Spawned,
    ) -> Result<(RunningService<RoleClient, VaultdClient>, Spawned), HandshakeError> {
        let child = &mut spawned.child;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut stdin = child.stdin.take().expect("stdin is piped");
        if let Some(stderr) = child.stderr.take() {
            let name = self.name().to_string();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(server = %name, "MCP server stderr: {line}");
                }
            });
        }
        // What the probe reads past stays in the buffer for rmcp.
        let mut stdout = tokio::io::BufReader::new(stdout);
        let mode = match start {
            Start::InitializeOnly => {
                handler.asks_in_rounds = false;
                ClientLifecycleMode::Initialize
            }
            Start::Discover => {
                let era = discover::probe(
                    &mut stdout,
                    &mut stdin,
                    &handler.get_info(),
                    ProtocolVersion::V_2026_07_28,
                    discover::probe_wait(self.config.start_timeout),
                )
                .await;
                match era {
                    Ok(Era::Discover) => ClientLifecycleMode::Discover {
                        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                    },
                    Ok(Era::Initialize(code, message)) => {
                        tracing::info!(
                            server = self.name(),
                            "MCP server answered server/discover with JSON-RPC error {code} ({message}): it predates 2026-07-28; initialize at 2025-11-25"
                        );
                        handler.asks_in_rounds = false;
                        ClientLifecycleMode::Initialize
                    }
                    Ok(Era::Fresh(why)) => {
                        stop_child(self.name(), spawned).await;
                        return Err(HandshakeError::Again(why));
                    }
                    Err(e) => {
                        stop_child(self.name(), spawned).await;
                        return Err(HandshakeError::Other(format!(
                            "the MCP handshake failed: {e}"
                        )));
                    }
                }
            }
        };
        let transport =
            rmcp::transport::IntoTransport::<RoleClient, _, _>::into_transport((stdout, stdin));
        let service = match handler
            .serve_with_lifecycle(FreshIds::new(transport), mode)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                stop_child(self.name(), spawned).await;
                return Err(e.into());
            }
        };
        Ok((service, spawned))
    }

    /// open's HTTP stage: the session over streamable HTTP, with the configured headers and
    /// the tokens of `vaultd mcp login` when there are any.
    async fn open_http(
        self: &Arc<Self>,
        start: Start,
        mut handler: VaultdClient,
        url: &str,
        headers: &[(String, crate::secret::Secret)],
        oauth: &(super::oauth::TokenFile, super::oauth::OAuthClient),
    ) -> Result<RunningService<RoleClient, VaultdClient>, HandshakeError> {
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        let mut map = HashMap::new();
        for (name, secret) in headers {
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| HandshakeError::Other(format!("header name `{name}`: {e}")))?;
            let mut value =
                reqwest::header::HeaderValue::from_str(secret.expose()).map_err(|_| {
                    HandshakeError::Other(format!(
                        "header `{name}`: the secret is not a valid header value"
                    ))
                })?;
            value.set_sensitive(true);
            map.insert(name, value);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(map);
        let mode = match start {
            Start::Discover => lifecycle(),
            Start::InitializeOnly => {
                handler.asks_in_rounds = false;
                ClientLifecycleMode::Initialize
            }
        };
        let login = || format!("run `vaultd mcp login {}`", self.name());
        let (tokens, client) = oauth;
        *self.login_seen.lock().expect("login_seen lock") = tokens.stamp();
        let service = if tokens.logged_in() {
            // The tokens of `vaultd mcp login`: sent, and refreshed as they expire.
            let manager = super::oauth::authorized(url, tokens.clone(), client, &self.http)
                .await
                .map_err(|e| {
                    HandshakeError::Other(format!(
                        "its OAuth tokens cannot be used ({e}): {}",
                        login()
                    ))
                })?;
            let transport = StreamableHttpClientTransport::with_client(
                rmcp::transport::auth::AuthClient::new(self.http.clone(), manager),
                config,
            );
            handler
                .serve_with_lifecycle(FreshIds::new(transport), mode)
                .await
        } else {
            let transport = StreamableHttpClientTransport::with_client(self.http.clone(), config);
            handler
                .serve_with_lifecycle(FreshIds::new(transport), mode)
                .await
        };
        service.map_err(|e| match super::oauth::refusal(self.name(), &e) {
            Some(why) => HandshakeError::Other(why),
            None => e.into(),
        })
    }

    /// Lists every tool (all pages), records the allowed ones in the catalog and their pins.
    async fn relist(&self, peer: &Peer<RoleClient>) -> Result<(), String> {
        let all = peer.list_all_tools().await.map_err(|e| {
            super::oauth::refusal(self.name(), &e)
                .unwrap_or_else(|| format!("tools/list failed: {e}"))
        })?;
        let mut listed = Vec::new();
        let mut others = Vec::new();
        let mut defs = HashMap::new();
        for tool in all {
            let definition = serde_json::to_value(&tool).unwrap_or(Value::Null);
            let l = pin::listed(&tool.name, &definition);
            if !self.config.allow.allows(&tool.name) {
                others.push(l);
                continue;
            }
            defs.insert(
                tool.name.to_string(),
                Listed {
                    definition,
                    listed: l.clone(),
                },
            );
            listed.push(l);
        }
        let journal = self.journal.clone();
        let name = self.name().to_string();
        let to_record = listed.clone();
        let states = tokio::task::spawn_blocking(move || {
            journal.record_mcp_listing(&name, &to_record, &others)
        })
        .await
        .map_err(|e| format!("journal task failed: {e}"))?
        .map_err(|e| format!("cannot record the tool listing: {e}"))?;
        self.remember_accepted(&listed, &states);
        for (l, state) in listed.iter().zip(&states) {
            let full = super::tool_name(self.name(), &l.tool);
            match state {
                PinState::Accepted => {}
                PinState::Changed { .. } => tracing::warn!(
                    tool = %full,
                    "MCP tool definition changed since accepted; its calls are denied until `vaultd tools accept {full}` (see `vaultd tools` for the diff)"
                ),
                PinState::New => tracing::warn!(
                    tool = %full,
                    "MCP tool appeared after the server's first listing; its calls are denied until `vaultd tools accept {full}`"
                ),
            }
        }
        tracing::debug!(
            server = self.name(),
            tools = listed.len(),
            "listed MCP tools"
        );
        *self.tools.lock().expect("tools lock") = defs;
        Ok(())
    }

    /// The pin state of `tool`'s current definition: from the cache when it was found
    /// accepted, else read from the journal at call time, so an accept made while the daemon
    /// runs counts at once (module doc). None: the server no longer offers the tool.
    pub fn pin_state(&self, tool: &str) -> Option<Result<PinState, String>> {
        let listed = self.tool(tool)?;
        let hash = &listed.listed.hash;
        if self.accepted.lock().expect("accepted lock").get(tool) == Some(hash) {
            return Some(Ok(PinState::Accepted));
        }
        let state = self
            .journal
            .mcp_pin_state(self.name(), &listed.listed)
            .map_err(|e| e.to_string());
        if state == Ok(PinState::Accepted) {
            self.accepted
                .lock()
                .expect("accepted lock")
                .insert(tool.to_string(), hash.clone());
        }
        Some(state)
    }

    /// Replaces the cache of accepted pins with what a new listing found.
    fn remember_accepted(&self, listed: &[ListedTool], states: &[PinState]) {
        *self.accepted.lock().expect("accepted lock") = listed
            .iter()
            .zip(states)
            .filter(|(_, state)| **state == PinState::Accepted)
            .map(|(l, _)| (l.tool.clone(), l.hash.clone()))
            .collect();
    }

    /// A connected peer. `wait_past`: wait (until `deadline`) for a connection newer than
    /// this generation (after a crash mid-call, or before the first start finished).
    async fn peer(
        &self,
        deadline: Instant,
        wait_past: Option<u64>,
    ) -> Result<(Peer<RoleClient>, u64), CallError> {
        let mut rx = self.link.subscribe();
        let ready = |l: &Link| l.peer.is_some() && wait_past.is_none_or(|g| l.generation > g);
        let first_start_pending = rx.borrow().attempts == 0;
        if wait_past.is_some() || first_start_pending {
            let _ = tokio::time::timeout_at(
                tokio::time::Instant::from_std(deadline),
                rx.wait_for(|l| ready(l)),
            )
            .await;
        }
        let l = rx.borrow().clone();
        match (&l.peer, ready(&l)) {
            (Some(p), true) => Ok((p.clone(), l.generation)),
            _ => Err(CallError::new(
                ErrorCode::ExecutionError,
                format!(
                    "MCP server `{}` is not running ({}); vaultd restarts it with backoff, try again later",
                    self.name(),
                    l.error.as_deref().unwrap_or("starting")
                ),
            )
            .retryable(true)),
        }
    }

    /// Whether the OAuth token file changed since the current session began (a login).
    fn login_changed(&self) -> bool {
        let Transport::Http { oauth, .. } = &self.config.transport else {
            return false;
        };
        *self.login_seen.lock().expect("login_seen lock") != oauth.0.stamp()
    }

    /// Calls `tool` once. A server that goes away mid-call: a `read_only` tool is called
    /// again on the restarted server (within the deadline); anything else ends as
    /// UNKNOWN_OUTCOME, since it may have acted.
    pub async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        safe_to_repeat: bool,
        deadline: Instant,
        answer: Option<&Value>,
    ) -> Result<CallToolResult, CallError> {
        let mut wait_past = None;
        let mut renewed = false;
        loop {
            let (peer, generation) = self.peer(deadline, wait_past).await?;
            match self.call_rounds(&peer, tool, &arguments, answer).await {
                Ok(result) => return Ok(result),
                Err(Round::Refused(e)) => return Err(e),
                // Refused at the door (401, or 403 for more scope): not run. A login made since
                // the session began: a new session sends its tokens, and the call is made
                // again there (once; it did not run). Else a person has to log in first.
                Err(Round::Service(e))
                    if super::oauth::refusal(self.name(), &e).is_some()
                        && !renewed
                        && self.login_changed() =>
                {
                    renewed = true;
                    wait_past = Some(generation);
                    self.renew.notify_one();
                }
                Err(Round::Service(e))
                    if let Some(why) = super::oauth::refusal(self.name(), &e) =>
                {
                    return Err(CallError::new(
                        ErrorCode::ExecutionError,
                        format!(
                            "MCP server `{}` refused the call, which did not run: {why}",
                            self.name()
                        ),
                    ));
                }
                Err(Round::Service(e)) => match e {
                    ServiceError::McpError(e) => {
                        return Err(CallError::new(
                            ErrorCode::ExecutionError,
                            format!(
                                "MCP server `{}` refused the call: {} (JSON-RPC error {})",
                                self.name(),
                                e.message,
                                e.code.0
                            ),
                        ));
                    }
                    ServiceError::TransportClosed | ServiceError::TransportSend(_)
                        if wait_past.is_none() && safe_to_repeat =>
                    {
                        tracing::warn!(
                            server = self.name(),
                            tool,
                            "MCP server went away during a read_only call; calling again once it is back"
                        );
                        wait_past = Some(generation);
                    }
                    e @ (ServiceError::TransportClosed | ServiceError::TransportSend(_)) => {
                        if safe_to_repeat {
                            return Err(CallError::new(
                                ErrorCode::ExecutionError,
                                format!(
                                    "MCP server `{}` went away during the call: {e}",
                                    self.name()
                                ),
                            )
                            .retryable(true));
                        }
                        return Err(CallError::new(
                            ErrorCode::UnknownOutcome,
                            format!(
                                "MCP server `{}` went away while this call ran; it may or may not have acted, so it is not called again. Check, then write the call again to run it once more",
                                self.name()
                            ),
                        ));
                    }
                    e => {
                        return Err(CallError::new(
                            ErrorCode::ExecutionError,
                            format!("MCP call to `{}` failed: {e}", self.name()),
                        ));
                    }
                },
            }
        }
    }

    /// One `tools/call` to its end (SEP-2322): an `input_required` result is answered and
    /// the call sent again as a new request (a new id), the server's `requestState` echoed
    /// unchanged, the answers keyed as the server keyed its questions, and nothing carried
    /// over to any other call. A round that only carries state (the server asks to be asked
    /// again) waits a little first, as rmcp's own driver does. A round that asks a person
    /// ends the run with NEEDS_ANSWER ([`super::question`]); `answer` (from a person's
    /// approval, [`super::question::resume`]) makes the first request that next round.
    async fn call_rounds(
        &self,
        peer: &Peer<RoleClient>,
        tool: &str,
        arguments: &serde_json::Map<String, Value>,
        answer: Option<&Value>,
    ) -> Result<CallToolResult, Round> {
        let mut params =
            CallToolRequestParams::new(tool.to_string()).with_arguments(arguments.clone());
        if let Some(answer) = answer {
            let responses: InputResponses = serde_json::from_value(answer["responses"].clone())
                .map_err(|e| {
                    Round::Refused(CallError::new(
                        ErrorCode::ExecutionError,
                        format!("the recorded answer cannot be sent: {e}"),
                    ))
                })?;
            params.input_responses = (!responses.is_empty()).then_some(responses);
            params.request_state = answer["request_state"].as_str().map(str::to_string);
        }
        let mut state_only_rounds = 0u32;
        for _ in 0..DEFAULT_MRTR_MAX_ROUNDS {
            // Dropped at the runner's timeout: rmcp then sends notifications/cancelled.
            match peer
                .call_tool_once(params.clone())
                .await
                .map_err(Round::Service)?
            {
                CallToolResponse::Complete(result) => return Ok(result),
                CallToolResponse::InputRequired(asked) => {
                    let InputRequiredResult {
                        input_requests,
                        request_state,
                        ..
                    } = asked;
                    let requests = input_requests.unwrap_or_default();
                    if requests.is_empty() {
                        // rmcp only decodes an `input_required` result that carries one
                        // or the other, so this is a state-only round.
                        let pause = STATE_ONLY_PAUSE * 2u32.pow(state_only_rounds.min(2));
                        tokio::time::sleep(pause).await;
                        state_only_rounds += 1;
                    } else {
                        state_only_rounds = 0;
                    }
                    let (responses, asks) = self.answer(requests)?;
                    if !asks.is_empty() {
                        return Err(Round::Refused(self.asked(asks, request_state, responses)));
                    }
                    params.input_responses = (!responses.is_empty()).then_some(responses);
                    params.request_state = request_state;
                }
                CallToolResponse::Task(_) => {
                    return Err(Round::Refused(CallError::new(
                        ErrorCode::ExecutionError,
                        format!(
                            "MCP server `{}` answered with a task (the tasks extension); vaultd does not follow MCP tasks",
                            self.name()
                        ),
                    )));
                }
                _ => return Err(Round::Service(ServiceError::UnexpectedResponse)),
            }
        }
        Err(Round::Refused(CallError::new(
            ErrorCode::ExecutionError,
            format!(
                "MCP server `{}` still asked for input after {DEFAULT_MRTR_MAX_ROUNDS} rounds; vaultd gave the call up",
                self.name()
            ),
        )))
    }

    /// The NEEDS_ANSWER that holds the call for a person: the questions of this round, its
    /// state and what vaultd answered itself ([`super::question`]).
    fn asked(
        &self,
        asks: Vec<(String, String, Value)>,
        request_state: Option<String>,
        answered: InputResponses,
    ) -> CallError {
        let answered = serde_json::to_value(answered)
            .ok()
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default();
        let question = super::question::question(self.name(), asks, request_state, answered);
        tracing::info!(
            server = self.name(),
            "MCP server asked a question: the call waits for a person's answer in its note"
        );
        CallError::new(ErrorCode::NeedsAnswer, super::question::describe(&question))
            .with_details(question)
    }

    /// The answers to one round's input requests vaultd gives itself, and the questions for
    /// a person (key, message, requested schema): sampling ends the call with a clear error
    /// (vaultd has no model), a request for the roots gets none.
    #[allow(clippy::type_complexity)]
    fn answer(
        &self,
        requests: rmcp::model::InputRequests,
    ) -> Result<(InputResponses, Vec<(String, String, Value)>), Round> {
        let mut out = InputResponses::new();
        let mut asks = Vec::new();
        for (key, request) in requests {
            let value = match request {
                InputRequest::CreateMessage(_) => {
                    return Err(Round::Refused(sampling_refused(self.name())));
                }
                // Roots are deprecated by the 2026 revision (SEP-2577): none.
                InputRequest::ListRoots(_) => serde_json::json!({ "roots": [] }),
                InputRequest::Elicitation(asked) => {
                    let params = serde_json::to_value(&asked.params).unwrap_or_default();
                    if params["mode"] == "url" {
                        // A link to open is not an answer a note can carry.
                        serde_json::to_value(decline_question(self.name(), &asked.params))
                            .expect("an elicitation result serializes")
                    } else {
                        asks.push((
                            key,
                            params["message"].as_str().unwrap_or("").to_string(),
                            params["requestedSchema"].clone(),
                        ));
                        continue;
                    }
                }
                _ => {
                    return Err(Round::Refused(CallError::new(
                        ErrorCode::ExecutionError,
                        format!(
                            "MCP server `{}` asked for an input vaultd does not know (input request `{key}`)",
                            self.name()
                        ),
                    )));
                }
            };
            out.insert(key, value);
        }
        Ok((out, asks))
    }
}

/// How a call's rounds ended short of a result.
enum Round {
    /// The session failed (handled by [`McpServer::call`]: restart, retry, unknown outcome).
    Service(ServiceError),
    /// vaultd will not go on with this call.
    Refused(CallError),
}

fn sampling_refused(server: &str) -> CallError {
    CallError::new(
        ErrorCode::ExecutionError,
        format!(
            "MCP server `{server}` asked vaultd to sample a language model (sampling/createMessage); vaultd has no model and does not offer sampling"
        ),
    )
}

/// A server's question for a person (elicitation), in a session or in an `input_required`
/// round: declined, and said in the log with the server's message, never silently.
fn decline_question(server: &str, asked: &impl serde::Serialize) -> ElicitResult {
    tracing::warn!(
        server,
        "MCP server asked a question; vaultd declines it (it does not ask a person yet): {}",
        serde_json::to_string(asked).unwrap_or_default()
    );
    ElicitResult::new(ElicitationAction::Decline)
}

/// A live session and, for stdio, the process behind it.
struct Connection {
    service: RunningService<RoleClient, VaultdClient>,
    child: Option<Spawned>,
}

impl Connection {
    /// Closes the session (stdin of a stdio server), then stops the process.
    async fn stop(mut self, server: &str) {
        let _ = self.service.close_with_timeout(EXIT_ON_EOF).await;
        drop(self.service);
        if let Some(child) = self.child.take() {
            stop_child(server, child).await;
        }
    }
}

/// A started stdio server: its supervisor (docs/design.md §10.5) and the write end of the
/// supervisor's control pipe. Closing the pipe (dropping this, or vaultd's own end, even by
/// `kill -9`) makes the supervisor kill the server and every process it started.
struct Spawned {
    control: std::os::fd::OwnedFd,
    child: tokio::process::Child,
}

/// Close stdin (already done by closing the session), give the server a moment, SIGTERM its
/// process group (the supervisor ignores it), then close the control pipe: the supervisor
/// kills the server and every descendant. SIGKILL to the supervisor is the last resort.
async fn stop_child(server: &str, spawned: Spawned) {
    let Spawned { control, mut child } = spawned;
    drop(child.stdin.take());
    if tokio::time::timeout(EXIT_ON_EOF, child.wait())
        .await
        .is_ok()
    {
        return;
    }
    let group = child
        .id()
        .and_then(|id| rustix::process::Pid::from_raw(id as i32));
    if let Some(pg) = group {
        let _ = rustix::process::kill_process_group(pg, rustix::process::Signal::TERM);
    }
    if tokio::time::timeout(TERM_GRACE, child.wait()).await.is_ok() {
        return;
    }
    tracing::warn!(server, "MCP server ignored SIGTERM; killing it");
    drop(control);
    if tokio::time::timeout(TERM_GRACE, child.wait()).await.is_ok() {
        return;
    }
    let _ = child.kill().await;
}

/// What this kernel's sandbox can do, probed once for every server.
fn support() -> &'static Support {
    static SUPPORT: std::sync::OnceLock<Support> = std::sync::OnceLock::new();
    SUPPORT.get_or_init(Support::probe)
}

/// Spawns a stdio server: no shell, a clean environment (only [`INHERITED_ENV`] and the
/// configured secrets), under a supervisor that ends every process it starts, and — unless
/// `sandbox = false` — in the sandbox of docs/design.md §10.7: no capabilities, no new
/// privileges, everything readable but the secrets, only `own` (its folder, with its
/// `TMPDIR`) and `writable` writable, no socket without `network`.
fn spawn_child(
    server: &str,
    program: &str,
    args: &[String],
    env: &[(String, crate::tools::command::config::EnvValue)],
    cwd: &std::path::Path,
    own: &std::path::Path,
    sandbox: &McpSandbox,
) -> Result<Spawned, String> {
    let not_started = |why: String| format!("MCP server `{server}` was not started: {why}");
    let tmp = own.join("tmp");
    // Left by the last run: each start begins with an empty TMPDIR.
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)
        .map_err(|e| not_started(format!("cannot make {}: {e}", tmp.display())))?;
    // The server's argv and environment, made now: the supervisor starts it after the
    // fork, where nothing may be allocated (`supervise::Program`).
    let mut vars: Vec<(std::ffi::OsString, std::ffi::OsString)> = Vec::new();
    for var in INHERITED_ENV {
        if let Some(v) = std::env::var_os(var) {
            vars.push((var.into(), v));
        }
    }
    for (var, value) in env {
        vars.push((var.into(), value.value().into()));
    }
    // Its own, sandboxed or not: a server's temporary files go with its folder.
    vars.push(("TMPDIR".into(), tmp.clone().into()));
    let started = supervise::Program::new(
        std::ffi::OsStr::new(program),
        std::ffi::OsStr::new(program),
        args,
        vars,
    )
    .map_err(|e| format!("cannot run `{program}` for MCP server `{server}`: {e}"))?;
    // std's Command forks the supervisor (stdio, working directory); the server is started
    // by the supervisor from `started`, so argv and environment are set there.
    let mut cmd = std::process::Command::new(program);
    cmd.env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if std::fs::create_dir_all(cwd).is_ok() {
        cmd.current_dir(cwd);
    }
    let confined = match sandbox {
        McpSandbox::Off => None,
        McpSandbox::On(s) => {
            support().allows(s.mode, s.network).map_err(|why| {
                not_started(format!(
                    "{why} (for an MCP server the keys are `sandbox = {{ mode = \"best_effort\" }}`, or `sandbox = false`)"
                ))
            })?;
            Some((s.mode, server_ruleset(s, own).map_err(not_started)?))
        }
    };
    let filter = match sandbox {
        McpSandbox::On(s) => seccomp::filter(s.network).ok(),
        McpSandbox::Off => None,
    };
    let (control_read, control) = supervise::control_pipe()
        .map_err(|e| not_started(format!("cannot make the supervisor's pipe: {e}")))?;
    let control_fd = std::os::fd::AsRawFd::as_raw_fd(&control_read);
    let (mode, mut ruleset) = match confined {
        Some((mode, ruleset)) => (Some(mode), ruleset),
        None => (None, None),
    };
    // An MCP server is not in a call cgroup (it outlives calls).
    let no_cgroup = supervise::CgroupJoin::default();
    // SAFETY: `split` and `enter` make only system calls on memory made before the fork
    // and allocate nothing on their success path (the contract of `pre_exec`, and of
    // `split`'s `enter`; see their docs).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            Err(supervise::split(
                control_fd,
                &no_cgroup,
                &started,
                &mut || match mode {
                    Some(mode) => command_sandbox::enter(
                        &mut ruleset,
                        filter.as_ref(),
                        Limits::for_server(),
                        mode,
                    ),
                    None => Ok(()),
                },
            ))
        });
    }
    let mut cmd = tokio::process::Command::from(cmd);
    // Not killed on drop: closing `control` ends it and everything it started, where a
    // SIGKILL to the supervisor would leave the server's orphans behind.
    cmd.kill_on_drop(false);
    let spawned = cmd.spawn();
    drop(control_read);
    let child = spawned.map_err(|e| {
        if e.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error()) {
            not_started(format!(
                "the sandbox could not be applied ({e}); a required sandbox never runs a server unconfined"
            ))
        } else {
            format!("cannot run `{program}` for MCP server `{server}`: {e}")
        }
    })?;
    Ok(Spawned { control, child })
}

/// The server's ruleset: everything readable but the secrets (the state dir among them),
/// its own folder and `writable` writable. `None` where a best-effort sandbox could not be
/// built (the kernel's Landlock refused); a granted path that cannot be opened without
/// following a symlink is an error whatever the mode.
fn server_ruleset(
    s: &ServerSandbox,
    own: &std::path::Path,
) -> Result<Option<landlock::RulesetCreated>, String> {
    use crate::tools::sandbox::paths;
    use command_sandbox::{Grant, Grants, RulesetBuildError};
    let mut opened = Vec::new();
    for (list, grant, key) in [
        (&s.writable, Grant::Write, "sandbox.writable"),
        (&s.read, Grant::Read, "sandbox.read"),
    ] {
        for p in list {
            opened.push((
                paths::open_absolute(p).map_err(|e| format!("{key}: {e}"))?,
                grant,
            ));
        }
    }
    // Of `/dev` only what programs read (a terminal there would give the server the
    // keystrokes typed in it; a disk, every file when vaultd runs as root); `null`, `zero`
    // and `full` are writable as for every sandboxed program.
    let mut kept_from = s.secrets.clone();
    kept_from.push(std::path::PathBuf::from("/dev"));
    let built = command_sandbox::build(Grants {
        network: s.network,
        read_paths: command_sandbox::READABLE_DEVICES
            .iter()
            .map(std::path::PathBuf::from)
            .collect(),
        write_paths: vec![own.to_path_buf()],
        opened,
        read_each: paths::everything_but(&kept_from),
    });
    match built {
        Ok(r) => Ok(Some(r)),
        Err(RulesetBuildError::Landlock(e)) if s.mode == SandboxMode::BestEffort => {
            tracing::warn!("MCP server runs without Landlock: {e}");
            Ok(None)
        }
        Err(RulesetBuildError::Landlock(e) | RulesetBuildError::Path(e)) => {
            Err(format!("the sandbox could not be built: {e}"))
        }
    }
}

/// The client side of the session: reacts to `notifications/tools/list_changed`.
#[derive(Clone)]
struct VaultdClient {
    server: Weak<McpServer>,
    /// Declares form elicitation: a question comes in an `input_required` round and is put
    /// to a person in the note ([`super::question`]). Not declared to a server reached with
    /// `initialize` (2025-era): it would ask within its session, where a call cannot wait
    /// for a person.
    asks_in_rounds: bool,
}

impl ClientHandler for VaultdClient {
    /// vaultd announces itself by name and version; `initialize` (the fallback) asks for
    /// 2025-11-25, discovery for the versions of [`lifecycle`].
    fn get_info(&self) -> ClientConfig {
        let capabilities: ClientCapabilities = if self.asks_in_rounds {
            serde_json::from_value(serde_json::json!({
                "elicitation": { "form": { "schemaValidation": true } }
            }))
            .expect("a form elicitation capability")
        } else {
            ClientCapabilities::default()
        };
        ClientConfig::new(
            capabilities,
            Implementation::new("vaultd", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    // Sampling is deprecated by the 2026 revision (SEP-2577); older servers may still ask.
    #[allow(deprecated)]
    async fn create_message(
        &self,
        _params: rmcp::model::CreateMessageRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        let server = self.server.upgrade();
        let name = server.as_ref().map_or("?", |s| s.name());
        Err(rmcp::ErrorData::invalid_request(
            sampling_refused(name).message,
            None,
        ))
    }

    /// A question within the session (2025-era `elicitation/create`): the call it belongs
    /// to cannot wait for a person here, so it is refused with an error that says so (the
    /// server's tool then fails visibly, never "ok" with a silent decline), and logged.
    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        let server = self.server.upgrade();
        let name = server.as_ref().map_or("?", |s| s.name());
        tracing::warn!(
            server = name,
            "MCP server asked a question within its session; refused (vaultd holds questions asked in input_required rounds, MCP 2026-07-28): {}",
            serde_json::to_string(&request).unwrap_or_default()
        );
        Err(rmcp::ErrorData::invalid_request(
            format!(
                "vaultd puts a server's questions to a person only when they come in an input_required result (MCP 2026-07-28); `{name}` asked within its session (elicitation/create), where the call cannot wait for a person's answer"
            ),
            None,
        ))
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        let Some(server) = self.server.upgrade() else {
            return;
        };
        tracing::info!(
            server = server.name(),
            "MCP server says its tools changed; listing again"
        );
        let peer = context.peer.clone();
        // Not awaited here: the listing's responses arrive through this same session.
        tokio::spawn(async move {
            if let Err(e) = server.relist(&peer).await {
                tracing::error!(server = server.name(), "{e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::mcp::config::{RawServer, from_raw};
    use std::collections::BTreeMap;

    fn server(journal: Arc<Journal>) -> Arc<McpServer> {
        let raw: BTreeMap<String, toml::Spanned<RawServer>> =
            toml::from_str("[files]\ncommand = [\"srv\"]\nallow = [\"a\"]\n").unwrap();
        let base = std::path::Path::new("/nonexistent");
        let cx = crate::config::table::TableContext {
            path: &base.join("t.toml"),
            base,
            vault: &base.join("vault"),
            folders: &Default::default(),
            state_dir: &base.join("state"),
            skip_secrets: false,
        };
        let config = from_raw(raw, &cx).unwrap().remove(0);
        McpServer::new(config, journal, reqwest::Client::new(), "/".into())
    }

    fn def(text: &str) -> ListedTool {
        pin::listed(
            "a",
            &serde_json::json!({ "name": "a", "description": text }),
        )
    }

    #[test]
    fn accepted_pins_are_cached_and_others_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Arc::new(Journal::open(dir.path()).unwrap());
        journal
            .record_mcp_listing("files", &[def("v1")], &[])
            .unwrap();
        // The definition changed since it was accepted.
        let states = journal
            .record_mcp_listing("files", &[def("v2")], &[])
            .unwrap();
        assert!(matches!(states[0], PinState::Changed { .. }));
        let srv = server(journal.clone());
        assert!(matches!(
            srv.pin_state("a"),
            Some(Ok(PinState::Changed { .. }))
        ));

        // `vaultd tools accept` in another process: the next call sees it.
        let cli = Journal::open(dir.path()).unwrap();
        assert!(cli.accept_mcp_tool("files", "a").unwrap());
        assert_eq!(srv.pin_state("a"), Some(Ok(PinState::Accepted)));

        // From now on from memory: a pin changed behind the daemon's back (which only its own
        // listing does) is not read again...
        cli.record_mcp_listing("files", &[def("v3")], &[]).unwrap();
        cli.accept_mcp_tool("files", "a").unwrap();
        assert_eq!(srv.pin_state("a"), Some(Ok(PinState::Accepted)));
        // ...until a listing of this daemon says what is accepted now.
        srv.remember_accepted(
            &[def("v2")],
            &[PinState::Changed {
                accepted_definition: def("v3").definition,
            }],
        );
        assert!(matches!(
            srv.pin_state("a"),
            Some(Ok(PinState::Changed { .. }))
        ));
    }
}
