//! A copy is known by what it carries, whatever its name (docs/design.md §9.10), and a note's undo
//! history is its id's (§11.3): the real binary, a real Slack-format webhook (wiremock) on
//! 127.0.0.1, and the moves that used to send twice — a left-behind name renamed inside the
//! grace, the note as claimed dropped back as `x 2.md`, sync clients' duplicate names of the
//! original — and `vaultd undo --note` after a rename.

use crate::util::searx::SearxServer;
use crate::util::*;
use serde_json::json;
use std::time::Duration;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

async fn slack_hook() -> MockServer {
    let slack = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/services/T000/B000/hook"))
        .respond_with(ResponseTemplate::new(200).set_body_string("ok"))
        .mount(&slack)
        .await;
    slack
}

/// A vault whose `ops` Slack webhook is `slack`, with `extra` on top.
fn slack_vault(search: &SearxServer, slack: &MockServer, extra: &str) -> TestVault {
    let vault = TestVault::new(&search.base_url(), "");
    let secret = vault.dir.path().join("slack-hook");
    std::fs::write(&secret, format!("{}/services/T000/B000/hook", slack.uri())).unwrap();
    vault.write_config(
        &search.base_url(),
        &format!(
            "{extra}\n[tools.send_notification.slack.webhooks]\nops = \"file:{}\"\n",
            secret.display()
        ),
    );
    vault
}

fn send_note(title: &str) -> String {
    note_with_calls(
        title,
        &[json!({ "name": "send_notification", "parameters": {
            "method": "slack", "recipient": "ops", "subject": title, "body": "once" } })],
    )
}

async fn sends(slack: &MockServer) -> usize {
    slack.received_requests().await.unwrap_or_default().len()
}

fn only_result(text: &str) -> serde_json::Value {
    let results = results_in(text);
    assert_eq!(results.len(), 1, "exactly one result: {text}");
    results[0].clone()
}

/// Waits until `folder/rel` holds a finished note (`tool_status`), with the log on failure.
fn finished(vault: &TestVault, daemon: &RunningDaemon, folder: &str, rel: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(vault.path(folder, rel))
            && text.contains("tool_status:")
        {
            return text;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{folder}/{rel} never finished; vault: {:#?}\nlog:\n{}",
            vault.all_notes(),
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// Item 1: `mv x.md Needs_Action/; mv Needs_Action/x.md Needs_Action/y.md` inside the grace.
// The claim linked x.md into In_Progress and stamped it there (a new file); y.md is the first
// name, renamed: no tool_note, another path. It is the claimed note and never runs (§9.10).
#[tokio::test(flavor = "multi_thread")]
async fn a_left_behind_name_renamed_inside_the_grace_is_not_sent_again() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook().await;
    // A grace long enough to rename inside it on a loaded machine (the default is 100 ms).
    let vault = slack_vault(&search, &slack, "moved_in_grace = \"10s\"\n");
    let daemon = vault.start_logged("renamed-left-behind.log");
    vault.drop_note("x.md", &send_note("Deploy"));
    let done = finished(&vault, &daemon, "Done", "x.md");
    assert_eq!(only_result(&done)["ok"], true, "{done}");
    std::fs::rename(
        vault.path("Needs_Action", "x.md"),
        vault.path("Needs_Action", "y.md"),
    )
    .unwrap_or_else(|e| panic!("the first name was gone before the grace was over: {e}"));
    wait_until("the renamed first name is dropped", DEADLINE, || {
        vault.notes_in("Needs_Action").is_empty()
    });
    let status = daemon.terminate();
    assert!(status.success(), "{status:?}");
    assert_eq!(vault.all_notes(), vec!["Done/x.md".to_string()]);
    assert_eq!(sends(&slack).await, 1, "sent once");
}

// Item 1 across a crash: killed inside the grace, the first name renamed while the daemon is
// down; the restart finds it by its file key (recorded with the claim) and drops it.
#[tokio::test(flavor = "multi_thread")]
async fn a_left_behind_name_renamed_while_the_daemon_is_down_is_dropped_at_start() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook().await;
    let vault = slack_vault(&search, &slack, "moved_in_grace = \"60s\"\n");
    let daemon = vault.start_logged("renamed-kill.log");
    vault.drop_note("x.md", &send_note("Deploy"));
    finished(&vault, &daemon, "Done", "x.md");
    daemon.kill9();
    std::fs::rename(
        vault.path("Needs_Action", "x.md"),
        vault.path("Needs_Action", "renamed.md"),
    )
    .unwrap();
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    assert_eq!(vault.all_notes(), vec!["Done/x.md".to_string()], "{log}");
    assert_eq!(sends(&slack).await, 1, "sent once");
}

// Item 2, rule 1: the note as it was right after its claim (tool_note set, no result) dropped
// back under another name while the original (in Done/) exists: a copy, so a new id, but the
// send its carried id made gets its recorded result; nothing is sent again.
#[tokio::test(flavor = "multi_thread")]
async fn the_note_as_claimed_dropped_back_as_x_2_gets_the_recorded_result() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook().await;
    let vault = slack_vault(&search, &slack, "");
    let original = send_note("Deploy");
    vault.drop_note("x.md", &original);
    assert_eq!(vault.once().0, 0);
    let done = vault.read("Done", "x.md");
    let id = property(&done, "tool_note").expect("stamped at the claim");
    let as_claimed = format!("---\ntool_note: {id}\n---\n{original}");
    // iCloud's `x 2.md`, Obsidian's "Duplicate file" (`x 1.md`), a backup restored by hand.
    for name in ["x 2.md", "x 1.md", "restored.md"] {
        vault.drop_note(name, &as_claimed);
    }
    vault.drop_into("Approved", "approved copy.md", as_claimed.as_bytes());
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    for name in ["x 2.md", "x 1.md", "restored.md", "approved copy.md"] {
        let copy = vault.read("Done", name);
        assert_eq!(only_result(&copy), only_result(&done), "{name}: {copy}");
        assert_ne!(property(&copy, "tool_note"), Some(id.clone()), "{name}");
    }
    assert_eq!(sends(&slack).await, 1, "sent once: {log}");
    // A call the copy adds, which that note never started, runs.
    let more = format!(
        "{as_claimed}\n```json\n{}\n```\n",
        json!({ "tool_call": search_call("new question") })
    );
    vault.drop_note("x 3.md", &more);
    assert_eq!(vault.once().0, 0);
    let copy = vault.read("Done", "x 3.md");
    let results = results_in(&copy);
    assert_eq!(results.len(), 2, "{copy}");
    assert_eq!(search.queries(), vec!["new question"]);
    assert_eq!(sends(&slack).await, 1);
}

