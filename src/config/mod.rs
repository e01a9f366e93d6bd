//! Configuration: the TOML file (strict, unknown keys are errors) is read into `RawConfig`,
//! then validated once into `Config`, with secrets resolved. Nothing downstream re-checks.
//! This file owns the core keys; each tool source reads its own tables (the built-in tools in
//! `tools/builtin/*/config.rs`, command tools, vault tools, MCP servers) through
//! [`TableContext`], and names its secrets for [`Config::redactor`].

use crate::home::expand_tilde;
use crate::secret::{Redactor, SecretHolder};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Raw: exactly the file's shape.

/// `watch = "events" | "poll"`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RawWatch {
    Events,
    Poll,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub vault: Option<String>,
    pub state_dir: Option<String>,
    pub workers: Option<usize>,
    pub max_calls_per_note: Option<usize>,
    pub max_note_bytes: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    pub shutdown_grace: Option<Duration>,
    /// "events" (inotify, default) or "poll".
    pub watch: Option<RawWatch>,
    #[serde(default, with = "humantime_serde")]
    pub poll_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub rescan_interval: Option<Duration>,
    /// docs/design.md §9.1: quiet time after a note written in place before it is read.
    #[serde(default, with = "humantime_serde")]
    pub settle: Option<Duration>,
    /// How long a note that arrived by rename waits before it is claimed (`mv` of several).
    #[serde(default, with = "humantime_serde")]
    pub moved_in_grace: Option<Duration>,
    /// docs/design.md §9.1: how long a note whose last call block is unfinished is waited for.
    #[serde(default, with = "humantime_serde")]
    pub settle_max: Option<Duration>,
    /// docs/design.md §9.6: a copy of a claimed note within this is that note.
    #[serde(default, with = "humantime_serde")]
    pub stale_copy_grace: Option<Duration>,
    /// docs/design.md §9.6: up to this, a copy's started side effects are held.
    #[serde(default, with = "humantime_serde")]
    pub stale_copy_window: Option<Duration>,
    /// docs/design.md §9.9: another runner's notes this recent stop start-up.
    #[serde(default, with = "humantime_serde")]
    pub runner_window: Option<Duration>,
    /// Who may approve held calls, for every tool (docs/design.md §4).
    pub approval_via: Option<ApprovalVia>,
    #[serde(default)]
    pub folders: RawFolders,
    #[serde(default)]
    pub tools: RawTools,
    /// A result `data` larger than this goes to `Tool_Results/` (docs/design.md §10.6).
    pub max_result_bytes: Option<usize>,
    /// `[mcp.NAME]`: MCP servers, read by their tool source.
    #[serde(default)]
    pub mcp: BTreeMap<String, toml::Spanned<crate::tools::mcp::config::RawServer>>,
    /// Guardrails (docs/design.md §12), validated by `guard::config_from_raw`.
    pub note_budget: Option<u64>,
    #[serde(default)]
    pub notify: crate::guard::RawNotify,
    #[serde(default)]
    pub circuit_breaker: crate::guard::RawCircuitBreaker,
    #[serde(default)]
    pub gateway: RawGateway,
    /// The file's text, kept to turn a key's span into a line number in messages.
    #[serde(skip)]
    pub text: String,
}

impl RawConfig {
    /// The 1-based line of a byte offset in the file (1 without a file).
    fn line_of(&self, offset: usize) -> usize {
        line_column(&self.text, offset).0
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFolders {
    pub needs_action: Option<String>,
    pub in_progress: Option<String>,
    pub pending_approval: Option<String>,
    pub approved: Option<String>,
    pub rejected: Option<String>,
    pub done: Option<String>,
    pub failed: Option<String>,
    /// Where oversized results are saved; never watched.
    pub tool_results: Option<String>,
    pub dry_run: Option<String>,
    /// Where `vaultd mcp serve` writes a note per client session (docs/design.md §14).
    pub sessions: Option<String>,
}

/// `[gateway]`: `vaultd mcp serve` (docs/design.md §14).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGateway {
    /// How long a held call's MCP request waits for a person before it answers "held".
    #[serde(default, with = "humantime_serde")]
    pub approval_wait: Option<Duration>,
    /// The bearer token HTTP clients must send (`--listen`): a secret reference.
    pub token: Option<String>,
    /// `[gateway.permissions]`: the rules of the `approve_tool_use` tool.
    pub permissions: Option<crate::tools::builtin::approve_tool_use::RawPermissions>,
}

/// The validated `[gateway]` and `[folders] sessions`.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Vault-relative folder of the session notes.
    pub sessions: String,
    pub approval_wait: Duration,
    /// Required of HTTP clients; `vaultd mcp serve --listen` refuses to start without it.
    pub token: Option<crate::secret::Secret>,
}

