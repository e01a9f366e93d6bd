//! What a newcomer meets in the first hour, end to end with the real binary: one line number
//! for one broken call, a finished note moved back into the inbox, read-only commands in a
//! shell without the secrets, a typo written in place or moved in, and the help texts.

use crate::util::*;
use serde_json::{Value, json};
use std::process::Output;
use std::time::Duration;

const NO_SEARCH: &str = "http://127.0.0.1:9";

/// A note with frontmatter, a good deal of text, and one call whose `"id"` line lacks the
/// comma before it: a typo deep in the note, with text after it (so it is not unfinished).
fn note_with_a_typo_deep_in_it() -> String {
    let mut s = String::from("---\ntitle: Weekly research\ntags: [agents]\n---\n# Research\n\n");
    for i in 1..=12 {
        s.push_str(&format!(
            "Paragraph {i} of what the agent wrote before its call.\n\n"
        ));
    }
    s.push_str(
        "```json\n{\n  \"tool_call\": {\n    \"name\": \"search_web\",\n    \"parameters\": { \"query\": \"x\" }\n    \"id\": \"typo\"\n  }\n}\n```\n\nAnd a closing remark.\n",
    );
    s
}

/// The (line, column) a reader finds the typo at in `text`: the `"id"` key that should have
/// had a comma before it, 1-based, column in characters.
fn typo_position(text: &str) -> (u64, u64) {
    let (i, line) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.trim_start().starts_with("\"id\": \"typo\""))
        .expect("the typo line is in the note");
    let column = line.find('"').expect("a quote on the line") + 1;
    (i as u64 + 1, column as u64)
}

fn run(vault: &TestVault, args: &[&str]) -> Output {
    vault.cmd().args(args).output().expect("run vaultd")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every "at line N, column M" in `text`.
fn positions_in(text: &str) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("at line ") {
        rest = &rest[i + "at line ".len()..];
        let line: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Some(after) = rest[line.len()..].strip_prefix(", column ") else {
            continue;
        };
        let column: String = after.chars().take_while(char::is_ascii_digit).collect();
        if let (Ok(l), Ok(c)) = (line.parse(), column.parse()) {
            out.push((l, c));
        }
    }
    out
}

fn check_json(vault: &TestVault, note: &str) -> Value {
    let out = run(vault, &["check", note, "--json"]);
    serde_json::from_str(stdout(&out).trim())
        .unwrap_or_else(|e| panic!("check --json: {e}: {}{}", stdout(&out), stderr(&out)))
}

// Item: one broken call, one line number (docs/design.md §8.3: counted in the note as the person
// sees it), in `check`, in the result written into the note, in the daemon's log line, in
// `vaultd log` and in `vaultd status`.
#[test]
fn one_broken_call_has_one_line_number_in_check_the_note_and_the_log() {
    let vault = TestVault::new(NO_SEARCH, "");
    let text = note_with_a_typo_deep_in_it();
    let before = typo_position(&text);
    vault.drop_note("typo.md", &text);

    // Before it runs, `check` counts in the note as it is now.
    let checked = check_json(&vault, "Needs_Action/typo.md");
    let call = &checked["calls"][0];
    assert_eq!(call["status"], "invalid", "{checked}");
    assert_eq!(
        positions_in(call["error"]["message"].as_str().unwrap()),
        vec![before],
        "{checked}"
    );
    let fence = text.lines().position(|l| l == "```json").unwrap() + 1;
    assert_eq!(
        call["line"],
        json!(fence),
        "check --json's line is the fence's"
    );

    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let failed = vault.read("Failed", "typo.md");
    // vaultd added properties above the call: the typo moved down, and every number says
    // where it is now, in the note as the person opens it.
    let (line, column) = typo_position(&failed);
    assert!(line > before.0, "the frontmatter grew: {failed}");
    let results = results_in(&failed);
    assert_eq!(results.len(), 1, "{failed}");
    let error = &results[0]["error"];
    assert_eq!(error["code"], "INVALID_JSON");
    assert_eq!(error["details"], json!({ "line": line, "column": column }));
    assert_eq!(
        positions_in(error["message"].as_str().unwrap()),
        vec![(line, column)]
    );
    assert!(
        failed.contains(&format!("INVALID_JSON at {line}:{column}")),
        "callout title: {failed}"
    );
    // The daemon's log line says the same.
    let logged = positions_in(&log);
    assert!(!logged.is_empty(), "the log names the position: {log}");
    assert!(
        logged.iter().all(|p| *p == (line, column)),
        "log says {logged:?}, the note {:?}: {log}",
        (line, column)
    );

    // `check` of the note as it is now shows its result: the same position.
    let after = check_json(&vault, "Failed/typo.md");
    assert_eq!(after["calls"][0]["status"], "done", "{after}");
    assert_eq!(
        positions_in(after["calls"][0]["result"]["message"].as_str().unwrap()),
        vec![(line, column)],
        "{after}"
    );
    let human = stdout(&run(&vault, &["check", "Failed/typo.md"]));
    assert_eq!(positions_in(&human), vec![(line, column)], "{human}");

    // So do the journal's readers.
    let journal_log = stdout(&run(&vault, &["log"]));
    assert!(
        positions_in(&journal_log)
            .iter()
            .all(|p| *p == (line, column)),
        "{journal_log}"
    );
    let status = vault.status_json();
    let detail = status["recent_failures"][0]["detail"].as_str().unwrap();
    assert_eq!(positions_in(detail), vec![(line, column)], "{status}");
}

