//! `vaultd status`: the daemon, the notes in each folder, open runs, problems and MCP servers.

use super::{GlobalArgs, escape_controls, open_journal, validated_without_secrets};
use crate::config::Config;
use crate::daemon;
use crate::guard::breaker::CircuitStatus;
use crate::journal::{LogEntry, RecentFailure};
use crate::note::parse_note;
use crate::tools::Registry;
use crate::vault::{State, Vault};
use anyhow::Result;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

pub(super) fn status(g: &GlobalArgs, as_json: bool) -> Result<i32> {
    let (config, registry) = validated_without_secrets(g)?;
    let report = Report::gather(&config, &registry)?;
    // The journal holds redacted text only; the redactor here is the last line of defence.
    let redactor = daemon::redactor_for(&config);
    if as_json {
        println!(
            "{}",
            redactor.redact(&serde_json::to_string_pretty(&report.to_json())?)
        );
    } else {
        report.print(&redactor)?;
    }
    Ok(0)
}

/// What `vaultd status` shows, gathered once (docs/design.md §15: commands print, library code
/// gathers); printed as JSON or as text.
struct Report {
    vault_root: PathBuf,
    state_dir: PathBuf,
    vault: Vault,
    daemon_pid: Option<u32>,
    counts: Vec<(State, usize)>,
    /// Notes in Needs_Action/ whose every call has its result.
    nothing_pending: Vec<String>,
    running: Vec<LogEntry>,
    failures: Vec<RecentFailure>,
    /// Where each failed call's note is now.
    failed_notes_now: Vec<Option<String>>,
    problems: Vec<LogEntry>,
    circuits: Vec<CircuitStatus>,
    mcp_servers: Vec<Value>,
    runner: Option<crate::synced::RunnerId>,
    pause: Option<crate::journal::runners::RunnerPause>,
    storage_pause: Option<String>,
    rates: Vec<Value>,
}

impl Report {
    fn gather(config: &Config, registry: &Registry) -> Result<Report> {
        let vault = Vault::new(config.vault.clone(), config.folders.clone());
        let journal = open_journal(config)?;
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
        let mcp_servers =
            super::mcp::server_states(config, &journal, &circuits, daemon_pid.is_some())?;
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
        Ok(Report {
            vault_root: config.vault.clone(),
            state_dir: config.state_dir.clone(),
            vault,
            daemon_pid,
            counts,
            nothing_pending,
            running,
            failures,
            failed_notes_now,
            problems,
            circuits,
            mcp_servers,
            runner,
            pause,
            storage_pause,
            rates,
        })
    }