impl SecretHolder for GatewayConfig {
    fn secrets(&self) -> Vec<&crate::secret::Secret> {
        self.token.iter().collect()
    }
}

/// `[folders] sessions`' default.
pub const DEFAULT_SESSIONS: &str = "Agent/Sessions";
/// `[gateway] approval_wait`'s default.
pub const DEFAULT_APPROVAL_WAIT: Duration = Duration::from_secs(600);

// ---------------------------------------------------------------------------------------------
// Validated.

/// The effective configuration, validated and with secrets resolved.
#[derive(Debug, Clone)]
pub struct Config {
    /// The config file this came from, if any (named in error messages and `vaultd config`).
    pub source: Option<PathBuf>,
    /// The vault root, absolute and canonical.
    pub vault: PathBuf,
    /// Where the journal and the lock live.
    pub state_dir: PathBuf,
    /// Global cap on calls running at once, across all notes.
    pub workers: usize,
    pub max_calls_per_note: usize,
    pub max_note_bytes: u64,
    pub shutdown_grace: Duration,
    pub watch: WatchMode,
    /// A full scan every so often, because events are hints and the folders are the truth.
    pub rescan_interval: Duration,
    /// A note written in place is read after its writer closed it and it stayed unchanged
    /// this long (docs/design.md §9.1).
    pub settle: Duration,
    /// A note that arrived by rename is claimed this long after it landed: GNU `mv` of
    /// several files `lstat`s each one right after moving it and fails when it is gone.
    pub moved_in_grace: Duration,
    /// A note whose last call block is unfinished is not judged before its last change is
    /// this old (docs/design.md §9.1).
    pub settle_max: Duration,
    /// A note without `tool_note` at a path a note was claimed from this recently is that
    /// note, come back as an editor's stale copy (docs/design.md §9.6).
    pub stale_copy_grace: Duration,
    /// Up to this long after such a claim, the copy's already started side effects are held
    /// for approval instead of run (docs/design.md §9.6).
    pub stale_copy_window: Duration,
    /// A note another runner (a vaultd on a replica of a synced vault) updated this recently
    /// stops `run`/`once` at start (docs/design.md §9.9).
    pub runner_window: Duration,
    pub folders: Folders,
    pub tools: ToolsConfig,
    /// `data` larger than this (compact JSON bytes) is saved to `tool_results` instead.
    pub max_result_bytes: usize,
    /// Vault-relative folder of saved results and attachments (`[folders] tool_results`).
    pub tool_results: String,
    /// `[mcp.NAME]` servers, validated.
    pub mcp: Vec<crate::tools::mcp::config::McpServerConfig>,
    /// Dry run, note budget, circuit breaker, hold alerts (docs/design.md §12).
    pub guard: crate::guard::GuardConfig,
    /// Who may approve held calls: moving the note, or only `vaultd approve` (docs/design.md §4).
    pub approval_via: ApprovalVia,
    /// `vaultd mcp serve` (docs/design.md §14).
    pub gateway: GatewayConfig,
    /// Things a person should change in the file that do not stop vaultd (an old spelling),
    /// each naming file:line; logged at start.
    pub warnings: Vec<String>,
    /// What the command line said when this was loaded: a reload reads the file again with
    /// the same (`daemon::reload`).
    pub loaded_with: Overrides,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchMode {
    Events,
    Poll(Duration),
}

pub use crate::tools::sources::{RawTools, ToolsConfig};
pub use crate::vault::Folders;
pub mod table;
pub use table::{ApprovalVia, ConfigError, RateLimit, RawRateLimit, TableContext};

// ---------------------------------------------------------------------------------------------
// Loading.

/// What the command line says about where things are; every subcommand takes these.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub vault: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    /// Commands that run no tool (`status`, `log`) keep secret references unresolved: an
    /// unset environment variable must not stop them (the values are never needed there).
    pub skip_secrets: bool,
}

/// The config file to read, by the lookup order of docs/design.md §6: `--config`, `$VAULTD_CONFIG`,
/// `<vault>/.vaultd.toml`, the user config dir. `None` when no file exists (defaults apply).
pub fn locate(overrides: &Overrides) -> Option<PathBuf> {
    let found = locate_relative(overrides)?;
    Some(std::path::absolute(&found).unwrap_or(found))
}

fn locate_relative(overrides: &Overrides) -> Option<PathBuf> {
    if let Some(p) = &overrides.config {
        return Some(p.clone());
    }
    if let Some(p) = std::env::var_os("VAULTD_CONFIG").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(v) = &overrides.vault {
        let p = v.join(".vaultd.toml");
        if p.is_file() {
            return Some(p);
        }
    }
    let user = user_config_file()?;
    user.is_file().then_some(user)
}

