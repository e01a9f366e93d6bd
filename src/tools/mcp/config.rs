//! The `[mcp.NAME]` tables: read with serde (unknown keys are errors), then validated once
//! into [`McpServerConfig`] with every secret reference resolved. Every error names the file,
//! line and key: the values a check can refuse are read as `toml::Spanned`.

use crate::config::table::{ConfigError, RateLimit, RawRateLimit, TableContext};
use crate::secret::Secret;
use crate::tools::command::config::{EnvValue, SandboxMode};
use crate::tools::sandbox::protect::Protected;
use crate::tools::{ApprovalRule, Effect};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

/// Default per-call timeout of an MCP tool.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long start-up waits for a server's first tool listing (docs/design.md §10.4).
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(10);

/// One `[mcp.NAME]` table exactly as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub enabled: Option<bool>,
    /// stdio: the program and its arguments, run without a shell.
    pub command: Option<Spanned<Vec<String>>>,
    /// Streamable HTTP endpoint.
    pub url: Option<Spanned<String>>,
    /// Environment of a stdio server: name -> plain text, or a secret reference (`env:`,
    /// `file:`, `credential:`) that is redacted wherever it appears.
    pub env: Option<Spanned<BTreeMap<String, String>>>,
    /// HTTP headers of a `url` server: name -> secret reference.
    pub headers: Option<Spanned<BTreeMap<String, String>>>,
    /// How a `url` server's OAuth login identifies vaultd (`vaultd mcp login`).
    pub oauth: Option<Spanned<super::oauth::RawOAuth>>,
    /// Tool names that may be called; `["*"]` allows all. Empty (the default) allows none.
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub start_timeout: Option<Duration>,
    /// Working directory of a stdio server (default: the state directory's `mcp/NAME`).
    pub cwd: Option<Spanned<String>>,
    /// `false`, or a [`RawSandbox`] table.
    pub sandbox: Option<Spanned<RawSandboxSetting>>,
    #[serde(default)]
    pub tools: BTreeMap<String, Spanned<RawToolPolicy>>,
}

/// `[mcp.NAME] sandbox = { read = [...], writable = [...], network = false }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSandbox {
    #[serde(default)]
    pub read: Vec<String>,
    #[serde(default)]
    pub writable: Vec<String>,
    #[serde(default)]
    pub network: bool,
    pub mode: Option<SandboxMode>,
}

/// `sandbox` as written: `false` (unconfined), `true` (the default) or a [`RawSandbox`] table.
#[derive(Debug)]
pub enum RawSandboxSetting {
    Off,
    On(RawSandbox),
}

/// Two shapes, one key: a bool or a table, and anything else is an error that shows both.
impl<'de> Deserialize<'de> for RawSandboxSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Shapes;
        impl<'de> serde::de::Visitor<'de> for Shapes {
            type Value = RawSandboxSetting;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "`false` or a table such as { writable = [\"~/Notes/Projects\"], network = false }",
                )
            }

            fn visit_bool<E>(self, on: bool) -> Result<RawSandboxSetting, E> {
                Ok(if on {
                    RawSandboxSetting::On(RawSandbox::default())
                } else {
                    RawSandboxSetting::Off
                })
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RawSandboxSetting, A::Error> {
                RawSandbox::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawSandboxSetting::On)
            }
        }
        d.deserialize_any(Shapes)
    }
}

/// How a stdio server is confined (docs/design.md §10.7).
#[derive(Debug, Clone)]
pub enum McpSandbox {
    /// `sandbox = false`: unconfined, as the person chose; `vaultd tools` says so.
    Off,
    On(ServerSandbox),
}

/// The sandbox of one stdio server, held for the server's life: every file readable but
/// the secrets, nothing writable but its own folder and `writable`, no network unless set.
#[derive(Debug, Clone)]
pub struct ServerSandbox {
    /// Extra readable paths inside what is otherwise never granted (rarely needed: the
    /// rest of the file system is readable already).
    pub read: Vec<PathBuf>,
    /// Absolute folders or files the server may write (its root, its memory file).
    pub writable: Vec<PathBuf>,
    pub network: bool,
    pub mode: SandboxMode,
    /// Never readable: the state dir (but the server's own folder), the config, keys.
    pub secrets: Vec<PathBuf>,
}

