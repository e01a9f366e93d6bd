//! The command line: `run | once | check | tools | init | status | log | approve | reject |
//! config`. Maps every failure to a message and an exit code; `anyhow` lives only here.

use crate::config::{self, Config, Overrides};
use crate::daemon::{self, Mode};
use crate::journal::Decision;
use crate::note::parse_note;
use crate::pipeline::plan::{self, Facts, Rules, Step};
use crate::secret::Redactor;
use crate::tools::Registry;
use crate::tools::mcp::McpSource;
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod mcp;

#[derive(Debug, Parser)]
#[command(
    name = "vaultd",
    version,
    about = "Runs the tool calls that agents write into markdown notes",
    after_help = EXAMPLES
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Taken by every subcommand (docs/design.md §8.8).
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

/// `vaultd --help`: the commands in the order of the loop, one example each.
const EXAMPLES: &str = "\
Examples, in the order of the loop:
  vaultd init ~/Notes                    create a vault with a welcome note
  vaultd run                             run the daemon (inside the vault: no --vault needed)
  vaultd once                            process everything pending, then exit
  vaultd check Needs_Action/a.md         lint a note: what would run, what is held, why
  vaultd tools --format openai           the tool list for an LLM API
  vaultd status                          notes per state, failures, rate limits
  vaultd approve report.md               approve the held calls of Pending_Approval/report.md
  vaultd reject report.md                reject them instead
  vaultd log --since 1h                  the journal of the last hour
  vaultd config                          the effective config, secrets redacted
  vaultd completions bash                shell completions (bash, zsh, fish, ...)
  vaultd mcp import .mcp.json            move MCP servers over from Claude Desktop, Claude Code, Cursor, goose

Without --vault, vaultd finds the vault by walking up from the current folder to the first
folder holding .vaultd.toml or Needs_Action/.";

/// One variant per command, declared in the order of the loop (which is the order of
/// `--help`); each is handled by one function in [`dispatch`].
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the folders, a commented config and a welcome note in DIR.
    #[command(after_help = "Example: vaultd init ~/Notes && cd ~/Notes && vaultd once")]
    Init {
        /// The vault folder to set up (created if missing); an existing vault is left as it is.
        dir: PathBuf,
    },
    /// Run the daemon in the foreground (systemd runs this).
    #[command(after_help = "Example: vaultd run --vault ~/Notes")]
    Run {
        #[command(flatten)]
        runner: RunnerArgs,
    },
    /// Process everything pending, then exit.
    #[command(after_help = "Example: vaultd once --vault ~/Notes")]
    Once {
        #[command(flatten)]
        runner: RunnerArgs,
    },
    /// Lint notes: what each call would do (run, held, denied), and why
    ///
    /// Parses and validates with the daemon's config and tools; runs nothing. Exits 1 when
    /// any call is invalid or denied.
    #[command(after_help = "Example: vaultd check Needs_Action/a.md --json")]
    Check {
        /// Notes: a path (from here or from the vault root) or a bare note name.
        #[arg(required = true)]
        notes: Vec<PathBuf>,
        /// One JSON object per note (JSON Lines).
        #[arg(long)]
        json: bool,
        /// Print what each pending call would do, as a note in Dry_Run/ gets it written
        /// (the tool, the exact parameters, whether it would run, be held or be denied);
        /// nothing runs and the note is not touched.
        #[arg(long)]
        preview: bool,
    },
    /// List the tools with their descriptions and JSON Schemas (MCP tools from the catalog
    /// the daemon last listed; no server is started).
    #[command(after_help = "Example: vaultd tools --format anthropic")]
    Tools {
        /// A JSON array of { name, description, effect, parameters } (parameters: the JSON
        /// Schema).
        #[arg(long)]
        json: bool,
        /// Print a ready-to-use tool list for an LLM API.
        #[arg(long, value_enum)]
        format: Option<ToolFormat>,
        /// Also list the MCP tools that may not run, and why: not in `allow`, or a server
        /// that never listed its tools.
        #[arg(long, conflicts_with = "format")]
        all: bool,
        #[command(subcommand)]
        action: Option<ToolsAction>,
    },
    /// Notes per state, running calls, recent failures and problems, rate-limit use.
    #[command(after_help = "Example: vaultd status --json")]
    Status {
        /// One JSON object with the same facts, for scripts and monitoring.
        #[arg(long)]
        json: bool,
    },
    /// Approve the held calls of a note in Pending_Approval/
    ///
    /// Approves exactly the parameters its questions show and moves the note to Approved/,
    /// where the daemon runs them.
    #[command(after_help = "Example: vaultd approve report.md")]
    Approve {
        /// The note: a path (from here or from the vault root) or a bare name of a held note.
        note: PathBuf,
    },
    /// Reject the held calls of a note in Pending_Approval/
    ///
    /// The held calls get REJECTED results and the note moves to Rejected/.
    #[command(after_help = "Example: vaultd reject report.md")]
    Reject {
        /// The note: a path (from here or from the vault root) or a bare name of a held note.
        note: PathBuf,
    },
    /// Show the journal: claims, calls, results, moves, problems.
    #[command(after_help = "Example: vaultd log --since 1h --tool send_notification")]
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
    /// Print the effective configuration, secrets redacted.
    #[command(after_help = "Example: vaultd config --config /etc/vaultd/config.toml")]
    Config,
    /// Print a shell completion script.
    #[command(
        after_help = "Example: vaultd completions bash > ~/.local/share/bash-completion/completions/vaultd"
    )]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Undo the vault changes of a call (or of every call of a note, newest first): each file
    /// is put back if it still is as the call left it.
    #[command(
        after_help = "Examples:\n  vaultd undo c-3f2a9c1b0d4e --dry-run   show what would be put back\n  vaultd undo c-3f2a9c1b0d4e             put back what that call changed\n  vaultd undo --note Done/report.md      undo every call of that note, newest first"
    )]
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
    /// Add MCP servers to the config, or import those of Claude Desktop, Claude Code, Cursor
    /// or goose.
    #[command(
        after_help = "Examples:\n  vaultd mcp add memory -- mcp-server-memory\n  vaultd mcp import ~/.config/Claude/claude_desktop_config.json"
    )]
    Mcp {
        #[command(subcommand)]
        action: mcp::McpAction,
    },
}

