//! Circuit breakers (docs/design.md §12.3): after `failures` consecutive retryable failures of one
//! tool (or of any tool of one MCP server), its calls fail at once for `open_for` with a
//! retryable EXECUTION_ERROR ("circuit open until …"); then one trial call decides. The state
//! lives in memory; every transition is logged and the open circuits are mirrored into
//! `<state_dir>/circuits.json` for `vaultd status`.

use crate::call::{CallError, ErrorCode, ToolOutput, rfc3339_seconds};
use crate::guard::BreakerConfig;
use crate::tools::{Source, ToolSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// The file the daemon mirrors its open circuits into, in the state dir.
pub const STATE_FILE: &str = "circuits.json";

/// The breaker a tool's calls count against: `mcp:SERVER` for every tool of one MCP server
/// (a server that is down fails all its tools), else the tool's own name.
pub fn circuit_key(spec: &ToolSpec) -> String {
    match &spec.source {
        Source::Mcp(server) => format!("mcp:{server}"),
        _ => spec.name.clone(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Closed,
    Open {
        until: SystemTime,
    },
    /// The cool-down passed and one trial call is running; the others still fail at once.
    Trial,
}

#[derive(Debug, Clone)]
struct Circuit {
    /// Consecutive retryable failures so far.
    failures: u32,
    phase: Phase,
    /// The message of the failure that opened it, shown in errors and `vaultd status`.
    last_error: String,
}

/// What [`Breakers::admit`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Closed: run as usual.
    Pass,
    /// The one trial call after the cool-down: its outcome closes or reopens the circuit.
    Trial,
}

/// One circuit as `vaultd status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CircuitStatus {
    /// A tool name, or `mcp:SERVER`.
    pub key: String,
    /// `open` or `half_open` (a trial call is running).
    pub state: String,
    /// RFC 3339; when calls may try again.
    pub until: Option<String>,
    pub failures: u32,
    pub last_error: String,
}

/// The file `vaultd status` reads.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct StateFile {
    /// The daemon that wrote it: a file left by a daemon that is gone is stale.
    pub pid: u32,
    pub circuits: Vec<CircuitStatus>,
}

pub struct Breakers {
    config: BreakerConfig,
    circuits: Mutex<BTreeMap<String, Circuit>>,
    /// Where open circuits are mirrored; `None` keeps them in memory only.
    state_file: Option<PathBuf>,
}

impl Breakers {
    pub fn new(config: BreakerConfig) -> Breakers {
        Breakers {
            config,
            circuits: Mutex::new(BTreeMap::new()),
            state_file: None,
        }
    }

    /// Mirrors the open circuits into `state_dir/circuits.json` (written now, empty).
    pub fn with_state_file(mut self, state_dir: &Path) -> Breakers {
        self.state_file = Some(state_dir.join(STATE_FILE));
        self.save(&BTreeMap::new());
        self
    }

    /// Whether a call counted against `key` may run now. An open circuit whose cool-down has
    /// passed lets exactly one call through as its trial.
    pub fn admit(&self, key: &str, tool: &str) -> Result<Gate, CallError> {
        let mut circuits = self.circuits.lock().expect("breaker lock poisoned");
        let Some(c) = circuits.get_mut(key) else {
            return Ok(Gate::Pass);
        };
        match c.phase {
            Phase::Closed => Ok(Gate::Pass),
            Phase::Open { until } if SystemTime::now() >= until => {
                c.phase = Phase::Trial;
                tracing::info!(circuit = key, "circuit half-open: one trial call of {tool} decides");
                let snapshot = circuits.clone();
                drop(circuits);
                self.save(&snapshot);
                Ok(Gate::Trial)
            }
            Phase::Open { until } => Err(open_error(key, tool, until, c)),
            Phase::Trial => Err(CallError::new(
                ErrorCode::ExecutionError,
                format!(
                    "circuit {key} is half-open: a trial call is deciding whether it works again after {} failures in a row (last: {}); try again shortly",
                    c.failures, c.last_error
                ),
            )
            .retryable(true)),
        }
    }

