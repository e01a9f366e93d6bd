//! `vaultd mcp add` and `vaultd mcp import`: moving MCP servers over from another client in
//! one command (docs/design.md §10.4, "Coming from another client"), plus what `vaultd tools
//! --all` and `vaultd status` say about each configured server.
//!
//! Both commands write through the one config writer (`tools::mcp::edit`, comments and layout
//! kept) and validate the result with the daemon's own config reading before the file is
//! replaced (a temp file renamed over it): a config the daemon would refuse is never written.

use super::{GlobalArgs, escape_controls, read_only, registry_for};
use crate::config::{self, Config};
use crate::journal::Journal;
use crate::journal::catalog::PinState;
use crate::tools::mcp::config::{Allow, McpServerConfig, Transport};
use crate::tools::mcp::edit::{self, NewServer, NewTransport};
use crate::tools::mcp::import::{self, ToSet};
use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Subcommand)]
pub enum McpAction {
    /// Add an MCP server to the config: `vaultd mcp add NAME -- COMMAND ARGS...` (stdio) or
    /// `vaultd mcp add NAME --url URL` (streamable HTTP)
    ///
    /// Writes a `[mcp.NAME]` table into the config file, its comments kept. No tool of the
    /// server may run until named in `allow` (`--allow TOOL`, or later in the file):
    /// `vaultd tools --all` lists them once the server has run.
    #[command(
        after_help = "Examples:\n  vaultd mcp add memory --env MEMORY_FILE_PATH=/home/me/memory.jsonl -- mcp-server-memory\n  vaultd mcp add github --env GITHUB_TOKEN=env:GITHUB_TOKEN --allow search_issues -- github-mcp-server stdio\n  vaultd mcp add docs --url https://docs.example.com/mcp --header Authorization=env:DOCS_MCP_AUTH"
    )]
    Add(AddArgs),
    /// Import the MCP servers of Claude Desktop, Claude Code, Cursor or goose
    ///
    /// Reads an `mcpServers` JSON (claude_desktop_config.json, .mcp.json, ~/.cursor/mcp.json)
    /// or goose's config.yaml and writes one `[mcp.NAME]` table per server. Credentials are
    /// not copied: they become `env:NAME` references, and the variables to set are listed.
    #[command(
        after_help = "Examples:\n  vaultd mcp import ~/.config/Claude/claude_desktop_config.json --dry-run\n  vaultd mcp import .mcp.json --only github --only memory\n  vaultd mcp import ~/.config/goose/config.yaml"
    )]
    Import(ImportArgs),
    /// Log in to a streamable-HTTP server with OAuth (GitHub's, Linear's, Notion's, …)
    ///
    /// Finds the server's authorization server, registers vaultd there (or uses
    /// `[mcp.NAME.oauth] client_id`), opens a browser for you to approve, and keeps the tokens
    /// in the state directory (0600); the daemon sends them and refreshes them as they expire.
    #[command(
        after_help = "Examples:\n  vaultd mcp login linear\n  vaultd mcp login github --scope repo --scope read:org\n  vaultd mcp login notion --no-browser      (prints the address to open elsewhere)"
    )]
    Login(super::login::LoginArgs),
    /// Forget the OAuth tokens of a server (`vaultd mcp login` gets new ones)
    Logout(super::login::LogoutArgs),
    /// Offer the vault's tools to an MCP client over stdio: Claude Code, goose, Cursor, …
    ///
    /// Every call runs as a call note through the daemon (journaled, at most once, held for a
    /// person's approval when policy says so, undoable) and is appended to a session note
    /// under `Agent/Sessions/`. Runs the daemon in this process when none runs on the vault.
    #[command(
        after_help = "Examples:\n  claude mcp add vaultd -- vaultd mcp serve --vault ~/Notes\n  goose session --with-extension \"vaultd mcp serve --vault ~/Notes\"\n  vaultd mcp serve --vault ~/Notes --listen 127.0.0.1:8765     (with [gateway] token = \"env:VAULTD_GATEWAY_TOKEN\")"
    )]
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Serve streamable HTTP instead of stdio, on a loopback address (`127.0.0.1:8765`,
    /// `[::1]:8765`, port 0 for any free one) or a unix socket (`unix:/run/user/1000/vaultd.sock`);
    /// the MCP endpoint is `/mcp`. Clients send `Authorization: Bearer` with `[gateway] token`.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// With --listen: accept clients without a token. Anyone on this machine can then call the
    /// vault's tools; for tests (the MCP conformance suite sends no token).
    #[arg(long, requires = "listen")]
    pub insecure_no_token: bool,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The server's name: 1-32 characters of [A-Za-z0-9_-], its tools become mcp__NAME__TOOL.
    name: String,
    /// An environment variable of a stdio server: a plain value (a path, a flag) or a secret
    /// reference (env:NAME, file:PATH, credential:NAME). A literal that looks like a
    /// credential is refused.
    #[arg(long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// A tool that may be called (repeat for more; `*` allows every tool). Default: none.
    #[arg(long, value_name = "TOOL")]
    allow: Vec<String>,
    /// The working directory of a stdio server (relative to the config file).
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// A streamable HTTP server's address, instead of a command.
    #[arg(long, value_name = "URL", conflicts_with_all = ["env", "cwd", "command"])]
    url: Option<String>,
    /// An HTTP header of a `--url` server; its value is a secret reference (env:NAME, …).
    #[arg(long = "header", value_name = "K=SECRET_REF", requires = "url")]
    headers: Vec<String>,
    /// Print the table that would be added; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// The program and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND", required_unless_present = "url")]
    command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// claude_desktop_config.json, .mcp.json, ~/.cursor/mcp.json or goose's config.yaml.
    file: PathBuf,
    /// Import only this server (its name in FILE; repeat for more).
    #[arg(long, value_name = "NAME")]
    only: Vec<String>,
    /// Print the TOML that would be added; write nothing.
    #[arg(long)]
    dry_run: bool,
}

