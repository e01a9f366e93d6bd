//! End-to-end load generator: the real `vaultd` binary on temp vaults against a SearXNG-format
//! server on 127.0.0.1, measuring what a user feels. Prints one table.
//!
//! ```text
//! cargo bench --bench load                       # full run (~3 min)
//! cargo bench --bench load -- --quick            # short run (~30 s)
//! cargo bench --bench load -- --repeat 3         # each scenario 3 times, medians
//! cargo bench --bench load -- --only latency,cap # some scenarios
//! VAULTD_BIN=/path/to/vaultd cargo bench --bench load
//! cargo test --bench load                        # smoke test: tiny sizes, a few seconds
//! ```
//!
//! Scenarios (targets from the "Fast to the disk's limit" issue, 16):
//! - `latency`: notes dropped one by one by rename into `Needs_Action/` of a running daemon,
//!   time from the rename until the note's name appears in `Done/`. The generator waits on
//!   inotify (through `notify`) on `Done/`, so it sleeps in the kernel instead of spinning on
//!   the two shared cores; a 5 ms timeout falls back to a `stat` so a lost event cannot hang it.
//!   The method's own cost is measured by renaming into a watched folder ourselves
//!   (`probe overhead`).
//! - `throughput`: `vaultd once` over notes already in `Needs_Action/` (process start included).
//! - `cap`: `vaultd once` over notes whose search takes 100 ms; ideal = notes × 100 ms ÷ 10.
//! - `idle`: a running daemon on an empty vault; VmRSS and utime+stime over the idle period.
//! - `queued`: notes dropped into a running daemon whose server answers slowly, so they queue;
//!   peak VmHWM while they sit there.
//! - `mcp`: as `latency`, alternating one call to the in-tree MCP test server's `echo` tool
//!   (stdio, `read_only`) with one `search_web` call to the loopback SearXNG fake, in one daemon:
//!   drop-to-Done p50/p99 of each, and what MCP adds at p50.
//! - `command`: like `latency`, with notes alternating between one call of a command tool
//!   running `true` (spawn + sandbox + journal) and one search call (0 ms server), in one
//!   daemon; then command notes each dropped after a 50 ms pause (a call after a pause is
//!   where a kernel waiting to move a process into a cgroup shows); and `true` spawned
//!   directly by the bench, unsandboxed: the program's own time.
//!
//! Scenarios for "Sends as fast as searches" (issue 31):
//! - `send`: notes with one `send_notification` email each, written by the file transport as
//!   an `.eml` into an outbox (the recipient is in `allowed_recipients`, so nothing waits for
//!   approval and no server is in the way): `vaultd once` over them (notes/s), then drop-to-Done
//!   p50/p99 in a running daemon as `latency` measures it.
//! - `mixed`: one running daemon, notes of five kinds interleaved (the order rotated each
//!   round so no kind always follows the same one): `search_web`, `send_notification` (outbox),
//!   `vault_create` (a vault write), the MCP test server's `echo` and the command tool `true`;
//!   p50/p99 of each and what each adds over a search at p50.
//!
//! The disk's floor (issue 31): a 4 KiB write + fsync, a rename, a folder fsync, a rename to a
//! second folder and its fsync — the least a note's results write and its move to `Done/` can
//! cost — timed in the bench's temp folder (the vault's file system) before the daemon starts
//! and after it stops, in the same run. `latency`, `send` and `mixed` print it beside their
//! figures, and drop-to-Done p50 and p99 as multiples of the floor's p50 (targets ≤ 2.5×,
//! ≤ 10×). `latency` and `mixed` also time the search fake alone (`search fake round trip`, the
//! bench's own keep-alive client): what of a search note's time is the fake's.
//!
//! The search fake. By default search notes go to the Rust fake in `tests/util/searx.rs`, in
//! the bench's process, whose answer costs microseconds: a fast fake flatters. `--fake python`
//! (or `VAULTD_BENCH_FAKE=python`) sends the search notes of `throughput`, `latency` and
//! `mixed` to `scripts/fake-searxng.py` instead (standard-library Python, a thread per
//! connection: a server not tuned by us), started as a child process on a free port; the other
//! scenarios need the Rust fake's delays and counters and keep it. The table's title says which
//! fake ran. `cargo test` checks the Python fake against `vaultd once` in `tests/fake_searxng.rs`.
//!
//! ```text
//! VAULTD_BIN=target/release/vaultd target/release/deps/load-… --bench --only send,mixed --quick
//! VAULTD_BIN=target/release/vaultd target/release/deps/load-… --bench --only throughput,latency,mixed --fake python
//! ```
//!
//! Everything is bounded: every wait has a deadline, every daemon is killed on the way out.

#[path = "../tests/util/searx.rs"]
mod searx;

#[path = "../tests/util/mcp_server.rs"]
mod mcp_server;
use mcp_server::mcp_test_server;

use notify::{EventKind, RecursiveMode, Watcher};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

/// Sizes of one run; `--quick` shrinks them.
#[derive(Clone, Copy)]
struct Sizes {
    latency_notes: usize,
    throughput_notes: usize,
    cap_notes: usize,
    idle: Duration,
    queued_notes: usize,
}

const FULL: Sizes = Sizes {
    latency_notes: 200,
    throughput_notes: 2_000,
    cap_notes: 300,
    idle: Duration::from_secs(60),
    queued_notes: 10_000,
};

const QUICK: Sizes = Sizes {
    latency_notes: 50,
    throughput_notes: 500,
    cap_notes: 100,
    idle: Duration::from_secs(10),
    queued_notes: 2_000,
};

/// `cargo test --all-targets` runs this file without `--bench`: then only check that every
/// scenario works, in a few seconds.
const SMOKE: Sizes = Sizes {
    latency_notes: 5,
    throughput_notes: 20,
    cap_notes: 10,
    idle: Duration::from_secs(1),
    queued_notes: 50,
};

const WORKERS: usize = 10;
const CAP_DELAY: Duration = Duration::from_millis(100);
/// Generous upper bound on any single wait.
const DEADLINE: Duration = Duration::from_secs(120);

