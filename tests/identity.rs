//! Never read a note half-written, never run a call twice (docs/design.md §9): each case of
//! §9.1-§9.8 against the real binary, a real Slack-format webhook (wiremock) and a real SMTP
//! server on 127.0.0.1, with the hand moves and editor saves that used to break it.

use crate::util::searx::SearxServer;
use crate::util::*;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// A Slack webhook on 127.0.0.1 that takes `delay` to answer `ok`.
async fn slack_hook(delay: Duration) -> MockServer {
    let slack = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/services/T000/B000/hook"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_string("ok")
                .set_delay(delay),
        )
        .mount(&slack)
        .await;
    slack
}

/// A vault whose `ops` Slack webhook is `slack` (the URL given as a `file:` secret).
fn slack_vault(search: &SearxServer, slack: &MockServer, extra: &str) -> TestVault {
    let vault = TestVault::new(&search.base_url(), "");
    let secret = vault.dir.path().join("slack-hook");
    std::fs::write(&secret, format!("{}/services/T000/B000/hook", slack.uri())).unwrap();
    vault.write_config(
        &search.base_url(),
        &format!(
            "{extra}\n[tools.send_notification]\ntimeout = \"20s\"\n[tools.send_notification.slack.webhooks]\nops = \"file:{}\"\n",
            secret.display()
        ),
    );
    vault
}

fn slack_note(title: &str) -> String {
    note_with_calls(
        title,
        &[json!({ "name": "send_notification", "parameters": {
            "method": "slack", "recipient": "ops", "subject": title, "body": "once" } })],
    )
}

async fn requests(slack: &MockServer) -> usize {
    slack.received_requests().await.unwrap_or_default().len()
}

