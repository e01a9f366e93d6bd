//! The command tool source (docs/design.md §10.5): `[tools.command.NAME]` runs a program, never a
//! shell, in a sandbox ([`sandbox`]), with its output capped and its whole process group
//! killed on timeout. [`config`] reads and checks the tables; [`register`] adds the tools.

pub mod config;
pub mod sandbox;

use crate::call::{CallError, ErrorCode, ToolOutput};
use crate::tools::{Policy, Registry, RegistryError, Source, Tool, ToolCall, ToolFuture, ToolSpec};
use config::{CommandToolConfig, CommandTools, Cwd, Output, Piece};
use sandbox::{Limits, Support};
use serde_json::{Map, Value, json};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Adds every configured command tool. Landlock is probed once; what it found is logged
/// and shown by `vaultd tools`. A `required` sandbox the kernel cannot give leaves the
/// tool listed but unusable, with the reason (never silently unsandboxed).
pub fn register(config: &CommandTools, registry: &mut Registry) -> Result<(), RegistryError> {
    if config.tools.is_empty() {
        return Ok(());
    }
    let support = Arc::new(Support::probe());
    tracing::info!(
        tools = config.tools.len(),
        "command tools: sandbox: {}",
        support.describe()
    );
    if rustix::process::getuid().is_root() {
        tracing::warn!(
            "vaultd runs as root: the kernel does not apply the process limit (RLIMIT_NPROC) to root, so command tools' max_processes is not enforced; run vaultd as its own user"
        );
    }
    for tool in &config.tools {
        let unusable = support.allows(tool.sandbox, tool.network).err();
        if let Some(why) = &unusable {
            tracing::error!(tool = %tool.name, "command tool unusable: {why}");
        }
        let policy = Policy {
            enabled: tool.enabled,
            timeout: tool.timeout,
            rate_limit: tool.rate_limit,
            approval: Some(tool.approval),
        };
        registry.add(
            Box::new(CommandTool {
                spec: ToolSpec {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    source: Source::Command,
                    effect: tool.effect,
                    schema: tool.schema.clone(),
                },
                config: tool.clone(),
                vault: config.vault.clone(),
                scratch_root: config.scratch_root.clone(),
                support: support.clone(),
                unusable,
            }),
            policy,
        )?;
    }
    Ok(())
}

/// One `[tools.command.NAME]`.
pub struct CommandTool {
    spec: ToolSpec,
    config: CommandToolConfig,
    vault: PathBuf,
    scratch_root: PathBuf,
    support: Arc<Support>,
    /// Why this kernel cannot run the tool as configured (`sandbox = "required"`).
    unusable: Option<String>,
}

impl Tool for CommandTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn details(&self) -> Option<Value> {
        Some(json!({
            "argv": std::iter::once(self.config.argv0.clone())
                .chain(self.config.args.iter().map(|a| render_template_source(a)))
                .collect::<Vec<_>>(),
            "sandbox": self.config.sandbox.as_str(),
            "landlock_abi": self.support.abi,
            "fully_enforced": self.support.fully_enforced && self.unusable.is_none(),
            "sandbox_status": self.support.describe(),
            "network": self.config.network,
            "unusable": self.unusable,
        }))
    }

    fn run<'a>(&'a self, call: ToolCall<'a>) -> ToolFuture<'a> {
        Box::pin(self.run_call(call))
    }
}

/// The note id a program sees as `VAULTD_NOTE_ID`: the note's `tool_note` (docs/design.md §9.2).
fn note_id<'a>(call: &ToolCall<'a>) -> &'a str {
    call.note_id
}

