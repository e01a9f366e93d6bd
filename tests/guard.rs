//! Guardrails (docs/design.md §12) end to end with the real binary: dry run previews that touch
//! nothing, the note budget across agent rounds, circuit breakers against a failing search
//! server, hold alerts to a loopback Slack webhook, and escaped untrusted text.

use crate::util::searx::{Answer, SearxServer};
use crate::util::*;
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};
use wiremock::MockServer;

/// Every `tool_preview` JSON in a note, in order.
fn previews_in(text: &str) -> Vec<Value> {
    json_blocks_in(text)
        .into_iter()
        .filter_map(|v| v.get("tool_preview").cloned())
        .collect()
}

/// Every JSON object in a `> ```json` fence of a callout.
fn json_blocks_in(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let body = line.strip_prefix("> ");
        match (body, current.as_mut()) {
            (Some(b), None) if b.starts_with("```json") => current = Some(String::new()),
            (Some(b), Some(_)) if b.starts_with("```") => {
                if let Ok(v) = serde_json::from_str(&current.take().unwrap()) {
                    out.push(v);
                }
            }
            (Some(b), Some(buf)) => {
                buf.push_str(b);
                buf.push('\n');
            }
            _ => {}
        }
    }
    out
}

fn send(method: &str, recipient: &str) -> Value {
    json!({ "name": "send_notification", "parameters": {
        "method": method, "recipient": recipient, "subject": "Weekly report", "body": "All green.\nSee you." } })
}

