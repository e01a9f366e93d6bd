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
struct Tally {
    spec: ToolSpec,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl Tool for Tally {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(&'a self, call: ToolCall<'a>) -> ToolFuture<'a> {
        Box::pin(async move {
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

fn tally_source(seen: Arc<Mutex<Vec<(String, String)>>>) -> Registry {
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
        .add(Box::new(Tally { spec, seen }), policy)
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
        registry: tally_source(seen),
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
