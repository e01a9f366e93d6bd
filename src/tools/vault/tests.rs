//! The vault tools through the real runner: a temp vault, a real SQLite journal, every tool's
//! happy path and error codes, and undo round trips.

use super::undo::{Target, undo_from_cli};
use super::{RawVault, RawVaultTool, TOOL_NAMES, VaultToolsConfig};
use crate::call::{CallResult, ErrorCode};
use crate::config::Folders;
use crate::journal::Journal;
use crate::runner::Runner;
use crate::secret::Redactor;
use crate::tools::{Admission, Registry, ToolCall};
use serde_json::{Map, Value, json};
use std::path::Path;
use std::sync::Arc;

struct Fixture {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    journal: Arc<Journal>,
    runner: Runner,
    run: i64,
}

const NOTE: &str = "In_Progress/agent.md";

fn config(root: &Path, raw: RawVault, per_tool: Vec<(&str, RawVaultTool)>) -> VaultToolsConfig {
    let cx = crate::config::table::TableContext {
        path: Path::new("test.toml"),
        base: root,
        vault: root,
        folders: &Folders::default(),
        state_dir: &root.join(".state"),
        skip_secrets: false,
    };
    VaultToolsConfig::from_raw(
        raw,
        per_tool,
        &cx,
        &[crate::results::DEFAULT_FOLDER, "Agent/Sessions"],
    )
    .unwrap()
}

fn fixture_with(raw: RawVault) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("vault").to_path_buf();
    std::fs::create_dir_all(root.join("In_Progress")).unwrap();
    std::fs::create_dir_all(root.join("Agent")).unwrap();
    let journal = Arc::new(Journal::open(&dir.path().join("state")).unwrap());
    let mut registry = Registry::empty();
    super::register(
        &config(&root, raw, Vec::new()),
        Some(journal.clone()),
        &mut registry,
    )
    .unwrap();
    let runner = Runner::new(
        Arc::new(registry),
        journal.clone(),
        Arc::new(Redactor::new([], &[])),
        4,
    );
    let run = journal.begin_run(NOTE).unwrap();
    Fixture {
        _dir: dir,
        root,
        journal,
        runner,
        run,
    }
}

fn fixture() -> Fixture {
    fixture_with(RawVault {
        write: Some(vec!["Agent/**".into()]),
        ..RawVault::default()
    })
}

impl Fixture {
    async fn call(&self, call_id: &str, name: &str, params: Value) -> CallResult {
        let params: Map<String, Value> = params.as_object().unwrap().clone();
        let call = self
            .runner
            .registry
            .valid_call(call_id, name, &params)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // Held calls (vault_delete) run here as after a person's approval.
        if name != "vault_delete" {
            assert_eq!(call.admit(), Admission::Run, "{name} would be held");
        }
        let permit = self.runner.permit().await;
        let ran = self
            .runner
            .run_call(self.run, NOTE, "n-000000000001", &call, None, permit, None)
            .await;
        if let Some(committed) = ran.committed {
            self.journal.settle(committed).unwrap();
        }
        ran.result
    }

    async fn ok(&self, call_id: &str, name: &str, params: Value) -> Value {
        let r = self.call(call_id, name, params).await;
        match r.outcome {
            Ok(out) => out.data,
            Err(e) => panic!("{name} failed: {e}"),
        }
    }

    async fn err(&self, call_id: &str, name: &str, params: Value) -> crate::call::CallError {
        let r = self.call(call_id, name, params).await;
        r.outcome.expect_err("the call should fail")
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root.join(rel)).unwrap()
    }

    fn exists(&self, rel: &str) -> bool {
        self.root.join(rel).exists()
    }

    fn cli_undo(
        &self,
        call_id: &str,
        force: bool,
    ) -> Result<super::undo::CliUndo, crate::call::CallError> {
        undo_from_cli(
            &self.journal,
            &self.root,
            &Target::Call {
                call_id: call_id.into(),
                note_key: None,
            },
            force,
            false,
        )
    }
}

