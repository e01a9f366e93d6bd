//! OAuth 2.1 for streamable-HTTP MCP servers (docs/design.md §10.4, "OAuth").
//!
//! `vaultd mcp login NAME` runs the authorization-code flow with PKCE once, the way the MCP
//! authorization spec lays it out (rmcp's `auth` does the protocol): the server's 401
//! challenge and protected-resource metadata lead to its authorization server; the client is
//! the one configured in `[mcp.NAME.oauth]` (`client_id`, optional `client_secret`), else a
//! client ID metadata document (`client_metadata_url`) where the server takes one, else one
//! registered dynamically; the person approves in a browser, which comes back to a one-shot
//! listener on 127.0.0.1. The tokens are kept in [`TokenFile`] (`<state_dir>/oauth/NAME.json`,
//! 0600, bound to the server's URL), and from then on the daemon sends them and refreshes
//! them as they expire ([`authorized`]). A daemon has no one at a browser: when a server
//! refuses the tokens for good (revoked, refresh rejected, more scope wanted), the call fails
//! saying to run `vaultd mcp login NAME` again.

use crate::private;
use crate::secret::{Redactor, Secret};
use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationRequest, AuthorizationSession,
    CredentialRefreshGuard, CredentialStore, OAuthClientConfig, StoredCredentials,
};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Makes the token file's temp names unique among this process's writers (the pid makes
/// them unique among processes: a daemon refreshing while `vaultd mcp login` saves).
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// How long `vaultd mcp login` waits for the browser to come back.
pub const LOGIN_WAIT: Duration = Duration::from_secs(300);

/// `[mcp.NAME.oauth]`, validated: how vaultd identifies itself to the authorization server.
#[derive(Debug, Clone, Default)]
pub struct OAuthClient {
    /// A client registered with the authorization server beforehand (no registration then).
    pub client_id: Option<String>,
    /// Its secret, for a confidential client (a secret reference).
    pub client_secret: Option<Secret>,
    /// Scopes to ask for; empty: what the server's challenge or metadata names.
    pub scopes: Vec<String>,
    /// An HTTPS client ID metadata document, used where the server accepts one.
    pub client_metadata_url: Option<String>,
}

/// `[mcp.NAME.oauth]` exactly as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOAuth {
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    pub client_metadata_url: Option<String>,
}

/// What the token file holds: the tokens, the URL they were given for, the redirect used.
#[derive(Serialize, Deserialize)]
struct Kept {
    url: String,
    redirect_uri: String,
    credentials: StoredCredentials,
}

/// The tokens of one server, in `<state_dir>/oauth/NAME.json` (0600, replaced atomically).
/// Tokens kept for another URL (the config's `url` changed) are not sent. Every writer —
/// the daemon's refresh, `vaultd mcp login` — holds `oauth/NAME.lock` (an `flock`) from
/// reading the tokens it replaces to saving the new ones, so one never saves over the
/// other's newer tokens.
#[derive(Debug, Clone)]
pub struct TokenFile {
    path: PathBuf,
    url: String,
    /// The redirect URI of the login in progress (saved with the tokens).
    redirect_uri: String,
    /// The daemon's redactor: every token saved (a refresh's new ones) is taught to it
    /// before it is used, so a server that quotes it back puts it in no note or log.
    learns: Option<Arc<Redactor>>,
}

impl TokenFile {
    pub fn new(state_dir: &Path, server: &str, url: &str) -> TokenFile {
        TokenFile {
            path: state_dir.join("oauth").join(format!("{server}.json")),
            url: url.to_string(),
            redirect_uri: String::new(),
            learns: None,
        }
    }