/// Synced vaults (docs/design.md §9.9).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct RunnerArgs {
    /// Run this vault from here although another vaultd (on a replica of a synced vault)
    /// worked on it recently: its notes up to now become history. Only when the other one is
    /// stopped or gone for good.
    #[arg(long)]
    pub take_over: bool,
    /// Start with a new, empty journal although this vault holds notes vaultd ran here (the
    /// journal was deleted or emptied): their pending send/write calls are held for approval.
    #[arg(long)]
    pub new_journal: bool,
}

#[derive(Debug, Subcommand)]
pub enum ToolsAction {
    /// Accept the definition an MCP server offers now for NAME (`mcp__SERVER__TOOL`): after a
    /// change (see the diff in `vaultd tools`) or for a tool that appeared later.
    Accept { name: String },
}

/// Parses the command line, runs it, returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run { .. } | Command::Once { .. }) {
        restore_sigpipe();
        ONE_SHOT.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            // vaultd's own multi-line messages (every unknown config key on its own line)
            // keep their lines; continuation lines are indented, so no text from a file or a
            // path can pass for a line of its own.
            let message = format!("{e:#}");
            let lines: Vec<String> = message.lines().map(escape_controls).collect();
            eprintln!("vaultd: {}", lines.join("\n  "));
            2
        }
    }
}

