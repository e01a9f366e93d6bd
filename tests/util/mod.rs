//! Domain verbs for the integration tests: a temp vault, the real `vaultd` binary, a real
//! SMTP server, a SearXNG-format search server.

#![allow(dead_code)]

pub mod home;
pub mod mcp_server;
pub mod searx;
pub mod sync;

pub use mcp_server::mcp_test_server;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a wait gives an event that shows no progress. Waits on something that moves (a
/// log that grows, notes that arrive, a note that changes folder) restart it at every move, so
/// a loaded machine that is slow but working never trips it; see [`wait_for_progress`].
pub const DEADLINE: Duration = Duration::from_secs(30);

/// How long a wait on a count (notes processed) tolerates no change at all before it gives up.
pub const STALL: Duration = Duration::from_secs(120);

/// The longest any progress-restarted wait runs in all (a daemon that logs in a loop without
/// ever saying the awaited line must still fail).
pub const CAP: Duration = Duration::from_secs(600);

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vaultd"))
}

/// A file of the example vault as the repository has it (`rel` from `examples/vault/`), never
/// as the working tree has it now: the README's first command runs vaultd on examples/vault,
/// which moves its notes (and `scripts/test` may run right after). Read from git's index — what
/// the README's reset (`git checkout examples/vault`) restores; on a fresh clone that is HEAD —
/// and from the working tree only outside a git checkout (a source archive has no index, and
/// nothing ran on its copy). The panic names the file and both places looked.
pub fn example_vault_file(rel: &str) -> Vec<u8> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = format!("examples/vault/{rel}");
    let git = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["rev-parse", "--is-inside-work-tree"])
        .output();
    let in_git = git.is_ok_and(|o| o.status.success());
    if !in_git {
        return std::fs::read(repo.join(&path))
            .unwrap_or_else(|e| panic!("{path} (not a git checkout, read as is): {e}"));
    }
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["show", &format!(":{path}")])
        .output()
        .expect("run git show");
    assert!(
        out.status.success(),
        "{path} is not in git's index: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A temp vault with its own state dir and config file.
pub struct TestVault {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub state: PathBuf,
    pub config: PathBuf,
}

impl TestVault {
    /// A vault whose config is `extra` (TOML) on top of a searxng provider at `search_url`.
    pub fn new(search_url: &str, extra: &str) -> TestVault {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("vault");
        let state = dir.path().join("state");
        std::fs::create_dir_all(&root).unwrap();
        let root = root.canonicalize().unwrap();
        let config = dir.path().join("vaultd.toml");
        let vault = TestVault {
            dir,
            root,
            state,
            config,
        };
        vault.write_config(search_url, extra);
        vault
    }

    pub fn write_config(&self, search_url: &str, extra: &str) {
        let search = section(extra, "[tools.search_web]");
        let timeout = if search.contains("timeout") {
            ""
        } else {
            "timeout = \"5s\"\n"
        };
        let text = format!(
            "vault = {root:?}\nstate_dir = {state:?}\n{top}\n[tools.search_web]\nprovider = \"searxng\"\nbase_url = {url:?}\n{timeout}{search}\n{rest}\n",
            root = self.root.display().to_string(),
            state = self.state.display().to_string(),
            url = search_url,
            top = section(extra, ""),
            rest = rest_sections(extra),
        );
        std::fs::write(&self.config, text).unwrap();
    }

    pub fn path(&self, folder: &str, rel: &str) -> PathBuf {
        self.root.join(folder).join(rel)
    }

    /// Drops a note into Needs_Action the way an agent does: write elsewhere, rename in.
    pub fn drop_note(&self, rel: &str, text: &str) -> PathBuf {
        self.drop_into("Needs_Action", rel, text.as_bytes())
    }

    pub fn drop_into(&self, folder: &str, rel: &str, bytes: &[u8]) -> PathBuf {
        let target = self.path(folder, rel);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        // A short temp name: `rel` may be at the 255-byte limit already.
        static DROPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = DROPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self.dir.path().join(format!("drop-{n}"));
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::rename(&tmp, &target).unwrap();
        target
    }

    /// Writes a note in place (open, write, close), as an editor without atomic saves does.
    pub fn write_in_place(&self, folder: &str, rel: &str, text: &str) -> PathBuf {
        let target = self.path(folder, rel);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(&target, text).unwrap();
        target
    }

    /// Moves a note between folders, as a person in Obsidian does.
    pub fn move_note(&self, from: &str, to: &str, rel: &str) -> PathBuf {
        let target = self.path(to, rel);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::rename(self.path(from, rel), &target).unwrap();
        target
    }

    pub fn read(&self, folder: &str, rel: &str) -> String {
        std::fs::read_to_string(self.path(folder, rel))
            .unwrap_or_else(|e| panic!("{folder}/{rel}: {e}"))
    }

    pub fn exists(&self, folder: &str, rel: &str) -> bool {
        self.path(folder, rel).exists()
    }

    /// Waits until `folder/rel` exists and no claim is in progress, then returns its text.
    /// Gives up after [`DEADLINE`] in which the note neither moved nor changed (a slow machine
    /// that is still working on it is waited for), saying where it is.
    pub fn wait_until_in(&self, folder: &str, rel: &str) -> String {
        let start = Instant::now();
        let mut seen = self.whereabouts(rel);
        let mut moved = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(self.path(folder, rel))
                && (folder == "Needs_Action" || text.contains("tool_status:"))
            {
                return text;
            }
            let now = self.whereabouts(rel);
            if now != seen {
                seen = now;
                moved = Instant::now();
            }
            if moved.elapsed() > DEADLINE || start.elapsed() > CAP {
                panic!(
                    "{folder}/{rel} did not appear after {:.1?}: the note is {} (unchanged for {:.1?}); vault holds: {:#?}",
                    start.elapsed(),
                    describe_whereabouts(&seen),
                    moved.elapsed(),
                    self.all_notes()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every `FOLDER/rel` that exists, with its size: where a note is and how far it got.
    pub fn whereabouts(&self, rel: &str) -> Vec<(String, u64)> {
        let Ok(folders) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut out: Vec<(String, u64)> = folders
            .flatten()
            .filter_map(|f| {
                let folder = f.file_name().to_string_lossy().into_owned();
                let len = std::fs::metadata(f.path().join(rel)).ok()?.len();
                Some((format!("{folder}/{rel}"), len))
            })
            .collect();
        out.sort();
        out
    }

    /// Notes per top-level folder (`.md` files, recursive), for failure messages.
    pub fn notes_per_folder(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for n in self.all_notes() {
            let folder = n.split('/').next().unwrap_or("").to_string();
            *m.entry(folder).or_insert(0) += 1;
        }
        m
    }

    /// Waits until `total` notes are in `folder` (a sub-folder path, recursive), as long as
    /// the count keeps moving ([`wait_for_progress`]); returns how long it took.
    pub fn wait_for_notes_in(&self, folder: &str, total: usize) -> Duration {
        let dir = self.root.join(folder);
        wait_for_progress(
            &format!("notes in {folder}/"),
            total,
            || count_notes(&dir),
            || format!("notes per folder: {:?}", self.notes_per_folder()),
        )
    }

    /// For a wait that gave up with notes left behind: the notes still in `folders` (top-level
    /// state folders) and, for the first few, every line of `daemon`'s log that names them
    /// (under any state folder), so the failure says what the daemon did with each, or that it
    /// never heard of it. Also the log's warnings, errors and panics, which can hold back any
    /// note.
    pub fn stuck_notes_report(&self, daemon: &RunningDaemon, folders: &[&str]) -> String {
        const NOTES: usize = 10;
        const LINES: usize = 40;
        let log = daemon.log_text();
        let stuck: Vec<String> = self
            .all_notes()
            .into_iter()
            .filter(|n| folders.iter().any(|f| n.starts_with(&format!("{f}/"))))
            .collect();
        let mut out = format!(
            "notes per folder: {:?}\n{} note(s) still in {folders:?}: {:?}\n",
            self.notes_per_folder(),
            stuck.len(),
            stuck.iter().take(100).collect::<Vec<_>>()
        );
        for note in stuck.iter().take(NOTES) {
            // The path below its state folder: the log names it as it moves between folders.
            let rel = note.split_once('/').map_or(note.as_str(), |(_, rel)| rel);
            let lines = daemon.log_lines_with(rel, LINES);
            out.push_str(&format!(
                "--- the daemon's log about {note} ({} line(s)):\n{}\n",
                lines.len(),
                lines.join("\n")
            ));
        }
        let alarms: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("panicked"))
            .collect();
        let from = alarms.len().saturating_sub(LINES);
        out.push_str(&format!(
            "--- the log's warnings, errors and panics ({} in all, the last {}):\n{}\n",
            alarms.len(),
            alarms.len() - from,
            alarms[from..].join("\n")
        ));
        out
    }

    /// Every `.md` file in the vault, relative paths, sorted.
    pub fn all_notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        walk(&self.root, &self.root, &mut out);
        out.sort();
        out
    }

    pub fn notes_in(&self, folder: &str) -> Vec<String> {
        self.all_notes()
            .into_iter()
            .filter(|n| n.starts_with(&format!("{folder}/")))
            .collect()
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(bin());
        c.arg("--config").arg(&self.config);
        c.env_remove("VAULTD_CONFIG");
        // What systemd hands a service; a test that wants it sets it (tests/service.rs).
        for var in [
            "NOTIFY_SOCKET",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "CREDENTIALS_DIRECTORY",
            "STATE_DIRECTORY",
            "CONFIGURATION_DIRECTORY",
            "JOURNAL_STREAM",
        ] {
            c.env_remove(var);
        }
        c.env("RUST_LOG", "vaultd=debug,info");
        c
    }

    /// [`once`](Self::once) off the async workers, for a test whose fake servers run on them.
    pub async fn once_async(&self) -> (i32, String) {
        let mut cmd = self.cmd();
        tokio::task::spawn_blocking(move || {
            let out = cmd.arg("once").output().expect("run vaultd once");
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .await
        .expect("the vaultd once task")
    }

    /// `vaultd once`; returns (exit code, stderr, the CPU time it used). For a bound on how
    /// much work a run does: unlike the wall clock, CPU time hardly moves on a loaded machine.
    pub fn once_cpu(&self) -> (i32, String, Duration) {
        let (out, cpu) = output_with_cpu(self.cmd().arg("once"));
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            cpu,
        )
    }

    /// `vaultd once`; returns (exit code, stderr).
    pub fn once(&self) -> (i32, String) {
        let out = self.cmd().arg("once").output().expect("run vaultd once");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Starts `vaultd run` and waits until it is watching.
    pub fn start(&self) -> RunningDaemon {
        RunningDaemon::start(self.cmd(), self.dir.path().join("daemon.log"))
    }

    /// Starts `vaultd run` logging to its own file `name` (kept for a post-mortem).
    pub fn start_logged(&self, name: &str) -> RunningDaemon {
        RunningDaemon::start(self.cmd(), self.dir.path().join(name))
    }

    /// The daemon's journal, opened read-write as the CLI does.
    pub fn journal(&self) -> vaultd::journal::Journal {
        vaultd::journal::Journal::open(&self.state).expect("open the journal")
    }

    /// `vaultd status --json`, parsed.
    pub fn status_json(&self) -> serde_json::Value {
        let out = self
            .cmd()
            .args(["status", "--json"])
            .output()
            .expect("run vaultd status");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status --json is JSON")
    }

    /// Every file in the vault (hidden ones included, `.vaultd.lock` and `.vaultd/` excepted),
    /// relative.
    pub fn all_files(&self) -> Vec<String> {
        let mut out = Vec::new();
        walk_all(&self.root, &self.root, &mut out);
        out.sort();
        out
    }
}

fn section(extra: &str, header: &str) -> String {
    // The text of `extra` under `header` ("" = before the first header).
    let mut out = String::new();
    let mut current = String::new();
    for line in extra.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            current = t.to_string();
            continue;
        }
        if current == header {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn rest_sections(extra: &str) -> String {
    let mut out = String::new();
    let mut current = String::new();
    for line in extra.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            current = t.to_string();
        }
        if !current.is_empty() && current != "[tools.search_web]" {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if p.is_dir() {
            walk(base, &p, out);
        } else if name.ends_with(".md") {
            out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
        }
    }
}

fn walk_all(base: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            // vaultd's own: the vault's id, which names its state dir (docs/design.md §9.11).
            if dir == base && e.file_name() == ".vaultd" {
                continue;
            }
            walk_all(base, &p, out);
        } else if e.file_name() != ".vaultd.lock" {
            out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
        }
    }
}

/// A webhook URL kept in a file, referenced as `file:…` (a secret, like in production).
pub fn secret_file(vault: &TestVault, name: &str, value: &str) -> String {
    let p = vault.dir.path().join(name);
    std::fs::write(&p, value).unwrap();
    format!("file:{}", p.display())
}

/// A webhook server (Slack's, Discord's) on 127.0.0.1 that answers every POST with `status`.
pub async fn webhook_server(status: u16) -> wiremock::MockServer {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(status).set_body_string("ok"))
        .mount(&server)
        .await;
    server
}

/// Waits until `done()` holds, polling; panics with `what` after the deadline. For an event
/// with no measure of progress; a count uses [`wait_for_progress`].
pub fn wait_until(what: &str, deadline: Duration, done: impl FnMut() -> bool) {
    wait_until_or_say(what, deadline, done, String::new)
}

/// [`wait_until`], whose failure also prints `say()` (a daemon's log, where the notes are).
pub fn wait_until_or_say(
    what: &str,
    deadline: Duration,
    mut done: impl FnMut() -> bool,
    say: impl FnOnce() -> String,
) {
    let start = Instant::now();
    let mut checks = 0u64;
    while !done() {
        checks += 1;
        if start.elapsed() > deadline {
            panic!(
                "timed out after {:.1?} waiting until {what} (checked {checks} times, never true)\n{}",
                start.elapsed(),
                say()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `count()` reaches `total`, for as long as the count keeps changing: there is no
/// budget for the whole wait (a loaded 2-core machine may take minutes for thousands of notes),
/// only for a stall — [`STALL`] without any change. The failure says how many of how many
/// arrived, how long it waited, and `state()` (where the rest are). Returns the time taken.
pub fn wait_for_progress(
    what: &str,
    total: usize,
    mut count: impl FnMut() -> usize,
    mut state: impl FnMut() -> String,
) -> Duration {
    let start = Instant::now();
    let mut last = count();
    let mut moved = Instant::now();
    while last != total {
        // Not every 20 ms: counting thousands of files competes with the daemon for the CPU.
        std::thread::sleep(Duration::from_millis(100));
        let now = count();
        if now != last {
            last = now;
            moved = Instant::now();
        } else if moved.elapsed() > STALL {
            panic!(
                "waiting for {total} {what}: {last} of {total} after {:.1?}, none for the last {:.1?}; {}",
                start.elapsed(),
                moved.elapsed(),
                state()
            );
        }
    }
    start.elapsed()
}

/// Runs `cmd` to its end; returns its output and the CPU time (user + system) the process
/// and its waited-for children used, from `wait4` on that one process (`RUSAGE_CHILDREN`
/// would add every other test's children).
pub fn output_with_cpu(cmd: &mut Command) -> (std::process::Output, Duration) {
    use std::io::Read;
    // Reaped by `wait4` below (for its rusage), not by `Child::wait`.
    #[allow(clippy::zombie_processes)]
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the command");
    // Both pipes read while it runs, so a full pipe cannot stall it.
    let mut out_pipe = child.stdout.take().expect("piped stdout");
    let mut err_pipe = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out_pipe.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err_pipe.read_to_end(&mut v);
        v
    });
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value; wait4 reaps exactly this child, which the
    // `Child` is not used to wait for afterwards.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let reaped = loop {
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == -1 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        break r;
    };
    assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    let cpu = tv(usage.ru_utime) + tv(usage.ru_stime);
    use std::os::unix::process::ExitStatusExt;
    let output = std::process::Output {
        status: std::process::ExitStatus::from_raw(status),
        stdout: out_reader.join().expect("the stdout reader"),
        stderr: err_reader.join().expect("the stderr reader"),
    };
    (output, cpu)
}

/// The CPU time the calling thread has used: a bound on in-process work that a loaded machine
/// does not stretch as it stretches the wall clock.
pub fn thread_cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `t` is.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(r, 0, "clock_gettime: {}", std::io::Error::last_os_error());
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `.md` files under `dir`, recursive (0 when it does not exist yet).
pub fn count_notes(dir: &Path) -> usize {
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.len()
}

fn describe_whereabouts(seen: &[(String, u64)]) -> String {
    if seen.is_empty() {
        return "nowhere in the vault".to_string();
    }
    let at: Vec<String> = seen
        .iter()
        .map(|(path, len)| format!("at {path} ({len} bytes)"))
        .collect();
    at.join(" and ")
}

/// Counts the result blocks per call id in a note.
pub fn result_counts(text: &str) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for r in results_in(text) {
        *m.entry(r["call_id"].as_str().unwrap_or("").to_string())
            .or_insert(0) += 1;
    }
    m
}

/// A small deterministic PRNG (xorshift64*) so "random" tests replay exactly.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A `vaultd run` child process; killed when dropped.
pub struct RunningDaemon {
    pub child: Child,
    pub log: PathBuf,
}

impl RunningDaemon {
    pub fn start(mut cmd: Command, log: PathBuf) -> RunningDaemon {
        let file = std::fs::File::create(&log).unwrap();
        let child = cmd
            .arg("run")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn vaultd run");
        let d = RunningDaemon { child, log };
        d.wait_for_log("vaultd started");
        d
    }

    /// Starts `vaultd run` without waiting for it to be ready (to kill it during start-up).
    pub fn spawn(mut cmd: Command, log: PathBuf) -> RunningDaemon {
        let file = std::fs::File::create(&log).unwrap();
        let child = cmd
            .arg("run")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn vaultd run");
        RunningDaemon { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log's lines that contain `needle`, the first `max` of them (and a count of the rest).
    pub fn log_lines_with(&self, needle: &str, max: usize) -> Vec<String> {
        let log = self.log_text();
        let all: Vec<&str> = log.lines().filter(|l| l.contains(needle)).collect();
        let mut lines: Vec<String> = all.iter().take(max).map(|l| l.to_string()).collect();
        if all.len() > max {
            lines.push(format!("… and {} more", all.len() - max));
        }
        lines
    }

    /// Waits until the log says `needle`. Gives up after [`DEADLINE`] in which the log did not
    /// grow (a daemon still logging is still working), or after [`CAP`] in all.
    pub fn wait_for_log(&self, needle: &str) {
        self.wait_for_log_times(needle, 1);
    }

    /// Waits until `needle` is in the log `n` times (or more); returns the log.
    pub fn wait_for_log_times(&self, needle: &str, n: usize) -> String {
        let start = Instant::now();
        let mut len = 0;
        let mut grew = Instant::now();
        loop {
            let log = self.log_text();
            let seen = log.matches(needle).count();
            if seen >= n {
                return log;
            }
            if log.len() != len {
                len = log.len();
                grew = Instant::now();
            }
            if grew.elapsed() > DEADLINE || start.elapsed() > CAP {
                let exited = if self.has_exited() {
                    "; vaultd has exited"
                } else {
                    ""
                };
                panic!(
                    "log said {needle:?} {seen} times in {:.1?}, wanted {n} (nothing new for the last {:.1?}{exited}); log ({len} bytes):\n{log}",
                    start.elapsed(),
                    grew.elapsed(),
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the daemon has exited, seen without reaping it (`terminate` still gets the
    /// status): an exited child is a zombie until waited for.
    pub fn has_exited(&self) -> bool {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        // "pid (comm) S ...": the state follows the last ')'.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z")
    }

    /// Sends a signal without waiting.
    pub fn signal(&self, sig: i32) {
        unsafe { libc_kill(self.pid(), sig) };
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        unsafe { libc_kill(self.pid(), 15) };
        let status = self.child.wait().unwrap();
        std::mem::forget(self);
        status
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::forget(self);
    }
}

impl Drop for RunningDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// A note with the given call blocks (JSON of the `tool_call` value), one after the other.
pub fn note_with_calls(title: &str, calls: &[serde_json::Value]) -> String {
    let mut s = format!("# {title}\n\nSome text the agent wrote.\n");
    for c in calls {
        s.push_str(&format!(
            "\n```json\n{}\n```\n",
            serde_json::to_string_pretty(&serde_json::json!({ "tool_call": c })).unwrap()
        ));
    }
    s
}

pub fn search_call(query: &str) -> serde_json::Value {
    serde_json::json!({ "name": "search_web", "parameters": { "query": query, "num_results": 3 } })
}

/// Every `tool_result` JSON in a note, in order.
pub fn results_in(text: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let body = line.strip_prefix("> ").or_else(|| line.strip_prefix(">"));
        match (body, current.as_mut()) {
            (Some(b), None) if b.trim_start().starts_with("```json") => {
                current = Some(String::new())
            }
            (Some(b), Some(_)) if b.trim_start().starts_with("```") => {
                let json = current.take().unwrap();
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&json)
                    && let Some(r) = v.get("tool_result")
                {
                    out.push(r.clone());
                }
            }
            (Some(b), Some(buf)) => {
                buf.push_str(b);
                buf.push('\n');
            }
            _ => {}
        }
    }
    out
}

/// The value of a frontmatter property.
pub fn property(text: &str, key: &str) -> Option<String> {
    let body = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = body.strip_prefix("---")?;
    let end = rest.find("\n---")?;
    rest[..end].lines().find_map(|l| {
        l.strip_prefix(&format!("{key}:"))
            .map(|v| v.trim().to_string())
    })
}

// ---------------------------------------------------------------------------------------------
// A real SMTP server (mailin-embedded) on 127.0.0.1.

#[derive(Debug, Clone, Default)]
pub struct Mail {
    pub from: String,
    pub to: Vec<String>,
    pub data: String,
}

#[derive(Clone, Default)]
struct Capture {
    mails: Arc<Mutex<Vec<Mail>>>,
    /// Messages whose data is complete and whose reply is being held back (`reply_delay`).
    answering: Arc<std::sync::atomic::AtomicUsize>,
    current: Mail,
    reply_delay: Duration,
}

impl mailin_embedded::Handler for Capture {
    fn data_start(
        &mut self,
        _domain: &str,
        from: &str,
        _is8bit: bool,
        to: &[String],
    ) -> mailin_embedded::Response {
        self.current = Mail {
            from: from.to_string(),
            to: to.to_vec(),
            data: String::new(),
        };
        mailin_embedded::response::OK
    }

    fn data(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.current.data.push_str(&String::from_utf8_lossy(buf));
        Ok(())
    }

    fn data_end(&mut self) -> mailin_embedded::Response {
        if !self.reply_delay.is_zero() {
            self.answering
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(self.reply_delay);
        }
        self.mails.lock().unwrap().push(self.current.clone());
        mailin_embedded::response::OK
    }
}

pub struct SmtpServer {
    pub port: u16,
    mails: Arc<Mutex<Vec<Mail>>>,
    answering: Arc<std::sync::atomic::AtomicUsize>,
}

impl SmtpServer {
    pub fn start() -> SmtpServer {
        SmtpServer::start_with_delay(Duration::ZERO)
    }

    /// A server that waits `delay` before acknowledging a message's data.
    pub fn start_with_delay(delay: Duration) -> SmtpServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let capture = Capture {
            reply_delay: delay,
            ..Default::default()
        };
        let mails = capture.mails.clone();
        let answering = capture.answering.clone();
        let mut server = mailin_embedded::Server::new(capture);
        server
            .with_name("test.local")
            .with_ssl(mailin_embedded::SslConfig::None)
            .unwrap()
            .with_tcp_listener(listener);
        std::thread::spawn(move || {
            let _ = server.serve();
        });
        SmtpServer {
            port,
            mails,
            answering,
        }
    }

    /// How many messages the server has whole and is holding its reply to.
    pub fn answering(&self) -> usize {
        self.answering.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn received(&self) -> Vec<Mail> {
        self.mails.lock().unwrap().clone()
    }
}

/// Makes a FIFO at `path` (a command tool with `writable` can make one named like a note).
pub fn make_fifo(path: &Path) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo {path:?}"
    );
}

/// Waits up to `deadline` for `child` to exit; kills it and returns None when it did not.
pub fn exit_within(child: &mut Child, deadline: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

impl TestVault {
    /// `vaultd once` that must end within `deadline`; (exit code, stderr), or a panic that says
    /// it hung (the process is killed first).
    pub fn once_within(&self, deadline: Duration) -> (i32, String) {
        let log = self.dir.path().join("once.log");
        let mut child = self
            .cmd()
            .arg("once")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn vaultd once");
        let status = exit_within(&mut child, deadline);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let Some(status) = status else {
            panic!("vaultd once did not exit within {deadline:?}; its log:\n{text}");
        };
        (status.code().unwrap_or(-1), text)
    }
}

/// Every `tool_preview` a dry run wrote into a note, in order (docs/design.md §12.1).
pub fn previews_in(text: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (line.strip_prefix("> "), current.as_mut()) {
            (Some(b), None) if b.starts_with("```json") => current = Some(String::new()),
            (Some(b), Some(_)) if b.starts_with("```") => {
                let json = current.take().unwrap();
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&json)
                    && let Some(p) = v.get("tool_preview")
                {
                    out.push(p.clone());
                }
            }
            (Some(b), Some(buf)) => {
                buf.push_str(b);
                buf.push('\n');
            }
            _ => {}
        }
    }
    out
}

impl TestVault {
    /// `vaultd check --preview --json NOTE`: its exit code and the previews it printed.
    pub fn check_preview(&self, note: &Path) -> (i32, Vec<serde_json::Value>) {
        let out = self
            .cmd()
            .args(["check", "--preview", "--json"])
            .arg(note)
            .output()
            .unwrap();
        let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "check --preview printed no JSON ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let previews = line["previews"].as_array().cloned().unwrap_or_default();
        (out.status.code().unwrap_or(-1), previews)
    }
}
