//! Reloading the config of a running `vaultd run`, end to end with the real binary: on SIGHUP,
//! on a change of the config file (saved by rename, as editors do), a bad config that leaves
//! the running one in place and is reported once, and keys that need a restart. A loopback
//! webhook server stands in for Slack.

use crate::util::searx::SearxServer;
use crate::util::*;
use serde_json::{Value, json};
use std::time::Duration;
use wiremock::MockServer;

fn send_slack(recipient: &str) -> Value {
    json!({ "name": "send_notification", "parameters": {
        "method": "slack", "recipient": recipient, "subject": "Deploy", "body": "Done." } })
}

/// The `[tools.send_notification.slack.webhooks]` table naming `ops`, its URL in a secret file.
fn ops_webhook(vault: &TestVault, slack: &MockServer) -> String {
    let hook = secret_file(
        vault,
        "slack-ops",
        &format!("{}/services/T0/B0/OPSSECRET", slack.uri()),
    );
    format!("[tools.send_notification.slack.webhooks]\nops = {hook:?}\n")
}

async fn requests(server: &MockServer) -> usize {
    server.received_requests().await.map_or(0, |r| r.len())
}

/// Saves the config file the way editors do: a new file renamed over the old one.
fn save_by_rename(vault: &TestVault, text: &str) {
    let tmp = vault.config.with_extension("toml.swp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &vault.config).unwrap();
}

/// A note with one Slack send to `ops`, dropped and awaited in `folder`; returns its text.
fn slack_note(vault: &TestVault, name: &str, folder: &str) -> String {
    vault.drop_note(name, &note_with_calls(name, &[send_slack("ops")]));
    vault.wait_until_in(folder, name)
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_the_config_and_a_new_slack_webhook_is_used() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = webhook_server(200).await;
    let vault = TestVault::new(&search.base_url(), "");
    // The config is a link to a file elsewhere (a dotfiles checkout, say): writing through it
    // changes nothing in the folder vaultd watches, so only the signal can reload it.
    let elsewhere = vault.dir.path().join("dotfiles");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::rename(&vault.config, elsewhere.join("vaultd.toml")).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("vaultd.toml"), &vault.config).unwrap();
    let daemon = vault.start();

    let first = slack_note(&vault, "first.md", "Failed");
    assert!(
        first.contains("POLICY_DENIED") && first.contains("no slack webhook named `ops`"),
        "{first}"
    );

    vault.write_config(&search.base_url(), &ops_webhook(&vault, &slack));
    daemon.signal(1);
    let log = daemon.wait_for_log_times("config reloaded", 1);
    let line = log
        .lines()
        .find(|l| l.contains("config reloaded"))
        .expect("the line just awaited");
    assert!(line.contains("tools changed: send_notification"), "{line}");
    assert!(log.contains("SIGHUP: reloading the config"), "{log}");
    assert!(
        !log.contains("OPSSECRET"),
        "the new secret is redacted: {log}"
    );

    let second = slack_note(&vault, "second.md", "Done");
    assert_eq!(results_in(&second)[0]["ok"], true, "{second}");
    assert_eq!(requests(&slack).await, 1, "the webhook got the one send");
    assert!(daemon.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn saving_the_config_file_reloads_it_without_a_signal() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = webhook_server(200).await;
    let vault = TestVault::new(&search.base_url(), "");
    let daemon = vault.start();
    let first = slack_note(&vault, "first.md", "Failed");
    assert!(first.contains("POLICY_DENIED"), "{first}");

    let before = std::fs::read_to_string(&vault.config).unwrap();
    save_by_rename(
        &vault,
        &format!("{before}\n{}", ops_webhook(&vault, &slack)),
    );
    let log = daemon.wait_for_log_times("config reloaded", 1);
    assert!(log.contains("tools changed: send_notification"), "{log}");
    assert!(!log.contains("SIGHUP"), "no signal was sent: {log}");

    let second = slack_note(&vault, "second.md", "Done");
    assert_eq!(results_in(&second)[0]["ok"], true, "{second}");
    assert_eq!(requests(&slack).await, 1);
    assert!(daemon.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_config_keeps_the_running_one_and_each_error_is_logged_once() {
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = webhook_server(200).await;
    let vault = TestVault::new(&search.base_url(), "");
    vault.write_config(&search.base_url(), &ops_webhook(&vault, &slack));
    let good = std::fs::read_to_string(&vault.config).unwrap();
    let daemon = vault.start();

    // Two unknown keys on lines 1 and 2, and the webhook gone: nothing of it is taken.
    let without_hook = good.replace("ops = ", "# ops = ");
    let bad = format!("workerz = 3\nmax_calls_per_notee = 2\n{without_hook}");
    save_by_rename(&vault, &bad);
    let log = daemon.wait_for_log_times("config not reloaded", 1);
    let file = vault.config.display().to_string();
    assert!(log.contains(&format!("{file}:1:1: `workerz`")), "{log}");
    assert!(
        log.contains(&format!("{file}:2:1: `max_calls_per_notee`")),
        "{log}"
    );
    assert!(log.contains("the running config stays"), "{log}");

    // The running config still has the webhook.
    let note = slack_note(&vault, "still.md", "Done");
    assert_eq!(results_in(&note)[0]["ok"], true, "{note}");
    assert_eq!(requests(&slack).await, 1);

    // The same text saved again is not judged again.
    save_by_rename(&vault, &bad);
    daemon.wait_for_log("config file saved unchanged");
    // A different mistake is reported, by line and key, once.
    save_by_rename(
        &vault,
        &format!("max_calls_per_note = \"ten\"\n{without_hook}"),
    );
    let log = daemon.wait_for_log_times("config not reloaded", 2);
    assert!(
        log.contains(&format!("{file}, line 1: key `max_calls_per_note`")),
        "{log}"
    );
    assert_eq!(log.matches("`workerz`").count(), 1, "{log}");
    assert_eq!(log.matches("config not reloaded").count(), 2, "{log}");
    assert!(daemon.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_vault_or_state_dir_is_named_as_needing_a_restart() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    let daemon = vault.start();
    let other = vault.dir.path().join("other-vault");
    std::fs::create_dir(&other).unwrap();
    let text = std::fs::read_to_string(&vault.config).unwrap();
    let moved = text
        .replace(
            &format!("vault = {:?}", vault.root.display().to_string()),
            &format!("vault = {:?}", other.display().to_string()),
        )
        .replace(
            &format!("state_dir = {:?}", vault.state.display().to_string()),
            &format!(
                "state_dir = {:?}",
                vault.dir.path().join("other-state").display().to_string()
            ),
        );
    assert_ne!(moved, text, "the test config names both keys");
    save_by_rename(&vault, &format!("max_calls_per_note = 3\n{moved}"));
    let log = daemon.wait_for_log_times("config reloaded", 1);
    assert!(log.contains("needs a restart: vault"), "{log}");
    assert!(log.contains("needs a restart: state_dir"), "{log}");
    assert!(
        log.contains("settings changed: max_calls_per_note"),
        "{log}"
    );

    // Still the vault it started on.
    vault.drop_note("here.md", &note_with_calls("Here", &[search_call("q")]));
    vault.wait_until_in("Done", "here.md");
    assert!(!other.join("Needs_Action").exists());
    assert!(!vault.dir.path().join("other-state").exists());
    assert!(daemon.terminate().success());
}