#[tokio::test]
async fn read_list_search_and_tasks_see_only_what_the_policy_allows() {
    let f = fixture();
    f.write(
        "Projects/plan.md",
        "---\ntags: [work]\nstatus: draft\n---\n# Plan\nBudget for the Q3 launch\n1. [ ] call Anna\n   - [x] book room\n",
    );
    f.write("Projects/other.md", "budget only\n");
    f.write("Done/finished.md", "Budget launch in a state folder\n");
    f.write(".obsidian/x.md", "Budget launch hidden\n");
    f.write("Projects/data.txt", "Budget launch not a note\n");

    let read = f
        .ok("r1", "vault_read", json!({ "path": "Projects/plan.md" }))
        .await;
    assert_eq!(read["properties"]["status"], "draft");
    assert_eq!(read["properties"]["tags"], json!(["work"]));
    assert!(read["content"].as_str().unwrap().starts_with("# Plan"));
    assert_eq!(
        read["sha256"],
        super::sha256_hex(f.read("Projects/plan.md").as_bytes())
    );

    let list = f.ok("l1", "vault_list", json!({})).await;
    let paths: Vec<&str> = list["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["Projects/other.md", "Projects/plan.md"]);

    let found = f
        .ok("s1", "vault_search", json!({ "query": "BUDGET launch" }))
        .await;
    assert_eq!(
        found["matches"],
        json!([{ "path": "Projects/plan.md", "line": 6, "text": "Budget for the Q3 launch" }])
    );
    let tagged = f
        .ok(
            "s2",
            "vault_search",
            json!({ "query": "budget", "tag": "work" }),
        )
        .await;
    assert_eq!(tagged["matches"].as_array().unwrap().len(), 1);
    let limited = f
        .ok(
            "s3",
            "vault_search",
            json!({ "query": "budget", "limit": 1 }),
        )
        .await;
    assert_eq!(limited["truncated"], true);

    let tasks = f.ok("t1", "vault_tasks", json!({ "done": false })).await;
    assert_eq!(
        tasks["tasks"],
        json!([{ "path": "Projects/plan.md", "line": 7, "text": "call Anna", "done": false }])
    );

    assert_eq!(
        f.err("r2", "vault_read", json!({ "path": "Projects/missing.md" }))
            .await
            .code,
        ErrorCode::NotFound
    );
    for bad in [
        "Done/finished.md",
        ".obsidian/x.md",
        "../x.md",
        "Projects/data.txt",
    ] {
        assert_eq!(
            f.err("r3", "vault_read", json!({ "path": bad })).await.code,
            ErrorCode::PolicyDenied,
            "{bad}"
        );
    }
    assert_eq!(
        f.err("l2", "vault_list", json!({ "folder": "Done" }))
            .await
            .code,
        ErrorCode::PolicyDenied
    );
}

#[tokio::test]
async fn writes_are_denied_by_default_naming_the_key() {
    let f = fixture_with(RawVault::default());
    let e = f
        .err(
            "c1",
            "vault_create",
            json!({ "path": "Agent/a.md", "content": "x" }),
        )
        .await;
    assert_eq!(e.code, ErrorCode::PolicyDenied);
    assert!(
        e.message.contains("`write` in [tools.vault]"),
        "{}",
        e.message
    );
    assert!(!f.exists("Agent/a.md"));
}

#[tokio::test]
async fn create_append_properties_and_tasks_with_their_conflicts() {
    let f = fixture();
    let created = f
        .ok(
            "c1",
            "vault_create",
            json!({ "path": "Agent/new/log.md", "content": "# Log\n- [ ] first\n", "properties": { "topic": "ai" } }),
        )
        .await;
    assert_eq!(created["path"], "Agent/new/log.md");
    assert_eq!(
        f.read("Agent/new/log.md"),
        "---\ntopic: ai\n---\n# Log\n- [ ] first\n"
    );
    let e = f
        .err(
            "c2",
            "vault_create",
            json!({ "path": "Agent/new/log.md", "content": "y" }),
        )
        .await;
    assert_eq!(e.code, ErrorCode::Conflict);
    let e = f
        .err(
            "c3",
            "vault_create",
            json!({ "path": "Agent/new/LOG.md", "content": "y" }),
        )
        .await;
    assert_eq!(e.code, ErrorCode::Conflict, "{}", e.message);
    let e = f
        .err(
            "c4",
            "vault_create",
            json!({ "path": "Agent/x.md", "content": "", "properties": { "tool_status": "done" } }),
        )
        .await;
    assert_eq!(e.code, ErrorCode::PolicyDenied);
    // vaultd's own properties however written: `tool_note ` is written `tool_note : …`, which
    // YAML reads as `tool_note`; a name that would not read back as itself is refused.
    for (id, name) in [("c5", "tool_note "), ("c6", "\"tool_note\""), ("c7", "a:b")] {
        let e = f
            .err(
                id,
                "vault_create",
                json!({ "path": "Agent/x.md", "content": "", "properties": { name: "n-1" } }),
            )
            .await;
        assert_eq!(e.code, ErrorCode::InvalidParams, "{name}: {}", e.message);
    }

    let sha = created["sha256"].as_str().unwrap().to_string();
    let appended = f
        .ok(
            "a1",
            "vault_append",
            json!({ "path": "Agent/new/log.md", "text": "- [ ] second", "heading": "Log", "if_sha256": sha }),
        )
        .await;
    assert_eq!(
        f.read("Agent/new/log.md"),
        "---\ntopic: ai\n---\n# Log\n- [ ] first\n- [ ] second\n"
    );
    let e = f
        .err(
            "a2",
            "vault_append",
            json!({ "path": "Agent/new/log.md", "text": "late", "if_sha256": sha }),
        )
        .await;
    assert_eq!(e.code, ErrorCode::Conflict);
    assert_eq!(e.details.unwrap()["sha256"], appended["sha256"]);
    assert_eq!(
        f.err(
            "a3",
            "vault_append",
            json!({ "path": "Agent/none.md", "text": "x" })
        )
        .await
        .code,
        ErrorCode::NotFound
    );

    f.ok(
        "p1",
        "vault_set_properties",
        json!({ "path": "Agent/new/log.md", "properties": { "topic": null, "status": "open" } }),
    )
    .await;
    assert_eq!(
        f.read("Agent/new/log.md"),
        "---\nstatus: open\n---\n# Log\n- [ ] first\n- [ ] second\n"
    );

    f.ok(
        "k1",
        "vault_complete_task",
        json!({ "path": "Agent/new/log.md", "line": 6, "text": "second" }),
    )
    .await;
    assert!(
        f.read("Agent/new/log.md")
            .ends_with("- [ ] first\n- [x] second\n")
    );
    let e = f
        .err(
            "k2",
            "vault_complete_task",
            json!({ "path": "Agent/new/log.md", "line": 5, "text": "second" }),
        )
        .await;
    assert_eq!(e.code, ErrorCode::Conflict);
}

#[tokio::test]
async fn property_edits_keep_every_other_byte() {
    let f = fixture();
    let odd = "\u{feff}---\r\ntitle:   \"Odd: yes\"   \r\n# a comment\r\nlist:\r\n- a\r\n-   b\r\nmap: {x: 1}\r\n---\r\nBody\twith tabs  \r\nlast line";
    f.write("Agent/odd.md", odd);
    f.ok(
        "p1",
        "vault_set_properties",
        json!({ "path": "Agent/odd.md", "properties": { "reviewed": true } }),
    )
    .await;
    let after = f.read("Agent/odd.md");
    assert_eq!(
        after,
        odd.replace("map: {x: 1}\r\n---", "map: {x: 1}\r\nreviewed: true\r\n---")
    );
}

#[tokio::test]
async fn undo_round_trips_and_an_undo_is_undoable() {
    let f = fixture();
    f.write("Agent/a.md", "start\n");
    f.ok(
        "a1",
        "vault_append",
        json!({ "path": "Agent/a.md", "text": "more" }),
    )
    .await;
    assert_eq!(f.read("Agent/a.md"), "start\nmore\n");

    let undone = f.ok("u1", "vault_undo", json!({ "call_id": "a1" })).await;
    assert_eq!(undone["restored"], json!(["Agent/a.md"]));
    assert_eq!(f.read("Agent/a.md"), "start\n");

    let e = f.err("u2", "vault_undo", json!({ "call_id": "a1" })).await;
    assert_eq!(e.code, ErrorCode::NothingToUndo, "{}", e.message);

    // Undo the undo: the append is back.
    f.ok("u3", "vault_undo", json!({ "call_id": "u1" })).await;
    assert_eq!(f.read("Agent/a.md"), "start\nmore\n");
    assert_eq!(
        f.err("u4", "vault_undo", json!({ "call_id": "nobody" }))
            .await
            .code,
        ErrorCode::NotFound
    );
}

#[tokio::test]
async fn a_manual_edit_makes_undo_refuse_with_a_diff_unless_forced() {
    let f = fixture();
    f.write("Agent/a.md", "one\n");
    f.ok(
        "a1",
        "vault_append",
        json!({ "path": "Agent/a.md", "text": "two" }),
    )
    .await;
    f.write("Agent/a.md", "one\ntwo\nthree by hand\n");
    let e = f.err("u1", "vault_undo", json!({ "call_id": "a1" })).await;
    assert_eq!(e.code, ErrorCode::CannotUndo);
    let diff = e.details.unwrap()["diff"].as_str().unwrap().to_string();
    assert!(diff.contains("-three by hand"), "{diff}");
    assert!(diff.contains("--- a/Agent/a.md"), "{diff}");
    assert_eq!(f.read("Agent/a.md"), "one\ntwo\nthree by hand\n");

    let e = f.cli_undo("a1", false).unwrap_err();
    assert_eq!(e.code, ErrorCode::CannotUndo);
    let done = f.cli_undo("a1", true).unwrap();
    assert_eq!(f.read("Agent/a.md"), "one\n");
    // The forced undo is recorded too: undoing it brings the hand edit back.
    f.cli_undo(done.call_id.as_deref().unwrap(), false).unwrap();
    assert_eq!(f.read("Agent/a.md"), "one\ntwo\nthree by hand\n");
}

#[tokio::test]
async fn undo_of_create_trashes_of_move_moves_back_of_delete_restores() {
    let f = fixture();
    f.ok(
        "c1",
        "vault_create",
        json!({ "path": "Agent/n.md", "content": "new\n" }),
    )
    .await;
    f.ok("u1", "vault_undo", json!({ "call_id": "c1" })).await;
    assert!(!f.exists("Agent/n.md"));
    assert_eq!(f.read(".trash/Agent/n.md"), "new\n");

    f.write("Agent/m.md", "moving\n");
    let moved = f
        .ok(
            "m1",
            "vault_move",
            json!({ "from": "Agent/m.md", "to": "Agent/sub/m2.md" }),
        )
        .await;
    assert_eq!(moved["path"], "Agent/sub/m2.md");
    assert!(!f.exists("Agent/m.md"));
    f.write("Agent/taken.md", "x");
    assert_eq!(
        f.err(
            "m2",
            "vault_move",
            json!({ "from": "Agent/sub/m2.md", "to": "Agent/taken.md" })
        )
        .await
        .code,
        ErrorCode::Conflict
    );
    assert_eq!(
        f.err(
            "m3",
            "vault_move",
            json!({ "from": "Agent/gone.md", "to": "Agent/q.md" })
        )
        .await
        .code,
        ErrorCode::NotFound
    );
    assert_eq!(
        f.err(
            "m4",
            "vault_move",
            json!({ "from": "Agent/taken.md", "to": "Approved/x.md" })
        )
        .await
        .code,
        ErrorCode::PolicyDenied
    );
    f.ok("u2", "vault_undo", json!({ "call_id": "m1" })).await;
    assert_eq!(f.read("Agent/m.md"), "moving\n");
    assert!(!f.exists("Agent/sub/m2.md"));
    assert!(
        !f.exists(".trash/Agent/sub/m2.md"),
        "moved back, not copied"
    );

    f.write("Agent/d.md", "delete me\n");
    let deleted = f
        .ok("d1", "vault_delete", json!({ "path": "Agent/d.md" }))
        .await;
    assert_eq!(deleted["trashed"], ".trash/Agent/d.md");
    assert!(!f.exists("Agent/d.md"));
    assert_eq!(
        f.err("d2", "vault_delete", json!({ "path": "Agent/d.md" }))
            .await
            .code,
        ErrorCode::NotFound
    );
    f.ok("u3", "vault_undo", json!({ "call_id": "d1" })).await;
    assert_eq!(f.read("Agent/d.md"), "delete me\n");
    assert!(!f.exists(".trash/Agent/d.md"), "restored from the trash");
}

#[tokio::test]
async fn delete_is_held_by_default_and_tools_can_be_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let mut registry = Registry::empty();
    super::register(
        &config(
            dir.path(),
            RawVault::default(),
            vec![(
                "vault_read",
                RawVaultTool {
                    enabled: Some(false),
                    ..RawVaultTool::default()
                },
            )],
        ),
        None,
        &mut registry,
    )
    .unwrap();
    let params = json!({ "path": "Agent/x.md" }).as_object().unwrap().clone();
    let delete = registry.resolve("vault_delete", &params).unwrap();
    assert!(matches!(delete.admit(&params), Admission::Hold { .. }));
    let e = registry.resolve("vault_read", &params).err().unwrap();
    assert_eq!(e.code, ErrorCode::PolicyDenied);
    assert_eq!(registry.tools().count(), TOOL_NAMES.len());

    let mut off = Registry::empty();
    super::register(
        &config(
            dir.path(),
            RawVault {
                enabled: Some(false),
                ..RawVault::default()
            },
            TOOL_NAMES
                .iter()
                .map(|n| (*n, RawVaultTool::default()))
                .collect(),
        ),
        None,
        &mut off,
    )
    .unwrap();
    assert!(off.tools().all(|t| !t.policy.enabled));
}