impl McpSandbox {
    /// One line for `vaultd tools` and `vaultd config`.
    pub fn describe(&self) -> String {
        match self {
            McpSandbox::Off => "off (sandbox = false): the server runs unconfined".into(),
            McpSandbox::On(s) => {
                let list = |v: &[PathBuf]| {
                    v.iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                format!(
                    "{}; network {}; writable: {}; reads all but the state dir, the config and keys",
                    s.mode.as_str(),
                    if s.network { "on" } else { "off" },
                    if s.writable.is_empty() {
                        "its own folder only".into()
                    } else {
                        list(&s.writable)
                    }
                )
            }
        }
    }
}

/// `[mcp.NAME.tools.TOOL]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawToolPolicy {
    pub effect: Option<Effect>,
    pub approval: Option<ApprovalRule>,
    pub rate_limit: Option<RawRateLimit>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
}

/// How vaultd reaches a server.
#[derive(Debug, Clone)]
pub enum Transport {
    /// A child process speaking newline-delimited JSON-RPC on stdin/stdout.
    Stdio {
        program: String,
        args: Vec<String>,
        /// The child's environment beside [`INHERITED_ENV`]: plain values and secrets.
        env: Vec<(String, EnvValue)>,
        cwd: Option<PathBuf>,
        sandbox: McpSandbox,
    },
    /// Streamable HTTP.
    Http {
        url: String,
        headers: Vec<(String, Secret)>,
        /// The tokens of `vaultd mcp login` (sent when there are any) and the client it uses.
        oauth: Box<(super::oauth::TokenFile, super::oauth::OAuthClient)>,
    },
}

/// Variables a stdio server gets from vaultd's own environment: what a program needs to
/// start (find its interpreter, pick a locale, a home for caches), never a secret.
pub const INHERITED_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// Which of a server's tools may be called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allow {
    All,
    Only(Vec<String>),
}

impl Allow {
    pub fn allows(&self, tool: &str) -> bool {
        match self {
            Allow::All => true,
            Allow::Only(names) => names.iter().any(|n| n == tool),
        }
    }
}

/// The policy of one MCP tool, from its `[mcp.S.tools.T]` table or the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolPolicy {
    pub effect: Effect,
    pub approval: ApprovalRule,
    pub rate_limit: RateLimit,
    pub timeout: Duration,
}

/// One validated `[mcp.NAME]`.
#[derive(Debug, Clone)]
pub struct McpServerConfig {
    pub name: String,
    pub transport: Transport,
    pub allow: Allow,
    pub timeout: Duration,
    pub start_timeout: Duration,
    pub tools: BTreeMap<String, ToolPolicy>,
}

impl McpServerConfig {
    /// This server with its OAuth token file teaching `redactor` every token it saves (the
    /// daemon's: a refreshed token is redacted like the ones read at start).
    pub fn teaching(mut self, redactor: std::sync::Arc<crate::secret::Redactor>) -> Self {
        if let Transport::Http { oauth, .. } = &mut self.transport {
            oauth.0 = oauth.0.clone().learning(redactor);
        }
        self
    }

    /// The policy of `tool`: its own table if it has one, else the server's defaults
    /// (effect `external_side_effect`, approval by effect, the server's timeout).
    pub fn policy(&self, tool: &str) -> ToolPolicy {
        self.tools.get(tool).copied().unwrap_or(ToolPolicy {
            effect: Effect::ExternalSideEffect,
            approval: ApprovalRule::default_for(Effect::ExternalSideEffect),
            rate_limit: RateLimit::default(),
            timeout: self.timeout,
        })
    }
}

/// Every secret of this server, for the one redactor.
impl crate::secret::SecretHolder for McpServerConfig {
    fn secrets(&self) -> Vec<&Secret> {
        match &self.transport {
            Transport::Stdio { env, .. } => env
                .iter()
                .filter_map(|(_, v)| match v {
                    EnvValue::Secret(s) => Some(s),
                    EnvValue::Plain(_) => None,
                })
                .collect(),
            Transport::Http { headers, oauth, .. } => headers
                .iter()
                .map(|(_, s)| s)
                .chain(oauth.1.client_secret.as_ref())
                .collect(),
        }
    }
}

