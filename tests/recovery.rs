//! "Never lose a note, never send twice": the real binary killed with SIGKILL at varied
//! moments, restarted, and checked note by note and call by call.

use crate::util::searx::SearxServer;
use crate::util::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The name of torture note `i`, its queries (every third note has two) and whether it sends
/// an email too (every other note, before its searches in every fourth): read_only calls,
/// whose starts are not waited for, beside side effects, whose starts are.
fn torture_note(i: usize) -> (String, Vec<String>, bool) {
    let queries = if i.is_multiple_of(3) {
        vec![format!("q{i} first"), format!("q{i} second")]
    } else {
        vec![format!("q{i}")]
    };
    (format!("t{i:02}.md"), queries, i.is_multiple_of(2))
}

fn torture_send(i: usize) -> serde_json::Value {
    json!({ "name": "send_notification", "parameters": {
        "recipient": "bob@example.org", "subject": format!("t{i}"), "body": "once" } })
}

fn drop_torture_note(vault: &TestVault, i: usize) {
    let (name, queries, sends) = torture_note(i);
    let mut calls: Vec<_> = queries.iter().map(|q| search_call(q)).collect();
    if sends {
        let at = if i.is_multiple_of(4) { 0 } else { calls.len() };
        calls.insert(at, torture_send(i));
    }
    vault.drop_note(&name, &note_with_calls(&name, &calls));
}

/// No open run, no call without an outcome, in the journal.
fn assert_journal_closed(vault: &TestVault) {
    let journal = vault.journal();
    let open = journal.open_runs().unwrap();
    assert!(open.is_empty(), "runs left open: {open:#?}");
    assert!(journal.running_calls().unwrap().is_empty());
}

/// Files vaultd left beside the notes (temp files of interrupted writes).
fn leftover_temp_files(vault: &TestVault) -> Vec<String> {
    vault
        .all_files()
        .into_iter()
        .filter(|f| f.contains(".vaultd-") && f.ends_with(".tmp"))
        .collect()
}