/// Waits until the webhook has the request and the journal shows the call running.
async fn wait_for_send_in_flight(vault: &TestVault, slack: &MockServer) {
    let start = std::time::Instant::now();
    while requests(slack).await == 0 || vault.journal().running_calls().unwrap().is_empty() {
        assert!(
            start.elapsed() < DEADLINE,
            "the send was not seen in flight: {} request(s) at the webhook; vault: {:#?}",
            requests(slack).await,
            vault.all_notes()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`TestVault::wait_until_in`], with the daemon's log in the failure message.
fn wait_in(vault: &TestVault, daemon: &RunningDaemon, folder: &str, rel: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(vault.path(folder, rel))
            && text.contains("tool_status:")
        {
            return text;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{folder}/{rel} never appeared; vault: {:#?}\nlog:\n{}",
            vault.all_notes(),
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn only_result(text: &str) -> serde_json::Value {
    let results = results_in(text);
    assert_eq!(results.len(), 1, "exactly one result: {text}");
    results[0].clone()
}

fn smtp_config(smtp: &SmtpServer) -> String {
    format!(
        "[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"smtp\"\nsmtp_url = \"smtp://127.0.0.1:{}\"\nfrom = \"Agent <agent@example.com>\"\n",
        smtp.port
    )
}

fn mail_note(title: &str) -> String {
    note_with_calls(
        title,
        &[json!({ "name": "send_notification", "parameters": {
            "recipient": "bob@example.org", "subject": title, "body": "Exactly once." } })],
    )
}

// 1. kill -9 during a Slack send, then a hand move back to the inbox, then a restart.
#[tokio::test(flavor = "multi_thread")]
async fn killed_mid_send_then_moved_back_by_hand_is_unknown_outcome_and_sent_once() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook(Duration::from_secs(3)).await;
    let vault = slack_vault(&search, &slack, "");
    let daemon = vault.start();
    vault.drop_note("x.md", &slack_note("Deploy"));
    wait_for_send_in_flight(&vault, &slack).await;
    daemon.kill9();
    let claimed = vault.read("In_Progress", "x.md");
    assert!(property(&claimed, "tool_note").is_some(), "{claimed}");
    vault.move_note("In_Progress", "Needs_Action", "x.md");

    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let text = vault.read("Failed", "x.md");
    let r = only_result(&text);
    assert_eq!(r["error"]["code"], "UNKNOWN_OUTCOME", "{text}");
    assert!(
        log.contains("note failed") && log.contains("UNKNOWN_OUTCOME"),
        "one log line with the outcome and why: {log}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(requests(&slack).await, 1, "sent once, never again");
}

// 2. While a send is in flight the note is moved from In_Progress back to Needs_Action.
#[tokio::test(flavor = "multi_thread")]
async fn a_note_moved_back_to_the_inbox_mid_send_is_sent_once_and_gets_the_result() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook(Duration::from_secs(2)).await;
    let vault = slack_vault(&search, &slack, "");
    let daemon = vault.start_logged("moved-back.log");
    vault.drop_note("x.md", &slack_note("Deploy"));
    wait_for_send_in_flight(&vault, &slack).await;
    vault.move_note("In_Progress", "Needs_Action", "x.md");

    let text = wait_in(&vault, &daemon, "Done", "x.md");
    let r = only_result(&text);
    assert_eq!(r["ok"], true, "{text}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(requests(&slack).await, 1, "one POST");
    assert_eq!(vault.all_notes(), vec!["Done/x.md".to_string()]);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_email_moved_back_to_the_inbox_mid_send_is_sent_once() {
    let search = SearxServer::start(Duration::ZERO).await;
    let smtp = SmtpServer::start_with_delay(Duration::from_secs(2));
    let vault = TestVault::new(&search.base_url(), &smtp_config(&smtp));
    let daemon = vault.start();
    vault.drop_note("mail.md", &mail_note("Once"));
    wait_until("the SMTP server has the message", DEADLINE, || {
        smtp.answering() == 1
    });
    vault.move_note("In_Progress", "Needs_Action", "mail.md");
    let text = wait_in(&vault, &daemon, "Done", "mail.md");
    assert_eq!(only_result(&text)["ok"], true, "{text}");
    std::thread::sleep(Duration::from_millis(500));
    drop(daemon);
    assert_eq!(smtp.received().len(), 1, "one email, one Message-ID");
}

// 3. Moved out of In_Progress (to the vault root) mid-send, back to the inbox seconds later.
#[tokio::test(flavor = "multi_thread")]
async fn a_note_moved_out_mid_send_and_back_later_gets_the_recorded_result() {
    let search = SearxServer::start(Duration::ZERO).await;
    // The send must still be in flight when the test sees it (each look opens the journal,
    // slow on a loaded machine): 1 s was missed once in CI under load.
    let slack = slack_hook(Duration::from_secs(4)).await;
    let vault = slack_vault(&search, &slack, "");
    let daemon = vault.start_logged("moved-out.log");
    vault.drop_note("x.md", &slack_note("Deploy"));
    wait_for_send_in_flight(&vault, &slack).await;
    std::fs::rename(vault.path("In_Progress", "x.md"), vault.root.join("x.md")).unwrap();
    // The send finishes while the note is away: its outcome is recorded, not written.
    wait_until("the send is recorded", DEADLINE, || {
        vault.journal().running_calls().unwrap().is_empty()
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    std::fs::rename(vault.root.join("x.md"), vault.path("Needs_Action", "x.md")).unwrap();

    let text = wait_in(&vault, &daemon, "Done", "x.md");
    assert_eq!(only_result(&text)["ok"], true, "{text}");
    assert_eq!(requests(&slack).await, 1, "one delivery");
    drop(daemon);
}

// 4. An editor saves its stale buffer back (temp file + rename) right after the claim.
#[tokio::test(flavor = "multi_thread")]
async fn an_editor_resave_during_the_claim_runs_nothing_twice() {
    let search = SearxServer::start(Duration::ZERO).await;
    // In flight long enough to be seen on a loaded machine (see test 3).
    let slack = slack_hook(Duration::from_secs(3)).await;
    let vault = slack_vault(&search, &slack, "");
    let daemon = vault.start_logged("resave.log");
    let original = slack_note("Deploy");
    vault.drop_note("c.md", &original);
    wait_for_send_in_flight(&vault, &slack).await;
    vault.drop_note("c.md", &original); // the editor's save: temp file, rename

    let first = wait_in(&vault, &daemon, "Done", "c.md");
    let copy = wait_in(&vault, &daemon, "Done", "c (2).md");
    assert_eq!(only_result(&first)["ok"], true, "{first}");
    assert_eq!(
        only_result(&copy),
        only_result(&first),
        "the copy gets the recorded result"
    );
    assert_ne!(
        property(&first, "tool_note"),
        property(&copy, "tool_note"),
        "a copy gets its own id"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(requests(&slack).await, 1, "every send of the note once");
    drop(daemon);
}

// 4 (§9.6). A stale copy that comes back after the grace: its side effect is held, not sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_stale_copy_after_the_grace_is_held_saying_when_it_ran() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook(Duration::ZERO).await;
    let vault = slack_vault(&search, &slack, "stale_copy_grace = \"1s\"\n");
    let original = note_with_calls(
        "Deploy",
        &[
            json!({ "name": "send_notification", "parameters": {
                "method": "slack", "recipient": "ops", "subject": "s", "body": "b" } }),
            search_call("still fine"),
        ],
    );
    vault.drop_note("c.md", &original);
    assert_eq!(vault.once().0, 0);
    assert!(vault.exists("Done", "c.md"));
    std::thread::sleep(Duration::from_millis(1500));
    vault.drop_note("c.md", &original); // a sync client brings the old version back

    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let text = vault.read("Pending_Approval", "c.md");
    assert!(text.contains("already ran at"), "{text}");
    assert!(text.contains("Done/c.md"), "{text}");
    let results = results_in(&text);
    assert_eq!(results.len(), 1, "the read_only search ran: {text}");
    assert_eq!(requests(&slack).await, 1, "not sent again");
    assert!(log.contains("note held"), "{log}");
}

// 2 (§9.2). A copy of a note (both exist) gets its own id and its new calls run.
#[tokio::test(flavor = "multi_thread")]
async fn a_copy_of_a_finished_note_gets_a_new_id_and_runs_its_own_calls() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    vault.drop_note("a.md", &note_with_calls("A", &[search_call("first")]));
    assert_eq!(vault.once().0, 0);
    let done = vault.read("Done", "a.md");
    let id = property(&done, "tool_note").expect("tool_note added at the claim");
    assert!(id.starts_with("n-") && id.len() == 14, "{id}");
    let copy = format!(
        "{done}\n```json\n{}\n```\n",
        json!({ "tool_call": search_call("second") })
    );
    vault.drop_note("b.md", &copy);
    assert_eq!(vault.once().0, 0);
    let b = vault.read("Done", "b.md");
    assert_eq!(results_in(&b).len(), 2, "{b}");
    assert_ne!(property(&b, "tool_note"), Some(id.clone()));
    assert_eq!(property(&vault.read("Done", "a.md"), "tool_note"), Some(id));
    assert_eq!(search.queries(), vec!["first", "second"]);
}

// When the stamp is written: before a send starts, so the note that carries the send is tied to
// its journal records while it runs; with the results for a note of only `read_only` calls
// (one note write fewer, for speed: §9.2), whose calls may run again anyway (§9.3).
#[tokio::test(flavor = "multi_thread")]
async fn a_send_is_stamped_before_it_starts_a_search_with_its_results() {
    let search = SearxServer::start(Duration::from_millis(1500)).await;
    let slack = slack_hook(Duration::from_secs(2)).await;
    let vault = slack_vault(&search, &slack, "");
    let daemon = vault.start();
    vault.drop_note("send.md", &slack_note("Deploy"));
    wait_for_send_in_flight(&vault, &slack).await;
    let claimed = vault.read("In_Progress", "send.md");
    let id = property(&claimed, "tool_note").expect("tool_note before the send starts");
    assert!(property(&claimed, "tool_runner").is_some(), "{claimed}");
    assert!(results_in(&claimed).is_empty(), "{claimed}");
    let done = wait_in(&vault, &daemon, "Done", "send.md");
    assert_eq!(property(&done, "tool_note"), Some(id));

    let text = note_with_calls("Look", &[search_call("slow")]);
    vault.drop_note("look.md", &text);
    let start = std::time::Instant::now();
    while search.queries().is_empty() {
        assert!(start.elapsed() < DEADLINE, "the search never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        vault.read("In_Progress", "look.md"),
        text,
        "a note of read_only calls is untouched while they run"
    );
    let done = wait_in(&vault, &daemon, "Done", "look.md");
    for key in ["tool_note", "tool_runner", "tool_updated"] {
        assert!(property(&done, key).is_some(), "{key} in {done}");
    }
    assert_eq!(results_in(&done).len(), 1, "{done}");
    assert_eq!(requests(&slack).await, 1);
}

// The agentic loop: a finished note moved back with a deleted result runs that call again.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_result_runs_again_when_the_note_comes_back() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    let original = note_with_calls("A", &[search_call("again")]);
    vault.drop_note("a.md", &original);
    assert_eq!(vault.once().0, 0);
    let done = vault.read("Done", "a.md");
    let id = property(&done, "tool_note").unwrap();
    let cut = done.find("\n> [!success]").unwrap();
    vault.drop_note("a.md", &done[..cut]);
    std::fs::remove_file(vault.path("Done", "a.md")).unwrap();
    assert_eq!(vault.once().0, 0);
    let again = vault.read("Done", "a.md");
    assert_eq!(results_in(&again).len(), 1, "{again}");
    assert_eq!(property(&again, "tool_note"), Some(id));
    assert_eq!(search.queries(), vec!["again", "again"]);
}

// 5. Half-written notes: a writer that pauses with the file open, or closes and reopens.
#[tokio::test(flavor = "multi_thread")]
async fn a_writer_pausing_with_the_note_open_gets_every_call_run() {
    use std::io::Write;
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "settle = \"1s\"\n");
    let daemon = vault.start_logged("pause.log");
    let text = note_with_calls("Two", &[search_call("one"), search_call("two")]);
    let cut = text.find("```json").unwrap()
        + text[text.find("```json").unwrap()..]
            .find("\n```\n")
            .unwrap()
        + 5;
    let path = vault.path("Needs_Action", "two.md");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&text.as_bytes()[..cut]).unwrap();
    f.sync_all().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        vault.exists("Needs_Action", "two.md"),
        "not claimed while open"
    );
    f.write_all(&text.as_bytes()[cut..]).unwrap();
    drop(f);
    let done = vault.wait_until_in("Done", "two.md");
    assert_eq!(results_in(&done).len(), 2, "{done}");
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_note_closed_half_way_and_reopened_to_append_is_one_note() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    let daemon = vault.start_logged("reopen.log");
    let text = note_with_calls("Two", &[search_call("one"), search_call("two")]);
    let half = text.rfind("\n```json").unwrap();
    vault.write_in_place("Needs_Action", "two.md", &text[..half]);
    std::thread::sleep(Duration::from_millis(700));
    std::fs::write(vault.path("Needs_Action", "two.md"), &text).unwrap();
    let done = vault.wait_until_in("Done", "two.md");
    assert_eq!(results_in(&done).len(), 2, "{done}");
    assert_eq!(vault.all_notes(), vec!["Done/two.md".to_string()]);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unclosed_last_block_waits_for_its_writer_instead_of_failing() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "settle = \"500ms\"\n");
    let daemon = vault.start_logged("unclosed.log");
    let text = note_with_calls("One", &[search_call("late")]);
    let half = text.rfind("\"num_results\"").unwrap();
    vault.write_in_place("Needs_Action", "one.md", &text[..half]);
    // Looked at once settled, and left for its writer: the log says until when.
    daemon.wait_for_log("its last call block is unfinished");
    assert!(vault.exists("Needs_Action", "one.md"), "not judged yet");
    std::fs::write(vault.path("Needs_Action", "one.md"), &text).unwrap();
    let done = vault.wait_until_in("Done", "one.md");
    assert_eq!(only_result(&done)["ok"], true, "{done}");
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unclosed_last_block_is_judged_after_settle_max() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(
        &search.base_url(),
        "settle = \"200ms\"\nsettle_max = \"2s\"\n",
    );
    let daemon = vault.start_logged("settle-max.log");
    let text = note_with_calls("One", &[search_call("never finished")]);
    let half = text.rfind("\n```").unwrap();
    vault.write_in_place("Needs_Action", "one.md", &text[..half]);
    let failed = vault.wait_until_in("Failed", "one.md");
    let r = only_result(&failed);
    assert_eq!(r["error"]["code"], "INVALID_CALL", "{failed}");
    drop(daemon);
}

// 6. Symlinks: the lock and the state folders are never followed.
#[test]
fn a_symlinked_lock_is_refused_and_its_target_untouched() {
    let vault = TestVault::new("http://127.0.0.1:9", "");
    std::fs::create_dir_all(&vault.root).unwrap();
    let target = vault.dir.path().join("precious.txt");
    std::fs::write(&target, "keep me").unwrap();
    std::os::unix::fs::symlink(&target, vault.root.join(".vaultd.lock")).unwrap();
    let (code, log) = vault.once();
    assert_ne!(code, 0, "{log}");
    assert!(log.contains("symlink"), "{log}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
}

#[test]
fn a_symlinked_state_folder_stops_run_and_once() {
    let vault = TestVault::new("http://127.0.0.1:9", "");
    let outside = vault.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("foreign.md"), "```json\n{\"tool_call\": {\"name\": \"search_web\", \"parameters\": {\"query\": \"x\"}}}\n```\n").unwrap();
    std::os::unix::fs::symlink(&outside, vault.root.join("Needs_Action")).unwrap();
    let (code, log) = vault.once();
    assert_ne!(code, 0, "{log}");
    assert!(
        log.contains("Needs_Action") && log.contains("symlink"),
        "{log}"
    );
    let out = vault.cmd().arg("run").output().unwrap();
    assert!(!out.status.success());
    assert!(outside.join("foreign.md").exists(), "nothing pulled in");
    assert!(!vault.root.join("In_Progress/foreign.md").exists());
}

// 7. File modes under umask 022 and 000; the lock goes on exit.
fn mode(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

fn with_umask(mut cmd: std::process::Command, umask: u32) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: umask is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(move || {
            libc::umask(umask as libc::mode_t);
            Ok(())
        });
    }
    cmd
}

fn private_files_under_umask(umask: u32) {
    let vault = TestVault::new("http://127.0.0.1:9", "");
    let outbox = vault.state.join("outbox");
    vault.write_config(
        "http://127.0.0.1:9",
        &format!(
            "[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"file\"\noutbox = {:?}\n",
            outbox.display().to_string()
        ),
    );
    vault.drop_note("mail.md", &mail_note("Private"));
    let out = with_umask(vault.cmd(), umask).arg("once").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(vault.exists("Done", "mail.md"));
    assert_eq!(mode(&vault.state), 0o700, "state dir");
    assert_eq!(mode(&vault.state.join("journal.sqlite")), 0o600, "journal");
    for side in ["journal.sqlite-wal", "journal.sqlite-shm"] {
        let p = vault.state.join(side);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{side}");
        }
    }
    assert_eq!(mode(&outbox), 0o700, "outbox");
    let emls: Vec<_> = std::fs::read_dir(&outbox).unwrap().flatten().collect();
    assert_eq!(emls.len(), 1);
    assert_eq!(mode(&emls[0].path()), 0o600, ".eml");
    assert!(
        !vault.root.join(".vaultd.lock").exists(),
        "lock removed after once"
    );

    // `run` with a live writer of the WAL, then SIGTERM: the lock goes too.
    let daemon = RunningDaemon::start(
        with_umask(vault.cmd(), umask),
        vault.dir.path().join("run.log"),
    );
    assert_eq!(mode(&vault.root.join(".vaultd.lock")), 0o600, "lock");
    for side in ["journal.sqlite-wal", "journal.sqlite-shm"] {
        assert_eq!(mode(&vault.state.join(side)), 0o600, "{side}");
    }
    assert!(daemon.terminate().success());
    assert!(
        !vault.root.join(".vaultd.lock").exists(),
        "lock removed after SIGTERM"
    );

    let fresh = vault.dir.path().join("fresh");
    let out = with_umask(std::process::Command::new(bin()), umask)
        .arg("init")
        .arg(&fresh)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&fresh.join(".vaultd.toml")), 0o600, "init's config");
}