// Item: a finished note moved back into Needs_Action/ with every call answered.
#[test]
fn a_finished_note_moved_back_says_nothing_pending_in_the_log_check_and_status() {
    let vault = TestVault::new(NO_SEARCH, "");
    vault.drop_note("done-with.md", &note_with_a_typo_deep_in_it());
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let finished = vault.read("Failed", "done-with.md");
    vault.move_note("Failed", "Needs_Action", "done-with.md");

    // The daemon says what it sees, once, and leaves the note as it is.
    let daemon = vault.start_logged("moved-back.log");
    daemon
        .wait_for_log("nothing pending: every call has a result; delete a result to run it again");
    let said = daemon.log_text();
    let line = said
        .lines()
        .find(|l| l.contains("nothing pending"))
        .unwrap();
    assert!(line.contains("Needs_Action/done-with.md"), "{line}");
    assert_eq!(vault.read("Needs_Action", "done-with.md"), finished);

    // `check` says it too, and shows the failed call as failed, not merely "done".
    let human = stdout(&run(&vault, &["check", "Needs_Action/done-with.md"]));
    assert!(
        human.contains("nothing pending: every call has a result"),
        "{human}"
    );
    assert!(
        human.contains("has its result: failed INVALID_JSON"),
        "{human}"
    );
    let checked = check_json(&vault, "Needs_Action/done-with.md");
    assert_eq!(
        checked["message"],
        "nothing pending: every call has a result; delete a result to run it again"
    );
    assert_eq!(checked["calls"][0]["result"]["ok"], false, "{checked}");
    assert_eq!(checked["calls"][0]["result"]["code"], "INVALID_JSON");

    // `status` names it among the notes with nothing pending, and its recent failure where
    // the note is now, not In_Progress/ where the call ran.
    let status = vault.status_json();
    assert_eq!(
        status["nothing_pending"],
        json!(["Needs_Action/done-with.md"])
    );
    let failure = &status["recent_failures"][0];
    assert_eq!(failure["note"], "In_Progress/done-with.md", "{status}");
    assert_eq!(failure["now"], "Needs_Action/done-with.md", "{status}");
    let human = stdout(&run(&vault, &["status"]));
    let failures = human.split("recent failures").nth(1).unwrap();
    assert!(failures.contains("Needs_Action/done-with.md"), "{human}");
    assert!(!failures.contains("In_Progress/"), "{human}");
    assert!(human.contains("1 of them with nothing pending"), "{human}");

    // A note gone from the vault's folders is said to be gone, not shown where it was.
    std::fs::rename(
        vault.path("Needs_Action", "done-with.md"),
        vault.dir.path().join("elsewhere.md"),
    )
    .unwrap();
    let status = vault.status_json();
    assert_eq!(status["recent_failures"][0]["now"], Value::Null, "{status}");
    let human = stdout(&run(&vault, &["status"]));
    assert!(
        human.contains("(moved since; not in the vault's folders)"),
        "{human}"
    );
    drop(daemon);
}

