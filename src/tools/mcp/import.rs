//! Reads the MCP servers another client configured, for `vaultd mcp import`
//! (docs/design.md §10.4, "Coming from another client"): the `mcpServers` object of Claude
//! Desktop's `claude_desktop_config.json`, Claude Code's and Cursor's `.mcp.json` /
//! `~/.cursor/mcp.json` (VS Code's `servers` too), and the `extensions:` of goose's
//! `config.yaml`. Each server becomes a [`NewServer`] for the one config writer
//! ([`super::edit`]). Pure: text in, servers out.
//!
//! Credentials are never copied: an `env` value that looks like one (by its name or its
//! shape) and every HTTP header become secret references (`env:NAME`), and the person is told
//! which variables to set. A value the old client read from its own environment
//! (`${VAR}`, `${env:VAR}`) becomes `env:VAR` directly.

use super::edit::{NewServer, NewTransport};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Which kind of file was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{"mcpServers": {...}}`: Claude Desktop, Claude Code, Cursor (or VS Code's `servers`).
    McpServersJson,
    /// goose's `config.yaml`, `extensions:`.
    GooseYaml,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::McpServersJson => "mcpServers JSON",
            Format::GooseYaml => "goose config.yaml",
        }
    }
}

/// One server found in the file.
#[derive(Debug, Clone)]
pub struct Found {
    /// Its name in the file.
    pub original_name: String,
    /// What to write, or why it is not imported.
    pub outcome: Result<Imported, String>,
}

#[derive(Debug, Clone)]
pub struct Imported {
    pub server: NewServer,
    /// Variables vaultd's environment must hold before the server can start.
    pub to_set: Vec<ToSet>,
    /// What the person should know about this server (a dropped setting, `npx`, …).
    pub notes: Vec<String>,
}

/// One environment variable to set for vaultd, and what it must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToSet {
    pub variable: String,
    pub holds: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{file}: not valid JSON (line {line}, column {column}): {message}")]
    Json {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}: not valid YAML: {message}")]
    Yaml { file: String, message: String },
    #[error("{file}: {message}")]
    Shape { file: String, message: String },
}

/// The servers of `text`, the contents of `file` (its name picks nothing but the messages;
/// YAML is recognised by the extension `.yaml`/`.yml` or by not starting with `{`).
pub fn read_servers(file: &Path, text: &str) -> Result<(Format, Vec<Found>), ImportError> {
    let shown = file.display().to_string();
    let yaml = file
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
        || !text.trim_start().starts_with(JSON_OBJECT);
    let mut names = Names::default();
    if yaml {
        let root: Value = serde_norway::from_str(text).map_err(|e| ImportError::Yaml {
            file: shown.clone(),
            message: e.to_string(),
        })?;
        let Some(extensions) = root.get("extensions").and_then(Value::as_object) else {
            return Err(ImportError::Shape {
                file: shown,
                message: "no `extensions:` map (goose keeps its MCP servers there, in ~/.config/goose/config.yaml)".into(),
            });
        };
        let found = extensions
            .iter()
            .map(|(name, entry)| Found {
                original_name: name.clone(),
                outcome: goose_entry(name, entry, &mut names),
            })
            .collect();
        return Ok((Format::GooseYaml, found));
    }
    let root: Value = serde_json::from_str(text).map_err(|e| ImportError::Json {
        file: shown.clone(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let servers = root
        .get("mcpServers")
        .or_else(|| root.get("servers"))
        .and_then(Value::as_object)
        .ok_or_else(|| ImportError::Shape {
            file: shown.clone(),
            message: "no `mcpServers` object (Claude Desktop, Claude Code and Cursor keep their MCP servers there; Claude Code's own servers of a project are in the project's .mcp.json)".into(),
        })?;
    let found = servers
        .iter()
        .map(|(name, entry)| Found {
            original_name: name.clone(),
            outcome: mcp_servers_entry(name, entry, &mut names),
        })
        .collect();
    Ok((Format::McpServersJson, found))
}

/// Keys of an `mcpServers` entry that carry no meaning for vaultd, or one it cannot honour.
const IGNORED_JSON_KEYS: &[&str] = &["description", "name"];

/// How a JSON client file starts (a YAML one, goose's, need not).
const JSON_OBJECT: char = '{';

/// The braces of a `${VAR}` reference in the old clients' files.
const VARIABLE_OPEN: &str = "${";
const VARIABLE_CLOSE: char = '}';

fn mcp_servers_entry(name: &str, entry: &Value, names: &mut Names) -> Result<Imported, String> {
    let obj = entry
        .as_object()
        .ok_or_else(|| "its entry is not an object".to_string())?;
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    let mut notes = Vec::new();
    for (key, _) in obj.iter().filter(|(k, _)| {
        ![
            "type", "command", "args", "env", "cwd", "url", "headers", "disabled",
        ]
        .contains(&k.as_str())
            && !IGNORED_JSON_KEYS.contains(&k.as_str())
    }) {
        notes.push(format!(
            "`{key}` is not imported (vaultd has no such setting; approval and allow are set per tool in the config)"
        ));
    }
    let enabled = obj.get("disabled").and_then(Value::as_bool) != Some(true);
    let transport = match (kind, obj.get("url"), obj.get("command")) {
        ("sse", _, _) => return Err(sse_note(obj.get("url").and_then(Value::as_str))),
        (_, Some(url), None) | ("http" | "streamable-http" | "streamable_http", Some(url), _) => {
            let url = url
                .as_str()
                .ok_or_else(|| "`url` is not a string".to_string())?;
            let headers = string_map(obj.get("headers"), "headers")?;
            http(name, url, &headers, &[], names, &mut notes)?
        }
        (_, None, Some(command)) => {
            let command = command
                .as_str()
                .ok_or_else(|| "`command` is not a string".to_string())?;
            let args = string_list(obj.get("args"), "args")?;
            let env = string_map(obj.get("env"), "env")?;
            let cwd = obj.get("cwd").and_then(Value::as_str).map(str::to_string);
            stdio(name, command, args, &env, &[], cwd, names, &mut notes)?
        }
        (_, Some(_), Some(_)) => return Err("it has both `command` and `url`".into()),
        (_, None, None) => return Err("it has neither `command` nor `url`".into()),
    };
    Ok(finish(name, transport, enabled, None, notes))
}

fn goose_entry(name: &str, entry: &Value, names: &mut Names) -> Result<Imported, String> {
    let obj = entry
        .as_object()
        .ok_or_else(|| "its entry is not a map".to_string())?;
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    let enabled = obj.get("enabled").and_then(Value::as_bool) != Some(false);
    let timeout = obj
        .get("timeout")
        .and_then(Value::as_u64)
        .map(|s| format!("{s}s"));
    let mut notes = Vec::new();
    // goose keeps the values of `env_keys` in its own secret store: vaultd reads them from
    // its environment.
    let env_keys = string_list(obj.get("env_keys"), "env_keys")?;
    let transport = match kind {
        "stdio" => {
            let cmd = obj
                .get("cmd")
                .and_then(Value::as_str)
                .ok_or_else(|| "a stdio extension without `cmd`".to_string())?;
            let args = string_list(obj.get("args"), "args")?;
            let env = string_map(obj.get("envs"), "envs")?;
            let cwd = obj.get("cwd").and_then(Value::as_str).map(str::to_string);
            stdio(name, cmd, args, &env, &env_keys, cwd, names, &mut notes)?
        }
        "streamable_http" => {
            let url = obj
                .get("uri")
                .or_else(|| obj.get("url"))
                .and_then(Value::as_str)
                .ok_or_else(|| "a streamable_http extension without `uri`".to_string())?;
            let headers = string_map(obj.get("headers"), "headers")?;
            let envs = string_map(obj.get("envs"), "envs")?;
            if !envs.is_empty() {
                notes.push(
                    "its `envs` are not imported: a remote server gets no environment from vaultd"
                        .into(),
                );
            }
            http(name, url, &headers, &env_keys, names, &mut notes)?
        }
        "sse" => return Err(sse_note(obj.get("uri").and_then(Value::as_str))),
        "builtin" | "platform" | "frontend" | "inline_python" => {
            return Err(format!(
                "a goose `{kind}` extension runs inside goose, not as an MCP server vaultd can start"
            ));
        }
        other => return Err(format!("unknown extension type `{other}`")),
    };
    Ok(finish(name, transport, enabled, timeout, notes))
}

fn sse_note(url: Option<&str>) -> String {
    format!(
        "it uses the SSE transport ({}), which MCP replaced by streamable HTTP in 2025 and vaultd does not speak; if the server also offers streamable HTTP (often the same address ending in /mcp instead of /sse), add it with `vaultd mcp add NAME --url URL`",
        url.unwrap_or("no url")
    )
}

fn finish(
    name: &str,
    transport: (NewTransport, Vec<ToSet>),
    enabled: bool,
    timeout: Option<String>,
    mut notes: Vec<String>,
) -> Imported {
    let (transport, to_set) = transport;
    let vaultd_name = server_name(name);
    if vaultd_name != name {
        notes.push(format!(
            "imported as `{vaultd_name}` (a server name is 1-32 characters of [A-Za-z0-9_-] without `__`)"
        ));
    }
    if !enabled {
        notes.push("switched off in the old client: written with `enabled = false`".into());
    }
    let mut comments = vec![format!(
        "imported by `vaultd mcp import` from `{name}`. allow = [] denies every tool: run the"
    )];
    comments.push(
        "server once (vaultd once), list its tools with `vaultd tools --all`, then name the ones to use."
            .into(),
    );
    for t in &to_set {
        comments.push(format!(
            "needs {} in vaultd's environment: {}",
            t.variable, t.holds
        ));
    }
    Imported {
        server: NewServer {
            name: vaultd_name,
            transport,
            allow: Vec::new(),
            enabled,
            timeout,
            comments,
        },
        to_set,
        notes,
    }
}

#[allow(clippy::too_many_arguments)]
fn stdio(
    server: &str,
    command: &str,
    args: Vec<String>,
    env: &BTreeMap<String, String>,
    env_keys: &[String],
    cwd: Option<String>,
    names: &mut Names,
    notes: &mut Vec<String>,
) -> Result<(NewTransport, Vec<ToSet>), String> {
    if command.trim().is_empty() {
        return Err("its `command` is empty".into());
    }
    let mut to_set = Vec::new();
    let mut out = BTreeMap::new();
    for (key, value) in env {
        match env_value(server, key, value, names) {
            EnvImport::Plain(v) => {
                out.insert(key.clone(), v);
            }
            EnvImport::Reference { variable, holds } => {
                out.insert(key.clone(), format!("env:{variable}"));
                to_set.push(ToSet { variable, holds });
            }
        }
    }
    for key in env_keys {
        if !out.contains_key(key) {
            out.insert(key.clone(), format!("env:{key}"));
            to_set.push(ToSet {
                variable: key.clone(),
                holds: format!("{key}, kept in the old client's secret store"),
            });
        }
    }
    let program = Path::new(command)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(command);
    if matches!(program, "npx" | "uvx" | "bunx" | "pnpx") {
        notes.push(format!(
            "`{program}` downloads the server at each start: in vaultd's sandbox that needs `sandbox = {{ network = true, writable = [\"~/.npm\"] }}` (`~/.cache/uv` for uvx); installing the server once and naming its program needs neither (docs/tools/mcp.md)"
        ));
    }
    let mut command_line = vec![command.to_string()];
    command_line.extend(args);
    Ok((
        NewTransport::Stdio {
            command: command_line,
            env: out,
            cwd,
        },
        to_set,
    ))
}

