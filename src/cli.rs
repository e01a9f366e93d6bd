//! The command line: `run | once | check | tools | init | status | log | approve | reject |
//! config`. Maps every failure to a message and an exit code; `anyhow` lives only here.

use crate::config::{self, Config, Overrides};
use crate::daemon::{self, Mode};
use crate::journal::Decision;
use crate::note::{CallBody, parse_note};
use crate::secret::Redactor;
use crate::tools::Registry;
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Parser)]
#[command(
    name = "vaultd",
    version,
    about = "Runs the tool calls that agents write into markdown notes"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Taken by every subcommand (DESIGN §8.8).
#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// The vault folder (overrides `vault` in the config).
    #[arg(long, global = true, value_name = "DIR")]
    pub vault: Option<PathBuf>,
    /// The config file (else $VAULTD_CONFIG, <vault>/.vaultd.toml, the user config dir).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where the journal lives (overrides `state_dir`).
    #[arg(long, global = true, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ToolFormat {
    Openai,
    Anthropic,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon in the foreground (systemd runs this).
    Run,
    /// Process everything pending, then exit.
    Once,
    /// Parse and validate notes; print what would run. Exit 1 when any call is invalid.
    Check {
        #[arg(required = true)]
        notes: Vec<PathBuf>,
        /// One JSON object per note (JSON Lines).
        #[arg(long)]
        json: bool,
    },
    /// List the tools with their descriptions and JSON Schemas.
    Tools {
        #[arg(long)]
        json: bool,
        /// Print a ready-to-use tool list for an LLM API.
        #[arg(long, value_enum)]
        format: Option<ToolFormat>,
    },
    /// Create the folders, a commented config and a welcome note in DIR.
    Init { dir: PathBuf },
    /// Print the effective configuration, secrets redacted.
    Config,
    /// Notes per state, running calls, recent failures and problems, rate-limit use.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Show the journal: claims, calls, results, moves, problems.
    Log {
        /// Only entries newer than this (e.g. 30m, 1h, 2days).
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        /// Only calls of this tool.
        #[arg(long)]
        tool: Option<String>,
        /// Only notes whose path contains this text.
        #[arg(long)]
        note: Option<String>,
        /// At most this many entries (the newest).
        #[arg(long, default_value_t = 200)]
        limit: usize,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Approve the held calls of a note in Pending_Approval/ (exactly the parameters its
    /// questions show) and move it to Approved/, where the daemon runs them.
    Approve {
        /// The note: a path, or relative to the vault or to Pending_Approval/.
        note: PathBuf,
    },
    /// Reject the held calls of a note: they get REJECTED results and the note moves to
    /// Rejected/.
    Reject {
        /// The note: a path, or relative to the vault or to Pending_Approval/.
        note: PathBuf,
    },
    /// Undo the vault changes of a call (or of every call of a note, newest first): each file
    /// is put back if it still is as the call left it.
    Undo {
        /// The call id (as in its result block); an undo prints its own id, so it can be
        /// undone too.
        #[arg(required_unless_present = "note")]
        call_id: Option<String>,
        /// Every change made by this note's calls (a path, or relative to the vault).
        #[arg(long)]
        note: Option<PathBuf>,
        /// Print the diff of what would be restored; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Restore even files edited since the call changed them (their edits are lost).
        #[arg(long)]
        force: bool,
    },
}

/// Parses the command line, runs it, returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vaultd: {e:#}");
            2
        }
    }
}

fn overrides(g: &GlobalArgs) -> Overrides {
    Overrides {
        vault: g.vault.clone(),
        config: g.config.clone(),
        state_dir: g.state_dir.clone(),
    }
}