// Item: read-only commands work in a shell without the secrets, and say which are unset.
#[test]
fn read_only_commands_work_without_secrets_and_name_the_unset_ones() {
    let server = crate::util::mcp_test_server();
    let kinds = [
        (
            "slack webhook",
            "VAULTD_T_UNSET_WEBHOOK",
            "[tools.send_notification.slack.webhooks]\nops = \"env:VAULTD_T_UNSET_WEBHOOK\"\n"
                .to_string(),
        ),
        (
            "command tool env",
            "VAULTD_T_UNSET_CMD",
            "[tools.command.hello]\ndescription = \"hello\"\nargv = [\"echo\", \"hi\"]\neffect = \"read_only\"\nenv = { TOKEN = \"env:VAULTD_T_UNSET_CMD\" }\n"
                .to_string(),
        ),
        (
            "MCP server env",
            "VAULTD_T_UNSET_MCP_ENV",
            format!(
                "[mcp.t]\ncommand = [{:?}]\nenv = {{ TOKEN = \"env:VAULTD_T_UNSET_MCP_ENV\" }}\nallow = [\"echo\"]\n",
                server.display().to_string()
            ),
        ),
        (
            "MCP header",
            "VAULTD_T_UNSET_MCP_HEADER",
            "[mcp.web]\nurl = \"http://127.0.0.1:9/mcp\"\nheaders = { Authorization = \"env:VAULTD_T_UNSET_MCP_HEADER\" }\nallow = [\"echo\"]\n"
                .to_string(),
        ),
    ];
    for (kind, var, config) in kinds {
        let vault = TestVault::new(NO_SEARCH, &config);
        vault.drop_note(
            "a.md",
            &note_with_calls("A", &[json!({ "name": "vault_list", "parameters": {} })]),
        );
        // The daemon needs the secret: it refuses to start and names it.
        let once = vault.cmd().env_remove(var).arg("once").output().unwrap();
        assert_eq!(once.status.code(), Some(2), "{kind}: {}", stderr(&once));
        assert!(stderr(&once).contains(var), "{kind}: {}", stderr(&once));
        for args in [
            &["tools"][..],
            &["tools", "--json"],
            &["check", "Needs_Action/a.md"],
            // Not `check --preview`: a preview says what would happen in this shell, where the
            // unset webhook is not configured, so the send is denied and check exits 1.
            &["config"],
            &["status"],
            &["log"],
        ] {
            let out = vault.cmd().env_remove(var).args(args).output().unwrap();
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(0), "{kind}: vaultd {args:?}: {err}");
            let warning: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
            assert_eq!(warning.len(), 1, "{kind}: vaultd {args:?}: {err}");
            assert!(
                warning[0].contains(&format!("env:{var}"))
                    && warning[0].contains(&format!("environment variable {var} is not set")),
                "{kind}: vaultd {args:?}: {err}"
            );
            // With the secret set there is nothing to warn about.
            let set = vault
                .cmd()
                .env(var, "https://hooks.example.com/services/T0/B0/s3cr3t-value")
                .args(args)
                .output()
                .unwrap();
            assert!(set.status.success(), "{kind}: {args:?}: {}", stderr(&set));
            assert!(
                !stderr(&set).contains("warning"),
                "{kind}: {}",
                stderr(&set)
            );
            assert!(!stdout(&set).contains("s3cr3t-value"), "{kind}: {args:?}");
        }
    }
}

// Item: a typo in a note written in place waits (its writer may be at it) and the log says
// why and until when, once; the same typo moved in by rename is judged at once.
#[test]
fn a_typo_written_in_place_waits_and_the_log_says_why_and_until_when() {
    let vault = TestVault::new(NO_SEARCH, "settle = \"200ms\"\nsettle_max = \"10m\"\n");
    let daemon = vault.start_logged("in-place.log");
    let mut text = note_with_calls("One", &[json!({ "name": "vault_list", "parameters": {} })]);
    // The last block: a call with a missing comma, at the very end of the note.
    text.push_str(
        "\n```json\n{\"tool_call\": {\"name\": \"vault_list\" \"parameters\": {}}}\n```\n",
    );
    vault.write_in_place("Needs_Action", "typo.md", &text);
    daemon.wait_for_log("not judged before");
    let log = daemon.log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("not judged before"))
        .collect();
    assert_eq!(lines.len(), 1, "once: {log}");
    let line = lines[0];
    assert!(line.contains("Needs_Action/typo.md"), "{line}");
    assert!(
        line.contains("settle_max = 10m"),
        "until when and why: {line}"
    );
    assert!(
        line.contains("invalid JSON at line"),
        "what is unfinished: {line}"
    );
    assert!(line.contains("written in place"), "{line}");
    assert!(vault.exists("Needs_Action", "typo.md"), "still waiting");
    drop(daemon);
}

