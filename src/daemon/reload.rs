//! Reloading the config while `vaultd run` runs: on SIGHUP (`systemctl reload`) or when the
//! config file changes, the file is read and validated as at start-up, secrets resolved and
//! the tools built. A valid config becomes the [`Live`] one new note runs take; notes already
//! running finish with the one they started with. A bad one is logged, every error once, and
//! the running config stays. Keys bound at start-up keep their running value and are named
//! ("needs a restart").

use crate::config::{self, Config, ConfigError};
use crate::daemon::Daemon;
use crate::runner::Runner;
use crate::tools::{Registry, RegistryError};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The part of the daemon a reload replaces, as one: a note run takes it once
/// ([`Daemon::live`]) and keeps it to its end.
pub(crate) struct Live {
    /// The effective config: the file's, with the keys bound at start-up as they were.
    pub(crate) config: Config,
    /// Runs calls with the tools built from `config`; its worker cap, circuit breakers and
    /// redactor are shared by every `Live` of the daemon.
    pub(crate) runner: Runner,
}

/// Builds the tool registry of a config: every tool source, plus the tools of the MCP servers
/// started with the daemon (they are not restarted by a reload).
pub type BuildTools = Box<dyn Fn(&Config) -> Result<Registry, RegistryError> + Send + Sync>;

/// What asked for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Signal,
    FileChanged,
}

/// How long the config file must stay quiet before it is read: an editor's save is several
/// events (write a temp file, rename it over, change its mode).
const QUIET: Duration = Duration::from_millis(300);

/// SIGHUP caught and the config file watched, from before start-up recovery (a reload asked
/// for meanwhile is kept, not lost), until [`Reloader::start`] acts on them.
pub(crate) struct Reloader {
    hup: tokio::signal::unix::Signal,
    changes: mpsc::Receiver<()>,
    watch: Option<crate::watch::WatchHandle>,
    file: PathBuf,
}

/// Keeps the reload task and the file watch alive; dropping it stops them.
pub(crate) struct Reloading {
    _watch: Option<crate::watch::WatchHandle>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Reloading {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why a config was not taken: the file or its tools are bad.
#[derive(Debug, thiserror::Error)]
enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tools(#[from] RegistryError),
}

/// The config file a reload reads and watches: the one read at start-up, or the vault's own
/// `.vaultd.toml` when vaultd started without a file (defaults), as the place one is made.
fn config_file(config: &Config) -> PathBuf {
    config
        .source
        .clone()
        .unwrap_or_else(|| config.vault.join(".vaultd.toml"))
}

impl Daemon {
    /// The config and tools a note run starts with.
    pub(crate) fn live(&self) -> Arc<Live> {
        self.live
            .read()
            .expect("the live config lock is never poisoned")
            .clone()
    }

    /// Catches SIGHUP and watches the config file, for [`Reloader::start`]. Without
    /// `build_tools` (a daemon given its own tool sources) nothing reloads.
    pub(crate) fn catch_reloads(&self) -> Option<Reloader> {
        self.build_tools.as_ref()?;
        let hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(hup) => hup,
            Err(e) => {
                tracing::warn!("cannot catch SIGHUP, the config is not reloaded: {e}");
                return None;
            }
        };
        let (tx, changes) = mpsc::channel::<()>(1);
        let live = self.live();
        let file = config_file(&live.config);
        let watch = match crate::watch::watch_file(&file, live.config.watch, tx) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(
                    "changes of {} are not picked up ({e}); send SIGHUP to reload it",
                    file.display()
                );
                None
            }
        };
        Some(Reloader {
            hup,
            changes,
            watch,
            file,
        })
    }
}