/// Validates every `[mcp.NAME]` table: paths relative to the config file's folder, secrets
/// resolved (unless `cx.skip_secrets`: commands that start no server), each stdio server's
/// sandbox checked against what may never be granted.
pub fn from_raw(
    raw: BTreeMap<String, Spanned<RawServer>>,
    cx: &TableContext<'_>,
) -> Result<Vec<McpServerConfig>, ConfigError> {
    let protected = Protected {
        vault: cx.vault,
        state_dir: cx.state_dir,
        config: cx.path,
        folders: cx.folders,
    };
    let mut out = Vec::new();
    for (name, table) in raw {
        if let Some(server) = server_from_raw(name, table, cx, &protected)? {
            out.push(server);
        }
    }
    Ok(out)
}

/// The server whose `[mcp.NAME]` table is being read: names its keys in errors and secrets.
struct ServerTable<'a> {
    name: &'a str,
    cx: &'a TableContext<'a>,
}

impl ServerTable<'_> {
    fn key(&self, k: &str) -> String {
        format!("mcp.{}.{k}", self.name)
    }

    // `span`: the value at fault, or the table where no single key is.
    fn invalid(&self, k: &str, span: std::ops::Range<usize>, message: String) -> ConfigError {
        self.cx.invalid_at(
            &if k.is_empty() {
                format!("mcp.{}", self.name)
            } else {
                self.key(k)
            },
            span,
            message,
        )
    }

    fn secret(&self, k: String, reference: &str) -> Result<Secret, ConfigError> {
        self.cx.secret(&k, reference)
    }
}

/// [`from_raw`]'s stage for one server: its name, transport, allow list, timeouts and tool
/// policies; `None` when it is switched off.
fn server_from_raw(
    name: String,
    table: Spanned<RawServer>,
    cx: &TableContext<'_>,
    protected: &Protected<'_>,
) -> Result<Option<McpServerConfig>, ConfigError> {
    let table_span = table.span();
    let mut server = table.into_inner();
    let at = ServerTable { name: &name, cx };
    if !valid_server_name(&name) {
        return Err(at.invalid(
            "",
            table_span,
            "a server name is 1-32 characters of [A-Za-z0-9_-] without `__` (it becomes part of the tool names mcp__SERVER__TOOL)".into(),
        ));
    }
    if server.enabled == Some(false) {
        return Ok(None);
    }
    let transport = match (server.command.take(), server.url.take()) {
        (Some(_), Some(_)) => {
            return Err(at.invalid(
                "",
                table_span,
                "give either `command` (stdio) or `url` (streamable HTTP), not both".into(),
            ));
        }
        (None, None) => {
            return Err(at.invalid(
                "",
                table_span,
                "needs `command = [\"program\", \"arg\", …]` (stdio) or `url = \"https://…/mcp\"`"
                    .into(),
            ));
        }
        (Some(command), None) => {
            stdio_transport(command, &mut server, table_span.clone(), &at, protected)?
        }
        (None, Some(url)) => http_transport(url, &mut server, table_span.clone(), &at)?,
    };
    let allow = if server.allow.iter().any(|a| a == "*") {
        Allow::All
    } else {
        Allow::Only(server.allow)
    };
    let timeout = server.timeout.unwrap_or(DEFAULT_TIMEOUT);
    if timeout.is_zero() {
        return Err(at.invalid("timeout", table_span, "must be more than 0s".into()));
    }
    let start_timeout = server.start_timeout.unwrap_or(DEFAULT_START_TIMEOUT);
    let tools = tool_policies(server.tools, &allow, timeout, &at)?;
    Ok(Some(McpServerConfig {
        name,
        transport,
        allow,
        timeout,
        start_timeout,
        tools,
    }))
}