#[tokio::test]
async fn a_write_whose_outcome_was_never_recorded_is_still_undoable() {
    // A kill between the vault write and the outcome's commit: the write-ahead record is
    // all the journal has. Run the tool directly, as the runner would, and record nothing.
    let f = fixture();
    f.write("Agent/a.md", "before\n");
    let params = json!({ "path": "Agent/a.md", "text": "after" });
    spawn_tool(&f, "k1", "vault_append", params)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(f.read("Agent/a.md"), "before\nafter\n");
    let entries = f.journal.undo_entries_for_call("k1").unwrap();
    assert_eq!(entries.len(), 1);
    assert!(!entries[0].confirmed);
    f.cli_undo("k1", false).unwrap();
    assert_eq!(f.read("Agent/a.md"), "before\n");
}

#[tokio::test]
async fn old_undo_data_is_pruned() {
    let f = fixture();
    f.write("Agent/a.md", "x\n");
    f.ok(
        "a1",
        "vault_append",
        json!({ "path": "Agent/a.md", "text": "y" }),
    )
    .await;
    assert_eq!(
        f.journal
            .prune_undo(std::time::SystemTime::now() - std::time::Duration::from_secs(60))
            .unwrap(),
        0
    );
    assert_eq!(
        f.journal
            .prune_undo(std::time::SystemTime::now() + std::time::Duration::from_secs(1))
            .unwrap(),
        1
    );
    assert_eq!(
        f.err("u1", "vault_undo", json!({ "call_id": "a1" }))
            .await
            .code,
        ErrorCode::NotFound
    );
}