    /// `vaultd status --json`.
    fn to_json(&self) -> Value {
        let Report {
            vault_root,
            state_dir,
            vault: _,
            daemon_pid,
            counts,
            nothing_pending,
            running,
            failures,
            failed_notes_now,
            problems,
            circuits,
            mcp_servers,
            runner,
            pause,
            storage_pause,
            rates,
        } = self;
        json!({
            "vault": vault_root.display().to_string(),
            "daemon_pid": daemon_pid,
            "notes": counts.iter().map(|(s, n)| (s.as_str().to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "nothing_pending": nothing_pending,
            "running": running,
            "recent_failures": failures.iter().zip(failed_notes_now).map(|(f, now)| {
                let mut v = json!(f);
                v["now"] = json!(now);
                v
            }).collect::<Vec<_>>(),
            "problems": problems,
            "rate_limits": rates,
            "open_circuits": circuits,
            "mcp_servers": mcp_servers,
            "runner": runner.as_ref().map(|r| r.to_string()),
            "state_dir": state_dir.display().to_string(),
            "storage_paused": storage_pause,
            "paused": pause.as_ref().map(|p| json!({
                "host": crate::synced::host_of(&p.other),
                "runner": p.other,
                "note": p.note,
                "since": humantime::format_rfc3339_seconds(p.at).to_string(),
                "how_to_resume": crate::synced::how_to_resume(crate::synced::host_of(&p.other)),
            })),
        })
    }

    /// `vaultd status`: the text, every string from the journal redacted and escaped.
    fn print(&self, redactor: &crate::secret::Redactor) -> Result<()> {
        self.print_header();
        self.print_notes();
        self.print_running();
        self.print_failures(redactor);
        self.print_problems(redactor);
        self.print_circuits(redactor);
        super::mcp::print_server_states(&self.mcp_servers, redactor)?;
        self.print_rates();
        Ok(())
    }

    /// Vault, daemon, runner, state dir, and why nothing is claimed (paused) if so.
    fn print_header(&self) {
        let Report {
            vault_root,
            state_dir,
            daemon_pid,
            runner,
            pause,
            storage_pause,
            ..
        } = self;
        println!("vault  {}", vault_root.display());
        match daemon_pid {
            Some(pid) => println!("daemon running (PID {pid})"),
            None => println!("daemon not running"),
        }
        match &runner {
            Some(r) => println!("runner {r} (the tool_runner of the notes this daemon claims)"),
            None => println!("runner none yet (made at the first start)"),
        }
        println!("state  {}", state_dir.display());
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
    }

    /// Notes per state folder, and those with nothing pending.
    fn print_notes(&self) {
        let Report {
            vault,
            counts,
            nothing_pending,
            ..
        } = self;
        println!("\nnotes");
        let width = State::ALL
            .iter()
            .map(|s| vault.folder_name(*s).chars().count())
            .max()
            .unwrap_or(0);
        for (s, n) in counts {
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
    }

    fn print_running(&self) {
        let running = &self.running;
        println!("\nrunning now");
        if running.is_empty() {
            println!("  nothing");
        }
        for e in running {
            println!(
                "  {}  {}  {} for {} ms",
                escape_controls(&e.note),
                e.call_id.as_deref().unwrap_or(""),
                e.tool.as_deref().unwrap_or(""),
                e.duration_ms.unwrap_or(0)
            );
        }
    }

    /// Recent failures, each with where its note is now.
    fn print_failures(&self, redactor: &crate::secret::Redactor) {
        let Report {
            failures,
            failed_notes_now,
            ..
        } = self;
        println!("\nrecent failures");
        if failures.is_empty() {
            println!("  none");
        }
        for (f, now) in failures.iter().zip(failed_notes_now) {
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
    }

    fn print_problems(&self, redactor: &crate::secret::Redactor) {
        let problems = &self.problems;
        if !problems.is_empty() {
            println!("\nnotes vaultd cannot process");
            for e in problems {
                println!(
                    "  {}  {}: {}",
                    e.time,
                    escape_controls(&e.note),
                    redactor.redact(e.detail.as_deref().unwrap_or(""))
                );
            }
        }
    }

    fn print_circuits(&self, redactor: &crate::secret::Redactor) {
        let circuits = &self.circuits;
        if !circuits.is_empty() {
            println!("\nopen circuits");
            let width = circuits
                .iter()
                .map(|c| c.key.chars().count())
                .max()
                .unwrap_or(0);
            for c in circuits {
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
    }

    fn print_rates(&self) {
        let rates = &self.rates;
        println!("\nrate limits");
        // Aligned to the longest name: command and MCP tools (mcp__SERVER__TOOL) run long.
        let width = rates
            .iter()
            .map(|r| r["tool"].as_str().unwrap_or("").chars().count())
            .max()
            .unwrap_or(0);
        for r in rates {
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
    }
}

/// Where the note of each failed call is now (vault-relative): the path its run last
/// recorded if the note there still carries its `tool_note`, else the note in any state
/// folder that carries it (one scan of the folders, made only when a note was moved by hand
/// since, e.g. back into Needs_Action/); None when it is nowhere in them.
pub(super) fn notes_now(
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