impl CommandTool {
    async fn run_call(&self, call: ToolCall<'_>) -> Result<ToolOutput, CallError> {
        if let Some(why) = &self.unusable {
            return Err(CallError::new(ErrorCode::PolicyDenied, why.clone()));
        }
        let c = &self.config;
        let args = render_args(&c.args, call.parameters, &c.schema);
        let scratch = ScratchDir::create(&self.scratch_root, call.call_id).map_err(|e| {
            CallError::new(
                ErrorCode::ExecutionError,
                format!("cannot make the scratch dir: {e}"),
            )
            .retryable(true)
        })?;
        let ruleset = match sandbox::ruleset(c, &self.vault, &scratch.path) {
            Ok(r) => Some(r),
            Err(e) if c.sandbox == config::SandboxMode::BestEffort => {
                tracing::warn!(tool = %c.name, "running without Landlock: {e}");
                None
            }
            Err(e) => {
                return Err(CallError::new(
                    ErrorCode::ExecutionError,
                    format!("the sandbox could not be built: {e}"),
                ));
            }
        };
        let limits = Limits::for_tool(c);
        let mut cmd = std::process::Command::new(&c.program);
        cmd.arg0(&c.argv0)
            .args(&args)
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| config::DEFAULT_PATH.into()),
            )
            .env(
                "LANG",
                std::env::var_os("LANG").unwrap_or_else(|| "C.UTF-8".into()),
            )
            .env("HOME", &scratch.path)
            .env("VAULTD_NOTE_ID", note_id(&call))
            .env("VAULTD_CALL_ID", call.call_id)
            .envs(c.env.iter().map(|(k, v)| (k, v.value())))
            .current_dir(match c.cwd {
                Cwd::Vault => &self.vault,
                Cwd::Scratch => &scratch.path,
            })
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mode = c.sandbox;
        let mut ruleset = ruleset;
        // SAFETY: `enter` makes only system calls (setsid, setrlimit, prctl, capset,
        // landlock_restrict_self) and allocates nothing on its success path.
        unsafe {
            cmd.pre_exec(move || sandbox::enter(&mut ruleset, limits, mode));
        }
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            let message = if e.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error()) {
                format!(
                    "{} was not started: the sandbox could not be applied ({e}); sandbox = \"required\" never runs a program unsandboxed",
                    c.argv0
                )
            } else {
                format!("{} could not be started: {e}", c.argv0)
            };
            CallError::new(ErrorCode::ExecutionError, message)
        })?;
        // From here on, dropping this future (the runner's timeout) kills the whole group.
        let group = GroupGuard(std::sync::atomic::AtomicI32::new(
            child.id().map_or(0, |pid| pid as i32),
        ));
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let max = c.max_output_bytes;
        let deadline = tokio::time::Instant::from_std(call.deadline);
        let run = async {
            let wait = async {
                let status = child.wait().await;
                // The program is done: what it left running in its group goes too. Its
                // pid is free again now, so the guard is disarmed at once.
                group.kill();
                group.disarm();
                status
            };
            tokio::join!(wait, read_capped(stdout, max), read_capped(stderr, max))
        };
        let (status, out, err) = match tokio::time::timeout_at(deadline, run).await {
            Ok(done) => done,
            Err(_) => {
                group.kill();
                return Err(CallError::new(
                    ErrorCode::Timeout,
                    format!(
                        "{} did not finish within its timeout of {}; its process group was killed",
                        c.name,
                        humantime::format_duration(c.timeout)
                    ),
                ));
            }
        };
        drop(scratch);
        let status = status.map_err(|e| {
            CallError::new(
                ErrorCode::ExecutionError,
                format!("waiting for {}: {e}", c.argv0),
            )
        })?;
        let (stdout, stdout_truncated) = out.map_err(read_error)?;
        let (stderr, stderr_truncated) = err.map_err(read_error)?;
        finish(
            c,
            status,
            stdout,
            stdout_truncated,
            stderr,
            stderr_truncated,
        )
    }
}

fn read_error(e: std::io::Error) -> CallError {
    CallError::new(
        ErrorCode::ExecutionError,
        format!("reading the program's output: {e}"),
    )
}

/// Maps the exit status and output to a result (docs/design.md §10.5).
fn finish(
    c: &CommandToolConfig,
    status: std::process::ExitStatus,
    stdout: Vec<u8>,
    stdout_truncated: bool,
    stderr: Vec<u8>,
    stderr_truncated: bool,
) -> Result<ToolOutput, CallError> {
    use std::os::unix::process::ExitStatusExt;
    let stdout_text = String::from_utf8_lossy(&stdout).into_owned();
    let stderr_text = String::from_utf8_lossy(&stderr).into_owned();
    let mut data = Map::new();
    data.insert("exit_code".into(), json!(status.code()));
    if let Some(sig) = status.signal() {
        data.insert("signal".into(), json!(sig));
    }
    data.insert("stderr".into(), Value::String(stderr_text.clone()));
    if stdout_truncated {
        data.insert("stdout_truncated".into(), Value::Bool(true));
    }
    if stderr_truncated {
        data.insert("stderr_truncated".into(), Value::Bool(true));
    }
    if !status.success() {
        data.insert("stdout".into(), Value::String(stdout_text));
        let how = match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(sig)) => format!("was killed by signal {sig}{}", signal_hint(sig)),
            _ => "failed".to_string(),
        };
        let tail = tail(&stderr_text, 500);
        let message = if tail.is_empty() {
            format!("{} {how}", c.argv0)
        } else {
            format!("{} {how}: {tail}", c.argv0)
        };
        return Err(
            CallError::new(ErrorCode::ExecutionError, message).with_details(Value::Object(data))
        );
    }
    let stdout_value = match c.output {
        Output::Text => Value::String(stdout_text),
        Output::Json => {
            let parsed = if stdout_truncated {
                Err(format!(
                    "stdout is over max_output_bytes ({})",
                    c.max_output_bytes
                ))
            } else {
                serde_json::from_slice::<Value>(&stdout).map_err(|e| e.to_string())
            };
            match parsed {
                Ok(v) => v,
                Err(why) => {
                    data.insert("stdout".into(), Value::String(stdout_text));
                    return Err(CallError::new(
                        ErrorCode::ExecutionError,
                        format!("{} printed no JSON (output = \"json\"): {why}", c.argv0),
                    )
                    .with_details(Value::Object(data)));
                }
            }
        }
    };
    let bytes = stdout.len();
    data.insert("stdout".into(), stdout_value);
    Ok(ToolOutput {
        data: Value::Object(data),
        summary: format!(
            "exit 0, {bytes} bytes of output{}",
            if stdout_truncated { " (truncated)" } else { "" }
        ),
        undo: None,
    })
}