impl Reloader {
    /// Reloads on every SIGHUP and, once the file stayed quiet for [`QUIET`], on every change
    /// of its text, one reload at a time, until the returned value is dropped.
    pub(crate) fn start(self, daemon: &Arc<Daemon>) -> Reloading {
        let Reloader {
            mut hup,
            mut changes,
            watch,
            file,
        } = self;
        let me = daemon.clone();
        let task = tokio::spawn(async move {
            // The text last judged (`Some(None)`: no file): the same text again (a `touch`,
            // an editor saving unchanged) is not reloaded nor its errors logged again.
            let mut judged: Option<Option<String>> = None;
            loop {
                let mut trigger = tokio::select! {
                    Some(_) = hup.recv() => Trigger::Signal,
                    Some(()) = changes.recv() => Trigger::FileChanged,
                    else => return,
                };
                if trigger == Trigger::FileChanged {
                    // Until the file is quiet; a SIGHUP meanwhile makes it a requested reload.
                    loop {
                        tokio::select! {
                            Some(_) = hup.recv() => trigger = Trigger::Signal,
                            Some(()) = changes.recv() => {}
                            _ = tokio::time::sleep(QUIET) => break,
                        }
                    }
                }
                let now = std::fs::read_to_string(&file).ok();
                if trigger == Trigger::FileChanged && judged.as_ref() == Some(&now) {
                    tracing::debug!(
                        "config file saved unchanged: {} is not read again",
                        file.display()
                    );
                    continue;
                }
                judged = Some(now);
                if trigger == Trigger::Signal {
                    tracing::info!("SIGHUP: reloading the config");
                }
                let daemon = me.clone();
                let _ = tokio::task::spawn_blocking(move || daemon.reload()).await;
            }
        });
        Reloading {
            _watch: watch,
            task,
        }
    }
}

impl Daemon {
    /// Reads, validates and applies the config file once, telling systemd (RELOADING=1, then
    /// READY=1) and the log what came of it.
    fn reload(&self) {
        let mut notify = vec![sd_notify::NotifyState::Reloading];
        notify.extend(sd_notify::NotifyState::monotonic_usec_now().ok());
        let _ = sd_notify::notify(&notify);
        match self.take_config() {
            Ok(summary) => tracing::info!("config reloaded{summary}"),
            Err((file, e)) => tracing::error!(
                "config not reloaded, the running config stays: {}{}",
                error_chain(&e),
                file.map(|f| format!(" (fix {} and save it again)", f.display()))
                    .unwrap_or_default()
            ),
        }
        let _ = sd_notify::notify(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(&format!("watching {}", self.vault.root().display())),
        ]);
    }

    /// The new config and its tools, validated as at start-up, made the live ones; returns
    /// what changed, for the log line.
    // Called once per reload, never on a hot path: the large error is not worth a box.
    #[allow(clippy::result_large_err)]
    fn take_config(&self) -> Result<String, (Option<PathBuf>, ReloadError)> {
        let build_tools = self
            .build_tools
            .as_ref()
            .expect("a reloader runs only with build_tools");
        let old = self.live();
        let source = old.config.source.clone();
        let (new, restart) = read_config(&old.config).map_err(|e| (source.clone(), e.into()))?;
        for warning in &new.warnings {
            tracing::warn!("{warning}");
        }
        let registry = build_tools(&new).map_err(|e| (new.source.clone(), e.into()))?;
        for key in &restart {
            tracing::warn!(
                "needs a restart: {key} (changed in the config file; the running value stays until vaultd restarts)"
            );
        }
        // New secrets (a webhook added) are hidden in logs and results from now on.
        old.runner.redactor.learn(&new.redactor());
        let tools = tool_changes(&old.runner.registry, &old.config, &registry, &new);
        let settings = settings_changed(&old.config, &new);
        let file = new
            .source
            .as_ref()
            .map(|p| format!(" from {}", p.display()))
            .unwrap_or_default();
        let next = Live {
            runner: old.runner.with_registry(Arc::new(registry)),
            config: new,
        };
        *self
            .live
            .write()
            .expect("the live config lock is never poisoned") = Arc::new(next);
        let mut changed: Vec<String> = tools;
        if !settings.is_empty() {
            changed.push(format!("settings changed: {}", settings.join(", ")));
        }
        if !restart.is_empty() {
            changed.push(format!(
                "{} key(s) kept until a restart (named above)",
                restart.len()
            ));
        }
        if changed.is_empty() {
            changed.push("nothing changed".to_string());
        }
        Ok(format!("{file}: {}", changed.join("; ")))
    }
}