#[tokio::test]
async fn undo_of_a_whole_note_plans_each_change_on_the_state_the_newer_ones_leave() {
    let f = fixture();
    f.write("Agent/a.md", "0\n");
    f.ok(
        "a1",
        "vault_append",
        json!({ "path": "Agent/a.md", "text": "1" }),
    )
    .await;
    f.ok(
        "a2",
        "vault_append",
        json!({ "path": "Agent/a.md", "text": "2" }),
    )
    .await;
    f.ok(
        "m1",
        "vault_move",
        json!({ "from": "Agent/a.md", "to": "Agent/b.md" }),
    )
    .await;
    f.ok(
        "c1",
        "vault_create",
        json!({ "path": "Agent/a.md", "content": "new\n" }),
    )
    .await;
    let target = Target::Note {
        note_id: None,
        note_key: "agent.md".into(),
        missing: None,
    };
    let dry = undo_from_cli(&f.journal, &f.root, &target, false, true).unwrap();
    assert!(dry.call_id.is_none());
    assert!(
        dry.diff.contains("rename Agent/b.md -> Agent/a.md"),
        "{}",
        dry.diff
    );
    assert_eq!(
        f.read("Agent/b.md"),
        "0\n1\n2\n",
        "a dry run changes nothing"
    );
    let done = undo_from_cli(&f.journal, &f.root, &target, false, false).unwrap();
    assert_eq!(f.read("Agent/a.md"), "0\n");
    assert!(!f.exists("Agent/b.md"));
    assert_eq!(f.read(".trash/Agent/a.md"), "new\n");
    assert_eq!(
        undo_from_cli(&f.journal, &f.root, &target, false, false)
            .unwrap_err()
            .code,
        ErrorCode::NothingToUndo
    );
    // Undoing that undo replays all four changes.
    f.cli_undo(done.call_id.as_deref().unwrap(), false).unwrap();
    assert_eq!(f.read("Agent/a.md"), "new\n");
    assert_eq!(f.read("Agent/b.md"), "0\n1\n2\n");
}

