//! The vault tools end to end: the real binary runs `vault_*` calls from a note, `vaultd undo`
//! puts changes back, and a daemon killed between a vault write and its result neither
//! repeats the change nor loses its undo.

use crate::util::*;
use serde_json::json;
use std::time::Duration;

const SCOPE: &str = "[tools.vault]\nwrite = [\"Agent/**\"]\n";

fn undo(vault: &TestVault, args: &[&str]) -> (i32, String, String) {
    let out = vault
        .cmd()
        .arg("undo")
        .args(args)
        .output()
        .expect("run vaultd undo");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn agent_file(vault: &TestVault, rel: &str) -> Option<String> {
    std::fs::read_to_string(vault.root.join(rel)).ok()
}

#[test]
fn a_note_uses_four_vault_tools_and_vaultd_undo_puts_changes_back() {
    let vault = TestVault::new("http://127.0.0.1:9", SCOPE);
    std::fs::create_dir_all(vault.root.join("Projects")).unwrap();
    std::fs::write(
        vault.root.join("Projects/launch.md"),
        "# Launch\nThe budget review is on Friday.\n- [ ] send the budget\n",
    )
    .unwrap();
    let text = note_with_calls(
        "Research",
        &[
            json!({ "name": "vault_search", "id": "find", "parameters": { "query": "budget friday" } }),
            json!({ "name": "vault_read", "id": "read", "parameters": { "path": "Projects/launch.md" } }),
            json!({ "name": "vault_create", "id": "make", "parameters": { "path": "Agent/summary.md", "content": "# Summary\n" } }),
            json!({ "name": "vault_append", "id": "add", "parameters": { "path": "Agent/summary.md", "text": "- review on Friday" } }),
            json!({ "name": "vault_append", "id": "outside", "parameters": { "path": "Projects/launch.md", "text": "x" } }),
        ],
    );
    vault.drop_note("research.md", &text);
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let done = vault.read("Failed", "research.md");
    let results = results_in(&done);
    assert_eq!(results.len(), 5, "{done}");
    assert_eq!(
        results[0]["data"]["matches"][0],
        json!({ "path": "Projects/launch.md", "line": 2, "text": "The budget review is on Friday." })
    );
    assert_eq!(results[1]["data"]["path"], "Projects/launch.md");
    assert_eq!(results[2]["data"]["path"], "Agent/summary.md");
    assert_eq!(results[3]["ok"], true, "{done}");
    assert_eq!(results[4]["error"]["code"], "POLICY_DENIED");
    assert!(
        results[4]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("[tools.vault]"),
        "{}",
        results[4]
    );
    // Pre-images never reach the note.
    assert!(!done.contains("undo"), "{done}");
    assert_eq!(
        agent_file(&vault, "Agent/summary.md").unwrap(),
        "# Summary\n- review on Friday\n"
    );

    // --dry-run shows the diff and changes nothing.
    let (code, out, err) = undo(&vault, &["add", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("-- review on Friday"), "{out}");
    assert!(out.contains("dry run"), "{out}");
    assert_eq!(
        agent_file(&vault, "Agent/summary.md").unwrap(),
        "# Summary\n- review on Friday\n"
    );

    let (code, out, err) = undo(&vault, &["add"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        agent_file(&vault, "Agent/summary.md").unwrap(),
        "# Summary\n"
    );
    let undo_id = out
        .lines()
        .find_map(|l| l.strip_prefix("undo id "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no undo id in {out}"))
        .to_string();

    let (code, _, err) = undo(&vault, &["add"]);
    assert_eq!(code, 1);
    assert!(err.contains("NOTHING_TO_UNDO"), "{err}");

    // Everything the note changed, newest first: only the create is left; it goes to the trash.
    let (code, _, err) = undo(&vault, &["--note", "Failed/research.md"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(agent_file(&vault, "Agent/summary.md"), None);
    assert_eq!(
        agent_file(&vault, ".trash/Agent/summary.md").unwrap(),
        "# Summary\n"
    );

    // An undo is undoable: the append comes back once the note is back.
    let (code, out, err) = undo(&vault, &["--note", "Failed/research.md"]);
    assert_eq!(code, 1, "{out}");
    assert!(err.contains("NOTHING_TO_UNDO"), "{err}");
    let trash_undo = std::fs::read_dir(vault.root.join(".trash/Agent"))
        .unwrap()
        .count();
    assert_eq!(trash_undo, 1);
    let last = vault.journal();
    let cli_undos = last.undo_entries_for_note("vaultd undo").unwrap();
    assert_eq!(cli_undos.len(), 2, "the two CLI undos are recorded");
    let (code, _, err) = undo(&vault, &[&cli_undos[0].call_id]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        agent_file(&vault, "Agent/summary.md").unwrap(),
        "# Summary\n"
    );
    let (code, _, err) = undo(&vault, &[&undo_id]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        agent_file(&vault, "Agent/summary.md").unwrap(),
        "# Summary\n- review on Friday\n"
    );
}

#[test]
fn undo_after_a_manual_edit_refuses_with_a_diff_and_force_overrides() {
    let vault = TestVault::new("http://127.0.0.1:9", SCOPE);
    std::fs::create_dir_all(vault.root.join("Agent")).unwrap();
    std::fs::write(vault.root.join("Agent/log.md"), "one\n").unwrap();
    let text = note_with_calls(
        "Log",
        &[
            json!({ "name": "vault_append", "id": "add", "parameters": { "path": "Agent/log.md", "text": "two" } }),
        ],
    );
    vault.drop_note("log.md", &text);
    assert_eq!(vault.once().0, 0);
    std::fs::write(vault.root.join("Agent/log.md"), "one\ntwo\nby hand\n").unwrap();
    let (code, out, err) = undo(&vault, &["add"]);
    assert_eq!(code, 1);
    assert!(err.contains("CANNOT_UNDO"), "{err}");
    assert!(out.contains("-by hand"), "{out}");
    assert_eq!(
        agent_file(&vault, "Agent/log.md").unwrap(),
        "one\ntwo\nby hand\n"
    );
    let (code, _, err) = undo(&vault, &["add", "--force"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(agent_file(&vault, "Agent/log.md").unwrap(), "one\n");
}

#[test]
fn a_vault_write_whose_outcome_was_lost_is_not_repeated_and_stays_undoable() {
    // The state a kill -9 leaves between the tool's vault write and the outcome's commit:
    // the call's start and the write-ahead undo record are in the journal, nothing else.
    let vault = TestVault::new("http://127.0.0.1:9", SCOPE);
    std::fs::create_dir_all(vault.root.join("Agent")).unwrap();
    std::fs::write(vault.root.join("Agent/a.md"), "before\n").unwrap();
    let text = note_with_calls(
        "Append",
        &[
            json!({ "name": "vault_append", "id": "add-1", "parameters": { "path": "Agent/a.md", "text": "after" } }),
        ],
    );
    let note = "In_Progress/k.md";
    vault.drop_into("In_Progress", "k.md", text.as_bytes());
    let journal = std::sync::Arc::new(vault.journal());
    let run = journal.begin_run(note).unwrap();
    let params = json!({ "path": "Agent/a.md", "text": "after" });
    journal
        .call_started(
            run,
            "add-1",
            "vault_append",
            vaultd::tools::Effect::StateChange,
            &params,
        )
        .unwrap();
    let cx = vaultd::config::TableContext {
        path: std::path::Path::new("test.toml"),
        base: &vault.root,
        vault: &vault.root,
        folders: &vaultd::config::Folders::default(),
        state_dir: &vault.root.join(".state"),
        skip_secrets: false,
    };
    let config = vaultd::tools::vault::VaultToolsConfig::from_raw(
        vaultd::tools::vault::RawVault {
            write: Some(vec!["Agent/**".into()]),
            ..Default::default()
        },
        Vec::new(),
        &cx,
        &[vaultd::results::DEFAULT_FOLDER],
    )
    .unwrap();
    let mut registry = vaultd::tools::Registry::empty();
    vaultd::tools::vault::register(&config, Some(journal.clone()), &mut registry).unwrap();
    let tool = registry.get("vault_append").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(tool.tool.run(vaultd::tools::ToolCall {
        call_id: "add-1",
        note_id: "n-000000000001",
        note,
        parameters: params.as_object().unwrap(),
        deadline: std::time::Instant::now() + Duration::from_secs(10),
        answer: None,
    }))
    .unwrap();
    drop((registry, journal));
    assert_eq!(agent_file(&vault, "Agent/a.md").unwrap(), "before\nafter\n");

    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let text = vault.read("Failed", "k.md");
    let results = results_in(&text);
    assert_eq!(results.len(), 1, "{text}");
    assert_eq!(results[0]["error"]["code"], "UNKNOWN_OUTCOME", "{text}");
    assert_eq!(
        agent_file(&vault, "Agent/a.md").unwrap(),
        "before\nafter\n",
        "applied exactly once"
    );
    let (code, _, err) = undo(&vault, &["add-1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(agent_file(&vault, "Agent/a.md").unwrap(), "before\n");
}

#[test]
fn kill_nine_during_vault_writes_applies_each_change_at_most_once_and_undoably() {
    let vault = TestVault::new("http://127.0.0.1:9", &format!("workers = 1\n{SCOPE}"));
    std::fs::create_dir_all(vault.root.join("Agent")).unwrap();
    let mut rng = Rng::new(0x7A17_2026);
    const CALLS: usize = 8;
    // (applied with a result, applied with UNKNOWN_OUTCOME, not applied)
    let mut seen = (0, 0, 0);
    for round in 0..6 {
        // Appends to files that exist, and every other one a new file (`vault_create`).
        let calls: Vec<serde_json::Value> = (0..CALLS)
            .map(|i| {
                let file = format!("Agent/r{round}-{i}.md");
                if i % 2 == 1 {
                    return json!({ "name": "vault_create", "id": format!("w{round}-{i}"),
                        "parameters": { "path": file, "content": format!("line {round}-{i}\n") } });
                }
                std::fs::write(vault.root.join(&file), "base\n").unwrap();
                json!({ "name": "vault_append", "id": format!("w{round}-{i}"),
                        "parameters": { "path": file, "text": format!("line {round}-{i}") } })
            })
            .collect();
        let name = format!("k{round}.md");
        let daemon = vault.start_logged(&format!("kill-{round}.log"));
        vault.drop_note(&name, &note_with_calls("Writes", &calls));
        // A note of eight writes takes about 40 ms here: most kills land inside it.
        std::thread::sleep(Duration::from_millis(rng.below(50)));
        daemon.kill9();
        let (code, log) = vault.once();
        assert_eq!(code, 0, "{log}");
        let folder = ["Done", "Failed"]
            .into_iter()
            .find(|f| vault.exists(f, &name))
            .unwrap_or_else(|| panic!("{name} lost: {:#?}", vault.all_notes()));
        let text = vault.read(folder, &name);
        let results = results_in(&text);
        assert_eq!(results.len(), CALLS, "each call one result: {text}");
        // A write killed before its new file took its place left that file's temp file
        // (written while the undo record committed): the next start swept it.
        let left: Vec<_> = vault
            .all_files()
            .into_iter()
            .filter(|f| f.starts_with("Agent/") && f.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "temp files left: {left:?}");
        for (i, r) in results.iter().enumerate() {
            let file = format!("Agent/r{round}-{i}.md");
            let line = format!("line {round}-{i}");
            let (base, created) = if i % 2 == 1 {
                ("", true)
            } else {
                ("base\n", false)
            };
            let now = agent_file(&vault, &file).unwrap_or_default();
            assert!(
                now.matches(&line).count() <= 1,
                "{file} written twice: {now}"
            );
            let code = r["error"]["code"].as_str();
            match code {
                None => assert_eq!(now, format!("{base}{line}\n"), "{r}"),
                Some("UNKNOWN_OUTCOME") => {
                    assert!(
                        now == base || now == format!("{base}{line}\n"),
                        "{file}: {now}"
                    )
                }
                Some(other) => panic!("unexpected {other}: {r}"),
            }
            match (code, now.contains(&line)) {
                (None, _) => seen.0 += 1,
                (Some(_), true) => seen.1 += 1,
                (Some(_), false) => seen.2 += 1,
            }
            let id = r["call_id"].as_str().unwrap();
            let (undo_code, _, err) = undo(&vault, &[id]);
            if now.contains(&line) {
                assert_eq!(undo_code, 0, "{id}: {err}");
            } else {
                assert_ne!(undo_code, 0, "{id}: nothing was applied, nothing to undo");
            }
            // Undone (a new file goes to the trash), or never made.
            let back = agent_file(&vault, &file);
            assert_eq!(back.as_deref(), (!created).then_some("base\n"), "{id}");
        }
    }
    eprintln!("vault kills: {seen:?} (ok, applied but outcome lost, not applied)");
}

#[test]
fn init_lets_agents_write_under_agent_only() {
    let dir = tempfile::tempdir().unwrap();
    let vault = dir.path().join("notes");
    let run = |args: &[&str]| {
        std::process::Command::new(bin())
            .args(args)
            .env_remove("VAULTD_CONFIG")
            .env("STATE_DIRECTORY", dir.path().join("state"))
            .output()
            .unwrap()
    };
    assert!(run(&["init", vault.to_str().unwrap()]).status.success());
    let out = run(&["config", "--vault", vault.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(config["tools"]["vault"]["write"], json!(["Agent/**"]));
    assert_eq!(config["tools"]["vault"]["read"], json!(["**"]));
    assert_eq!(
        config["tools"]["vault"]["vault_delete"]["approval"],
        "always"
    );
    assert_eq!(
        config["tools"]["vault"]["vault_append"]["approval"],
        "never"
    );
}