/// Output into a closed pipe (`vaultd log | head`) ends the process quietly, as `cat` does:
/// the Rust runtime ignores SIGPIPE, which turns every later print into a panic. The daemon
/// commands keep ignoring it: their output is the log, and a closed stderr must not kill a
/// running call.
fn restore_sigpipe() {
    // SAFETY: setting a signal's disposition to its default has no preconditions; it runs
    // before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Control characters in a printed path (a note named `a\nINFO forged.md`) are shown
/// escaped, so no name can forge a line of output or move the terminal's cursor.
pub fn escape_controls(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| match c {
            '\n' => "\\n".to_string(),
            '\r' => "\\r".to_string(),
            '\t' => "\\t".to_string(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}

fn overrides(g: &GlobalArgs) -> Overrides {
    Overrides {
        vault: g.vault.clone(),
        config: g.config.clone(),
        state_dir: g.state_dir.clone(),
        skip_secrets: false,
    }
}

fn dispatch(cli: Cli) -> Result<i32> {
    let g = cli.global;
    match cli.command {
        Command::Init { dir } => init(&dir),
        Command::Run { runner } => serve(&g, Mode::Run, runner),
        Command::Once { runner } => serve(&g, Mode::Once, runner),
        Command::Check {
            notes,
            json,
            preview: true,
        } => preview(&g, &notes, json),
        Command::Check { notes, json, .. } => check(&g, &notes, json),
        Command::Tools {
            action: Some(ToolsAction::Accept { name }),
            ..
        } => accept_tool(&g, &name),
        Command::Tools {
            json, format, all, ..
        } => tools(&g, json, format, all),
        Command::Status { json } => status(&g, json),
        Command::Approve { note } => decide(&g, &note, Decision::Approved),
        Command::Reject { note } => decide(&g, &note, Decision::Rejected),
        Command::Log {
            since,
            tool,
            note,
            limit,
            json,
        } => log(&g, since, tool, note, limit, json),
        Command::Config => print_config(&g),
        Command::Completions { shell } => completions(shell),
        Command::Undo {
            call_id,
            note,
            dry_run,
            force,
        } => undo(&g, call_id, note, dry_run, force),
        Command::Mcp { action } => mcp::run(&g, action),
    }
}

fn completions(shell: clap_complete::Shell) -> Result<i32> {
    use clap::CommandFactory;
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut Cli::command(), "vaultd", &mut out);
    out.flush()?;
    Ok(0)
}

/// The one validation every command goes through: the config file (every key, every value)
/// and the tools built from it, so `vaultd config` refuses exactly what `vaultd once` would
/// (secrets aside: it names those it cannot read here in a warning).
fn validated(o: &Overrides) -> Result<(Config, Registry)> {
    let config = config::load(o)?;
    if ONE_SHOT.load(std::sync::atomic::Ordering::Relaxed) {
        init_warnings(&config);
    }
    let registry = registry_for(&config)?;
    Ok((config, registry))
}

/// Set for every command but `run` and `once` (which set up their own logging from the config).
static ONE_SHOT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What a one-shot command logs: warnings only (a journal adopted into the vault's own state
/// folder, a runner id that could not be copied), through the config's redactor, without
/// timestamps. Before, such commands had no logger and said nothing of what they changed.
fn init_warnings(config: &Config) {
    let writer = RedactingStderr(Arc::new(daemon::redactor_for(config)), false);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn,rmcp=error"))
        .with_writer(writer)
        .with_ansi(false)
        .with_target(false)
        .without_time()
        .try_init();
}

/// For commands that run no tool (`status`, `log`, `config`): a secret that cannot be read
/// here stays an unresolved reference, named in a warning.
fn validated_without_secrets(g: &GlobalArgs) -> Result<(Config, Registry)> {
    let (config, registry) = validated(&read_only(g))?;
    warn_unresolved(&config);
    Ok((config, registry))
}

/// What the commands that run no tool load: every secret that can be read (so the redactor
/// knows it), the others left unresolved.
fn read_only(g: &GlobalArgs) -> Overrides {
    Overrides {
        skip_secrets: true,
        ..overrides(g)
    }
}

/// One warning line on stderr naming the secrets a command that runs no tool could not read
/// here: it works without them, `run` and `once` would refuse to start.
fn warn_unresolved(config: &Config) {
    let unset = config.unresolved_secrets();
    if unset.is_empty() {
        return;
    }
    let list: Vec<String> = unset
        .iter()
        .map(|(reference, why)| format!("{reference} ({why})"))
        .collect();
    eprintln!(
        "vaultd: warning: {} secret(s) not available here, not needed by this command (`vaultd run` and `vaultd once` need them): {}",
        unset.len(),
        escape_controls(&list.join("; "))
    );
}

fn load(g: &GlobalArgs) -> Result<(Config, Registry)> {
    validated(&overrides(g))
}

/// The config for commands that work without a vault (`check`, `tools`): the current folder
/// stands in for a missing vault.
/// They run no tool: secrets that cannot be read here are named in a warning, not refused.
fn load_lenient(g: &GlobalArgs) -> Result<(Config, Registry)> {
    let (config, registry) = match config::load(&read_only(g)) {
        Err(config::ConfigError::NoVault { .. }) => {
            let mut o = read_only(g);
            o.vault = Some(std::env::current_dir()?);
            validated(&o)?
        }
        Err(e) => return Err(e.into()),
        Ok(config) => {
            let registry = registry_for(&config)?;
            (config, registry)
        }
    };
    warn_unresolved(&config);
    Ok((config, registry))
}

fn serve(g: &GlobalArgs, mode: Mode, runner: RunnerArgs) -> Result<i32> {
    let (config, _) = load(g)?;
    let redactor = Arc::new(daemon::redactor_for(&config));
    init_tracing(redactor.clone(), g.log_format);
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (grace, lock) = (config.shutdown_grace, config.vault.join(".vaultd.lock"));
    let outcome = runtime.block_on(async move {
        let signal = shutdown_signal();
        let shutdown = async move {
            signal.await;
            exit_if_shutdown_hangs(grace, lock);
        };
        daemon::run_vault(
            config,
            mode,
            runner.take_over,
            runner.new_journal,
            redactor,
            shutdown,
        )
        .await
        .map_err(anyhow::Error::from)
    });
    // docs/design.md §9.15: a blocking-pool thread stuck in a read (a FIFO, a hung device) must not
    // keep the process alive: the runtime is not waited for beyond a moment.
    runtime.shutdown_timeout(SHUTDOWN_LEFTOVERS);
    outcome?;
    Ok(0)
}

/// How long a finished `run`/`once` waits for blocking-pool threads still in a call.
const SHUTDOWN_LEFTOVERS: std::time::Duration = std::time::Duration::from_secs(2);

/// Past `shutdown_grace` plus this, a shutdown that still has not ended exits anyway.
const SHUTDOWN_BACKSTOP: std::time::Duration = std::time::Duration::from_secs(8);

/// docs/design.md §9.15: SIGTERM and SIGINT end `run` within `shutdown_grace` plus a few seconds,
/// whatever a tool or file is doing. The drain already stops waiting after the grace; this
/// thread is the backstop for anything that still holds the process (a stuck thread, a child
/// that ignores its signals): it exits with status 1, saying so. Recovery at the next start
/// finishes what was interrupted (the journal knows which calls started). The lock file is
/// removed as a normal exit does (§9.5; the `flock` goes with the process).
fn exit_if_shutdown_hangs(grace: std::time::Duration, lock: PathBuf) {
    let spawned = std::thread::Builder::new()
        .name("shutdown-backstop".into())
        .spawn(move || {
            std::thread::sleep(grace + SHUTDOWN_BACKSTOP);
            tracing::error!(
                "shutdown did not end within shutdown_grace + {}s (a tool or a read that does not return); exiting now, interrupted calls are finished at the next start",
                SHUTDOWN_BACKSTOP.as_secs()
            );
            let _ = std::fs::remove_file(&lock);
            std::process::exit(1);
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the shutdown backstop: {e}");
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed now, inside the runtime, not on
/// the first poll: the daemon polls this only from its main loop, and until then a SIGTERM
/// (systemd stopping the unit during start-up) would kill the process instead of waiting.
fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler can be installed");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler can be installed");
    // SIGHUP's default action would kill the daemon mid-call: caught from here on. `run`
    // reloads the config on it (daemon::reload, which has its own handler); here it is only
    // acknowledged.
    let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler can be installed");
    async move {
        loop {
            tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); return }
                _ = int.recv() => { tracing::info!("SIGINT: shutting down"); return }
                _ = hup.recv() => {}
            }
        }
    }
}

/// Logs go to stderr through the redactor: plain lines without colours or timestamps under
/// systemd's journal, colours on a terminal, JSON with `--log-format json`.
pub fn init_tracing(redactor: Arc<Redactor>, format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    // rmcp logs every session's start at INFO with a dump of the peer's whole description;
    // vaultd says what matters in one line of its own ("MCP server is up: NAME VERSION, …").
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rmcp=warn"));
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let ansi = std::io::stderr().is_terminal() && !under_journal;
    let writer = RedactingStderr(redactor, ansi);
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

/// A stderr writer that passes every log line through the redactor and escapes control
/// characters (a note named with a line break must not forge a log line). The second field
/// says whether the line carries our own colour codes (ESC is then kept).
#[derive(Clone)]
struct RedactingStderr(Arc<Redactor>, bool);

struct RedactingLine(Arc<Redactor>, bool);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactingStderr {
    type Writer = RedactingLine;
    fn make_writer(&'a self) -> RedactingLine {
        RedactingLine(self.0.clone(), self.1)
    }
}

/// One formatted log line with every control character inside it escaped; its final line
/// break stays.
fn escape_log_line(line: &str, keep_esc: bool) -> String {
    let (body, end) = match line.strip_suffix('\n') {
        Some(b) => (b, "\n"),
        None => (line, ""),
    };
    if !body
        .chars()
        .any(|c| c.is_control() && c != '\t' && !(keep_esc && c == '\u{1b}'))
    {
        return line.to_string();
    }
    let mut out = String::with_capacity(line.len() + 8);
    for c in body.chars() {
        match c {
            '\t' => out.push(c),
            '\u{1b}' if keep_esc => out.push(c),
            c if c.is_control() => out.push_str(&escape_controls(&c.to_string())),
            c => out.push(c),
        }
    }
    out.push_str(end);
    out
}

impl Write for RedactingLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let line = escape_log_line(&self.0.redact(&text), self.1);
        std::io::stderr().write_all(line.as_bytes())?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// The built-in, vault and command tools: building them is the one validation every command
/// shares. Opens no journal (a command refused at start must leave no state behind).
fn registry_for(config: &Config) -> Result<Registry> {
    Ok(Registry::from_config(
        &config.tools,
        daemon::http_client()?,
        None,
    )?)
}

/// Every tool, MCP tools from the journal's catalog (no server is started). The journal is
/// opened only when MCP servers are configured.
fn mcp_registry_for(
    config: &Config,
) -> Result<(Registry, McpSource, Option<Arc<crate::journal::Journal>>)> {
    let mut registry = Registry::from_config(&config.tools, daemon::http_client()?, None)?;
    if config.mcp.is_empty() {
        return Ok((registry, McpSource::none(), None));
    }
    let journal = Arc::new(open_journal(config)?);
    let mcp = McpSource::offline(&config.mcp, journal.clone());
    mcp.register(&mut registry)?;
    Ok((registry, mcp, Some(journal)))
}

/// `vaultd tools accept NAME`.
fn accept_tool(g: &GlobalArgs, name: &str) -> Result<i32> {
    let (config, _) = load_lenient(g)?;
    let Some((server, tool)) = crate::tools::mcp::split_name(name) else {
        anyhow::bail!(
            "`{name}` is not an MCP tool name (mcp__SERVER__TOOL); only MCP tool definitions are pinned"
        );
    };
    if !config.mcp.iter().any(|s| s.name == server) {
        anyhow::bail!("no MCP server `{server}` in the config (add [mcp.{server}])");
    }
    let journal = open_journal(&config)?;
    if !journal.accept_mcp_tool(server, tool)? {
        anyhow::bail!(
            "MCP server `{server}` has not listed a tool `{tool}` (is it in mcp.{server}.allow, and has the daemon run since it appeared?)"
        );
    }
    println!("accepted the current definition of {name}; its calls run again");
    Ok(0)
}

/// A NOTE argument: a path from the current folder, a path from the vault root, or a bare
/// note name (`report` or `report.md`) that matches exactly one note in `folders`.
fn resolve_note(config: &Config, arg: &Path, folders: &[crate::vault::State]) -> Result<PathBuf> {
    use crate::vault::Vault;
    if arg.is_file() {
        return Ok(arg.to_path_buf());
    }
    let from_root = config.vault.join(arg);
    if from_root.is_file() {
        return Ok(from_root);
    }
    let vault = Vault::new(config.vault.clone(), config.folders.clone());
    for state in folders {
        let in_folder = vault.folder(*state).join(arg);
        if in_folder.is_file() {
            return Ok(in_folder);
        }
    }
    let shown = escape_controls(&arg.display().to_string());
    let is_bare = arg.components().count() == 1;
    if !is_bare {
        anyhow::bail!(
            "no note {shown}: not a file here or in the vault {}",
            config.vault.display()
        );
    }
    let name = arg.to_string_lossy();
    let wanted = [name.to_string(), format!("{name}.md")];
    let matches: Vec<PathBuf> = folders
        .iter()
        .flat_map(|s| vault.scan(*s))
        .filter(|p| {
            p.file_name()
                .is_some_and(|f| wanted.iter().any(|w| f.to_string_lossy() == *w))
        })
        .collect();
    let where_ = folders
        .iter()
        .map(|s| format!("{}/", vault.folder_name(*s)))
        .collect::<Vec<_>>()
        .join(", ");
    match matches.as_slice() {
        [one] => Ok(one.clone()),
        [] => anyhow::bail!(
            "no note named {shown} in {where_} of the vault {}",
            config.vault.display()
        ),
        many => {
            let list: Vec<String> = many
                .iter()
                .map(|p| escape_controls(&vault.relative(p)))
                .collect();
            anyhow::bail!(
                "{shown} names {} notes: {}; give one of these paths (nothing was done)",
                many.len(),
                list.join(", ")
            )
        }
    }
}

/// What would happen to a call that is still pending, as the daemon's plan decides it (docs/design.md
/// §12.1's decision): its `check` status, the decision and the error when it is not run.
fn decision_of(step: &Step) -> (&'static str, Value, Option<&crate::call::CallError>) {
    fn not_run<'a>(
        action: &str,
        r: &'a crate::call::CallResult,
    ) -> (&'static str, Value, Option<&'a crate::call::CallError>) {
        let e = r.outcome.as_ref().err();
        let reason = e.map_or("", |e| e.message.as_str());
        ("invalid", json!({ "action": action, "reason": reason }), e)
    }
    match step {
        Step::Run(_) => ("pending", json!({ "action": "run" }), None),
        Step::Ask(h) | Step::Waiting(h) => (
            "pending",
            json!({ "action": "held", "reason": h.reason }),
            None,
        ),
        Step::Denied(r) => not_run("denied", r),
        Step::Fail(r) => not_run("invalid", r),
        Step::Recorded(_) => ("done", Value::Null, None),
    }
}

fn check(g: &GlobalArgs, notes: &[PathBuf], as_json: bool) -> Result<i32> {
    use crate::vault::State;
    let (config, _) = load_lenient(g)?;
    let (registry, _mcp, journal) = mcp_registry_for(&config)?;
    let mut any_invalid = false;
    // MCP servers whose tools the checked calls use: their catalog's age is shown at the end.
    let mut mcp_servers = std::collections::BTreeSet::new();
    let mut out = std::io::stdout().lock();
    for arg in notes {
        let path = match resolve_note(&config, arg, &State::ALL) {
            Ok(p) => p,
            Err(e) => {
                any_invalid = true;
                report_unreadable(&mut out, arg, &format!("{e:#}"), as_json)?;
                continue;
            }
        };
        let path = path.as_path();
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
        for call in &parsed.calls {
            if let Some((server, _)) = call.name.as_deref().and_then(crate::tools::mcp::split_name)
                && config.mcp.iter().any(|s| s.name == server)
            {
                mcp_servers.insert(server.to_string());
            }
        }
        let calls = checked_calls(&parsed, &registry);
        any_invalid |= calls.iter().any(|c| c["status"] == "invalid");
        let shown = escape_controls(&path.display().to_string());
        if as_json {
            let mut line = json!({ "path": path.display().to_string(), "calls": calls });
            if !calls.is_empty() && calls.iter().all(|c| c["status"] == "done") {
                line["message"] = json!(crate::note::NOTHING_PENDING);
            }
            writeln!(out, "{line}")?;
        } else {
            print_checked(&mut out, &shown, &calls)?;
        }
    }
    if let (false, Some(journal)) = (as_json, &journal) {
        print_catalog_ages(&mut out, journal, &mcp_servers)?;
    }
    Ok(if any_invalid { 1 } else { 0 })
}

/// `vaultd check`'s entry for every call of a note: done, or what the daemon's plan decides.
fn checked_calls(parsed: &crate::note::ParsedNote, registry: &Registry) -> Vec<Value> {
    let plan = plan::plan(parsed, registry, &Rules::check(), &Facts::default());
    let steps: std::collections::HashMap<&str, &Step> =
        plan.steps.iter().map(|(id, s)| (id.as_str(), s)).collect();
    let mut calls = Vec::new();
    for call in &parsed.calls {
        let mut entry = json!({
            "call_id": call.call_id,
            "name": call.name,
            "line": call.line,
        });
        if let Some(step) = steps.get(call.call_id.as_str()) {
            let (status, decision, error) = decision_of(step);
            entry["status"] = json!(status);
            entry["decision"] = decision;
            if let Some(e) = error {
                entry["error"] = json!({ "code": e.code.as_str(), "message": e.message });
            }
        } else {
            // Its result is in the note: it does not run again until that result is deleted.
            entry["status"] = json!("done");
            if let Some(r) = parsed.results.iter().find(|r| r.call_id == call.call_id) {
                entry["result"] = match &r.error {
                    Some((code, message)) => {
                        json!({ "ok": false, "code": code, "message": message })
                    }
                    None => json!({ "ok": r.ok }),
                };
            }
        }
        calls.push(entry);
    }
    calls
}

fn print_checked(out: &mut impl Write, shown: &str, calls: &[Value]) -> Result<()> {
    writeln!(out, "{shown}: {} call(s)", calls.len())?;
    if !calls.is_empty() && calls.iter().all(|c| c["status"] == "done") {
        writeln!(out, "  {}", crate::note::NOTHING_PENDING)?;
    }
    for c in calls {
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
        match c["decision"]["action"].as_str() {
            Some("run") => write!(out, "\n        -> runs")?,
            Some("held") => write!(
                out,
                "\n        -> held for approval: {}",
                c["decision"]["reason"].as_str().unwrap_or("")
            )?,
            Some("denied") => write!(
                out,
                "\n        -> denied: {}",
                c["decision"]["reason"].as_str().unwrap_or("")
            )?,
            Some(_) => write!(out, "\n        -> not run: the call is invalid")?,
            None => match c["result"]["ok"].as_bool() {
                Some(true) => write!(out, "\n        -> has its result: ok")?,
                Some(false) => write!(
                    out,
                    "\n        -> has its result: failed {}: {}",
                    c["result"]["code"].as_str().unwrap_or("?"),
                    c["result"]["message"].as_str().unwrap_or("")
                )?,
                None => {}
            },
        }
        writeln!(out)?;
    }
    Ok(())
}

/// When each MCP server the checked calls use last listed its tools.
fn print_catalog_ages(
    out: &mut impl Write,
    journal: &crate::journal::Journal,
    servers: &std::collections::BTreeSet<String>,
) -> Result<()> {
    for server in servers {
        match journal.mcp_catalog(server)? {
            Some(c) => writeln!(
                out,
                "MCP server `{server}`: tools as it listed them at {}",
                c.listed_at
            )?,
            None => writeln!(
                out,
                "MCP server `{server}`: never listed yet (start the daemon once to know its tools)"
            )?,
        }
    }
    Ok(())
}

/// `vaultd check --preview`: the `tool_preview` of every pending call, exactly as a note in
/// Dry_Run/ gets it, printed instead of written. Exit 1 when a call would be denied.
fn preview(g: &GlobalArgs, notes: &[PathBuf], as_json: bool) -> Result<i32> {
    let (config, _) = load_lenient(g)?;
    let (registry, _, _) = mcp_registry_for(&config)?;
    let redactor = daemon::redactor_for(&config);
    // What a running daemon records: its open circuits.
    let circuits = crate::guard::breaker::read_state_file(
        &config.state_dir,
        daemon::running_daemon(&config.vault),
    );
    let journal = preview_journal(&config)?;
    let vault = crate::vault::Vault::new(config.vault.clone(), config.folders.clone());
    let mut any_denied = false;
    let mut out = std::io::stdout().lock();
    for path in notes {
        let text = match std::fs::read(path).map(String::from_utf8) {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => {
                any_denied = true;
                report_unreadable(&mut out, path, "note is not UTF-8", as_json)?;
                continue;
            }
            Err(e) => {
                any_denied = true;
                report_unreadable(&mut out, path, &format!("cannot read: {e}"), as_json)?;
                continue;
            }
        };
        let parsed = parse_note(&text);
        let note = path.display().to_string();
        // The daemon's plan of this note, with the journal's facts (docs/design.md §12.1): a
        // note in Approved/ is planned as the daemon claims it from there.
        let in_approved = [path.canonicalize(), std::path::absolute(path)]
            .into_iter()
            .flatten()
            .find_map(|abs| vault.locate(&abs))
            .is_some_and(|(state, _)| state == crate::vault::State::Approved);
        let rules = Rules::for_config(&config, in_approved);
        let facts = match &journal {
            Some(j) => {
                let note_id = crate::note::frontmatter_property(&text, "tool_note");
                let questions = if config.approval_via == crate::config::ApprovalVia::Cli {
                    Facts::questions(&parsed)
                } else {
                    Vec::new()
                };
                crate::guard::dry_run::journal_facts(j, note_id, &questions)?
            }
            None => Facts::default(),
        };
        let plan = plan::plan(&parsed, &registry, &rules, &facts);
        let shown = crate::guard::dry_run::Shown {
            registry: &registry,
            redactor: &redactor,
            note: &note,
            circuits: &circuits,
            max_calls: config.max_calls_per_note,
        };
        // Every pending call, even one a dry run already previewed in the note.
        let previews = crate::guard::dry_run::previews(&shown, &parsed, &plan, &Default::default());
        any_denied |= previews.iter().any(|p| p["decision"]["action"] == "deny");
        if as_json {
            let line = json!({ "path": note, "previews": previews });
            writeln!(out, "{}", redactor.redact(&line.to_string()))?;
        } else {
            writeln!(out, "{note}: {} pending call(s)", previews.len())?;
            for p in &previews {
                let lines = crate::note::render::preview_callout(p);
                writeln!(out, "{}", redactor.redact(&lines.join("\n")))?;
            }
        }
    }
    Ok(if any_denied { 1 } else { 0 })
}

/// The journal `check --preview` reads its facts from, opened only when the vault has one:
/// previewing a note must not create a state dir.
fn preview_journal(config: &Config) -> Result<Option<crate::journal::Journal>> {
    if !config.state_dir.join(crate::state::JOURNAL_FILE).exists() {
        return Ok(None);
    }
    Ok(Some(open_journal(config)?))
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
        writeln!(
            out,
            "{}: {message}",
            escape_controls(&path.display().to_string())
        )?;
    }
    Ok(())
}