/// Keywords that draft 7 does not know (it ignores them) or reads differently.
fn later_draft_keywords(schema: &Value, at: &str, found: &mut Vec<String>) {
    const LATER: &[&str] = &[
        "prefixItems",
        "unevaluatedProperties",
        "unevaluatedItems",
        "dependentRequired",
        "dependentSchemas",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
        "$anchor",
        "minContains",
        "maxContains",
    ];
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                if LATER.contains(&key.as_str()) || (key == "items" && value.is_array()) {
                    found.push(format!("{at}/{key}"));
                }
                if key == "properties" || key == "$defs" || key == "definitions" {
                    // Names, not keywords: each value is a schema.
                    for (name, sub) in value.as_object().into_iter().flatten() {
                        later_draft_keywords(sub, &format!("{at}/{key}/{name}"), found);
                    }
                } else if key != "enum" && key != "const" && key != "examples" {
                    later_draft_keywords(value, &format!("{at}/{key}"), found);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                later_draft_keywords(item, &format!("{at}/{i}"), found);
            }
        }
        _ => {}
    }
}

/// The registry checks vaultd's own schemas as draft-07 documents (`Registry::add`): none may
/// use a keyword that only later drafts give a meaning to.
#[test]
fn vaultds_own_schemas_mean_the_same_in_draft_7() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("vault");
    std::fs::create_dir_all(&root).unwrap();
    let builtin = Registry::from_config(
        &crate::config::ToolsConfig::defaults(),
        reqwest::Client::new(),
        None,
        &crate::tools::mcp::McpSource::none(),
    )
    .unwrap();
    let mut vault = Registry::empty();
    let raw = RawVault {
        write: Some(vec!["Agent/**".into()]),
        ..RawVault::default()
    };
    super::register(&config(&root, raw, Vec::new()), None, &mut vault).unwrap();
    let mut checked = 0;
    for tool in builtin.tools().chain(vault.tools()) {
        let spec = tool.spec();
        assert!(matches!(
            spec.source,
            crate::tools::Source::Builtin | crate::tools::Source::Vault
        ));
        let mut found = Vec::new();
        later_draft_keywords(&spec.schema, "", &mut found);
        assert!(found.is_empty(), "{}: {found:?}", spec.name);
        checked += 1;
    }
    assert!(checked > TOOL_NAMES.len(), "{checked} tools checked");
    // The check itself finds what it looks for.
    let mut found = Vec::new();
    later_draft_keywords(
        &json!({"properties": {"items": {"prefixItems": []}}, "items": [{}]}),
        "",
        &mut found,
    );
    assert_eq!(found, ["/items", "/properties/items/prefixItems"]);
}