    /// This token file, teaching `redactor` every token it saves.
    pub fn learning(mut self, redactor: Arc<Redactor>) -> TokenFile {
        self.learns = Some(redactor);
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The token file's size and mtime now (`None`: no file): a login since a moment shows as
    /// a change of it.
    pub fn stamp(&self) -> Option<(u64, std::time::SystemTime)> {
        let meta = std::fs::metadata(&self.path).ok()?;
        Some((meta.len(), meta.modified().ok()?))
    }

    /// Takes `oauth/NAME.lock` (waiting while another writer holds it): held from reading the
    /// tokens a writer replaces to saving the new ones; released when dropped.
    async fn lock(&self) -> Result<std::fs::File, String> {
        let dir = self
            .path
            .parent()
            .expect("oauth/ has a parent")
            .to_path_buf();
        let lock = self.path.with_extension("lock");
        tokio::task::spawn_blocking(move || {
            private::create_dir(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let file = private::open_file(&lock)
                .map_err(|e| format!("cannot open {}: {e}", lock.display()))?;
            rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
                .map_err(|e| format!("cannot lock {}: {e}", lock.display()))?;
            Ok(file)
        })
        .await
        .map_err(|e| format!("the token file's lock task failed: {e}"))?
    }

    fn read(&self) -> Result<Option<Kept>, String> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", self.path.display())),
        };
        let kept: Kept = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} is not a token file vaultd wrote: {e}",
                self.path.display()
            )
        })?;
        Ok((kept.url == self.url).then_some(kept))
    }

    /// Whether tokens for this server's URL are kept (a login happened).
    pub fn logged_in(&self) -> bool {
        self.read()
            .is_ok_and(|k| k.is_some_and(|k| k.credentials.token_response.is_some()))
    }

    /// The kept tokens as secrets, for the redactor: a server that quotes one back in an
    /// error does not put it in a note or a log.
    pub fn secrets(&self) -> Vec<Secret> {
        let Ok(Some(kept)) = self.read() else {
            return Vec::new();
        };
        self.secrets_of(&kept.credentials)
    }

    fn secrets_of(&self, credentials: &StoredCredentials) -> Vec<Secret> {
        let token = serde_json::to_value(&credentials.token_response).unwrap_or_default();
        ["access_token", "refresh_token"]
            .iter()
            .filter_map(|k| token[*k].as_str())
            .map(|v| Secret::literal(&format!("oauth:{}", self.path.display()), v))
            .collect()
    }

    /// What `vaultd status` shows: never a token.
    pub fn describe(&self) -> serde_json::Value {
        match self.read() {
            Ok(Some(kept)) if kept.credentials.token_response.is_some() => {
                // The token response as its wire fields (`expires_in`, `refresh_token`).
                let token =
                    serde_json::to_value(&kept.credentials.token_response).unwrap_or_default();
                let expires_at = kept
                    .credentials
                    .token_received_at
                    .zip(token["expires_in"].as_u64())
                    .map(|(at, d)| at + d);
                serde_json::json!({
                    "logged_in": true,
                    "scopes": kept.credentials.granted_scopes,
                    "expires_at": expires_at,
                    "refreshable": token["refresh_token"].is_string(),
                    "issuer": kept.credentials.issuer,
                })
            }
            Ok(_) => serde_json::json!({ "logged_in": false }),
            Err(e) => serde_json::json!({ "logged_in": false, "error": e }),
        }
    }

    fn write(&self, kept: &Kept) -> Result<(), String> {
        let dir = self.path.parent().expect("oauth/ has a parent");
        private::create_dir(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        // Unique: two writers never share (or remove) each other's temp file.
        let tmp = dir.join(format!(
            ".{}.{}-{}.tmp",
            self.path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("tokens"),
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed),
        ));
        let write = || -> std::io::Result<()> {
            let mut f = private::create_new_file(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(kept).map_err(std::io::Error::other)?)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot write {}: {e}", self.path.display())
        })
    }

    /// Forgets the tokens (`vaultd mcp logout`): whether there were any.
    pub fn remove(&self) -> Result<bool, String> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(format!("cannot remove {}: {e}", self.path.display())),
        }
    }
}

fn store_error(e: String) -> AuthError {
    AuthError::CredentialStoreError(e)
}