/// Human-readable target, and whether a value meets it.
type Target = Option<(&'static str, fn(f64) -> bool)>;

/// One measured number.
struct Metric {
    name: String,
    value: f64,
    unit: &'static str,
    target: Target,
}

fn metric(name: impl Into<String>, value: f64, unit: &'static str) -> Metric {
    Metric {
        name: name.into(),
        value,
        unit,
        target: None,
    }
}

impl Metric {
    fn target(mut self, text: &'static str, ok: fn(f64) -> bool) -> Metric {
        self.target = Some((text, ok));
        self
    }
}

fn main() {
    let _graveyard = Graveyard;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let smoke = !args.iter().any(|a| a == "--bench");
    let (sizes, label) = match (smoke, quick) {
        (true, _) => (SMOKE, "smoke test: cargo test runs benches without --bench"),
        (false, true) => (QUICK, "quick"),
        (false, false) => (FULL, "full"),
    };
    let repeat: usize = arg_value(&args, "--repeat")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .clamp(1, 20);
    let only: Option<Vec<String>> =
        arg_value(&args, "--only").map(|v| v.split(',').map(str::to_string).collect());
    let wanted = |s: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == s));
    let fake = match arg_value(&args, "--fake").or_else(|| std::env::var("VAULTD_BENCH_FAKE").ok())
    {
        None => FakeKind::Rust,
        Some(v) if v == "rust" => FakeKind::Rust,
        Some(v) if v == "python" => FakeKind::Python,
        Some(v) => panic!("--fake (or VAULTD_BENCH_FAKE) is `rust` or `python`, not {v:?}"),
    };
    FAKE.set(fake).expect("the fake is chosen once");

    let bin = vaultd_bin();
    eprintln!("vaultd binary: {}", bin.display());
    eprintln!(
        "search fake (throughput, latency, mixed): {}",
        fake.describe()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");

    type Scenario = fn(&Path, &tokio::runtime::Runtime, Sizes) -> Vec<Metric>;
    let scenarios: [(&str, Scenario); 9] = [
        ("latency", latency),
        ("throughput", throughput),
        ("cap", cap_efficiency),
        ("idle", idle),
        ("queued", queued),
        ("mcp", mcp_latency),
        ("command", command_tool),
        ("send", send),
        ("mixed", mixed),
    ];
    // name -> (samples, unit, target), in first-seen order.
    let mut order: Vec<String> = Vec::new();
    let mut samples: BTreeMap<String, (Vec<f64>, &'static str, Target)> = BTreeMap::new();
    for (name, scenario) in scenarios {
        if !wanted(name) {
            continue;
        }
        for round in 1..=repeat {
            eprintln!("== {name} (round {round}/{repeat})");
            for m in scenario(&bin, &rt, sizes) {
                eprintln!("   {} = {:.3} {}", m.name, m.value, m.unit);
                let entry = samples.entry(m.name.clone()).or_insert_with(|| {
                    order.push(m.name.clone());
                    (Vec::new(), m.unit, m.target)
                });
                entry.0.push(m.value);
            }
        }
    }

    if smoke {
        // Smoke sizes measure nothing worth a table (a newcomer reads a table of tiny or
        // missing figures as a failure): say what ran and where the real figures come from.
        println!(
            "load bench smoke test: {} metric(s) from {} scenario(s) checked; figures: cargo bench --bench load",
            order.len(),
            scenarios.iter().filter(|(n, _)| wanted(n)).count()
        );
        return;
    }
    println!();
    println!(
        "vaultd load ({}, {} round(s) per scenario; median [min..max]; search fake: {})",
        label,
        repeat,
        fake.describe()
    );
    println!(
        "| {:<44} | {:>26} | {:<8} | {:<14} | {:<4} |",
        "metric", "median [min..max]", "unit", "target", "met"
    );
    println!(
        "|{:-<46}|{:->28}|{:-<10}|{:-<16}|{:-<6}|",
        "", "", "", "", ""
    );
    for name in order {
        let (mut v, unit, target) = samples.remove(&name).expect("recorded above");
        v.sort_by(f64::total_cmp);
        let med = median(&v);
        let range = if v.len() > 1 {
            format!("{} [{}..{}]", fmt(med), fmt(v[0]), fmt(v[v.len() - 1]))
        } else {
            fmt(med)
        };
        let (t, met) = match target {
            Some((t, ok)) => (t, if ok(med) { "yes" } else { "NO" }),
            None => ("", ""),
        };
        println!("| {name:<44} | {range:>26} | {unit:<8} | {t:<14} | {met:<4} |");
    }
}

fn arg_value(args: &[String], key: &str) -> Option<String> {
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix(&format!("{key}="))
            .map(str::to_string)
            .or_else(|| (a == key).then(|| args.get(i + 1).cloned()).flatten())
    })
}

fn fmt(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn median(sorted: &[f64]) -> f64 {
    percentile(sorted, 0.5)
}

/// Nearest-rank percentile of sorted samples.
/// `"{name} p50"` and `"{name} p99"` of `sorted`, in ms.
fn p50_p99(name: &str, sorted: &[f64]) -> [Metric; 2] {
    [
        metric(format!("{name} p50"), percentile(sorted, 0.5), "ms"),
        metric(format!("{name} p99"), percentile(sorted, 0.99), "ms"),
    ]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// `$VAULTD_BIN`, else the binary cargo built for this bench (same profile).
fn vaultd_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("VAULTD_BIN") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_BIN_EXE_vaultd"))
}

/// A temp vault with its state dir and config, and a staging folder on the same file system
/// for drop-by-rename.
struct Bench {
    dir: Kept,
    root: PathBuf,
    config: PathBuf,
    staging: PathBuf,
}

/// A bench's temp folder, removed when the bench exits ([`Graveyard`]), not when its scenario
/// ends. On ext4 without a journal a file made within 60 s of a removal walks past every inode
/// freed meanwhile (`recently_deleted()`): a scenario that ran right after another's vault was
/// removed measured that walk (`send` in a full run: 559 notes/s, against 1,336–1,645 in
/// `scripts/ab-sends` the same hour, BENCHMARKS.md, thirteenth pass). The price: a full run
/// keeps every scenario's notes on disk until it exits (some 20,000 small files).
struct Kept(Option<tempfile::TempDir>);

static GRAVEYARD: Mutex<Vec<tempfile::TempDir>> = Mutex::new(Vec::new());

impl Kept {
    fn path(&self) -> &Path {
        self.0.as_ref().expect("kept until dropped").path()
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            GRAVEYARD
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(dir);
        }
    }
}

/// Removes every bench's temp folder when `main` returns or unwinds.
struct Graveyard;

impl Drop for Graveyard {
    fn drop(&mut self) {
        let dirs = std::mem::take(&mut *GRAVEYARD.lock().unwrap_or_else(|p| p.into_inner()));
        drop(dirs);
    }
}

impl Bench {
    fn new(search_url: &str) -> Bench {
        // `VAULTD_BENCH_KEEP_IN=DIR`: vaults are made in DIR and kept. On ext4 without a
        // journal, inodes freed in the last 60 s are skipped one by one when a new file is
        // made (`recently_deleted()`), so a run right after another one's vault was removed
        // measures that scan: for A/B runs back to back, keep them and remove DIR after.
        let keep_in = std::env::var_os("VAULTD_BENCH_KEEP_IN");
        let dir = Kept(Some(
            tempfile::Builder::new()
                .prefix("vaultd-load-")
                .disable_cleanup(keep_in.is_some())
                .tempdir_in(keep_in.map_or_else(std::env::temp_dir, PathBuf::from))
                .expect("tempdir"),
        ));
        let root = dir.path().join("vault");
        let staging = dir.path().join("staging");
        for f in ["Needs_Action", "In_Progress", "Done", "Failed"] {
            std::fs::create_dir_all(root.join(f)).expect("create vault folder");
        }
        std::fs::create_dir_all(&staging).expect("create staging");
        let root = root.canonicalize().expect("canonical vault");
        let config = dir.path().join("vaultd.toml");
        // A/B against an older build: `VAULTD_BENCH_TOP` adds top-level keys (e.g.
        // `moved_in_grace = "0s"`), `VAULTD_BENCH_NO_VAULT_TOOLS=1` leaves out the
        // `[tools.vault]` table an older build does not know.
        let top = std::env::var("VAULTD_BENCH_TOP").unwrap_or_default();
        let vault_tools = if std::env::var_os("VAULTD_BENCH_NO_VAULT_TOOLS").is_some() {
            ""
        } else {
            "[tools.vault]\nwrite = [\"Agent/**\"]\n"
        };
        let text = format!(
            "vault = {root:?}\nstate_dir = {state:?}\nworkers = {WORKERS}\nshutdown_grace = \"1s\"\n{top}\n\
             [tools.search_web]\nprovider = \"searxng\"\nbase_url = {search_url:?}\ntimeout = \"60s\"\n\
             rate_limit = {{ per_hour = 100000000, per_day = 100000000 }}\n\
             {vault_tools}",
            root = root.display().to_string(),
            state = dir.path().join("state").display().to_string(),
        );
        std::fs::write(&config, text).expect("write config");
        Bench {
            dir,
            root,
            config,
            staging,
        }
    }

