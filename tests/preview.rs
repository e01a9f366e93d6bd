//! Dry-run previews (docs/design.md §12.1) end to end with the real binary: a command tool's
//! preview shows the argv it would run and its sandbox, a vault write's shows the unified
//! diff, and every preview decides through the daemon's own plan — the note budget, a
//! question a person answered with `vaultd approve`, a call the journal recorded — in
//! `Dry_Run/` and in `vaultd check --preview` alike. Nothing runs.

use crate::util::searx::SearxServer;
use crate::util::*;
use serde_json::json;
use std::time::Duration;

/// No search server is used here; the config still names one.
const NO_SEARCH: &str = "http://127.0.0.1:9";

fn once_ok(vault: &TestVault) {
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
}

/// A command tool that would create a file in the vault if it ran.
const TOUCH_TOOL: &str = r#"
[tools.command.touch]
description = "Create a file (test only)"
argv = ["touch", "--", "out/{name}", "-{flag}"]
parameters = { type = "object", properties = { name = { type = "string" }, flag = { type = "string" } }, required = ["name"] }
effect = "state_change"
approval = "never"
writable = ["out"]
read = ["/usr/share"]
timeout = "7s"
max_memory = 268435456
max_processes = 9
max_output_bytes = 2048
env = { MODE = "quiet" }
"#;

