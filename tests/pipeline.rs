//! End-to-end tests of the loop: the real `vaultd` binary on temp vaults, against a SearXNG-format
//! server and a real SMTP server on 127.0.0.1.

use crate::util::searx::{Answer, SearxServer};
use crate::util::*;
use serde_json::json;
use std::time::Duration;

async fn searx() -> SearxServer {
    SearxServer::start(Duration::ZERO).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_search_call_ends_in_done_with_its_result() {
    let server = searx().await;
    let vault = TestVault::new(&server.base_url(), "");
    let daemon = vault.start();
    let original = note_with_calls("Research", &[search_call("rust agents")]);
    vault.drop_note("a.md", &original);
    let text = vault.wait_until_in("Done", "a.md");
    // A graceful stop: the first name a claim keeps for `moved_in_grace` is gone too.
    assert!(daemon.terminate().success());

    assert!(!vault.exists("Needs_Action", "a.md"));
    assert!(vault.notes_in("In_Progress").is_empty());
    // The original is kept byte for byte after the new frontmatter.
    let body = text.split_once("\n---\n").unwrap().1;
    assert!(
        body.starts_with(&original),
        "original text changed:\n{text}"
    );
    assert!(
        text.contains("> [!success]- search_web · 3 results · "),
        "{text}"
    );
    let results = results_in(&text);
    assert_eq!(results.len(), 1);
    let r = &results[0];
    assert_eq!(r["name"], "search_web");
    assert_eq!(r["ok"], true);
    assert!(r["call_id"].as_str().unwrap().starts_with("c-"));
    assert_eq!(r["data"]["results"][0]["title"], "rust agents result 1");
    assert_eq!(r["data"]["results"][0]["url"], "https://example.org/1");
    assert_eq!(
        r["data"]["results"][0]["snippet"],
        "snippet 1 about rust agents"
    );
    assert!(r["meta"]["duration_ms"].is_u64());
    assert!(r["meta"]["started_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(property(&text, "tool_status").as_deref(), Some("done"));
    assert_eq!(property(&text, "tool_calls").as_deref(), Some("1"));
    assert_eq!(property(&text, "tool_errors").as_deref(), Some("0"));
    assert!(property(&text, "tool_updated").unwrap().ends_with('Z'));
    assert_eq!(server.queries(), vec!["rust agents"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_calls_give_two_results_in_call_order() {
    let server = searx().await;
    server.set_delay(Duration::from_millis(50));
    let vault = TestVault::new(&server.base_url(), "");
    vault.drop_note(
        "two.md",
        &note_with_calls("Two", &[search_call("first"), search_call("second")]),
    );
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let text = vault.read("Done", "two.md");
    let results = results_in(&text);
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["data"]["results"][0]["title"], "first result 1");
    assert_eq!(results[1]["data"]["results"][0]["title"], "second result 1");
    assert_eq!(property(&text, "tool_calls").as_deref(), Some("2"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_note_moved_back_with_a_new_call_runs_only_that_call() {
    let server = searx().await;
    let vault = TestVault::new(&server.base_url(), "");
    let daemon = vault.start();
    vault.drop_note(
        "loop.md",
        &note_with_calls("Loop", &[search_call("round one")]),
    );
    let text = vault.wait_until_in("Done", "loop.md");
    assert_eq!(server.requests(), 1);

    // The agent appends its next call and moves the note back.
    let next = format!(
        "{text}\n```json\n{}\n```\n",
        json!({ "tool_call": search_call("round two") })
    );
    std::fs::write(vault.path("Done", "loop.md"), &next).unwrap();
    vault.move_note("Done", "Needs_Action", "loop.md");
    let start = std::time::Instant::now();
    let text = loop {
        let t = vault.wait_until_in("Done", "loop.md");
        if results_in(&t).len() == 2 {
            break t;
        }
        assert!(start.elapsed() < DEADLINE, "second round never finished");
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(daemon);
    assert_eq!(server.requests(), 2, "exactly one more request");
    assert_eq!(server.queries(), vec!["round one", "round two"]);
    assert!(
        text.starts_with(&next[..next.find("tool_status").unwrap()]) || text.contains("round two")
    );
    assert_eq!(property(&text, "tool_calls").as_deref(), Some("2"));
    assert_eq!(
        text.matches("tool_status:").count(),
        1,
        "one frontmatter property each"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn identical_calls_get_numbered_ids() {
    let server = searx().await;
    let vault = TestVault::new(&server.base_url(), "");
    vault.drop_note(
        "dup.md",
        &note_with_calls("Dup", &[search_call("same"), search_call("same")]),
    );
    assert_eq!(vault.once().0, 0);
    let results = results_in(&vault.read("Done", "dup.md"));
    let a = results[0]["call_id"].as_str().unwrap();
    let b = results[1]["call_id"].as_str().unwrap();
    assert_eq!(b, format!("{a}-2"));
}

#[tokio::test(flavor = "multi_thread")]
async fn notes_without_pending_calls_are_left_untouched() {
    let server = searx().await;
    let vault = TestVault::new(&server.base_url(), "");
    let quoted = format!(
        "# Quoted\n\n> An example call, quoted:\n> ```json\n> {}\n> ```\n",
        json!({ "tool_call": search_call("quoted") })
    );
    let plain = "# Plain\r\n\r\nNo calls here.";
    vault.drop_note("quoted.md", &quoted);
    vault.drop_note("plain.md", plain);
    let daemon = vault.start();
    // A note dropped after the start-up scan, which is processed, proves the daemon looked.
    vault.drop_note("marker.md", &note_with_calls("M", &[search_call("marker")]));
    vault.wait_until_in("Done", "marker.md");
    drop(daemon);
    assert_eq!(vault.once().0, 0);
    assert_eq!(vault.read("Needs_Action", "quoted.md"), quoted);
    assert_eq!(vault.read("Needs_Action", "plain.md"), plain);
    assert_eq!(server.queries(), vec!["marker"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn subfolders_are_kept_and_name_collisions_numbered() {
    let server = searx().await;
    let vault = TestVault::new(&server.base_url(), "");
    vault.drop_into("Done", "work/a.md", b"an older note of the same name");
    vault.drop_note("work/a.md", &note_with_calls("A", &[search_call("sub")]));
    assert_eq!(vault.once().0, 0);
    assert_eq!(
        vault.read("Done", "work/a.md"),
        "an older note of the same name"
    );
    let text = vault.read("Done", "work/a (2).md");
    assert_eq!(results_in(&text).len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn once_processes_a_backlog_and_exits_zero() {
    let server = searx().await;
    let vault = TestVault::new(&server.base_url(), "");
    for i in 0..25 {
        vault.drop_note(
            &format!("n{i:02}.md"),
            &note_with_calls("N", &[search_call(&format!("q{i}"))]),
        );
    }
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    assert_eq!(vault.notes_in("Done").len(), 25);
    assert!(vault.notes_in("Needs_Action").is_empty());
    assert_eq!(server.requests(), 25);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_cap_holds_across_notes() {
    let server = SearxServer::start(Duration::from_millis(300)).await;
    let vault = TestVault::new(&server.base_url(), "");
    for i in 0..40 {
        vault.drop_note(
            &format!("cap{i:02}.md"),
            &note_with_calls("Cap", &[search_call(&format!("q{i}"))]),
        );
    }
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    assert_eq!(server.requests(), 40);
    assert_eq!(
        server.max_in_flight(),
        10,
        "the cap of 10 workers, and all 10 used"
    );
    assert_eq!(vault.notes_in("Done").len(), 40);
}

/// Runs one note through `once` and returns its single result from Failed/.
fn failed_result(vault: &TestVault, name: &str, text: &str) -> serde_json::Value {
    vault.drop_note(name, text);
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let note = vault.read("Failed", name);
    assert_eq!(property(&note, "tool_status").as_deref(), Some("failed"));
    let results = results_in(&note);
    assert!(!results.is_empty(), "no result in {note}");
    let r = results.last().unwrap().clone();
    assert_eq!(r["ok"], false);
    // A block that never became a call is titled "broken call" (§3), not with the name of
    // a tool it never called.
    let shown_name = match r["name"].as_str().unwrap() {
        "tool_call" => "broken call",
        name => name,
    };
    assert!(
        note.contains(&format!(
            "> [!failure]- {} · {}",
            shown_name,
            r["error"]["code"].as_str().unwrap()
        )),
        "{note}"
    );
    assert!(r["error"]["message"].as_str().unwrap().len() > 10);
    r
}

#[tokio::test(flavor = "multi_thread")]
async fn broken_json_is_invalid_json_with_line_and_column() {
    let server = searx().await;
    let vault = TestVault::new(&server.base_url(), "");
    let text = "# Broken\n\n```json\n{\"tool_call\": {\"name\": \"search_web\",}}\n```\n";
    let r = failed_result(&vault, "broken.md", text);
    assert_eq!(r["error"]["code"], "INVALID_JSON");
    assert_eq!(r["error"]["retryable"], false);
    // §8.3: the line counted in the note as written, vaultd's frontmatter included: the
    // broken call's line in the final note.
    let note = vault.read("Failed", "broken.md");
    let broken_line = note
        .lines()
        .position(|l| l.starts_with("{\"tool_call\": {\"name\": \"search_web\",}}"))
        .unwrap()
        + 1;
    assert!(broken_line > 4, "frontmatter added above");
    assert_eq!(r["error"]["details"]["line"], broken_line);
    assert!(r["error"]["details"]["column"].as_u64().unwrap() > 1);
    assert!(note.ends_with("```\n"));
    assert!(note.contains(text), "original kept");
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_calls_unknown_tools_and_bad_params_are_reported() {
    let server = searx().await;
    let vault = TestVault::new(&server.base_url(), "");
    let r = failed_result(
        &vault,
        "nocall.md",
        "```json\n{\"tool_call\": {\"parameters\": {}}}\n```\n",
    );
    assert_eq!(r["error"]["code"], "INVALID_CALL");
    let r = failed_result(
        &vault,
        "unclosed.md",
        "text\n\n```json\n{\"tool_call\": {\"name\": \"search_web\", \"parameters\": {\"query\": \"x\"}}}\n",
    );
    assert_eq!(r["error"]["code"], "INVALID_CALL");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not closed")
    );
    let r = failed_result(
        &vault,
        "unknown.md",
        &note_with_calls(
            "U",
            &[json!({ "name": "launch_rockets", "parameters": {} })],
        ),
    );
    assert_eq!(r["error"]["code"], "UNKNOWN_TOOL");
    let r = failed_result(
        &vault,
        "params.md",
        &note_with_calls(
            "P",
            &[
                json!({ "name": "search_web", "parameters": { "query": "", "num_results": 99, "qury": 1 } }),
            ],
        ),
    );
    assert_eq!(r["error"]["code"], "INVALID_PARAMS");
    let pointers: Vec<&str> = r["error"]["details"]["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["pointer"].as_str().unwrap())
        .collect();
    assert!(pointers.contains(&"/num_results"), "{pointers:?}");
    assert!(pointers.contains(&"/query"), "{pointers:?}");
    assert!(
        pointers.contains(&"/qury"),
        "the misspelt key at its own pointer: {pointers:?}"
    );
    assert_eq!(server.requests(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_servers_time_out_and_failing_servers_are_execution_errors() {
    let server = SearxServer::start(Duration::from_secs(3)).await;
    let vault = TestVault::new(&server.base_url(), "[tools.search_web]\ntimeout = \"1s\"\n");
    let r = failed_result(
        &vault,
        "slow.md",
        &note_with_calls("S", &[search_call("slow")]),
    );
    assert_eq!(r["error"]["code"], "TIMEOUT");
    assert_eq!(r["error"]["retryable"], true);

    let garbage = searx().await;
    garbage.set_answer(Answer::Garbage);
    let vault = TestVault::new(&garbage.base_url(), "");
    let r = failed_result(
        &vault,
        "garbage.md",
        &note_with_calls("G", &[search_call("g")]),
    );
    assert_eq!(r["error"]["code"], "EXECUTION_ERROR");
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_disabled_tools_and_missing_config_fail_clearly() {
    let server = searx().await;
    let vault = TestVault::new(&server.base_url(), "max_calls_per_note = 1\n");
    vault.drop_note(
        "quota.md",
        &note_with_calls("Q", &[search_call("one"), search_call("two")]),
    );
    assert_eq!(vault.once().0, 0);
    let note = vault.read("Failed", "quota.md");
    let results = results_in(&note);
    assert_eq!(results[0]["ok"], true);
    assert_eq!(results[1]["error"]["code"], "QUOTA_EXCEEDED");
    assert_eq!(server.requests(), 1);

    let vault = TestVault::new(&server.base_url(), "[tools.search_web]\nenabled = false\n");
    let r = failed_result(
        &vault,
        "off.md",
        &note_with_calls("O", &[search_call("off")]),
    );
    assert_eq!(r["error"]["code"], "POLICY_DENIED");

    // searxng has no public instance to fall back on: without base_url it is not configured.
    let vault = TestVault::new(&server.base_url(), "");
    let cfg = std::fs::read_to_string(&vault.config).unwrap();
    let cfg: String = cfg
        .lines()
        .filter(|l| !l.starts_with("base_url"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&vault.config, cfg).unwrap();
    let r = failed_result(&vault, "nc.md", &note_with_calls("N", &[search_call("nc")]));
    assert_eq!(r["error"]["code"], "NOT_CONFIGURED");
    assert_eq!(server.requests(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn email_goes_through_a_real_smtp_server() {
    let server = searx().await;
    let smtp = SmtpServer::start();
    let vault = TestVault::new(
        &server.base_url(),
        &format!(
            "[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"smtp\"\nsmtp_url = \"smtp://127.0.0.1:{}\"\nfrom = \"Agent <agent@example.com>\"\n",
            smtp.port
        ),
    );
    vault.drop_note(
        "mail.md",
        &note_with_calls(
            "Mail",
            &[json!({ "name": "send_notification", "parameters": {
                "recipient": "bob@example.org", "subject": "Build done", "body": "All green." } })],
        ),
    );
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let note = vault.read("Done", "mail.md");
    let r = &results_in(&note)[0];
    let mails = smtp.received();
    assert_eq!(mails.len(), 1);
    assert_eq!(mails[0].to, vec!["bob@example.org"]);
    assert!(mails[0].data.contains("Subject: Build done"));
    assert!(mails[0].data.contains("All green."));
    let call_id = r["call_id"].as_str().unwrap();
    assert!(
        mails[0].data.contains(&format!("<{call_id}@")),
        "{}",
        mails[0].data
    );
    assert_eq!(r["data"]["success"], true);
}

#[tokio::test(flavor = "multi_thread")]
async fn check_json_reports_each_call() {
    let server = searx().await;
    let vault = TestVault::new(&server.base_url(), "");
    let path = vault.dir.path().join("lint.md");
    std::fs::write(
        &path,
        "---\ntitle: x\n---\n# Lint\n\n```json\n{\"tool_call\": {\"name\": \"search_web\", \"parameters\": {\"query\": \"ok\"}}}\n```\n\n```json\n{\"tool_call\": {\"name\": \"nope\"}}\n```\n",
    )
    .unwrap();
    let out = vault
        .cmd()
        .arg("check")
        .arg("--json")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "an invalid call exits 1");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1);
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(v["path"], path.display().to_string());
    let calls = v["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["status"], "pending");
    assert_eq!(calls[0]["line"], 6);
    assert_eq!(calls[0]["name"], "search_web");
    assert_eq!(calls[1]["status"], "invalid");
    assert_eq!(calls[1]["error"]["code"], "UNKNOWN_TOOL");
    assert_eq!(calls[1]["line"], 10);
}

#[test]
fn tools_json_lists_names_effects_and_schemas() {
    let out = std::process::Command::new(bin())
        .args(["tools", "--json"])
        .env_remove("VAULTD_CONFIG")
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tools = v.as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names[..3],
        ["search_web", "send_notification", "approve_tool_use"]
    );
    assert_eq!(names[3..], vaultd::tools::vault::TOOL_NAMES);
    assert_eq!(tools[0]["effect"], "read_only");
    assert_eq!(tools[1]["effect"], "external_side_effect");
    assert_eq!(tools[0]["parameters"]["additionalProperties"], false);
    assert_eq!(tools[0]["parameters"]["required"], json!(["query"]));
}

#[test]
fn init_makes_a_working_vault_and_changes_nothing_the_second_time() {
    let dir = tempfile::tempdir().unwrap();
    let vault = dir.path().join("Notes");
    let state = dir.path().join("state");
    let run = |args: &[&str]| {
        std::process::Command::new(bin())
            .args(args)
            .env_remove("VAULTD_CONFIG")
            .output()
            .unwrap()
    };
    let out = run(&["init", vault.to_str().unwrap()]);
    assert!(out.status.success());
    for f in [
        "Needs_Action",
        "In_Progress",
        "Pending_Approval",
        "Approved",
        "Rejected",
        "Done",
        "Failed",
    ] {
        assert!(vault.join(f).is_dir(), "{f}");
    }
    let config = std::fs::read_to_string(vault.join(".vaultd.toml")).unwrap();
    let welcome = std::fs::read_to_string(vault.join("Needs_Action/Welcome.md")).unwrap();
    let out = run(&["init", vault.to_str().unwrap()]);
    assert!(out.status.success());
    assert_eq!(
        std::fs::read_to_string(vault.join(".vaultd.toml")).unwrap(),
        config
    );
    assert_eq!(
        std::fs::read_to_string(vault.join("Needs_Action/Welcome.md")).unwrap(),
        welcome
    );
    // The commented config is a valid config, and the vault runs.
    let out = run(&[
        "once",
        "--vault",
        vault.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !vault.join("Needs_Action/Welcome.md").exists(),
        "the welcome note was processed"
    );
}

#[test]
fn a_bad_config_stops_with_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        format!(
            "vault = {:?}\n\n[tools.search_web]\nprovder = \"brave\"\n",
            dir.path()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(bin())
        .args(["run", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml:4:") && err.contains("provder"),
        "{err}"
    );
}