fn tools(g: &GlobalArgs, as_json: bool, format: Option<ToolFormat>, all: bool) -> Result<i32> {
    let (config, _) = load_lenient(g)?;
    let (registry, mcp, journal) = mcp_registry_for(&config)?;
    let not_usable = if all {
        mcp::not_usable(&config, journal.as_deref())?
    } else {
        Vec::new()
    };
    let mut described = registry.describe();
    if let Some(list) = described.as_array_mut() {
        for t in list.iter_mut() {
            let name = t["name"].as_str().unwrap_or("").to_string();
            if let Some(extra) = journal.as_ref().and_then(|j| mcp.describe(j, &name)) {
                t["mcp"] = extra;
            }
        }
    }
    let mut list = described.as_array().cloned().unwrap_or_default();
    if format.is_some() {
        list = only_runnable(list);
    }
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
        None if as_json => {
            let mut all = described.as_array().cloned().unwrap_or_default();
            all.extend(not_usable);
            Value::Array(all)
        }
        None => {
            let mut out = std::io::stdout().lock();
            for t in &list {
                writeln!(
                    out,
                    "{} ({}, {}, approval: {})\n  {}",
                    t["name"].as_str().unwrap_or(""),
                    t["source"].as_str().unwrap_or(""),
                    t["effect"].as_str().unwrap_or(""),
                    t["approval"].as_str().unwrap_or(""),
                    t["description"].as_str().unwrap_or(""),
                )?;
                if let Some(m) = t.get("mcp") {
                    writeln!(out, "  definition: {}", m["pin"].as_str().unwrap_or(""))?;
                    if !m["annotations"].is_null() {
                        println!(
                            "  annotations (hints from the server, not trusted): {}",
                            m["annotations"]
                        );
                    }
                    if let Some(at) = m["catalog_refreshed_at"].as_str() {
                        println!("  listed by the server at {at}");
                    }
                    if let Some(diff) = m["diff"].as_str() {
                        println!("  {}", diff.trim_end().replace('\n', "\n  "));
                    }
                }
                writeln!(
                    out,
                    "  parameters: {}\n",
                    serde_json::to_string_pretty(&t["parameters"])?.replace('\n', "\n  ")
                )?;
                if let Some(status) = t["details"]["sandbox_status"].as_str() {
                    writeln!(out, "  sandbox: {status} (sandbox = {})\n", t["details"]["sandbox"])?;
                } else if let Some(sandbox) = t["details"]["sandbox"].as_str() {
                    // An MCP server's: one line saying how it is confined, or that it is not.
                    writeln!(out, "  sandbox: {sandbox}\n")?;
                }
                if let Some(why) = t["details"]["unusable"].as_str() {
                    writeln!(out, "  UNUSABLE: {why}\n")?;
                }
            }
            if all {
                mcp::print_not_usable(&mut out, &not_usable)?;
            }
            return Ok(0);
        }
    };
    writeln!(
        std::io::stdout().lock(),
        "{}",
        serde_json::to_string_pretty(&out)?
    )?;
    Ok(0)
}

