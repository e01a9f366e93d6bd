//! Synced vaults (docs/design.md §9.9, §9.6): one runner per vault, and old copies that come
//! back never send twice. The real binary on temp vaults, a loopback Slack webhook (wiremock),
//! a SearXNG-format search server; a second runner is simulated the way a sync client shows
//! it — notes with another `tool_runner` appearing by rename — and, in the two-daemon test, by
//! a real second daemon on a replica kept in sync by `util::sync`.

use crate::util::searx::SearxServer;
use crate::util::sync::SyncPair;
use crate::util::*;
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

/// A Slack webhook on 127.0.0.1 that answers `ok` after `delay`.
async fn slack_hook(delay: Duration) -> MockServer {
    let slack = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_string("ok")
                .set_delay(delay),
        )
        .mount(&slack)
        .await;
    slack
}

/// A vault whose `ops` Slack webhook is `slack`; `extra` is more config on top.
fn slack_vault(search: &SearxServer, slack: &MockServer, extra: &str) -> TestVault {
    let vault = TestVault::new(&search.base_url(), "");
    configure_slack(&vault, search, slack, extra);
    vault
}

fn configure_slack(vault: &TestVault, search: &SearxServer, slack: &MockServer, extra: &str) {
    let secret = vault.dir.path().join("slack-hook");
    std::fs::write(&secret, format!("{}/services/T000/B000/hook", slack.uri())).unwrap();
    vault.write_config(
        &search.base_url(),
        &format!(
            "{extra}\n[tools.send_notification]\ntimeout = \"20s\"\n[tools.send_notification.slack.webhooks]\nops = \"file:{}\"\n",
            secret.display()
        ),
    );
}

fn slack_send(subject: &str) -> Value {
    json!({ "name": "send_notification", "parameters": {
        "method": "slack", "recipient": "ops", "subject": subject, "body": "once" } })
}