fn user_config_file() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CONFIGURATION_DIRECTORY").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(dir).join("config.toml"));
    }
    directories::ProjectDirs::from("", "", "vaultd").map(|d| d.config_dir().join("config.toml"))
}

/// The vault that holds the current folder: the first folder, walking up, that holds
/// `.vaultd.toml` or `Needs_Action/` (docs/design.md §13).
pub fn find_vault_upwards() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    let needs_action = Folders::default().needs_action;
    cwd.ancestors()
        .find(|dir| dir.join(".vaultd.toml").is_file() || dir.join(&needs_action).is_dir())
        .map(Path::to_path_buf)
}

/// Finds, reads and validates the config. The vault folder must exist. Without `--vault`, a
/// config named by `--config` or `$VAULTD_CONFIG` decides (its `vault`, else the folder
/// found walking up); otherwise the vault found walking up from the current folder.
pub fn load(overrides: &Overrides) -> Result<Config, ConfigError> {
    let explicit_config = overrides.config.is_some()
        || std::env::var_os("VAULTD_CONFIG").is_some_and(|v| !v.is_empty());
    let mut found = overrides.clone();
    if found.vault.is_none() && !explicit_config {
        found.vault = find_vault_upwards();
    }
    let overrides = &found;
    let path = locate(overrides);
    let raw = match &path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.clone(),
                source,
            })?;
            parse_raw(&text, p)?
        }
        None => RawConfig::default(),
    };
    from_raw(raw, path, overrides)
}

/// Parses the file strictly. Every unknown key is reported at once, each with its line and
/// column: serde stops at the first, so each one found is removed and the rest parsed again.
pub fn parse_raw(text: &str, path: &Path) -> Result<RawConfig, ConfigError> {
    use serde::Deserialize as _;
    let parse_error = |source: toml::de::Error| ConfigError::Parse {
        path: path.to_path_buf(),
        source,
    };
    let mut table = toml::de::DeTable::parse(text).map_err(parse_error)?;
    let mut unknown = Vec::new();
    loop {
        let attempt = RawConfig::deserialize(toml::de::Deserializer::from(table.clone()));
        let mut error = match attempt {
            Ok(raw) if unknown.is_empty() => {
                return Ok(RawConfig {
                    text: text.to_string(),
                    ..raw
                });
            }
            Ok(_) => break,
            Err(e) => e,
        };
        let span = error.span();
        let removed = match &span {
            Some(span) if error.message().starts_with("unknown field") => {
                remove_key(table.get_mut(), span, "")
            }
            _ => None,
        };
        match (removed, span) {
            (Some(key), Some(span)) if unknown.len() < 100 => {
                let (line, column) = line_column(text, span.start);
                unknown.push(format!("{}:{line}:{column}: `{key}`", path.display()));
            }
            // A value of the wrong type or not among the choices: name its line and key.
            (None, Some(span)) if unknown.is_empty() => {
                if let Some(key) = key_at(table.get_ref(), &span, "") {
                    return Err(ConfigError::InvalidAt {
                        path: path.to_path_buf(),
                        line: line_column(text, span.start).0,
                        key,
                        message: with_example(error.message()),
                    });
                }
                error.set_input(Some(text));
                return Err(parse_error(error));
            }
            _ if unknown.is_empty() => {
                error.set_input(Some(text));
                return Err(parse_error(error));
            }
            // Another error after the unknown keys: report the keys; the rest follows once
            // they are fixed.
            _ => break,
        }
    }
    Err(ConfigError::UnknownKeys {
        path: path.to_path_buf(),
        keys: unknown,
    })
}

/// serde's message, with what a person would write where it only names the type.
fn with_example(message: &str) -> String {
    if message.ends_with("expected a duration") {
        format!("{message} like \"30s\" or \"5m\"")
    } else {
        message.to_string()
    }
}

/// The dotted path of the innermost key whose value holds `span` (where serde found a bad
/// value), anywhere in the tree.
fn key_at(
    table: &toml::de::DeTable<'_>,
    span: &std::ops::Range<usize>,
    prefix: &str,
) -> Option<String> {
    for (k, v) in table.iter() {
        let path = format!("{prefix}{}", k.get_ref());
        let deeper = match v.get_ref() {
            toml::de::DeValue::Table(t) => key_at(t, span, &format!("{path}.")),
            toml::de::DeValue::Array(items) => items.iter().find_map(|item| match item.get_ref() {
                toml::de::DeValue::Table(t) => key_at(t, span, &format!("{path}.")),
                _ => None,
            }),
            _ => None,
        };
        if deeper.is_some() {
            return deeper;
        }
        let held = v.span();
        if !held.is_empty() && held.start <= span.start && span.end <= held.end {
            return Some(path);
        }
    }
    None
}