/// What a power loss (not a kill) can do to a note whose last write was the identity stamp,
/// written without an fsync of its own (journal/mod.rs, "The stamp"): leave it empty. Done
/// to every such note in In_Progress whose open run kept its claimed text; returns how many.
fn lose_unsynced_stamps(vault: &TestVault) -> usize {
    let open = vault.journal().open_runs().unwrap();
    let mut damaged = 0;
    for run in open.iter().filter(|r| r.claimed_text.is_some()) {
        let path = vault.root.join(&run.note);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if property(&text, "tool_note").is_some() && results_in(&text).is_empty() {
            std::fs::write(&path, b"").unwrap();
            damaged += 1;
        }
    }
    damaged
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_nine_at_varied_moments_loses_no_note_and_writes_each_result_once() {
    let began = Instant::now();
    let server = SearxServer::start(Duration::from_millis(100)).await;
    let vault = TestVault::new(&server.base_url(), "");
    let outbox = vault.dir.path().join("outbox");
    vault.write_config(
        &server.base_url(),
        &format!(
            "workers = 4\n[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"file\"\noutbox = {:?}\n",
            outbox.display().to_string()
        ),
    );
    const NOTES: usize = 30;
    // Half the notes wait in the inbox before the first start; the rest arrive while the
    // daemon runs, between kills.
    let mut dropped = 0;
    while dropped < NOTES / 2 {
        drop_torture_note(&vault, dropped);
        dropped += 1;
    }
    // VAULTD_TORTURE_SEED replays another schedule (to hunt for rarer interleavings).
    let seed = std::env::var("VAULTD_TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_2026_0001);
    let mut rng = Rng::new(seed);
    let kills = 14;
    let mut damaged = 0;
    for k in 0..kills {
        server.set_delay(Duration::from_millis(50 + rng.below(151)));
        let log = vault.dir.path().join(format!("kill-{k:02}.log"));
        // Every fourth cycle dies during start-up (recovery itself is interrupted).
        let daemon = if k % 4 == 3 {
            RunningDaemon::spawn(vault.cmd(), log)
        } else {
            RunningDaemon::start(vault.cmd(), log)
        };
        for _ in 0..rng.below(3) {
            if dropped < NOTES {
                drop_torture_note(&vault, dropped);
                dropped += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(rng.below(350)));
        daemon.kill9();
        if k % 2 == 1 {
            damaged += lose_unsynced_stamps(&vault);
        }
    }
    while dropped < NOTES {
        drop_torture_note(&vault, dropped);
        dropped += 1;
    }

    // The last, clean run finishes everything.
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");

    let notes = vault.all_notes();
    assert!(vault.notes_in("Needs_Action").is_empty(), "{notes:#?}");
    assert!(vault.notes_in("In_Progress").is_empty(), "{notes:#?}");
    assert_eq!(notes.len(), NOTES, "each note exactly once: {notes:#?}");
    // 0 duplicate sends: every Message-ID at most once in the outbox.
    let sent = sent_once(&vault, &outbox);
    let (mut sends_ok, mut sends_unknown) = (0, 0);
    for i in 0..NOTES {
        let (name, queries, sends) = torture_note(i);
        let folder = ["Done", "Failed"]
            .into_iter()
            .find(|f| vault.exists(f, &name))
            .unwrap_or_else(|| panic!("{name} lost; vault: {notes:#?}"));
        let text = vault.read(folder, &name);
        let calls = queries.len() + usize::from(sends);
        let counts = result_counts(&text);
        assert_eq!(counts.len(), calls, "{name}: {text}");
        assert!(
            counts.values().all(|&n| n == 1),
            "{name}: a call with more than one result: {counts:?}\n{text}"
        );
        let results = results_in(&text);
        let (send, searches): (Vec<_>, Vec<_>) = results
            .iter()
            .partition(|r| r["name"] == "send_notification");
        // A read_only call is never lost: run again after any kill, it always succeeds.
        for (r, q) in searches.iter().zip(&queries) {
            assert_eq!(r["ok"], true, "{name}: {r}");
            assert_eq!(r["data"]["results"][0]["title"], format!("{q} result 1"));
        }
        // A send ran once (its email in the outbox) or was cut off by a kill after its
        // durable start: UNKNOWN_OUTCOME, never a second send.
        let mut all_ok = true;
        for r in &send {
            if r["ok"] == true {
                sends_ok += 1;
                let id = r["data"]["message_id"].as_str().unwrap_or_default();
                let id = format!("<{}>", id.trim_matches(|c| c == '<' || c == '>'));
                assert_eq!(sent.get(&id), Some(&1), "{name}: {id} not in {sent:#?}");
            } else {
                sends_unknown += 1;
                all_ok = false;
                assert_eq!(r["error"]["code"], "UNKNOWN_OUTCOME", "{name}: {r}");
            }
        }
        assert_eq!(send.len(), usize::from(sends), "{name}: {text}");
        let expected = if all_ok { "Done" } else { "Failed" };
        assert_eq!(folder, expected, "{name}: {text}");
        assert_eq!(property(&text, "tool_calls"), Some(calls.to_string()));
        assert_eq!(text.matches("tool_status:").count(), 1, "{text}");
    }
    assert!(sent.len() <= NOTES.div_ceil(2), "{sent:#?}");
    assert_journal_closed(&vault);
    assert!(
        leftover_temp_files(&vault).is_empty(),
        "{:?}",
        leftover_temp_files(&vault)
    );
    eprintln!(
        "torture: {kills} kills, {damaged} notes damaged as a power loss could, {} search requests for 40 searches, {sends_ok} sends, {sends_unknown} unknown outcomes, {:?}",
        server.requests(),
        began.elapsed()
    );
}

fn smtp_config(smtp: &SmtpServer) -> String {
    format!(
        "[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"smtp\"\nsmtp_url = \"smtp://127.0.0.1:{}\"\nfrom = \"Agent <agent@example.com>\"\n",
        smtp.port
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_during_an_smtp_send_never_sends_twice_and_says_unknown_outcome() {
    let server = SearxServer::start(Duration::ZERO).await;
    let smtp = SmtpServer::start_with_delay(Duration::from_secs(3));
    let vault = TestVault::new(&server.base_url(), &smtp_config(&smtp));
    let daemon = vault.start();
    vault.drop_note(
        "mail.md",
        &note_with_calls(
            "Mail",
            &[json!({ "name": "send_notification", "parameters": {
                "recipient": "bob@example.org", "subject": "Once only", "body": "Exactly once." } })],
        ),
    );
    // The send is in flight: the journal has its start, and the server has the whole message
    // and holds back its reply, so the outcome cannot be recorded before the kill.
    wait_until("the send is running", DEADLINE, || {
        vault.exists("In_Progress", "mail.md")
            && !vault.journal().running_calls().unwrap().is_empty()
            && smtp.answering() == 1
    });
    daemon.kill9();
    assert!(
        smtp.received().is_empty(),
        "the server has not answered yet"
    );

    let daemon = vault.start_logged("after-kill.log");
    let text = vault.wait_until_in("Failed", "mail.md");
    let results = results_in(&text);
    assert_eq!(results.len(), 1, "{text}");
    assert_eq!(results[0]["error"]["code"], "UNKNOWN_OUTCOME");
    assert_eq!(results[0]["error"]["retryable"], false);
    assert!(text.contains("> [!failure]- send_notification · UNKNOWN_OUTCOME"));

    // The message the killed daemon handed over arrives once the server answers; no second one.
    wait_until("the server has the first message", DEADLINE, || {
        !smtp.received().is_empty()
    });
    std::thread::sleep(Duration::from_millis(500));
    drop(daemon);
    assert_eq!(vault.once().0, 0);
    let mails = smtp.received();
    assert_eq!(mails.len(), 1, "at most one message in total");
    let call_id = results[0]["call_id"].as_str().unwrap();
    assert!(mails[0].data.contains(&format!("<{call_id}@")));
    assert_journal_closed(&vault);
}

// The identity stamp is written without an fsync of its own (journal/mod.rs, "The stamp"): a
// power loss can leave the note empty or zero-filled where a kill -9 cannot. Both are made
// here by hand after the kill: the note is put back as claimed, from the journal, and its
// send is not made again.
async fn a_note_a_crash_damaged_mid_send_is_put_back_from_the_journal(damage: &[u8]) {
    let server = SearxServer::start(Duration::ZERO).await;
    let smtp = SmtpServer::start_with_delay(Duration::from_secs(3));
    let vault = TestVault::new(&server.base_url(), &smtp_config(&smtp));
    let daemon = vault.start();
    let claimed = note_with_calls(
        "Mail",
        &[json!({ "name": "send_notification", "parameters": {
            "recipient": "bob@example.org", "subject": "Once only", "body": "Exactly once." } })],
    );
    let claimed = format!("{claimed}\nThe agent's own words, which must survive.\n");
    vault.drop_note("mail.md", &claimed);
    wait_until("the send is running", DEADLINE, || {
        vault.exists("In_Progress", "mail.md")
            && !vault.journal().running_calls().unwrap().is_empty()
            && smtp.answering() == 1
    });
    daemon.kill9();
    std::fs::write(vault.path("In_Progress", "mail.md"), damage).unwrap();

    let daemon = vault.start_logged("after-damage.log");
    let text = vault.wait_until_in("Failed", "mail.md");
    assert!(
        text.contains("The agent's own words, which must survive."),
        "the note as claimed: {text}"
    );
    let results = results_in(&text);
    assert_eq!(results.len(), 1, "{text}");
    assert_eq!(results[0]["error"]["code"], "UNKNOWN_OUTCOME", "{text}");
    wait_until("the server has the first message", DEADLINE, || {
        !smtp.received().is_empty()
    });
    std::thread::sleep(Duration::from_millis(500));
    let log = daemon.log_text();
    drop(daemon);
    assert_eq!(smtp.received().len(), 1, "sent once");
    assert!(log.contains("put back as it was claimed"), "{log}");
    assert_journal_closed(&vault);
}

// A power loss can also undo a finished note's last steps after its run was recorded as
// ended (the results' rename and the move are the flusher's): the note is back in
// In_Progress, and its stamped version, never fsynced, can be empty. Recovery finds the text
// by the note's name and the ended run, puts it back, and sends nothing again.
#[tokio::test(flavor = "multi_thread")]
async fn a_finished_send_note_a_crash_left_empty_in_in_progress_is_put_back_and_not_resent() {
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "");
    let outbox = vault.dir.path().join("outbox");
    vault.write_config(
        &server.base_url(),
        &format!(
            "[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"file\"\noutbox = {:?}\n",
            outbox.display().to_string()
        ),
    );
    let note = note_with_calls("Mail", &[torture_send(1)]);
    vault.drop_note("mail.md", &format!("{note}\nWords that must survive.\n"));
    assert_eq!(vault.once().0, 0);
    assert!(vault.exists("Done", "mail.md"));
    // What the power loss left: the move and the results' rename undone, the stamp empty.
    std::fs::rename(
        vault.path("Done", "mail.md"),
        vault.path("In_Progress", "mail.md"),
    )
    .unwrap();
    std::fs::write(vault.path("In_Progress", "mail.md"), b"").unwrap();

    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    assert!(log.contains("put back as it was claimed"), "{log}");
    let folder = ["Done", "Failed"]
        .into_iter()
        .find(|f| vault.exists(f, "mail.md"))
        .unwrap_or_else(|| panic!("{:?}", vault.all_notes()));
    let text = vault.read(folder, "mail.md");
    assert!(text.contains("Words that must survive."), "{text}");
    assert_eq!(outbox_message_ids(&outbox).len(), 1, "sent once: {text}");
}

// Only start-up recovery puts a damaged note back: found empty at a rescan while the daemon
// runs, a stranded note may be an editor's save in progress (truncated, not yet written),
// and the journal's older text must not be renamed over it.
#[tokio::test(flavor = "multi_thread")]
async fn an_empty_stranded_note_found_at_a_rescan_is_not_replaced_by_the_claimed_text() {
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "rescan_interval = \"1s\"\n");
    let daemon = vault.start_logged("rescan.log");
    let journal = vault.journal();
    let run = journal.begin_run("In_Progress/saved.md").unwrap();
    journal
        .keep_claimed_text(run, "# Old\n\nThe text as claimed.\n")
        .unwrap();
    drop(journal);
    std::fs::write(vault.path("In_Progress", "saved.md"), b"").unwrap();
    wait_until("the rescan looked at the stranded run", DEADLINE, || {
        daemon
            .log_text()
            .contains("retrying a run whose note was not finished")
    });
    std::thread::sleep(Duration::from_millis(500));
    let log = daemon.log_text();
    drop(daemon);
    assert!(!log.contains("put back as it was claimed"), "{log}");
    let found: Vec<String> = vault
        .all_notes()
        .into_iter()
        .filter(|n| n.ends_with("saved.md"))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    let (folder, name) = found[0].split_once('/').unwrap();
    let text = vault.read(folder, name);
    assert!(!text.contains("The text as claimed."), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_note_a_crash_left_empty_mid_send_is_put_back_from_the_journal() {
    a_note_a_crash_damaged_mid_send_is_put_back_from_the_journal(b"").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_note_a_crash_left_zero_filled_mid_send_is_put_back_from_the_journal() {
    a_note_a_crash_damaged_mid_send_is_put_back_from_the_journal(&[0u8; 300]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_send_recorded_before_the_kill_is_written_without_sending_again() {
    // The outcome reached the journal but not the note (a kill between the two): recovery
    // writes the recorded result and sends nothing.
    let server = SearxServer::start(Duration::ZERO).await;
    let smtp = SmtpServer::start();
    let vault = TestVault::new(&server.base_url(), &smtp_config(&smtp));
    let text = note_with_calls(
        "Mail",
        &[json!({ "name": "send_notification", "parameters": {
            "recipient": "bob@example.org", "subject": "s", "body": "b" } })],
    );
    let call_id = only_call_id(&vault, &text);
    vault.drop_into("In_Progress", "mail.md", text.as_bytes());
    let journal = vault.journal();
    let run = journal.begin_run("In_Progress/mail.md").unwrap();
    journal
        .call_started(
            run,
            &call_id,
            "send_notification",
            vaultd::tools::Effect::ExternalSideEffect,
            &json!({}),
        )
        .unwrap();
    let mut recorded = vaultd::call::CallResult::failed_now(
        &call_id,
        "send_notification",
        vaultd::call::CallError::new(vaultd::call::ErrorCode::ExecutionError, "x"),
    );
    recorded.outcome = Ok(vaultd::call::ToolOutput {
        data: json!({ "success": true, "message_id": "<recorded@test>" }),
        summary: "sent".into(),
        undo: None,
    });
    journal.call_finished(run, &recorded).unwrap();
    drop(journal);

    assert_eq!(vault.once().0, 0);
    let text = vault.read("Done", "mail.md");
    let results = results_in(&text);
    assert_eq!(results.len(), 1, "{text}");
    assert_eq!(results[0]["data"]["message_id"], "<recorded@test>");
    assert!(smtp.received().is_empty(), "nothing sent again");
    assert_journal_closed(&vault);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_result_written_before_the_kill_still_sends_the_note_to_failed() {
    // Killed after the results were written into the note but before it moved on: the run's
    // failure is in the note, not in this start's results.
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "");
    let original = note_with_calls("Bad", &[json!({ "name": "no_such_tool" })]);
    let call_id = only_call_id(&vault, &original);
    let failed = vaultd::call::CallResult::failed_now(
        &call_id,
        "no_such_tool",
        vaultd::call::CallError::new(vaultd::call::ErrorCode::UnknownTool, "no tool named x"),
    );
    let written = vaultd::note::append_blocks(
        &original,
        &[vaultd::note::Block::Result(&failed)],
        "in_progress",
        std::time::SystemTime::now(),
    );
    vault.drop_into("In_Progress", "bad.md", written.as_bytes());
    let journal = vault.journal();
    let run = journal.begin_run("In_Progress/bad.md").unwrap();
    journal.call_finished(run, &failed).unwrap();
    journal.results_written(run, &[&call_id]).unwrap();
    drop(journal);

    assert_eq!(vault.once().0, 0);
    let text = vault.read("Failed", "bad.md");
    assert_eq!(results_in(&text).len(), 1, "{text}");
    assert_eq!(property(&text, "tool_status").as_deref(), Some("failed"));
    assert_journal_closed(&vault);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_result_whose_written_mark_a_kill_took_runs_again_once_deleted() {
    // Killed after the results write and the move, before the "written" mark (not waited
    // for) committed: the journal holds the outcome as recorded only. Once the note is
    // finished, deleting the result block must still mean "run again" (§9.3), not "write the
    // recorded result back".
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "");
    let id = "n-0123456789ab";
    let original = vaultd::note::set_note_id(&note_with_calls("Look", &[search_call("q")]), id);
    let call_id = only_call_id(&vault, &original);
    let timed_out = vaultd::call::CallResult::failed_now(
        &call_id,
        "search_web",
        vaultd::call::CallError::new(vaultd::call::ErrorCode::Timeout, "the search took too long"),
    );
    let written = vaultd::note::append_blocks(
        &original,
        &[vaultd::note::Block::Result(&timed_out)],
        "in_progress",
        std::time::SystemTime::now(),
    );
    vault.drop_into("In_Progress", "look.md", written.as_bytes());
    let journal = vault.journal();
    let run = journal
        .begin_note_run(
            "In_Progress/look.md",
            Some(id),
            Some("Needs_Action/look.md"),
            None,
        )
        .unwrap();
    journal.call_finished(run, &timed_out).unwrap();
    drop(journal);
    assert_eq!(vault.once().0, 0);
    let failed = vault.read("Failed", "look.md");
    assert_eq!(results_in(&failed).len(), 1, "{failed}");
    assert_eq!(server.requests(), 0);

    // The agent deletes the TIMEOUT and moves the note back.
    std::fs::remove_file(vault.path("Failed", "look.md")).unwrap();
    vault.drop_note("look.md", &original);
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let text = vault.read("Done", "look.md");
    let results = results_in(&text);
    assert_eq!(results.len(), 1, "{text}");
    assert_eq!(
        results[0]["ok"], true,
        "run again, not the old TIMEOUT: {text}"
    );
    assert_eq!(server.requests(), 1);
    assert_journal_closed(&vault);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_note_unknown_to_the_journal_in_in_progress_is_finished_once() {
    // docs/design.md §8.15: a kill between the claim (rename) and its journal record.
    let server = SearxServer::start(Duration::ZERO).await;
    let smtp = SmtpServer::start();
    let vault = TestVault::new(&server.base_url(), &smtp_config(&smtp));
    vault.drop_into(
        "In_Progress",
        "mixed.md",
        note_with_calls(
            "Mixed",
            &[
                search_call("recovered"),
                json!({ "name": "send_notification", "parameters": {
                    "recipient": "bob@example.org", "subject": "s", "body": "b" } }),
            ],
        )
        .as_bytes(),
    );
    assert_eq!(vault.once().0, 0);
    let text = vault.read("Failed", "mixed.md");
    let results = results_in(&text);
    assert_eq!(results.len(), 2, "{text}");
    assert_eq!(results[0]["ok"], true);
    assert_eq!(results[1]["error"]["code"], "UNKNOWN_OUTCOME");
    assert!(smtp.received().is_empty());
    assert_eq!(server.queries(), vec!["recovered"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn temp_files_of_an_interrupted_write_are_swept_at_start() {
    let server = SearxServer::start(Duration::ZERO).await;
    // The vault tools may write under Agent/ and into Projects/*/log.md.
    let vault = TestVault::new(
        &server.base_url(),
        "[tools.vault]\nwrite = [\"Agent/**\", \"Projects/*/log.md\"]\n",
    );
    let stale = [
        "In_Progress/.a.md.vaultd-4900000-3.tmp",
        "Done/sub/.b.md.vaultd-4900001-0.tmp",
        // A vault tool's edit killed before its file took the note's place.
        "Agent/.log.md.vaultd-4900002-7.tmp",
        "Agent/deep/.x.md.vaultd-4900002-8.tmp",
        "Projects/launch/.log.md.vaultd-4900002-9.tmp",
    ];
    let kept = [
        "Needs_Action/.a.md.tmp",
        "Done/.c.md.vaultd-notes.tmp",
        // Outside where the vault tools write: not theirs to sweep.
        "Notes/.n.md.vaultd-4900003-1.tmp",
        "Agent/.hidden/.h.md.vaultd-4900003-2.tmp",
    ];
    for f in stale.iter().chain(&kept) {
        let p = vault.root.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "half a note").unwrap();
    }
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    for f in stale {
        assert!(!vault.root.join(f).exists(), "{f} swept");
    }
    for f in kept {
        assert!(vault.root.join(f).exists(), "{f} not ours: kept");
    }
}

/// A daemon killed while a lone note's search runs leaves the temp file its results write
/// made beside the note meanwhile (`note::TempFile`, made while the call runs); the next start
/// sweeps it and finishes the note, with its one result.
#[tokio::test(flavor = "multi_thread")]
async fn a_kill_during_a_lone_notes_call_leaves_a_temp_file_the_next_start_sweeps() {
    let server = SearxServer::start(Duration::from_secs(60)).await;
    let vault = TestVault::new(&server.base_url(), "");
    let mut daemon = vault.start();
    vault.drop_note("slow.md", &note_with_calls("Slow", &[search_call("slow")]));
    wait_until("the search under way", Duration::from_secs(20), || {
        server.requests() == 1 && !leftover_temp_files(&vault).is_empty()
    });
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
    let left = leftover_temp_files(&vault);
    assert!(
        left.len() == 1 && left[0].starts_with("In_Progress/.slow.md.vaultd-"),
        "{left:?}"
    );
    server.set_delay(Duration::ZERO);
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let left = leftover_temp_files(&vault);
    assert!(left.is_empty(), "{left:?}");
    let results = results_in(&vault.read("Done", "slow.md"));
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["ok"], true);
    assert_eq!(server.queries(), vec!["slow", "slow"]);
}

/// The call id `vaultd check --json` gives the single call of `text`.
fn only_call_id(vault: &TestVault, text: &str) -> String {
    let path = vault.dir.path().join("check-me.md");
    std::fs::write(&path, text).unwrap();
    let out = vault
        .cmd()
        .args(["check", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let calls = v["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    calls[0]["call_id"].as_str().unwrap().to_string()
}

#[test]
fn result_counts_sees_every_block() {
    let r = |id: &str| {
        format!(
            "\n> [!success]- x\n> ```json\n> {{\"tool_result\": {{\"call_id\": \"{id}\", \"ok\": true}}}}\n> ```\n"
        )
    };
    let text = format!("# n\n{}{}{}", r("a"), r("b"), r("a"));
    let counts = result_counts(&text);
    assert_eq!(counts, BTreeMap::from([("a".into(), 2), ("b".into(), 1)]));
}

/// Torture note `i` for the stress test with people and editors: a search and an email.
fn people_note(i: usize) -> (String, String) {
    let name = format!("p{i:02}.md");
    let text = note_with_calls(
        &name,
        &[
            search_call(&format!("p{i}")),
            json!({ "name": "send_notification", "parameters": {
                "recipient": "bob@example.org", "subject": format!("p{i}"), "body": "once" } }),
        ],
    );
    (name, text)
}

/// Message-IDs of the emails in the outbox, with how often each was sent.
fn outbox_message_ids(outbox: &std::path::Path) -> BTreeMap<String, usize> {
    let mut ids = BTreeMap::new();
    for entry in std::fs::read_dir(outbox).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        if let Some(line) = text
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("message-id:"))
        {
            *ids.entry(line[11..].trim().to_string()).or_insert(0) += 1;
        }
    }
    ids
}

/// The outbox's Message-IDs, each asserted sent once. A double send first keeps the vault,
/// its journal and the daemons' logs in the temp dir, for whoever looks into it.
fn sent_once(vault: &TestVault, outbox: &std::path::Path) -> BTreeMap<String, usize> {
    let sent = outbox_message_ids(outbox);
    if !sent.values().all(|&c| c == 1) {
        let keep = std::env::temp_dir().join(format!("vaultd-sent-twice-{}", std::process::id()));
        let _ = std::process::Command::new("cp")
            .arg("-a")
            .arg(vault.dir.path())
            .arg(&keep)
            .status();
        eprintln!("the vault is kept in {}", keep.display());
    }
    assert!(sent.values().all(|&c| c == 1), "sent twice: {sent:#?}");
    sent
}

/// Subjects of the emails in the outbox, with how often each was sent.
fn outbox_subjects(outbox: &std::path::Path) -> BTreeMap<String, usize> {
    let mut subjects = BTreeMap::new();
    for entry in std::fs::read_dir(outbox).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        if let Some(line) = text
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("subject:"))
        {
            *subjects.entry(line[8..].trim().to_string()).or_insert(0) += 1;
        }
    }
    subjects
}

/// `mv Needs_Action/x.md "Needs_Action/x (renamed).md"` 0–80 ms after the drop: inside the
/// default `moved_in_grace`, so often the name a link claim left behind (docs/design.md §9.10).
fn rename_inside_the_grace(vault: &TestVault, name: &str, rng: &mut Rng) -> bool {
    std::thread::sleep(Duration::from_millis(rng.below(81)));
    let renamed = format!("{} (renamed).md", name.trim_end_matches(".md"));
    !vault.exists("Needs_Action", &renamed)
        && std::fs::rename(
            vault.path("Needs_Action", name),
            vault.path("Needs_Action", &renamed),
        )
        .is_ok()
}

/// A sync client's copy of the note as claimed (`x (1).md`, Google Drive's name), made once
/// the claim stamped it in In_Progress (within a second, else none).
fn copy_at_its_claim(vault: &TestVault, name: &str) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        if let Ok(text) = std::fs::read_to_string(vault.path("In_Progress", name))
            && text.contains("tool_note:")
        {
            let copy = format!("{} (1).md", name.trim_end_matches(".md"));
            if vault.exists("Needs_Action", &copy) {
                return false;
            }
            vault.drop_note(&copy, &text);
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// The rename-inside-the-grace and copy-at-its-claim moves (docs/design.md §9.10). With them
/// a copy made at the claim and seen by a restarted daemon before the original's recovery
/// ran sent the email a second time; a copy now waits for the note it copies.
const WITH_COPY_MOVES: bool = true;

#[tokio::test(flavor = "multi_thread")]
async fn kill_nine_with_hand_moves_and_editor_resaves_sends_once_and_loses_nothing() {
    let server = SearxServer::start(Duration::from_millis(100)).await;
    let vault = TestVault::new(&server.base_url(), "");
    let outbox = vault.dir.path().join("outbox");
    vault.write_config(
        &server.base_url(),
        &format!(
            "workers = 4\nsettle = \"200ms\"\n[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"file\"\noutbox = {:?}\n",
            outbox.display().to_string()
        ),
    );
    const NOTES: usize = 16;
    let notes: Vec<(String, String)> = (0..NOTES).map(people_note).collect();
    let mut dropped = 0;
    while dropped < NOTES / 2 {
        vault.drop_note(&notes[dropped].0, &notes[dropped].1);
        dropped += 1;
    }
    let seed = std::env::var("VAULTD_TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_2026_0010);
    let mut rng = Rng::new(seed);
    let (mut moves, mut resaves, mut renames, mut copies) = (0, 0, 0, 0);
    // Notes renamed inside the grace: an editor's old buffer saved back under the name the
    // note had only before that rename is outside what vaultd recognises (docs/design.md
    // §9.10 lists the three rules: it is neither at a path a note was claimed from, nor a
    // sync client's duplicate name, nor a claimed file), so the re-save move skips them.
    let mut renamed_notes: std::collections::HashSet<String> = Default::default();
    for k in 0..10 {
        server.set_delay(Duration::from_millis(50 + rng.below(151)));
        let daemon = RunningDaemon::start(
            vault.cmd(),
            vault.dir.path().join(format!("people-{k:02}.log")),
        );
        if dropped < NOTES {
            let (name, text) = &notes[dropped];
            vault.drop_note(name, text);
            dropped += 1;
            match rng.below(3) {
                0 if WITH_COPY_MOVES && rename_inside_the_grace(&vault, name, &mut rng) => {
                    renamed_notes.insert(name.clone());
                    renames += 1
                }
                1 if WITH_COPY_MOVES && copy_at_its_claim(&vault, name) => copies += 1,
                _ => {}
            }
        }
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(rng.below(200)));
            let (name, text) = &notes[rng.below(dropped as u64) as usize];
            if rng.below(3) > 0 {
                // A person moves a note being worked on back to the inbox.
                if vault.exists("In_Progress", name)
                    && !vault.exists("Needs_Action", name)
                    && std::fs::rename(
                        vault.path("In_Progress", name),
                        vault.path("Needs_Action", name),
                    )
                    .is_ok()
                {
                    moves += 1;
                }
            } else if !vault.exists("Needs_Action", name) && !renamed_notes.contains(name) {
                // An editor saves its old buffer back where the note was (temp + rename).
                vault.drop_note(name, text);
                resaves += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(rng.below(300)));
        daemon.kill9();
        // A person moves what the dead daemon left in In_Progress back to the inbox.
        for name in vault.notes_in("In_Progress") {
            let rel = name.trim_start_matches("In_Progress/");
            if rng.below(2) == 0
                && !vault.exists("Needs_Action", rel)
                && std::fs::rename(
                    vault.path("In_Progress", rel),
                    vault.path("Needs_Action", rel),
                )
                .is_ok()
            {
                moves += 1;
            }
        }
    }
    while dropped < NOTES {
        vault.drop_note(&notes[dropped].0, &notes[dropped].1);
        dropped += 1;
    }
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");

    let all = vault.all_notes();
    assert!(vault.notes_in("In_Progress").is_empty(), "{all:#?}");
    // 0 lost: every note is in Done or Failed (copies beside it, numbered) — or back in the
    // inbox with every call answered (checked below): a person moved it there after its
    // results were written, before its move, and a note with no pending call stays (§1).
    for (name, _) in &notes {
        let stem = name.trim_end_matches(".md");
        assert!(
            all.iter().any(|n| {
                (n.starts_with("Done/")
                    || n.starts_with("Failed/")
                    || n.starts_with("Needs_Action/"))
                    && n.split('/')
                        .nth(1)
                        .is_some_and(|f| f == name.as_str() || f.starts_with(&format!("{stem} (")))
            }),
            "{name} lost: {all:#?}"
        );
    }
    // 0 duplicate results: no call has two result blocks in one note.
    for n in &all {
        let text = std::fs::read_to_string(vault.root.join(n)).unwrap();
        let counts = result_counts(&text);
        assert!(counts.values().all(|&c| c == 1), "{n}: {counts:?}\n{text}");
        assert_eq!(counts.len(), 2, "{n}: both calls answered\n{text}");
    }
    // 0 duplicate deliveries: every Message-ID at most once in the outbox, and every note's
    // email (its subject) at most once, whatever copies of it got their own ids.
    let sent = sent_once(&vault, &outbox);
    assert!(sent.len() <= NOTES, "{sent:#?}");
    let subjects = outbox_subjects(&outbox);
    assert!(
        subjects.values().all(|&c| c == 1),
        "a note's email sent twice (seed {seed}): {subjects:#?}"
    );
    assert_journal_closed(&vault);
    eprintln!(
        "people torture: 10 kills, {moves} hand moves, {resaves} editor re-saves, {renames} renames inside the grace, {copies} copies at the claim, {} notes, {} emails",
        all.len(),
        sent.len()
    );
}
