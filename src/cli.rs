//! The command line: `run | once | check | tools | init | status | log | approve | reject |
//! config | undo | mcp`. Maps every failure to a message and an exit code; `anyhow` lives only
//! here. This file holds the arguments, the dispatch and what several commands share (loading
//! the config, finding a note); each command is a file of its own in `cli/`.

use crate::config::{self, Config, Overrides};
use crate::daemon::{self, Mode};
use crate::journal::Decision;
use crate::pipeline::plan::Step;
use crate::tools::Registry;
use crate::tools::mcp::McpSource;
use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod check;
mod decide;
mod gateway;
mod init;
mod log;
mod logging;
mod login;
mod mcp;
mod preview;
mod serve;
mod show_config;
mod status;
mod tools;
mod undo;

use check::check;
use decide::decide;
use init::init;
use log::log;
pub use logging::init_tracing;
use logging::init_warnings;
use preview::preview;
use serve::serve;
use show_config::print_config;
use status::status;
use tools::{accept_tool, tools};
use undo::undo;

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
        since: Option<humantime::Duration>,
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
    // The commands that run the daemon set up their own logging from the config.
    let runs_daemon = matches!(
        cli.command,
        Command::Run { .. }
            | Command::Once { .. }
            | Command::Mcp {
                action: mcp::McpAction::Serve(_)
            }
    );
    if !runs_daemon {
        restore_sigpipe();
        ONE_SHOT.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let outcome = dispatch(cli);
    // Whatever ended the command (an error before its daemon task finished, say), the moves
    // the flusher has yet to fsync are durable before exit.
    crate::files::flush_folders();
    match outcome {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            let code = exit_code(&e);
            // vaultd's own multi-line messages (every unknown config key on its own line)
            // keep their lines; continuation lines are indented, so no text from a file or a
            // path can pass for a line of its own.
            let message = format!("{e:#}");
            let lines: Vec<String> = message.lines().map(escape_controls).collect();
            eprintln!("vaultd: {}", lines.join("\n  "));
            code
        }
    }
}

/// The status an error exits with: 75 (`EX_TEMPFAIL`) when the daemon stopped for a failed
/// fsync of its journal (start it again: systemd's `Restart=on-failure` does), 2 for every
/// other error.
pub(crate) fn exit_code(e: &anyhow::Error) -> i32 {
    let storage_lost = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<crate::daemon::DaemonError>(),
            Some(crate::daemon::DaemonError::StorageLost { .. })
        )
    });
    if storage_lost { 75 } else { 2 }
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
        Command::Mcp {
            action: mcp::McpAction::Serve(args),
        } => gateway::serve(&g, args),
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

/// The built-in, vault and command tools: building them is the one validation every command
/// shares. Opens no journal (a command refused at start must leave no state behind).
fn registry_for(config: &Config) -> Result<Registry> {
    Ok(Registry::from_config(
        &config.tools,
        daemon::http_client()?,
        None,
        &McpSource::none(),
    )?)
}

/// Every tool, MCP tools from the journal's catalog (no server is started). The journal is
/// opened only when MCP servers are configured.
fn mcp_registry_for(
    config: &Config,
) -> Result<(Registry, McpSource, Option<Arc<crate::journal::Journal>>)> {
    // The other sources' tools are checked before the journal is opened, so a config they
    // refuse leaves no state behind.
    let registry = registry_for(config)?;
    if config.mcp.is_empty() {
        return Ok((registry, McpSource::none(), None));
    }
    let journal = Arc::new(open_journal(config)?);
    let mcp = McpSource::offline(&config.mcp, journal.clone());
    let registry = Registry::from_config(&config.tools, daemon::http_client()?, None, &mcp)?;
    Ok((registry, mcp, Some(journal)))
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

fn open_journal(config: &Config) -> Result<crate::journal::Journal> {
    Ok(crate::state::open_journal(config)?)
}

#[cfg(test)]
mod exit_tests {
    use super::*;

    /// A stop for a failed fsync of the journal has a status of its own, so a service
    /// manager's log and a script can tell it from a bad config (2).
    #[test]
    fn a_stop_for_a_failed_fsync_exits_75_other_errors_2() {
        let lost = anyhow::Error::from(crate::daemon::DaemonError::StorageLost {
            path: "/state/journal.sqlite".into(),
            why: "an fsync of the WAL failed".into(),
        });
        assert_eq!(exit_code(&lost), 75);
        assert_eq!(exit_code(&lost.context("vaultd run")), 75);
        assert_eq!(exit_code(&anyhow::anyhow!("bad config")), 2);
        let locked = anyhow::Error::from(crate::daemon::DaemonError::Locked("held".into()));
        assert_eq!(exit_code(&locked), 2);
    }
}
