//! vaultd as a systemd service, end to end with the real binary: the sd_notify protocol on a
//! socket the test owns (READY=1, WATCHDOG=1, RELOADING=1, STOPPING=1), SIGTERM handling, one
//! daemon per vault, and the directories and credentials systemd hands over in the environment.

use crate::util::searx::SearxServer;
use crate::util::*;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The service manager's end of `$NOTIFY_SOCKET`: a datagram socket bound on a temp path
/// (sd-notify 0.5 does not support abstract `@name` sockets).
struct NotifySocket {
    path: PathBuf,
    socket: UnixDatagram,
    /// Every datagram received so far, in order.
    received: Vec<String>,
}

impl NotifySocket {
    fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        NotifySocket {
            path,
            socket,
            received: Vec::new(),
        }
    }

    /// How many datagrams so far carry the line `line` (e.g. "WATCHDOG=1").
    fn count(&self, line: &str) -> usize {
        self.received
            .iter()
            .filter(|m| m.lines().any(|l| l == line))
            .count()
    }

    /// Receives until `count(line) >= n`; panics after the deadline.
    fn wait_for(&mut self, line: &str, n: usize, deadline: Duration) {
        let start = Instant::now();
        while self.count(line) < n {
            if start.elapsed() > deadline {
                panic!(
                    "{line} seen {} times, wanted {n}; received {:#?}",
                    self.count(line),
                    self.received
                );
            }
            self.receive_for(Duration::from_millis(50));
        }
    }

    /// Collects whatever arrives during `span`.
    fn receive_for(&mut self, span: Duration) {
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        while start.elapsed() < span {
            if let Ok(n) = self.socket.recv(&mut buf) {
                self.received
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
    }
}

/// `vaultd run` as systemd starts it with `Type=notify` and `WatchdogSec=`. WATCHDOG_PID is left
/// out: the child's PID is not known before it is spawned, and sd-notify 0.5 enables the
/// watchdog when WATCHDOG_PID is absent or equal to its own PID.
fn start_under_notify(
    vault: &TestVault,
    socket: &NotifySocket,
    watchdog_pid: Option<&str>,
) -> RunningDaemon {
    let mut cmd = vault.cmd();
    cmd.env("NOTIFY_SOCKET", &socket.path)
        .env("WATCHDOG_USEC", "200000");
    match watchdog_pid {
        Some(pid) => cmd.env("WATCHDOG_PID", pid),
        None => cmd.env_remove("WATCHDOG_PID"),
    };
    RunningDaemon::start(cmd, vault.dir.path().join("daemon.log"))
}

/// Sends SIGTERM from a blocking thread (the test's runtime keeps serving HTTP meanwhile) and
/// returns the exit status and how long the daemon took to exit.
async fn terminate_and_time(daemon: RunningDaemon) -> (std::process::ExitStatus, Duration) {
    tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let status = daemon.terminate();
        (status, start.elapsed())
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn notify_socket_gets_ready_then_watchdog_pings_then_stopping() {
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "");
    let mut socket = NotifySocket::bind(vault.dir.path());
    let daemon = start_under_notify(&vault, &socket, None);

    socket.wait_for("READY=1", 1, DEADLINE);
    let ready = socket
        .received
        .iter()
        .find(|m| m.lines().any(|l| l == "READY=1"))
        .unwrap();
    assert!(
        ready.contains(&format!("STATUS=watching {}", vault.root.display())),
        "{ready:?}"
    );
    // WATCHDOG_USEC=200000: a ping every 100 ms, from the main loop.
    socket.wait_for("WATCHDOG=1", 3, Duration::from_secs(5));
    let first_ping = socket
        .received
        .iter()
        .position(|m| m.lines().any(|l| l == "WATCHDOG=1"))
        .unwrap();
    let ready_at = socket
        .received
        .iter()
        .position(|m| m.lines().any(|l| l == "READY=1"))
        .unwrap();
    assert!(ready_at < first_ping, "{:#?}", socket.received);

    let status = daemon.terminate();
    assert!(status.success(), "{status:?}");
    socket.receive_for(Duration::from_millis(200));
    assert_eq!(socket.count("STOPPING=1"), 1, "{:#?}", socket.received);
    // The default grace of 10 s plus a 5 s margin, asked of systemd's stop timeout.
    assert_eq!(
        socket.count("EXTEND_TIMEOUT_USEC=15000000"),
        1,
        "{:#?}",
        socket.received
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn watchdog_pings_only_when_watchdog_pid_is_ours() {
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "");
    let mut socket = NotifySocket::bind(vault.dir.path());
    // PID 1 is never the daemon: the watchdog is meant for another process.
    let daemon = start_under_notify(&vault, &socket, Some("1"));
    socket.wait_for("READY=1", 1, DEADLINE);
    socket.receive_for(Duration::from_millis(600));
    assert_eq!(socket.count("WATCHDOG=1"), 0, "{:#?}", socket.received);
    assert!(daemon.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_while_idle_exits_zero_within_two_seconds() {
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "");
    let daemon = vault.start();
    let log = daemon.log.clone();
    let (status, took) = terminate_and_time(daemon).await;
    let log = std::fs::read_to_string(log).unwrap();
    assert!(status.success(), "{status:?}; log:\n{log}");
    assert!(took < Duration::from_secs(2), "took {took:?}; log:\n{log}");
    assert!(log.contains("vaultd stopped"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_tells_systemd_reloading_then_ready() {
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "");
    let mut socket = NotifySocket::bind(vault.dir.path());
    let daemon = start_under_notify(&vault, &socket, Some("1"));
    socket.wait_for("READY=1", 1, DEADLINE);
    daemon.signal(1);
    daemon.wait_for_log("config reloaded");
    socket.wait_for("READY=1", 2, DEADLINE);
    let reloading = socket
        .received
        .iter()
        .position(|m| m.lines().any(|l| l == "RELOADING=1"))
        .unwrap_or_else(|| panic!("no RELOADING=1: {:#?}", socket.received));
    let message = &socket.received[reloading];
    // systemd's reload protocol (Type=notify-reload) wants the time the reload began.
    assert!(
        message.lines().any(|l| l.starts_with("MONOTONIC_USEC=")),
        "{message:?}"
    );
    let ready_again = socket
        .received
        .iter()
        .rposition(|m| m.lines().any(|l| l == "READY=1"))
        .unwrap();
    assert!(reloading < ready_again, "{:#?}", socket.received);
    assert!(daemon.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_is_logged_and_the_daemon_keeps_working() {
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "");
    let daemon = vault.start();
    daemon.signal(1);
    daemon.wait_for_log("SIGHUP");
    vault.drop_note("after-hup.md", &note_with_calls("H", &[search_call("hup")]));
    vault.wait_until_in("Done", "after-hup.md");
    assert!(daemon.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_right_after_start_up_is_still_graceful() {
    // The SIGTERM handler used to be installed on the main loop's first poll: a stop arriving
    // between start-up and that poll killed the process (status 143) most of the time.
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "");
    for round in 0..10 {
        let log = vault.dir.path().join(format!("start-{round}.log"));
        let mut child = vault
            .cmd()
            .arg("run")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let start = Instant::now();
        // No sleep: the signal must land as soon after start-up as possible.
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("vaultd started")
        {
            assert!(start.elapsed() < DEADLINE, "never started");
        }
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(status.success(), "round {round}: {status:?}; log:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_slow_call_waits_for_it_and_exits_zero() {
    let server = SearxServer::start(Duration::from_millis(1500)).await;
    let vault = TestVault::new(&server.base_url(), "shutdown_grace = \"10s\"\n");
    let daemon = vault.start();
    vault.drop_note(
        "slow.md",
        &note_with_calls("Slow", &[search_call("patience")]),
    );
    let start = Instant::now();
    while server.requests() == 0 {
        assert!(start.elapsed() < DEADLINE, "the search never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let log = daemon.log.clone();
    let (status, took) = terminate_and_time(daemon).await;
    let log = std::fs::read_to_string(log).unwrap();
    assert!(status.success(), "{status:?}; log:\n{log}");
    assert!(took < Duration::from_secs(10), "took {took:?}; log:\n{log}");

    // The call finished inside the grace period: its result is written and the note moved,
    // before the process exited.
    let text = vault.read("Done", "slow.md");
    let results = results_in(&text);
    assert_eq!(results.len(), 1, "{text}");
    assert_eq!(results[0]["ok"], true, "{text}");
    assert_eq!(
        results[0]["data"]["results"][0]["title"],
        "patience result 1"
    );
    assert!(vault.notes_in("In_Progress").is_empty());
    assert!(!log.contains("shutdown grace"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_daemon_on_the_same_vault_exits_at_once_naming_the_first() {
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "");
    let first = vault.start();

    // Another state dir, so only the vault lock can stop it.
    let other_state = vault.dir.path().join("other-state");
    let started = Instant::now();
    let mut second = vault
        .cmd()
        .arg("--state-dir")
        .arg(&other_state)
        .arg("run")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(5) {
            let _ = second.kill();
            panic!("the second daemon kept running");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = std::io::read_to_string(second.stderr.take().unwrap()).unwrap();
    assert!(!status.success(), "{status:?}");
    assert!(
        stderr.contains(&format!("another vaultd (PID {})", first.pid())),
        "{stderr}"
    );
    assert!(
        stderr.contains(&vault.root.display().to_string()),
        "{stderr}"
    );
    assert!(!other_state.join("journal.sqlite").exists());

    // The first one is undisturbed.
    assert!(first.terminate().success());
}

/// A config of our own: TestVault's always names the searxng provider.
fn write_brave_config(vault: &TestVault, base_url: &str, api_key: &str) {
    std::fs::write(
        &vault.config,
        format!(
            "vault = {:?}\nstate_dir = {:?}\n\n[tools.search_web]\nprovider = \"brave\"\nbase_url = {base_url:?}\napi_key = {api_key:?}\n",
            vault.root.display().to_string(),
            vault.state.display().to_string(),
        ),
    )
    .unwrap();
}

/// `$CREDENTIALS_DIRECTORY` as `LoadCredential=NAME:…` leaves it: one file per secret.
fn credentials_dir(vault: &TestVault, name: &str, value: &str) -> PathBuf {
    let creds = vault.dir.path().join("credentials");
    std::fs::create_dir_all(&creds).unwrap();
    std::fs::write(creds.join(name), format!("{value}\n")).unwrap();
    creds
}

#[test]
fn credential_secrets_come_from_credentials_directory_and_stay_redacted() {
    let vault = TestVault::new("http://127.0.0.1:9", "");
    write_brave_config(&vault, "http://127.0.0.1:9", "credential:brave_key");
    let secret = "BSA-s3cr3t-from-LoadCredential";
    let creds = credentials_dir(&vault, "brave_key", secret);

    let out = vault
        .cmd()
        .env("CREDENTIALS_DIRECTORY", &creds)
        .arg("config")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let config: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        config["tools"]["search_web"]["api_key"],
        "credential:brave_key [redacted]"
    );
    assert!(!stdout.contains(secret) && !stderr.contains(secret));
    assert!(!stdout.contains("s3cr3t"), "{stdout}");

    // Without systemd's directory the reference cannot resolve: a clear error, no guess.
    let out = vault
        .cmd()
        .env_remove("CREDENTIALS_DIRECTORY")
        .arg("once")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("CREDENTIALS_DIRECTORY"), "{stderr}");
    assert!(stderr.contains("api_key"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_credential_reaches_the_provider_and_nothing_else() {
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let secret = "BSA-s3cr3t-from-LoadCredential";
    let brave = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/res/v1/web/search"))
        .and(header("x-subscription-token", secret))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "query": { "original": "credentials" },
            "web": { "results": [
                { "title": "Credentials", "url": "https://systemd.io/CREDENTIALS/", "description": "LoadCredential=" }
            ] }
        })))
        .expect(1)
        .mount(&brave)
        .await;
    let vault = TestVault::new("http://127.0.0.1:9", "");
    write_brave_config(&vault, &brave.uri(), "credential:brave_key");
    let creds = credentials_dir(&vault, "brave_key", secret);
    vault.drop_note(
        "key.md",
        &note_with_calls("Key", &[search_call("credentials")]),
    );

    let out = vault
        .cmd()
        .env("CREDENTIALS_DIRECTORY", &creds)
        .env("RUST_LOG", "trace")
        .arg("once")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let text = vault.read("Done", "key.md");
    assert_eq!(
        results_in(&text)[0]["data"]["results"][0]["title"],
        "Credentials",
        "{text}"
    );
    assert!(!text.contains(secret) && !log.contains(secret), "{log}");
    for entry in std::fs::read_dir(&vault.state).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains(secret));
    }
}

#[test]
fn systemd_state_and_configuration_directories_are_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let (vault, state, conf) = (
        dir.path().join("notes"),
        dir.path().join("state"),
        dir.path().join("etc"),
    );
    for d in [&vault, &state, &conf] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(
        conf.join("config.toml"),
        format!("vault = {:?}\n", vault.display().to_string()),
    )
    .unwrap();

    let out = Command::new(bin())
        .env_remove("VAULTD_CONFIG")
        .env("STATE_DIRECTORY", &state)
        .env("CONFIGURATION_DIRECTORY", &conf)
        .arg("config")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let config: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        config["source"],
        conf.join("config.toml").display().to_string()
    );
    // One state per vault under $STATE_DIRECTORY, named by the id kept in the vault (§9.11).
    let id = std::fs::read_to_string(vault.join(".vaultd/id")).unwrap();
    assert_eq!(
        config["state_dir"],
        state.join(id.trim()).display().to_string()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn log_lines_suit_the_journal_and_log_shippers_and_vaultd_log_filters() {
    let server = SearxServer::start(Duration::ZERO).await;
    let vault = TestVault::new(&server.base_url(), "");
    vault.drop_note("a.md", &note_with_calls("A", &[search_call("alpha")]));

    // Under systemd (JOURNAL_STREAM set): no colours and no timestamps (journald adds its own).
    let out = vault
        .cmd()
        .env("JOURNAL_STREAM", "8:12345")
        .arg("once")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let started = stderr
        .lines()
        .find(|l| l.contains("vaultd started"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(started.trim_start().starts_with("INFO"), "{started}");
    assert!(!stderr.contains('\u{1b}'), "no ANSI escapes: {stderr:?}");

    // --log-format json: one JSON object per line.
    vault.drop_note("b.md", &note_with_calls("B", &[search_call("beta")]));
    let out = vault
        .cmd()
        .args(["--log-format", "json", "once"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for line in stderr.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
    }

    // vaultd log: what the journal holds, filtered by note and tool.
    let out = vault
        .cmd()
        .args(["log", "--json", "--note", "b.md"])
        .output()
        .unwrap();
    let entries: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let events: Vec<&str> = entries
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        vec!["claim", "call_start", "call_end", "written", "move"]
    );
    assert!(
        entries
            .iter()
            .all(|e| e["note"].as_str().unwrap().contains("b.md"))
    );
    assert_eq!(entries[2]["outcome"], "ok");
    assert_eq!(entries[4]["detail"], "Done/b.md");
    let out = vault
        .cmd()
        .args(["log", "--json", "--tool", "send_notification"])
        .output()
        .unwrap();
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = vault.cmd().args(["log", "--since", "1h"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches(" move ").count(), 2, "{text}");
}
