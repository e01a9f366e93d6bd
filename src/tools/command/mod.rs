//! The command tool source (docs/design.md §10.5): `[tools.command.NAME]` runs a program, never a
//! shell, in a sandbox ([`sandbox`]), with its output capped and its whole process group
//! killed on timeout. [`config`] reads and checks the tables; [`register`] adds the tools.

pub mod config;
mod preview;
pub mod sandbox;

use crate::call::{CallError, ErrorCode, ToolOutput};
use crate::tools::sandbox::cgroup::{CallCgroup, CallLimits, Cgroups};
use crate::tools::sandbox::{seccomp, supervise};
use crate::tools::{Policy, Registry, RegistryError, Source, Tool, ToolCall, ToolFuture, ToolSpec};
use config::{CommandToolConfig, CommandTools, Cwd, Output, Piece};
use landlock::RulesetCreated;
use sandbox::{Limits, Support};
use serde_json::{Map, Value, json};
use std::os::fd::{AsRawFd, OwnedFd};
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
    let cgroups = Cgroups::shared();
    tracing::info!(
        tools = config.tools.len(),
        "command tools: sandbox: {}; {}",
        support.describe(),
        cgroups.describe()
    );
    if rustix::process::getuid().is_root() && !cgroups.bounds_processes() {
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
                cgroups: cgroups.clone(),
                filter: seccomp::filter(tool.network).ok().map(Arc::new),
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
    /// The per-call cgroups this vaultd can make (none: supervisor and rlimits only).
    cgroups: Arc<Cgroups>,
    /// The seccomp filter for this tool's `network`, compiled once (None: the arch has none).
    filter: Option<Arc<seccomp::Filter>>,
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
            "sandbox_status": format!("{}; {}", self.support.describe(), self.cgroups.describe()),
            "read": self.config.read,
            "writable": self.config.writable,
            "network": self.config.network,
            "unusable": self.unusable,
        }))
    }

    fn run<'a>(&'a self, call: ToolCall<'a>) -> ToolFuture<'a> {
        Box::pin(self.run_call(call))
    }

    /// The argv and the sandbox ([`preview`]).
    fn preview(&self, call: ToolCall<'_>) -> Value {
        self.would(call)
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
        let (scratch, tmp) = make_scratch(&self.scratch_root, call.call_id)?;
        let ruleset = self.build_ruleset(&scratch.path)?;
        let limits = Limits::for_tool(c, &self.cgroups);
        let cgroup = self.cgroups.for_call(CallLimits {
            memory: c.max_memory,
            processes: c.max_processes,
        });
        let (control_read, control_write) = supervise::control_pipe().map_err(|e| {
            CallError::new(
                ErrorCode::ExecutionError,
                format!("cannot make the supervisor's pipe: {e}"),
            )
            .retryable(true)
        })?;
        // From here on, dropping this future (the runner's timeout) ends every process of
        // the call: the supervisor sees its pipe close; the cgroup is killed.
        let scratch_path = scratch.path.clone();
        let end = CallEnd {
            control: Some(control_write),
            cgroup,
            scratch: Some(scratch),
        };
        let program = prepare_program(c, &args, &scratch_path, &tmp, &call)?;
        let child =
            self.start_supervised(program, ruleset, limits, control_read, &end, &scratch_path)?;
        wait_and_finish(c, end, child, call.deadline).await
    }

    /// run_call's Landlock stage: the call's ruleset, or none where `best_effort` lets the
    /// program run without one.
    fn build_ruleset(&self, scratch: &Path) -> Result<Option<RulesetCreated>, CallError> {
        let c = &self.config;
        let ruleset = match sandbox::ruleset(c, &self.vault, scratch) {
            Ok(r) => Some(r),
            Err(sandbox::RulesetBuildError::Path(why)) => {
                return Err(CallError::new(
                    ErrorCode::PolicyDenied,
                    format!("{} was not started: {why}", c.argv0),
                ));
            }
            Err(sandbox::RulesetBuildError::Landlock(e))
                if c.sandbox == config::SandboxMode::BestEffort =>
            {
                tracing::warn!(tool = %c.name, "running without Landlock: {e}");
                None
            }
            Err(sandbox::RulesetBuildError::Landlock(e)) => {
                return Err(CallError::new(
                    ErrorCode::ExecutionError,
                    format!("the sandbox could not be built: {e}"),
                ));
            }
        };
        Ok(ruleset)
    }

    /// run_call's start stage: the supervisor (working directory, stdio), which starts
    /// `program` in its sandbox; started in vaultd's memory where it can be
    /// ([`supervise::spawn`]: no copy of vaultd's page tables at each call), else forked.
    fn start_supervised(
        &self,
        program: supervise::Program,
        ruleset: Option<RulesetCreated>,
        limits: Limits,
        control_read: OwnedFd,
        end: &CallEnd,
        scratch_path: &Path,
    ) -> Result<Started, CallError> {
        let c = &self.config;
        let cwd = match c.cwd {
            Cwd::Vault => self.vault.as_path(),
            Cwd::Scratch => scratch_path,
        };
        let mode = c.sandbox;
        let mut ruleset = ruleset;
        let join = end
            .cgroup
            .as_ref()
            .map(CallCgroup::join)
            .unwrap_or_default();
        if supervise::in_shared_memory() {
            let filter = self.filter.as_deref();
            let ruleset = &ruleset;
            // SAFETY: `enter` makes only system calls (fcntl, setrlimit, capset, prctl,
            // landlock_restrict_self, seccomp) on memory made before, and allocates nothing
            // on its success path; we are inside the runtime (`run_call`).
            let spawned = unsafe {
                supervise::spawn(cwd, control_read.as_raw_fd(), &join, &program, &mut || {
                    // The program's process shares vaultd's memory: what it takes from
                    // `ruleset` (its fd, closed in the program's fd table only) would be
                    // gone from vaultd's, and vaultd's fd never closed. It takes a copy.
                    let mut copy = ruleset.as_ref().map(|r| r.try_clone()).transpose()?;
                    sandbox::enter(&mut copy, filter, limits, mode)
                })
            };
            drop(control_read);
            // With it go argv, environment and the program's stack.
            drop(program);
            return spawned
                .map(Started::Shared)
                .map_err(|e| self.spawn_error(e));
        }
        // std's Command forks the supervisor (stdio, working directory); the program is
        // started by the supervisor from `program`, so argv and environment are set there.
        let mut cmd = std::process::Command::new(&c.program);
        cmd.env_clear()
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let filter = self.filter.clone();
        let control = control_read.as_raw_fd();
        // SAFETY: `split` and `enter` make only system calls (setsid, write, prctl, clone3,
        // setrlimit, capset, landlock_restrict_self, seccomp, execve; the supervisor: poll,
        // waitpid, kill, /proc reads into stack buffers) on memory made before the fork, and
        // allocate nothing on their success path; `enter` runs in the program's process.
        unsafe {
            cmd.pre_exec(move || {
                Err(supervise::split(control, &join, &program, &mut || {
                    sandbox::enter(&mut ruleset, filter.as_deref(), limits, mode)
                }))
            });
        }
        let mut cmd = tokio::process::Command::from(cmd);
        let spawned = cmd.spawn();
        drop(control_read);
        // With it go vaultd's copies of argv, environment and the program's stack.
        drop(cmd);
        spawned
            .map(Started::Forked)
            .map_err(|e| self.spawn_error(e))
    }

    fn spawn_error(&self, e: std::io::Error) -> CallError {
        let c = &self.config;
        let message = if e.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error()) {
            format!(
                "{} was not started: the sandbox could not be applied ({e}); sandbox = \"required\" never runs a program unsandboxed",
                c.argv0
            )
        } else {
            format!("{} could not be started: {e}", c.argv0)
        };
        CallError::new(ErrorCode::ExecutionError, message)
    }
}