/// Removes the key whose name sits at `span`, anywhere in the tree; returns its dotted path.
fn remove_key(
    table: &mut toml::de::DeTable<'_>,
    span: &std::ops::Range<usize>,
    prefix: &str,
) -> Option<String> {
    let hit = table.keys().find(|k| k.span() == *span).cloned();
    if let Some(key) = hit {
        table.remove(&key);
        return Some(format!("{prefix}{}", key.get_ref()));
    }
    for (k, v) in table.iter_mut() {
        let path = format!("{prefix}{}.", k.get_ref());
        if let Some(hit) = remove_key_in(v.get_mut(), span, &path) {
            return Some(hit);
        }
    }
    None
}

fn remove_key_in(
    value: &mut toml::de::DeValue<'_>,
    span: &std::ops::Range<usize>,
    prefix: &str,
) -> Option<String> {
    match value {
        toml::de::DeValue::Table(t) => remove_key(t, span, prefix),
        toml::de::DeValue::Array(items) => items
            .iter_mut()
            .find_map(|item| remove_key_in(item.get_mut(), span, prefix)),
        _ => None,
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// Validates a raw config into a `Config`. `source` names the file in errors.
pub fn from_raw(
    mut raw: RawConfig,
    source: Option<PathBuf>,
    overrides: &Overrides,
) -> Result<Config, ConfigError> {
    let path = source
        .clone()
        .unwrap_or_else(|| PathBuf::from("<defaults>"));
    let mut warnings = Vec::new();
    let approval_via = approval_via(&mut raw, &path, &mut warnings)?;
    let invalid = |key: &str, message: String| ConfigError::Invalid {
        path: path.clone(),
        key: key.to_string(),
        message,
    };
    // Relative paths in a config file are relative to the file's folder.
    let base = source
        .as_ref()
        .and_then(|p| p.parent())
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let config_path = |p: &str| {
        let p = expand_tilde(p);
        if p.is_relative() { base.join(p) } else { p }
    };
    let vault = vault_folder(&raw, source.as_deref(), overrides, &config_path, &invalid)?;
    let state_dir = match (&overrides.state_dir, &raw.state_dir) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) => config_path(s),
        // One state per vault (docs/design.md §9.11): named by the id kept in the vault.
        (None, None) => crate::state::id::default_state_dir(&vault)?,
    };
    let core = core_keys(&raw, &invalid)?;
    gateway_permissions(&mut raw, &invalid)?;
    let (folders, tool_results, sessions) = checked_folders(raw.folders, &invalid)?;

    let cx = TableContext {
        path: &path,
        base: &base,
        vault: &vault,
        folders: &folders,
        state_dir: &state_dir,
        skip_secrets: overrides.skip_secrets,
    };
    let tools = ToolsConfig::from_raw(raw.tools, &cx, &[&tool_results, &sessions])?;
    let guard = crate::guard::config_from_raw(
        raw.note_budget,
        raw.notify,
        raw.circuit_breaker,
        &tools.send_notification,
        &path,
    )?;

    let max_result_bytes = raw
        .max_result_bytes
        .unwrap_or(crate::results::DEFAULT_MAX_RESULT_BYTES);
    if max_result_bytes < 1024 {
        return Err(invalid(
            "max_result_bytes",
            format!("must be at least 1024, got {max_result_bytes}"),
        ));
    }
    let mcp = crate::tools::mcp::config::from_raw(raw.mcp, &cx)?;
    let gateway_token = match &raw.gateway.token {
        Some(r) => Some(cx.secret("gateway.token", r)?),
        None => None,
    };

    let mut config = Config {
        source,
        vault,
        state_dir,
        workers: core.workers,
        max_calls_per_note: core.max_calls_per_note,
        max_note_bytes: core.max_note_bytes,
        shutdown_grace: core.shutdown_grace,
        watch: core.watch,
        rescan_interval: core.rescan_interval,
        settle: core.settle,
        moved_in_grace: core.moved_in_grace,
        settle_max: core.settle_max,
        stale_copy_grace: core.stale_copy_grace,
        stale_copy_window: core.stale_copy_window,
        runner_window: core.runner_window,
        folders,
        tools,
        max_result_bytes,
        tool_results,
        mcp,
        guard,
        approval_via,
        gateway: GatewayConfig {
            sessions,
            approval_wait: raw.gateway.approval_wait.unwrap_or(DEFAULT_APPROVAL_WAIT),
            token: gateway_token,
        },
        warnings,
        loaded_with: overrides.clone(),
    };
    config.keep_secret_files_from_servers();
    Ok(config)
}