fn http(
    server: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
    env_keys: &[String],
    names: &mut Names,
    notes: &mut Vec<String>,
) -> Result<(NewTransport, Vec<ToSet>), String> {
    let mut to_set = Vec::new();
    let mut out = BTreeMap::new();
    // Every header value is a secret reference in vaultd (it is where tokens go).
    for (header, value) in headers {
        if is_reference(value) {
            out.insert(header.clone(), value.clone());
            continue;
        }
        let (variable, holds) = match whole_variable(value) {
            Some(var) => (
                var.clone(),
                format!("the {header} header, as the old client read it from ${var}"),
            ),
            None => (
                names.claim(&env_name(&format!("{server}_{header}")), value),
                format!(
                    "the whole {header} header value, as written in the old client's file{}",
                    if value.contains(VARIABLE_OPEN) {
                        " (with its ${…} filled in)"
                    } else {
                        ""
                    }
                ),
            ),
        };
        out.insert(header.clone(), format!("env:{variable}"));
        to_set.push(ToSet { variable, holds });
    }
    if !env_keys.is_empty() {
        notes.push(format!(
            "its env_keys ({}) are not imported: a remote server gets no environment; if one is a token, send it as a header",
            env_keys.join(", ")
        ));
    }
    Ok((
        NewTransport::Http {
            url: url.to_string(),
            headers: out,
        },
        to_set,
    ))
}

