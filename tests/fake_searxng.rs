//! `scripts/fake-searxng.py`, the load bench's external search fake (`--fake python`), answers
//! what vaultd's `search_web` asks: the real `vaultd once` against it, a paged search and a
//! query that needs percent-decoding included. Skipped, saying so, where there is no python3.

use crate::util::*;
use serde_json::json;
use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

/// The fake as a child process, killed when dropped.
struct PythonFake {
    child: Child,
    url: String,
}

impl PythonFake {
    /// Starts the script on a free port; None when python3 cannot be run here.
    fn start() -> Option<PythonFake> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fake-searxng.py");
        let mut child = match Command::new("python3")
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("cannot run python3 {}: {e}", script.display()),
        };
        let stdout = child.stdout.take().expect("stdout was piped");
        // The first line names the address; read on a thread so a silent fake fails in time.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(DEADLINE).unwrap_or_default();
        let Some(url) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!(
                "the fake did not say `listening on URL` within {DEADLINE:?}: {line:?}; stderr: {err}"
            );
        };
        Some(PythonFake {
            url: url.to_string(),
            child,
        })
    }

    /// `GET /stats`: the fake's own count of the requests it answered.
    fn requests(&self) -> u64 {
        let addr = self.url.strip_prefix("http://").expect("http URL");
        let mut stream = std::net::TcpStream::connect(addr).expect("connect to the fake");
        stream
            .set_read_timeout(Some(DEADLINE))
            .expect("read timeout");
        write!(
            stream,
            "GET /stats HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .expect("ask for /stats");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("read /stats");
        let body = answer
            .split_once("\r\n\r\n")
            .expect("a header and a body")
            .1;
        let stats: serde_json::Value = serde_json::from_str(body).expect("/stats is JSON");
        stats["requests"].as_u64().expect("requests is a number")
    }
}

impl Drop for PythonFake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn vaultd_once_gets_its_results_from_the_python_fake() {
    let Some(fake) = PythonFake::start() else {
        eprintln!("skipped: python3 is not installed here");
        return;
    };
    let vault = TestVault::new(&fake.url, "");
    // Characters that must survive the query string: a space, `&`, `+`, a non-ASCII letter.
    let query = "café & tea+milk";
    vault.drop_note("a.md", &note_with_calls("Research", &[search_call(query)]));
    // Five results: the fake gives three a page, so vaultd must ask for page 2.
    let paged =
        json!({ "name": "search_web", "parameters": { "query": "paged", "num_results": 5 } });
    vault.drop_note("b.md", &note_with_calls("More", &[paged]));

    let (code, log) = vault.once_within(CAP);
    assert_eq!(code, 0, "vaultd once failed:\n{log}");

    let a = vault.read("Done", "a.md");
    assert_eq!(property(&a, "tool_status").as_deref(), Some("done"), "{a}");
    let r = &results_in(&a)[0];
    assert_eq!(r["ok"], true, "{a}");
    let hits = r["data"]["results"].as_array().expect("results");
    assert_eq!(hits.len(), 3, "{a}");
    assert_eq!(hits[0]["title"], format!("{query} result 1"));
    assert_eq!(hits[0]["url"], "https://example.org/1");
    assert_eq!(hits[0]["snippet"], format!("snippet 1 about {query}"));

    let b = vault.read("Done", "b.md");
    let r = &results_in(&b)[0];
    assert_eq!(r["ok"], true, "{b}");
    let urls: Vec<&str> = r["data"]["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|h| h["url"].as_str().expect("a url"))
        .collect();
    assert_eq!(
        urls,
        (1..=5)
            .map(|n| format!("https://example.org/{n}"))
            .collect::<Vec<_>>()
    );
    // One request for a.md, two pages for b.md: the answers came from this fake.
    assert_eq!(fake.requests(), 3);
}
