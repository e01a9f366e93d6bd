//! Rate limits (docs/design.md §5): counted in the journal, so they hold across notes and restarts;
//! a call over the limit is `RATE_LIMITED` with the reset time, and `vaultd status` shows
//! the use against the limits.

use crate::util::searx::SearxServer;
use crate::util::*;
use serde_json::Value;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
async fn the_third_search_in_an_hour_is_rate_limited_across_notes_and_restarts() {
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(
        &server.base_url(),
        "[tools.search_web]\nrate_limit = { per_hour = 2 }\n",
    );

    // Two searches in one note, under a running daemon.
    let daemon = vault.start();
    vault.drop_note(
        "first.md",
        &note_with_calls("First", &[search_call("one"), search_call("two")]),
    );
    let text = vault.wait_until_in("Done", "first.md");
    assert_eq!(results_in(&text).len(), 2);
    assert_eq!(daemon.terminate().code(), Some(0));

    // A new daemon process, another note: the journal still counts the first two.
    let daemon = vault.start();
    vault.drop_note(
        "second.md",
        &note_with_calls("Second", &[search_call("three")]),
    );
    let text = vault.wait_until_in("Failed", "second.md");
    drop(daemon);
    assert_eq!(
        server.requests(),
        2,
        "the limited call never reached the server"
    );
    let r = &results_in(&text)[0];
    assert_eq!(r["error"]["code"], "RATE_LIMITED", "{text}");
    assert_eq!(r["error"]["retryable"], true);
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("limited to 2 calls per hour; the next call is allowed at "),
        "{message}"
    );
    let reset = r["error"]["details"]["reset_at"].as_str().unwrap();
    assert!(reset.ends_with('Z') && message.contains(reset), "{r}");
    assert_eq!(r["error"]["details"]["limit"], 2);
    assert_eq!(r["error"]["details"]["window"], "hour");

    // `vaultd status` shows the use against the limits.
    let out = vault.cmd().args(["status", "--json"]).output().unwrap();
    assert!(out.status.success());
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let search = status["rate_limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tool"] == "search_web")
        .unwrap_or_else(|| panic!("{status}"));
    assert_eq!(search["last_hour"], 2, "{status}");
    assert_eq!(search["per_hour"], 2);
    assert_eq!(search["last_day"], 2);
    // A rate_limit table replaces the default one whole: no daily limit was given.
    assert_eq!(search["per_day"], Value::Null);
    let out = vault.cmd().arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.contains("search_web") && l.contains("2/2 this hour")),
        "{text}"
    );
}