enum EnvImport {
    Plain(String),
    Reference { variable: String, holds: String },
}

/// One `env` entry: a value the old client read from its environment stays there, a value
/// that looks like a credential moves there, anything else is copied as plain text.
fn env_value(server: &str, key: &str, value: &str, names: &mut Names) -> EnvImport {
    if is_reference(value) {
        return EnvImport::Plain(value.to_string());
    }
    if let Some(var) = whole_variable(value) {
        return EnvImport::Reference {
            holds: format!("{key} of server `{server}`, as the old client read it from ${var}"),
            variable: var,
        };
    }
    if crate::secret::looks_like_credential(key, value) {
        return EnvImport::Reference {
            variable: names.claim(&env_name(key), value),
            holds: format!(
                "{key} of server `{server}` (a credential: its value is in the imported file, not copied)"
            ),
        };
    }
    EnvImport::Plain(value.to_string())
}

/// Already a secret reference, as vaultd's config reads one.
fn is_reference(value: &str) -> bool {
    ["env:", "file:", "credential:"]
        .iter()
        .any(|p| value.starts_with(p))
}

/// `${VAR}`, `${VAR:-default}` (Claude Code), `${env:VAR}` (Cursor), `$VAR`: the variable.
fn whole_variable(value: &str) -> Option<String> {
    let inner = value
        .strip_prefix(VARIABLE_OPEN)
        .and_then(|v| v.strip_suffix(VARIABLE_CLOSE))
        .map(|v| v.strip_prefix("env:").unwrap_or(v))
        .map(|v| v.split(":-").next().unwrap_or(v))
        .or_else(|| value.strip_prefix('$'))?;
    let valid = !inner.is_empty()
        && !inner.starts_with(|c: char| c.is_ascii_digit())
        && inner.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then(|| inner.to_string())
}