fn dispatch(cli: Cli) -> Result<i32> {
    let g = cli.global;
    match cli.command {
        Command::Run => serve(&g, Mode::Run),
        Command::Once => serve(&g, Mode::Once),
        Command::Check { notes, json } => check(&g, &notes, json),
        Command::Tools { json, format } => tools(&g, json, format),
        Command::Init { dir } => init(&dir),
        Command::Config => print_config(&g),
        Command::Status { json } => status(&g, json),
        Command::Log {
            since,
            tool,
            note,
            limit,
            json,
        } => log(&g, since, tool, note, limit, json),
        Command::Approve { note } => decide(&g, &note, Decision::Approved),
        Command::Reject { note } => decide(&g, &note, Decision::Rejected),
        Command::Undo {
            call_id,
            note,
            dry_run,
            force,
        } => undo(&g, call_id, note, dry_run, force),
    }
}

fn load(g: &GlobalArgs) -> Result<Config> {
    Ok(config::load(&overrides(g))?)
}

/// The config for commands that work without a vault (`check`, `tools`): the current folder
/// stands in for a missing vault.
fn load_lenient(g: &GlobalArgs) -> Result<Config> {
    match config::load(&overrides(g)) {
        Err(config::ConfigError::NoVault { .. }) => {
            let mut o = overrides(g);
            o.vault = Some(std::env::current_dir()?);
            Ok(config::load(&o)?)
        }
        other => Ok(other?),
    }
}

fn serve(g: &GlobalArgs, mode: Mode) -> Result<i32> {
    let config = load(g)?;
    let redactor = Arc::new(daemon::redactor_for(&config));
    init_tracing(redactor.clone(), g.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        daemon::run(config, mode, redactor, shutdown_signal())
            .await
            .map_err(anyhow::Error::from)
    })?;
    Ok(0)
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed now, inside the runtime, not on
/// the first poll: the daemon polls this only from its main loop, and until then a SIGTERM
/// (systemd stopping the unit during start-up) would kill the process instead of waiting.
fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler can be installed");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler can be installed");
    // SIGHUP's default action would kill the daemon mid-call; the config is not reloaded
    // (see README), so it is only acknowledged.
    let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler can be installed");
    async move {
        loop {
            tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); return }
                _ = int.recv() => { tracing::info!("SIGINT: shutting down"); return }
                _ = hup.recv() => tracing::warn!("SIGHUP: the config is not reloaded; restart vaultd to apply a changed config"),
            }
        }
    }
}

/// Logs go to stderr through the redactor: plain lines without colours or timestamps under
/// systemd's journal, colours on a terminal, JSON with `--log-format json`.
pub fn init_tracing(redactor: Arc<Redactor>, format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let ansi = std::io::stderr().is_terminal() && !under_journal;
    let writer = RedactingStderr(redactor);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .with_target(false);
    let _ = match (format, under_journal) {
        (LogFormat::Json, _) => builder.json().try_init(),
        (LogFormat::Text, true) => builder.without_time().try_init(),
        (LogFormat::Text, false) => builder.try_init(),
    };
}

/// A stderr writer that passes every log line through the redactor.
#[derive(Clone)]
struct RedactingStderr(Arc<Redactor>);