/// The ready-to-use list for a model (`--format openai|anthropic`, docs/design.md §10.4) carries only
/// definitions whose calls may run: an MCP tool changed since accepted (or new, never
/// accepted) or any unusable tool is left out and named on stderr, so an unaccepted
/// description never reaches the model.
fn only_runnable(list: Vec<Value>) -> Vec<Value> {
    let (runnable, left_out): (Vec<Value>, Vec<Value>) = list.into_iter().partition(|t| {
        let mcp = t["source"].as_str().is_some_and(|s| s.starts_with("mcp:"));
        t["details"]["unusable"].is_null() && (!mcp || t["mcp"]["may_run"] == json!(true))
    });
    for t in &left_out {
        let why = t["details"]["unusable"]
            .as_str()
            .map(|w| format!("unusable: {w}"))
            .or_else(|| t["mcp"]["pin"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "its definition's state is unknown".to_owned());
        eprintln!(
            "left out {}: {}",
            escape_controls(t["name"].as_str().unwrap_or("")),
            escape_controls(&why)
        );
    }
    runnable
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
    if std::fs::symlink_metadata(&config_path).is_err() {
        // §9.5: the config may name secrets' files; private whatever the umask.
        use std::io::Write;
        crate::private::create_new_file(&config_path)
            .and_then(|mut f| f.write_all(INIT_CONFIG.as_bytes()))
            .with_context(|| format!("cannot write {}", config_path.display()))?;
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
            "next: cd {} && vaultd once   (or `vaultd run` for the daemon; inside the vault no --vault is needed)",
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
    let (c, _) = validated_without_secrets(g)?;
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
        "settle": humantime::format_duration(c.settle).to_string(),
        "settle_max": humantime::format_duration(c.settle_max).to_string(),
        "stale_copy_grace": humantime::format_duration(c.stale_copy_grace).to_string(),
        "stale_copy_window": humantime::format_duration(c.stale_copy_window).to_string(),
        "runner_window": humantime::format_duration(c.runner_window).to_string(),
        "approval_via": c.approval_via.as_str(),
        "folders": {
            "needs_action": c.folders.needs_action, "in_progress": c.folders.in_progress,
            "pending_approval": c.folders.pending_approval, "approved": c.folders.approved,
            "rejected": c.folders.rejected, "done": c.folders.done, "failed": c.folders.failed,
            "dry_run": c.folders.dry_run,
        },
        "note_budget": c.guard.note_budget,
        "notify": { "on_hold": c.guard.on_hold.as_ref().map(|h| json!({ "method": h.method, "recipient": h.recipient })), "on_hold_per_hour": c.guard.on_hold_per_hour },
        "circuit_breaker": { "failures": c.guard.breaker.failures, "open_for": humantime::format_duration(c.guard.breaker.open_for).to_string() },
        "tools": c.tools.describe(),
    });
    let mut effective = effective;
    effective["max_result_bytes"] = json!(c.max_result_bytes);
    effective["folders"]["tool_results"] = json!(c.tool_results);
    effective["mcp"] = crate::tools::mcp::config::describe(&c.mcp);
    let redactor = daemon::redactor_for(&c);
    let text = serde_json::to_string_pretty(&effective)?;
    println!("{}", redactor.redact(&text));
    Ok(0)
}

