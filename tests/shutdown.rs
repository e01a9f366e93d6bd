//! docs/design.md §9.15: shutdown always ends, and nothing waits on a file that is not a regular file.
//! A FIFO named `x.md` (a command tool with `writable` can make one) as the target of the
//! vault tools, in the inbox and in `In_Progress/`; `once` exits, and `run` ends on SIGTERM
//! within `shutdown_grace` plus a few seconds while a call hangs.

use crate::util::*;
use serde_json::{Value, json};
use std::time::Duration;

const NO_SEARCH: &str = "http://127.0.0.1:9";

/// Generous: the machine is loaded; a hang is forever.
const EXIT_DEADLINE: Duration = Duration::from_secs(60);

fn call(name: &str, id: &str, parameters: Value) -> Value {
    json!({ "name": name, "id": id, "parameters": parameters })
}

fn result<'a>(results: &'a [Value], id: &str) -> &'a Value {
    results
        .iter()
        .find(|r| r["call_id"] == id)
        .unwrap_or_else(|| panic!("no result {id} in {results:?}"))
}

#[test]
fn fifos_named_like_notes_are_refused_by_the_vault_tools_and_once_exits() {
    let vault = TestVault::new(NO_SEARCH, "");
    let projects = vault.root.join("Projects");
    std::fs::create_dir_all(&projects).unwrap();
    std::fs::write(
        projects.join("plan.md"),
        "# Plan\nthe budget is due\n- [ ] pay\n",
    )
    .unwrap();
    make_fifo(&projects.join("pipe.md"));
    make_fifo(&vault.path("Needs_Action", "inbox-pipe.md"));
    std::fs::create_dir_all(vault.root.join("In_Progress")).unwrap();
    make_fifo(&vault.path("In_Progress", "stranded-pipe.md"));
    vault.drop_note(
        "look.md",
        &note_with_calls(
            "Look",
            &[
                call("vault_read", "read", json!({ "path": "Projects/pipe.md" })),
                call(
                    "vault_search",
                    "search",
                    json!({ "query": "budget", "folder": "Projects" }),
                ),
                call("vault_list", "list", json!({ "folder": "Projects" })),
                call("vault_tasks", "tasks", json!({ "folder": "Projects" })),
            ],
        ),
    );
    let (code, log) = vault.once_within(EXIT_DEADLINE);
    assert_eq!(code, 0, "{log}");

    let text = vault.read("Failed", "look.md");
    let results = results_in(&text);
    let read = result(&results, "read");
    assert_eq!(read["ok"], false, "{read}");
    let message = read["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("FIFO") && message.contains("not a regular file"),
        "{message}"
    );
    let search = result(&results, "search");
    assert_eq!(search["ok"], true, "{search}");
    assert_eq!(search["data"]["matches"][0]["path"], "Projects/plan.md");
    let list = result(&results, "list");
    assert_eq!(list["ok"], true, "{list}");
    let listed: Vec<&str> = list["data"]["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(listed, vec!["Projects/plan.md"]);
    assert_eq!(result(&results, "tasks")["ok"], true);

    // The FIFOs are where they were, untouched.
    use std::os::unix::fs::FileTypeExt;
    for p in [
        projects.join("pipe.md"),
        vault.path("Needs_Action", "inbox-pipe.md"),
        vault.path("In_Progress", "stranded-pipe.md"),
    ] {
        assert!(
            std::fs::symlink_metadata(&p).unwrap().file_type().is_fifo(),
            "{p:?}"
        );
    }
}

/// A command tool that ignores SIGTERM and hangs (bounded, so no test leaves it forever).
const HANG_TOOL: &str = r#"
shutdown_grace = "1s"
[tools.command.hang]
description = "Ignore SIGTERM and hang (test only)"
argv = ["sh", "-c", "trap '' TERM; sleep 90"]
parameters = { type = "object", properties = {} }
effect = "read_only"
timeout = "120s"
"#;

#[test]
fn run_ends_on_sigterm_within_the_grace_while_calls_hang_on_a_fifo_and_a_stubborn_tool() {
    let vault = TestVault::new(NO_SEARCH, HANG_TOOL);
    let projects = vault.root.join("Projects");
    std::fs::create_dir_all(&projects).unwrap();
    make_fifo(&projects.join("pipe.md"));
    let mut daemon = vault.start();
    vault.drop_note(
        "fifo.md",
        &note_with_calls(
            "Fifo",
            &[call(
                "vault_read",
                "read",
                json!({ "path": "Projects/pipe.md" }),
            )],
        ),
    );
    vault.drop_note(
        "hang.md",
        &note_with_calls("Hang", &[call("hang", "hang", json!({}))]),
    );
    // Both claimed: the hanging tool runs; the FIFO read either failed at once (as it must)
    // or is stuck in its read.
    wait_until("both notes claimed", DEADLINE, || {
        !vault.exists("Needs_Action", "fifo.md") && vault.exists("In_Progress", "hang.md")
    });
    let sent = std::time::Instant::now();
    daemon.signal(15);
    let status = exit_within(&mut daemon.child, EXIT_DEADLINE);
    let log = daemon.log_text();
    let Some(status) = status else {
        panic!("vaultd run did not end within {EXIT_DEADLINE:?} of SIGTERM; log:\n{log}");
    };
    // shutdown_grace (1 s) plus a few seconds; generous for a loaded machine.
    assert!(
        sent.elapsed() < Duration::from_secs(30),
        "took {:?}; log:\n{log}",
        sent.elapsed()
    );
    assert!(status.code().is_some(), "{status:?}: {log}");
    assert!(log.contains("vaultd stopped"), "{log}");
    // The FIFO read was refused, not waited on.
    let fifo = vault.read("Failed", "fifo.md");
    assert!(fifo.contains("not a regular file"), "{fifo}");
}