/// [`from_raw`]'s vault stage: the folder named on the command line or in the file, else
/// found walking up; canonical, and a folder.
fn vault_folder(
    raw: &RawConfig,
    source: Option<&Path>,
    overrides: &Overrides,
    config_path: &impl Fn(&str) -> PathBuf,
    invalid: &impl Fn(&str, String) -> ConfigError,
) -> Result<PathBuf, ConfigError> {
    let vault = match (&overrides.vault, &raw.vault) {
        (Some(v), _) => v.clone(),
        (None, Some(v)) => config_path(v),
        (None, None) => match find_vault_upwards() {
            Some(v) => v,
            None => {
                let looked = match source {
                    Some(p) => format!("{} sets no `vault`", p.display()),
                    None => "no config file sets `vault`".to_string(),
                };
                let looked = match std::env::current_dir() {
                    Ok(cwd) => format!(
                        "{looked}, and neither {} nor any folder above it holds .vaultd.toml or {}/",
                        cwd.display(),
                        Folders::default().needs_action
                    ),
                    Err(_) => looked,
                };
                return Err(ConfigError::NoVault { looked });
            }
        },
    };
    // A vault named on the command line that does not exist is "no such vault", not a bad
    // config; one named in the config file is that file's key at fault.
    let from_command_line = overrides.vault.is_some();
    let unusable = |reason: String| {
        if from_command_line {
            ConfigError::NoSuchVault {
                path: vault.clone(),
                reason,
            }
        } else {
            invalid(
                "vault",
                format!("vault folder {} is not usable: {reason}", vault.display()),
            )
        }
    };
    let canonical = std::fs::canonicalize(&vault).map_err(|e| unusable(e.to_string()))?;
    if !canonical.is_dir() {
        return Err(unusable("not a folder".to_string()));
    }
    Ok(canonical)
}

/// The top-level numbers and durations of [`Config`] (each field as documented there).
struct CoreKeys {
    workers: usize,
    max_calls_per_note: usize,
    max_note_bytes: u64,
    shutdown_grace: Duration,
    watch: WatchMode,
    rescan_interval: Duration,
    settle: Duration,
    moved_in_grace: Duration,
    settle_max: Duration,
    stale_copy_grace: Duration,
    stale_copy_window: Duration,
    runner_window: Duration,
}

/// [`from_raw`]'s core stage: the top-level numbers and durations, defaulted and checked.
fn core_keys(
    raw: &RawConfig,
    invalid: &impl Fn(&str, String) -> ConfigError,
) -> Result<CoreKeys, ConfigError> {
    let workers = raw.workers.unwrap_or(10);
    if workers == 0 || workers > 1024 {
        return Err(invalid(
            "workers",
            format!("must be 1..=1024, got {workers}"),
        ));
    }
    let max_calls_per_note = raw.max_calls_per_note.unwrap_or(10);
    if max_calls_per_note == 0 {
        return Err(invalid("max_calls_per_note", "must be at least 1".into()));
    }
    let max_note_bytes = raw.max_note_bytes.unwrap_or(1024 * 1024);
    if max_note_bytes == 0 {
        return Err(invalid("max_note_bytes", "must be at least 1".into()));
    }
    let shutdown_grace = raw.shutdown_grace.unwrap_or(Duration::from_secs(10));
    let poll_interval = raw.poll_interval.unwrap_or(Duration::from_secs(2));
    let watch = match raw.watch {
        None | Some(RawWatch::Events) => WatchMode::Events,
        Some(RawWatch::Poll) => WatchMode::Poll(poll_interval),
    };
    let rescan_interval = raw.rescan_interval.unwrap_or(Duration::from_secs(300));

    let settle = raw.settle.unwrap_or(Duration::from_secs(2));
    let moved_in_grace = raw.moved_in_grace.unwrap_or(Duration::from_millis(100));
    let settle_max = raw.settle_max.unwrap_or(Duration::from_secs(60));
    let stale_copy_grace = raw.stale_copy_grace.unwrap_or(Duration::from_secs(600));
    let stale_copy_window = raw
        .stale_copy_window
        .unwrap_or(Duration::from_secs(7 * 86_400));
    let runner_window = raw.runner_window.unwrap_or(Duration::from_secs(86_400));
    Ok(CoreKeys {
        workers,
        max_calls_per_note,
        max_note_bytes,
        shutdown_grace,
        watch,
        rescan_interval,
        settle,
        moved_in_grace,
        settle_max,
        stale_copy_grace,
        stale_copy_window,
        runner_window,
    })
}