#[test]
fn private_files_are_private_under_umask_022() {
    private_files_under_umask(0o022);
}

#[test]
fn private_files_are_private_under_umask_000() {
    private_files_under_umask(0o000);
}

// 9. An explicit `x-2` and the second `x` do not share an id.
#[test]
fn derived_id_suffixes_skip_ids_already_used() {
    let vault = TestVault::new("http://127.0.0.1:9", "");
    let call =
        |id: &str, q: &str| json!({ "name": "search_web", "id": id, "parameters": { "query": q } });
    let text = note_with_calls("Ids", &[call("x", "a"), call("x-2", "b"), call("x", "c")]);
    let path = vault.dir.path().join("ids.md");
    std::fs::write(&path, text).unwrap();
    let out = vault
        .cmd()
        .args(["check", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = v["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["x", "x-2", "x-3"]);
}

// 10. `vaultd status` shows only notes really in In_Progress.
#[tokio::test(flavor = "multi_thread")]
async fn status_lists_only_notes_really_in_progress() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook(Duration::from_secs(3)).await;
    let vault = slack_vault(&search, &slack, "");
    let daemon = vault.start();
    vault.drop_note("x.md", &slack_note("Deploy"));
    wait_for_send_in_flight(&vault, &slack).await;
    let running = vault.status_json()["running"].as_array().unwrap().len();
    assert_eq!(running, 1);
    daemon.kill9();
    vault.move_note("In_Progress", "Failed", "x.md");
    let status = vault.status_json();
    assert_eq!(status["running"], json!([]), "{status}");
}

// The journal of the previous release (schema 1) is migrated in place.
#[tokio::test(flavor = "multi_thread")]
async fn an_old_format_journal_is_migrated_in_place_and_recovery_uses_it() {
    let search = SearxServer::start(Duration::ZERO).await;
    let smtp = SmtpServer::start();
    let vault = TestVault::new(&search.base_url(), &smtp_config(&smtp));
    let text = mail_note("Old");
    let call_id = {
        let path = vault.dir.path().join("check-me.md");
        std::fs::write(&path, &text).unwrap();
        let out = vault
            .cmd()
            .args(["check", "--json"])
            .arg(&path)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["calls"][0]["call_id"].as_str().unwrap().to_string()
    };
    vault.drop_into("In_Progress", "mail.md", text.as_bytes());
    vault.drop_note(
        "new.md",
        &note_with_calls("New", &[search_call("after migration")]),
    );
    std::fs::create_dir_all(&vault.state).unwrap();
    {
        let db = rusqlite::Connection::open(vault.state.join("journal.sqlite")).unwrap();
        db.pragma_update(None, "journal_mode", "WAL").unwrap();
        db.execute_batch(V1_SCHEMA).unwrap();
        db.execute(
            "INSERT INTO runs (id, note, claimed_at_ms) VALUES (1, 'In_Progress/mail.md', 1)",
            [],
        )
        .unwrap();
        // The send started (external_side_effect, recorded) and never finished.
        db.execute(
            "INSERT INTO calls (run_id, call_id, tool, effect, params_json, started_at_ms)
             VALUES (1, ?1, 'send_notification', 'external_side_effect', '{}', 2)",
            [&call_id],
        )
        .unwrap();
        db.pragma_update(None, "user_version", 1).unwrap();
    }

    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let failed = vault.read("Failed", "mail.md");
    assert_eq!(
        only_result(&failed)["error"]["code"],
        "UNKNOWN_OUTCOME",
        "{failed}"
    );
    assert!(property(&failed, "tool_note").is_some(), "{failed}");
    assert!(smtp.received().is_empty(), "never sent again");
    let done = vault.read("Done", "new.md");
    assert_eq!(only_result(&done)["ok"], true);
    let db = rusqlite::Connection::open(vault.state.join("journal.sqlite")).unwrap();
    let version: i64 = db
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(
        version,
        vaultd::journal::SCHEMA_VERSION,
        "migrated to the newest schema"
    );
    let with_id: i64 = db
        .query_row(
            "SELECT count(*) FROM runs WHERE note_id IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        with_id, 2,
        "the old run adopted the note's id; the new run has one"
    );
}

/// The schema of the previous release (journal version 1), as it created it.
const V1_SCHEMA: &str = "CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        note TEXT NOT NULL,
        claimed_at_ms INTEGER NOT NULL,
        ended_at_ms INTEGER,
        final_state TEXT
    );
    CREATE INDEX runs_open ON runs (note) WHERE ended_at_ms IS NULL;
    CREATE TABLE calls (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs (id),
        call_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        effect TEXT,
        params_json TEXT,
        started_at_ms INTEGER,
        ended_at_ms INTEGER,
        result_json TEXT,
        error_code TEXT,
        written_at_ms INTEGER
    );
    CREATE INDEX calls_by_run ON calls (run_id, call_id);
    CREATE INDEX calls_by_tool ON calls (tool, started_at_ms);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        at_ms INTEGER NOT NULL,
        event TEXT NOT NULL,
        run_id INTEGER,
        note TEXT NOT NULL,
        call_id TEXT,
        tool TEXT,
        outcome TEXT,
        duration_ms INTEGER,
        detail TEXT
    );
    CREATE INDEX events_at ON events (at_ms);
    CREATE INDEX events_kind ON events (event, id);
    CREATE TABLE approvals (
        call_id TEXT NOT NULL,
        params_hash TEXT NOT NULL,
        note TEXT NOT NULL,
        decision TEXT NOT NULL,
        at_ms INTEGER NOT NULL,
        consumed_at_ms INTEGER,
        PRIMARY KEY (call_id, params_hash)
    );";