    fn folder(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn command(&self, bin: &Path, sub: &str) -> Command {
        let mut c = Command::new(bin);
        c.arg(sub)
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.path().join(format!("{sub}.log")))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            );
        c
    }

    /// Writes `n` notes straight into Needs_Action (for `once`).
    fn queue_notes(&self, n: usize, tag: &str) {
        let inbox = self.folder("Needs_Action");
        for i in 0..n {
            std::fs::write(inbox.join(note_name(tag, i)), note_text(tag, i)).expect("write note");
        }
    }

    fn stage(&self, tag: &str, i: usize) -> PathBuf {
        let p = self.staging.join(note_name(tag, i));
        std::fs::write(&p, note_text(tag, i)).expect("stage note");
        p
    }

    fn count(&self, folder: &str) -> usize {
        std::fs::read_dir(self.folder(folder))
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".md"))
                    .count()
            })
            .unwrap_or(0)
    }
}

fn note_name(tag: &str, i: usize) -> String {
    format!("{tag}-{i:05}.md")
}

/// One search call, 3 results (one page: no paging), a query unique to the note.
fn note_text(tag: &str, i: usize) -> String {
    format!(
        "# Note {i}\n\nSome text the agent wrote.\n\n```json\n{{\"tool_call\": {{\"name\": \"search_web\", \"parameters\": {{\"query\": \"{tag} load {i}\", \"num_results\": 3}}}}}}\n```\n"
    )
}

/// A running daemon, killed when dropped.
struct Daemon {
    child: Child,
}

impl Daemon {
    fn start(bench: &Bench, bin: &Path) -> Daemon {
        let child = bench.command(bin, "run").spawn().expect("start vaultd run");
        Daemon { child }
    }

