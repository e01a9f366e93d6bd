//! Secrets never leak (docs/design.md §5, §8.12): a Slack webhook URL and an SMTP password, taken from
//! `env:` references, against servers that fail in the ways that make clients quote what they
//! sent (a 500 that echoes the token, a refused login that echoes the credentials) and against
//! closed ports. The token or password must appear in no file under the test's folder — the
//! notes, the journal (SQLite file, WAL included), the daemon's stderr at `RUST_LOG=trace` —
//! and in none of `vaultd log --json`, `vaultd status --json`, `vaultd config`.

use crate::util::searx::SearxServer;
use crate::util::*;
use base64::Engine;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TOKEN: &str = "SECRETTOKEN123";
const TOKEN_PATH: &str = "/services/T000/B000/SECRETTOKEN123";
const PASSWORD: &str = "pw-Sup3rS3cret!";
const USER: &str = "agent";

/// Every form a secret could leak in: plain, URL-encoded, base64, SMTP AUTH PLAIN, and
/// escaped inside a JSON string (once, twice, ASCII-only as Python writes it), a YAML
/// single-quoted string, Rust's `Debug` (docs/design.md §10.8).
fn forms(secret: &str) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let url = percent_encoding::utf8_percent_encode(secret, percent_encoding::NON_ALPHANUMERIC)
        .to_string();
    let json = json_inside(secret);
    vec![
        secret.to_string(),
        url,
        b64.encode(secret),
        b64.encode(format!("\0{USER}\0{secret}")),
        json_inside(&json),
        ascii_json_inside(secret),
        secret.replace('\'', "''"),
        format!("{secret:?}").trim_matches('"').to_string(),
        json,
    ]
}

/// `s` as the inside of a JSON string.
fn json_inside(s: &str) -> String {
    let q = serde_json::to_string(s).unwrap();
    q[1..q.len() - 1].to_string()
}

/// `s` as the inside of a JSON string with every non-ASCII character as `\uXXXX`.
fn ascii_json_inside(s: &str) -> String {
    let mut out = String::new();
    for c in json_inside(s).chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// Panics naming the file when any form of `secret` is in any file under `dir`.
fn assert_in_no_file(dir: &Path, secret: &str) {
    let needles = forms(secret);
    let mut stack = vec![dir.to_path_buf()];
    let mut files = 0;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            files += 1;
            let bytes = std::fs::read(&p).unwrap();
            for n in &needles {
                assert!(
                    !bytes.windows(n.len()).any(|w| w == n.as_bytes()),
                    "{n:?} leaked into {}:\n{}",
                    p.display(),
                    String::from_utf8_lossy(&bytes)
                );
            }
        }
    }
    assert!(files >= 3, "scanned only {files} files");
}

fn assert_not_in(text: &str, secret: &str, what: &str) {
    for n in forms(secret) {
        assert!(!text.contains(&n), "{n:?} leaked into {what}:\n{text}");
    }
}

/// `vaultd` with the secret's environment and every log line on.
fn cmd(vault: &TestVault, env: &[(&str, &str)]) -> Command {
    let mut c = vault.cmd();
    c.env("RUST_LOG", "trace");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Runs `vaultd once`, keeping its stderr in the test folder (scanned with everything else).
fn once_logged(vault: &TestVault, env: &[(&str, &str)]) {
    let out = cmd(vault, env).arg("once").output().unwrap();
    let log = vault.dir.path().join("once.log");
    let mut previous = std::fs::read(&log).unwrap_or_default();
    previous.extend_from_slice(&out.stderr);
    std::fs::write(&log, previous).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The outputs of the reading subcommands, each checked and also kept in the test folder.
fn check_cli_outputs(vault: &TestVault, env: &[(&str, &str)], secret: &str) {
    for args in [
        &["log", "--json"][..],
        &["log"][..],
        &["status", "--json"][..],
        &["config"][..],
    ] {
        let out = cmd(vault, env).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_not_in(&text, secret, &format!("vaultd {}", args.join(" ")));
        assert_not_in(
            &String::from_utf8_lossy(&out.stderr),
            secret,
            &format!("stderr of vaultd {}", args.join(" ")),
        );
    }
}

fn slack_note() -> String {
    note_with_calls(
        "Ping",
        &[json!({ "name": "send_notification", "parameters": {
            "method": "slack", "recipient": "ops", "subject": "Deploy", "body": "done" } })],
    )
}

fn slack_config() -> &'static str {
    "[tools.send_notification]\ntimeout = \"5s\"\n[tools.send_notification.slack.webhooks]\nops = \"env:SLACK_HOOK\"\n"
}

fn only_failure(vault: &TestVault, rel: &str) -> Value {
    let text = vault.read("Failed", rel);
    let results = results_in(&text);
    assert_eq!(results.len(), 1, "{text}");
    assert_eq!(results[0]["ok"], false, "{text}");
    results[0].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slack_webhook_that_answers_500_leaks_its_token_nowhere() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let search = SearxServer::start(Duration::ZERO).await;
    let slack = MockServer::start().await;
    // A hostile or broken proxy: the error page quotes the path and the token.
    Mock::given(method("POST"))
        .and(path(TOKEN_PATH))
        .respond_with(
            ResponseTemplate::new(500)
                .set_body_string(format!("upstream failed for {TOKEN_PATH} (token {TOKEN})")),
        )
        .mount(&slack)
        .await;
    let hook = format!("{}{TOKEN_PATH}", slack.uri());
    let env = [("SLACK_HOOK", hook.as_str())];
    let vault = TestVault::new(&search.base_url(), slack_config());

    let daemon = RunningDaemon::start(cmd(&vault, &env), vault.dir.path().join("daemon.log"));
    vault.drop_note("ping.md", &slack_note());
    vault.wait_until_in("Failed", "ping.md");
    assert_eq!(daemon.terminate().code(), Some(0));

    let requests = slack.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1, "the webhook was really called");
    let r = only_failure(&vault, "ping.md");
    assert_eq!(r["error"]["code"], "EXECUTION_ERROR");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("answered 500"), "{message}");
    assert!(message.contains("[redacted]"), "{message}");
    assert_in_no_file(vault.dir.path(), TOKEN);
    check_cli_outputs(&vault, &env, TOKEN);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slack_webhook_on_a_closed_port_leaks_its_token_nowhere() {
    let search = SearxServer::start(Duration::ZERO).await;
    let port = closed_port();
    let hook = format!("http://127.0.0.1:{port}{TOKEN_PATH}");
    let env = [("SLACK_HOOK", hook.as_str())];
    let vault = TestVault::new(&search.base_url(), slack_config());
    vault.drop_note("ping.md", &slack_note());
    once_logged(&vault, &env);

    let r = only_failure(&vault, "ping.md");
    assert_eq!(r["error"]["code"], "EXECUTION_ERROR");
    assert_eq!(r["error"]["retryable"], true);
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("could not be reached"),
        "{r}"
    );
    assert_in_no_file(vault.dir.path(), TOKEN);
    check_cli_outputs(&vault, &env, TOKEN);
}

fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// An SMTP server on 127.0.0.1 that offers AUTH over plaintext (vaultd allows plaintext
/// credentials only to loopback) and refuses every login with a reply that quotes the
/// credentials back, decoded and encoded. Records every line it receives.
struct RefusingSmtp {
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

/// How the refusing server quotes the decoded `user:password` back (with `\0` as `:`).
type Quote = fn(&str) -> String;

/// As is: `bad credentials agent:pw`.
fn quote_plain(decoded: &str) -> String {
    decoded.to_string()
}

impl RefusingSmtp {
    fn start() -> RefusingSmtp {
        RefusingSmtp::start_quoting(quote_plain)
    }

    fn start_quoting(quote: Quote) -> RefusingSmtp {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = lines.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let _ = refuse_logins(stream, &seen, quote);
                });
            }
        });
        RefusingSmtp { port, lines }
    }

    fn received(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

fn refuse_logins(
    stream: std::net::TcpStream,
    seen: &Mutex<Vec<String>>,
    quote: Quote,
) -> std::io::Result<()> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let read_line = |reader: &mut BufReader<std::net::TcpStream>| -> Option<String> {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                let line = line.trim_end().to_string();
                seen.lock().unwrap().push(line.clone());
                Some(line)
            }
        }
    };
    let decoded = |s: &str| {
        quote(
            &String::from_utf8_lossy(&b64.decode(s.trim()).unwrap_or_default()).replace('\0', ":"),
        )
    };
    out.write_all(b"220 refuser ESMTP\r\n")?;
    while let Some(line) = read_line(&mut reader) {
        let upper = line.to_ascii_uppercase();
        if upper.starts_with("EHLO") {
            out.write_all(b"250-refuser\r\n250-AUTH PLAIN LOGIN\r\n250 8BITMIME\r\n")?;
        } else if upper.starts_with("AUTH PLAIN") {
            let creds = match line.split_whitespace().nth(2) {
                Some(c) => c.to_string(),
                None => {
                    out.write_all(b"334 \r\n")?;
                    read_line(&mut reader).unwrap_or_default()
                }
            };
            let reply = format!(
                "535 5.7.8 bad credentials {} ({creds})\r\n",
                decoded(&creds)
            );
            out.write_all(reply.as_bytes())?;
        } else if upper.starts_with("AUTH LOGIN") {
            out.write_all(b"334 VXNlcm5hbWU6\r\n")?;
            let user = read_line(&mut reader).unwrap_or_default();
            out.write_all(b"334 UGFzc3dvcmQ6\r\n")?;
            let pass = read_line(&mut reader).unwrap_or_default();
            let reply = format!(
                "535 5.7.8 bad credentials {}:{} ({pass})\r\n",
                decoded(&user),
                decoded(&pass)
            );
            out.write_all(reply.as_bytes())?;
        } else if upper.starts_with("QUIT") {
            out.write_all(b"221 bye\r\n")?;
            return Ok(());
        } else {
            out.write_all(b"250 ok\r\n")?;
        }
    }
    Ok(())
}