/// [`from_raw`]'s gateway-permissions stage: `[gateway.permissions]` becomes the rules of
/// the `approve_tool_use` tool.
fn gateway_permissions(
    raw: &mut RawConfig,
    invalid: &impl Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    // `approve_tool_use` is a built-in tool, but its rules are the gateway's: written in
    // `[gateway.permissions]` only.
    let t = &raw.tools.approve_tool_use;
    if t.enabled.is_some() || !t.allow.is_empty() || !t.deny.is_empty() || !t.ask.is_empty() {
        return Err(invalid(
            "tools.approve_tool_use",
            "the rules of approve_tool_use are written in [gateway.permissions]".to_string(),
        ));
    }
    if let Some(p) = raw.gateway.permissions.take() {
        raw.tools.approve_tool_use = p;
    }
    Ok(())
}

/// [`from_raw`]'s folders stage: `[folders]` with defaults, each a plain relative name that
/// overlaps no other. Returns the folders, `tool_results` and `sessions`.
fn checked_folders(
    f: RawFolders,
    invalid: &impl Fn(&str, String) -> ConfigError,
) -> Result<(Folders, String, String), ConfigError> {
    let d = Folders::default();
    let folders = Folders {
        needs_action: f.needs_action.unwrap_or(d.needs_action),
        in_progress: f.in_progress.unwrap_or(d.in_progress),
        pending_approval: f.pending_approval.unwrap_or(d.pending_approval),
        approved: f.approved.unwrap_or(d.approved),
        rejected: f.rejected.unwrap_or(d.rejected),
        done: f.done.unwrap_or(d.done),
        failed: f.failed.unwrap_or(d.failed),
        dry_run: f.dry_run.unwrap_or(d.dry_run),
    };
    let tool_results = f
        .tool_results
        .unwrap_or_else(|| crate::results::DEFAULT_FOLDER.to_string());
    let sessions = f.sessions.unwrap_or_else(|| DEFAULT_SESSIONS.to_string());
    let all = [
        ("folders.tool_results", &tool_results),
        ("folders.sessions", &sessions),
        ("folders.needs_action", &folders.needs_action),
        ("folders.in_progress", &folders.in_progress),
        ("folders.pending_approval", &folders.pending_approval),
        ("folders.approved", &folders.approved),
        ("folders.rejected", &folders.rejected),
        ("folders.done", &folders.done),
        ("folders.failed", &folders.failed),
        ("folders.dry_run", &folders.dry_run),
    ];
    for (i, (key, name)) in all.iter().enumerate() {
        let p = Path::new(name.as_str());
        let plain = !name.is_empty()
            && p.components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
            && !name.starts_with('.');
        if !plain {
            return Err(invalid(
                key,
                format!("`{name}` must be a relative folder name inside the vault"),
            ));
        }
        for (other_key, other) in &all[..i] {
            let (a, b) = (Path::new(name.as_str()), Path::new(other.as_str()));
            if a.starts_with(b) || b.starts_with(a) {
                return Err(invalid(
                    key,
                    format!("`{name}` overlaps `{other_key}` = `{other}`"),
                ));
            }
        }
    }
    Ok((folders, tool_results, sessions))
}

/// The top-level `approval_via`, or its old spelling under `[tools.send_notification]` (with
/// a warning naming file:line and the new spelling). Both, and different: an error.
fn approval_via(
    raw: &mut RawConfig,
    path: &Path,
    warnings: &mut Vec<String>,
) -> Result<ApprovalVia, ConfigError> {
    let top = raw.approval_via;
    let Some(old) = raw.tools.send_notification.approval_via.take() else {
        return Ok(top.unwrap_or(ApprovalVia::Folder));
    };
    let line = raw.line_of(old.span().start);
    let old = *old.get_ref();
    if let Some(top) = top
        && top != old
    {
        return Err(ConfigError::InvalidAt {
            path: path.to_path_buf(),
            line,
            key: "tools.send_notification.approval_via".to_string(),
            message: format!(
                "`{}` contradicts the top-level approval_via = \"{}\"; keep only the top-level key",
                old.as_str(),
                top.as_str()
            ),
        });
    }
    warnings.push(format!(
        "{}:{line}: `approval_via` under [tools.send_notification] is the old spelling: it applies \
         to every held call, so write `approval_via = \"{}\"` at the top of the file, before any [table]",
        path.display(),
        old.as_str()
    ));
    Ok(old)
}

impl ToolsConfig {
    /// The defaults, for commands that need tool specs but no vault (`vaultd tools`).
    pub fn defaults() -> ToolsConfig {
        let dir = tempfile_free_dir();
        let overrides = Overrides {
            vault: Some(dir.clone()),
            state_dir: Some(dir),
            ..Default::default()
        };
        from_raw(RawConfig::default(), None, &overrides)
            .expect("the default config is valid")
            .tools
    }
}