#[test]
fn a_command_preview_shows_the_exact_argv_and_the_sandbox_and_runs_nothing() {
    let vault = TestVault::new(NO_SEARCH, TOUCH_TOOL);
    std::fs::create_dir_all(vault.root.join("out")).unwrap();
    // A hostile name stays one argument: shown exactly as the program would get it.
    let hostile = "a b; $(touch pwned)";
    let note = note_with_calls(
        "Touch",
        &[json!({ "name": "touch", "parameters": { "name": hostile } })],
    );
    let path = vault.drop_into("Dry_Run", "touch.md", note.as_bytes());
    once_ok(&vault);
    let written = previews_in(&vault.read("Dry_Run", "touch.md"));
    assert_eq!(written.len(), 1, "{}", vault.read("Dry_Run", "touch.md"));
    let p = &written[0];
    assert_eq!(p["decision"]["action"], "run", "{p}");
    let would = &p["would"];
    // `-{flag}` names an absent optional parameter: left out, as when it runs.
    assert_eq!(
        would["argv"],
        json!(["touch", "--", format!("out/{hostile}")]),
        "{would}"
    );
    assert!(
        would["program"].as_str().unwrap().ends_with("/touch"),
        "{would}"
    );
    let sandbox = &would["sandbox"];
    assert_eq!(sandbox["mode"], "required", "{sandbox}");
    assert_eq!(sandbox["network"], false);
    assert!(
        sandbox["writable"]
            .to_string()
            .contains("out (in the vault)")
    );
    assert!(sandbox["read"].to_string().contains("/usr/share"));
    assert_eq!(sandbox["limits"]["timeout"], "7s");
    assert_eq!(sandbox["limits"]["max_memory"], 268435456);
    assert_eq!(sandbox["limits"]["max_processes"], 9);
    assert_eq!(sandbox["limits"]["max_output_bytes"], 2048);
    assert!(sandbox["enforced"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(would["env"]["MODE"], "quiet");
    // Nothing ran.
    assert_eq!(
        std::fs::read_dir(vault.root.join("out")).unwrap().count(),
        0,
        "the program was started"
    );
    assert!(!vault.root.join("pwned").exists());

    // `check --preview` prints the same.
    let (code, printed) = vault.check_preview(&path);
    assert_eq!(code, 0);
    assert_eq!(printed[0]["would"], *would);
}

/// A vault whose tools may write under `Agent/`, with one note there.
fn agent_vault() -> TestVault {
    let vault = TestVault::new(
        NO_SEARCH,
        "[tools.vault]\nwrite = [\"Agent/**\", \"Private/**\"]\nread = [\"Agent/**\"]\n",
    );
    std::fs::create_dir_all(vault.root.join("Agent")).unwrap();
    std::fs::create_dir_all(vault.root.join("Private")).unwrap();
    std::fs::write(
        vault.root.join("Agent/log.md"),
        "# Log\n\n- [ ] one\n- two\n",
    )
    .unwrap();
    std::fs::write(vault.root.join("Private/keys.md"), "pin: 4321\n").unwrap();
    vault
}

#[test]
fn a_vault_write_preview_shows_the_unified_diff_and_writes_nothing() {
    let vault = agent_vault();
    let calls = [
        json!({ "name": "vault_append", "parameters": { "path": "Agent/log.md", "text": "- three" } }),
        json!({ "name": "vault_create", "parameters": { "path": "Agent/new.md", "content": "Hello\n", "properties": { "tags": "x" } } }),
        json!({ "name": "vault_complete_task", "parameters": { "path": "Agent/log.md", "line": 3, "text": "one" } }),
        json!({ "name": "vault_move", "parameters": { "from": "Agent/log.md", "to": "Agent/old/log.md" } }),
        json!({ "name": "vault_append", "parameters": { "path": "Agent/missing.md", "text": "x" } }),
        // Writable but not readable: the preview must not show what the note holds.
        json!({ "name": "vault_append", "parameters": { "path": "Private/keys.md", "text": "more" } }),
    ];
    let path = vault.drop_into(
        "Dry_Run",
        "edit.md",
        note_with_calls("Edit", &calls).as_bytes(),
    );
    let before = vault.all_files();
    once_ok(&vault);
    let text = vault.read("Dry_Run", "edit.md");
    let p = previews_in(&text);
    assert_eq!(p.len(), calls.len(), "{text}");
    assert_eq!(
        p[0]["would"]["diff"],
        "--- a/Agent/log.md\n+++ b/Agent/log.md\n@@ -2,3 +2,4 @@\n \n - [ ] one\n - two\n+- three\n",
        "{}",
        p[0]
    );
    assert_eq!(
        p[1]["would"]["diff"],
        "--- /dev/null\n+++ b/Agent/new.md\n@@ -0,0 +1,4 @@\n+---\n+tags: x\n+---\n+Hello\n",
        "{}",
        p[1]
    );
    assert_eq!(
        p[2]["would"]["diff"],
        "--- a/Agent/log.md\n+++ b/Agent/log.md\n@@ -1,4 +1,4 @@\n # Log\n \n-- [ ] one\n+- [x] one\n - two\n",
        "{}",
        p[2]
    );
    assert_eq!(
        p[3]["would"]["diff"],
        "--- a/Agent/log.md\n+++ b/Agent/old/log.md\n"
    );
    assert_eq!(p[4]["would"]["error"]["code"], "NOT_FOUND", "{}", p[4]);
    assert!(
        !text.contains("4321"),
        "a note outside the read scope leaked: {text}"
    );
    for preview in &p {
        assert_eq!(preview["decision"]["action"], "run", "{preview}");
    }
    // Nothing was written: the vault has the same files with the same text, and no undo
    // record was kept.
    let mut after = vault.all_files();
    after.retain(|f| !f.starts_with("Dry_Run/"));
    let mut before = before;
    before.retain(|f| !f.starts_with("Dry_Run/"));
    assert_eq!(after, before);
    assert_eq!(
        std::fs::read_to_string(vault.root.join("Agent/log.md")).unwrap(),
        "# Log\n\n- [ ] one\n- two\n"
    );

    // `check --preview` prints the same diffs.
    let (code, printed) = vault.check_preview(&path);
    assert_eq!(code, 0);
    for (a, b) in printed.iter().zip(&p) {
        assert_eq!(a["would"], b["would"]);
    }
}

/// A note whose `tool_note` has spent its budget: the next call previews as QUOTA_EXCEEDED,
/// in Dry_Run/ and in `check --preview` (which did not know the budget before).
#[tokio::test(flavor = "multi_thread")]
async fn a_spent_note_budget_previews_as_quota_exceeded_in_check_preview_too() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "note_budget = 1\n");
    vault.drop_note("n.md", &note_with_calls("N", &[search_call("a")]));
    once_ok(&vault);
    let done = vault.wait_until_in("Done", "n.md");
    let next = format!(
        "{done}\n```json\n{}\n```\n",
        json!({ "tool_call": search_call("b") })
    );
    std::fs::write(vault.path("Done", "n.md"), &next).unwrap();
    let (code, printed) = vault.check_preview(&vault.path("Done", "n.md"));
    assert_eq!(code, 1, "a denied call makes check fail");
    assert_eq!(printed.len(), 1);
    assert_eq!(printed[0]["decision"]["action"], "deny", "{}", printed[0]);
    assert_eq!(printed[0]["decision"]["code"], "QUOTA_EXCEEDED");
    let requests = search.requests();

    vault.drop_into("Dry_Run", "n.md", next.as_bytes());
    once_ok(&vault);
    let written = previews_in(&vault.read("Dry_Run", "n.md"));
    assert_eq!(written[0]["decision"], printed[0]["decision"]);
    assert_eq!(search.requests(), requests, "a preview sends nothing");
}