pub(super) fn run(g: &GlobalArgs, action: McpAction) -> Result<i32> {
    match action {
        McpAction::Add(args) => add(g, args),
        McpAction::Import(args) => import_file(g, args),
        McpAction::Login(args) => super::login::login(g, args),
        McpAction::Logout(args) => super::login::logout(g, args),
        // Dispatched by the caller (cli.rs): the gateway lists tools as `vaultd tools` does.
        McpAction::Serve(_) => unreachable!("`vaultd mcp serve` is dispatched in cli.rs"),
    }
}

/// The config file as the daemon finds it, read and validated as it is now.
struct Target {
    config: Config,
    path: PathBuf,
    text: String,
}

fn target(g: &GlobalArgs) -> Result<Target> {
    let config = match config::load(&read_only(g)) {
        Err(config::ConfigError::NoVault { .. }) => {
            let mut o = read_only(g);
            o.vault = Some(std::env::current_dir()?);
            config::load(&o)?
        }
        other => other?,
    };
    let Some(path) = config.source.clone() else {
        bail!(
            "no config file to add the server to: vaultd runs on its defaults here; create one with `vaultd init DIR`, or name one with --config"
        );
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(Target { config, path, text })
}

impl Target {
    /// Reads `text` as the daemon would read this file (every key, every table, secrets
    /// left unresolved: they may not be set yet) and builds its tools.
    fn validate(&self, g: &GlobalArgs, text: &str, with_tools: bool) -> Result<()> {
        let raw = config::parse_raw(text, &self.path)?;
        let mut o = read_only(g);
        o.vault.get_or_insert_with(|| self.config.vault.clone());
        let config = config::from_raw(raw, Some(self.path.clone()), &o)?;
        if with_tools {
            registry_for(&config)?;
        }
        Ok(())
    }

    fn write(&self, text: &str) -> Result<()> {
        replace_config(&self.path, &self.text, text)
    }
}

/// Replaces the config at `path`, read as `read`, with `text`: a temp file beside it with the
/// file's mode, synced, renamed over it (a symbolic link to the config is followed, so a
/// dotfiles link stays a link).
fn replace_config(path: &Path, read: &str, text: &str) -> Result<()> {
    let real = std::fs::canonicalize(path)
        .with_context(|| format!("cannot resolve {}", path.display()))?;
    let dir = real
        .parent()
        .with_context(|| format!("{} has no folder", real.display()))?;
    // An edit made since this command read the file is never overwritten.
    let now = std::fs::read_to_string(&real)
        .with_context(|| format!("cannot read {}", real.display()))?;
    if now != read {
        bail!(
            "{} changed while vaultd was adding to it; nothing written, run the command again",
            path.display()
        );
    }
    let permissions = std::fs::metadata(&real)?.permissions();
    let mut tmp = tempfile::Builder::new()
        .prefix(".vaultd-config-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write a temp file in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().set_permissions(permissions)?;
    tmp.as_file().sync_all()?;
    tmp.persist(&real)
        .with_context(|| format!("cannot replace {}", real.display()))?;
    crate::files::fsync_dir(dir);
    Ok(())
}

fn split_pair(pair: &str, flag: &str) -> Result<(String, String)> {
    match pair.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => bail!("{flag} takes K=V, not `{pair}`"),
    }
}

fn is_reference(v: &str) -> bool {
    ["env:", "file:", "credential:"]
        .iter()
        .any(|p| v.starts_with(p))
}

fn add(g: &GlobalArgs, args: AddArgs) -> Result<i32> {
    let transport = match &args.url {
        Some(url) => {
            let mut headers = BTreeMap::new();
            for h in &args.headers {
                let (k, v) = split_pair(h, "--header")?;
                if !is_reference(&v) {
                    bail!(
                        "--header {k}: a header value is a secret reference, never the token itself (it would be in the config and in your shell history): put the value in a variable and give --header {k}=env:{}",
                        env_var_for(&args.name, &k)
                    );
                }
                headers.insert(k, v);
            }
            NewTransport::Http {
                url: url.clone(),
                headers,
            }
        }
        None => {
            let mut env = BTreeMap::new();
            for e in &args.env {
                let (k, v) = split_pair(e, "--env")?;
                if !is_reference(&v) && crate::secret::looks_like_credential(&k, &v) {
                    bail!(
                        "--env {k}: this looks like a credential; a credential is never written into the config: set it in vaultd's environment and give --env {k}=env:{k} (or file:PATH)"
                    );
                }
                env.insert(k, v);
            }
            NewTransport::Stdio {
                command: args.command.clone(),
                env,
                cwd: args.cwd.clone(),
            }
        }
    };
    let server = NewServer {
        name: args.name.clone(),
        transport,
        allow: args.allow.clone(),
        enabled: true,
        timeout: None,
        comments: Vec::new(),
    };
    let target = target(g)?;
    let text = edit::add_servers(&target.text, std::slice::from_ref(&server))
        .with_context(|| format!("{}", target.path.display()))?;
    target.validate(g, &text, true).with_context(|| {
        format!(
            "[mcp.{}] was not added: the config would not be valid",
            args.name
        )
    })?;
    let table = edit::render(std::slice::from_ref(&server))?;
    let mut out = std::io::stdout().lock();
    if args.dry_run {
        writeln!(
            out,
            "--dry-run: nothing written; this would be added to {}:\n\n{table}",
            target.path.display()
        )?;
        return Ok(0);
    }
    target.write(&text)?;
    writeln!(
        out,
        "added [mcp.{}] to {}:\n\n{table}",
        args.name,
        target.path.display()
    )?;
    next_steps(&mut out, &[server.name.as_str()], &args.allow)?;
    Ok(0)
}

/// What to do after adding: the server lists its tools at its first start, and nothing of it
/// runs until its tools are allowed (deny by default).
fn next_steps(out: &mut impl Write, names: &[&str], allowed: &[String]) -> Result<()> {
    let first = names.first().copied().unwrap_or("NAME");
    if allowed.is_empty() {
        writeln!(
            out,
            "No tool of {} may run yet: `allow = []` denies every tool (deny by default).",
            names.join(", ")
        )?;
    } else {
        writeln!(
            out,
            "Allowed: {}. Each is held for approval until you give it an effect: [mcp.{first}.tools.TOOL] effect = \"read_only\" (the default is external_side_effect).",
            allowed.join(", ")
        )?;
    }
    writeln!(
        out,
        "Next:\n  vaultd once            starts the server once: it lists its tools (a running `vaultd run` needs a restart for a new server)\n  vaultd tools --all     its tools, and why each is not usable yet\n  then name the tools to use in mcp.{first}.allow (allow = [\"*\"] allows all), and give each its effect"
    )?;
    Ok(())
}

/// `SERVER_HEADER` in upper case: the variable suggested for a header's value, named as
/// `mcp import` names them (`import::env_name`).
fn env_var_for(server: &str, header: &str) -> String {
    import::env_name(&format!("{server}_{header}"))
}

fn import_file(g: &GlobalArgs, args: ImportArgs) -> Result<i32> {
    let source = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let (format, found) = import::read_servers(&args.file, &source)?;
    check_only(&args, &found)?;
    let target = target(g)?;
    let configured = edit::configured_servers(&target.text)
        .with_context(|| format!("{}", target.path.display()))?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}: {} server(s) ({})",
        args.file.display(),
        found.len(),
        format.as_str()
    )?;
    let mut text = target.text.clone();
    let mut added: Vec<NewServer> = Vec::new();
    let mut to_set: Vec<ToSet> = Vec::new();
    for f in found {
        let shown = escape_controls(&f.original_name);
        if !args.only.is_empty()
            && !args.only.iter().any(|w| {
                w == &f.original_name || f.outcome.as_ref().is_ok_and(|i| &i.server.name == w)
            })
        {
            continue;
        }
        let imported = match f.outcome {
            Err(why) => {
                writeln!(out, "  {shown}: skipped: {}", escape_controls(&why))?;
                continue;
            }
            Ok(i) => i,
        };
        let name = imported.server.name.clone();
        if configured.contains(&name) || added.iter().any(|a| a.name == name) {
            writeln!(
                out,
                "  {shown}: skipped: [mcp.{name}] is already configured (the existing table is left as it is)"
            )?;
            continue;
        }
        let next = edit::add_servers(&text, std::slice::from_ref(&imported.server))?;
        if let Err(e) = target.validate(g, &next, false) {
            writeln!(
                out,
                "  {shown}: skipped: the config would not be valid with it: {}",
                escape_controls(&format!("{e:#}")).replace("\\n", " ")
            )?;
            continue;
        }
        text = next;
        writeln!(out, "  {shown}: -> [mcp.{name}]")?;
        for n in &imported.notes {
            writeln!(out, "      note: {}", escape_controls(n))?;
        }
        to_set.extend(imported.to_set);
        added.push(imported.server);
    }
    if added.is_empty() {
        writeln!(
            out,
            "nothing to add; {} is unchanged",
            target.path.display()
        )?;
        return Ok(0);
    }
    target
        .validate(g, &text, true)
        .context("nothing was imported: the config would not be valid")?;
    let toml = edit::render(&added)?;
    if args.dry_run {
        writeln!(
            out,
            "\n--dry-run: nothing written; this would be added to {}:\n\n{toml}",
            target.path.display()
        )?;
    } else {
        target.write(&text)?;
        writeln!(
            out,
            "\nadded {} server(s) to {}:\n\n{toml}",
            added.len(),
            target.path.display()
        )?;
    }
    print_credentials(&mut out, to_set)?;
    let names: Vec<&str> = added.iter().map(|s| s.name.as_str()).collect();
    next_steps(&mut out, &names, &[])?;
    Ok(0)
}