    /// Starts the daemon with `NOTIFY_SOCKET` set, as systemd does, and returns once it says
    /// `READY=1`: its watches are up and its start-up scan is done, so a note dropped after
    /// this comes in by its inotify event, as in use. A note dropped before it may be found by
    /// the start-up scan instead, which runs other code: the idle scenario's resident code
    /// (and `scripts/symbol-order`'s list, made from that scenario under valgrind, where start
    /// takes seconds) then depended on which of the two won.
    fn start_ready(bench: &Bench, bin: &Path, within: Duration) -> Daemon {
        let path = bench.dir.path().join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind notify socket");
        socket
            .set_read_timeout(Some(within))
            .expect("socket timeout");
        let child = bench
            .command(bin, "run")
            .env("NOTIFY_SOCKET", &path)
            .spawn()
            .expect("start vaultd run");
        let daemon = Daemon { child };
        let mut buf = [0u8; 4096];
        loop {
            let n = socket
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("no READY=1 from vaultd within {within:?}: {e}"));
            if String::from_utf8_lossy(&buf[..n])
                .lines()
                .any(|l| l == "READY=1")
            {
                return daemon;
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then SIGKILL if it has not exited within a few seconds.
    fn stop(mut self) {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (on inotify) for names appearing in one folder.
struct FolderWatch {
    _watcher: notify::RecommendedWatcher,
    rx: mpsc::Receiver<(PathBuf, Instant)>,
}

impl FolderWatch {
    fn new(folder: &Path) -> FolderWatch {
        let (tx, rx) = mpsc::channel();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let now = Instant::now();
            if let Ok(e) = res
                && matches!(e.kind, EventKind::Create(_) | EventKind::Modify(_))
            {
                for p in e.paths {
                    let _ = tx.send((p, now));
                }
            }
        })
        .expect("watcher");
        watcher
            .watch(folder, RecursiveMode::NonRecursive)
            .expect("watch folder");
        FolderWatch {
            _watcher: watcher,
            rx,
        }
    }

    /// Renames `staged` to `dest` and returns the milliseconds until `target` appeared here
    /// (panics if it never does).
    fn drop_and_time(&self, staged: &Path, dest: &Path, target: &Path) -> f64 {
        let t0 = Instant::now();
        std::fs::rename(staged, dest).expect("drop");
        let at = self
            .wait_for(target)
            .unwrap_or_else(|| panic!("{} did not reach Done", target.display()));
        at.duration_since(t0).as_secs_f64() * 1e3
    }

    /// The instant `path` appeared (event time), or None after `DEADLINE`.
    fn wait_for(&self, path: &Path) -> Option<Instant> {
        let until = Instant::now() + DEADLINE;
        while Instant::now() < until {
            match self.rx.recv_timeout(Duration::from_millis(5)) {
                Ok((p, at)) if p == path => return Some(at),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if path.exists() {
                        return Some(Instant::now());
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
        None
    }
}

/// Polls `cond` every 10 ms until it holds or `DEADLINE` passes.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + DEADLINE;
    while !cond() {
        if Instant::now() > until {
            panic!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One call to the MCP echo tool.
fn mcp_note_text(tag: &str, i: usize) -> String {
    mcp_note_on("bench", tag, i)
}

fn mcp_note_on(server: &str, tag: &str, i: usize) -> String {
    format!(
        "# Note {i}\n\n```json\n{{\"tool_call\": {{\"name\": \"mcp__{server}__echo\", \"parameters\": {{\"text\": \"{tag} {i}\"}}}}}}\n```\n"
    )
}

/// `[mcp.NAME]`: the in-tree MCP test server with its `echo` tool allowed (`read_only`, no rate
/// limit in the way), working in `dir`, under `sandbox` (a TOML value).
fn mcp_server_table(name: &str, sandbox: &str, dir: &Path) -> String {
    format!(
        "[mcp.{name}]\ncommand = [{:?}, \"--dir\", {dir:?}]\nallow = [\"echo\"]\nsandbox = {sandbox}\n[mcp.{name}.tools.echo]\neffect = \"read_only\"\nrate_limit = {{ per_hour = 100000000 }}\n",
        mcp_test_server().display().to_string(),
        dir = dir.display().to_string(),
    )
}

fn mcp_latency(bin: &Path, rt: &tokio::runtime::Runtime, sizes: Sizes) -> Vec<Metric> {
    let server = rt.block_on(searx::SearxServer::start(Duration::ZERO));
    let bench = Bench::new(&server.base_url());
    let server_dir = bench.dir.path().join("mcp-server");
    std::fs::create_dir_all(&server_dir).expect("the MCP server's folder");
    // The same server twice: `bench` in the default sandbox, `open` unconfined (docs/design.md
    // §10.7), so the sandbox's cost per call is measured beside it.
    let extra = mcp_server_table(
        "bench",
        &format!("{{ writable = [{:?}] }}", server_dir.display().to_string()),
        &server_dir,
    ) + &mcp_server_table("open", "false", &server_dir);
    let mut config = std::fs::read_to_string(&bench.config).expect("read config");
    config.push_str(&extra);
    std::fs::write(&bench.config, config).expect("write config");
    let done = bench.folder("Done");
    let inbox = bench.folder("Needs_Action");
    let watch = FolderWatch::new(&done);
    let daemon = Daemon::start(&bench, bin);

    // One drop by rename, timed until the note's name appears in Done.
    let drop_one = |tag: &str, i: usize, text: String| -> f64 {
        let name = note_name(tag, i);
        let staged = bench.staging.join(&name);
        std::fs::write(&staged, text).expect("stage note");
        let target = done.join(&name);
        let t0 = Instant::now();
        std::fs::rename(&staged, inbox.join(&name)).expect("drop");
        let at = watch
            .wait_for(&target)
            .unwrap_or_else(|| panic!("{} did not reach Done", target.display()));
        at.duration_since(t0).as_secs_f64() * 1e3
    };
    for i in 0..5 {
        drop_one("warm-mcp", i, mcp_note_text("warm", i));
        drop_one("warm-open", i, mcp_note_on("open", "warm", i));
        drop_one("warm-web", i, note_text("warm", i));
    }
    let (mut mcp, mut open, mut web) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..sizes.latency_notes {
        mcp.push(drop_one("mcp", i, mcp_note_text("mcp", i)));
        open.push(drop_one("open", i, mcp_note_on("open", "open", i)));
        web.push(drop_one("web", i, note_text("web", i)));
    }
    daemon.stop();
    mcp.sort_by(f64::total_cmp);
    open.sort_by(f64::total_cmp);
    web.sort_by(f64::total_cmp);
    let added = percentile(&mcp, 0.5) - percentile(&web, 0.5);
    let sandbox_adds = percentile(&mcp, 0.5) - percentile(&open, 0.5);
    vec![
        metric("mcp echo latency p50", percentile(&mcp, 0.5), "ms"),
        metric("mcp echo latency p99", percentile(&mcp, 0.99), "ms"),
        metric(
            "search_web (loopback) latency p50",
            percentile(&web, 0.5),
            "ms",
        ),
        metric(
            "search_web (loopback) latency p99",
            percentile(&web, 0.99),
            "ms",
        ),
        metric("mcp adds at p50", added, "ms").target("<= 1", |v| v <= 1.0),
        metric(
            "mcp echo latency p50, server unconfined",
            percentile(&open, 0.5),
            "ms",
        ),
        metric("mcp sandbox adds at p50", sandbox_adds, "ms").target("<= 1", |v| v <= 1.0),
    ]
}

fn latency(bin: &Path, rt: &tokio::runtime::Runtime, sizes: Sizes) -> Vec<Metric> {
    let server = SearchFake::start(rt);
    let bench = Bench::new(&server.base_url());
    let done = bench.folder("Done");
    let inbox = bench.folder("Needs_Action");
    let watch = FolderWatch::new(&done);

    // The method's own cost: rename into the watched folder ourselves.
    let mut probe = Vec::new();
    for i in 0..50 {
        let staged = bench.staging.join(format!("probe-{i}.txt"));
        std::fs::write(&staged, "x").expect("probe");
        let target = done.join(format!("probe-{i}.txt"));
        let t0 = Instant::now();
        std::fs::rename(&staged, &target).expect("probe rename");
        let at = watch.wait_for(&target).expect("probe event");
        probe.push(at.duration_since(t0).as_secs_f64() * 1e3);
        std::fs::remove_file(&target).expect("probe cleanup");
    }
    probe.sort_by(f64::total_cmp);
    let mut floor = disk_floor(bench.dir.path(), floor_samples(sizes));
    let round_trips = server.round_trips(floor_samples(sizes), Duration::ZERO);
    let paced_round_trips = server.round_trips(floor_samples(sizes), NOTE_PAUSE);

    let daemon = Daemon::start(&bench, bin);
    // Warm up: the daemon is ready when a first note comes through.
    for i in 0..5 {
        let staged = bench.stage("warm", i);
        let target = done.join(note_name("warm", i));
        std::fs::rename(&staged, inbox.join(note_name("warm", i))).expect("drop");
        watch.wait_for(&target).expect("warm-up note reached Done");
    }

    let mut ms = Vec::with_capacity(sizes.latency_notes);
    // vault_append notes, alternated with the search notes so both see the same machine.
    let mut append_ms = Vec::with_capacity(sizes.latency_notes);
    std::fs::create_dir_all(bench.root.join("Agent")).expect("Agent folder");
    for i in 0..sizes.latency_notes {
        let staged = bench.stage("lat", i);
        let target = done.join(note_name("lat", i));
        let dest = inbox.join(note_name("lat", i));
        ms.push(watch.drop_and_time(&staged, &dest, &target));

        if std::env::var_os("VAULTD_BENCH_NO_VAULT_TOOLS").is_some() {
            continue; // an older build without vault tools
        }
        let name = note_name("app", i);
        std::fs::write(bench.root.join(format!("Agent/target-{i}.md")), "# Log\n")
            .expect("append target");
        let staged = bench.staging.join(&name);
        std::fs::write(
            &staged,
            format!(
                "# Append {i}\n\n```json\n{{\"tool_call\": {{\"name\": \"vault_append\", \"parameters\": {{\"path\": \"Agent/target-{i}.md\", \"text\": \"- entry {i}\"}}}}}}\n```\n"
            ),
        )
        .expect("stage append note");
        append_ms.push(watch.drop_and_time(&staged, &inbox.join(&name), &done.join(&name)));
    }
    daemon.stop();
    floor.extend(disk_floor(bench.dir.path(), floor_samples(sizes)));
    floor.sort_by(f64::total_cmp);
    ms.sort_by(f64::total_cmp);
    append_ms.sort_by(f64::total_cmp);
    let mut out = vec![
        metric("latency p50 (0 ms server)", percentile(&ms, 0.5), "ms")
            .target("<= 2.5", |v| v <= 2.5),
        metric("latency p99 (0 ms server)", percentile(&ms, 0.99), "ms")
            .target("<= 10", |v| v <= 10.0),
        metric("latency max", ms[ms.len() - 1], "ms"),
        metric("latency probe overhead p50", percentile(&probe, 0.5), "ms"),
        metric(
            "latency: search fake round trip p50 (bench's client)",
            percentile(&round_trips, 0.5),
            "ms",
        ),
    ];
    out.extend(floor_metrics("latency", "latency", &floor, &ms));
    // Issue 31's figure: drop-to-Done less the fake's own time, against the floor.
    out.push(metric(
        "latency p50 less the fake's round trip / floor",
        (percentile(&ms, 0.5) - percentile(&round_trips, 0.5)) / percentile(&floor, 0.5),
        "x",
    ));
    // The same with the fake's time as a note meets it: after a pause, from idle.
    out.push(metric(
        "latency: search fake round trip p50 after a pause (bench's client)",
        percentile(&paced_round_trips, 0.5),
        "ms",
    ));
    out.push(metric(
        "latency p50 less the paced fake's round trip / floor",
        (percentile(&ms, 0.5) - percentile(&paced_round_trips, 0.5)) / percentile(&floor, 0.5),
        "x",
    ));
    if append_ms.is_empty() {
        return out;
    }
    let append_delta = percentile(&append_ms, 0.5) - percentile(&ms, 0.5);
    out.extend([
        metric(
            "vault_append latency p50",
            percentile(&append_ms, 0.5),
            "ms",
        ),
        metric(
            "vault_append latency p99",
            percentile(&append_ms, 0.99),
            "ms",
        ),
        metric("vault_append p50 minus search_web p50", append_delta, "ms")
            .target("<= 1", |v| v <= 1.0),
    ]);
    out
}

/// The `noop` command tool: `true`, in the default sandbox.
const NOOP_TOOL: &str = "[tools.command.noop]\ndescription = \"Do nothing\"\nargv = [\"true\"]\neffect = \"read_only\"\n";

/// A note with one call of the `noop` command tool (`true`).
fn command_note_text(i: usize) -> String {
    format!(
        "# Command {i}\n\n```json\n{{\"tool_call\": {{\"name\": \"noop\", \"parameters\": {{}}}}}}\n```\n"
    )
}

fn command_tool(bin: &Path, rt: &tokio::runtime::Runtime, sizes: Sizes) -> Vec<Metric> {
    let server = rt.block_on(searx::SearxServer::start(Duration::ZERO));
    let bench = Bench::new(&server.base_url());
    bench.append_config(NOOP_TOOL);
    let done = bench.folder("Done");
    let inbox = bench.folder("Needs_Action");
    let watch = FolderWatch::new(&done);
    let daemon = Daemon::start(&bench, bin);
    let n = sizes.latency_notes;
    let (mut command_ms, mut search_ms) = (Vec::with_capacity(n), Vec::with_capacity(n));
    // Five warm-up rounds, then alternate so both kinds see the same machine load.
    for i in 0..n + 5 {
        for kind in ["cmd", "srch"] {
            let name = note_name(kind, i);
            let staged = bench.staging.join(&name);
            let text = if kind == "cmd" {
                command_note_text(i)
            } else {
                note_text(kind, i)
            };
            std::fs::write(&staged, text).expect("stage note");
            let target = done.join(&name);
            let t0 = Instant::now();
            std::fs::rename(&staged, inbox.join(&name)).expect("drop");
            let at = watch
                .wait_for(&target)
                .unwrap_or_else(|| panic!("{} did not reach Done", target.display()));
            if i >= 5 {
                let ms = at.duration_since(t0).as_secs_f64() * 1e3;
                if kind == "cmd" {
                    command_ms.push(ms);
                } else {
                    search_ms.push(ms);
                }
            }
        }
    }
    // Then command notes each after a pause, as an agent's calls come: a kernel that waits
    // for a grace period before moving a process into a cgroup shows here, not above.
    let mut paused_ms = Vec::with_capacity(n / 4);
    for i in 0..(n / 4).max(10) {
        std::thread::sleep(Duration::from_millis(50));
        let name = note_name("cmdp", i);
        let staged = bench.staging.join(&name);
        std::fs::write(&staged, command_note_text(i)).expect("stage note");
        paused_ms.push(watch.drop_and_time(&staged, &inbox.join(&name), &done.join(&name)));
    }
    daemon.stop();
    let mut alone = Vec::with_capacity(n);
    for _ in 0..n.max(20) {
        let t0 = Instant::now();
        let status = Command::new("true").status().expect("run true");
        assert!(status.success());
        alone.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    for v in [&mut command_ms, &mut search_ms, &mut alone, &mut paused_ms] {
        v.sort_by(f64::total_cmp);
    }
    let (c50, s50, a50) = (
        percentile(&command_ms, 0.5),
        percentile(&search_ms, 0.5),
        percentile(&alone, 0.5),
    );
    vec![
        metric("command note latency p50 (`true`)", c50, "ms"),
        metric(
            "command note latency p99 (`true`)",
            percentile(&command_ms, 0.99),
            "ms",
        ),
        metric("search note latency p50 (0 ms, same daemon)", s50, "ms"),
        metric("`true` spawned directly p50 (own run time)", a50, "ms"),
        // Issues 27 and 31: a command call in the full sandbox within 3 ms of a search call.
        metric(
            "command call overhead p50 (vs search note)",
            c50 - s50,
            "ms",
        )
        .target("<= 3", |v| v <= 3.0),
        metric("whole command note over `true` alone p50", c50 - a50, "ms"),
        metric(
            "whole command note over `true` alone p99",
            percentile(&command_ms, 0.99) - a50,
            "ms",
        ),
    ]
    .into_iter()
    .chain(p50_p99("command note after a 50 ms pause", &paused_ms))
    .collect()
}

/// Runs `vaultd once` over `n` queued notes; returns the wall time.
fn run_once(bench: &Bench, bin: &Path, n: usize) -> Duration {
    let t0 = Instant::now();
    let mut child = bench
        .command(bin, "once")
        .spawn()
        .expect("start vaultd once");
    let until = t0 + DEADLINE * 5;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for once") {
            break s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("vaultd once did not finish");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let took = t0.elapsed();
    assert!(status.success(), "vaultd once failed: {status}");
    let done = bench.count("Done");
    assert_eq!(done, n, "expected {n} notes in Done, found {done}");
    took
}

fn throughput(bin: &Path, rt: &tokio::runtime::Runtime, sizes: Sizes) -> Vec<Metric> {
    let server = SearchFake::start(rt);
    let bench = Bench::new(&server.base_url());
    let n = sizes.throughput_notes;
    bench.queue_notes(n, "tp");
    let took = run_once(&bench, bin, n);
    vec![
        metric(
            format!("once throughput ({n} notes, 0 ms)"),
            n as f64 / took.as_secs_f64(),
            "notes/s",
        )
        .target(">= 2000", |v| v >= 2000.0),
    ]
}

fn cap_efficiency(bin: &Path, rt: &tokio::runtime::Runtime, sizes: Sizes) -> Vec<Metric> {
    let server = rt.block_on(searx::SearxServer::start(CAP_DELAY));
    let bench = Bench::new(&server.base_url());
    let n = sizes.cap_notes;
    bench.queue_notes(n, "cap");
    let spawned = Instant::now();
    let took = run_once(&bench, bin, n);
    let (first, last) = server.span().expect("the cap run made calls");
    let ideal = CAP_DELAY.as_secs_f64() * n as f64 / WORKERS as f64;
    vec![
        metric(
            format!("cap efficiency ({n} x 100 ms, ideal {ideal:.1} s)"),
            ideal / took.as_secs_f64(),
            "ratio",
        )
        .target(">= 0.97", |v| v >= 0.97),
        // The same against what the server really took (its 100 ms are ~100.1 ms).
        metric(
            "cap: slot use (server busy / (10 x wall))",
            server.busy().as_secs_f64() / (WORKERS as f64 * took.as_secs_f64()),
            "ratio",
        ),
        metric(
            "cap: spawn to first call",
            (first - spawned).as_secs_f64() * 1e3,
            "ms",
        ),
        metric(
            "cap: last answer to exit",
            (spawned + took)
                .saturating_duration_since(last)
                .as_secs_f64()
                * 1e3,
            "ms",
        ),
        metric(
            "cap: server max in flight",
            server.max_in_flight() as f64,
            "calls",
        ),
    ]
}

fn idle(bin: &Path, rt: &tokio::runtime::Runtime, sizes: Sizes) -> Vec<Metric> {
    let server = rt.block_on(searx::SearxServer::start(Duration::ZERO));
    let bench = Bench::new(&server.base_url());
    let done = bench.folder("Done");
    let watch = FolderWatch::new(&done);
    // Every page of the binary in the page cache, as right after a build: the daemon then maps
    // all the code it touches (64 KiB around each fault), the most it can; one started from a
    // cold cache maps less. Without this the figure moved by ±0.5 MiB with what the kernel
    // had evicted since the binary was written.
    let _ = std::fs::read(bin);
    // Ready first (a minute allows for valgrind): the note comes in by its event, as in use.
    let daemon = Daemon::start_ready(&bench, bin, Duration::from_secs(60));
    // One note through, so the runtime, HTTP client and journal are all warm.
    let staged = bench.stage("idle", 0);
    std::fs::rename(
        &staged,
        bench.folder("Needs_Action").join(note_name("idle", 0)),
    )
    .expect("drop");
    watch
        .wait_for(&done.join(note_name("idle", 0)))
        .expect("idle warm-up note reached Done");
    std::thread::sleep(Duration::from_millis(200));
    let pid = daemon.pid();
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    let mut rss_max = 0u64;
    while t0.elapsed() < sizes.idle {
        rss_max = rss_max.max(proc_status_kb(pid, "VmRSS:"));
        std::thread::sleep(Duration::from_millis(500));
    }
    let cpu = cpu_seconds(pid) - cpu0;
    let rss = proc_status_kb(pid, "VmRSS:");
    let anon = proc_status_kb(pid, "RssAnon:");
    daemon.stop();
    let mut metrics = vec![
        // Issue 31: "no worse than today (9.3 MiB)".
        metric("idle RSS", rss as f64 / 1024.0, "MiB").target("<= 9.3", |v| v <= 9.3),
        metric("idle RSS max while idle", rss_max as f64 / 1024.0, "MiB"),
        // The rest of VmRSS is file-backed: pages of the binary's code, shared and reclaimable.
        metric("idle RssAnon (heap, stacks)", anon as f64 / 1024.0, "MiB"),
        metric(
            format!("idle CPU over {} s", sizes.idle.as_secs()),
            cpu,
            "s",
        )
        .target("~0 (<= 0.05)", |v| v <= 0.05),
    ];
    if let Some(share) = symbol_order_matched(bin) {
        metrics.push(
            metric("start-up symbol list found in the binary", share, "%")
                .target(">= 99.5 (release)", |v| v >= 99.5),
        );
    }
    metrics
}

/// How much of `scripts/symbol-order.txt` (the start-up functions a release link places side
/// by side, `build.rs`) names functions the binary has. The list goes stale as the code
/// changes, silently: each start-up function it misses brings 64 KiB of code around it into
/// the resident set (idle RSS had grown from 9.6 to 15.6 MiB with 62 % found, BENCHMARKS.md,
/// ninth pass; and from 9.2 to 10.4–10.9 MiB with 99.1 %, 34 names missing: fat LTO numbers
/// the local copies of a function `name.1234` afresh at each build, and a generic function's
/// hash moves with its type arguments). A list just made finds 99.9–100 % in the binary it was
/// made from; below 99.5 %, remake it with `scripts/symbol-order`. It cannot see a start-up
/// function the list never had (new code): idle RSS does. None without `nm` or the list.
fn symbol_order_matched(bin: &Path) -> Option<f64> {
    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/symbol-order.txt");
    let list = std::fs::read_to_string(list).ok()?;
    let wanted: Vec<&str> = list.lines().filter(|l| !l.is_empty()).collect();
    let out = Command::new("nm")
        .arg(bin)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if wanted.is_empty() || !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let have: std::collections::HashSet<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    let found = wanted.iter().filter(|name| have.contains(**name)).count();
    Some(100.0 * found as f64 / wanted.len() as f64)
}

fn queued(bin: &Path, rt: &tokio::runtime::Runtime, sizes: Sizes) -> Vec<Metric> {
    // Slow enough that almost every note is still queued while we measure.
    let server = rt.block_on(searx::SearxServer::start(Duration::from_secs(5)));
    let bench = Bench::new(&server.base_url());
    let daemon = Daemon::start(&bench, bin);
    let pid = daemon.pid();
    wait_until("the daemon's journal", || {
        bench.dir.path().join("state/journal.sqlite").exists()
    });
    std::thread::sleep(Duration::from_millis(200));
    let n = sizes.queued_notes;
    let inbox = bench.folder("Needs_Action");
    let staged: Vec<PathBuf> = (0..n).map(|i| bench.stage("q", i)).collect();
    for (i, s) in staged.iter().enumerate() {
        std::fs::rename(s, inbox.join(note_name("q", i))).expect("drop");
    }
    // Sample until the peak settles: a few seconds after the last drop.
    let t0 = Instant::now();
    let mut hwm = 0u64;
    let mut last_change = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) && last_change.elapsed() < Duration::from_secs(3) {
        let now = proc_status_kb(pid, "VmHWM:");
        if now > hwm {
            hwm = now;
            last_change = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let in_progress = bench.count("In_Progress");
    let still_queued = bench.count("Needs_Action");
    daemon.stop();
    vec![
        metric(
            format!("RSS peak, {n} notes queued (VmHWM)"),
            hwm as f64 / 1024.0,
            "MiB",
        )
        .target("<= 50", |v| v <= 50.0),
        metric(
            "queued: notes still in Needs_Action",
            still_queued as f64,
            "notes",
        ),
        metric("queued: notes in In_Progress", in_progress as f64, "notes"),
    ]
}

/// A `/proc/PID/status` field in kB (0 when unreadable).
fn proc_status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`, which may contain spaces: state is field 3, utime 14, stime 15.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
}

/// Which SearXNG fake answers the search notes of `throughput`, `latency` and `mixed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FakeKind {
    /// `tests/util/searx.rs`, in this process.
    Rust,
    /// `scripts/fake-searxng.py`, a child process.
    Python,
}

impl FakeKind {
    fn describe(self) -> &'static str {
        match self {
            FakeKind::Rust => "rust (tests/util/searx.rs, in process)",
            FakeKind::Python => "python (scripts/fake-searxng.py)",
        }
    }
}

/// Set once by `main` from `--fake` / `VAULTD_BENCH_FAKE`. A global rather than one more
/// parameter of every scenario: only three scenarios read it, and the others keep their
/// signatures (and their diffs) as they are.
static FAKE: OnceLock<FakeKind> = OnceLock::new();

/// The search server of one scenario, 0 ms answers, as `--fake` chose it.
enum SearchFake {
    Rust(searx::SearxServer),
    /// Killed when dropped; its stdout is kept open (it printed its address there).
    Python {
        child: Child,
        url: String,
        _stdout: std::process::ChildStdout,
    },
}

impl SearchFake {
    fn start(rt: &tokio::runtime::Runtime) -> SearchFake {
        match FAKE.get().copied().unwrap_or(FakeKind::Rust) {
            FakeKind::Rust => {
                SearchFake::Rust(rt.block_on(searx::SearxServer::start(Duration::ZERO)))
            }
            FakeKind::Python => SearchFake::start_python(),
        }
    }

    /// `python3 scripts/fake-searxng.py` on a free port: its first line names the address.
    fn start_python() -> SearchFake {
        use std::io::BufRead;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fake-searxng.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "--fake python: cannot run python3 {}: {e}",
                    script.display()
                )
            });
        let stdout = child.stdout.take().expect("stdout was piped");
        // Read the line on a thread, so a fake that never speaks fails at the deadline.
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut out = std::io::BufReader::new(stdout);
            let mut line = String::new();
            let _ = out.read_line(&mut line);
            let _ = tx.send(line);
            out.into_inner()
        });
        let line = match rx.recv_timeout(DEADLINE) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "--fake python: {} said nothing in {DEADLINE:?}",
                    script.display()
                );
            }
        };
        let stdout = reader.join().expect("the reader thread does not panic");
        let Some(url) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "--fake python: {} said {line:?}, not `listening on URL`",
                script.display()
            );
        };
        SearchFake::Python {
            url: url.to_string(),
            child,
            _stdout: stdout,
        }
    }

    fn base_url(&self) -> String {
        match self {
            SearchFake::Rust(s) => s.base_url(),
            SearchFake::Python { url, .. } => url.clone(),
        }
    }

    /// `n` requests as vaultd makes them, on one keep-alive connection from this process,
    /// each timed from the request's write to the body's last byte (ms, sorted): the fake's
    /// own share of a search note. `pause` before each request: back to back (zero), the
    /// machine stays awake; after a pause like the one between two notes of `latency`, the
    /// fake's thread and this one are woken from idle, as they are for a note.
    fn round_trips(&self, n: usize, pause: Duration) -> Vec<f64> {
        use std::io::{BufRead, Read, Write};
        let url = self.base_url();
        let addr = url
            .strip_prefix("http://")
            .expect("the fake's URL is http://");
        let stream = std::net::TcpStream::connect(addr).expect("connect to the search fake");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        stream
            .set_read_timeout(Some(DEADLINE))
            .expect("read timeout");
        let mut writer = stream.try_clone().expect("clone the socket");
        let mut reader = std::io::BufReader::new(stream);
        let mut ms = Vec::with_capacity(n);
        for i in 0..n {
            std::thread::sleep(pause);
            let request = format!(
                "GET /search?q=probe+{i}&format=json&pageno=1 HTTP/1.1\r\nHost: {addr}\r\naccept: application/json\r\n\r\n"
            );
            let t0 = Instant::now();
            writer
                .write_all(request.as_bytes())
                .expect("send to the fake");
            let mut length = None;
            loop {
                let mut line = String::new();
                let read = reader.read_line(&mut line).expect("the fake's answer");
                assert!(read > 0, "the fake closed the connection mid-answer");
                let l = line.trim_end();
                if l.is_empty() {
                    break;
                }
                if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse::<usize>().ok();
                }
            }
            let mut body = vec![0u8; length.expect("the fake sends content-length")];
            reader.read_exact(&mut body).expect("the fake's body");
            ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        ms.sort_by(f64::total_cmp);
        ms
    }
}