/// A send to an address outside `allowed_recipients` waits for a person. Previewed, it is
/// held with the reason; once a person approved it with `vaultd approve`, its preview says
/// it runs, as the daemon would run it.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_call_previews_as_held_until_vaultd_approve_decides_it() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    let outbox = vault.dir.path().join("outbox");
    vault.write_config(
        &search.base_url(),
        &format!(
            "approval_via = \"cli\"\n[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"file\"\noutbox = {:?}\nfrom = \"Agent <agent@example.com>\"\n",
            outbox.display().to_string()
        ),
    );
    let send = json!({ "name": "send_notification", "parameters": {
        "method": "email", "recipient": "stranger@elsewhere.net", "subject": "Hi", "body": "Hello." } });
    let note = note_with_calls("Send", &[send]);
    let dry = vault.drop_into("Dry_Run", "send.md", note.as_bytes());
    let (code, printed) = vault.check_preview(&dry);
    assert_eq!(code, 0);
    assert_eq!(printed[0]["decision"]["action"], "hold", "{}", printed[0]);
    assert!(
        printed[0]["decision"]["reason"]
            .as_str()
            .unwrap()
            .contains("stranger@elsewhere.net"),
        "{}",
        printed[0]
    );

    // The daemon asks; a person approves with the CLI.
    std::fs::remove_file(&dry).unwrap();
    vault.drop_note("send.md", &note);
    once_ok(&vault);
    vault.wait_until_in("Pending_Approval", "send.md");
    let out = vault
        .cmd()
        .arg("approve")
        .arg(vault.path("Pending_Approval", "send.md"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let approved = ["Approved", "Pending_Approval"]
        .into_iter()
        .find(|f| vault.exists(f, "send.md"))
        .expect("the approved note is in Approved/ or Pending_Approval/");
    let (code, printed) = vault.check_preview(&vault.path(approved, "send.md"));
    assert_eq!(code, 0);
    assert_eq!(
        printed[0]["decision"]["action"], "run",
        "the recorded approval decides: {}",
        printed[0]
    );
    // The same note in Dry_Run/ previews the same, and nothing is sent. (The approved note
    // itself is taken out of the vault first, or this `once` would send it.)
    let text = vault.read(approved, "send.md");
    std::fs::rename(
        vault.path(approved, "send.md"),
        vault.dir.path().join("send.md"),
    )
    .unwrap();
    vault.drop_into("Dry_Run", "again.md", text.as_bytes());
    once_ok(&vault);
    let written = previews_in(&vault.read("Dry_Run", "again.md"));
    assert_eq!(written.len(), 1, "{}", vault.read("Dry_Run", "again.md"));
    assert_eq!(written[0]["decision"]["action"], "run", "{}", written[0]);
    assert!(
        std::fs::read_dir(&outbox).map_or(0, |d| d.count()) == 0,
        "a preview sent an email"
    );
}

/// A send that started and whose outcome was never recorded (vaultd was killed mid-send) is
/// never sent again: its preview says what the daemon would do, never "run".
#[tokio::test(flavor = "multi_thread")]
async fn a_call_the_journal_recorded_previews_as_the_daemon_would_decide_it() {
    let search = SearxServer::start(Duration::ZERO).await;
    let smtp = SmtpServer::start_with_delay(Duration::from_secs(3));
    let vault = TestVault::new(
        &search.base_url(),
        &format!(
            "[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"smtp\"\nsmtp_url = \"smtp://127.0.0.1:{}\"\nfrom = \"Agent <agent@example.com>\"\n",
            smtp.port
        ),
    );
    let daemon = vault.start();
    vault.drop_note(
        "mail.md",
        &note_with_calls(
            "Mail",
            &[json!({ "name": "send_notification", "parameters": {
                "recipient": "bob@example.org", "subject": "Once only", "body": "Exactly once." } })],
        ),
    );
    wait_until("the send is running", DEADLINE, || {
        vault.exists("In_Progress", "mail.md")
            && !vault.journal().running_calls().unwrap().is_empty()
            && smtp.answering() == 1
    });
    daemon.kill9();
    let (code, printed) = vault.check_preview(&vault.path("In_Progress", "mail.md"));
    assert_eq!(code, 1);
    assert_eq!(printed[0]["decision"]["action"], "deny", "{}", printed[0]);
    assert_eq!(printed[0]["decision"]["code"], "UNKNOWN_OUTCOME");

    // The same note moved into Dry_Run/ (so no recovery finishes it first): its dry run
    // says what the daemon would, never "run".
    vault.move_note("In_Progress", "Dry_Run", "mail.md");
    once_ok(&vault);
    let written = previews_in(&vault.read("Dry_Run", "mail.md"));
    assert_eq!(written.len(), 1, "{}", vault.read("Dry_Run", "mail.md"));
    let decision = &written[0]["decision"];
    assert_eq!(decision["action"], "deny", "{decision}");
    assert_eq!(decision["code"], "UNKNOWN_OUTCOME", "{decision}");
}
