//! `vault_search` over a generated vault of 10,000 notes (~50 MB): the real tool (the
//! `ignore` walk, `grep-searcher` scan) through its `Tool::run`, timed per call.
//!
//! ```sh
//! cargo bench --bench vault                # 10,000 notes, ~50 MB, 30 searches per query
//! cargo bench --bench vault -- --quick     # 2,000 notes
//! cargo test --bench vault                 # smoke: 200 notes, a few searches
//! ```

use serde_json::{Map, Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use vaultd::tools::vault::{RawVault, VaultToolsConfig, register};
use vaultd::tools::{Registry, ToolCall};

/// Words the generated notes are made of (a vault's everyday vocabulary).
const WORDS: &[&str] = &[
    "the", "meeting", "project", "notes", "agent", "review", "draft", "plan", "team", "idea",
    "design", "week", "call", "email", "todo", "research", "reading", "summary", "question",
    "answer", "link", "source", "paper", "client", "launch", "budget", "deadline", "garden",
    "recipe", "travel", "book", "music", "health", "habit", "journal", "daily", "weekly",
    "monthly", "report", "status", "update", "context", "system", "vault", "folder", "tag",
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// `notes` notes of ~5 KB in 100 folders; every 997th note mentions the rare pair
/// "zephyr quarterly" (so a search for it scans everything and finds ~10 notes).
fn generate(root: &Path, notes: usize) -> u64 {
    let mut rng = Rng(0x005E_A2C4);
    let mut bytes = 0;
    for i in 0..notes {
        let dir = root.join(format!("Area {:02}", i % 100));
        std::fs::create_dir_all(&dir).expect("folder");
        let mut text = format!("---\ntags: [t{}]\n---\n# Note {i}\n\n", i % 7);
        while text.len() < 5_000 {
            for _ in 0..12 {
                text.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]);
                text.push(' ');
            }
            text.push('\n');
            if rng.next().is_multiple_of(9) {
                text.push_str("- [ ] follow up on the plan\n");
            }
        }
        if i.is_multiple_of(997) {
            text.push_str("The zephyr numbers for the quarterly report.\n");
        }
        bytes += text.len() as u64;
        std::fs::write(dir.join(format!("note {i:05}.md")), text).expect("note");
    }
    bytes
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let smoke = !args.iter().any(|a| a == "--bench");
    let quick = args.iter().any(|a| a == "--quick");
    let (notes, rounds) = match (smoke, quick) {
        (true, _) => (200, 3),
        (false, true) => (2_000, 20),
        (false, false) => (10_000, 30),
    };
    let dir = tempfile::Builder::new()
        .prefix("vaultd-search-")
        .tempdir()
        .expect("tempdir");
    let root = dir.path().canonicalize().expect("canonical");
    let t0 = Instant::now();
    let bytes = generate(&root, notes);
    eprintln!(
        "generated {notes} notes, {:.1} MB in {:.1} s",
        bytes as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    let cx = vaultd::config::TableContext {
        path: Path::new("bench.toml"),
        base: &root,
        vault: &root,
        folders: &vaultd::config::Folders::default(),
        state_dir: &root.join(".state"),
        skip_secrets: false,
    };
    let config = VaultToolsConfig::from_raw(
        RawVault::default(),
        Vec::new(),
        &cx,
        &[vaultd::results::DEFAULT_FOLDER],
    )
    .expect("config");
    let mut registry = Registry::empty();
    register(&config, None, &mut registry).expect("register");
    let tool = registry.get("vault_search").expect("vault_search");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    let queries = [
        ("rare pair, scans every note", "zephyr quarterly"),
        ("no match, scans every note", "xylophone"),
        ("common words, stops at 20", "budget deadline"),
    ];
    println!(
        "vault_search over {notes} notes ({:.1} MB)",
        bytes as f64 / 1e6
    );
    for (label, query) in queries {
        let params: Map<String, Value> = json!({ "query": query })
            .as_object()
            .expect("object")
            .clone();
        let mut ms = Vec::with_capacity(rounds);
        let mut found = 0;
        // One warm-up search: the page cache holds the vault, as on a machine in use.
        for round in 0..=rounds {
            let t = Instant::now();
            let out = rt
                .block_on(tool.tool.run(ToolCall {
                    note_id: "n-000000000001",
                    call_id: "bench",
                    note: "In_Progress/bench.md",
                    parameters: &params,
                    deadline: Instant::now() + Duration::from_secs(60),
                    answer: None,
                }))
                .expect("search runs");
            if round > 0 {
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            found = out.data["matches"].as_array().map_or(0, Vec::len);
        }
        ms.sort_by(f64::total_cmp);
        println!(
            "  {label:<28} {query:<18} p50 {:>7.1} ms  p90 {:>7.1} ms  max {:>7.1} ms  ({found} matches)",
            percentile(&ms, 0.5),
            percentile(&ms, 0.9),
            ms[ms.len() - 1],
        );
    }
}