/// Duplicate names of `x.md` as sync clients make them (docs/reliability.md, "Copies under other names").
const DUPLICATE_NAMES: &[&str] = &[
    "x 2.md",                                                // iCloud
    "x (1).md",                                              // Google Drive, Dropbox
    "x-LAPTOP-4F2A.md",                                      // OneDrive
    "x-conflict-20261124-101500.md",                         // generic -conflict
    "x (SFConflict ana@example.com 2026-11-24-10-15-00).md", // Seafile
];

// Item 2, rule 3: a sync client's duplicate of the original as it was claimed (no tool_note)
// is a stale copy of x.md (§9.6) whatever its name: the recorded result, nothing sent again.
// The same name with other text is a note of its own and runs.
#[tokio::test(flavor = "multi_thread")]
async fn sync_client_duplicates_of_the_original_are_not_sent_again() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook().await;
    let vault = slack_vault(&search, &slack, "");
    let original = send_note("Deploy");
    vault.drop_note("x.md", &original);
    assert_eq!(vault.once().0, 0);
    let done = vault.read("Done", "x.md");
    for name in DUPLICATE_NAMES {
        vault.drop_note(name, &original);
    }
    vault.drop_note("x 9.md", &send_note("Another deploy"));
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    for name in DUPLICATE_NAMES {
        let copy = vault.read("Done", name);
        assert_eq!(only_result(&copy), only_result(&done), "{name}: {copy}");
    }
    assert_eq!(only_result(&vault.read("Done", "x 9.md"))["ok"], true);
    assert_eq!(sends(&slack).await, 2, "x.md and x 9.md, once each: {log}");
}

// Rule 3 after `stale_copy_grace`: the duplicate's send is held, saying where it ran.
#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_after_the_grace_is_held_saying_where_it_ran() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook().await;
    let vault = slack_vault(&search, &slack, "stale_copy_grace = \"1s\"\n");
    let original = send_note("Deploy");
    vault.drop_note("x.md", &original);
    assert_eq!(vault.once().0, 0);
    std::thread::sleep(Duration::from_millis(1200));
    vault.drop_note("x (1).md", &original);
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let held = vault.read("Pending_Approval", "x (1).md");
    assert!(held.contains("already ran at"), "{held}");
    assert!(held.contains("Done/x.md"), "{held}");
    assert_eq!(sends(&slack).await, 1);
}

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

// Item 10: `vaultd undo --note` follows the note's id through a rename, takes a bare name
// without `.md` as every command does, and says when no note has that name.
#[test]
fn undo_by_note_follows_the_note_id_and_resolves_names() {
    let vault = TestVault::new(
        "http://127.0.0.1:9",
        "[tools.vault]\nwrite = [\"Agent/**\"]\n",
    );
    let make = |id: &str, path: &str| json!({ "name": "vault_create", "id": id, "parameters": { "path": path, "content": "x\n" } });
    vault.drop_note(
        "Round3.md",
        &note_with_calls("R3", &[make("a", "Agent/a.md")]),
    );
    vault.drop_note(
        "Other.md",
        &note_with_calls("O", &[make("b", "Agent/b.md")]),
    );
    assert_eq!(vault.once().0, 0);
    assert!(vault.root.join("Agent/a.md").exists());

    // Renamed (Obsidian keeps the frontmatter): the history goes with it.
    std::fs::rename(
        vault.path("Done", "Round3.md"),
        vault.path("Done", "Round4.md"),
    )
    .unwrap();
    let (code, out, err) = undo(&vault, &["--note", "Round4", "--dry-run"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Agent/a.md"), "{out}");
    let (code, out, err) = undo(&vault, &["--note", "Done/Round4.md"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!vault.root.join("Agent/a.md").exists());
    assert!(
        vault.root.join("Agent/b.md").exists(),
        "the other note's change stays"
    );

    // A bare name without `.md`.
    let (code, out, err) = undo(&vault, &["--note", "Other"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!vault.root.join("Agent/b.md").exists());
    let (code, _, err) = undo(&vault, &["--note", "Other"]);
    assert_eq!(code, 1);
    assert!(err.contains("NOTHING_TO_UNDO"), "{err}");

    // No such note: said so, with what was tried.
    let (code, _, err) = undo(&vault, &["--note", "Round9"]);
    assert_eq!(code, 1);
    assert!(err.contains("NOT_FOUND"), "{err}");
    assert!(err.contains("no note named Round9"), "{err}");
}