    /// Counts a finished call. A retryable EXECUTION_ERROR or TIMEOUT is a failure; anything
    /// else (success, or a clear answer such as a 404) shows the tool works and closes it.
    pub fn record(&self, key: &str, gate: Gate, outcome: &Result<ToolOutput, CallError>) {
        let failed = match outcome {
            Err(e) => {
                e.retryable && matches!(e.code, ErrorCode::ExecutionError | ErrorCode::Timeout)
            }
            Ok(_) => false,
        };
        let mut circuits = self.circuits.lock().expect("breaker lock poisoned");
        let changed = if failed {
            let message = outcome
                .as_ref()
                .err()
                .map(|e| format!("{}: {}", e.code, e.message))
                .unwrap_or_default();
            let c = circuits.entry(key.to_string()).or_insert(Circuit {
                failures: 0,
                phase: Phase::Closed,
                last_error: String::new(),
            });
            c.failures += 1;
            c.last_error = message;
            let reopen = gate == Gate::Trial;
            if reopen || (c.phase == Phase::Closed && c.failures >= self.config.failures) {
                let until = whole_second_after(SystemTime::now() + self.config.open_for);
                c.phase = Phase::Open { until };
                tracing::warn!(
                    circuit = key,
                    failures = c.failures,
                    "circuit open until {}: {}",
                    rfc3339_seconds(until),
                    c.last_error
                );
                true
            } else {
                false
            }
        } else {
            match circuits.remove(key) {
                Some(c) if c.phase != Phase::Closed => {
                    tracing::info!(circuit = key, "circuit closed: the trial call worked");
                    true
                }
                _ => false,
            }
        };
        if changed {
            let snapshot = circuits.clone();
            drop(circuits);
            self.save(&snapshot);
        }
    }

    /// A trial call that never reached the tool (rate limit, journal): the next call is the
    /// trial instead.
    pub fn release_trial(&self, key: &str) {
        let mut circuits = self.circuits.lock().expect("breaker lock poisoned");
        if let Some(c) = circuits.get_mut(key)
            && c.phase == Phase::Trial
        {
            c.phase = Phase::Open {
                until: SystemTime::now(),
            };
        }
    }

    /// Ends the cool-down of an open circuit now (tests stand in for the clock).
    #[cfg(test)]
    fn cool_down_now(&self, key: &str) {
        let mut circuits = self.circuits.lock().expect("breaker lock poisoned");
        if let Some(c) = circuits.get_mut(key)
            && matches!(c.phase, Phase::Open { .. })
        {
            c.phase = Phase::Open {
                until: SystemTime::now(),
            };
        }
    }

    /// The circuits that are not closed.
    pub fn snapshot(&self) -> Vec<CircuitStatus> {
        statuses(&self.circuits.lock().expect("breaker lock poisoned"))
    }

    /// Writes the open circuits atomically (temp file, rename), mode 0600. A failure is
    /// logged: the breakers work without the file, only `vaultd status` misses them.
    fn save(&self, circuits: &BTreeMap<String, Circuit>) {
        let Some(path) = &self.state_file else {
            return;
        };
        let file = StateFile {
            pid: std::process::id(),
            circuits: statuses(circuits),
        };
        if let Err(e) = write_private(path, &file) {
            tracing::warn!(file = %path.display(), "cannot record the circuit states for vaultd status: {e}");
        }
    }
}

fn statuses(circuits: &BTreeMap<String, Circuit>) -> Vec<CircuitStatus> {
    circuits
        .iter()
        .filter_map(|(key, c)| {
            let (state, until) = match c.phase {
                Phase::Closed => return None,
                Phase::Open { until } => ("open", Some(rfc3339_seconds(until))),
                Phase::Trial => ("half_open", None),
            };
            Some(CircuitStatus {
                key: key.clone(),
                state: state.to_string(),
                until,
                failures: c.failures,
                last_error: c.last_error.clone(),
            })
        })
        .collect()
}

/// Messages show the time to the second: the circuit opens up no earlier than they say.
fn whole_second_after(t: SystemTime) -> SystemTime {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() + u64::from(since.subsec_nanos() > 0);
    SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)
}

fn open_error(key: &str, tool: &str, until: SystemTime, c: &Circuit) -> CallError {
    let until_s = rfc3339_seconds(until);
    CallError::new(
        ErrorCode::ExecutionError,
        format!(
            "circuit open until {until_s}: {key} failed {} times in a row (last: {}); {tool} was not called. After that time one trial call decides whether it works again",
            c.failures, c.last_error
        ),
    )
    .retryable(true)
    .with_details(serde_json::json!({ "circuit": key, "open_until": until_s }))
}