/// A program started under its supervisor: forked by std (where the supervisor cannot
/// share vaultd's memory), or started in it ([`supervise::spawn`]).
enum Started {
    Forked(tokio::process::Child),
    Shared(supervise::Spawned),
}

/// run_call's scratch stage: the call's scratch dir (the program's HOME) and its private
/// TMPDIR inside it.
fn make_scratch(root: &Path, call_id: &str) -> Result<(ScratchDir, PathBuf), CallError> {
    let scratch = ScratchDir::create(root, call_id).map_err(|e| {
        CallError::new(
            ErrorCode::ExecutionError,
            format!("cannot make the scratch dir: {e}"),
        )
        .retryable(true)
    })?;
    // A private TMPDIR: /tmp is not granted, and a program's temporary files go with
    // its scratch dir.
    let tmp = scratch.path.join("tmp");
    std::fs::create_dir(&tmp).map_err(|e| {
        CallError::new(
            ErrorCode::ExecutionError,
            format!("cannot make the scratch dir: {e}"),
        )
        .retryable(true)
    })?;
    Ok((scratch, tmp))
}

/// run_call's program stage: the argv and environment the supervisor starts.
fn prepare_program(
    c: &CommandToolConfig,
    args: &[String],
    scratch_path: &Path,
    tmp: &Path,
    call: &ToolCall<'_>,
) -> Result<supervise::Program, CallError> {
    // The program's argv and environment, made now: the supervisor starts it after
    // the fork, where nothing may be allocated (`supervise::Program`).
    let env: Vec<(std::ffi::OsString, std::ffi::OsString)> = [
        (
            "PATH".into(),
            std::env::var_os("PATH").unwrap_or_else(|| config::DEFAULT_PATH.into()),
        ),
        (
            "LANG".into(),
            std::env::var_os("LANG").unwrap_or_else(|| "C.UTF-8".into()),
        ),
        ("HOME".into(), scratch_path.into()),
        ("TMPDIR".into(), tmp.into()),
        ("VAULTD_NOTE_ID".into(), note_id(call).into()),
        ("VAULTD_CALL_ID".into(), call.call_id.into()),
    ]
    .into_iter()
    .chain(c.env.iter().map(|(k, v)| (k.into(), v.value().into())))
    .collect();
    supervise::Program::new(
        c.program.as_os_str(),
        std::ffi::OsStr::new(&c.argv0),
        args,
        env,
    )
    .map_err(|e| {
        CallError::new(
            ErrorCode::ExecutionError,
            format!("{} could not be started: {e}", c.argv0),
        )
    })
}