/// import_file's `--only` stage: each name given is a server of the file.
fn check_only(args: &ImportArgs, found: &[import::Found]) -> Result<()> {
    for wanted in &args.only {
        if !found.iter().any(|f| {
            &f.original_name == wanted || f.outcome.as_ref().is_ok_and(|i| &i.server.name == wanted)
        }) {
            let names: Vec<&str> = found.iter().map(|f| f.original_name.as_str()).collect();
            bail!(
                "--only {wanted}: {} has no server of that name (it has: {}); nothing written",
                args.file.display(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            );
        }
    }
    Ok(())
}

/// import_file's credentials stage: the variables vaultd's environment must hold, sorted,
/// each once.
fn print_credentials(out: &mut impl Write, mut to_set: Vec<ToSet>) -> Result<()> {
    if !to_set.is_empty() {
        to_set.sort_by(|a, b| a.variable.cmp(&b.variable));
        to_set.dedup_by(|a, b| a.variable == b.variable);
        writeln!(
            out,
            "Credentials were not copied. Set these in vaultd's environment before it starts (for the service: EnvironmentFile= in its unit, docs/operations.md):"
        )?;
        let width = to_set.iter().map(|t| t.variable.len()).max().unwrap_or(0);
        for t in &to_set {
            writeln!(
                out,
                "  {:<width$}  {}",
                t.variable,
                escape_controls(&t.holds)
            )?;
        }
    }
    Ok(())
}

/// Every configured MCP tool that `vaultd tools` leaves out, and why (`vaultd tools --all`):
/// servers never listed yet, tools not in `allow`, allowed names the server does not offer.
pub(super) fn not_usable(config: &Config, journal: Option<&Journal>) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    let Some(journal) = journal else {
        return Ok(out);
    };
    for s in &config.mcp {
        let source = format!("mcp:{}", s.name);
        let Some(catalog) = journal.mcp_catalog(&s.name)? else {
            out.push(json!({
                "name": format!("mcp__{}__*", s.name),
                "source": source,
                "usable": false,
                "reason": "never_listed",
                "why": format!("never listed yet: server `{}` has not run since it was configured, so its tools are not known; `vaultd once` (or a restart of `vaultd run`) starts it and it lists them", s.name),
            }));
            continue;
        };
        match journal.mcp_not_allowed(&s.name)? {
            Some(tools) => {
                for t in tools {
                    out.push(json!({
                        "name": crate::tools::mcp::tool_name(&s.name, &t.tool),
                        "source": source,
                        "description": t.description,
                        "usable": false,
                        "reason": "not_allowed",
                        "why": format!("not allowed: add \"{}\" to mcp.{}.allow to use it (offered at {})", t.tool, s.name, catalog.listed_at),
                    }));
                }
            }
            None => out.push(json!({
                "name": format!("mcp__{}__*", s.name),
                "source": source,
                "usable": false,
                "reason": "not_allowed_unknown",
                "why": format!("the tools `allow` leaves out were not recorded at the last listing ({}); they are known after the server's next start", catalog.listed_at),
            })),
        }
        if let Allow::Only(names) = &s.allow {
            for name in names {
                if !catalog.tools.iter().any(|t| &t.tool.tool == name) {
                    out.push(json!({
                        "name": crate::tools::mcp::tool_name(&s.name, name),
                        "source": source,
                        "usable": false,
                        "reason": "not_offered",
                        "why": format!("in mcp.{}.allow, but the server did not offer it at its last listing ({})", s.name, catalog.listed_at),
                    }));
                }
            }
        }
    }
    Ok(out)
}

