//! The `[mcp.NAME]` tables: read with serde (unknown keys are errors), then validated once
//! into [`McpServerConfig`] with every secret reference resolved.

use crate::config::table::{ConfigError, RateLimit, RawRateLimit};
use crate::secret::Secret;
use crate::tools::{ApprovalRule, Effect};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    pub command: Option<Vec<String>>,
    /// Streamable HTTP endpoint.
    pub url: Option<String>,
    /// Environment of a stdio server: name -> secret reference (`env:`, `file:`, `credential:`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// HTTP headers of a `url` server: name -> secret reference.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Tool names that may be called; `["*"]` allows all. Empty (the default) allows none.
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub start_timeout: Option<Duration>,
    /// Working directory of a stdio server (default: the state directory's `mcp/NAME`).
    pub cwd: Option<String>,
    #[serde(default)]
    pub tools: BTreeMap<String, RawToolPolicy>,
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
        /// Secrets handed to the child as environment variables; nothing else is inherited
        /// except [`INHERITED_ENV`].
        env: Vec<(String, Secret)>,
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP.
    Http {
        url: String,
        headers: Vec<(String, Secret)>,
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
            Transport::Stdio { env, .. } => env.iter().map(|(_, s)| s).collect(),
            Transport::Http { headers, .. } => headers.iter().map(|(_, s)| s).collect(),
        }
    }
}

/// Validates every `[mcp.NAME]` table. `resolve_path` makes a relative path relative to the
/// config file's folder; with `skip_secrets` (commands that start no server) a secret that
/// cannot be read here is left unresolved.
pub fn from_raw(
    raw: BTreeMap<String, RawServer>,
    path: &Path,
    resolve_path: impl Fn(&str) -> PathBuf,
    skip_secrets: bool,
) -> Result<Vec<McpServerConfig>, ConfigError> {
    let mut out = Vec::new();
    for (name, server) in raw {
        let key = |k: &str| format!("mcp.{name}.{k}");
        let invalid = |k: &str, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key: if k.is_empty() {
                format!("mcp.{name}")
            } else {
                key(k)
            },
            message,
        };
        let secret = |k: String, reference: &str| {
            Secret::load(reference, skip_secrets).map_err(|source| ConfigError::Secret {
                path: path.to_path_buf(),
                key: k,
                source,
            })
        };
        if !valid_server_name(&name) {
            return Err(invalid(
                "",
                "a server name is 1-32 characters of [A-Za-z0-9_-] without `__` (it becomes part of the tool names mcp__SERVER__TOOL)".into(),
            ));
        }
        if server.enabled == Some(false) {
            continue;
        }
        let transport = match (server.command, server.url) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "",
                    "give either `command` (stdio) or `url` (streamable HTTP), not both".into(),
                ));
            }
            (None, None) => {
                return Err(invalid(
                    "",
                    "needs `command = [\"program\", \"arg\", …]` (stdio) or `url = \"https://…/mcp\"`".into(),
                ));
            }
            (Some(command), None) => {
                if !server.headers.is_empty() {
                    return Err(invalid(
                        "headers",
                        "only a `url` server takes headers".into(),
                    ));
                }
                let mut parts = command.into_iter();
                let Some(program) = parts.next().filter(|p| !p.is_empty()) else {
                    return Err(invalid("command", "names no program".into()));
                };
                let mut env = Vec::new();
                for (var, reference) in &server.env {
                    env.push((var.clone(), secret(key(&format!("env.{var}")), reference)?));
                }
                // `./server` or `bin/server`: relative to the config file, like every path
                // in it; a bare name is looked up in PATH.
                let program = if program.contains('/') && Path::new(&program).is_relative() {
                    resolve_path(&program).display().to_string()
                } else {
                    program
                };
                Transport::Stdio {
                    program,
                    args: parts.collect(),
                    env,
                    cwd: server.cwd.as_deref().map(&resolve_path),
                }
            }
            (None, Some(url)) => {
                if !server.env.is_empty() {
                    return Err(invalid("env", "only a `command` server takes env".into()));
                }
                if server.cwd.is_some() {
                    return Err(invalid("cwd", "only a `command` server takes cwd".into()));
                }
                check_url(&url).map_err(|m| invalid("url", m))?;
                let mut headers = Vec::new();
                for (header, reference) in &server.headers {
                    headers.push((
                        header.clone(),
                        secret(key(&format!("headers.{header}")), reference)?,
                    ));
                }
                Transport::Http { url, headers }
            }
        };
        let allow = if server.allow.iter().any(|a| a == "*") {
            Allow::All
        } else {
            Allow::Only(server.allow)
        };
        let timeout = server.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if timeout.is_zero() {
            return Err(invalid("timeout", "must be more than 0s".into()));
        }
        let start_timeout = server.start_timeout.unwrap_or(DEFAULT_START_TIMEOUT);
        let mut tools = BTreeMap::new();
        for (tool, p) in server.tools {
            if !allow.allows(&tool) {
                return Err(invalid(
                    &format!("tools.{tool}"),
                    format!("`{tool}` is not in `allow`; add it there to use this policy"),
                ));
            }
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
        out.push(McpServerConfig {
            name,
            transport,
            allow,
            timeout,
            start_timeout,
            tools,
        });
    }
    Ok(out)
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
            } => json!({
                "command": std::iter::once(program.clone()).chain(args.iter().cloned()).collect::<Vec<_>>(),
                "env": secrets(env),
                "cwd": cwd.as_ref().map(|c| c.display().to_string()),
            }),
            Transport::Http { url, headers } => json!({ "url": url, "headers": secrets(headers) }),
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
            let host = parsed.host_str().unwrap_or("");
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let loopback = host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if loopback {
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
        let raw: BTreeMap<String, RawServer> = toml::from_str(text).expect("toml");
        from_raw(
            raw,
            Path::new("test.toml"),
            |p: &str| PathBuf::from(p),
            false,
        )
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
        let err = parse("[x]\ncommand = [\"srv\"]\nenv = { T = \"plain\" }\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mcp.x.env.T"), "{err}");
        let raw: Result<BTreeMap<String, RawServer>, _> =
            toml::from_str("[x]\ncomand = [\"srv\"]\n");
        assert!(raw.unwrap_err().to_string().contains("comand"));
    }
}
