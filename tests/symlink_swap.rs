//! docs/design.md §9.13: a state folder swapped for a symlink while `run` runs is never written
//! through. The real binary; the swap is done the way a hostile tool or a confused sync client
//! would: the real folder renamed away, a symlink to a folder outside the vault in its place.

use crate::util::searx::SearxServer;
use crate::util::*;
use std::path::Path;
use std::time::Duration;

/// Every file under `dir`, for the "nothing landed outside" checks.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

/// Replaces the vault's `folder` with a symlink to `outside`; the real folder goes to `aside`.
fn swap_for_symlink(vault: &TestVault, folder: &str, outside: &Path, aside: &Path) {
    std::fs::rename(vault.root.join(folder), aside).unwrap();
    std::os::unix::fs::symlink(outside, vault.root.join(folder)).unwrap();
}

fn swap_back(vault: &TestVault, folder: &str, aside: &Path) {
    std::fs::remove_file(vault.root.join(folder)).unwrap();
    std::fs::rename(aside, vault.root.join(folder)).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn done_swapped_for_a_symlink_while_running_is_never_written_through() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "rescan_interval = \"1s\"\n");
    let outside = vault.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let aside = vault.dir.path().join("Done.real");
    let daemon = vault.start();
    vault.drop_note(
        "first.md",
        &note_with_calls("First", &[search_call("first")]),
    );
    vault.wait_until_in("Done", "first.md");

    swap_for_symlink(&vault, "Done", &outside, &aside);
    vault.drop_note(
        "second.md",
        &note_with_calls("Second", &[search_call("second")]),
    );
    daemon.wait_for_log("claiming paused");
    let log = daemon.log_text();
    assert!(log.contains("symlink"), "{log}");
    assert!(
        files_under(&outside).is_empty(),
        "{:?}",
        files_under(&outside)
    );
    // The note is safe in the vault, its result written.
    wait_until(
        "the note's result is written in In_Progress/",
        DEADLINE,
        || {
            std::fs::read_to_string(vault.path("In_Progress", "second.md"))
                .is_ok_and(|t| results_in(&t).len() == 1)
        },
    );
    // Paused: a new note waits in the inbox.
    vault.drop_note(
        "third.md",
        &note_with_calls("Third", &[search_call("third")]),
    );
    assert!(vault.exists("Needs_Action", "third.md"));
    assert!(
        files_under(&outside).is_empty(),
        "{:?}",
        files_under(&outside)
    );

    // The real folder back: claiming resumes by itself (the rescan finds the waiting note).
    swap_back(&vault, "Done", &aside);
    vault.wait_until_in("Done", "third.md");
    daemon.wait_for_log("claiming resumes");
    assert_eq!(daemon.terminate().code(), Some(0));
    // The next start finishes the note the refused move left in In_Progress/: not run again.
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let second = vault.read("Done", "second.md");
    assert_eq!(results_in(&second).len(), 1, "{second}");
    let mut queries = search.queries();
    queries.sort();
    assert_eq!(queries, vec!["first", "second", "third"]);
    assert!(
        files_under(&outside).is_empty(),
        "{:?}",
        files_under(&outside)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn in_progress_swapped_for_a_symlink_while_running_stops_the_claim() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    let outside = vault.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let aside = vault.dir.path().join("In_Progress.real");
    let daemon = vault.start();
    vault.drop_note(
        "first.md",
        &note_with_calls("First", &[search_call("first")]),
    );
    vault.wait_until_in("Done", "first.md");

    swap_for_symlink(&vault, "In_Progress", &outside, &aside);
    let text = note_with_calls("Second", &[search_call("second")]);
    vault.drop_note("second.md", &text);
    daemon.wait_for_log("claiming paused");
    assert!(
        files_under(&outside).is_empty(),
        "{:?}",
        files_under(&outside)
    );
    assert_eq!(vault.read("Needs_Action", "second.md"), text, "untouched");
    assert_eq!(search.queries(), vec!["first"]);
    drop(daemon);
}