impl Drop for SearchFake {
    fn drop(&mut self) {
        if let SearchFake::Python { child, .. } = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The disk's floor for one note (issue 31): write 4 KiB to a temp file and fsync it, rename
/// it into place and fsync that folder (an atomic note write), rename it into a second folder
/// and fsync that one (the move to `Done/`). `n` samples in ms, sorted, taken in `dir` (give
/// it a folder on the vault's file system; the daemon does not watch it).
fn disk_floor(dir: &Path, n: usize) -> Vec<f64> {
    use std::io::Write;
    let (a, b) = (dir.join("floor-a"), dir.join("floor-b"));
    for d in [&a, &b] {
        std::fs::create_dir_all(d).expect("the floor's folders");
    }
    // The folders' descriptors are opened once, as a daemon that keeps them would.
    let (da, db) = (
        std::fs::File::open(&a).expect("open floor-a"),
        std::fs::File::open(&b).expect("open floor-b"),
    );
    let block = [b'x'; 4096];
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        let (temp, note, moved) = (
            a.join(format!(".n{i}.tmp")),
            a.join(format!("n{i}.md")),
            b.join(format!("n{i}.md")),
        );
        let t0 = Instant::now();
        let mut f = std::fs::File::create(&temp).expect("floor temp file");
        f.write_all(&block).expect("floor write");
        f.sync_all().expect("floor fsync");
        drop(f);
        std::fs::rename(&temp, &note).expect("floor rename");
        da.sync_all().expect("floor folder fsync");
        std::fs::rename(&note, &moved).expect("floor move");
        db.sync_all().expect("floor second folder fsync");
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
        std::fs::remove_file(&moved).expect("floor cleanup");
    }
    ms.sort_by(f64::total_cmp);
    ms
}

/// About the time between two requests to the search fake in `latency` (a search note, then a
/// vault_append note): what the fake's round trip is paced by when it is timed as a note
/// meets it.
const NOTE_PAUSE: Duration = Duration::from_millis(4);

/// Samples of the floor per measurement: half before the daemon starts, half after it stops.
fn floor_samples(sizes: Sizes) -> usize {
    sizes.latency_notes.clamp(10, 100)
}

/// The floor's figures and drop-to-Done as multiples of it (`what` names the notes).
/// The floor's names carry the scenario's (`scenario`): `--only send,mixed` must not pool two
/// runs' floors into one row.
fn floor_metrics(scenario: &str, what: &str, floor: &[f64], sorted_ms: &[f64]) -> Vec<Metric> {
    let f50 = percentile(floor, 0.5);
    vec![
        metric(format!("{scenario}: disk floor p50"), f50, "ms"),
        metric(
            format!("{scenario}: disk floor p99"),
            percentile(floor, 0.99),
            "ms",
        ),
        metric(
            format!("{what} p50 / disk floor p50"),
            percentile(sorted_ms, 0.5) / f50,
            "x",
        )
        .target("<= 2.5", |v| v <= 2.5),
        metric(
            format!("{what} p99 / disk floor p50"),
            percentile(sorted_ms, 0.99) / f50,
            "x",
        )
        .target("<= 10", |v| v <= 10.0),
    ]
}

/// Drops one note by rename into `Needs_Action/` and returns the ms until its name appears in
/// `Done/`; on a timeout, says where the note is.
fn drop_timed(bench: &Bench, watch: &FolderWatch, name: &str, text: &str) -> f64 {
    let staged = bench.staging.join(name);
    std::fs::write(&staged, text).expect("stage note");
    let target = bench.folder("Done").join(name);
    let t0 = Instant::now();
    std::fs::rename(&staged, bench.folder("Needs_Action").join(name)).expect("drop");
    let Some(at) = watch.wait_for(&target) else {
        let seen: Vec<String> = std::fs::read_dir(&bench.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|f| f.path().join(name).exists())
            .map(|f| f.file_name().to_string_lossy().into_owned())
            .collect();
        panic!(
            "{name} did not reach Done/ in {DEADLINE:?}; it is in {seen:?} (daemon log: {})",
            bench.dir.path().join("run.log").display()
        );
    };
    at.duration_since(t0).as_secs_f64() * 1e3
}

impl Bench {
    /// Adds TOML tables at the end of the config.
    fn append_config(&self, tables: &str) {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.config)
            .and_then(|mut f| f.write_all(tables.as_bytes()))
            .expect("append to the config");
    }