/// A `command` server's transport stage: its program, env, working directory and sandbox.
fn stdio_transport(
    command: Spanned<Vec<String>>,
    server: &mut RawServer,
    table_span: std::ops::Range<usize>,
    at: &ServerTable<'_>,
    protected: &Protected<'_>,
) -> Result<Transport, ConfigError> {
    let cx = at.cx;
    let resolve_path = |p: &str| cx.path(p);
    if let Some(oauth) = &server.oauth {
        return Err(at.invalid(
            "oauth",
            oauth.span(),
            "only a `url` server logs in with OAuth".into(),
        ));
    }
    if let Some(headers) = server.headers.as_ref().filter(|h| !h.get_ref().is_empty()) {
        return Err(at.invalid(
            "headers",
            headers.span(),
            "only a `url` server takes headers".into(),
        ));
    }
    let command_span = command.span();
    let mut parts = command.into_inner().into_iter();
    let Some(program) = parts.next().filter(|p| !p.is_empty()) else {
        return Err(at.invalid("command", command_span, "names no program".into()));
    };
    let mut env = Vec::new();
    for (var, value) in server.env.iter().flat_map(Spanned::get_ref) {
        let v =
            EnvValue::load(var, value, cx.skip_secrets).map_err(|source| ConfigError::Secret {
                path: cx.path.to_path_buf(),
                key: at.key(&format!("env.{var}")),
                source,
            })?;
        env.push((var.clone(), v));
    }
    // `./server` or `bin/server`: relative to the config file, like every path
    // in it; a bare name is looked up in PATH.
    let program = if program.contains('/') && Path::new(&program).is_relative() {
        resolve_path(&program).display().to_string()
    } else {
        program
    };
    let sandbox_span = server
        .sandbox
        .as_ref()
        .map_or(table_span.clone(), Spanned::span);
    let sandbox = sandbox_from_raw(
        server.sandbox.take().map(Spanned::into_inner),
        protected,
        cx.base,
    )
    .map_err(|(k, m)| at.invalid(&k, sandbox_span, m))?;
    Ok(Transport::Stdio {
        program,
        args: parts.collect(),
        env,
        cwd: server.cwd.as_ref().map(|c| resolve_path(c.get_ref())),
        sandbox,
    })
}

/// A `url` server's transport stage: its URL, headers (secrets) and OAuth client.
fn http_transport(
    url: Spanned<String>,
    server: &mut RawServer,
    table_span: std::ops::Range<usize>,
    at: &ServerTable<'_>,
) -> Result<Transport, ConfigError> {
    if let Some(env) = server.env.as_ref().filter(|e| !e.get_ref().is_empty()) {
        return Err(at.invalid(
            "env",
            env.span(),
            "only a `command` server takes env".into(),
        ));
    }
    if let Some(cwd) = &server.cwd {
        return Err(at.invalid(
            "cwd",
            cwd.span(),
            "only a `command` server takes cwd".into(),
        ));
    }
    if let Some(sandbox) = &server.sandbox {
        return Err(at.invalid(
            "sandbox",
            sandbox.span(),
            "only a `command` server runs here, in a sandbox; a `url` server runs elsewhere".into(),
        ));
    }
    let url_span = url.span();
    let url = url.into_inner();
    check_url(&url).map_err(|m| at.invalid("url", url_span, m))?;
    let mut headers = Vec::new();
    for (header, reference) in server.headers.iter().flat_map(Spanned::get_ref) {
        headers.push((
            header.clone(),
            at.secret(at.key(&format!("headers.{header}")), reference)?,
        ));
    }
    let (oauth_span, raw) = server
        .oauth
        .take()
        .map_or((table_span.clone(), Default::default()), |o| {
            (o.span(), o.into_inner())
        });
    if raw.client_secret.is_some() && raw.client_id.is_none() {
        return Err(at.invalid(
            "oauth.client_secret",
            oauth_span,
            "a client_secret goes with the client_id it was issued for".into(),
        ));
    }
    if let Some(doc) = &raw.client_metadata_url
        && !doc.starts_with("https://")
    {
        return Err(at.invalid(
            "oauth.client_metadata_url",
            oauth_span,
            format!("`{doc}` must be an https:// URL (a client ID metadata document)"),
        ));
    }
    let client = super::oauth::OAuthClient {
        client_secret: match &raw.client_secret {
            Some(r) => Some(at.secret(at.key("oauth.client_secret"), r)?),
            None => None,
        },
        client_id: raw.client_id,
        scopes: raw.scopes,
        client_metadata_url: raw.client_metadata_url,
    };
    let tokens = super::oauth::TokenFile::new(at.cx.state_dir, at.name, &url);
    Ok(Transport::Http {
        url,
        headers,
        oauth: Box::new((tokens, client)),
    })
}