impl Config {
    /// Secrets left unresolved by a command that runs no tool (`Overrides::skip_secrets`):
    /// (reference, why it cannot be read here). `run` and `once` would refuse to start.
    pub fn unresolved_secrets(&self) -> Vec<(String, String)> {
        let mut holders = self.tools.secret_holders();
        holders.extend(self.mcp.iter().map(|s| s as &dyn SecretHolder));
        holders.push(&self.gateway);
        let mut out: Vec<(String, String)> = holders
            .iter()
            .flat_map(|h| h.secrets())
            .filter_map(|s| Some((s.reference().to_string(), s.why_unresolved()?)))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The one redactor: every secret that any tool source or MCP server names.
    /// Every `file:` secret of the config (another server's token, a tool's password, the
    /// gateway token) is a path no sandboxed MCP server reads, whatever its sandbox grants:
    /// "everything but the secrets" includes these.
    fn keep_secret_files_from_servers(&mut self) {
        let mut holders = self.tools.secret_holders();
        holders.extend(self.mcp.iter().map(|s| s as &dyn SecretHolder));
        holders.push(&self.gateway);
        let mut files: Vec<PathBuf> = holders
            .iter()
            .flat_map(|h| h.secrets())
            .filter_map(|s| s.reference().strip_prefix("file:"))
            .map(crate::home::expand_tilde)
            .collect();
        let real: Vec<PathBuf> = files.iter().filter_map(|p| p.canonicalize().ok()).collect();
        files.extend(real);
        for server in &mut self.mcp {
            use crate::tools::mcp::config::{McpSandbox, Transport};
            if let Transport::Stdio {
                sandbox: McpSandbox::On(sandbox),
                ..
            } = &mut server.transport
            {
                for f in &files {
                    if !sandbox.secrets.contains(f) {
                        sandbox.secrets.push(f.clone());
                    }
                }
            }
        }
    }

    pub fn redactor(&self) -> Redactor {
        let mut holders = self.tools.secret_holders();
        holders.extend(self.mcp.iter().map(|s| s as &dyn SecretHolder));
        holders.push(&self.gateway);
        let redactor = Redactor::for_holders(&holders);
        // The OAuth tokens kept by `vaultd mcp login` (as they are at start).
        let tokens: Vec<crate::secret::Secret> = self
            .mcp
            .iter()
            .flat_map(|s| match &s.transport {
                crate::tools::mcp::config::Transport::Http { oauth, .. } => oauth.0.secrets(),
                crate::tools::mcp::config::Transport::Stdio { .. } => Vec::new(),
            })
            .collect();
        redactor.learn(&Redactor::new(&tokens, &[]));
        redactor
    }
}

fn tempfile_free_dir() -> PathBuf {
    std::env::temp_dir()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::builtin::search_web::config::SearchProvider;
    use crate::tools::builtin::send_notification::config::{Approval, EmailTransport};

    fn load_str(text: &str, vault: &Path) -> Result<Config, ConfigError> {
        let path = PathBuf::from("test.toml");
        let raw = parse_raw(text, &path)?;
        from_raw(
            raw,
            Some(path),
            &Overrides {
                vault: Some(vault.to_path_buf()),
                ..Default::default()
            },
        )
    }

    #[test]
    fn the_vault_tools_keep_out_of_the_configured_preview_and_results_folders() {
        let dir = tempfile::tempdir().unwrap();
        let c = load_str(
            "[folders]\ndry_run = \"Previews\"\ntool_results = \"Saved\"\n",
            dir.path(),
        )
        .unwrap();
        let reserved = &c.tools.vault.reserved;
        assert!(reserved.contains(&"Previews".to_string()), "{reserved:?}");
        assert!(reserved.contains(&"Saved".to_string()), "{reserved:?}");
        // The default names are ordinary folders when others are configured.
        assert!(!reserved.contains(&"Dry_Run".to_string()), "{reserved:?}");
        assert!(
            !reserved.contains(&"Tool_Results".to_string()),
            "{reserved:?}"
        );
    }

    #[test]
    fn defaults_match_the_design() {
        let dir = tempfile::tempdir().unwrap();
        let c = load_str("", dir.path()).unwrap();
        assert_eq!(c.workers, 10);
        assert_eq!(c.max_calls_per_note, 10);
        assert_eq!(c.max_note_bytes, 1_048_576);
        assert_eq!(c.shutdown_grace, Duration::from_secs(10));
        assert_eq!(c.folders, Folders::default());
        assert_eq!(c.tools.search_web.provider, SearchProvider::DuckDuckGo);
        assert_eq!(c.tools.search_web.rate_limit.per_hour, Some(120));
        assert_eq!(c.tools.send_notification.rate_limit.per_day, Some(100));
        assert_eq!(c.tools.send_notification.approval, Approval::Unlisted);
        assert!(matches!(
            c.tools.send_notification.email.transport,
            EmailTransport::File { .. }
        ));
    }

    #[test]
    fn an_mcp_sandbox_of_the_wrong_shape_names_its_key_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let err = |sandbox: &str| {
            load_str(
                &format!("[mcp.s]\ncommand = [\"srv\"]\nsandbox = {sandbox}\n"),
                dir.path(),
            )
            .unwrap_err()
            .to_string()
        };
        let e = err("\"yes\"");
        assert!(
            e.contains("line 3: key `mcp.s.sandbox`") && e.contains("`false` or a table"),
            "{e}"
        );
        let e = err("{ netwrok = true }");
        assert!(e.contains("test.toml:3:13: `mcp.s.sandbox.netwrok`"), "{e}");
        let e = err("{ mode = \"sometimes\" }");
        assert!(e.contains("key `mcp.s.sandbox.mode`"), "{e}");
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_str("workerz = 3\n", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("workerz"), "{err}");
        assert!(err.contains("test.toml"), "{err}");
        let err = load_str("[tools.search_web]\nprovidr = \"brave\"\n", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("providr"), "{err}");
        assert!(err.contains("test.toml:2:1"), "{err}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_str("[tools.search_web]\nprovider = \"bing\"\n", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("tools.search_web.provider"), "{err}");
        let err = load_str("[tools.search_web]\ntimeout = \"soon\"\n", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("tools.search_web.timeout"), "{err}");
        assert!(
            err.contains("line 2") && err.contains("like \"30s\""),
            "{err}"
        );
        let err = load_str("[folders]\ndone = \"../x\"\n", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("folders.done"), "{err}");
    }