    /// `send_notification` by email into `outbox/` beside the vault, to an allowed recipient
    /// (no approval), rate limits out of the way.
    fn enable_send(&self) {
        self.append_config(&format!(
            "[tools.send_notification]\nallowed_recipients = [{SEND_TO:?}]\n\
             rate_limit = {{ per_hour = 100000000, per_day = 100000000 }}\n\
             [tools.send_notification.email]\ntransport = \"file\"\noutbox = {:?}\n",
            self.outbox().display().to_string()
        ));
    }

    fn outbox(&self) -> PathBuf {
        self.dir.path().join("outbox")
    }

    /// `.eml` files in the outbox.
    fn emails(&self) -> usize {
        std::fs::read_dir(self.outbox())
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".eml"))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Writes `n` notes of `text` straight into Needs_Action (for `once`).
    fn queue_with(&self, n: usize, tag: &str, text: fn(&str, usize) -> String) {
        let inbox = self.folder("Needs_Action");
        for i in 0..n {
            std::fs::write(inbox.join(note_name(tag, i)), text(tag, i)).expect("write note");
        }
    }
}

/// The recipient of the send notes, in `allowed_recipients`.
const SEND_TO: &str = "bench@example.org";

/// One `send_notification` email (the default method) to the allowed recipient.
fn send_note_text(tag: &str, i: usize) -> String {
    format!(
        "# Note {i}\n\nSome text the agent wrote.\n\n```json\n{{\"tool_call\": {{\"name\": \"send_notification\", \"parameters\": {{\"recipient\": \"{SEND_TO}\", \"subject\": \"{tag} {i}\", \"body\": \"Note {i} of the load bench says hello.\"}}}}}}\n```\n"
    )
}