// ---------------------------------------------------------------------------------------------
// Dry run

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_previews_every_builtin_call_and_nothing_runs() {
    let search = SearxServer::start(Duration::ZERO).await;
    let hooks = webhook_server(200).await;
    let smtp = SmtpServer::start();
    let vault = TestVault::new(&search.base_url(), "");
    let slack_ref = secret_file(
        &vault,
        "slack",
        &format!("{}/services/T0/B0/SLACKSECRET", hooks.uri()),
    );
    let discord_ref = secret_file(
        &vault,
        "discord",
        &format!("{}/api/webhooks/1/DISCORDSECRET", hooks.uri()),
    );
    vault.write_config(
        &search.base_url(),
        &format!(
            "[tools.send_notification]\nallowed_recipients = [\"me@example.com\"]\n\
             [tools.send_notification.email]\ntransport = \"smtp\"\nsmtp_url = \"smtp://127.0.0.1:{}\"\nfrom = \"Agent <agent@example.com>\"\n\
             [tools.send_notification.slack.webhooks]\nops = {slack_ref:?}\n\
             [tools.send_notification.discord.webhooks]\nalerts = {discord_ref:?}\n",
            smtp.port
        ),
    );
    let calls = [
        search_call("dry run \u{202e}news"),
        send("email", "me@example.com"),
        send("email", "stranger@example.net"),
        send("slack", "ops"),
        send("discord", "alerts"),
        send("slack", "https://evil.example/hook"),
        json!({ "name": "no_such_tool", "parameters": {} }),
    ];
    let text = note_with_calls("Plan", &calls);
    let before_files = {
        vault.drop_into("Dry_Run", "plan.md", text.as_bytes());
        vault.all_files()
    };

    let (code, stderr) = vault.once();
    assert_eq!(code, 0, "{stderr}");
    let after = vault.read("Dry_Run", "plan.md");
    assert!(after.starts_with("---\n"), "{after}");
    assert_eq!(property(&after, "tool_status").as_deref(), Some("dry_run"));
    assert!(after.contains(&text), "the note's own text is kept");
    let previews = previews_in(&after);
    assert_eq!(previews.len(), calls.len(), "{after}");
    assert_eq!(
        after.matches("> [!example]- preview · ").count(),
        calls.len()
    );

    // search_web: read-only, what it would ask.
    let p = &previews[0];
    assert_eq!(p["name"], "search_web");
    assert_eq!(p["effect"], "read_only");
    assert_eq!(p["decision"]["action"], "run");
    assert_eq!(p["parameters"]["query"], "dry run \u{202e}news");
    assert!(
        p["would"]["description"]
            .as_str()
            .unwrap()
            .contains("searxng"),
        "{p}"
    );
    let added = &after[after.find("[!example]").unwrap()..];
    assert!(
        !added.contains('\u{202e}'),
        "untrusted text is escaped in previews too"
    );
    assert!(added.contains("dry run \\u202enews"), "{added}");

    // The email as it would be sent: headers and body.
    let p = &previews[1];
    assert_eq!(p["effect"], "external_side_effect");
    assert_eq!(p["decision"]["action"], "run");
    let email = p["would"]["email"].as_str().unwrap();
    for needle in [
        "From: Agent <agent@example.com>",
        "To: me@example.com",
        "Subject: Weekly report",
        &format!("Message-ID: <{}@", p["call_id"].as_str().unwrap()),
        "All green.",
    ] {
        assert!(email.contains(needle), "{needle:?} missing from {email}");
    }
    assert!(
        p["would"]["transport"]
            .as_str()
            .unwrap()
            .contains("SMTP server 127.0.0.1")
    );

    // Held, and why.
    let p = &previews[2];
    assert_eq!(p["decision"]["action"], "hold");
    assert!(
        p["decision"]["reason"]
            .as_str()
            .unwrap()
            .contains("not in allowed_recipients")
    );

    // The webhooks' JSON bodies; the URLs (secrets) nowhere.
    assert_eq!(
        previews[3]["would"]["json"],
        json!({ "text": "*Weekly report*\nAll green.\nSee you." })
    );
    assert_eq!(previews[3]["would"]["webhook"], "ops");
    assert_eq!(
        previews[4]["would"]["json"],
        json!({ "content": "**Weekly report**\nAll green.\nSee you.", "allowed_mentions": { "parse": [] } })
    );
    assert!(!after.contains("SLACKSECRET") && !after.contains("DISCORDSECRET"));

    // Denied, and why.
    assert_eq!(previews[5]["decision"]["action"], "deny");
    assert_eq!(previews[5]["decision"]["code"], "POLICY_DENIED");
    assert_eq!(previews[6]["decision"]["code"], "UNKNOWN_TOOL");

    // Nothing ran: no request anywhere, no mail, no journal record, no other file.
    assert_eq!(search.requests(), 0);
    assert!(hooks.received_requests().await.unwrap().is_empty());
    assert!(smtp.received().is_empty());
    assert_eq!(vault.all_files(), before_files);
    let log = vault.cmd().args(["log", "--json"]).output().unwrap();
    for line in String::from_utf8_lossy(&log.stdout).lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        assert!(
            entry["call_id"].is_null(),
            "nothing journaled about a call: {line}"
        );
    }
    let status = vault.status_json();
    assert_eq!(status["rate_limits"][0]["last_hour"], 0);

    // Written once: another pass changes nothing.
    let (code, _) = vault.once();
    assert_eq!(code, 0);
    assert_eq!(vault.read("Dry_Run", "plan.md"), after);

    // `vaultd check --preview` prints the same previews and touches nothing.
    let out = vault
        .cmd()
        .args(["check", "--preview", "--json"])
        .arg(vault.path("Dry_Run", "plan.md"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a denied call makes check fail");
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let printed = printed["previews"].as_array().unwrap().clone();
    assert_eq!(printed.len(), previews.len());
    for (a, b) in printed.iter().zip(&previews) {
        let strip = |v: &Value| {
            let mut v = v.clone();
            // The email's Date header is the time of printing.
            v["would"].as_object_mut().map(|o| o.remove("email"));
            v
        };
        assert_eq!(strip(a), strip(b));
    }
    let human = vault
        .cmd()
        .args(["check", "--preview"])
        .arg(vault.path("Dry_Run", "plan.md"))
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("> [!example]- preview · send_notification · would hold"),
        "{human}"
    );
    assert_eq!(vault.read("Dry_Run", "plan.md"), after);
    assert_eq!(search.requests(), 0);
    assert!(smtp.received().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_previews_a_dropped_note_and_moving_it_runs_it_for_real() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    let daemon = vault.start();
    let note = note_with_calls("Try", &[search_call("vaultd guardrails")]);
    vault.drop_into("Dry_Run", "try.md", note.as_bytes());
    wait_until("the preview is written", DEADLINE, || {
        std::fs::read_to_string(vault.path("Dry_Run", "try.md"))
            .is_ok_and(|t| t.contains("[!example]-"))
    });
    let previewed = vault.read("Dry_Run", "try.md");
    assert_eq!(previews_in(&previewed).len(), 1);
    assert_eq!(search.requests(), 0);

    // Moving it to Needs_Action runs it; the preview stays inert in the note.
    vault.move_note("Dry_Run", "Needs_Action", "try.md");
    let done = vault.wait_until_in("Done", "try.md");
    assert_eq!(results_in(&done).len(), 1);
    assert_eq!(results_in(&done)[0]["ok"], true);
    assert!(search.requests() >= 1);
    assert_eq!(previews_in(&done).len(), 1);
    assert_eq!(daemon.terminate().code(), Some(0));
}

// ---------------------------------------------------------------------------------------------
// Note budget

/// The agent's side of the loop: wait for the note to come back, append a call, move it in.
fn agent_round(vault: &TestVault, rel: &str, round: usize) -> String {
    let (folder, text) = loop {
        if let Some(f) = ["Done", "Failed"]
            .into_iter()
            .find(|f| vault.exists(f, rel))
        {
            break (f, vault.wait_until_in(f, rel));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let next = format!(
        "{text}\n```json\n{}\n```\n",
        json!({ "tool_call": search_call(&format!("round {round}")) })
    );
    std::fs::write(vault.path(folder, rel), next).unwrap();
    vault.move_note(folder, "Needs_Action", rel);
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_loop_stops_when_the_note_budget_is_spent() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "note_budget = 3\n");
    let daemon = vault.start();
    vault.drop_note(
        "loop.md",
        &note_with_calls(
            "Loop",
            &[search_call("round 0 a"), search_call("round 0 b")],
        ),
    );
    for round in 1..=3 {
        agent_round(&vault, "loop.md", round);
    }
    let last = loop {
        if let Some(f) = ["Done", "Failed"]
            .into_iter()
            .find(|f| vault.exists(f, "loop.md"))
        {
            break vault.wait_until_in(f, "loop.md");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(daemon.terminate().code(), Some(0));
    let results = results_in(&last);
    assert_eq!(results.len(), 5, "{last}");
    let ok = results.iter().filter(|r| r["ok"] == true).count();
    assert_eq!(ok, 3, "three calls ran, then the budget was spent: {last}");
    for r in &results[3..] {
        assert_eq!(r["error"]["code"], "QUOTA_EXCEEDED");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("note budget spent")
        );
    }
    assert!(vault.exists("Failed", "loop.md"));
    // The budget spent no request: three searches' worth reached the server.
    let queries = search.queries();
    assert!(
        !queries.iter().any(|q| q == "round 2" || q == "round 3"),
        "{queries:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_note_budget_holds_across_once_runs() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "note_budget = 2\n");
    vault.drop_note(
        "n.md",
        &note_with_calls("N", &[search_call("a"), search_call("b"), search_call("c")]),
    );
    assert_eq!(vault.once().0, 0);
    let text = vault.wait_until_in("Failed", "n.md");
    let results = results_in(&text);
    assert_eq!(results[0]["ok"], true);
    assert_eq!(results[1]["ok"], true);
    assert_eq!(results[2]["error"]["code"], "QUOTA_EXCEEDED");
    // Back again with one more call: still spent, in a new process.
    let next = format!(
        "{text}\n```json\n{}\n```\n",
        json!({ "tool_call": search_call("d") })
    );
    std::fs::write(vault.path("Failed", "n.md"), next).unwrap();
    vault.move_note("Failed", "Needs_Action", "n.md");
    assert_eq!(vault.once().0, 0);
    let text = vault.wait_until_in("Failed", "n.md");
    let results = results_in(&text);
    assert_eq!(results.len(), 4);
    assert_eq!(results[3]["error"]["code"], "QUOTA_EXCEEDED");
    assert_eq!(search.queries().iter().filter(|q| *q == "d").count(), 0);

    // A dry run of the same note says so before it is moved in again.
    let next = format!(
        "{text}\n```json\n{}\n```\n",
        json!({ "tool_call": search_call("e") })
    );
    vault.drop_into("Dry_Run", "n.md", next.as_bytes());
    assert_eq!(vault.once().0, 0);
    let previews = previews_in(&vault.read("Dry_Run", "n.md"));
    assert_eq!(previews.len(), 1);
    assert_eq!(previews[0]["decision"]["code"], "QUOTA_EXCEEDED");
}

// ---------------------------------------------------------------------------------------------
// Circuit breaker

fn until_of(result: &Value) -> SystemTime {
    let until = result["error"]["details"]["open_until"].as_str().unwrap();
    humantime::parse_rfc3339(until).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn five_failures_open_the_circuit_then_one_trial_closes_it() {
    let search = SearxServer::start(Duration::ZERO).await;
    search.set_answer(Answer::ServerError);
    let vault = TestVault::new(
        &search.base_url(),
        "[circuit_breaker]\nopen_for = \"5s\"\n[tools.search_web]\ntimeout = \"1s\"\n",
    );
    let daemon = vault.start();
    let five: Vec<Value> = (0..5).map(|i| search_call(&format!("down {i}"))).collect();
    vault.drop_note("a.md", &note_with_calls("A", &five));
    let a = vault.wait_until_in("Failed", "a.md");
    for r in results_in(&a) {
        let code = r["error"]["code"].as_str().unwrap();
        assert!(code == "EXECUTION_ERROR" || code == "TIMEOUT", "{a}");
        assert_eq!(r["error"]["retryable"], true);
    }
    let asked = search.requests();
    assert!(asked >= 5);
    daemon.wait_for_log("circuit open until");

    let status = vault.status_json();
    assert_eq!(status["open_circuits"][0]["key"], "search_web", "{status}");
    assert_eq!(status["open_circuits"][0]["state"], "open");
    let human = vault.cmd().arg("status").output().unwrap();
    assert!(String::from_utf8_lossy(&human.stdout).contains("open circuits"));

    // Open: the call fails at once, without a request.
    vault.drop_note("b.md", &note_with_calls("B", &[search_call("still down")]));
    let b = vault.wait_until_in("Failed", "b.md");
    let r = &results_in(&b)[0];
    assert_eq!(r["error"]["code"], "EXECUTION_ERROR");
    assert_eq!(r["error"]["retryable"], true);
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("circuit open until "),
        "{r}"
    );
    assert_eq!(
        search.requests(),
        asked,
        "no request while the circuit is open"
    );
    // A dry run and `check --preview` say the call would fail at once.
    let probe = note_with_calls("P", &[search_call("probe")]);
    vault.drop_into("Dry_Run", "p.md", probe.as_bytes());
    wait_until("the preview is written", DEADLINE, || {
        vault.read("Dry_Run", "p.md").contains("[!example]-")
    });
    let p = &previews_in(&vault.read("Dry_Run", "p.md"))[0];
    assert_eq!(p["decision"]["code"], "EXECUTION_ERROR", "{p}");
    let out = vault
        .cmd()
        .args(["check", "--preview", "--json"])
        .arg(vault.path("Dry_Run", "p.md"))
        .output()
        .unwrap();
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        printed["previews"][0]["decision"]["reason"]
            .as_str()
            .unwrap()
            .contains("circuit search_web is open"),
        "{printed}"
    );

    // The service recovers; after the cool-down one trial call closes the circuit.
    search.set_answer(Answer::Results);
    let until = until_of(r);
    wait_until("the cool-down has passed", DEADLINE, || {
        SystemTime::now() > until
    });
    vault.drop_note("c.md", &note_with_calls("C", &[search_call("back up")]));
    let c = vault.wait_until_in("Done", "c.md");
    assert_eq!(results_in(&c)[0]["ok"], true);
    assert!(search.requests() > asked);
    daemon.wait_for_log("circuit half-open");
    daemon.wait_for_log("circuit closed");
    assert_eq!(vault.status_json()["open_circuits"], json!([]));
    vault.drop_note("d.md", &note_with_calls("D", &[search_call("again")]));
    vault.wait_until_in("Done", "d.md");
    assert_eq!(daemon.terminate().code(), Some(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn in_once_the_sixth_failing_call_is_not_sent() {
    let search = SearxServer::start(Duration::ZERO).await;
    search.set_answer(Answer::ServerError);
    // One worker: the calls of the note run one after the other.
    let vault = TestVault::new(
        &search.base_url(),
        "workers = 1\n[tools.search_web]\ntimeout = \"1s\"\n",
    );
    let six: Vec<Value> = (0..6).map(|i| search_call(&format!("down {i}"))).collect();
    vault.drop_note("a.md", &note_with_calls("A", &six));
    let (code, stderr) = vault.once();
    assert_eq!(code, 0, "{stderr}");
    let a = vault.wait_until_in("Failed", "a.md");
    let results = results_in(&a);
    assert_eq!(results.len(), 6);
    let open: Vec<&Value> = results
        .iter()
        .filter(|r| {
            r["error"]["message"]
                .as_str()
                .unwrap_or("")
                .starts_with("circuit open until")
        })
        .collect();
    assert_eq!(open.len(), 1, "{a}");
    let queries = search.queries();
    assert_eq!(
        queries
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len(),
        5,
        "the sixth query never reached the server: {queries:?}"
    );
    assert!(stderr.contains("circuit open until"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// Hold alerts

fn alert_config(vault: &TestVault, hook: &str, extra: &str) -> String {
    let r = secret_file(vault, "slack-ops", hook);
    format!(
        "[notify]\non_hold = {{ method = \"slack\", recipient = \"ops\" }}\n{extra}\
         [tools.send_notification.slack.webhooks]\nops = {r:?}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_note_sends_one_slack_alert_per_hold() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = webhook_server(200).await;
    let vault = TestVault::new(&search.base_url(), "");
    let cfg = alert_config(
        &vault,
        &format!("{}/services/T/B/HOLDSECRET", slack.uri()),
        "on_hold_per_hour = 1\n",
    );
    vault.write_config(&search.base_url(), &cfg);
    let daemon = vault.start();
    vault.drop_note(
        "mail.md",
        &note_with_calls("Mail", &[send("email", "boss@example.org")]),
    );
    let held = vault.wait_until_in("Pending_Approval", "mail.md");
    assert!(held.contains("[!question]"));
    wait_until("the alert arrives", DEADLINE, || {
        futures_received(&slack) >= 1
    });
    let requests = slack.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    let body: Value = serde_json::from_slice(&requests[0].body).unwrap();
    let text = body["text"].as_str().unwrap();
    assert!(text.contains("Pending_Approval/mail.md"), "{text}");
    assert!(text.contains("send_notification"), "{text}");
    assert!(
        text.contains("boss@example.org is not in allowed_recipients"),
        "{text}"
    );
    assert!(text.contains("move this note to `Approved/`"), "{text}");

    // The same hold looked at again is not alerted again: moved back to Needs_Action without
    // a decision, the note returns to Pending_Approval with the same question.
    vault.move_note("Pending_Approval", "Needs_Action", "mail.md");
    wait_until("the note is held again", DEADLINE, || {
        vault.exists("Pending_Approval", "mail.md")
            && vault
                .read("Pending_Approval", "mail.md")
                .contains("tool_status: pending_approval")
    });
    // A restart (a full scan by a fresh daemon with fresh memory) does not repeat it either.
    assert_eq!(daemon.terminate().code(), Some(0));
    assert_eq!(vault.once().0, 0);
    let daemon = vault.start();
    assert_eq!(slack.received_requests().await.unwrap().len(), 1);
    // Two more holds: the hourly cap of 1 (per daemon) lets one more through.
    vault.drop_note(
        "two.md",
        &note_with_calls("Two", &[send("email", "x@example.org")]),
    );
    vault.drop_note(
        "three.md",
        &note_with_calls("Three", &[send("email", "y@example.org")]),
    );
    vault.wait_until_in("Pending_Approval", "two.md");
    vault.wait_until_in("Pending_Approval", "three.md");
    daemon.wait_for_log("hold alert not sent");
    assert_eq!(daemon.terminate().code(), Some(0));
    // The first daemon's alert plus one from the second (its own hourly budget).
    assert_eq!(slack.received_requests().await.unwrap().len(), 2);
    assert!(
        !vault
            .read("Pending_Approval", "two.md")
            .contains("HOLDSECRET")
    );
}

/// Requests wiremock has seen so far, from a blocking poll loop.
fn futures_received(server: &MockServer) -> usize {
    let fut = server.received_requests();
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(fut))
        .map(|r| r.len())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_alert_is_logged_and_the_note_is_held_as_usual() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = webhook_server(500).await;
    let vault = TestVault::new(&search.base_url(), "");
    let cfg = alert_config(
        &vault,
        &format!("{}/services/T/B/HOLDSECRET", slack.uri()),
        "",
    );
    vault.write_config(&search.base_url(), &cfg);
    vault.drop_note(
        "mail.md",
        &note_with_calls("Mail", &[send("email", "boss@example.org")]),
    );
    let (code, stderr) = vault.once();
    assert_eq!(code, 0, "{stderr}");
    let held = vault.wait_until_in("Pending_Approval", "mail.md");
    assert!(held.contains("[!question]"));
    assert!(results_in(&held).is_empty());
    assert!(stderr.contains("hold alert failed"), "{stderr}");
    assert!(!stderr.contains("HOLDSECRET"), "{stderr}");
    assert!(!slack.received_requests().await.unwrap().is_empty());
}

#[test]
fn a_hold_alert_to_an_unknown_webhook_is_a_config_error() {
    let vault = TestVault::new(
        "http://127.0.0.1:9",
        "[notify]\non_hold = { method = \"slack\", recipient = \"nobody\" }\n",
    );
    let (code, stderr) = vault.once();
    assert_ne!(code, 0);
    assert!(stderr.contains("notify.on_hold.recipient"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// Untrusted text

#[tokio::test(flavor = "multi_thread")]
async fn bidi_and_zero_width_characters_in_results_are_escaped() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    // The fake server echoes the query into titles and snippets: hostile output.
    let query = "invoice\u{202e}fdp.exe\u{200b}\u{2066}x\u{feff}";
    vault.drop_note("q.md", &note_with_calls("Q", &[search_call(query)]));
    assert_eq!(vault.once().0, 0);
    let text = vault.wait_until_in("Done", "q.md");
    let result_part = &text[text.find("[!success]").unwrap()..];
    for c in ['\u{202e}', '\u{200b}', '\u{2066}', '\u{feff}'] {
        assert!(!result_part.contains(c), "{c:?} written raw");
    }
    assert!(result_part.contains("invoice\\u202efdp.exe\\u200b\\u2066x\\ufeff result 1"));
    // Escaped in JSON: the value an agent reads is what the server sent.
    let r = &results_in(&text)[0];
    assert_eq!(
        r["data"]["results"][0]["title"],
        format!("{query} result 1")
    );
}