/// A state change's outcome is queued by the runner, not waited for: the write back's settle
/// before the note's move is what waits for its fsync (`Journal::call_finished_later`).
#[tokio::test]
async fn a_state_change_outcome_is_left_for_the_write_back_to_settle() {
    let f = fixture();
    f.journal.adopt_run(f.run, "n-000000000001").unwrap();
    let params = json!({ "path": "Agent/queued.md", "content": "x" });
    let call = f
        .runner
        .registry
        .valid_call("c1", "vault_create", params.as_object().unwrap())
        .unwrap();
    let permit = f.runner.permit().await;
    let ran = f
        .runner
        .run_call(f.run, NOTE, "n-000000000001", &call, None, permit, None)
        .await;
    assert!(ran.result.outcome.is_ok(), "{:?}", ran.result.outcome);
    let committed = ran.committed.expect("the outcome is queued for the settle");
    f.journal.settle(committed).unwrap();
    let calls = f.journal.note_calls("n-000000000001").unwrap();
    let c1 = calls.iter().find(|c| c.call_id == "c1").expect("recorded");
    assert!(
        c1.recorded.is_some(),
        "its outcome is in the journal once settled"
    );
}

/// The hidden temp files of note writes (`.{name}.vaultd-{pid}-{n}.tmp`) in `dir`.
fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && n.ends_with(".tmp"))
        .collect()
}