/// One `vault_create` of a new note under `Agent/` (allowed by `[tools.vault] write`).
fn vault_note_text(tag: &str, i: usize) -> String {
    format!(
        "# Note {i}\n\n```json\n{{\"tool_call\": {{\"name\": \"vault_create\", \"parameters\": {{\"path\": \"Agent/{tag}-{i}.md\", \"content\": \"# Found\\n\\nentry {i}\\n\"}}}}}}\n```\n"
    )
}

fn send(bin: &Path, _rt: &tokio::runtime::Runtime, sizes: Sizes) -> Vec<Metric> {
    // No search call is made: the search URL is a closed port.
    let no_search = "http://127.0.0.1:9";

    // `vaultd once` over queued send notes.
    let bench = Bench::new(no_search);
    bench.enable_send();
    let n = sizes.throughput_notes;
    bench.queue_with(n, "stp", send_note_text);
    let took = run_once(&bench, bin, n);
    assert_eq!(bench.emails(), n, "one .eml per send note");

    // Drop-to-Done in a running daemon, a fresh vault, the floor measured around it.
    let bench = Bench::new(no_search);
    bench.enable_send();
    let watch = FolderWatch::new(&bench.folder("Done"));
    let mut floor = disk_floor(bench.dir.path(), floor_samples(sizes));
    let daemon = Daemon::start(&bench, bin);
    for i in 0..5 {
        drop_timed(
            &bench,
            &watch,
            &note_name("warm", i),
            &send_note_text("warm", i),
        );
    }
    let mut ms: Vec<f64> = (0..sizes.latency_notes)
        .map(|i| {
            drop_timed(
                &bench,
                &watch,
                &note_name("snd", i),
                &send_note_text("snd", i),
            )
        })
        .collect();
    daemon.stop();
    floor.extend(disk_floor(bench.dir.path(), floor_samples(sizes)));
    floor.sort_by(f64::total_cmp);
    ms.sort_by(f64::total_cmp);
    assert_eq!(
        bench.emails(),
        sizes.latency_notes + 5,
        "one .eml per send note"
    );
    let mut out = vec![
        metric(
            format!("send once throughput ({n} notes, .eml outbox)"),
            n as f64 / took.as_secs_f64(),
            "notes/s",
        )
        .target(">= 1500", |v| v >= 1500.0),
        metric("send latency p50 (.eml outbox)", percentile(&ms, 0.5), "ms"),
        metric(
            "send latency p99 (.eml outbox)",
            percentile(&ms, 0.99),
            "ms",
        ),
        metric("send latency max", ms[ms.len() - 1], "ms"),
    ];
    out.extend(floor_metrics("send", "send latency", &floor, &ms));
    out
}