/// The config file read again with what the command line said at start-up (the same file;
/// started without one, the lookup of docs/design.md §6 again) and validated as at start-up; the keys
/// bound at start-up keep their running values. When the vault, the state dir or a folder
/// changed, the file is validated once more with the running ones, since the tools are built
/// from them (a vault tool must not write into the vault named for the next start).
fn read_config(current: &Config) -> Result<(Config, Vec<&'static str>), ConfigError> {
    let overrides = &current.loaded_with;
    let path = current.source.clone().or_else(|| config::locate(overrides));
    let text = match &path {
        Some(p) => Some(
            std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.clone(),
                source,
            })?,
        ),
        None => None,
    };
    let raw = || match (&text, &path) {
        (Some(text), Some(path)) => config::parse_raw(text, path),
        _ => Ok(config::RawConfig::default()),
    };
    let mut new = config::from_raw(raw()?, path.clone(), overrides)?;
    let restart = keep_bound_keys(current, &mut new);
    let paths_changed = restart
        .iter()
        .any(|k| ["vault", "state_dir", "folders", "folders.tool_results"].contains(k));
    if paths_changed {
        let mut raw = raw()?;
        raw.folders = running_folders(current);
        let running = config::Overrides {
            vault: Some(current.vault.clone()),
            state_dir: Some(current.state_dir.clone()),
            ..overrides.clone()
        };
        new = config::from_raw(raw, path, &running)?;
        // What the command line said stays what a later reload starts from.
        new.loaded_with = overrides.clone();
        keep_bound_keys(current, &mut new);
    }
    Ok((new, restart))
}

/// `[folders]` as the daemon runs with them.
fn running_folders(current: &Config) -> config::RawFolders {
    let f = &current.folders;
    config::RawFolders {
        needs_action: Some(f.needs_action.clone()),
        in_progress: Some(f.in_progress.clone()),
        pending_approval: Some(f.pending_approval.clone()),
        approved: Some(f.approved.clone()),
        rejected: Some(f.rejected.clone()),
        done: Some(f.done.clone()),
        failed: Some(f.failed.clone()),
        tool_results: Some(current.tool_results.clone()),
        dry_run: Some(f.dry_run.clone()),
        sessions: Some(current.gateway.sessions.clone()),
    }
}

/// Sets every key of `new` that is bound at start-up back to its running value, and names
/// those that differed: the vault lock, journal, folders being watched, worker and note
/// slots, MCP server processes, circuit breakers and hold alerts are made once, at start.
fn keep_bound_keys(old: &Config, new: &mut Config) -> Vec<&'static str> {
    let mut keys = Vec::new();
    macro_rules! keep {
        ($key:literal, $($field:ident).+) => {
            if old.$($field).+ != new.$($field).+ {
                keys.push($key);
                new.$($field).+ = old.$($field).+.clone();
            }
        };
    }
    keep!("vault", vault);
    keep!("state_dir", state_dir);
    keep!("folders", folders);
    keep!("folders.tool_results", tool_results);
    keep!("workers", workers);
    keep!("watch", watch);
    keep!("rescan_interval", rescan_interval);
    keep!("moved_in_grace", moved_in_grace);
    keep!("runner_window", runner_window);
    keep!("max_result_bytes", max_result_bytes);
    keep!("circuit_breaker", guard.breaker);
    keep!("notify.on_hold", guard.on_hold);
    keep!("notify.on_hold_per_hour", guard.on_hold_per_hour);
    // Server configs hold secrets, compared by what the file says (the references).
    if format!("{:?}", old.mcp) != format!("{:?}", new.mcp) {
        keys.push("mcp");
        new.mcp = old.mcp.clone();
    }
    keys
}

/// The settings read at each use that differ, by key.
fn settings_changed(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut keys = Vec::new();
    macro_rules! compare {
        ($key:literal, $($field:ident).+) => {
            if old.$($field).+ != new.$($field).+ {
                keys.push($key);
            }
        };
    }
    compare!("max_calls_per_note", max_calls_per_note);
    compare!("max_note_bytes", max_note_bytes);
    compare!("note_budget", guard.note_budget);
    compare!("shutdown_grace", shutdown_grace);
    compare!("settle", settle);
    compare!("settle_max", settle_max);
    compare!("stale_copy_grace", stale_copy_grace);
    compare!("stale_copy_window", stale_copy_window);
    compare!("approval_via", approval_via);
    keys
}