#[async_trait::async_trait]
impl CredentialStore for TokenFile {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        Ok(self.read().map_err(store_error)?.map(|k| k.credentials))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        // A refresh keeps the redirect of the login; a login brings its own.
        let redirect_uri = match self.read() {
            Ok(Some(kept)) if self.redirect_uri.is_empty() => kept.redirect_uri,
            _ => self.redirect_uri.clone(),
        };
        if let Some(redactor) = &self.learns {
            redactor.learn(&Redactor::new(&self.secrets_of(&credentials), &[]));
        }
        self.write(&Kept {
            url: self.url.clone(),
            redirect_uri,
            credentials,
        })
        .map_err(store_error)
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.remove().map(drop).map_err(store_error)
    }

    /// A refresh holds the file's lock from loading the tokens to saving their successors.
    async fn acquire_refresh_guard(&self) -> Result<Option<CredentialRefreshGuard>, AuthError> {
        let file = self.lock().await.map_err(store_error)?;
        Ok(Some(CredentialRefreshGuard::new(file)))
    }
}

/// The manager the daemon's HTTP transport sends and refreshes the kept tokens with. The
/// authorization server is found as the login finds it, from the server's 401 challenge
/// (not by a discovery without it, which could find another server than the login did, or
/// fall back to endpoints at the MCP server's own address and refresh there); a server that
/// moved to another authorization server is noticed here, and its tokens are not sent.
pub async fn authorized(
    url: &str,
    tokens: TokenFile,
    client: &OAuthClient,
    http: &reqwest::Client,
) -> Result<AuthorizationManager, AuthError> {
    let redirect_uri = tokens
        .read()
        .ok()
        .flatten()
        .map(|k| k.redirect_uri)
        .unwrap_or_default();
    let mut manager = AuthorizationManager::new(url).await?;
    let challenge = challenge(url, http)
        .await
        .map_err(AuthError::InternalError)?;
    let resolution = manager
        .resolve_metadata_from_challenge(challenge.as_deref())
        .await?;
    manager.set_metadata(resolution.metadata);
    manager.set_credential_store(tokens);
    if !manager.initialize_from_store().await? {
        return Err(AuthError::AuthorizationRequired);
    }
    // A confidential client refreshes with its secret.
    if let (Some(id), Some(secret)) = (&client.client_id, &client.client_secret) {
        manager.configure_client(
            OAuthClientConfig::new(id.clone(), redirect_uri)
                .with_client_secret(secret.expose().to_string())
                .with_scopes(client.scopes.clone()),
        )?;
    }
    Ok(manager)
}

/// What a login granted.
#[derive(Debug)]
pub struct LoggedIn {
    pub scopes: Vec<String>,
    pub path: PathBuf,
}