/// The kinds of note in `mixed`, in the order of the first round.
const MIXED_KINDS: [&str; 5] = ["search", "send", "vault", "mcp", "command"];

fn mixed(bin: &Path, rt: &tokio::runtime::Runtime, sizes: Sizes) -> Vec<Metric> {
    let fake = SearchFake::start(rt);
    let bench = Bench::new(&fake.base_url());
    let vault_tools = std::env::var_os("VAULTD_BENCH_NO_VAULT_TOOLS").is_none();
    bench.enable_send();
    let server_dir = bench.dir.path().join("mcp-server");
    std::fs::create_dir_all(&server_dir).expect("the MCP server's folder");
    bench.append_config(&mcp_server_table(
        "bench",
        &format!("{{ writable = [{:?}] }}", server_dir.display().to_string()),
        &server_dir,
    ));
    bench.append_config(NOOP_TOOL);
    if vault_tools {
        std::fs::create_dir_all(bench.root.join("Agent")).expect("Agent folder");
    }
    let text = |kind: &str, i: usize| -> String {
        match kind {
            "search" => note_text("mix-search", i),
            "send" => send_note_text("mix-send", i),
            "vault" => vault_note_text("mix-vault", i),
            "mcp" => mcp_note_text("mix-mcp", i),
            "command" => command_note_text(i),
            _ => unreachable!("one of MIXED_KINDS"),
        }
    };
    let kinds: Vec<&str> = MIXED_KINDS
        .into_iter()
        .filter(|k| vault_tools || *k != "vault") // an older build without vault tools
        .collect();

    let watch = FolderWatch::new(&bench.folder("Done"));
    let mut floor = disk_floor(bench.dir.path(), floor_samples(sizes));
    let round_trips = fake.round_trips(floor_samples(sizes), Duration::ZERO);
    let daemon = Daemon::start(&bench, bin);
    let mut ms: BTreeMap<&str, Vec<f64>> = kinds.iter().map(|k| (*k, Vec::new())).collect();
    // Five warm-up rounds (each kind's first call: the MCP server's start, the outbox's
    // creation), then rounds whose order is rotated by one each time.
    for round in 0..sizes.latency_notes + 5 {
        let mut order = kinds.clone();
        order.rotate_left(round % kinds.len());
        for kind in order {
            let t = drop_timed(
                &bench,
                &watch,
                &note_name(&format!("mix-{kind}"), round),
                &text(kind, round),
            );
            if round >= 5 {
                ms.get_mut(kind).expect("every kind has samples").push(t);
            }
        }
    }
    daemon.stop();
    floor.extend(disk_floor(bench.dir.path(), floor_samples(sizes)));
    floor.sort_by(f64::total_cmp);
    assert_eq!(
        bench.emails(),
        sizes.latency_notes + 5,
        "one .eml per send note"
    );
    for v in ms.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    let p50 = |k: &str| percentile(&ms[k], 0.5);
    let mut out = Vec::new();
    for kind in &kinds {
        out.push(metric(format!("mixed: {kind} p50"), p50(kind), "ms"));
        out.push(metric(
            format!("mixed: {kind} p99"),
            percentile(&ms[kind], 0.99),
            "ms",
        ));
    }
    out.push(metric(
        "mixed: search fake round trip p50 (bench's client)",
        percentile(&round_trips, 0.5),
        "ms",
    ));
    out.push(
        metric(
            "mixed: mcp minus search at p50",
            p50("mcp") - p50("search"),
            "ms",
        )
        .target("<= 1", |v| v <= 1.0),
    );
    out.push(
        metric(
            "mixed: command minus search at p50",
            p50("command") - p50("search"),
            "ms",
        )
        .target("<= 3", |v| v <= 3.0),
    );
    out.push(metric(
        "mixed: send minus search at p50",
        p50("send") - p50("search"),
        "ms",
    ));
    if vault_tools {
        out.push(metric(
            "mixed: vault write minus search at p50",
            p50("vault") - p50("search"),
            "ms",
        ));
    }
    out.extend(floor_metrics("mixed", "mixed: send", &floor, &ms["send"]));
    let f50 = percentile(&floor, 0.5);
    out.push(
        metric(
            "mixed: search p50 / disk floor p50",
            p50("search") / f50,
            "x",
        )
        .target("<= 2.5", |v| v <= 2.5),
    );
    out
}