struct RedactingLine(Arc<Redactor>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactingStderr {
    type Writer = RedactingLine;
    fn make_writer(&'a self) -> RedactingLine {
        RedactingLine(self.0.clone())
    }
}

impl Write for RedactingLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(self.0.redact(&text).as_bytes())?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn registry_for(config: &Config) -> Result<Registry> {
    Ok(Registry::from_config(
        &config.tools,
        daemon::http_client()?,
        None,
    )?)
}

fn check(g: &GlobalArgs, notes: &[PathBuf], as_json: bool) -> Result<i32> {
    let config = load_lenient(g)?;
    let registry = registry_for(&config)?;
    let mut any_invalid = false;
    let mut out = std::io::stdout().lock();
    for path in notes {
        let text = match std::fs::read(path) {
            Ok(b) => match String::from_utf8(b) {
                Ok(s) => s,
                Err(_) => {
                    any_invalid = true;
                    report_unreadable(&mut out, path, "note is not UTF-8", as_json)?;
                    continue;
                }
            },
            Err(e) => {
                any_invalid = true;
                report_unreadable(&mut out, path, &format!("cannot read: {e}"), as_json)?;
                continue;
            }
        };
        let parsed = parse_note(&text);
        let mut calls = Vec::new();
        for call in &parsed.calls {
            let (status, error) = if parsed.has_result(&call.call_id) {
                ("done", None)
            } else {
                match &call.body {
                    CallBody::Broken(e) => ("invalid", Some(e.clone())),
                    CallBody::Call { name, parameters } => {
                        match registry.resolve(name, parameters) {
                            Err(e) => ("invalid", Some(e)),
                            Ok(tool) => match tool.admit(parameters) {
                                crate::tools::Admission::Deny(e) => ("invalid", Some(e)),
                                _ => ("pending", None),
                            },
                        }
                    }
                }
            };
            any_invalid |= status == "invalid";
            let mut entry = json!({
                "call_id": call.call_id,
                "name": call.name,
                "line": call.line,
                "status": status,
            });
            if let Some(e) = error {
                entry["error"] = json!({ "code": e.code.as_str(), "message": e.message });
            }
            calls.push(entry);
        }
        if as_json {
            let line = json!({ "path": path.display().to_string(), "calls": calls });
            writeln!(out, "{line}")?;
        } else {
            writeln!(out, "{}: {} call(s)", path.display(), calls.len())?;
            for c in &calls {
                write!(
                    out,
                    "  line {:>4}  {:<10} {} {}",
                    c["line"],
                    c["status"].as_str().unwrap_or(""),
                    c["call_id"].as_str().unwrap_or(""),
                    c["name"].as_str().unwrap_or("?")
                )?;
                if let Some(e) = c.get("error") {
                    write!(
                        out,
                        "  {}: {}",
                        e["code"].as_str().unwrap_or(""),
                        e["message"].as_str().unwrap_or("")
                    )?;
                }
                writeln!(out)?;
            }
        }
    }
    Ok(if any_invalid { 1 } else { 0 })
}

fn report_unreadable(
    out: &mut impl Write,
    path: &Path,
    message: &str,
    as_json: bool,
) -> Result<()> {
    if as_json {
        let line = json!({ "path": path.display().to_string(), "calls": [], "error": { "code": "UNREADABLE", "message": message } });
        writeln!(out, "{line}")?;
    } else {
        writeln!(out, "{}: {message}", path.display())?;
    }
    Ok(())
}

fn tools(g: &GlobalArgs, as_json: bool, format: Option<ToolFormat>) -> Result<i32> {
    let config = load_lenient(g)?;
    let registry = registry_for(&config)?;
    let described = registry.describe();
    let list = described.as_array().cloned().unwrap_or_default();
    let out: Value = match format {
        Some(ToolFormat::Openai) => Value::Array(
            list.iter()
                .map(|t| json!({ "type": "function", "function": { "name": t["name"], "description": t["description"], "parameters": t["parameters"] } }))
                .collect(),
        ),
        Some(ToolFormat::Anthropic) => Value::Array(
            list.iter()
                .map(|t| json!({ "name": t["name"], "description": t["description"], "input_schema": t["parameters"] }))
                .collect(),
        ),
        None if as_json => described.clone(),
        None => {
            for t in &list {
                println!(
                    "{} ({})\n  {}\n  parameters: {}\n",
                    t["name"].as_str().unwrap_or(""),
                    t["effect"].as_str().unwrap_or(""),
                    t["description"].as_str().unwrap_or(""),
                    serde_json::to_string_pretty(&t["parameters"])?.replace('\n', "\n  ")
                );
            }
            return Ok(0);
        }
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(0)
}

const INIT_CONFIG: &str = include_str!("init_config.toml");
const WELCOME_NOTE: &str = include_str!("welcome.md");

fn init(dir: &Path) -> Result<i32> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let folders = config::Folders::default();
    let vault = crate::vault::Vault::new(dir.to_path_buf(), folders);
    vault.prepare()?;
    let config_path = dir.join(".vaultd.toml");
    let mut created = Vec::new();
    if !config_path.exists() {
        std::fs::write(&config_path, INIT_CONFIG)?;
        created.push(config_path.display().to_string());
    }
    let welcome = vault
        .folder(crate::vault::State::NeedsAction)
        .join("Welcome.md");
    // Welcome.md is written only into a fresh vault: once processed it lives in Done/.
    let any_note = crate::vault::State::ALL
        .iter()
        .any(|s| !vault.scan(*s).is_empty());
    if !any_note {
        std::fs::write(&welcome, WELCOME_NOTE)?;
        created.push(welcome.display().to_string());
    }
    if created.is_empty() {
        println!(
            "{} is already a vaultd vault; nothing changed",
            dir.display()
        );
    } else {
        for c in created {
            println!("created {c}");
        }
        println!(
            "run it with: vaultd run --vault {}",
            shell_quote(&dir.display().to_string())
        );
    }
    Ok(0)
}

fn shell_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-~".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn print_config(g: &GlobalArgs) -> Result<i32> {
    let c = load(g)?;
    let rl = |r: &config::RateLimit| json!({ "per_hour": r.per_hour, "per_day": r.per_day });
    let t = &c.tools;
    let email = match &t.send_notification.email.transport {
        config::EmailTransport::File { outbox } => {
            json!({ "transport": "file", "outbox": outbox.display().to_string() })
        }
        config::EmailTransport::Smtp {
            url,
            starttls,
            username,
            password,
        } => json!({
            "transport": "smtp", "smtp_url": url,
            "starttls": format!("{starttls:?}").to_lowercase(),
            "username": username,
            "password": password.as_ref().map(|p| format!("{} [redacted]", p.reference())),
        }),
    };
    let hooks = |m: &std::collections::BTreeMap<String, crate::secret::Secret>| {
        Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), json!(format!("{} [redacted]", v.reference()))))
                .collect(),
        )
    };
    let mut email = email;
    email["from"] = json!(t.send_notification.email.from);
    let effective = json!({
        "source": c.source.as_ref().map(|p| p.display().to_string()),
        "vault": c.vault.display().to_string(),
        "state_dir": c.state_dir.display().to_string(),
        "workers": c.workers,
        "max_calls_per_note": c.max_calls_per_note,
        "max_note_bytes": c.max_note_bytes,
        "shutdown_grace": humantime::format_duration(c.shutdown_grace).to_string(),
        "watch": match c.watch { config::WatchMode::Events => "events".to_string(), config::WatchMode::Poll(d) => format!("poll every {}", humantime::format_duration(d)) },
        "rescan_interval": humantime::format_duration(c.rescan_interval).to_string(),
        "folders": {
            "needs_action": c.folders.needs_action, "in_progress": c.folders.in_progress,
            "pending_approval": c.folders.pending_approval, "approved": c.folders.approved,
            "rejected": c.folders.rejected, "done": c.folders.done, "failed": c.folders.failed,
        },
        "tools": {
            "search_web": {
                "enabled": t.search_web.enabled,
                "provider": t.search_web.provider.as_str(),
                "base_url": t.search_web.base_url,
                "api_key": t.search_web.api_key.as_ref().map(|k| format!("{} [redacted]", k.reference())),
                "timeout": humantime::format_duration(t.search_web.timeout).to_string(),
                "rate_limit": rl(&t.search_web.rate_limit),
            },
            "send_notification": {
                "enabled": t.send_notification.enabled,
                "approval": format!("{:?}", t.send_notification.approval).to_lowercase(),
                "approval_via": format!("{:?}", t.send_notification.approval_via).to_lowercase(),
                "allowed_recipients": t.send_notification.allowed_recipients,
                "timeout": humantime::format_duration(t.send_notification.timeout).to_string(),
                "rate_limit": rl(&t.send_notification.rate_limit),
                "email": email,
                "slack": { "webhooks": hooks(&t.send_notification.slack) },
                "discord": { "webhooks": hooks(&t.send_notification.discord) },
            },
            "vault": t.vault.describe(),
        }
    });
    let redactor = daemon::redactor_for(&c);
    let text = serde_json::to_string_pretty(&effective)?;
    println!("{}", redactor.redact(&text));
    Ok(0)
}