/// `vaultd mcp login`: asks the server (its 401 challenge leads to the authorization server),
/// registers or names the client, sends the person to `open(url)`, waits up to `wait` for the
/// browser to come back to 127.0.0.1 (or, with `pasted`, for the address it ended on, pasted
/// on stdin: a browser on another machine cannot reach this one's loopback), and keeps the
/// tokens.
pub async fn login(
    url: &str,
    mut tokens: TokenFile,
    client: &OAuthClient,
    http: &reqwest::Client,
    open: impl FnOnce(&str),
    wait: Duration,
    pasted: bool,
) -> Result<LoggedIn, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("cannot listen on 127.0.0.1 for the browser's return: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");
    tokens.redirect_uri = redirect_uri.clone();
    let path = tokens.path.clone();
    let lock = tokens.clone();
    let before = match tokens.read() {
        Ok(Some(kept)) => kept.credentials.granted_scopes,
        _ => Vec::new(),
    };

    let challenge = challenge(url, http).await?;
    let mut manager = AuthorizationManager::new(url)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    manager.set_credential_store(tokens);
    let resolution = manager
        .resolve_metadata_from_challenge(challenge.as_deref())
        .await
        .map_err(|e| format!("cannot find the server's authorization server: {e}"))?;
    manager.set_metadata(resolution.metadata);
    let mut request = AuthorizationRequest::new(&redirect_uri).with_client_name("vaultd");
    if !client.scopes.is_empty() {
        // Asking for more keeps what was granted before (SEP-2350: the union).
        let mut scopes = before;
        for s in &client.scopes {
            if !scopes.contains(s) {
                scopes.push(s.clone());
            }
        }
        request = request.with_scopes(scopes);
    }
    if let Some(id) = &client.client_id {
        request = request.with_preregistered_client(id);
    }
    if let Some(secret) = &client.client_secret {
        request = request.with_client_secret(secret.expose());
    }
    if let Some(doc) = &client.client_metadata_url {
        request = request.with_client_metadata_url(doc);
    }
    let session = AuthorizationSession::new(manager, request)
        .await
        .map_err(|(_, e)| format!("cannot start the authorization: {e}"))?;
    let state = query_param(session.get_authorization_url(), "state");
    open(session.get_authorization_url());
    let back = async {
        if !pasted {
            return callback(listener, state.as_deref()).await;
        }
        eprintln!(
            "When the browser ends on an address that does not load (another machine), paste that address here and press Enter:"
        );
        let line = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map(|_| line)
        });
        tokio::select! {
            back = callback(listener, state.as_deref()) => back,
            line = line => match line {
                Ok(Ok(line)) if line.contains("code=") => Ok(line.trim().to_string()),
                Ok(Ok(_)) => Err("the pasted address has no `code=`: paste the whole address the browser ended on".to_string()),
                _ => Err("cannot read the pasted address".to_string()),
            },
        }
    };
    let back = tokio::time::timeout(wait, back).await.map_err(|_| {
        format!(
            "the browser did not come back within {}: run the login again",
            humantime::format_duration(wait)
        )
    })??;
    // The code is exchanged and the tokens saved under the file's lock: a daemon's refresh
    // in flight then saves first, and the login's tokens replace its (not the other way).
    let _lock = lock.lock().await?;
    session
        .handle_callback_url(&back)
        .await
        .map_err(|e| format!("the authorization server's answer was refused: {e}"))?;
    let scopes = session.auth_manager.get_current_scopes().await;
    Ok(LoggedIn { scopes, path })
}

/// The server's `WWW-Authenticate` challenge to an unauthenticated MCP request, if it makes
/// one (its `resource_metadata` and `scope` lead the discovery). Some servers let
/// `initialize` through and challenge the first real request: `tools/list` is tried next.
async fn challenge(url: &str, http: &reqwest::Client) -> Result<Option<String>, String> {
    let initialize = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "vaultd", "version": env!("CARGO_PKG_VERSION")},
        },
    });
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    for probe in [initialize, list] {
        let answer = http
            .post(url)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2025-11-25")
            .json(&probe)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| format!("cannot reach {url}: {e}"))?;
        if let Some(challenge) = answer
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
        {
            return Ok(Some(challenge.to_string()));
        }
    }
    Ok(None)
}

/// Why a request was refused for want of authorization (a 401, or a 403 asking for more
/// scope), found anywhere in `e`'s chain of causes: what to tell the person.
pub fn refusal(server: &str, e: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rmcp::transport::streamable_http_client::{AuthRequiredError, InsufficientScopeError};
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(s) = c.downcast_ref::<InsufficientScopeError>() {
            return Some(match s.get_required_scope() {
                Some(scope) => format!(
                    "the server wants the OAuth scope `{scope}`, which the login did not grant: run `vaultd mcp login {server} {}` (the scopes granted before are kept)",
                    scope_flags(scope)
                ),
                None => format!(
                    "the server wants more OAuth scope than the login granted: run `vaultd mcp login {server} --scope SCOPE`"
                ),
            });
        }
        if c.downcast_ref::<AuthRequiredError>().is_some() {
            return Some(format!(
                "the server asks for an OAuth login (or refused the kept tokens): run `vaultd mcp login {server}`"
            ));
        }
        cause = c.source();
    }
    None
}

