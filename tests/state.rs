//! One vault, one state (docs/design.md §9.11) and vaultd's own storage failing (§9.12), end to end:
//! two vaults made by `vaultd init` under one HOME, a vault renamed, a journal handed to the
//! wrong vault, the journal of the releases that shared one state, a full disk, a deleted
//! journal.

use crate::util::home::{Home, email_note, text};
use crate::util::searx::SearxServer;
use crate::util::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `vaultd init NAME` in `h`'s HOME: a second (third, …) vault beside `~/Notes`.
fn init_vault(h: &Home, name: &str) -> PathBuf {
    let out = h.vaultd_in(&h.home, &["init", name]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    h.home.join(name)
}

fn vaultd_in(h: &Home, vault: &Path, args: &[&str]) -> std::process::Output {
    h.vaultd_in(vault, args)
}

fn write(vault: &Path, rel: &str, body: &str) {
    let p = vault.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, body).unwrap();
}

fn read(vault: &Path, rel: &str) -> String {
    std::fs::read_to_string(vault.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Adds `line` to the `[tools.send_notification]` table of the config `init` wrote.
fn limit_sends(vault: &Path, line: &str) {
    let config = vault.join(".vaultd.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let anchor = "allowed_recipients = [\"me@example.com\"]";
    assert!(text.contains(anchor), "{text}");
    std::fs::write(&config, text.replace(anchor, &format!("{anchor}\n{line}"))).unwrap();
}

fn status_json(h: &Home, vault: &Path) -> serde_json::Value {
    let out = vaultd_in(h, vault, &["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("status --json is JSON")
}

fn append_note(id: &str, text: &str) -> String {
    note_with_calls(
        "Log",
        &[
            json!({ "name": "vault_append", "id": id, "parameters": { "path": "Agent/log.md", "text": text } }),
        ],
    )
}

// 1. Two vaults made by `vaultd init`, one HOME: undo records and rate windows do not cross.
#[test]
fn two_vaults_made_by_init_keep_their_undo_and_rate_windows_apart() {
    let h = Home::with_vault();
    let a = h.vault.clone();
    let b = init_vault(&h, "Work");
    for v in [&a, &b] {
        limit_sends(v, "rate_limit = { per_hour = 1 }");
    }
    // Each Welcome note sends one email: the second vault's is not counted against the first's.
    for v in [&a, &b] {
        let out = vaultd_in(&h, v, &["once"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let note = read(v, "Done/Welcome.md");
        assert_eq!(results_in(&note)[0]["ok"], true, "{note}");
    }
    assert_ne!(h.state_dir_of(&a), h.state_dir_of(&b));
    assert_eq!(h.outbox_of(&a).len(), 1);
    assert_eq!(h.outbox_of(&b).len(), 1);
    let (sa, sb) = (status_json(&h, &a), status_json(&h, &b));
    assert_ne!(sa["state_dir"], sb["state_dir"]);

    // The same call id in both vaults: B's undo never sees A's pre-image.
    write(&a, "Agent/log.md", "A's log\n");
    write(&b, "Agent/log.md", "B's log\n");
    write(
        &a,
        "Needs_Action/log.md",
        &append_note("add", "- a line in A"),
    );
    write(
        &b,
        "Needs_Action/log.md",
        &append_note("add", "- a line in B"),
    );
    for v in [&a, &b] {
        let out = vaultd_in(&h, v, &["once"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(v.join("Done/log.md").is_file(), "{}", text(&out.stderr));
    }
    let out = vaultd_in(&h, &b, &["undo", "add", "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(read(&b, "Agent/log.md"), "B's log\n");
    let out = vaultd_in(&h, &a, &["undo", "add", "--force"]);
    assert!(
        out.status.success(),
        "A's undo is A's, untouched by B's: {}",
        text(&out.stderr)
    );
    assert_eq!(read(&a, "Agent/log.md"), "A's log\n");
}

// 2. Renaming the vault folder keeps its state.
#[test]
fn renaming_the_vault_folder_keeps_its_state() {
    let h = Home::with_vault();
    limit_sends(&h.vault, "rate_limit = { per_hour = 1 }");
    let out = h.vaultd(&["once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state = h.state_dir_of(&h.vault);

    let moved = h.home.join("Renamed Notes");
    std::fs::rename(&h.vault, &moved).unwrap();
    assert_eq!(h.state_dir_of(&moved), state);
    let status = status_json(&h, &moved);
    assert_eq!(status["state_dir"], state.display().to_string());
    // The rate window came along: a second email this hour is refused.
    write(
        &moved,
        "Needs_Action/again.md",
        &email_note("me@example.com"),
    );
    let out = vaultd_in(&h, &moved, &["once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let note = read(&moved, "Failed/again.md");
    assert_eq!(
        results_in(&note)[0]["error"]["code"],
        "RATE_LIMITED",
        "{note}"
    );
    let out = vaultd_in(&h, &moved, &["log", "--json"]);
    assert!(
        text(&out.stdout).contains("Welcome.md"),
        "the history came along"
    );
}

// 3. A journal of vault A given to vault B with --state-dir is refused, naming both.
#[test]
fn a_journal_of_one_vault_given_to_another_is_refused_naming_both() {
    let h = Home::with_vault();
    let a = h.vault.clone();
    let b = init_vault(&h, "Work");
    let out = vaultd_in(&h, &a, &["once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let a_state = h.state_dir_of(&a);
    let a_state_arg = a_state.display().to_string();

    for args in [
        vec!["once", "--state-dir", &a_state_arg],
        vec!["status", "--state-dir", &a_state_arg],
        vec!["log", "--state-dir", &a_state_arg],
    ] {
        let out = vaultd_in(&h, &b, &args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted: {err}");
        assert!(err.contains(&a.display().to_string()), "{args:?}: {err}");
        assert!(err.contains(&b.display().to_string()), "{args:?}: {err}");
    }
    assert!(b.join("Needs_Action/Welcome.md").is_file(), "B ran nothing");
    assert_eq!(h.outbox_of(&a).len(), 1, "A's outbox holds A's email only");
    // A itself still opens it.
    let out = vaultd_in(&h, &a, &["status", "--state-dir", &a_state_arg]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Makes `vault`'s journal look like one the releases before wrote at the shared default:
/// `~/.local/state/vaultd/journal.sqlite`, with no vault recorded.
fn run_with_the_shared_state_of_old(h: &Home, vault: &Path) {
    let base = h.state_base();
    let out = vaultd_in(h, vault, &["once", "--state-dir", base.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let conn = rusqlite::Connection::open(base.join("journal.sqlite")).unwrap();
    conn.execute_batch(
        "DROP TABLE vault_owner; DROP TABLE journal_origin; DROP TABLE storage_probe;",
    )
    .unwrap();
}

// 4. The journal the releases before kept for every vault at once is adopted by the vault
// whose notes it knows, and left alone by any other.
#[test]
fn an_old_shared_journal_is_adopted_by_its_vault_and_refused_by_another() {
    let h = Home::with_vault();
    let a = h.vault.clone();
    run_with_the_shared_state_of_old(&h, &a);
    let base = h.state_base();
    let old_runner = std::fs::read_to_string(base.join("runner_id")).unwrap();
    write(&a, "Agent/log.md", "A's log\n");
    write(&a, "Needs_Action/log.md", &append_note("add", "- a line"));
    let out = vaultd_in(&h, &a, &["once", "--state-dir", base.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let conn = rusqlite::Connection::open(base.join("journal.sqlite")).unwrap();
    conn.execute_batch("DELETE FROM vault_owner").unwrap();
    drop(conn);

    // Another vault starts first: the old journal is not its own; it starts one of its own.
    let b = init_vault(&h, "Work");
    write(&b, "Agent/log.md", "B's log\n");
    let out = vaultd_in(&h, &b, &["once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(base.join("journal.sqlite").is_file(), "left where it was");
    // B's own journal never saw call `add`: nothing of A's is found there to undo.
    let out = vaultd_in(&h, &b, &["undo", "add", "--force"]);
    assert!(
        text(&out.stderr).contains("NOT_FOUND: no recorded vault change for call add"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(read(&b, "Agent/log.md"), "B's log\n");
    let out = vaultd_in(&h, &b, &["log", "--json"]);
    assert!(
        !text(&out.stdout).contains("log.md"),
        "{}",
        text(&out.stdout)
    );

    // The vault whose notes it knows adopts it: moved into its own state dir, runner id too.
    let out = vaultd_in(&h, &a, &["status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("adopted the journal"),
        "{}",
        text(&out.stderr)
    );
    let a_state = h.state_dir_of(&a);
    assert!(!base.join("journal.sqlite").exists());
    assert!(a_state.join("journal.sqlite").is_file());
    assert_eq!(
        std::fs::read_to_string(a_state.join("runner_id")).unwrap(),
        old_runner
    );
    let out = vaultd_in(&h, &a, &["undo", "add", "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(read(&a, "Agent/log.md"), "A's log\n");
    // And a later start of A runs on it without asking (its own notes, its own runner id).
    write(&a, "Needs_Action/later.md", &email_note("me@example.com"));
    let out = vaultd_in(&h, &a, &["once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(a.join("Done/later.md").is_file(), "{}", text(&out.stderr));
    // B, given A's adopted journal, is refused by name.
    let out = vaultd_in(
        &h,
        &b,
        &["status", "--state-dir", a_state.to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(&a.display().to_string()));
}

// 5. A deleted journal while the vault holds notes this runner stamped: `run`/`once` refuse,
// naming --new-journal; with it, a stamped pending send is held, not sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_journal_starts_only_with_new_journal_and_holds_a_stamped_send() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(
        &search.base_url(),
        "[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n",
    );
    let send = note_with_calls(
        "Report",
        &[json!({ "name": "send_notification", "parameters": {
            "recipient": "bob@example.org", "subject": "Report", "body": "Once." } })],
    );
    vault.drop_note("report.md", &send);
    assert_eq!(vault.once().0, 0);
    let done = vault.read("Done", "report.md");
    assert!(property(&done, "tool_runner").is_some(), "{done}");
    let outbox = || {
        std::fs::read_dir(vault.state.join("outbox"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    assert_eq!(outbox(), 1);
    // The note as it was right after its claim (stamped, no result yet), restored from a
    // backup; and the journal gone.
    let claimed = done
        .split("\n> [!")
        .next()
        .unwrap()
        .replace("tool_status: done", "tool_status: running");
    assert!(results_in(&claimed).is_empty(), "{claimed}");
    for f in ["journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm"] {
        let _ = std::fs::remove_file(vault.state.join(f));
    }
    vault.drop_note("report restored.md", &claimed);

    let (code, log) = vault.once();
    assert_ne!(code, 0, "{log}");
    assert!(log.contains("--new-journal"), "{log}");
    assert!(log.contains("Done/report.md"), "names the notes: {log}");
    assert!(vault.exists("Needs_Action", "report restored.md"));
    assert_eq!(outbox(), 1);
    // `run` refuses the same way (and is killed, not waited for forever, if it does not).
    let mut run = RunningDaemon::spawn(vault.cmd(), vault.dir.path().join("run.log"));
    let mut exited = None;
    wait_until("`run` to refuse", DEADLINE, || {
        exited = run.child.try_wait().unwrap();
        exited.is_some()
    });
    assert!(!exited.unwrap().success());
    assert!(
        run.log_text().contains("--new-journal"),
        "{}",
        run.log_text()
    );

    let (code, log) = vault
        .cmd()
        .args(["once", "--new-journal"])
        .output()
        .map(|o| (o.status.code().unwrap_or(-1), text(&o.stderr)))
        .unwrap();
    assert_eq!(code, 0, "{log}");
    let held = vault.read("Pending_Approval", "report restored.md");
    assert!(held.contains("may already have run"), "{held}");
    assert!(held.contains("--new-journal"), "{held}");
    assert_eq!(outbox(), 1, "not sent again");
    // Asked once: later starts do not ask again, and a fresh note runs.
    vault.drop_note("fresh.md", &send.replace("Once.", "New."));
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    assert!(vault.exists("Done", "fresh.md"), "{log}");
    assert_eq!(outbox(), 2);
}

// 5b. The same for a journal emptied (truncated to nothing) rather than deleted.
#[tokio::test(flavor = "multi_thread")]
async fn an_emptied_journal_is_refused_like_a_deleted_one() {
    let search = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&search.base_url(), "");
    vault.drop_note("a.md", &note_with_calls("A", &[search_call("one")]));
    assert_eq!(vault.once().0, 0);
    // A note finished long ago counts too: the start-up scan reads every note while the
    // journal knows none, not only those changed inside `runner_window`.
    let done = std::fs::File::options()
        .write(true)
        .open(vault.root.join("Done/a.md"))
        .unwrap();
    done.set_modified(std::time::SystemTime::now() - Duration::from_secs(90 * 86_400))
        .unwrap();
    for f in ["journal.sqlite-wal", "journal.sqlite-shm"] {
        let _ = std::fs::remove_file(vault.state.join(f));
    }
    std::fs::write(vault.state.join("journal.sqlite"), b"").unwrap();
    let (code, log) = vault.once();
    assert_ne!(code, 0, "{log}");
    assert!(log.contains("--new-journal"), "{log}");
    assert!(log.contains("Done/a.md"), "names the note: {log}");
}

// ---------------------------------------------------------------------------------------------
// vaultd's own storage failing (§9.12). Two real ways to make the journal's writes fail: a
// small tmpfs filled up (needs `mount`, skipped with a notice where it is refused), and a file
// size limit (RLIMIT_FSIZE, set on the running daemon with prlimit: works anywhere).

/// How the journal's storage is made to refuse writes, and given back.
trait Squeeze {
    fn fill(&mut self);
    fn release(&mut self);
}

/// A tmpfs mounted on the state dir, filled to the last byte by a filler file.
struct FullTmpfs {
    mount: PathBuf,
    filler: PathBuf,
}

impl FullTmpfs {
    /// None (with a notice) where mounting is refused.
    fn mount_on(dir: &Path) -> Option<FullTmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs"])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(FullTmpfs {
                mount: dir.to_path_buf(),
                filler: dir.join("filler"),
            }),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs here ({}); the file-size-limit variant covers §9.12",
                    text(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: no `mount` ({e}); the file-size-limit variant covers §9.12");
                None
            }
        }
    }
}

impl Squeeze for FullTmpfs {
    fn fill(&mut self) {
        use std::io::Write;
        let mut f = std::fs::File::create(&self.filler).unwrap();
        let chunk = vec![0u8; 4096];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        // SQLite's WAL grows by whole frames: a few bytes left would still take none.
        let _ = f.sync_all();
    }

    fn release(&mut self) {
        std::fs::remove_file(&self.filler).unwrap();
    }
}

impl Drop for FullTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.mount)
            .status();
    }
}

/// RLIMIT_FSIZE on the running daemon at the journal's WAL size now: the next frame appended
/// fails with EFBIG (notes, a few KB, still fit). The daemon's log goes through a pipe, which
/// the limit does not touch.
struct FileSizeLimit {
    pid: i32,
    wal: PathBuf,
}

impl FileSizeLimit {
    fn set(&self, bytes: u64) {
        let limit = libc::rlimit {
            rlim_cur: bytes,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: prlimit with a valid rlimit and no old-value pointer.
        let rc =
            unsafe { libc::prlimit(self.pid, libc::RLIMIT_FSIZE, &limit, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    }
}

impl Squeeze for FileSizeLimit {
    fn fill(&mut self) {
        let size = std::fs::metadata(&self.wal)
            .expect("the journal has a WAL")
            .len();
        assert!(
            size > 16 * 1024,
            "WAL of {size} bytes: a note would not fit under it"
        );
        self.set(size);
    }

    fn release(&mut self) {
        self.set(libc::RLIM_INFINITY);
    }
}

/// `vaultd run` with its log pumped through a pipe into `log` (so a file size limit on the
/// daemon never cuts its log short); waits until it is watching.
fn start_piped(vault: &TestVault) -> RunningDaemon {
    use std::io::{Read, Write};
    let log = vault.dir.path().join("daemon.log");
    let mut file = std::fs::File::create(&log).unwrap();
    let mut child = vault
        .cmd()
        .arg("run")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn vaultd run");
    let mut pipe = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            let _ = file.write_all(&buf[..n]);
            let _ = file.flush();
        }
    });
    let d = RunningDaemon { child, log };
    d.wait_for_log("vaultd started");
    d
}

fn mail_and_search(title: &str) -> String {
    note_with_calls(
        title,
        &[
            search_call(title),
            json!({ "name": "send_notification", "parameters": {
                "recipient": "bob@example.org", "subject": title, "body": "Once." } }),
        ],
    )
}

fn smtp_config(smtp: &SmtpServer) -> String {
    format!(
        "[tools.send_notification]\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"smtp\"\nsmtp_url = \"smtp://127.0.0.1:{}\"\nfrom = \"Agent <agent@example.com>\"\n",
        smtp.port
    )
}

/// The scenario both squeezes run: a note arriving while the journal cannot be written goes
/// back (or stays) in Needs_Action, nothing goes to Failed, nothing is sent; `vaultd status`
/// says why; once writes succeed again, claiming resumes by itself and every call runs once.
fn storage_fails_then_returns(
    vault: &TestVault,
    smtp: &SmtpServer,
    daemon: &RunningDaemon,
    squeeze: &mut dyn Squeeze,
) {
    vault.drop_note("warm.md", &mail_and_search("warm"));
    vault.wait_until_in("Done", "warm.md");
    assert_eq!(smtp.received().len(), 1);

    squeeze.fill();
    vault.drop_note("a.md", &mail_and_search("during"));
    daemon.wait_for_log("paused: the journal");
    wait_until_or_say(
        "a.md back in Needs_Action",
        DEADLINE,
        || vault.exists("Needs_Action", "a.md") && !vault.exists("In_Progress", "a.md"),
        || format!("notes: {:?}\n{}", vault.all_notes(), daemon.log_text()),
    );
    let status = vault.status_json();
    let why = status["storage_paused"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(why.contains("cannot be written"), "{status}");
    vault.drop_note("b.md", &note_with_calls("B", &[search_call("waits")]));
    // Nothing to wait for here but the absence of a claim: two storage checks' worth.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        vault.exists("Needs_Action", "b.md"),
        "{}",
        daemon.log_text()
    );
    assert!(vault.notes_in("Failed").is_empty(), "{}", daemon.log_text());
    assert_eq!(smtp.received().len(), 1, "nothing sent while paused");

    squeeze.release();
    daemon.wait_for_log("claiming resumes");
    let a = vault.wait_until_in("Done", "a.md");
    let b = vault.wait_until_in("Done", "b.md");
    let results = results_in(&a);
    assert_eq!(results.len(), 2, "one result per call: {a}");
    assert!(results.iter().all(|r| r["ok"] == true), "{a}");
    assert_eq!(results_in(&b).len(), 1, "{b}");
    assert_eq!(smtp.received().len(), 2, "a's email sent exactly once");
    assert!(vault.notes_in("Failed").is_empty());
    assert!(vault.status_json()["storage_paused"].is_null());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_pauses_claiming_and_it_resumes_by_itself() {
    let search = SearxServer::start(Duration::ZERO).await;
    let smtp = SmtpServer::start();
    let vault = TestVault::new(&search.base_url(), &smtp_config(&smtp));
    let Some(mut tmpfs) = FullTmpfs::mount_on(&vault.state) else {
        return;
    };
    let daemon = vault.start();
    let v = &vault;
    tokio::task::block_in_place(|| storage_fails_then_returns(v, &smtp, &daemon, &mut tmpfs));
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_size_limit_on_the_journal_pauses_claiming_and_it_resumes_by_itself() {
    let search = SearxServer::start(Duration::ZERO).await;
    let smtp = SmtpServer::start();
    let vault = TestVault::new(&search.base_url(), &smtp_config(&smtp));
    let daemon = start_piped(&vault);
    let mut limit = FileSizeLimit {
        pid: daemon.pid(),
        wal: vault.state.join("journal.sqlite-wal"),
    };
    let v = &vault;
    tokio::task::block_in_place(|| storage_fails_then_returns(v, &smtp, &daemon, &mut limit));
}