// 8. Bounded growth: a note of many calls, a huge parameter.
#[test]
fn a_note_with_many_calls_grows_by_at_most_twice_the_cap() {
    let vault = TestVault::new("http://127.0.0.1:9", "max_calls_per_note = 3\n");
    let calls: Vec<_> = (0..40)
        .map(|i| json!({ "name": "no_such_tool", "parameters": { "i": i } }))
        .collect();
    vault.drop_note("many.md", &note_with_calls("Many", &calls));
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let text = vault.read("Failed", "many.md");
    let results = results_in(&text);
    assert_eq!(results.len(), 6, "3 run, 3 QUOTA_EXCEEDED, 34 stay pending");
    let quota = results
        .iter()
        .filter(|r| r["error"]["code"] == "QUOTA_EXCEEDED")
        .count();
    assert_eq!(quota, 3);
    assert!(log.contains("34 more pending calls"), "{log}");
    let problems = vault.status_json()["problems"].to_string();
    assert!(problems.contains("34 more pending calls"), "{problems}");
}

#[test]
fn a_huge_parameter_is_not_copied_back_into_the_note() {
    let vault = TestVault::new("http://127.0.0.1:9", "max_note_bytes = 4000000\n");
    let query = "q".repeat(900_000);
    let text = note_with_calls("Huge", &[search_call(&query)]);
    vault.drop_note("huge.md", &text);
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let after = vault.read("Failed", "huge.md");
    assert_eq!(only_result(&after)["error"]["code"], "INVALID_PARAMS");
    assert!(
        after.len() < text.len() + 4_000,
        "{} bytes became {}",
        text.len(),
        after.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_result_that_would_overflow_the_note_goes_to_an_attachment() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "max_note_bytes = 8000\n");
    let query = "w".repeat(450);
    let call = json!({ "name": "search_web", "parameters": { "query": query, "num_results": 20 } });
    vault.drop_note("big.md", &note_with_calls("Big", &[call]));
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let text = vault.read("Done", "big.md");
    assert!(text.len() <= 8000, "{} bytes", text.len());
    let r = only_result(&text);
    assert_eq!(r["data"]["truncated"], true, "{text}");
    let id = property(&text, "tool_note").unwrap();
    let call_id = r["call_id"].as_str().unwrap();
    assert_eq!(
        r["data"]["full"],
        format!("[[Tool_Results/{id}/{call_id}]]"),
        "{text}"
    );
    let full = std::fs::read_to_string(vault.root.join(format!("Tool_Results/{id}/{call_id}.md")))
        .unwrap();
    assert!(full.matches("\"title\"").count() >= 10, "every result kept");
    let preview = r["data"]["preview"].as_str().unwrap();
    let whole: serde_json::Value = serde_json::from_str(
        full.split("json\n")
            .nth(1)
            .unwrap()
            .rsplit_once("\n```")
            .unwrap()
            .0,
    )
    .unwrap();
    assert!(
        whole.to_string().starts_with(preview.trim_end_matches('…')),
        "the preview is the start of the whole"
    );
    assert_eq!(
        r["data"]["bytes"].as_u64().unwrap() as usize,
        whole.to_string().len()
    );
}