/// Runs the vault tool `name` directly (no start record: only its own journal write) on a
/// task of its own.
fn spawn_tool(
    f: &Fixture,
    call_id: &'static str,
    name: &'static str,
    params: Value,
) -> tokio::task::JoinHandle<Result<crate::call::ToolOutput, crate::call::CallError>> {
    let registry = f.runner.registry.clone();
    tokio::spawn(async move {
        let params = params.as_object().unwrap().clone();
        let tool = registry.get(name).unwrap();
        tool.tool
            .run(ToolCall {
                call_id,
                note: NOTE,
                note_id: "n-000000000001",
                parameters: &params,
                deadline: std::time::Instant::now() + std::time::Duration::from_secs(30),
                answer: None,
            })
            .await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vault_write_is_made_ready_while_its_undo_record_commits_and_lands_only_after() {
    // The write-ahead record's commit and the new file's write and fsync overlap; the file
    // takes its place only once the record is durable. A held writer keeps the record from
    // committing: the temp file appears meanwhile, the vault does not change.
    let f = fixture();
    f.write("Agent/log.md", "# Log\n");
    let agent = f.root.join("Agent");
    for (call_id, name, params, target) in [
        (
            "w1",
            "vault_append",
            json!({ "path": "Agent/log.md", "text": "- one" }),
            "Agent/log.md",
        ),
        (
            "w2",
            "vault_create",
            json!({ "path": "Agent/new.md", "content": "# New\n" }),
            "Agent/new.md",
        ),
    ] {
        let before = std::fs::read_to_string(f.root.join(target)).ok();
        let (release, holder) = f.journal.hold_writer();
        let call = spawn_tool(&f, call_id, name, params);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while temp_files(&agent).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: no temp file was written while its undo record waited to commit"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(
            std::fs::read_to_string(f.root.join(target)).ok(),
            before,
            "{name} changed the vault before its undo record was durable"
        );
        assert!(!call.is_finished());
        release.send(()).unwrap();
        tokio::task::spawn_blocking(move || holder.join().unwrap())
            .await
            .unwrap();
        call.await.unwrap().unwrap();
        assert_ne!(std::fs::read_to_string(f.root.join(target)).ok(), before);
        assert_eq!(f.journal.undo_entries_for_call(call_id).unwrap().len(), 1);
        assert!(temp_files(&agent).is_empty());
    }
    assert_eq!(f.read("Agent/log.md"), "# Log\n- one\n");
    assert_eq!(f.read("Agent/new.md"), "# New\n");
}

#[tokio::test]
async fn a_vault_write_whose_undo_record_cannot_commit_changes_nothing() {
    let f = fixture();
    f.write("Agent/log.md", "# Log\n");
    let agent = f.root.join("Agent");
    for (call_id, name, params) in [
        (
            "f1",
            "vault_append",
            json!({ "path": "Agent/log.md", "text": "- one" }),
        ),
        (
            "f2",
            "vault_create",
            json!({ "path": "Agent/new.md", "content": "# New\n" }),
        ),
        (
            "f3",
            "vault_create",
            json!({ "path": "Agent/made/for/it.md", "content": "# New\n" }),
        ),
    ] {
        // The tool's one journal write is the next one sent: its group's commit fails.
        f.journal.fail_commit_of_write(f.journal.writes_sent() + 1);
        let e = spawn_tool(&f, call_id, name, params)
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            e.message.contains("could not record the undo data"),
            "{name}: {e:?}"
        );
        assert!(temp_files(&agent).is_empty(), "{name} left its temp file");
        assert!(f.journal.undo_entries_for_call(call_id).unwrap().is_empty());
    }
    assert_eq!(f.read("Agent/log.md"), "# Log\n");
    assert!(!f.exists("Agent/new.md"));
    // Not even the folders a new note would have needed.
    assert!(!f.exists("Agent/made"));
}

#[test]
fn write_roots_are_each_globs_leading_folders_inside_the_vault() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap().join("vault");
    for d in ["Agent/sub", "Projects", "Shared"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::create_dir_all(dir.path().join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("Link")).unwrap();
    let roots = |write: &[&str]| {
        config(
            &root,
            RawVault {
                write: Some(write.iter().map(|g| g.to_string()).collect()),
                ..RawVault::default()
            },
            Vec::new(),
        )
        .write_roots()
    };
    assert_eq!(roots(&["Agent/**"]), [root.join("Agent")]);
    assert_eq!(
        roots(&["Projects/*/log.md", "Agent/inbox.md", "Agent/sub/**"]),
        [root.join("Projects"), root.join("Agent")]
    );
    assert_eq!(roots(&["**/*.md", "Agent/**"]), vec![root.clone()]);
    assert_eq!(
        roots(&["./Agent/", "/Projects/**"]),
        [root.join("Agent"), root.join("Projects")]
    );
    assert!(roots(&[]).is_empty());
    // Never outside the vault: not above it, not through a symlink, not a folder that is missing.
    assert!(roots(&["../**", "Shared/../../x/**", "Link/**", "Missing/**"]).is_empty());
}