fn write_private(path: &Path, file: &StateFile) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let text = serde_json::to_string_pretty(file).map_err(std::io::Error::other)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The open circuits a running daemon recorded (for `vaultd status`); empty when the file is
/// missing, unreadable, or was left by a daemon that is not `running_pid`.
pub fn read_state_file(state_dir: &Path, running_pid: Option<u32>) -> Vec<CircuitStatus> {
    let Some(pid) = running_pid else {
        return Vec::new();
    };
    std::fs::read_to_string(state_dir.join(STATE_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<StateFile>(&t).ok())
        .filter(|f| f.pid == pid)
        .map(|f| f.circuits)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn failure() -> Result<ToolOutput, CallError> {
        Err(CallError::new(ErrorCode::ExecutionError, "503").retryable(true))
    }

    fn success() -> Result<ToolOutput, CallError> {
        Ok(ToolOutput {
            data: serde_json::json!({}),
            summary: String::new(),
            undo: None,
        })
    }

    fn breakers(open_for: Duration) -> Breakers {
        Breakers::new(BreakerConfig {
            failures: 5,
            open_for,
        })
    }

    #[test]
    fn five_retryable_failures_open_the_circuit() {
        let b = breakers(Duration::from_secs(60));
        for _ in 0..4 {
            assert_eq!(b.admit("t", "t").unwrap(), Gate::Pass);
            b.record("t", Gate::Pass, &failure());
        }
        assert_eq!(b.admit("t", "t").unwrap(), Gate::Pass);
        b.record("t", Gate::Pass, &failure());
        let e = b.admit("t", "t").unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
        assert!(e.retryable);
        assert!(
            e.message.starts_with("circuit open until "),
            "{}",
            e.message
        );
        assert_eq!(b.snapshot()[0].state, "open");
    }

    #[test]
    fn a_success_or_a_permanent_error_resets_the_count() {
        let b = breakers(Duration::from_secs(60));
        for _ in 0..4 {
            b.record("t", Gate::Pass, &failure());
        }
        b.record(
            "t",
            Gate::Pass,
            &Err(CallError::new(ErrorCode::ExecutionError, "404")),
        );
        for _ in 0..4 {
            b.record("t", Gate::Pass, &failure());
        }
        assert_eq!(b.admit("t", "t").unwrap(), Gate::Pass);
        b.record("t", Gate::Pass, &success());
        for _ in 0..4 {
            b.record("t", Gate::Pass, &failure());
        }
        assert_eq!(b.admit("t", "t").unwrap(), Gate::Pass);
    }

    #[test]
    fn the_time_shown_is_never_earlier_than_the_real_one() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_001);
        let shown = whole_second_after(t);
        assert!(shown >= t);
        assert_eq!(rfc3339_seconds(shown), "2023-11-14T22:13:21Z");
        let whole = SystemTime::UNIX_EPOCH + Duration::from_secs(5);
        assert_eq!(whole_second_after(whole), whole);
    }

    #[test]
    fn one_trial_after_the_cool_down_decides() {
        let b = breakers(Duration::ZERO);
        for _ in 0..5 {
            b.record("t", Gate::Pass, &failure());
        }
        b.cool_down_now("t");
        assert_eq!(b.admit("t", "t").unwrap(), Gate::Trial);
        // While the trial runs, everything else fails at once.
        assert!(b.admit("t", "t").unwrap_err().message.contains("half-open"));
        b.record("t", Gate::Trial, &failure());
        // One failed trial opens it again for another cool-down.
        assert!(
            b.admit("t", "t")
                .unwrap_err()
                .message
                .starts_with("circuit open until")
        );
        b.cool_down_now("t");
        assert_eq!(b.admit("t", "t").unwrap(), Gate::Trial);
        b.record("t", Gate::Trial, &success());
        assert_eq!(b.admit("t", "t").unwrap(), Gate::Pass);
        assert!(b.snapshot().is_empty());
    }

    #[test]
    fn circuits_are_separate_and_mcp_tools_share_their_servers() {
        let b = breakers(Duration::from_secs(60));
        for _ in 0..5 {
            b.record("a", Gate::Pass, &failure());
        }
        assert!(b.admit("a", "a").is_err());
        assert_eq!(b.admit("b", "b").unwrap(), Gate::Pass);
        let spec = |source| ToolSpec {
            name: "mcp__files__read".into(),
            description: String::new(),
            source,
            effect: crate::tools::Effect::ReadOnly,
            schema: serde_json::json!({}),
        };
        assert_eq!(circuit_key(&spec(Source::Mcp("files".into()))), "mcp:files");
        assert_eq!(circuit_key(&spec(Source::Builtin)), "mcp__files__read");
    }

    #[test]
    fn the_state_file_shows_open_circuits_of_the_running_daemon_only() {
        let dir = tempfile::tempdir().unwrap();
        let b = breakers(Duration::from_secs(60)).with_state_file(dir.path());
        for _ in 0..5 {
            b.record("search_web", Gate::Pass, &failure());
        }
        let me = std::process::id();
        let shown = read_state_file(dir.path(), Some(me));
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0].key, "search_web");
        assert!(read_state_file(dir.path(), Some(me + 1)).is_empty());
        assert!(read_state_file(dir.path(), None).is_empty());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(STATE_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