    #[test]
    fn rate_limit_keys_may_be_given_alone() {
        let dir = tempfile::tempdir().unwrap();
        let c = load_str(
            "[tools.search_web]\nrate_limit = { per_hour = 2 }\n",
            dir.path(),
        )
        .unwrap();
        assert_eq!(c.tools.search_web.rate_limit.per_hour, Some(2));
        assert_eq!(c.tools.search_web.rate_limit.per_day, None);
    }

    #[test]
    fn approval_via_is_a_top_level_key() {
        let dir = tempfile::tempdir().unwrap();
        let c = load_str("", dir.path()).unwrap();
        assert_eq!(c.approval_via, ApprovalVia::Folder);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let c = load_str("approval_via = \"cli\"\n", dir.path()).unwrap();
        assert_eq!(c.approval_via, ApprovalVia::Cli);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let err = load_str("approval_via = \"maybe\"\n", dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("approval_via") && err.contains("maybe"),
            "{err}"
        );
    }

    #[test]
    fn the_old_approval_via_spelling_works_with_a_warning_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let old = "workers = 2\n[tools.send_notification]\napproval_via = \"cli\"\n";
        let c = load_str(old, dir.path()).unwrap();
        assert_eq!(c.approval_via, ApprovalVia::Cli);
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        let w = &c.warnings[0];
        assert!(w.starts_with("test.toml:3: "), "{w}");
        assert!(
            w.contains("approval_via = \"cli\"") && w.contains("top of the file"),
            "{w}"
        );
        // Both spellings saying the same is fine (still a warning); saying different things
        // is an error at the old key's line.
        let both = format!("approval_via = \"cli\"\n{old}");
        let c = load_str(&both, dir.path()).unwrap();
        assert_eq!(c.approval_via, ApprovalVia::Cli);
        assert_eq!(c.warnings.len(), 1);
        let clash = format!("approval_via = \"folder\"\n{old}");
        let err = load_str(&clash, dir.path()).unwrap_err().to_string();
        assert!(err.contains("line 4"), "{err}");
        assert!(
            err.contains("tools.send_notification.approval_via"),
            "{err}"
        );
        assert!(err.contains("contradicts"), "{err}");
    }

    #[test]
    fn a_secret_error_keeps_its_cause_in_the_chain() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_str(
            "[tools.search_web]\napi_key = \"file:/nonexistent/vaultd-key\"\n",
            dir.path(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad config test.toml: key `tools.search_web.api_key`"
        );
        let secret = std::error::Error::source(&err).expect("the secret error");
        assert_eq!(
            secret.to_string(),
            "cannot read secret file /nonexistent/vaultd-key"
        );
        let io = secret
            .source()
            .and_then(|e| e.downcast_ref::<std::io::Error>())
            .expect("the io error");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn smtp_needs_a_url_without_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_str(
            "[tools.send_notification.email]\ntransport = \"smtp\"\n",
            dir.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("smtp_url"), "{err}");
        let err = load_str(
            "[tools.send_notification.email]\ntransport = \"smtp\"\nsmtp_url = \"smtp://u:p@h\"\n",
            dir.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("credentials"), "{err}");
    }
}