fn mail_note() -> String {
    note_with_calls(
        "Mail",
        &[json!({ "name": "send_notification", "parameters": {
            "recipient": "bob@example.org", "subject": "Report", "body": "All green." } })],
    )
}

fn smtp_config(port: u16) -> String {
    format!(
        "[tools.send_notification]\ntimeout = \"5s\"\nallowed_recipients = [\"*@example.org\"]\n[tools.send_notification.email]\ntransport = \"smtp\"\nsmtp_url = \"smtp://127.0.0.1:{port}\"\nusername = \"{USER}\"\npassword = \"env:SMTP_PASSWORD\"\nfrom = \"Agent <agent@example.com>\"\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_smtp_login_leaks_the_password_nowhere() {
    let search = SearxServer::start(Duration::ZERO).await;
    let smtp = RefusingSmtp::start();
    let env = [("SMTP_PASSWORD", PASSWORD)];
    let vault = TestVault::new(&search.base_url(), &smtp_config(smtp.port));
    vault.drop_note("mail.md", &mail_note());
    once_logged(&vault, &env);

    // Honest: the login really went to the server (over plaintext, on loopback only), and
    // the server quoted it back.
    let lines = smtp.received();
    assert!(
        lines
            .iter()
            .any(|l| l.to_ascii_uppercase().starts_with("AUTH")),
        "{lines:?}"
    );
    let r = only_failure(&vault, "mail.md");
    assert_eq!(r["error"]["code"], "EXECUTION_ERROR");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("refused the login: 535"), "{message}");
    assert!(message.contains("[redacted]"), "{message}");
    assert_in_no_file(vault.dir.path(), PASSWORD);
    check_cli_outputs(&vault, &env, PASSWORD);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_smtp_server_on_a_closed_port_leaks_the_password_nowhere() {
    let search = SearxServer::start(Duration::ZERO).await;
    let env = [("SMTP_PASSWORD", PASSWORD)];
    let vault = TestVault::new(&search.base_url(), &smtp_config(closed_port()));
    vault.drop_note("mail.md", &mail_note());
    once_logged(&vault, &env);

    let r = only_failure(&vault, "mail.md");
    assert_eq!(r["error"]["code"], "EXECUTION_ERROR");
    assert_eq!(r["error"]["retryable"], true);
    assert_in_no_file(vault.dir.path(), PASSWORD);
    check_cli_outputs(&vault, &env, PASSWORD);
}

/// A password holding a quote, a backslash, a newline, an apostrophe and non-ASCII text
/// (docs/design.md §10.8).
const AWKWARD_PASSWORD: &str = "pw-q\"uo\\te\nnext-\u{fc}n\u{ef}\u{20ac}-'s/\u{1f511}-Sup3r";

/// Quotes the credentials the way a server answering in JSON does: escaped (Rust/JS style and
/// Python's ASCII-only style), in a YAML single-quoted string, and as is where that cannot
/// break the SMTP line.
fn quote_escaped(decoded: &str) -> String {
    let raw = if decoded.contains(['\r', '\n']) {
        String::new()
    } else {
        format!(" raw={decoded}")
    };
    format!(
        "{{\"login\": \"{}\", \"ascii\": \"{}\", \"yaml\": '{}'}}{raw}",
        json_inside(decoded),
        ascii_json_inside(decoded),
        decoded.replace('\'', "''"),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_password_with_quotes_backslashes_newlines_and_non_ascii_leaks_in_no_form() {
    // The second has no newline: the server quotes it raw too.
    for secret in [AWKWARD_PASSWORD, "pw-\"only\\quotes'and-\u{e9}"] {
        let search = SearxServer::start(Duration::ZERO).await;
        let smtp = RefusingSmtp::start_quoting(quote_escaped);
        let env = [("SMTP_PASSWORD", secret)];
        let vault = TestVault::new(&search.base_url(), &smtp_config(smtp.port));
        // The daemon too: its log, and the journal's -wal while it is open.
        let daemon = RunningDaemon::start(cmd(&vault, &env), vault.dir.path().join("daemon.log"));
        vault.drop_note("mail.md", &mail_note());
        vault.wait_until_in("Failed", "mail.md");
        assert_in_no_file(vault.dir.path(), secret);
        assert_eq!(daemon.terminate().code(), Some(0));
        vault.drop_note("again.md", &mail_note());
        once_logged(&vault, &env);

        // The server really got the login and quoted it back escaped.
        let lines = smtp.received();
        assert!(
            lines
                .iter()
                .any(|l| l.to_ascii_uppercase().starts_with("AUTH")),
            "{lines:?}"
        );
        let r = only_failure(&vault, "mail.md");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(message.contains("refused the login: 535"), "{message}");
        assert!(message.contains("\"ascii\": \""), "{message}");
        assert!(message.contains("[redacted]"), "{message}");
        assert_in_no_file(vault.dir.path(), secret);
        check_cli_outputs(&vault, &env, secret);
    }
}