/// The variable names one import hands out: the same name for the same value, another one
/// (prefixed with the server) when two servers hold different values under one name.
#[derive(Default)]
struct Names {
    given: BTreeMap<String, String>,
}

impl Names {
    fn claim(&mut self, wanted: &str, value: &str) -> String {
        let mut name = wanted.to_string();
        let mut n = 2;
        loop {
            match self.given.get(&name) {
                None => {
                    self.given.insert(name.clone(), value.to_string());
                    return name;
                }
                Some(v) if v == value => return name,
                Some(_) => {
                    name = format!("{wanted}_{n}");
                    n += 1;
                }
            }
        }
    }
}

/// An environment variable name made of `text`: upper case, `_` for anything else, and never
/// starting with a digit.
pub fn env_name(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) || out.is_empty() {
        out.insert(0, '_');
    }
    out
}

/// A valid `[mcp.NAME]` name made of another client's server name: 1-32 characters of
/// `[A-Za-z0-9_-]` without `__` (it becomes part of `mcp__SERVER__TOOL`).
pub fn server_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            c
        } else {
            '-'
        };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    let out: String = out.chars().take(32).collect();
    let out = out.trim_matches('-').to_string();
    if out.is_empty() { "server".into() } else { out }
}

fn string_list(v: Option<&Value>, what: &str) -> Result<Vec<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => Ok(s.clone()),
                // YAML reads `- 8080` as a number; the program gets it as text anyway.
                Value::Number(n) => Ok(n.to_string()),
                Value::Bool(b) => Ok(b.to_string()),
                _ => Err(format!("`{what}` holds something that is not a string")),
            })
            .collect(),
        Some(_) => Err(format!("`{what}` is not a list")),
    }
}