/// The text of `vaultd tools --all`'s second part.
pub(super) fn print_not_usable(out: &mut impl Write, list: &[Value]) -> Result<()> {
    writeln!(out, "Not usable ({}):", list.len())?;
    if list.is_empty() {
        writeln!(out, "  none")?;
    }
    for t in list {
        writeln!(
            out,
            "{} ({})\n  {}",
            escape_controls(t["name"].as_str().unwrap_or("")),
            t["source"].as_str().unwrap_or(""),
            escape_controls(t["why"].as_str().unwrap_or(""))
        )?;
        if let Some(d) = t["description"].as_str().filter(|d| !d.is_empty()) {
            writeln!(out, "  {}", escape_controls(d))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// What `vaultd status` says of each configured server: the config, and what the journal
/// recorded (listings, pins, its calls' failures) plus its circuit. Whether it is up right
/// now, when it started and how often it restarted live in the running daemon only (its log
/// says `MCP server is up`), and the output says so.
pub(super) fn server_states(
    config: &Config,
    journal: &Journal,
    circuits: &[crate::guard::breaker::CircuitStatus],
    daemon_running: bool,
) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for s in &config.mcp {
        let record = journal.mcp_server_record(&s.name)?;
        let count = |f: fn(&PinState) -> bool| record.tools.iter().filter(|t| f(&t.pin)).count();
        let circuit = circuits.iter().find(|c| c.key == format!("mcp:{}", s.name));
        out.push(json!({
            "name": s.name,
            "transport": transport_of(s),
            "allow": match &s.allow { Allow::All => json!(["*"]), Allow::Only(n) => json!(n) },
            "listed": record.listed_at.is_some(),
            "first_listed_at": record.first_listed_at,
            "last_listed_at": record.listed_at,
            "tools_allowed": record.tools.len(),
            "pins": {
                "accepted": count(|p| matches!(p, PinState::Accepted)),
                "changed": count(|p| matches!(p, PinState::Changed { .. })),
                "new": count(|p| matches!(p, PinState::New)),
            },
            "tools_not_allowed": record.not_allowed.as_ref().map(Vec::len),
            "last_call_at": record.last_call_at,
            "last_failure": record.last_failure.as_ref().map(|e| json!({
                "at": e.time, "tool": e.tool, "outcome": e.outcome, "detail": e.detail,
            })),
            "circuit": circuit,
            "live": record.live.map(|mut live| {
                // A daemon killed by a signal said nothing on its way out.
                if !daemon_running && live.state != "stopped" {
                    live.state = "not running".into();
                }
                live
            }),
        }));
    }
    Ok(out)
}

fn transport_of(s: &McpServerConfig) -> Value {
    match &s.transport {
        Transport::Stdio { program, .. } => json!({ "stdio": program }),
        Transport::Http { url, oauth, .. } => {
            json!({ "url": url, "oauth": oauth.0.describe() })
        }
    }
}

/// The text of `vaultd status`'s MCP part.
pub(super) fn print_server_states(
    servers: &[Value],
    redactor: &crate::secret::Redactor,
) -> Result<()> {
    if servers.is_empty() {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nMCP servers")?;
    for s in servers {
        let how = match (&s["transport"]["stdio"], &s["transport"]["url"]) {
            (Value::String(p), _) => format!("stdio {p}"),
            (_, Value::String(u)) => format!("url {u}"),
            _ => String::new(),
        };
        writeln!(
            out,
            "  {}  {}",
            s["name"].as_str().unwrap_or(""),
            escape_controls(&how)
        )?;
        let oauth = &s["transport"]["oauth"];
        if oauth["logged_in"] == json!(true) {
            let expires = oauth["expires_at"]
                .as_u64()
                .map(|at| {
                    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(at);
                    format!(", access token until {}", crate::call::rfc3339_seconds(at))
                })
                .unwrap_or_default();
            let renew = if oauth["refreshable"] == json!(true) {
                "refreshed by vaultd"
            } else {
                "no refresh token: `vaultd mcp login` again when it ends"
            };
            writeln!(out, "    OAuth: logged in{expires} ({renew})")?;
        } else if let Some(e) = oauth["error"].as_str() {
            writeln!(out, "    OAuth: {}", escape_controls(e))?;
        }
        if let Some(live) = s["live"].as_object() {
            let text = |k: &str| live[k].as_str().unwrap_or("");
            let mut line = match text("state") {
                "up" => format!("    up since {}", text("since")),
                "down" => format!("    down since {}, restarting with backoff", text("since")),
                "stopped" => format!("    stopped at {} (with vaultd)", text("since")),
                other => format!("    {other}: vaultd is not running"),
            };
            if let Some(about) = live["about"].as_str().filter(|a| !a.is_empty()) {
                line.push_str(&format!(" ({})", escape_controls(about)));
            }
            match live["restarts"].as_i64().unwrap_or(0) {
                0 => {}
                1 => line.push_str(", restarted once"),
                n => line.push_str(&format!(", restarted {n} times")),
            }
            writeln!(out, "{line}")?;
            if let Some(e) = live["last_error"].as_str() {
                writeln!(
                    out,
                    "    last error {}: {}",
                    text("last_error_at"),
                    escape_controls(&redactor.redact(e))
                )?;
            }
        }
        if s["listed"] != json!(true) {
            writeln!(
                out,
                "    never listed yet: it has not run since it was configured (`vaultd once` starts it)"
            )?;
        } else {
            let pins = &s["pins"];
            let mut line = format!(
                "    tools listed at {} (first at {}): {} allowed ({} accepted",
                s["last_listed_at"].as_str().unwrap_or("?"),
                s["first_listed_at"].as_str().unwrap_or("?"),
                s["tools_allowed"],
                pins["accepted"]
            );
            for (key, what) in [("changed", "changed since accepted"), ("new", "new")] {
                if pins[key].as_u64().unwrap_or(0) > 0 {
                    line.push_str(&format!(", {} {what}: see `vaultd tools`", pins[key]));
                }
            }
            line.push(')');
            if let Some(n) = s["tools_not_allowed"].as_u64() {
                line.push_str(&format!(", {n} not allowed"));
            }
            writeln!(out, "{line}")?;
        }
        if let Some(at) = s["last_call_at"].as_str() {
            writeln!(out, "    last call ended at {at}")?;
        }
        if let Some(f) = s["last_failure"].as_object() {
            writeln!(
                out,
                "    last failed call: {}  {} {}: {}",
                f["at"].as_str().unwrap_or(""),
                f["tool"].as_str().unwrap_or(""),
                f["outcome"].as_str().unwrap_or(""),
                escape_controls(&redactor.redact(f["detail"].as_str().unwrap_or("")))
            )?;
        }
        if let Some(c) = s["circuit"].as_object() {
            writeln!(
                out,
                "    circuit {}{} after {} failures in a row; last: {}",
                c["state"].as_str().unwrap_or(""),
                c["until"]
                    .as_str()
                    .map(|u| format!(" until {u}"))
                    .unwrap_or_default(),
                c["failures"],
                escape_controls(&redactor.redact(c["last_error"].as_str().unwrap_or("")))
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_variables_are_upper_case_names() {
        assert_eq!(env_var_for("docs", "X-Api-Key"), "DOCS_X_API_KEY");
    }

    #[test]
    fn pairs_need_a_key() {
        assert!(split_pair("=v", "--env").is_err());
        assert!(split_pair("k", "--env").is_err());
        assert_eq!(
            split_pair("K=a=b", "--env").unwrap(),
            ("K".into(), "a=b".into())
        );
    }

    #[test]
    fn the_config_file_keeps_its_mode_and_a_concurrent_edit_wins() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vaultd.toml");
        std::fs::write(&path, "# mine\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        replace_config(&link, "# mine\n", "# mine\n[mcp.x]\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "# mine\n[mcp.x]\n");
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
        // The file changed since it was read: nothing is written.
        let err = replace_config(&link, "# mine\n", "# other\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("changed while"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "# mine\n[mcp.x]\n");
    }
}
