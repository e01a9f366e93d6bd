//! Criterion micro-benches of the pure core: parsing and rendering a big note and a lone
//! one, call-id computation, schema validation of one call.
//!
//! ```text
//! cargo bench --bench core
//! ```

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Map, Value, json};
use std::hint::black_box;
use std::time::{Duration, SystemTime};
use vaultd::call::{CallResult, ToolOutput};
use vaultd::config::ToolsConfig;
use vaultd::note::parse::{canonical_json, hash_id};
use vaultd::note::{Block, append_blocks, parse_note};
use vaultd::tools::Registry;

const NOTE_BYTES: usize = 1 << 20;
const CALLS: usize = 100;

/// A ~1 MiB note: frontmatter, 100 search calls, prose between them.
fn big_note() -> String {
    let mut s = String::from("---\ntitle: Big research note\ntags: [bench]\n---\n# Research\n\n");
    let paragraph = "The agent wrote a long paragraph of notes about what it found, with *emphasis*, \
                     `inline code`, [links](https://example.org) and a list:\n\n- one\n- two\n\n";
    let per_gap = NOTE_BYTES / CALLS;
    for i in 0..CALLS {
        let start = s.len();
        s.push_str(&format!(
            "```json\n{{\n  \"tool_call\": {{\n    \"name\": \"search_web\",\n    \"parameters\": {{ \"query\": \"topic number {i}\", \"num_results\": 5 }}\n  }}\n}}\n```\n\n"
        ));
        while s.len() - start < per_gap {
            s.push_str(paragraph);
        }
    }
    s
}

fn search_result(call_id: &str, i: usize) -> CallResult {
    let results: Vec<Value> = (1..=5)
        .map(|n| {
            json!({
                "title": format!("topic number {i} result {n}"),
                "url": format!("https://example.org/{i}/{n}"),
                "snippet": format!("snippet {n} about topic number {i}, a sentence or two long."),
            })
        })
        .collect();
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    CallResult {
        call_id: call_id.to_string(),
        name: "search_web".to_string(),
        outcome: Ok(ToolOutput {
            data: json!({ "results": results }),
            summary: "5 results".to_string(),
            undo: None,
        }),
        started_at: t,
        ended_at: t + Duration::from_millis(412),
    }
}

fn parse_and_render(c: &mut Criterion) {
    let text = big_note();
    let parsed = parse_note(&text);
    assert_eq!(parsed.calls.len(), CALLS);
    let results: Vec<CallResult> = parsed
        .calls
        .iter()
        .enumerate()
        .map(|(i, call)| search_result(&call.call_id, i))
        .collect();
    let blocks: Vec<Block<'_>> = results.iter().map(Block::Result).collect();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let rendered = append_blocks(&text, &blocks, "done", now);

    let mut g = c.benchmark_group("note_1MiB_100_calls");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("parse", |b| b.iter(|| parse_note(black_box(&text))));
    g.bench_function("parse_with_results", |b| {
        b.iter(|| parse_note(black_box(&rendered)))
    });
    g.bench_function("render_100_results", |b| {
        b.iter(|| append_blocks(black_box(&text), black_box(&blocks), "done", now))
    });
    g.finish();
}

/// A lone search note as the load bench drops it (one call), and the one result the daemon
/// appends to it on its way to Done: the render is on every note's path.
fn lone_note(c: &mut Criterion) {
    let text = "# n-1\n```json\n{\"tool_call\": {\"name\": \"search_web\", \"parameters\": {\"query\": \"lone 1\", \"num_results\": 3}}}\n```\n".to_string();
    let parsed = parse_note(&text);
    assert_eq!(parsed.calls.len(), 1);
    let result = search_result(&parsed.calls[0].call_id, 1);
    let blocks = [Block::Result(&result)];
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut g = c.benchmark_group("lone_note_1_call");
    g.bench_function("parse", |b| b.iter(|| parse_note(black_box(&text))));
    g.bench_function("render_1_result", |b| {
        b.iter(|| append_blocks(black_box(&text), black_box(&blocks), "done", now))
    });
    g.finish();
}

fn call_id(c: &mut Criterion) {
    let call = json!({
        "name": "search_web",
        "parameters": { "query": "latest developments in AI agents", "num_results": 3 },
    });
    let canonical = canonical_json(&call);
    let mut g = c.benchmark_group("call_id");
    g.bench_function("canonical_json", |b| {
        b.iter(|| canonical_json(black_box(&call)))
    });
    g.bench_function("hash_id", |b| {
        b.iter(|| hash_id(black_box(canonical.as_bytes())))
    });
    g.bench_function("canonical_json+hash_id", |b| {
        b.iter(|| hash_id(canonical_json(black_box(&call)).as_bytes()))
    });
    g.finish();
}

fn params(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!("bench parameters are objects"),
    }
}

fn schema_validation(c: &mut Criterion) {
    let registry = Registry::from_config(
        &ToolsConfig::defaults(),
        reqwest::Client::new(),
        None,
        &vaultd::tools::mcp::McpSource::none(),
    )
    .expect("default registry");
    let valid = params(json!({ "query": "latest developments in AI agents", "num_results": 3 }));
    let invalid = params(json!({ "query": "", "num_results": 99, "nmu_results": 3 }));
    assert!(registry.resolve("search_web", &valid).is_ok());
    assert!(registry.resolve("search_web", &invalid).is_err());
    let mut g = c.benchmark_group("resolve_search_web");
    g.bench_function("valid", |b| {
        b.iter(|| registry.resolve("search_web", black_box(&valid)).is_ok())
    });
    g.bench_function("invalid_3_violations", |b| {
        b.iter(|| registry.resolve("search_web", black_box(&invalid)).is_err())
    });
    g.finish();
}

criterion_group!(
    benches,
    parse_and_render,
    lone_note,
    call_id,
    schema_validation
);
criterion_main!(benches);
