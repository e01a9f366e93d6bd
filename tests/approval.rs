//! End-to-end tests of approval (docs/design.md §4): sends to unlisted recipients wait in
//! Pending_Approval/; a person decides by moving the note (`approval_via = "folder"`) or with
//! `vaultd approve` / `vaultd reject` (`approval_via = "cli"`); a decision counts only for the
//! exact parameters the question showed. Emails go to the file outbox, which the tests count.

use crate::util::searx::SearxServer;
use crate::util::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A vault whose emails go to an outbox folder; `*@example.org` is allowed.
struct MailVault {
    vault: TestVault,
    outbox: PathBuf,
    _search: SearxServer,
}

impl MailVault {
    async fn new(approval_via: &str) -> MailVault {
        let search = SearxServer::start(Duration::ZERO).await;
        let probe = TestVault::new(&search.base_url(), "");
        let outbox = probe.dir.path().join("outbox");
        probe.write_config(
            &search.base_url(),
            &format!(
                "approval_via = {approval_via:?}\n[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"file\"\noutbox = {:?}\nfrom = \"Agent <agent@example.com>\"\n",
                outbox.display().to_string()
            ),
        );
        MailVault {
            vault: probe,
            outbox,
            _search: search,
        }
    }

    /// The emails written to the outbox, each file's text.
    fn sent(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(&self.outbox) else {
            return Vec::new();
        };
        let mut out: Vec<String> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "eml"))
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect();
        out.sort();
        out
    }

    fn once_ok(&self) {
        let (code, log) = self.vault.once();
        assert_eq!(code, 0, "{log}");
    }

    /// `vaultd approve|reject NOTE`: (exit code, stdout, stderr).
    fn decide(&self, verb: &str, note: &Path) -> (i32, String, String) {
        let out = self
            .vault
            .cmd()
            .arg(verb)
            .arg(note)
            .output()
            .expect("run vaultd");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn mail_call(recipient: &str, subject: &str) -> Value {
    json!({ "name": "send_notification", "parameters": {
        "recipient": recipient, "subject": subject, "body": "Hello." } })
}

/// Waits until `folder/rel` exists and `ready` holds for its text.
fn wait_for(vault: &TestVault, folder: &str, rel: &str, ready: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(vault.path(folder, rel))
            && ready(&text)
        {
            return text;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{folder}/{rel} never got ready; vault holds {:#?}",
            vault.all_notes()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn questions(text: &str) -> usize {
    text.matches("> [!question] Approval needed").count()
}

fn error_code(r: &Value) -> &str {
    r["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unlisted_recipient_waits_for_approval_and_nothing_is_sent() {
    let m = MailVault::new("folder").await;
    m.vault.drop_note(
        "ask.md",
        &note_with_calls("Ask", &[mail_call("stranger@elsewhere.net", "Hi")]),
    );
    m.once_ok();
    let text = m.vault.read("Pending_Approval", "ask.md");
    assert_eq!(questions(&text), 1, "{text}");
    assert!(text.contains("stranger@elsewhere.net is not in allowed_recipients"));
    assert!(text.contains("move this note to `Approved/`"), "{text}");
    assert!(text.contains("\"tool_approval\""), "{text}");
    assert!(results_in(&text).is_empty());
    assert_eq!(
        property(&text, "tool_status").as_deref(),
        Some("pending_approval")
    );
    assert!(m.sent().is_empty());
    // Another round changes nothing: the note waits for a person, not for vaultd.
    m.once_ok();
    assert_eq!(m.vault.read("Pending_Approval", "ask.md"), text);
    assert!(m.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn moved_to_approved_it_is_sent_exactly_once_and_ends_in_done() {
    let m = MailVault::new("folder").await;
    let daemon = m.vault.start();
    m.vault.drop_note(
        "ok.md",
        &note_with_calls("Ok", &[mail_call("stranger@elsewhere.net", "Approved one")]),
    );
    m.vault.wait_until_in("Pending_Approval", "ok.md");
    assert!(m.sent().is_empty());
    m.vault.move_note("Pending_Approval", "Approved", "ok.md");
    let text = m.vault.wait_until_in("Done", "ok.md");
    drop(daemon);
    let results = results_in(&text);
    assert_eq!(results.len(), 1, "{text}");
    assert_eq!(results[0]["ok"], true, "{text}");
    assert_eq!(property(&text, "tool_status").as_deref(), Some("done"));
    let sent = m.sent();
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].contains("To: stranger@elsewhere.net"),
        "{}",
        sent[0]
    );
    // A later round sends nothing more.
    m.once_ok();
    assert_eq!(m.sent().len(), 1);
    assert!(m.vault.notes_in("Approved").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn moved_to_rejected_it_gets_rejected_and_stays_there() {
    let m = MailVault::new("folder").await;
    let daemon = m.vault.start();
    m.vault.drop_note(
        "no.md",
        &note_with_calls("No", &[mail_call("stranger@elsewhere.net", "Refused")]),
    );
    m.vault.wait_until_in("Pending_Approval", "no.md");
    m.vault.move_note("Pending_Approval", "Rejected", "no.md");
    let text = wait_for(&m.vault, "Rejected", "no.md", |t| !results_in(t).is_empty());
    drop(daemon);
    let results = results_in(&text);
    assert_eq!(results.len(), 1);
    assert_eq!(error_code(&results[0]), "REJECTED");
    assert_eq!(property(&text, "tool_status").as_deref(), Some("rejected"));
    assert!(m.sent().is_empty());
    m.once_ok();
    assert!(m.vault.exists("Rejected", "no.md"));
    assert!(m.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_allowed_send_goes_at_once_while_the_unlisted_one_waits() {
    let m = MailVault::new("folder").await;
    m.vault.drop_note(
        "mixed.md",
        &note_with_calls(
            "Mixed",
            &[
                mail_call("team@example.org", "Allowed"),
                mail_call("stranger@elsewhere.net", "Held"),
            ],
        ),
    );
    m.once_ok();
    let text = m.vault.read("Pending_Approval", "mixed.md");
    let results = results_in(&text);
    assert_eq!(results.len(), 1, "{text}");
    assert_eq!(results[0]["ok"], true);
    assert_eq!(questions(&text), 1);
    let sent = m.sent();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].contains("To: team@example.org"));

    m.vault
        .move_note("Pending_Approval", "Approved", "mixed.md");
    m.once_ok();
    let text = m.vault.read("Done", "mixed.md");
    assert_eq!(results_in(&text).len(), 2, "{text}");
    assert_eq!(property(&text, "tool_calls").as_deref(), Some("2"));
    assert_eq!(m.sent().len(), 2, "the allowed one is not sent again");
}

/// Replaces the recipient in the call block (the first occurrence: the call comes before its
/// question) and writes the note back, as an agent editing the call would.
fn edit_recipient(vault: &TestVault, folder: &str, rel: &str, from: &str, to: &str) {
    let text = vault.read(folder, rel);
    let needle = format!("\"recipient\": \"{from}\"");
    assert!(text.contains(&needle), "{text}");
    let edited = text.replacen(&needle, &format!("\"recipient\": \"{to}\""), 1);
    std::fs::write(vault.path(folder, rel), edited).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edited_held_call_is_held_again_not_sent() {
    let m = MailVault::new("folder").await;
    let mut call = mail_call("stranger@elsewhere.net", "Edited");
    call["id"] = json!("mail-1"); // the id stays; only the parameters change
    m.vault
        .drop_note("edit.md", &note_with_calls("Edit", &[call]));
    m.once_ok();
    assert_eq!(questions(&m.vault.read("Pending_Approval", "edit.md")), 1);

    // The agent changes the recipient after the question was written, then moves the note.
    edit_recipient(
        &m.vault,
        "Pending_Approval",
        "edit.md",
        "stranger@elsewhere.net",
        "other@elsewhere.net",
    );
    m.vault.move_note("Pending_Approval", "Approved", "edit.md");
    m.once_ok();
    let text = m.vault.read("Pending_Approval", "edit.md");
    assert!(m.sent().is_empty(), "an edited call is never sent unasked");
    assert_eq!(questions(&text), 2, "asked again:\n{text}");
    assert!(results_in(&text).is_empty());

    // Approved as now shown, it goes to the new recipient, once.
    m.vault.move_note("Pending_Approval", "Approved", "edit.md");
    m.once_ok();
    let text = m.vault.read("Done", "edit.md");
    assert_eq!(results_in(&text).len(), 1);
    let sent = m.sent();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].contains("To: other@elsewhere.net"), "{}", sent[0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_mode_ignores_a_hand_moved_note_and_honours_vaultd_approve() {
    let m = MailVault::new("cli").await;
    m.vault.drop_note(
        "cli.md",
        &note_with_calls("Cli", &[mail_call("stranger@elsewhere.net", "Via CLI")]),
    );
    m.once_ok();
    let waiting = m.vault.read("Pending_Approval", "cli.md");
    assert!(waiting.contains("run `vaultd approve NOTE`"), "{waiting}");

    // The agent moves its own note into Approved/: nothing happens to it.
    m.vault.move_note("Pending_Approval", "Approved", "cli.md");
    m.once_ok();
    assert_eq!(m.vault.read("Approved", "cli.md"), waiting);
    assert!(m.sent().is_empty());
    let daemon = m.vault.start();
    // The start-up scan has looked at Approved/ by the time the daemon says it started.
    assert_eq!(m.vault.read("Approved", "cli.md"), waiting);
    assert!(m.sent().is_empty());

    // A person puts it back and approves it with the CLI; the running daemon sends it.
    m.vault.move_note("Approved", "Pending_Approval", "cli.md");
    let (code, out, err) = m.decide("approve", &m.vault.path("Pending_Approval", "cli.md"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("approved c-"), "{out}");
    assert!(out.contains("stranger@elsewhere.net"), "{out}");
    assert!(out.contains("Approved/cli.md"), "{out}");
    let text = m.vault.wait_until_in("Done", "cli.md");
    drop(daemon);
    assert_eq!(results_in(&text)[0]["ok"], true, "{text}");
    assert_eq!(m.sent().len(), 1);

    // The approval counted once: the note is done, and approving it again is refused.
    let (code, _, err) = m.decide("approve", &m.vault.path("Done", "cli.md"));
    assert_ne!(code, 0);
    assert!(err.contains("not waiting for approval"), "{err}");
    m.once_ok();
    assert_eq!(m.sent().len(), 1);

    let log = m.vault.cmd().args(["log", "--json"]).output().unwrap();
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(
        log.lines()
            .any(|l| l.contains("\"event\":\"approval\"") && l.contains("\"approved\"")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_mode_vaultd_reject_writes_rejected_without_a_daemon() {
    let m = MailVault::new("cli").await;
    m.vault.drop_note(
        "rej.md",
        &note_with_calls("Rej", &[mail_call("stranger@elsewhere.net", "Refused")]),
    );
    m.once_ok();
    // A bare name is looked up in Pending_Approval/.
    let (code, out, err) = m.decide("reject", Path::new("rej.md"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("rejected c-"), "{out}");
    let text = m.vault.read("Rejected", "rej.md");
    let results = results_in(&text);
    assert_eq!(results.len(), 1);
    assert_eq!(error_code(&results[0]), "REJECTED");
    assert_eq!(property(&text, "tool_status").as_deref(), Some("rejected"));
    m.once_ok();
    assert_eq!(m.vault.read("Rejected", "rej.md"), text);
    assert!(m.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn vaultd_reject_stamps_this_vault_s_runner_like_every_write_of_the_daemon() {
    let m = MailVault::new("cli").await;
    m.vault.drop_note(
        "rej.md",
        &note_with_calls("Rej", &[mail_call("stranger@elsewhere.net", "Refused")]),
    );
    m.once_ok();
    // The held note as another runner last wrote it (docs/design.md §9.9).
    let held = m.vault.read("Pending_Approval", "rej.md");
    let me = property(&held, "tool_runner").expect("the claim stamps tool_runner");
    let theirs = held.replace(&format!("tool_runner: {me}"), "tool_runner: laptop-beef");
    assert_ne!(theirs, held);
    m.vault
        .write_in_place("Pending_Approval", "rej.md", &theirs);
    let (code, out, err) = m.decide("reject", Path::new("rej.md"));
    assert_eq!(code, 0, "{out}{err}");
    let text = m.vault.read("Rejected", "rej.md");
    assert_eq!(property(&text, "tool_runner"), Some(me), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_mode_a_call_edited_after_approval_is_held_again() {
    let m = MailVault::new("cli").await;
    let mut call = mail_call("stranger@elsewhere.net", "Edited");
    call["id"] = json!("mail-2");
    m.vault
        .drop_note("late.md", &note_with_calls("Late", &[call]));
    m.once_ok();
    let (code, out, err) = m.decide("approve", &m.vault.path("Pending_Approval", "late.md"));
    assert_eq!(code, 0, "{out}{err}");
    // Between the approval and the send, the agent changes the recipient.
    edit_recipient(
        &m.vault,
        "Approved",
        "late.md",
        "stranger@elsewhere.net",
        "attacker@elsewhere.net",
    );
    m.once_ok();
    let text = m.vault.read("Pending_Approval", "late.md");
    assert!(m.sent().is_empty(), "the edited call was sent:\n{text}");
    assert_eq!(questions(&text), 2, "{text}");

    // Approving what is shown now sends that, once.
    let (code, out, err) = m.decide("approve", &m.vault.path("Pending_Approval", "late.md"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("attacker@elsewhere.net"), "{out}");
    m.once_ok();
    m.vault.read("Done", "late.md");
    let sent = m.sent();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].contains("To: attacker@elsewhere.net"));
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_mode_approving_a_hand_moved_note_sends_it_once() {
    let m = MailVault::new("cli").await;
    m.vault.drop_note(
        "moved.md",
        &note_with_calls("Moved", &[mail_call("stranger@elsewhere.net", "Moved")]),
    );
    m.once_ok();
    m.vault
        .move_note("Pending_Approval", "Approved", "moved.md");
    let (code, out, err) = m.decide("approve", &m.vault.path("Approved", "moved.md"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("note is now Approved/moved.md"), "{out}");
    m.once_ok();
    let text = m.vault.read("Done", "moved.md");
    assert_eq!(results_in(&text)[0]["ok"], true, "{text}");
    assert_eq!(m.sent().len(), 1);
    m.once_ok();
    assert_eq!(m.sent().len(), 1);
}