/// "tools added: …", "tools removed: …", "tools changed: …" between two registries. A tool
/// changed when what `vaultd tools --json` and `vaultd config` say of it differ, or its
/// policy (timeout, rate limit, approval) does.
fn tool_changes(
    old: &Registry,
    old_config: &Config,
    new: &Registry,
    new_config: &Config,
) -> Vec<String> {
    let (before, after) = (fingerprints(old, old_config), fingerprints(new, new_config));
    let added: Vec<&str> = after
        .keys()
        .filter(|k| !before.contains_key(*k))
        .map(String::as_str)
        .collect();
    let removed: Vec<&str> = before
        .keys()
        .filter(|k| !after.contains_key(*k))
        .map(String::as_str)
        .collect();
    let changed: Vec<&str> = after
        .iter()
        .filter(|(k, v)| before.get(*k).is_some_and(|b| b != *v))
        .map(|(k, _)| k.as_str())
        .collect();
    let mut out = Vec::new();
    for (label, names) in [
        ("tools added", added),
        ("tools removed", removed),
        ("tools changed", changed),
    ] {
        if !names.is_empty() {
            out.push(format!("{label}: {}", names.join(", ")));
        }
    }
    out
}

/// Per tool name, everything said of it: its listing, its policy and its config table.
fn fingerprints(registry: &Registry, config: &Config) -> BTreeMap<String, String> {
    let tables = config.tools.describe();
    let listed = registry.describe();
    registry
        .tools()
        .zip(listed.as_array().into_iter().flatten())
        .map(|(t, listing)| {
            let name = t.name().to_string();
            let said = serde_json::json!({
                "listing": listing,
                "table": tables.get(&name),
            });
            (name, format!("{said} {:?}", t.policy))
        })
        .collect()
}

/// An error and its causes, as `main` prints a bad config at start-up (`{:#}`).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config_of(text: &str, vault: &Path) -> Config {
        let path = vault.join(".vaultd.toml");
        let raw = config::parse_raw(text, &path).unwrap();
        config::from_raw(
            raw,
            Some(path),
            &config::Overrides {
                vault: Some(vault.to_path_buf()),
                ..Default::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn keys_bound_at_start_keep_their_running_value_and_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let old = config_of("state_dir = \"/tmp/a\"\nworkers = 2\n", dir.path());
        let mut new = config_of(
            "state_dir = \"/tmp/b\"\nworkers = 3\nmax_calls_per_note = 4\n[folders]\ndone = \"Finished\"\n[notify]\non_hold = { method = \"email\", recipient = \"me@example.com\" }\n",
            dir.path(),
        );
        let keys = keep_bound_keys(&old, &mut new);
        assert_eq!(keys, ["state_dir", "folders", "workers", "notify.on_hold"]);
        assert_eq!(new.state_dir, Path::new("/tmp/a"));
        assert_eq!(new.workers, 2);
        assert_eq!(new.folders.done, "Done");
        assert_eq!(new.guard.on_hold, None);
        // Read at each use: taken.
        assert_eq!(new.max_calls_per_note, 4);
        assert_eq!(settings_changed(&old, &new), ["max_calls_per_note"]);
    }

    #[test]
    fn tool_changes_name_tools_added_removed_and_changed() {
        let dir = tempfile::tempdir().unwrap();
        let build = |c: &Config| {
            Registry::from_config(
                &c.tools,
                reqwest::Client::new(),
                None,
                &crate::tools::mcp::McpSource::none(),
            )
            .unwrap()
        };
        let old = config_of("", dir.path());
        let hook = dir.path().join("ops-webhook");
        std::fs::write(&hook, "https://hooks.example/services/T/B/X\n").unwrap();
        let new = config_of(
            &format!(
                "[tools.send_notification.slack.webhooks]\nops = \"file:{}\"\n\
             [tools.command.hello]\ndescription = \"Say hi\"\nargv = [\"/bin/echo\", \"hi\"]\n\
             parameters = {{ type = \"object\" }}\neffect = \"read_only\"\n\
             [tools.search_web]\nenabled = false\n",
                hook.display()
            ),
            dir.path(),
        );
        let changes = tool_changes(&build(&old), &old, &build(&new), &new);
        assert!(
            changes.contains(&"tools added: hello".to_string()),
            "{changes:?}"
        );
        assert!(
            changes.iter().any(|c| c.starts_with("tools changed: ")
                && c.contains("search_web")
                && c.contains("send_notification")),
            "{changes:?}"
        );
        assert!(tool_changes(&build(&old), &old, &build(&old), &old).is_empty());
    }
}