/// The `text` of every Slack message the webhook got, in order.
async fn slack_texts(slack: &MockServer) -> Vec<String> {
    slack
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .map(|v| v["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// This daemon's runner id, as kept in its state dir.
fn runner_of(vault: &TestVault) -> String {
    std::fs::read_to_string(vault.state.join("runner_id"))
        .expect("the runner id is made at the first start")
        .trim()
        .to_string()
}

/// A note another runner finished: its frontmatter as vaultd writes it.
fn their_note(runner: &str, updated: SystemTime, status: &str) -> String {
    format!(
        "---\ntool_status: {status}\ntool_calls: 1\ntool_errors: 0\ntool_note: n-0123456789ab\ntool_runner: {runner}\ntool_updated: {}\n---\n# Theirs\n",
        humantime::format_rfc3339_seconds(updated)
    )
}

/// Sets a file's mtime (a sync client may keep the source's).
fn set_mtime(path: &std::path::Path, at: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(at)
        .unwrap();
}

/// `vaultd ARGS...` on the vault; (exit code, stdout, stderr).
fn vaultd(vault: &TestVault, args: &[&str]) -> (i32, String, String) {
    let out = vault.cmd().args(args).output().expect("run vaultd");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `vaultd run --take-over`, waited for until it is watching.
fn start_taking_over(vault: &TestVault, log: &str) -> RunningDaemon {
    let log = vault.dir.path().join(log);
    let file = std::fs::File::create(&log).unwrap();
    let child = vault
        .cmd()
        .args(["run", "--take-over"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("spawn vaultd run --take-over");
    let d = RunningDaemon { child, log };
    d.wait_for_log("vaultd started");
    d
}

/// `vaultd run`, expected to stop at start; returns its exit code and log.
fn run_refused(vault: &TestVault) -> (i32, String) {
    let out = vault
        .cmd()
        .arg("run")
        .stdin(Stdio::null())
        .output()
        .expect("run vaultd run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const HOUR: Duration = Duration::from_secs(3600);

// ---------------------------------------------------------------------------------------------
// 1. tool_runner at each claim, stable across restarts, shown by status.

#[tokio::test(flavor = "multi_thread")]
async fn each_claim_writes_this_daemons_runner_and_status_shows_it() {
    let search = SearxServer::start(Duration::from_millis(800)).await;
    let vault = TestVault::new(
        &search.base_url(),
        "[tools.vault]\nwrite = [\"Agent/**\"]\n",
    );
    let daemon = vault.start();
    let me = runner_of(&vault);
    let (host, hex) = me.rsplit_once('-').unwrap();
    assert!(!host.is_empty() && hex.len() == 4, "{me}");
    // A state_change call: the note is stamped at its claim, while the search still runs (a
    // note of only read_only calls is stamped with its results; tests/identity.rs).
    let make =
        json!({ "name": "vault_create", "parameters": { "path": "Agent/a.md", "content": "a" } });
    vault.drop_note("a.md", &note_with_calls("A", &[make, search_call("first")]));
    wait_until("the claimed note carries tool_runner", DEADLINE, || {
        std::fs::read_to_string(vault.path("In_Progress", "a.md"))
            .is_ok_and(|t| property(&t, "tool_runner").as_deref() == Some(me.as_str()))
    });
    let claimed = vault.read("In_Progress", "a.md");
    assert!(property(&claimed, "tool_note").is_some(), "{claimed}");
    let done = vault.wait_until_in("Done", "a.md");
    assert_eq!(property(&done, "tool_runner"), Some(me.clone()), "{done}");
    assert_eq!(daemon.terminate().code(), Some(0));

    // A restart keeps the id; the next round of the note is claimed under the same one.
    let again = format!(
        "{done}\n```json\n{}\n```\n",
        json!({ "tool_call": search_call("second") })
    );
    std::fs::remove_file(vault.path("Done", "a.md")).unwrap();
    vault.drop_note("a.md", &again);
    assert_eq!(vault.once().0, 0);
    let done = vault.read("Done", "a.md");
    assert_eq!(results_in(&done).len(), 3, "{done}");
    assert_eq!(property(&done, "tool_runner"), Some(me.clone()));
    assert_eq!(runner_of(&vault), me);

    let (code, out, err) = vaultd(&vault, &["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("runner {me}")), "{out}");
    assert!(!out.contains("paused"), "{out}");
    let status = vault.status_json();
    assert_eq!(status["runner"], json!(me));
    assert_eq!(status["paused"], Value::Null);
}

// ---------------------------------------------------------------------------------------------
// 2. Start-up: another runner's recent note stops `run` and `once`, naming it and the ways out.

#[tokio::test(flavor = "multi_thread")]
async fn start_up_stops_on_another_runners_recent_note_and_names_the_ways_out() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    let pending = note_with_calls("Mine", &[search_call("waits")]);
    vault.drop_note("mine.md", &pending);
    vault.drop_into(
        "Done",
        "work/theirs.md",
        their_note("laptop-beef", SystemTime::now() - HOUR, "done").as_bytes(),
    );
    for run in [false, true] {
        let (code, err) = if run {
            run_refused(&vault)
        } else {
            vault.once()
        };
        assert_ne!(code, 0, "{err}");
        for needle in [
            "second runner",
            "Done/work/theirs.md",
            "laptop-beef",
            "host laptop",
            "stop vaultd on laptop",
            "--take-over",
            "runner_window = 1day",
        ] {
            assert!(err.contains(needle), "{needle:?} missing: {err}");
        }
    }
    assert_eq!(vault.read("Needs_Action", "mine.md"), pending, "untouched");
    assert!(search.queries().is_empty());

    // Older than runner_window (by tool_updated, whatever the file's mtime): history.
    vault.write_config(&search.base_url(), "runner_window = \"30m\"\n");
    let (code, err) = vault.once();
    assert_eq!(code, 0, "{err}");
    assert!(vault.exists("Done", "mine.md"));
}

#[tokio::test(flavor = "multi_thread")]
async fn old_notes_are_not_read_at_start_up_and_a_claim_in_progress_counts_too() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    // A foreign stamp in a file not touched for two days is not even read (mtime filter) —
    // and it is outside the window anyway.
    let old = vault.drop_into(
        "Failed",
        "old.md",
        their_note("laptop-beef", SystemTime::now() - 48 * HOUR, "failed").as_bytes(),
    );
    set_mtime(&old, SystemTime::now() - 48 * HOUR);
    assert_eq!(vault.once().0, 0);
    // A claim of the other runner in In_Progress/, a minute old.
    vault.drop_into(
        "In_Progress",
        "busy.md",
        their_note(
            "laptop-beef",
            SystemTime::now() - Duration::from_secs(60),
            "in_progress",
        )
        .as_bytes(),
    );
    let (code, err) = vault.once();
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("In_Progress/busy.md"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// 3. --take-over: recorded, later restarts do not ask; the other host's later notes stop it.

#[tokio::test(flavor = "multi_thread")]
async fn a_take_over_is_recorded_and_the_other_hosts_later_notes_stop_it_again() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook(Duration::ZERO).await;
    let vault = slack_vault(&search, &slack, "");
    vault.drop_into(
        "Done",
        "theirs.md",
        their_note("laptop-beef", SystemTime::now() - HOUR, "done").as_bytes(),
    );
    // The other host died mid-send: its claim is in In_Progress/, unknown to our journal.
    let mut stranded = note_with_calls("Stranded", &[slack_send("stranded")]);
    stranded.insert_str(
        0,
        &format!(
            "---\ntool_note: n-00000000beef\ntool_runner: laptop-beef\ntool_updated: {}\n---\n",
            humantime::format_rfc3339_seconds(SystemTime::now() - HOUR)
        ),
    );
    vault.drop_into("In_Progress", "stranded.md", stranded.as_bytes());
    vault.drop_note("mine.md", &note_with_calls("Mine", &[search_call("mine")]));
    assert_ne!(vault.once().0, 0);

    let (code, _, err) = vaultd(&vault, &["once", "--take-over"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--take-over"), "{err}");
    assert!(vault.exists("Done", "mine.md"));
    // §8.15: recovered as unknown to this journal: not sent again.
    let failed = vault.read("Failed", "stranded.md");
    assert!(failed.contains("UNKNOWN_OUTCOME"), "{failed}");
    assert!(slack_texts(&slack).await.is_empty());
    let me = runner_of(&vault);
    assert_eq!(property(&failed, "tool_runner"), Some(me.clone()));

    // Later restarts do not ask again.
    vault.drop_note("next.md", &note_with_calls("Next", &[search_call("next")]));
    let (code, err) = vault.once();
    assert_eq!(code, 0, "{err}");
    assert!(vault.exists("Done", "next.md"));

    // A note that host updates after the take-over stops start-up again.
    std::thread::sleep(Duration::from_millis(1100)); // tool_updated has whole seconds
    vault.drop_into(
        "Done",
        "later.md",
        their_note("laptop-beef", SystemTime::now(), "done").as_bytes(),
    );
    let (code, err) = vault.once();
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("Done/later.md"), "{err}");
    let journal = vault.journal();
    assert!(journal.taken_over_at().unwrap().is_some());
}

// ---------------------------------------------------------------------------------------------
// 4. While running: another runner's activity pauses claiming; running calls finish.

#[tokio::test(flavor = "multi_thread")]
async fn another_runners_note_pauses_claiming_while_running_calls_finish() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook(Duration::from_millis(1500)).await;
    let vault = slack_vault(
        &search,
        &slack,
        "[notify]\non_hold = { method = \"slack\", recipient = \"ops\" }\n",
    );
    let daemon = vault.start_logged("paused.log");
    vault.drop_note(
        "first.md",
        &note_with_calls("First", &[slack_send("first")]),
    );
    wait_until("the first send is in flight", DEADLINE, || {
        !vault.journal().running_calls().unwrap().is_empty()
    });
    // The other runner's claim reaches In_Progress/ by rename, as a sync client delivers it.
    vault.drop_into(
        "In_Progress",
        "theirs.md",
        their_note("laptop-beef", SystemTime::now(), "in_progress").as_bytes(),
    );
    daemon.wait_for_log("paused: second runner on laptop");
    // The running call finishes and its note moves on.
    let first = vault.wait_until_in("Done", "first.md");
    assert_eq!(results_in(&first)[0]["ok"], true, "{first}");

    // Nothing new is claimed.
    vault.drop_note(
        "second.md",
        &note_with_calls("Second", &[slack_send("second")]),
    );
    vault.drop_into(
        "Done",
        "theirs-too.md",
        their_note("laptop-beef", SystemTime::now(), "done").as_bytes(),
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(vault.exists("Needs_Action", "second.md"));
    // Seen (the debug lines of its event), never claimed or run.
    assert!(
        !daemon
            .log_text()
            .lines()
            .any(|l| l.contains("second.md") && (!l.contains(" DEBUG ") || l.contains("claimed"))),
        "{}",
        daemon.log_text()
    );

    // One error line; status (another process) says paused and how to resume.
    let log = daemon.log_text();
    assert_eq!(log.matches("paused: second runner").count(), 1, "{log}");
    assert!(log.contains("ERROR"), "{log}");
    let (code, out, err) = vaultd(&vault, &["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("paused: second runner on laptop"), "{out}");
    assert!(out.contains("--take-over"), "{out}");
    assert!(out.contains("In_Progress/theirs.md"), "{out}");
    let status = vault.status_json();
    assert_eq!(status["paused"]["host"], "laptop");
    assert_eq!(status["paused"]["runner"], "laptop-beef");

    // The hold alert channel says it once; the paused note's send never went out.
    wait_until("the alert arrives", DEADLINE, || {
        let texts = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(slack_texts(&slack))
        });
        texts.iter().any(|t| t.contains("second runner on laptop"))
    });
    let texts = slack_texts(&slack).await;
    assert_eq!(
        texts.iter().filter(|t| t.contains("second runner")).count(),
        1,
        "{texts:?}"
    );
    assert!(
        !texts.iter().any(|t| t.starts_with("*second*")),
        "{texts:?}"
    );
    assert_eq!(texts.len(), 2, "the first send and the alert: {texts:?}");

    // A restart does not resume silently: the other runner's notes are recent.
    assert_eq!(daemon.terminate().code(), Some(0));
    let (code, err) = vault.once();
    assert_ne!(code, 0, "{err}");
    // Taking over resumes.
    let (code, _, err) = vaultd(&vault, &["once", "--take-over"]);
    assert_eq!(code, 0, "{err}");
    assert!(vault.exists("Done", "second.md"));
    assert_eq!(vault.status_json()["paused"], Value::Null);
}

#[tokio::test(flavor = "multi_thread")]
async fn own_moves_and_old_or_taken_over_notes_do_not_pause() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    let daemon = vault.start_logged("calm.log");
    for i in 0..5 {
        vault.drop_note(
            &format!("n{i}.md"),
            &note_with_calls("N", &[search_call(&format!("q{i}"))]),
        );
    }
    for i in 0..5 {
        vault.wait_until_in("Done", &format!("n{i}.md"));
    }
    // A person files an old note of another runner into Done/ by hand: history.
    vault.drop_into(
        "Done",
        "archive.md",
        their_note("laptop-beef", SystemTime::now() - 48 * HOUR, "done").as_bytes(),
    );
    // A person edits one of ours in place.
    let p = vault.path("Done", "n0.md");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, format!("{text}\nA comment.\n")).unwrap();
    vault.drop_note(
        "after.md",
        &note_with_calls("After", &[search_call("after")]),
    );
    vault.wait_until_in("Done", "after.md");
    assert!(
        !daemon.log_text().contains("paused"),
        "{}",
        daemon.log_text()
    );
}

// ---------------------------------------------------------------------------------------------
// 5. §9.6: a copy without tool_note at the path a note was claimed from.

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_copy_within_the_grace_gets_the_recorded_results_and_runs_nothing() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook(Duration::ZERO).await;
    let vault = slack_vault(&search, &slack, "");
    let original = note_with_calls("Deploy", &[slack_send("deploy"), search_call("status")]);
    vault.drop_note("c.md", &original);
    assert_eq!(vault.once().0, 0);
    let first = vault.read("Done", "c.md");
    // The sync client brings the version from before the claim back (no tool_note).
    vault.drop_note("c.md", &original);
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let copy = vault.read("Done", "c (2).md");
    assert_eq!(results_in(&copy), results_in(&first), "{copy}");
    assert_eq!(slack_texts(&slack).await.len(), 1, "sent once");
    assert_eq!(search.queries(), vec!["status"], "searched once");
    assert_ne!(property(&copy, "tool_note"), property(&first, "tool_note"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_copy_after_the_grace_holds_what_ran_and_runs_reads_and_new_calls() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook(Duration::ZERO).await;
    let vault = slack_vault(
        &search,
        &slack,
        "stale_copy_grace = \"1s\"\nstale_copy_window = \"1h\"\n",
    );
    let original = note_with_calls("Deploy", &[slack_send("deploy"), search_call("status")]);
    vault.drop_note("c.md", &original);
    assert_eq!(vault.once().0, 0);
    std::thread::sleep(Duration::from_millis(1500));
    // Days later in real life: the old copy comes back, with a new call written into it.
    let mut fresh = slack_send("fresh");
    fresh["id"] = json!("fresh-1");
    let copy = format!(
        "{original}\n```json\n{}\n```\n",
        json!({ "tool_call": fresh })
    );
    vault.drop_note("c.md", &copy);
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let held = vault.read("Pending_Approval", "c.md");
    assert!(held.contains("[!question]"), "{held}");
    assert!(held.contains("already ran at"), "{held}");
    assert!(held.contains("from Done/c.md"), "{held}");
    let results = results_in(&held);
    let ids: Vec<&str> = results
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["search_web", "send_notification"], "{held}");
    assert_eq!(
        search.queries(),
        vec!["status", "status"],
        "read_only runs again"
    );
    let texts = slack_texts(&slack).await;
    assert_eq!(
        texts.len(),
        2,
        "deploy once, the new explicit-id call once: {texts:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Two daemons on two replicas of one vault, kept in sync with a delay.

/// Every note's title (`# title`) per folder, across the vault, conflict copies excluded.
fn titles(vault: &TestVault) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for rel in vault.all_notes() {
        if rel.contains(".sync-conflict-") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(vault.root.join(&rel)) else {
            continue;
        };
        if let Some(t) = text.lines().find_map(|l| l.strip_prefix("# ")) {
            let folder = rel.split('/').next().unwrap_or("").to_string();
            out.push((folder, t.to_string()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn two_daemons_on_synced_replicas_one_runs_the_other_refuses_a_take_over_pauses_the_first() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook(Duration::from_millis(50)).await;
    let a = slack_vault(&search, &slack, "");
    let b = TestVault::new(&search.base_url(), "");
    configure_slack(&b, &search, &slack, "");
    std::fs::create_dir_all(a.root.join("Needs_Action")).unwrap();
    let _sync = SyncPair::start(&a.root, &b.root, Duration::from_millis(300));
    let note = |n: usize| note_with_calls(&format!("note-{n}"), &[slack_send(&format!("s{n}"))]);

    // A runs; notes dropped on either replica run once, on A.
    let daemon_a = a.start_logged("a.log");
    let me_a = runner_of(&a);
    for n in 0..4 {
        let at = if n % 2 == 0 { &a } else { &b };
        at.drop_note(&format!("n{n}.md"), &note(n));
    }
    for n in 0..4 {
        b.wait_until_in("Done", &format!("n{n}.md"));
    }
    // And the sync has taken them out of B's Needs_Action: a note B still finds there when it
    // takes over is one it never heard of (a replica's daemon cannot know A ran it: the
    // docs/reliability.md's "inside the sync delay" case), which would make it a second send.
    wait_until("B's inbox is synced", DEADLINE, || {
        (0..4).all(|n| !b.path("Needs_Action", &format!("n{n}.md")).exists())
    });
    // B on the replica refuses, naming A.
    let (code, err) = run_refused(&b);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains(&me_a), "{err}");
    assert!(err.contains("--take-over"), "{err}");

    // The misuse: B takes over while A still runs, with notes streaming in on both sides.
    let daemon_b = start_taking_over(&b, "b.log");
    let started = Instant::now();
    let mut n = 4;
    // Whichever sees the other's update first pauses: usually A (B's first note reaches it),
    // but under load B may see one of A's first and pause instead; after that B writes
    // nothing A could see. Either way one runner is left.
    let paused = |d: &RunningDaemon| d.log_text().contains("paused: second runner");
    let stopped = loop {
        if paused(&daemon_a) {
            break &daemon_a;
        }
        if paused(&daemon_b) {
            break &daemon_b;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "neither paused; A:\n{}\nB:\n{}",
            daemon_a.log_text(),
            daemon_b.log_text()
        );
        let at = if n % 2 == 0 { &a } else { &b };
        at.drop_note(&format!("n{n}.md"), &note(n));
        n += 1;
        std::thread::sleep(Duration::from_millis(150));
    };
    let paused_at = n;
    // From now on nothing runs on the paused one: later notes are never claimed there.
    for k in paused_at..paused_at + 4 {
        let at = if k % 2 == 0 { &a } else { &b };
        at.drop_note(&format!("n{k}.md"), &note(k));
    }
    let total = paused_at + 4;
    std::thread::sleep(Duration::from_secs(3));
    let log = stopped.log_text();
    let after_pause = &log[log.find("paused: second runner").unwrap()..];
    for k in paused_at..total {
        // Its events are still seen (debug lines); it is never claimed or run.
        let touched = after_pause.lines().any(|l| {
            l.contains(&format!("n{k}.md")) && (!l.contains(" DEBUG ") || l.contains("claimed"))
        });
        assert!(!touched, "n{k}.md touched after the pause:\n{after_pause}");
    }

    // No note lost: every note is somewhere in each replica's state folders, conflict copies
    // aside.
    let texts = slack_texts(&slack).await;
    for vault in [&a, &b] {
        let have = titles(vault);
        for k in 0..total {
            let t = format!("note-{k}");
            assert!(
                have.iter().any(|(_, title)| *title == t),
                "{t} lost in {}: {have:?}",
                vault.root.display()
            );
        }
    }
    // Deliveries: at most one per note, except notes both daemons claimed inside the sync
    // delay before either saw the other (docs/reliability.md, "Synced vaults"); none for notes dropped after
    // the pause ran twice.
    for k in 0..total {
        let sent = texts
            .iter()
            .filter(|t| t.starts_with(&format!("*s{k}*")))
            .count();
        let limit = if k < 4 || k >= paused_at { 1 } else { 2 };
        assert!(sent <= limit, "s{k} delivered {sent} times: {texts:?}");
    }
    drop(daemon_b);
    drop(daemon_a);
}

// ---------------------------------------------------------------------------------------------
// §9.10 through a sync client: duplicates made on a replica under the names sync clients give
// them (iCloud's `x 2.md` of the note as claimed; Google Drive's, OneDrive's and Seafile's of
// the original) reach the runner by the client's temp file + rename: each gets the recorded
// result, nothing is sent twice; a note of that name with other text runs.

#[tokio::test(flavor = "multi_thread")]
async fn duplicates_a_sync_client_brings_from_a_replica_are_not_sent_again() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = slack_hook(Duration::ZERO).await;
    let a = slack_vault(&search, &slack, "");
    let b = TestVault::new(&search.base_url(), "");
    std::fs::create_dir_all(a.root.join("Needs_Action")).unwrap();
    let _sync = SyncPair::start(&a.root, &b.root, Duration::from_millis(200));
    let daemon = a.start_logged("duplicates.log");
    let original = note_with_calls("Deploy", &[slack_send("deploy")]);
    b.drop_note("x.md", &original);
    let done = b.wait_until_in("Done", "x.md");
    let id = property(&done, "tool_note").expect("stamped at the claim");
    let as_claimed = format!("---\ntool_note: {id}\n---\n{original}");
    let copies = [
        ("x 2.md", &as_claimed),
        ("x (1).md", &original),
        ("x-LAPTOP-4F2A.md", &original),
        (
            "x (SFConflict ana@example.com 2026-11-24-10-15-00).md",
            &original,
        ),
    ];
    for (name, text) in copies {
        b.drop_note(name, text);
    }
    let other = note_with_calls("Deploy", &[slack_send("another")]);
    b.drop_note("x 3.md", &other);
    for (name, _) in copies {
        let copy = b.wait_until_in("Done", name);
        assert_eq!(
            results_in(&copy),
            results_in(&done),
            "{name}: {copy}\nlog:\n{}",
            daemon.log_text()
        );
    }
    b.wait_until_in("Done", "x 3.md");
    let texts = slack_texts(&slack).await;
    assert_eq!(texts.len(), 2, "deploy once, another once: {texts:?}");
    drop(daemon);
}

// ---------------------------------------------------------------------------------------------
// docs/design.md §9.14: a `tool_updated` in the future (the other host's clock is ahead) is named as
// such, and `--take-over` always works; that host's later notes still stop start-up.

#[tokio::test(flavor = "multi_thread")]
async fn a_future_dated_note_is_named_as_such_and_take_over_always_works() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    vault.drop_into(
        "Done",
        "ahead.md",
        their_note("laptop-beef", SystemTime::now() + 2 * HOUR, "done").as_bytes(),
    );
    vault.drop_note("mine.md", &note_with_calls("Mine", &[search_call("mine")]));
    let (code, err) = run_refused(&vault);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("Done/ahead.md"), "{err}");
    assert!(err.contains("in the future"), "{err}");

    // `run --take-over` starts and works the vault.
    let daemon = start_taking_over(&vault, "take-over.log");
    vault.wait_until_in("Done", "mine.md");
    assert_eq!(daemon.terminate().code(), Some(0));
    // Later restarts do not ask again.
    vault.drop_note("next.md", &note_with_calls("Next", &[search_call("next")]));
    let (code, err) = vault.once();
    assert_eq!(code, 0, "{err}");
    assert!(vault.exists("Done", "next.md"));

    // That host, its clock still ahead, updates a note later: start-up stops again.
    vault.drop_into(
        "Done",
        "ahead-later.md",
        their_note(
            "laptop-beef",
            SystemTime::now() + 2 * HOUR + HOUR / 4,
            "done",
        )
        .as_bytes(),
    );
    let (code, err) = vault.once();
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("Done/ahead-later.md"), "{err}");
}