/// The tool-policies stage: each `[mcp.NAME.tools.TOOL]` of a tool in `allow`, with the
/// defaults filled in.
fn tool_policies(
    raw: BTreeMap<String, Spanned<RawToolPolicy>>,
    allow: &Allow,
    timeout: Duration,
    at: &ServerTable<'_>,
) -> Result<BTreeMap<String, ToolPolicy>, ConfigError> {
    let mut tools = BTreeMap::new();
    for (tool, p) in raw {
        if !allow.allows(&tool) {
            return Err(at.invalid(
                &format!("tools.{tool}"),
                p.span(),
                format!("`{tool}` is not in `allow`; add it there to use this policy"),
            ));
        }
        let p = p.into_inner();
        let effect = p.effect.unwrap_or(Effect::ExternalSideEffect);
        let rate_limit = p.rate_limit.map_or(RateLimit::default(), |r| RateLimit {
            per_hour: r.per_hour,
            per_day: r.per_day,
        });
        tools.insert(
            tool,
            ToolPolicy {
                effect,
                approval: p.approval.unwrap_or(ApprovalRule::default_for(effect)),
                rate_limit,
                timeout: p.timeout.unwrap_or(timeout),
            },
        );
    }
    Ok(tools)
}

/// `sandbox` as written -> the server's sandbox; the error names the key at fault.
fn sandbox_from_raw(
    raw: Option<RawSandboxSetting>,
    protected: &Protected<'_>,
    base: &Path,
) -> Result<McpSandbox, (String, String)> {
    let raw = match raw {
        None => RawSandbox::default(),
        Some(RawSandboxSetting::Off) => return Ok(McpSandbox::Off),
        Some(RawSandboxSetting::On(raw)) => raw,
    };
    let mut read = Vec::new();
    for entry in &raw.read {
        read.push(
            protected
                .check_read(entry, base)
                .map_err(|m| ("sandbox.read".to_string(), m))?,
        );
    }
    let mut writable = Vec::new();
    for entry in &raw.writable {
        writable.push(
            protected
                .check_writable_anywhere(entry, base)
                .map_err(|m| ("sandbox.writable".to_string(), m))?,
        );
    }
    Ok(McpSandbox::On(ServerSandbox {
        read,
        writable,
        network: raw.network,
        mode: raw.mode.unwrap_or(SandboxMode::Required),
        secrets: protected.secret_paths(),
    }))
}

/// `vaultd config`'s view of the servers: every secret shown as its reference only.
pub fn describe(servers: &[McpServerConfig]) -> serde_json::Value {
    use serde_json::json;
    let secrets = |pairs: &[(String, Secret)]| {
        serde_json::Value::Object(
            pairs
                .iter()
                .map(|(k, s)| (k.clone(), json!(format!("{} [redacted]", s.reference()))))
                .collect(),
        )
    };
    let mut out = serde_json::Map::new();
    for s in servers {
        let mut v = match &s.transport {
            Transport::Stdio {
                program,
                args,
                env,
                cwd,
                sandbox,
            } => json!({
                "command": std::iter::once(program.clone()).chain(args.iter().cloned()).collect::<Vec<_>>(),
                "env": serde_json::Value::Object(
                    env.iter().map(|(k, v)| (k.clone(), json!(v.shown()))).collect()
                ),
                "cwd": cwd.as_ref().map(|c| c.display().to_string()),
                "sandbox": sandbox.describe(),
            }),
            Transport::Http {
                url,
                headers,
                oauth,
            } => {
                let client = &oauth.1;
                json!({
                    "url": url,
                    "headers": secrets(headers),
                    "oauth": {
                        "client_id": client.client_id,
                        "client_secret": client.client_secret.as_ref().map(|s| format!("{} [redacted]", s.reference())),
                        "scopes": client.scopes,
                        "client_metadata_url": client.client_metadata_url,
                    },
                })
            }
        };
        v["allow"] = match &s.allow {
            Allow::All => json!(["*"]),
            Allow::Only(names) => json!(names),
        };
        v["timeout"] = json!(humantime::format_duration(s.timeout).to_string());
        v["start_timeout"] = json!(humantime::format_duration(s.start_timeout).to_string());
        v["tools"] = serde_json::Value::Object(
            s.tools
                .iter()
                .map(|(t, p)| {
                    (
                        t.clone(),
                        json!({
                            "effect": p.effect.as_str(),
                            "approval": p.approval.as_str(),
                            "rate_limit": { "per_hour": p.rate_limit.per_hour, "per_day": p.rate_limit.per_day },
                            "timeout": humantime::format_duration(p.timeout).to_string(),
                        }),
                    )
                })
                .collect(),
        );
        out.insert(s.name.clone(), v);
    }
    serde_json::Value::Object(out)
}

fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && !name.contains("__")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `https://` anywhere; plain `http://` only to a loopback address (docs/design.md §8.12), since
/// headers carry credentials.
fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    match parsed.scheme() {
        "https" => Ok(()),
        "http" => {
            if crate::tools::http::is_loopback_host(parsed.host_str().unwrap_or("")) {
                Ok(())
            } else {
                Err("plain http:// is allowed only to a loopback address; use https://".into())
            }
        }
        other => Err(format!("scheme `{other}` is not http or https")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<McpServerConfig>, ConfigError> {
        parse_in(Path::new("/nonexistent/vault"), text)
    }

    fn parse_in(vault: &Path, text: &str) -> Result<Vec<McpServerConfig>, ConfigError> {
        let raw: BTreeMap<String, Spanned<RawServer>> = toml::from_str(text).expect("toml");
        let state_dir = vault.join(".vaultd-state");
        let cx = TableContext {
            path: &vault.join("vaultd.toml"),
            base: vault,
            vault,
            folders: &crate::vault::Folders::default(),
            state_dir: &state_dir,
            skip_secrets: false,
        };
        from_raw(raw, &cx)
    }

    fn sandbox_error(vault: &Path, sandbox: &str) -> String {
        parse_in(
            vault,
            &format!("[s]\ncommand = [\"srv\"]\nsandbox = {sandbox}\n"),
        )
        .unwrap_err()
        .to_string()
    }

    #[test]
    fn a_stdio_server_is_sandboxed_unless_it_says_false() {
        let on = &parse("[s]\ncommand = [\"srv\"]\n").unwrap()[0];
        let Transport::Stdio { sandbox, .. } = &on.transport else {
            panic!("stdio")
        };
        let McpSandbox::On(s) = sandbox else {
            panic!("sandboxed by default: {sandbox:?}")
        };
        assert!(!s.network && s.writable.is_empty() && s.mode == SandboxMode::Required);
        assert!(
            s.secrets
                .iter()
                .any(|p| p.ends_with(".ssh") || p.ends_with(".vaultd-state"))
        );
        let off = &parse("[s]\ncommand = [\"srv\"]\nsandbox = false\n").unwrap()[0];
        let Transport::Stdio { sandbox, .. } = &off.transport else {
            panic!("stdio")
        };
        assert!(matches!(sandbox, McpSandbox::Off), "{sandbox:?}");
        assert!(sandbox.describe().contains("unconfined"));
    }

    #[test]
    fn a_sandbox_never_grants_the_vault_its_state_folders_or_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let vault = dir.path().join("vault");
        for d in ["Needs_Action", "Projects", ".vaultd-state"] {
            std::fs::create_dir_all(vault.join(d)).unwrap();
        }
        let w = |p: &Path| format!("{{ writable = [{:?}] }}", p.display().to_string());
        let ok = parse_in(
            &vault,
            &format!(
                "[s]\ncommand = [\"srv\"]\nsandbox = {}\n",
                w(&vault.join("Projects"))
            ),
        );
        assert!(ok.is_ok(), "{:?}", ok.err());
        for (path, says) in [
            (vault.clone(), "holds the vault root"),
            (dir.path().to_path_buf(), "holds the vault root"),
            (vault.join("Needs_Action"), "state folder"),
            (vault.join(".vaultd-state"), "never granted"),
            (vault.join("vaultd.toml"), "never granted"),
            (crate::home::expand_tilde("~/.ssh"), "never granted"),
            (vault.join("Projects/../Needs_Action"), "`..`"),
            (vault.join("Missing"), "does not exist"),
        ] {
            let err = sandbox_error(&vault, &w(&path));
            assert!(
                err.contains("mcp.s.sandbox.writable") && err.contains(says),
                "{}: {err}",
                path.display()
            );
        }
        // A shape serde refuses (config::parse_raw then names the key and line).
        let shape = |sandbox: &str| {
            toml::from_str::<BTreeMap<String, RawServer>>(&format!(
                "[s]\ncommand = [\"srv\"]\nsandbox = {sandbox}\n"
            ))
            .unwrap_err()
            .to_string()
        };
        let err = shape("{ netwrok = true }");
        assert!(err.contains("unknown field `netwrok`"), "{err}");
        let err = shape("\"yes\"");
        assert!(err.contains("expected `false` or a table"), "{err}");
        let err = parse_in(
            &vault,
            "[s]\nurl = \"http://127.0.0.1:9/mcp\"\nsandbox = false\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("mcp.s.sandbox"), "{err}");
    }

    #[test]
    fn defaults_deny_and_take_external_side_effect() {
        let s = &parse("[files]\ncommand = [\"srv\", \"--root\", \"/x\"]\n").unwrap()[0];
        assert!(!s.allow.allows("read_file"));
        let p = s.policy("read_file");
        assert_eq!(p.effect, Effect::ExternalSideEffect);
        assert_eq!(p.approval, ApprovalRule::Always);
        assert_eq!(p.timeout, DEFAULT_TIMEOUT);
        assert_eq!(s.start_timeout, DEFAULT_START_TIMEOUT);
        match &s.transport {
            Transport::Stdio { program, args, .. } => {
                assert_eq!(program, "srv");
                assert_eq!(args, &["--root", "/x"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tool_tables_set_effect_approval_and_limits() {
        let s = &parse(
            "[files]\ncommand = [\"srv\"]\nallow = [\"read_file\"]\ntimeout = \"5s\"\n[files.tools.read_file]\neffect = \"read_only\"\nrate_limit = { per_hour = 600 }\n",
        )
        .unwrap()[0];
        let p = s.policy("read_file");
        assert_eq!(p.effect, Effect::ReadOnly);
        assert_eq!(p.approval, ApprovalRule::Never);
        assert_eq!(p.rate_limit.per_hour, Some(600));
        assert_eq!(p.timeout, Duration::from_secs(5));
    }

    #[test]
    fn star_allows_all() {
        let s = &parse("[x]\ncommand = [\"srv\"]\nallow = [\"*\"]\n").unwrap()[0];
        assert!(s.allow.allows("anything"));
    }

    #[test]
    fn mistakes_name_the_key() {
        let err = parse("[x]\ncommand = [\"srv\"]\nurl = \"https://a/mcp\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mcp.x"), "{err}");
        let err = parse("[x]\nurl = \"http://example.com/mcp\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mcp.x.url") && err.contains("loopback"),
            "{err}"
        );
        assert!(parse("[x]\nurl = \"http://127.0.0.1:9/mcp\"\n").is_ok());
        let err = parse("[x]\ncommand = [\"srv\"]\n[x.tools.t]\neffect = \"read_only\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mcp.x.tools.t"), "{err}");
        let err = parse("[a__b]\ncommand = [\"srv\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mcp.a__b"), "{err}");
        let err = parse("[x]\ncommand = [\"srv\"]\nenv = { T = \"env:VAULTD_T_SURELY_UNSET\" }\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mcp.x.env.T"), "{err}");
        // A plain value is plain: given as written, shown as written, never redacted.
        let s =
            &parse("[x]\ncommand = [\"srv\"]\nenv = { MEMORY_FILE_PATH = \"/w/memory.jsonl\" }\n")
                .unwrap()[0];
        assert!(crate::secret::SecretHolder::secrets(s).is_empty());
        let shown = describe(std::slice::from_ref(s)).to_string();
        assert!(shown.contains("/w/memory.jsonl"), "{shown}");
        // A plain value that looks like a credential is refused, with where and what to do.
        let err =
            parse("[x]\ncommand = [\"srv\"]\nenv = { GITHUB_TOKEN = \"ghp_0123456789abcdef\" }\n")
                .unwrap_err();
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(
            chain.contains("mcp.x.env.GITHUB_TOKEN")
                && chain.contains("looks like a credential")
                && chain.contains("env:GITHUB_TOKEN")
                && !chain.contains("ghp_0123"),
            "{chain}"
        );
        assert!(parse("[x]\ncommand = [\"srv\"]\nenv = { AUTH_MODE = \"none\" }\n").is_ok());
        let raw: Result<BTreeMap<String, RawServer>, _> =
            toml::from_str("[x]\ncomand = [\"srv\"]\n");
        assert!(raw.unwrap_err().to_string().contains("comand"));
    }
}