/// run_call's wait stage: the program's output, read up to the cap until it exits or the
/// deadline passes; then every process of the call is ended and the result mapped.
/// Dropped mid-wait (the runner's timeout), the parameters drop in reverse order: `child`
/// before `end`, as before the split; keep `end` ahead of `child`.
async fn wait_and_finish(
    c: &CommandToolConfig,
    end: CallEnd,
    child: Started,
    deadline: std::time::Instant,
) -> Result<ToolOutput, CallError> {
    let max = c.max_output_bytes;
    let deadline = tokio::time::Instant::from_std(deadline);
    // The supervisor exits once the program and everything it left are gone, so the
    // pipes close then too: a grandchild holding stdout does not hold the call.
    let gathered = match child {
        Started::Forked(mut child) => {
            let stdout = child.stdout.take().expect("stdout is piped");
            let stderr = child.stderr.take().expect("stderr is piped");
            tokio::time::timeout_at(deadline, gather(child.wait(), stdout, stderr, max)).await
        }
        Started::Shared(spawned) => {
            let supervise::Spawned {
                mut supervisor,
                stdout,
                stderr,
            } = spawned;
            let (stdout, stderr) = match (
                tokio::net::unix::pipe::Receiver::from_owned_fd(stdout),
                tokio::net::unix::pipe::Receiver::from_owned_fd(stderr),
            ) {
                (Ok(out), Ok(err)) => (out, err),
                (Err(e), _) | (_, Err(e)) => {
                    drop(end);
                    return Err(read_error(e));
                }
            };
            let run = gather(supervisor.wait(), stdout, stderr, max);
            tokio::time::timeout_at(deadline, run).await
        }
    };
    let (status, out, err) = match gathered {
        Ok(done) => done,
        Err(_) => {
            drop(end);
            return Err(CallError::new(
                ErrorCode::Timeout,
                format!(
                    "{} did not finish within its timeout of {}; it and every process it started were killed",
                    c.name,
                    humantime::format_duration(c.timeout)
                ),
            ));
        }
    };
    drop(end);
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

/// The exit status and both outputs (each up to `max`), all at once.
async fn gather(
    wait: impl std::future::Future<Output = std::io::Result<std::process::ExitStatus>>,
    stdout: impl AsyncRead + Unpin,
    stderr: impl AsyncRead + Unpin,
    max: usize,
) -> (
    std::io::Result<std::process::ExitStatus>,
    std::io::Result<(Vec<u8>, bool)>,
    std::io::Result<(Vec<u8>, bool)>,
) {
    tokio::join!(wait, read_capped(stdout, max), read_capped(stderr, max))
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
        let denial = explain_denial(&stderr_text, &stdout_text);
        data.insert("stdout".into(), Value::String(stdout_text));
        let how = match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(sig)) => format!("was killed by signal {sig}{}", signal_hint(sig)),
            _ => "failed".to_string(),
        };
        let tail = tail(&stderr_text, 500);
        let mut message = if tail.is_empty() {
            format!("{} {how}", c.argv0)
        } else {
            format!("{} {how}: {tail}", c.argv0)
        };
        if let Some(denial) = denial {
            message = format!("{message}\n{denial}");
        }
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