#[test]
fn a_typo_that_arrives_by_rename_is_judged_at_once() {
    // settle_max is far beyond the test's deadline: only "judged at once" passes.
    let vault = TestVault::new(NO_SEARCH, "settle = \"200ms\"\nsettle_max = \"10m\"\n");
    let daemon = vault.start_logged("renamed.log");
    let mut text = note_with_calls("One", &[]);
    text.push_str(
        "\n```json\n{\"tool_call\": {\"name\": \"vault_list\" \"parameters\": {}}}\n```\n",
    );
    vault.drop_note("typo.md", &text);
    let failed = vault.wait_until_in("Failed", "typo.md");
    let results = results_in(&failed);
    assert_eq!(results.len(), 1, "{failed}");
    assert_eq!(results[0]["error"]["code"], "INVALID_JSON", "{failed}");
    assert!(!daemon.log_text().contains("not judged before"));
    drop(daemon);
}

// Item 9: the help texts and the status table.
#[test]
fn help_texts_describe_every_argument_and_cite_no_internal_document() {
    for sub in [
        "init",
        "run",
        "once",
        "check",
        "tools",
        "status",
        "approve",
        "reject",
        "log",
        "config",
        "completions",
        "undo",
    ] {
        let out = std::process::Command::new(bin())
            .args([sub, "--help"])
            .output()
            .unwrap();
        let help = stdout(&out);
        assert!(out.status.success(), "{sub}: {}", stderr(&out));
        assert!(
            !help.contains("DESIGN"),
            "vaultd {sub} --help cites DESIGN: {help}"
        );
        assert!(
            help.contains("Example"),
            "vaultd {sub} --help has no example: {help}"
        );
    }
    let help = |sub: &str| {
        stdout(
            &std::process::Command::new(bin())
                .args([sub, "--help"])
                .output()
                .unwrap(),
        )
    };
    let described = |help: &str, arg: &str| {
        help.lines()
            .find(|l| l.trim_start().starts_with(arg))
            .is_some_and(|l| l.trim_start().len() > arg.len() + 4)
    };
    assert!(described(&help("tools"), "--json"), "{}", help("tools"));
    assert!(described(&help("status"), "--json"), "{}", help("status"));
    assert!(described(&help("init"), "<DIR>"), "{}", help("init"));
    assert!(help("undo").contains("vaultd undo c-"), "{}", help("undo"));
}

#[test]
fn status_columns_align_to_the_longest_tool_name() {
    let long = "a_command_tool_with_a_rather_long_descriptive_name";
    let vault = TestVault::new(
        NO_SEARCH,
        &format!(
            "[tools.command.{long}]\ndescription = \"x\"\nargv = [\"echo\", \"hi\"]\neffect = \"read_only\"\n"
        ),
    );
    let out = run(&vault, &["status"]);
    let text = stdout(&out);
    let rates: Vec<&str> = text
        .split("rate limits")
        .nth(1)
        .unwrap()
        .lines()
        .filter(|l| l.contains("this hour"))
        .collect();
    assert!(rates.iter().any(|l| l.contains(long)), "{text}");
    let columns: Vec<usize> = rates
        .iter()
        .map(|l| l.find(char::is_numeric).unwrap())
        .collect();
    assert!(
        columns.windows(2).all(|w| w[0] == w[1]),
        "the counts start in one column: {text}"
    );
}

// Item 9: an MCP server's start is one readable line, not a dump of its description.
#[test]
fn an_mcp_server_start_is_one_short_line() {
    let server = crate::util::mcp_test_server();
    let vault = TestVault::new(
        NO_SEARCH,
        &format!(
            "[mcp.t]\ncommand = [{:?}]\nallow = [\"echo\"]\n",
            server.display().to_string()
        ),
    );
    let mut cmd = vault.cmd();
    cmd.env_remove("RUST_LOG"); // the default filter, as a user has it
    let daemon = RunningDaemon::start(cmd, vault.dir.path().join("mcp-start.log"));
    daemon.wait_for_log("MCP server is up");
    wait_until(
        "the server's line is complete",
        Duration::from_secs(30),
        || {
            daemon
                .log_text()
                .lines()
                .any(|l| l.contains("MCP server is up") && l.contains("MCP protocol"))
        },
    );
    let log = daemon.log_text();
    let up = log
        .lines()
        .find(|l| l.contains("MCP server is up"))
        .unwrap();
    assert!(up.contains("MCP server is up: "), "{up}");
    assert!(up.len() < 200, "one short line: {up}");
    assert!(!log.contains("peer_info"), "{log}");
    assert!(!log.contains("ServerPeerInfo"), "{log}");
    drop(daemon);
}