/// `--scope` once per scope of a challenge's space-separated `scope` (`"repo read:org"`):
/// what `vaultd mcp login` takes.
fn scope_flags(scope: &str) -> String {
    scope
        .split_whitespace()
        .map(|s| format!("--scope {s}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The value of `name` in `url`'s query, if it has one.
fn query_param(url: &str, name: &str) -> Option<String> {
    let url = reqwest::Url::parse(url).ok()?;
    url.query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// Serves the loopback redirect until the browser comes back to `/callback` carrying this
/// login's `state`; the full URL it came back to. Another local process's request to
/// `/callback` (without the state) is answered 400 and does not end the wait.
async fn callback(
    listener: tokio::net::TcpListener,
    state: Option<&str>,
) -> Result<String, String> {
    let state = state.map(str::to_string);
    use http_body_util::Full;
    use hyper::body::Bytes;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1);
    loop {
        tokio::select! {
            back = rx.recv() => return back.ok_or_else(|| "the redirect listener stopped".to_string()),
            accepted = listener.accept() => {
                let (stream, _) = accepted.map_err(|e| format!("the redirect listener failed: {e}"))?;
                let (tx, state) = (tx.clone(), state.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (tx, state) = (tx.clone(), state.clone());
                        async move {
                            let url = format!(
                                "http://127.0.0.1:{port}{}",
                                req.uri().path_and_query().map_or("", |p| p.as_str())
                            );
                            let ours = state.is_none_or(|s| query_param(&url, "state").as_deref() == Some(s.as_str()));
                            let (status, text) = if req.uri().path() != "/callback" {
                                (404, "not found")
                            } else if !ours {
                                (400, "vaultd: not the return of this login.")
                            } else {
                                let _ = tx.send(url).await;
                                (200, "vaultd: the authorization is back. You can close this tab.")
                            };
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(status)
                                    .header("Content-Type", "text/plain; charset=utf-8")
                                    .body(Full::new(Bytes::from_static(text.as_bytes())))
                                    .expect("a static response"),
                            )
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        }
    }
}

/// Sends the person to `url`: `$BROWSER` (its first entry; `%s` stands for the URL, else the
/// URL is its last argument), else `xdg-open`; the URL is printed either way.
pub fn open_browser(url: &str) {
    eprintln!("Open this address in a browser to log in:\n\n  {url}\n");
    let command: Vec<String> = match std::env::var("BROWSER") {
        Ok(b) if !b.trim().is_empty() => {
            let first = b.split(':').next().unwrap_or_default();
            let mut argv: Vec<String> = first.split_whitespace().map(str::to_string).collect();
            if argv.iter().any(|a| a.contains("%s")) {
                argv = argv.into_iter().map(|a| a.replace("%s", url)).collect();
            } else {
                argv.push(url.to_string());
            }
            argv
        }
        _ => vec!["xdg-open".to_string(), url.to_string()],
    };
    let Some((program, args)) = command.split_first() else {
        return;
    };
    match std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
    {
        Ok(_) => eprintln!("(opened with {program}; waiting for the browser to come back)"),
        Err(_) => eprintln!("(open it by hand; waiting for the browser to come back)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use wiremock::matchers::{body_string_contains, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    /// Tokens as a login leaves them, received `age` seconds ago, valid for an hour.
    fn kept(url: &str, age: u64) -> String {
        serde_json::json!({
            "url": url,
            "redirect_uri": "http://127.0.0.1:9/callback",
            "credentials": {
                "client_id": "vaultd-test",
                "token_response": {
                    "access_token": "old-access", "token_type": "bearer",
                    "expires_in": 3600, "refresh_token": "old-refresh",
                },
                "granted_scopes": ["mcp:basic"],
                "token_received_at": now() - age,
            },
        })
        .to_string()
    }

    /// An authorization server at `{base}{prefix}` on the mock: its metadata at
    /// `metadata_path`, and a token endpoint that refreshes `old-refresh` once.
    async fn mount_authorization_server(server: &MockServer, prefix: &str, metadata_path: &str) {
        let issuer = format!("{}{prefix}", server.uri());
        Mock::given(method("GET"))
            .and(path(metadata_path))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "issuer": issuer,
                "authorization_endpoint": format!("{issuer}/authorize"),
                "token_endpoint": format!("{issuer}/token"),
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": ["S256"],
            })))
            .mount(server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("{prefix}/token")))
            .and(body_string_contains("grant_type=refresh_token"))
            .and(body_string_contains("refresh_token=old-refresh"))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "access_token": "new-access", "token_type": "Bearer",
                "expires_in": 3600, "refresh_token": "new-refresh",
            })))
            .expect(1)
            .mount(server)
            .await;
    }

    /// The token file of server `s` for `url`, holding tokens received two hours ago.
    fn expired_tokens(state: &Path, url: &str) -> TokenFile {
        let tokens = TokenFile::new(state, "s", url);
        std::fs::create_dir_all(tokens.path().parent().unwrap()).unwrap();
        std::fs::write(tokens.path(), kept(url, 7200)).unwrap();
        tokens
    }

    /// A real authorization server on 127.0.0.1 (its metadata and token endpoint): an expired
    /// access token is refreshed with the refresh token, and the new tokens land in the file,
    /// still private.
    #[tokio::test]
    async fn an_expired_token_is_refreshed_and_kept() {
        let server = MockServer::start().await;
        let base = server.uri();
        let url = format!("{base}/mcp");
        Mock::given(method("GET"))
            .and(path("/.well-known/oauth-protected-resource/mcp"))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "resource": url, "authorization_servers": [base],
            })))
            .mount(&server)
            .await;
        mount_authorization_server(&server, "", "/.well-known/oauth-authorization-server").await;

        let state = tempfile::tempdir().unwrap();
        let tokens = expired_tokens(state.path(), &url);
        assert!(tokens.logged_in());
        // The daemon's redactor, as built at start: it knows the tokens then kept.
        let redactor = Arc::new(Redactor::new(&tokens.secrets(), &[]));
        let learning = tokens.clone().learning(redactor.clone());
        let manager = authorized(
            &url,
            learning,
            &OAuthClient::default(),
            &reqwest::Client::new(),
        )
        .await
        .unwrap();
        assert_eq!(manager.get_access_token().await.unwrap(), "new-access");
        assert_eq!(
            redactor.redact("server said: new-access / new-refresh / old-refresh"),
            "server said: [redacted] / [redacted] / [redacted]",
            "the refreshed tokens are redacted too"
        );

        let text = std::fs::read_to_string(tokens.path()).unwrap();
        assert!(
            text.contains("new-refresh") && !text.contains("old-access"),
            "{text}"
        );
        assert!(
            text.contains("http://127.0.0.1:9/callback"),
            "the redirect is kept: {text}"
        );
        let mode = std::fs::metadata(tokens.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // What status shows names no token.
        let shown = tokens.describe().to_string();
        assert!(
            !shown.contains("new-access") && !shown.contains("new-refresh"),
            "{shown}"
        );
        assert_eq!(tokens.describe()["logged_in"], true);
    }

    /// The daemon finds the authorization server as the login does, through the server's
    /// 401 challenge: here the protected-resource metadata is only named by the challenge
    /// (nothing at the well-known address), and the authorization server is not the MCP
    /// server's origin. A discovery without the challenge fell back to `<origin>/token` and
    /// sent the refresh token there.
    #[tokio::test]
    async fn a_refresh_goes_to_the_authorization_server_the_challenge_names() {
        let server = MockServer::start().await;
        let base = server.uri();
        let url = format!("{base}/mcp");
        Mock::given(method("POST"))
            .and(path("/mcp"))
            .respond_with(ResponseTemplate::new(401).insert_header(
                "WWW-Authenticate",
                format!("Bearer resource_metadata=\"{base}/meta/prm\"").as_str(),
            ))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/meta/prm"))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "resource": url, "authorization_servers": [format!("{base}/as")],
            })))
            .mount(&server)
            .await;
        mount_authorization_server(&server, "/as", "/.well-known/oauth-authorization-server/as")
            .await;
        Mock::given(method("POST"))
            .and(path("/token"))
            .respond_with(ResponseTemplate::new(400))
            .expect(0)
            .mount(&server)
            .await;
        let state = tempfile::tempdir().unwrap();
        let tokens = expired_tokens(state.path(), &url);
        let manager = authorized(
            &url,
            tokens.clone(),
            &OAuthClient::default(),
            &reqwest::Client::new(),
        )
        .await
        .unwrap();
        assert_eq!(manager.get_access_token().await.unwrap(), "new-access");
    }

    /// Two writers at once (the daemon's refresh, `vaultd mcp login`): each save lands
    /// whole. With one fixed temp name, one writer removed or renamed the other's file
    /// half-written, and its own rename then failed.
    #[test]
    fn writers_at_once_never_share_a_temp_file() {
        let state = tempfile::tempdir().unwrap();
        let url = "https://example.org/mcp";
        let tokens = TokenFile::new(state.path(), "s", url);
        let kept: Kept = serde_json::from_str(&kept(url, 0)).unwrap();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        tokens.write(&kept).unwrap();
                    }
                });
            }
        });
        assert!(tokens.logged_in());
        let left: Vec<_> = std::fs::read_dir(tokens.path().parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, vec!["s.json".to_string()], "no temp file left");
    }

    /// A refresh holds the token file's lock (`oauth/NAME.lock`) until its guard is dropped:
    /// a second writer (another process's refresh, a login) waits for it.
    #[tokio::test]
    async fn a_refresh_holds_the_token_files_lock() {
        let state = tempfile::tempdir().unwrap();
        let tokens = TokenFile::new(state.path(), "s", "https://example.org/mcp");
        let first = tokens.acquire_refresh_guard().await.unwrap();
        let second = tokio::time::timeout(Duration::from_millis(300), tokens.lock()).await;
        assert!(second.is_err(), "the lock was taken twice");
        drop(first);
        tokio::time::timeout(Duration::from_secs(10), tokens.lock())
            .await
            .expect("the lock is free once the guard is dropped")
            .unwrap();
    }

    /// Only the browser's return with this login's `state` ends the wait: another local
    /// process's request to `/callback` is answered 400 and the login goes on.
    #[tokio::test]
    async fn the_redirect_listener_waits_for_this_logins_state() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let waiting = tokio::spawn(callback(listener, Some("s-123")));
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}/callback");
        let stray = http
            .get(format!("{base}?code=forged&state=other"))
            .send()
            .await
            .unwrap();
        assert_eq!(stray.status(), 400);
        assert!(!waiting.is_finished(), "a stray request ended the login");
        let ours = http
            .get(format!("{base}?code=c-1&state=s-123"))
            .send()
            .await
            .unwrap();
        assert_eq!(ours.status(), 200);
        let back = waiting.await.unwrap().unwrap();
        assert!(
            back.contains("code=c-1") && back.contains("state=s-123"),
            "{back}"
        );
    }

    #[test]
    fn a_step_up_for_several_scopes_names_each_with_its_own_flag() {
        assert_eq!(scope_flags("repo"), "--scope repo");
        assert_eq!(
            scope_flags("repo  read:org"),
            "--scope repo --scope read:org"
        );
    }

    #[test]
    fn tokens_kept_for_another_url_are_not_used_and_logout_forgets() {
        let state = tempfile::tempdir().unwrap();
        let old = TokenFile::new(state.path(), "s", "https://old.example/mcp");
        std::fs::create_dir_all(old.path().parent().unwrap()).unwrap();
        std::fs::write(old.path(), kept("https://old.example/mcp", 0)).unwrap();
        assert!(old.logged_in());
        let redactor = crate::secret::Redactor::new(&old.secrets(), &[]);
        assert_eq!(
            redactor.redact("server said: bad token old-access / old-refresh"),
            "server said: bad token [redacted] / [redacted]"
        );
        let moved = TokenFile::new(state.path(), "s", "https://new.example/mcp");
        assert!(!moved.logged_in(), "the URL changed: log in again");
        assert_eq!(moved.remove(), Ok(true));
        assert_eq!(old.remove(), Ok(false));
        assert!(!old.logged_in());
    }
}