fn open_journal(config: &Config) -> Result<crate::journal::Journal> {
    Ok(crate::state::open_journal(config)?)
}

fn status(g: &GlobalArgs, as_json: bool) -> Result<i32> {
    use crate::vault::{State, Vault};
    let (config, registry) = validated_without_secrets(g)?;
    let vault = Vault::new(config.vault.clone(), config.folders.clone());
    let journal = open_journal(&config)?;
    let daemon_pid = daemon::running_daemon(&config.vault);
    let counts: Vec<(State, usize)> = State::ALL
        .iter()
        .map(|s| (*s, vault.scan(*s).len()))
        .collect();
    // Counted in Needs_Action/ but waiting for nobody: every call has its result.
    let nothing_pending: Vec<String> = vault
        .scan(State::NeedsAction)
        .into_iter()
        .filter(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.len() <= config.max_note_bytes)
                && std::fs::read_to_string(p).is_ok_and(|t| parse_note(&t).nothing_pending())
        })
        .map(|p| vault.relative(&p))
        .collect();
    // Only notes really in In_Progress now: a run whose note was moved away by hand (or a
    // daemon that died) leaves calls in the journal that are running nowhere.
    let in_progress = vault.folder(State::InProgress);
    let running: Vec<_> = journal
        .running_calls()?
        .into_iter()
        .filter(|e| {
            let p = vault.root().join(&e.note);
            p.starts_with(&in_progress) && p.is_file()
        })
        .collect();
    let circuits = crate::guard::breaker::read_state_file(&config.state_dir, daemon_pid);
    let mcp_servers = mcp::server_states(&config, &journal, &circuits)?;
    let runner = crate::synced::RunnerId::load(&config.state_dir);
    let pause = journal.pause()?;
    let storage_pause = crate::state::storage_pause(&config.state_dir, daemon_pid);
    let failures = journal.recent_failures(10)?;
    let failed_notes_now = notes_now(&vault, &failures);
    let problems = journal.problems(10)?;
    let now = std::time::SystemTime::now();
    let hour = now - std::time::Duration::from_secs(3600);
    let day = now - std::time::Duration::from_secs(86_400);
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
            "nothing_pending": nothing_pending,
            "running": running,
            "recent_failures": failures.iter().zip(&failed_notes_now).map(|(f, now)| {
                let mut v = json!(f);
                v["now"] = json!(now);
                v
            }).collect::<Vec<_>>(),
            "problems": problems,
            "rate_limits": rates,
            "open_circuits": circuits,
            "mcp_servers": mcp_servers,
            "runner": runner.as_ref().map(|r| r.to_string()),
            "state_dir": config.state_dir.display().to_string(),
            "storage_paused": storage_pause,
            "paused": pause.as_ref().map(|p| json!({
                "host": crate::synced::host_of(&p.other),
                "runner": p.other,
                "note": p.note,
                "since": humantime::format_rfc3339_seconds(p.at).to_string(),
                "how_to_resume": crate::synced::how_to_resume(crate::synced::host_of(&p.other)),
            })),
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
    match &runner {
        Some(r) => println!("runner {r} (the tool_runner of the notes this daemon claims)"),
        None => println!("runner none yet (made at the first start)"),
    }
    println!("state  {}", config.state_dir.display());
    if let Some(why) = &storage_pause {
        println!("{}", escape_controls(why));
    }
    if let Some(p) = &pause {
        let host = crate::synced::host_of(&p.other);
        println!(
            "paused: second runner on {host} (vaultd {} updated {} ; seen at {}); nothing new is claimed. To resume, {}",
            p.other,
            escape_controls(&p.note),
            humantime::format_rfc3339_seconds(p.at),
            crate::synced::how_to_resume(host)
        );
    }
    println!("\nnotes");
    let width = State::ALL
        .iter()
        .map(|s| vault.folder_name(*s).chars().count())
        .max()
        .unwrap_or(0);
    for (s, n) in &counts {
        println!("  {:<width$} {n}", vault.folder_name(*s));
    }
    if !nothing_pending.is_empty() {
        let shown: Vec<String> = nothing_pending
            .iter()
            .take(10)
            .map(|n| escape_controls(n))
            .collect();
        let more = nothing_pending.len().saturating_sub(shown.len());
        println!(
            "  {} of them with {}: {}{}",
            nothing_pending.len(),
            crate::note::NOTHING_PENDING,
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
    }
    println!("\nrunning now");
    if running.is_empty() {
        println!("  nothing");
    }
    for e in &running {
        println!(
            "  {}  {}  {} for {} ms",
            escape_controls(&e.note),
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
    for (f, now) in failures.iter().zip(&failed_notes_now) {
        let e = &f.entry;
        // Where the note is now, not In_Progress/ where the call ran (it was moved on since).
        let note = match now {
            Some(now) => escape_controls(now),
            None => format!(
                "{} (moved since; not in the vault's folders)",
                escape_controls(f.moved_to.as_deref().unwrap_or(&e.note))
            ),
        };
        println!(
            "  {}  {note}  {} {}: {}",
            e.time,
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
                escape_controls(&e.note),
                redactor.redact(e.detail.as_deref().unwrap_or(""))
            );
        }
    }
    if !circuits.is_empty() {
        println!("\nopen circuits");
        let width = circuits
            .iter()
            .map(|c| c.key.chars().count())
            .max()
            .unwrap_or(0);
        for c in &circuits {
            println!(
                "  {:<width$} {}{}  after {} failures in a row; last: {}",
                c.key,
                c.state,
                c.until
                    .as_deref()
                    .map(|u| format!(" until {u}"))
                    .unwrap_or_default(),
                c.failures,
                redactor.redact(&c.last_error)
            );
        }
    }
    mcp::print_server_states(&mcp_servers, &redactor)?;
    println!("\nrate limits");
    // Aligned to the longest name: command and MCP tools (mcp__SERVER__TOOL) run long.
    let width = rates
        .iter()
        .map(|r| r["tool"].as_str().unwrap_or("").chars().count())
        .max()
        .unwrap_or(0);
    for r in &rates {
        let lim = |v: &Value| {
            v.as_u64()
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "  {:<width$} {}/{} this hour, {}/{} today",
            r["tool"].as_str().unwrap_or(""),
            r["last_hour"],
            lim(&r["per_hour"]),
            r["last_day"],
            lim(&r["per_day"])
        );
    }
    Ok(0)
}

/// Where the note of each failed call is now (vault-relative): the path its run last
/// recorded if the note there still carries its `tool_note`, else the note in any state
/// folder that carries it (one scan of the folders, made only when a note was moved by hand
/// since, e.g. back into Needs_Action/); None when it is nowhere in them.
fn notes_now(
    vault: &crate::vault::Vault,
    failures: &[crate::journal::RecentFailure],
) -> Vec<Option<String>> {
    use std::io::Read;
    // The frontmatter is at the top: a note's first 64 KiB hold it.
    let note_id_of = |path: &Path| -> Option<String> {
        let mut head = Vec::new();
        std::fs::File::open(path)
            .ok()?
            .take(64 * 1024)
            .read_to_end(&mut head)
            .ok()?;
        let text = String::from_utf8_lossy(&head);
        crate::note::frontmatter_property(&text, "tool_note").map(str::to_string)
    };
    let mut by_id: Option<std::collections::HashMap<String, String>> = None;
    failures
        .iter()
        .map(|f| {
            let id = f.note_id.as_deref();
            if let Some(rel) = &f.moved_to {
                let path = vault.root().join(rel);
                if path.is_file() && (id.is_none() || note_id_of(&path).as_deref() == id) {
                    return Some(rel.clone());
                }
            }
            let by_id = by_id.get_or_insert_with(|| {
                let mut found = std::collections::HashMap::new();
                for state in crate::vault::State::ALL {
                    for path in vault.scan(state) {
                        if let Some(id) = note_id_of(&path) {
                            found.entry(id).or_insert_with(|| vault.relative(&path));
                        }
                    }
                }
                found
            });
            by_id.get(id?).cloned()
        })
        .collect()
}

/// `vaultd approve` / `vaultd reject`: prints each decided call and where the note went.
fn decide(g: &GlobalArgs, note: &Path, decision: Decision) -> Result<i32> {
    use crate::vault::State;
    let (config, _) = load(g)?;
    let note = &resolve_note(&config, note, &[State::PendingApproval, State::Approved])?;
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
    writeln!(
        out,
        "note is now {}{daemon_note}",
        escape_controls(&outcome.note)
    )?;
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
    let (config, _) = validated_without_secrets(g)?;
    let journal = open_journal(&config)?;
    let since = match since {
        Some(s) => {
            let d = humantime::parse_duration(&s)
                .with_context(|| format!("--since {s}: not a duration like 30m, 1h, 2days"))?;
            // Further back than the clock goes: everything.
            Some(
                std::time::SystemTime::now()
                    .checked_sub(d)
                    .unwrap_or(std::time::UNIX_EPOCH),
            )
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
            let mut line = format!("{}  {:<10} {}", e.time, e.event, escape_controls(&e.note));
            for part in [&e.call_id, &e.tool, &e.outcome].into_iter().flatten() {
                line.push_str("  ");
                line.push_str(part);
            }
            if let Some(ms) = e.duration_ms {
                line.push_str(&format!("  {ms} ms"));
            }
            if let Some(d) = &e.detail {
                line.push_str("  ");
                line.push_str(&escape_controls(d));
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
    let (config, _) = load(g)?;
    let journal = open_journal(&config)?;
    // NOTE as every command reads it (§13); a note that is gone may still have a history
    // under its old path, so a miss is only said when the journal has none either.
    let note = note.map(
        |n| match resolve_note(&config, &n, &crate::vault::State::ALL) {
            Ok(path) => {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let id = crate::note::frontmatter_property(&text, "tool_note").map(str::to_string);
                (
                    note_key_of_arg(&config.vault, &config.folders, &path),
                    id,
                    None,
                )
            }
            Err(e) => (
                note_key_of_arg(&config.vault, &config.folders, &n),
                None,
                Some(e.to_string()),
            ),
        },
    );
    let target = match (call_id, note) {
        (Some(call_id), note) => Target::Call {
            call_id,
            note_key: note.map(|(key, _, _)| key),
        },
        (None, Some((note_key, note_id, missing))) => Target::Note {
            note_id,
            note_key,
            missing,
        },
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
