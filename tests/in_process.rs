//! The daemon run in-process through `daemon::run(services, shutdown)`: a temp vault, the real
//! journal, and a tool source of the test's own (a tiny `Tool` registered into the
//! `Registry`), so a behaviour can be tested without a server or the binary.

use crate::util::*;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vaultd::call::{CallError, ErrorCode, ToolOutput};
use vaultd::config::{Overrides, RateLimit};
use vaultd::daemon::{self, Mode, Services};
use vaultd::journal::Journal;
use vaultd::secret::Redactor;
use vaultd::tools::{Effect, Policy, Registry, Source, Tool, ToolCall, ToolFuture, ToolSpec};
use vaultd::vault::Vault;

/// `tally`: remembers the call ids and words it was called with; fails on the word "boom".
/// Takes `delay` per call.
struct Tally {
    spec: ToolSpec,
    seen: Arc<Mutex<Vec<(String, String)>>>,
    delay: Duration,
}

impl Tool for Tally {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(&'a self, call: ToolCall<'a>) -> ToolFuture<'a> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            let word = call.parameters["word"].as_str().unwrap_or("").to_string();
            let mut seen = self.seen.lock().unwrap();
            seen.push((call.call_id.to_string(), word.clone()));
            if word == "boom" {
                return Err(CallError::new(ErrorCode::ExecutionError, "tally: boom"));
            }
            Ok(ToolOutput {
                data: json!({ "word": word, "count": seen.len() }),
                summary: format!("{} seen", seen.len()),
                undo: None,
            })
        })
    }
}

fn tally_source(seen: Arc<Mutex<Vec<(String, String)>>>, delay: Duration) -> Registry {
    let mut registry = Registry::empty();
    let spec = ToolSpec {
        name: "tally".to_string(),
        description: "counts words".to_string(),
        source: Source::Builtin,
        effect: Effect::ReadOnly,
        schema: json!({
            "type": "object",
            "properties": { "word": { "type": "string" } },
            "required": ["word"],
            "additionalProperties": false
        }),
    };
    let policy = Policy {
        enabled: true,
        timeout: Duration::from_secs(5),
        rate_limit: RateLimit::default(),
        approval: None,
    };
    registry
        .add(Box::new(Tally { spec, seen, delay }), policy)
        .unwrap();
    registry
}

fn tally_call(word: &str) -> String {
    format!(
        "```json\n{}\n```\n",
        json!({ "tool_call": { "name": "tally", "parameters": { "word": word } } })
    )
}

/// Runs the daemon once over `vault` with the tally tool as its only tool source.
async fn run_once(vault: &TestVault, seen: Arc<Mutex<Vec<(String, String)>>>) {
    run_once_with(vault, tally_source(seen, Duration::ZERO)).await
}

async fn run_once_with(vault: &TestVault, registry: Registry) {
    let config = vaultd::config::load(&Overrides {
        config: Some(vault.config.clone()),
        ..Overrides::default()
    })
    .unwrap();
    let v = Vault::new(config.vault.clone(), config.folders.clone());
    v.prepare().unwrap();
    let journal = Arc::new(Journal::open(&config.state_dir).unwrap());
    let services = Services {
        mode: Mode::Once,
        vault: v,
        journal,
        registry,
        redactor: Arc::new(Redactor::new([], &[])),
        config,
    };
    daemon::run(services, std::future::pending()).await.unwrap();
}

fn result_data(note: &str) -> Vec<Value> {
    note.lines()
        .filter_map(|l| l.strip_prefix("> "))
        .collect::<Vec<_>>()
        .join("\n")
        .split("```json")
        .filter_map(|block| serde_json::from_str::<Value>(block.split("```").next()?).ok())
        .filter_map(|v| v.get("tool_result").cloned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_tool_source_runs_in_process_through_the_whole_pipeline() {
    let vault = TestVault::new("http://127.0.0.1:9", "");
    vault.drop_note(
        "a.md",
        &format!("# A\n{}{}", tally_call("one"), tally_call("two")),
    );
    vault.drop_note("b.md", &format!("# B\n{}", tally_call("boom")));
    vault.drop_note(
        "c.md",
        &format!("# C\n{}", tally_call("").replace("word", "wrd")),
    );
    let seen = Arc::new(Mutex::new(Vec::new()));

    run_once(&vault, seen.clone()).await;

    let a = vault.read("Done", "a.md");
    let results = result_data(&a);
    assert_eq!(results.len(), 2, "{a}");
    let words: Vec<&Value> = results.iter().map(|r| &r["data"]["word"]).collect();
    assert_eq!(
        words,
        [&json!("one"), &json!("two")],
        "results in call order: {a}"
    );
    let b = vault.read("Failed", "b.md");
    assert!(b.contains("tally: boom"), "{b}");
    // Validated once, by the plan: a call that breaks the schema never reaches the tool.
    let c = vault.read("Failed", "c.md");
    assert!(c.contains("INVALID_PARAMS"), "{c}");
    let mut words: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, w)| w.clone())
        .collect();
    words.sort();
    assert_eq!(words, ["boom", "one", "two"]);

    // A second pass finds nothing pending: nothing runs twice.
    run_once(&vault, seen.clone()).await;
    assert_eq!(seen.lock().unwrap().len(), 3);
}

/// STYLE habit 3: a note task is spawned only with its note slot in hand (`workers` × 4), so a
/// backlog is a list of paths, not a task per note. Counted with the runtime's own task count
/// while `once` works through 120 notes with 2 workers (8 slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_paths_not_tasks() {
    let vault = TestVault::new("http://127.0.0.1:9", "workers = 2");
    let notes = 120;
    for i in 0..notes {
        vault.drop_note(&format!("n{i:03}.md"), &format!("# N\n{}", tally_call("x")));
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (m, sampled) = (most.clone(), metrics.clone());
    let sampler = tokio::spawn(async move {
        loop {
            m.fetch_max(
                sampled.num_alive_tasks(),
                std::sync::atomic::Ordering::SeqCst,
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    run_once_with(
        &vault,
        tally_source(seen.clone(), Duration::from_millis(20)),
    )
    .await;
    sampler.abort();
    assert_eq!(seen.lock().unwrap().len(), notes, "every note ran");
    assert_eq!(
        std::fs::read_dir(vault.root.join("Done")).unwrap().count(),
        notes
    );
    let most = most.load(std::sync::atomic::Ordering::SeqCst) - before;
    // 8 note tasks, the sampler and the daemon's few of its own; a task per note would be 120.
    assert!(
        most <= 24,
        "{most} tasks alive at once for {notes} queued notes"
    );
}
