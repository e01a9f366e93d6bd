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
//!   daemon; and `true` spawned directly by the bench, unsandboxed: the program's own time.
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
use std::sync::mpsc;
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

    let bin = vaultd_bin();
    eprintln!("vaultd binary: {}", bin.display());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");

    type Scenario = fn(&Path, &tokio::runtime::Runtime, Sizes) -> Vec<Metric>;
    let scenarios: [(&str, Scenario); 7] = [
        ("latency", latency),
        ("throughput", throughput),
        ("cap", cap_efficiency),
        ("idle", idle),
        ("queued", queued),
        ("mcp", mcp_latency),
        ("command", command_tool),
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
        "vaultd load ({}, {} round(s) per scenario; median [min..max])",
        label, repeat
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
    dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
    staging: PathBuf,
}

impl Bench {
    fn new(search_url: &str) -> Bench {
        // `VAULTD_BENCH_KEEP_IN=DIR`: vaults are made in DIR and kept. On ext4 without a
        // journal, inodes freed in the last 60 s are skipped one by one when a new file is
        // made (`recently_deleted()`), so a run right after another one's vault was removed
        // measures that scan: for A/B runs back to back, keep them and remove DIR after.
        let keep_in = std::env::var_os("VAULTD_BENCH_KEEP_IN");
        let dir = tempfile::Builder::new()
            .prefix("vaultd-load-")
            .disable_cleanup(keep_in.is_some())
            .tempdir_in(keep_in.map_or_else(std::env::temp_dir, PathBuf::from))
            .expect("tempdir");
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

fn mcp_latency(bin: &Path, rt: &tokio::runtime::Runtime, sizes: Sizes) -> Vec<Metric> {
    let server = rt.block_on(searx::SearxServer::start(Duration::ZERO));
    let bench = Bench::new(&server.base_url());
    let server_dir = bench.dir.path().join("mcp-server");
    std::fs::create_dir_all(&server_dir).expect("the MCP server's folder");
    // The same server twice: `bench` in the default sandbox, `open` unconfined (docs/design.md
    // §10.7), so the sandbox's cost per call is measured beside it.
    let server_table = |name: &str, sandbox: &str| {
        format!(
            "[mcp.{name}]\ncommand = [{:?}, \"--dir\", {dir:?}]\nallow = [\"echo\"]\nsandbox = {sandbox}\n[mcp.{name}.tools.echo]\neffect = \"read_only\"\nrate_limit = {{ per_hour = 100000000 }}\n",
            mcp_test_server().display().to_string(),
            dir = server_dir.display().to_string(),
        )
    };
    let extra = server_table(
        "bench",
        &format!("{{ writable = [{:?}] }}", server_dir.display().to_string()),
    ) + &server_table("open", "false");
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
    let server = rt.block_on(searx::SearxServer::start(Duration::ZERO));
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
        let t0 = Instant::now();
        std::fs::rename(&staged, &dest).expect("drop");
        let at = watch
            .wait_for(&target)
            .unwrap_or_else(|| panic!("{} did not reach Done", target.display()));
        ms.push(at.duration_since(t0).as_secs_f64() * 1e3);

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
        let target = done.join(&name);
        let t0 = Instant::now();
        std::fs::rename(&staged, inbox.join(&name)).expect("drop");
        let at = watch
            .wait_for(&target)
            .unwrap_or_else(|| panic!("{} did not reach Done", target.display()));
        append_ms.push(at.duration_since(t0).as_secs_f64() * 1e3);
    }
    daemon.stop();
    ms.sort_by(f64::total_cmp);
    append_ms.sort_by(f64::total_cmp);
    let base = vec![
        metric("latency p50 (0 ms server)", percentile(&ms, 0.5), "ms")
            .target("<= 2.5", |v| v <= 2.5),
        metric("latency p99 (0 ms server)", percentile(&ms, 0.99), "ms")
            .target("<= 10", |v| v <= 10.0),
        metric("latency max", ms[ms.len() - 1], "ms"),
        metric("latency probe overhead p50", percentile(&probe, 0.5), "ms"),
    ];
    if append_ms.is_empty() {
        return base;
    }
    let append_delta = percentile(&append_ms, 0.5) - percentile(&ms, 0.5);
    vec![
        metric("latency p50 (0 ms server)", percentile(&ms, 0.5), "ms")
            .target("<= 2.5", |v| v <= 2.5),
        metric("latency p99 (0 ms server)", percentile(&ms, 0.99), "ms")
            .target("<= 10", |v| v <= 10.0),
        metric("latency max", ms[ms.len() - 1], "ms"),
        metric("latency probe overhead p50", percentile(&probe, 0.5), "ms"),
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
    ]
}

/// A note with one call of the `noop` command tool (`true`).
fn command_note_text(i: usize) -> String {
    format!(
        "# Command {i}\n\n```json\n{{\"tool_call\": {{\"name\": \"noop\", \"parameters\": {{}}}}}}\n```\n"
    )
}

fn command_tool(bin: &Path, rt: &tokio::runtime::Runtime, sizes: Sizes) -> Vec<Metric> {
    use std::io::Write;
    let server = rt.block_on(searx::SearxServer::start(Duration::ZERO));
    let bench = Bench::new(&server.base_url());
    std::fs::OpenOptions::new()
        .append(true)
        .open(&bench.config)
        .and_then(|mut f| {
            f.write_all(
                b"[tools.command.noop]\ndescription = \"Do nothing\"\nargv = [\"true\"]\neffect = \"read_only\"\n",
            )
        })
        .expect("add the command tool");
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
    daemon.stop();
    let mut alone = Vec::with_capacity(n);
    for _ in 0..n.max(20) {
        let t0 = Instant::now();
        let status = Command::new("true").status().expect("run true");
        assert!(status.success());
        alone.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    for v in [&mut command_ms, &mut search_ms, &mut alone] {
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
        metric(
            "command call overhead p50 (vs search note)",
            c50 - s50,
            "ms",
        ),
        metric("whole command note over `true` alone p50", c50 - a50, "ms")
            .target("<= 3", |v| v <= 3.0),
        metric(
            "whole command note over `true` alone p99",
            percentile(&command_ms, 0.99) - a50,
            "ms",
        ),
    ]
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
    let server = rt.block_on(searx::SearxServer::start(Duration::ZERO));
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
    let daemon = Daemon::start(&bench, bin);
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
    vec![
        metric("idle RSS", rss as f64 / 1024.0, "MiB").target("<= 15", |v| v <= 15.0),
        metric("idle RSS max while idle", rss_max as f64 / 1024.0, "MiB"),
        // The rest of VmRSS is file-backed: pages of the binary's code, shared and reclaimable.
        metric("idle RssAnon (heap, stacks)", anon as f64 / 1024.0, "MiB"),
        metric(
            format!("idle CPU over {} s", sizes.idle.as_secs()),
            cpu,
            "s",
        )
        .target("~0 (<= 0.05)", |v| v <= 0.05),
    ]
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