/// What a program's output says the sandbox denied, and the key that allows it (docs/design.md
/// §10.5): "denied by the sandbox: …; allow it with `read = [...]`". Read from the program's
/// own words, so it is a hint: a program may print "Permission denied" for a file that no
/// key would open.
fn explain_denial(stderr: &str, stdout: &str) -> Option<String> {
    const PATTERNS: &[&str] = &[
        "Permission denied",
        "Operation not permitted",
        "EACCES",
        "EPERM",
        "Read-only file system",
        "No module named 'encodings'",
        "No usable temporary directory",
    ];
    let line = stderr
        .lines()
        .chain(stdout.lines())
        .find(|l| PATTERNS.iter().any(|p| l.contains(p)))?
        .trim();
    let lower = line.to_lowercase();
    let key = if [
        "socket",
        "connect",
        "network",
        "resolve",
        "getaddrinfo",
        "http",
    ]
    .iter()
    .any(|w| lower.contains(w))
    {
        "`network = true`"
    } else if [
        "write",
        "creat",
        "mkdir",
        "read-only file system",
        "touch",
        "remove",
        "rename",
        "open for writing",
        "save",
    ]
    .iter()
    .any(|w| lower.contains(w))
    {
        "`writable = [...]` (a vault folder)"
    } else {
        "`read = [...]` (the folder the program needs, e.g. its interpreter's)"
    };
    let line: String = line.chars().take(300).collect();
    Some(format!(
        "denied by the sandbox: {line}; allow it with {key}"
    ))
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

/// The end of a call's processes: closing the control pipe tells the supervisor to kill
/// the program and everything it left (docs/design.md §10.5); then, off the call's path (on
/// tokio's blocking pool, whose threads are kept), the call's cgroup is killed and emptied
/// (the kernel may take a moment to see it empty) and its scratch dir removed. The call's
/// result does not wait for either.
struct CallEnd {
    control: Option<OwnedFd>,
    cgroup: Option<CallCgroup>,
    scratch: Option<ScratchDir>,
}

impl Drop for CallEnd {
    fn drop(&mut self) {
        self.control.take();
        let (cgroup, scratch) = (self.cgroup.take(), self.scratch.take());
        // The scratch dir first: its files are charged to the call's memory cgroup, which
        // the next call may get.
        let clean_up = move || {
            drop(scratch);
            if let Some(cgroup) = cgroup {
                cgroup.end();
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(clean_up)),
            Err(_) => drop(std::thread::spawn(clean_up)),
        }
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
        // Two notes with the same text have the same call ids and may run at once: a count
        // makes each run's dir its own (one run removing another's scratch dir failed it).
        static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = root.join(format!("{safe}-{}-{run}", std::process::id()));
        // Left over from a crash of a process with the same pid: start empty.
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
    fn two_runs_of_one_call_id_at_once_get_their_own_scratch_dirs() {
        let root = tempfile::tempdir().unwrap();
        let a = ScratchDir::create(root.path(), "c-4384e3ceb61b").unwrap();
        std::fs::write(a.path.join("work"), "a").unwrap();
        let b = ScratchDir::create(root.path(), "c-4384e3ceb61b").unwrap();
        assert_ne!(a.path, b.path);
        assert!(
            a.path.join("work").exists(),
            "the second run emptied the first's dir"
        );
        drop(b);
        assert!(a.path.is_dir());
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
    fn a_denial_names_the_key_that_allows_it() {
        let read = explain_denial(
            "Fatal Python error\nModuleNotFoundError: No module named 'encodings'\n",
            "",
        )
        .unwrap();
        assert!(
            read.starts_with("denied by the sandbox: ModuleNotFoundError"),
            "{read}"
        );
        assert!(read.contains("allow it with `read = [...]`"), "{read}");
        let write = explain_denial("sh: 1: cannot create notes/x: Permission denied", "").unwrap();
        assert!(write.contains("`writable = [...]`"), "{write}");
        let net = explain_denial("", "connect: Permission denied").unwrap();
        assert!(net.contains("`network = true`"), "{net}");
        assert_eq!(explain_denial("no such file", ""), None);
    }

    #[test]
    fn the_tail_is_cut_on_a_character_boundary() {
        assert_eq!(tail("ééé", 3), "é");
        assert_eq!(tail("abc\n", 10), "abc");
    }
}