// "Renamed in = read at once" (§9.1) and "`mv` of several notes always succeeds" (§1),
// together: a note renamed in is claimed by a hard link at once; its first name stays for
// `moved_in_grace` (here long, to look at it) and then goes.
#[tokio::test(flavor = "multi_thread")]
async fn a_note_renamed_in_runs_at_once_while_its_first_name_stays_for_the_grace() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "moved_in_grace = \"20s\"\n");
    let daemon = vault.start_logged("link-claim.log");
    let text = note_with_calls("Look", &[search_call("rust")]);
    let started = std::time::Instant::now();
    vault.drop_note("a.md", &text);
    let done = wait_in(&vault, &daemon, "Done", "a.md");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "ran inside the grace, not after it"
    );
    assert_eq!(only_result(&done)["ok"], true, "{done}");
    assert_eq!(
        vault.read("Needs_Action", "a.md"),
        text,
        "the first name stays, untouched, until the grace is over"
    );
    let status = daemon.terminate();
    assert!(status.success(), "{status:?}");
    assert_eq!(
        vault.all_notes(),
        vec!["Done/a.md".to_string()],
        "shutdown drops the first name"
    );
    assert_eq!(search.requests(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_name_goes_when_the_grace_is_over() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "moved_in_grace = \"1s\"\n");
    let daemon = vault.start_logged("link-claim-grace.log");
    vault.drop_note("a.md", &note_with_calls("Look", &[search_call("rust")]));
    wait_in(&vault, &daemon, "Done", "a.md");
    wait_until("the first name is dropped", DEADLINE, || {
        !vault.exists("Needs_Action", "a.md")
    });
    assert_eq!(vault.all_notes(), vec!["Done/a.md".to_string()]);
    assert_eq!(search.requests(), 1);
    drop(daemon);
}