fn string_map(v: Option<&Value>, what: &str) -> Result<BTreeMap<String, String>, String> {
    let empty = Map::new();
    let obj = match v {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(o)) => o,
        Some(_) => return Err(format!("`{what}` is not a map")),
    };
    obj.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            Value::Number(n) => Ok((k.clone(), n.to_string())),
            Value::Bool(b) => Ok((k.clone(), b.to_string())),
            _ => Err(format!("`{what}.{k}` is not a string")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(file: &str, text: &str) -> Imported {
        let (_, found) = read_servers(Path::new(file), text).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        found.into_iter().next().unwrap().outcome.unwrap()
    }

    #[test]
    fn claude_desktop_stdio_with_a_token_and_a_path() {
        let i = one(
            "claude_desktop_config.json",
            r#"{"mcpServers": {"github": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
                "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_abc123", "MEMORY_FILE_PATH": "/w/m.jsonl", "LOG_LEVEL": "debug"}}},
               "globalShortcut": "x"}"#,
        );
        let NewTransport::Stdio { command, env, cwd } = &i.server.transport else {
            panic!("stdio")
        };
        assert_eq!(
            command,
            &["npx", "-y", "@modelcontextprotocol/server-github"]
        );
        assert_eq!(
            env["GITHUB_PERSONAL_ACCESS_TOKEN"],
            "env:GITHUB_PERSONAL_ACCESS_TOKEN"
        );
        assert_eq!(env["MEMORY_FILE_PATH"], "/w/m.jsonl");
        assert_eq!(env["LOG_LEVEL"], "debug");
        assert!(cwd.is_none());
        assert_eq!(i.to_set.len(), 1);
        assert!(
            !format!("{i:?}").contains("ghp_abc123"),
            "the token is copied nowhere"
        );
        assert!(i.server.allow.is_empty());
        assert!(i.notes.iter().any(|n| n.contains("npx")), "{:?}", i.notes);
    }

    #[test]
    fn claude_code_and_cursor_http_servers_with_variables() {
        let i = one(
            ".mcp.json",
            r#"{"mcpServers": {"linear": {"type": "http", "url": "https://mcp.linear.app/mcp",
                "headers": {"Authorization": "Bearer ${LINEAR_TOKEN}", "X-Team": "${TEAM}"}}}}"#,
        );
        let NewTransport::Http { url, headers } = &i.server.transport else {
            panic!("http")
        };
        assert_eq!(url, "https://mcp.linear.app/mcp");
        assert_eq!(headers["Authorization"], "env:LINEAR_AUTHORIZATION");
        assert_eq!(headers["X-Team"], "env:TEAM");
        let i = one(
            "mcp.json",
            r#"{"mcpServers": {"x": {"command": "srv", "env": {"API_KEY": "${env:MY_KEY}", "A": "${B:-c}"}}}}"#,
        );
        let NewTransport::Stdio { env, .. } = &i.server.transport else {
            panic!("stdio")
        };
        assert_eq!(env["API_KEY"], "env:MY_KEY");
        assert_eq!(env["A"], "env:B");
        // A url without `type` is streamable HTTP too.
        let i = one(
            "m.json",
            r#"{"mcpServers": {"d": {"url": "https://d/mcp"}}}"#,
        );
        assert!(matches!(i.server.transport, NewTransport::Http { .. }));
    }

    #[test]
    fn sse_and_broken_entries_are_skipped_with_a_reason() {
        let (_, found) = read_servers(
            Path::new("c.json"),
            r#"{"mcpServers": {"old": {"type": "sse", "url": "https://x/sse"}, "bad": 3, "none": {}}}"#,
        )
        .unwrap();
        let why: BTreeMap<_, _> = found
            .iter()
            .map(|f| {
                (
                    f.original_name.as_str(),
                    f.outcome.as_ref().unwrap_err().clone(),
                )
            })
            .collect();
        assert!(
            why["old"].contains("SSE") && why["old"].contains("/mcp"),
            "{why:?}"
        );
        assert!(why["bad"].contains("not an object"));
        assert!(why["none"].contains("neither"));
    }

    #[test]
    fn goose_extensions() {
        let text = "extensions:\n  developer:\n    enabled: true\n    type: builtin\n    name: developer\n  github:\n    enabled: false\n    type: stdio\n    cmd: /usr/bin/gh-mcp\n    args: [serve, 8080]\n    envs:\n      GITHUB_HOST: github.com\n    env_keys: [GITHUB_TOKEN]\n    timeout: 300\n  remote:\n    type: streamable_http\n    uri: https://r.example/mcp\n";
        let (format, found) = read_servers(Path::new("config.yaml"), text).unwrap();
        assert_eq!(format, Format::GooseYaml);
        let by: BTreeMap<_, _> = found
            .iter()
            .map(|f| (f.original_name.as_str(), f))
            .collect();
        assert!(
            by["developer"]
                .outcome
                .as_ref()
                .unwrap_err()
                .contains("builtin")
        );
        let gh = by["github"].outcome.as_ref().unwrap();
        assert!(!gh.server.enabled);
        assert_eq!(gh.server.timeout.as_deref(), Some("300s"));
        let NewTransport::Stdio { command, env, .. } = &gh.server.transport else {
            panic!("stdio")
        };
        assert_eq!(command, &["/usr/bin/gh-mcp", "serve", "8080"]);
        assert_eq!(env["GITHUB_HOST"], "github.com");
        assert_eq!(env["GITHUB_TOKEN"], "env:GITHUB_TOKEN");
        assert!(matches!(
            by["remote"].outcome.as_ref().unwrap().server.transport,
            NewTransport::Http { .. }
        ));
    }

    #[test]
    fn malformed_files_name_the_file_and_the_place() {
        let err = read_servers(
            Path::new("/x/claude_desktop_config.json"),
            "{\"mcpServers\": {,}}",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("/x/claude_desktop_config.json: not valid JSON (line 1"),
            "{err}"
        );
        let err = read_servers(Path::new("a.json"), "{\"other\": 1}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no `mcpServers`"), "{err}");
        let err = read_servers(Path::new("c.yaml"), "extensions: [unclosed")
            .unwrap_err()
            .to_string();
        assert!(err.contains("c.yaml: not valid YAML"), "{err}");
    }

    #[test]
    fn names_become_valid_server_names_and_variables_do_not_clash() {
        assert_eq!(server_name("brave search"), "brave-search");
        assert_eq!(server_name("a__b"), "a_b");
        assert_eq!(server_name("ü"), "server");
        assert_eq!(server_name(&"x".repeat(40)).len(), 32);
        let (_, found) = read_servers(
            Path::new("c.json"),
            r#"{"mcpServers": {"a": {"command": "x", "env": {"API_KEY": "one"}}, "b": {"command": "y", "env": {"API_KEY": "two"}}}}"#,
        )
        .unwrap();
        let vars: Vec<String> = found
            .iter()
            .map(|f| f.outcome.as_ref().unwrap().to_set[0].variable.clone())
            .collect();
        assert_eq!(vars, ["API_KEY", "API_KEY_2"]);
    }
}