fn open_journal(config: &Config) -> Result<crate::journal::Journal> {
    Ok(crate::journal::Journal::open(&config.state_dir)?)
}

fn status(g: &GlobalArgs, as_json: bool) -> Result<i32> {
    use crate::vault::{State, Vault};
    let config = load(g)?;
    let vault = Vault::new(config.vault.clone(), config.folders.clone());
    let journal = open_journal(&config)?;
    let daemon_pid = daemon::running_daemon(&config.vault);
    let counts: Vec<(State, usize)> = State::ALL
        .iter()
        .map(|s| (*s, vault.scan(*s).len()))
        .collect();
    let running = journal.running_calls()?;
    let failures = journal.recent_failures(10)?;
    let problems = journal.problems(10)?;
    let now = std::time::SystemTime::now();
    let hour = now - std::time::Duration::from_secs(3600);
    let day = now - std::time::Duration::from_secs(86_400);
    let registry = registry_for(&config)?;
    let mut rates = Vec::new();
    for t in registry.tools() {
        let used = journal.rate_use(t.name(), hour, day)?;
        rates.push(json!({
            "tool": t.name(),
            "last_hour": used.last_hour, "per_hour": t.policy.rate_limit.per_hour,
            "last_day": used.last_day, "per_day": t.policy.rate_limit.per_day,
        }));
    }
    if as_json {
        let v = json!({
            "vault": config.vault.display().to_string(),
            "daemon_pid": daemon_pid,
            "notes": counts.iter().map(|(s, n)| (s.as_str().to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "running": running,
            "recent_failures": failures,
            "problems": problems,
            "rate_limits": rates,
        });
        // The journal holds redacted text only; the redactor here is the last line of defence.
        let redactor = daemon::redactor_for(&config);
        println!("{}", redactor.redact(&serde_json::to_string_pretty(&v)?));
        return Ok(0);
    }
    println!("vault  {}", config.vault.display());
    match daemon_pid {
        Some(pid) => println!("daemon running (PID {pid})"),
        None => println!("daemon not running"),
    }
    println!("\nnotes");
    for (s, n) in &counts {
        println!("  {:<18} {n}", vault.folder_name(*s));
    }
    println!("\nrunning now");
    if running.is_empty() {
        println!("  nothing");
    }
    for e in &running {
        println!(
            "  {}  {}  {} for {} ms",
            e.note,
            e.call_id.as_deref().unwrap_or(""),
            e.tool.as_deref().unwrap_or(""),
            e.duration_ms.unwrap_or(0)
        );
    }
    println!("\nrecent failures");
    if failures.is_empty() {
        println!("  none");
    }
    let redactor = daemon::redactor_for(&config);
    for e in &failures {
        println!(
            "  {}  {}  {} {}: {}",
            e.time,
            e.note,
            e.tool.as_deref().unwrap_or(""),
            e.outcome.as_deref().unwrap_or(""),
            redactor.redact(e.detail.as_deref().unwrap_or(""))
        );
    }
    if !problems.is_empty() {
        println!("\nnotes vaultd cannot process");
        for e in &problems {
            println!(
                "  {}  {}: {}",
                e.time,
                e.note,
                redactor.redact(e.detail.as_deref().unwrap_or(""))
            );
        }
    }
    println!("\nrate limits");
    for r in &rates {
        let lim = |v: &Value| {
            v.as_u64()
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "  {:<18} {}/{} this hour, {}/{} today",
            r["tool"].as_str().unwrap_or(""),
            r["last_hour"],
            lim(&r["per_hour"]),
            r["last_day"],
            lim(&r["per_day"])
        );
    }
    Ok(0)
}

/// `vaultd approve` / `vaultd reject`: prints each decided call and where the note went.
fn decide(g: &GlobalArgs, note: &Path, decision: Decision) -> Result<i32> {
    let config = load(g)?;
    let outcome = match decision {
        Decision::Approved => crate::approval::approve(&config, note)?,
        Decision::Rejected => crate::approval::reject(&config, note)?,
    };
    let mut out = std::io::stdout().lock();
    for c in &outcome.decided {
        writeln!(
            out,
            "{} {} {} {}",
            decision.as_str(),
            c.call_id,
            c.name,
            Value::Object(c.parameters.clone())
        )?;
    }
    for id in &outcome.changed {
        writeln!(
            out,
            "not approved {id}: its parameters changed after the question was written; vaultd asks again"
        )?;
    }
    let daemon_note = match (decision, daemon::running_daemon(&config.vault)) {
        (Decision::Approved, Some(_)) if outcome.was_in_approved => {
            "; the running daemon sends it at its next full scan (rescan_interval)"
        }
        (Decision::Approved, Some(_)) => "; the running daemon sends it now",
        (Decision::Approved, None) => {
            "; it runs when vaultd next runs (`vaultd run` or `vaultd once`)"
        }
        (Decision::Rejected, _) => "",
    };
    writeln!(out, "note is now {}{daemon_note}", outcome.note)?;
    Ok(0)
}

fn log(
    g: &GlobalArgs,
    since: Option<String>,
    tool: Option<String>,
    note: Option<String>,
    limit: usize,
    as_json: bool,
) -> Result<i32> {
    let config = load(g)?;
    let journal = open_journal(&config)?;
    let since = match since {
        Some(s) => {
            let d = humantime::parse_duration(&s)
                .with_context(|| format!("--since {s}: not a duration like 30m, 1h, 2days"))?;
            Some(std::time::SystemTime::now() - d)
        }
        None => None,
    };
    let entries = journal.log(&crate::journal::LogFilter {
        since,
        tool,
        note,
        limit: Some(limit),
    })?;
    // The journal holds redacted text only; the redactor here is the last line of defence.
    let redactor = daemon::redactor_for(&config);
    let mut out = std::io::stdout().lock();
    for e in entries {
        if as_json {
            writeln!(out, "{}", redactor.redact(&serde_json::to_string(&e)?))?;
        } else {
            let mut line = format!("{}  {:<10} {}", e.time, e.event, e.note);
            for part in [&e.call_id, &e.tool, &e.outcome].into_iter().flatten() {
                line.push_str("  ");
                line.push_str(part);
            }
            if let Some(ms) = e.duration_ms {
                line.push_str(&format!("  {ms} ms"));
            }
            if let Some(d) = &e.detail {
                line.push_str("  ");
                line.push_str(d);
            }
            writeln!(out, "{}", redactor.redact(&line))?;
        }
    }
    Ok(0)
}

/// `vaultd undo`: the same undo code `vault_undo` runs (tools::vault::undo).
fn undo(
    g: &GlobalArgs,
    call_id: Option<String>,
    note: Option<PathBuf>,
    dry_run: bool,
    force: bool,
) -> Result<i32> {
    use crate::tools::vault::undo::{Target, note_key_of_arg, undo_from_cli};
    let config = load(g)?;
    let journal = open_journal(&config)?;
    let note_key = note.map(|n| note_key_of_arg(&config, &n));
    let target = match (call_id, note_key) {
        (Some(call_id), note_key) => Target::Call { call_id, note_key },
        (None, Some(note_key)) => Target::Note { note_key },
        (None, None) => anyhow::bail!("give a CALL_ID or --note NOTE"),
    };
    let mut out = std::io::stdout().lock();
    match undo_from_cli(&journal, &config.vault, &target, force, dry_run) {
        Ok(done) => {
            out.write_all(done.diff.as_bytes())?;
            match done.call_id {
                Some(id) => writeln!(
                    out,
                    "restored {}\nundo id {id} (vaultd undo {id} puts it back)",
                    done.restored.join(", ")
                )?,
                None => writeln!(out, "dry run: nothing changed")?,
            }
            Ok(0)
        }
        Err(e) => {
            if let Some(diff) = e.details.as_ref().and_then(|d| d["diff"].as_str()) {
                out.write_all(diff.as_bytes())?;
            }
            eprintln!("vaultd: {}: {}", e.code, e.message);
            Ok(1)
        }
    }
}