// kill -9 inside the grace: the restart drops the first name (recorded with the claim) instead
// of taking it for a new note — no second note, no second result, nothing run twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_kill_inside_the_grace_leaves_no_second_note() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "moved_in_grace = \"30s\"\n");
    let daemon = vault.start_logged("link-claim-kill.log");
    vault.drop_note("a.md", &note_with_calls("Look", &[search_call("rust")]));
    wait_in(&vault, &daemon, "Done", "a.md");
    daemon.kill9();
    assert!(
        vault.exists("Needs_Action", "a.md"),
        "killed inside the grace"
    );
    let daemon = vault.start_logged("link-claim-restart.log");
    wait_until("the left-behind name is dropped", DEADLINE, || {
        !vault.exists("Needs_Action", "a.md")
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(vault.all_notes(), vec!["Done/a.md".to_string()]);
    assert_eq!(only_result(&vault.read("Done", "a.md"))["ok"], true);
    assert_eq!(search.requests(), 1, "nothing ran twice");
    drop(daemon);
}

// A note saved under the first name inside the grace is another file: never dropped.
#[tokio::test(flavor = "multi_thread")]
async fn a_note_saved_over_the_first_name_inside_the_grace_is_kept_and_run() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "moved_in_grace = \"2s\"\n");
    let daemon = vault.start_logged("link-claim-save.log");
    vault.drop_note("a.md", &note_with_calls("One", &[search_call("first")]));
    wait_in(&vault, &daemon, "Done", "a.md");
    // Another note, saved atomically under the same name while the first name still stands.
    vault.drop_note("a.md", &note_with_calls("Two", &[search_call("second")]));
    let second = wait_in(&vault, &daemon, "Done", "a (2).md");
    assert!(second.contains("Two"), "{second}");
    assert_eq!(only_result(&second)["ok"], true, "{second}");
    // The first note's grace ends first: its drop renames the name aside, finds the second
    // note there and puts it back, so `Needs_Action/` looks empty for an instant before the
    // second note's own grace ends. Waited for as a whole, not on that instant.
    let expected = vec!["Done/a (2).md".to_string(), "Done/a.md".to_string()];
    wait_until("every first name is dropped", DEADLINE, || {
        vault.all_notes() == expected
    });
    let mut queries = search.queries();
    queries.sort();
    assert_eq!(queries, vec!["first".to_string(), "second".to_string()]);
    drop(daemon);
}