fn signal_hint(sig: i32) -> &'static str {
    match sig {
        24 => " (SIGXCPU: over its CPU time)",
        25 => " (SIGXFSZ: a file over the size limit)",
        9 => " (SIGKILL)",
        11 => " (SIGSEGV; out of max_memory?)",
        6 => " (SIGABRT; out of max_memory?)",
        _ => "",
    }
}

/// The last `max` bytes of `s`, on a character boundary.
fn tail(s: &str, max: usize) -> &str {
    let s = s.trim_end();
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Reads a stream to its end, keeping the first `max` bytes and dropping the rest, so a
/// program printing without end neither blocks on a full pipe nor fills memory.
async fn read_capped(
    mut stream: impl AsyncRead + Unpin,
    max: usize,
) -> std::io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut truncated = false;
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok((kept, truncated));
        }
        let room = max.saturating_sub(kept.len());
        if n > room {
            truncated = true;
        }
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// argv[1..] with each `{param}` replaced by the validated value, inside its one argument.
/// An argument naming an absent optional parameter (without a schema `default`) is left out.
fn render_args(
    args: &[Vec<Piece>],
    parameters: &Map<String, Value>,
    schema: &Value,
) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    'args: for pieces in args {
        let mut arg = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(t) => arg.push_str(t),
                Piece::Param(name) => {
                    let value = parameters
                        .get(name)
                        .or_else(|| schema.pointer(&format!("/properties/{name}/default")));
                    match value {
                        Some(Value::String(s)) => arg.push_str(s),
                        Some(Value::Number(n)) => arg.push_str(&n.to_string()),
                        Some(Value::Bool(b)) => arg.push_str(if *b { "true" } else { "false" }),
                        // The schema allows only scalars here (checked at start).
                        Some(_) | None => continue 'args,
                    }
                }
            }
        }
        out.push(arg);
    }
    out
}

/// The argv element as written in the config, for `vaultd tools`.
fn render_template_source(pieces: &[Piece]) -> String {
    pieces
        .iter()
        .map(|p| match p {
            Piece::Text(t) => t.replace('{', "{{").replace('}', "}}"),
            Piece::Param(n) => format!("{{{n}}}"),
        })
        .collect()
}

/// Kills the program's whole process group (its pgid is its pid: `setsid` in the child)
/// when the call ends early: timeout, or the runner dropping the call.
struct GroupGuard(std::sync::atomic::AtomicI32);

impl GroupGuard {
    fn kill(&self) {
        let raw = self.0.load(std::sync::atomic::Ordering::Relaxed);
        if let Some(pid) = rustix::process::Pid::from_raw(raw) {
            // ESRCH when the group is already gone: nothing to do.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }

    /// After the program was reaped: its pid may be reused, so never signal it again.
    fn disarm(&self) {
        self.0.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A fresh, empty directory for one call (the program's HOME), removed afterwards.
struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    fn create(root: &Path, call_id: &str) -> std::io::Result<ScratchDir> {
        std::fs::create_dir_all(root)?;
        let safe: String = call_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let path = root.join(format!("{safe}-{}", std::process::id()));
        // Left over from a crash: start empty.
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
        std::fs::create_dir(&path)?;
        Ok(ScratchDir { path })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), "scratch dir not removed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn each_placeholder_stays_inside_its_one_argument() {
        let args: Vec<Vec<Piece>> = ["-w", "{path}", "--n={n}", "{flag}", "{opt}"]
            .iter()
            .map(|a| config::parse_template(a).unwrap())
            .collect();
        let schema = json!({ "properties": { "opt": { "type": "string" } } });
        let out = render_args(
            &args,
            &params(json!({ "path": "a b; $(rm -rf /)\n-x", "n": 3, "flag": true })),
            &schema,
        );
        assert_eq!(out, vec!["-w", "a b; $(rm -rf /)\n-x", "--n=3", "true"]);
        let with_default = json!({ "properties": { "opt": { "type": "string", "default": "d" } } });
        let out = render_args(&args[4..], &Map::new(), &with_default);
        assert_eq!(out, vec!["d"]);
    }

    #[tokio::test]
    async fn output_past_the_cap_is_read_and_dropped() {
        let data = vec![b'a'; 300_000];
        let (kept, truncated) = read_capped(&data[..], 1000).await.unwrap();
        assert_eq!(kept.len(), 1000);
        assert!(truncated);
        let (kept, truncated) = read_capped(&data[..10], 1000).await.unwrap();
        assert_eq!(kept.len(), 10);
        assert!(!truncated);
    }

    #[test]
    fn the_tail_is_cut_on_a_character_boundary() {
        assert_eq!(tail("ééé", 3), "é");
        assert_eq!(tail("abc\n", 10), "abc");
    }
}
