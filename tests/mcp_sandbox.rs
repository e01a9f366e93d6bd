//! MCP servers in the same sandbox as command tools (docs/design.md §10.7), end to end: the real
//! `vaultd` against a hostile server (tests/fixtures/hostile-mcp-server.py, which tries what
//! a compromised server would) and against the registries' reference servers, each
//! installed by scripts/test (npm: everything, filesystem, memory, sequential-thinking; PyPI:
//! time, git) and run with no more than the documented `sandbox` keys.

use crate::util::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NO_SEARCH: &str = "http://127.0.0.1:9";

fn hostile_server() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hostile-mcp-server.py")
        .display()
        .to_string()
}

/// A reference server installed by scripts/test under target/.
fn reference(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(rel);
    assert!(
        p.exists(),
        "{} is missing: scripts/test installs the MCP reference servers (npm and PyPI) into target/",
        p.display()
    );
    p.display().to_string()
}

/// A temp HOME holding a private key, as the person's own.
fn home_with_a_key(vault: &TestVault) -> PathBuf {
    let home = vault.dir.path().join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY").unwrap();
    home
}

fn probe(action: &str, rest: Value) -> Value {
    let mut params = json!({ "action": action });
    params
        .as_object_mut()
        .unwrap()
        .extend(rest.as_object().unwrap().clone());
    json!({ "name": "mcp__h__probe", "parameters": params })
}

/// Each probe's answer, keyed by `action path|port`: (ok, detail).
fn probes(text: &str) -> BTreeMap<String, (bool, String)> {
    results_in(text)
        .into_iter()
        .map(|r| {
            let answer: Value = serde_json::from_str(
                r["data"]["content"][0]["text"]
                    .as_str()
                    .unwrap_or_else(|| panic!("no text in {r}")),
            )
            .unwrap();
            let args = &answer["args"];
            let key = format!(
                "{} {}",
                args["action"].as_str().unwrap(),
                args["path"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| args["port"].to_string())
            );
            (
                key,
                (
                    answer["ok"].as_bool().unwrap(),
                    answer["detail"].as_str().unwrap_or("").to_string(),
                ),
            )
        })
        .collect()
}

fn hostile_config(sandbox: &str) -> String {
    format!(
        "[mcp.h]\ncommand = [\"python3\", {:?}]\nallow = [\"probe\"]\nstart_timeout = \"60s\"\n{sandbox}\n[mcp.h.tools.probe]\neffect = \"read_only\"\n",
        hostile_server()
    )
}

#[test]
fn a_hostile_server_cannot_read_keys_or_state_write_outside_connect_out_or_outlive_vaultd() {
    let vault = TestVault::new(NO_SEARCH, "");
    let home = home_with_a_key(&vault);
    let granted = vault.root.join("Projects");
    std::fs::create_dir_all(&granted).unwrap();
    std::fs::write(vault.root.join("Projects/plan.md"), "a plan").unwrap();
    // Fourteen probes in one note: past the default of 10 a round.
    vault.write_config(
        NO_SEARCH,
        &format!(
            "max_calls_per_note = 20\n{}",
            hostile_config(&format!(
                "sandbox = {{ writable = [{:?}] }}",
                granted.display().to_string()
            ))
        ),
    );
    let outside = vault.dir.path().join("outside.txt");
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let socket_path = vault.dir.path().join("bus.sock");
    let unix = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    unix.set_nonblocking(true).unwrap();
    let key = home.join(".ssh/id_ed25519").display().to_string();
    let state = vault.state.display().to_string();
    let config = vault.config.display().to_string();
    let note = vault.root.join("Projects/plan.md").display().to_string();
    let written = granted.join("by-server.md").display().to_string();
    let in_root = vault.root.join("injected.md").display().to_string();
    let in_inbox = vault
        .root
        .join("Needs_Action/injected.md")
        .display()
        .to_string();
    let outside_s = outside.display().to_string();
    let sock = socket_path.display().to_string();
    let calls = vec![
        probe("read", json!({ "path": key })),
        probe("list", json!({ "path": state })),
        probe("read", json!({ "path": config })),
        probe("read", json!({ "path": note })),
        probe("write", json!({ "path": written })),
        probe("write", json!({ "path": in_root })),
        probe("write", json!({ "path": in_inbox })),
        probe("write", json!({ "path": outside_s })),
        probe("tcp", json!({ "port": tcp.local_addr().unwrap().port() })),
        probe("udp", json!({ "port": udp.local_addr().unwrap().port() })),
        probe("unix", json!({ "path": sock })),
        probe("caps", json!({})),
        probe("env", json!({ "path": "TMPDIR" })),
        probe("daemon", json!({})),
    ];
    vault.drop_note("probe.md", &note_with_calls("probe", &calls));
    let out = vault.cmd().env("HOME", &home).arg("once").output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        vault.exists("Done", "probe.md"),
        "{:?}\n{}\n{log}",
        vault.all_notes(),
        vault
            .all_notes()
            .iter()
            .map(|n| std::fs::read_to_string(vault.root.join(n)).unwrap_or_default())
            .collect::<String>()
    );
    let text = vault.read("Done", "probe.md");
    let p = probes(&text);
    let denied = |k: &str| {
        let (ok, detail) = p.get(k).unwrap_or_else(|| panic!("no probe {k} in {text}"));
        assert!(!ok, "{k} was allowed: {detail}");
        assert!(
            detail.contains("Permission denied") || detail.contains("Errno 13"),
            "{k}: {detail}"
        );
    };
    let allowed = |k: &str| -> String {
        let (ok, detail) = p.get(k).unwrap_or_else(|| panic!("no probe {k} in {text}"));
        assert!(ok, "{k} was denied: {detail}");
        detail.clone()
    };
    // The keys, the state dir (the journal) and the config are not readable; notes are.
    denied(&format!("read {key}"));
    denied(&format!("list {state}"));
    denied(&format!("read {config}"));
    assert_eq!(allowed(&format!("read {note}")), "6 bytes");
    // Written only where granted: not the vault root, not the inbox, not elsewhere.
    allowed(&format!("write {written}"));
    assert!(std::path::Path::new(&written).exists());
    for w in [&in_root, &in_inbox, &outside_s] {
        denied(&format!("write {w}"));
        assert!(!std::path::Path::new(w).exists(), "{w} was written");
    }
    // No socket of any family reaches the listeners.
    for k in ["tcp", "udp"] {
        let port = if k == "tcp" {
            tcp.local_addr().unwrap().port()
        } else {
            udp.local_addr().unwrap().port()
        };
        denied(&format!("{k} {port}"));
    }
    denied(&format!("unix {sock}"));
    assert!(tcp.accept().is_err(), "a TCP connection arrived");
    assert!(unix.accept().is_err(), "a unix connection arrived");
    let mut buf = [0u8; 64];
    assert!(udp.recv(&mut buf).is_err(), "a UDP datagram arrived");
    // No capability, even when vaultd runs as root; a private TMPDIR in its own folder.
    assert_eq!(allowed("caps null"), "0000000000000000");
    assert!(
        allowed("env TMPDIR").starts_with(&vault.state.join("mcp/h").display().to_string()),
        "{text}"
    );
    // The double-forked, setsid daemon it left ended with the server, before `once` ended.
    let pid = allowed("daemon null");
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    wait_until_or_say(
        "the server's orphan is gone",
        Duration::from_secs(10),
        || !proc_dir.exists(),
        || {
            std::fs::read_to_string(proc_dir.join("status"))
                .unwrap_or_default()
                .lines()
                .take(3)
                .collect::<Vec<_>>()
                .join("; ")
        },
    );
}

#[test]
fn sandbox_false_runs_a_server_unconfined_and_vaultd_tools_says_so() {
    let vault = TestVault::new(NO_SEARCH, "");
    let home = home_with_a_key(&vault);
    vault.write_config(NO_SEARCH, &hostile_config("sandbox = false"));
    let key = home.join(".ssh/id_ed25519").display().to_string();
    vault.drop_note(
        "probe.md",
        &note_with_calls("probe", &[probe("read", json!({ "path": key }))]),
    );
    let out = vault.cmd().env("HOME", &home).arg("once").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same probe that the sandbox denies reads the key here: the probe is real.
    let p = probes(&vault.read("Done", "probe.md"));
    assert_eq!(p[&format!("read {key}")], (true, "11 bytes".to_string()));
    let tools = vault
        .cmd()
        .env("HOME", &home)
        .arg("tools")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&tools.stdout);
    assert!(
        shown.contains("sandbox: off (sandbox = false): the server runs unconfined"),
        "{shown}"
    );
}

#[test]
fn a_writable_folder_swapped_for_a_symlink_is_refused_when_the_server_starts_again() {
    let vault = TestVault::new(NO_SEARCH, "");
    let home = home_with_a_key(&vault);
    let granted = vault.root.join("Projects");
    std::fs::create_dir_all(&granted).unwrap();
    vault.write_config(
        NO_SEARCH,
        &hostile_config(&format!(
            "sandbox = {{ writable = [{:?}] }}",
            granted.display().to_string()
        )),
    );
    let mut cmd = vault.cmd();
    cmd.env("HOME", &home);
    let daemon = RunningDaemon::start(cmd, vault.dir.path().join("daemon.log"));
    // The folder becomes a link to the person's keys, then the server crashes: its restart
    // must not follow the link.
    std::fs::rename(&granted, vault.dir.path().join("Projects-away")).unwrap();
    std::os::unix::fs::symlink(home.join(".ssh"), &granted).unwrap();
    vault.drop_note(
        "crash.md",
        &note_with_calls("crash", &[probe("exit", json!({}))]),
    );
    vault.wait_until_in("Done", "crash.md");
    daemon.wait_for_log("is a symbolic link");
    let log = daemon.log_text();
    assert!(
        log.contains("MCP server `h` was not started: sandbox.writable:"),
        "{log}"
    );
    // Calls meanwhile fail, retryable; nothing was written through the link.
    vault.drop_note(
        "after.md",
        &note_with_calls(
            "after",
            &[probe(
                "write",
                json!({ "path": granted.join("x").display().to_string() }),
            )],
        ),
    );
    let text = vault.wait_until_in("Failed", "after.md");
    assert!(text.contains("EXECUTION_ERROR"), "{text}");
    assert!(!home.join(".ssh/x").exists());
    let mut key = String::new();
    std::fs::File::open(home.join(".ssh/id_ed25519"))
        .unwrap()
        .read_to_string(&mut key)
        .unwrap();
    assert_eq!(key, "PRIVATE KEY");
}

/// The reference servers people install, with only what docs/tools/mcp.md tells them to set:
/// each works in the default sandbox.
#[test]
fn the_reference_servers_work_in_the_default_sandbox() {
    let vault = TestVault::new(NO_SEARCH, "");
    let home = home_with_a_key(&vault);
    let root = vault.root.join("Projects");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("plan.md"), "the plan").unwrap();
    let memory = vault.dir.path().join("memory");
    std::fs::create_dir_all(&memory).unwrap();
    let repo = vault.dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .current_dir(&repo)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(repo.join("a.txt"), "a").unwrap();
    git(&["add", "a.txt"]);
    git(&["commit", "-qm", "first"]);
    let s = |p: &Path| format!("{:?}", p.display().to_string());
    let npm = |bin: &str| reference(&format!("mcp-reference/node_modules/.bin/{bin}"));
    let py = |bin: &str| reference(&format!("mcp-python/bin/{bin}"));
    let server = |name: &str, command: String, more: &str, tools: &[&str]| {
        let mut t = format!(
            "[mcp.{name}]\ncommand = {command}\nallow = [\"*\"]\nstart_timeout = \"60s\"\ntimeout = \"60s\"\n{more}\n"
        );
        for tool in tools {
            t.push_str(&format!(
                "[mcp.{name}.tools.{tool}]\neffect = \"read_only\"\n"
            ));
        }
        t
    };
    let config = [
        server(
            "everything",
            format!("[{:?}, \"stdio\"]", npm("mcp-server-everything")),
            "",
            &["echo"],
        ),
        server(
            "fs",
            format!("[{:?}, {}]", npm("mcp-server-filesystem"), s(&root)),
            &format!("sandbox = {{ writable = [{}] }}", s(&root)),
            &["write_file", "read_text_file"],
        ),
        server(
            "memory",
            format!("[{:?}]", npm("mcp-server-memory")),
            &format!(
                "env = {{ MEMORY_FILE_PATH = {} }}\nsandbox = {{ writable = [{}] }}",
                s(&memory.join("memory.jsonl")),
                s(&memory)
            ),
            &["create_entities"],
        ),
        server(
            "think",
            format!("[{:?}]", npm("mcp-server-sequential-thinking")),
            "",
            &["sequentialthinking"],
        ),
        server(
            "time",
            format!("[{:?}]", py("mcp-server-time")),
            "",
            &["get_current_time"],
        ),
        server(
            "git",
            format!(
                "[{:?}, \"--repository\", {}]",
                py("mcp-server-git"),
                s(&repo)
            ),
            &format!("sandbox = {{ writable = [{}] }}", s(&repo)),
            &["git_log"],
        ),
    ]
    .concat();
    vault.write_config(NO_SEARCH, &config);
    let c = |name: &str, params: Value| json!({ "name": name, "parameters": params });
    let calls = [
        c("mcp__everything__echo", json!({ "message": "sandboxed" })),
        c(
            "mcp__fs__write_file",
            json!({ "path": root.join("new.md").display().to_string(), "content": "from fs" }),
        ),
        c(
            "mcp__fs__read_text_file",
            json!({ "path": root.join("plan.md").display().to_string() }),
        ),
        c(
            "mcp__memory__create_entities",
            json!({ "entities": [{ "name": "vaultd", "entityType": "tool", "observations": ["sandboxed"] }] }),
        ),
        c(
            "mcp__think__sequentialthinking",
            json!({ "thought": "one", "nextThoughtNeeded": false, "thoughtNumber": 1, "totalThoughts": 1 }),
        ),
        c("mcp__time__get_current_time", json!({ "timezone": "UTC" })),
        c(
            "mcp__git__git_log",
            json!({ "repo_path": repo.display().to_string() }),
        ),
    ];
    vault.drop_note("refs.md", &note_with_calls("refs", &calls));
    let out = vault.cmd().env("HOME", &home).arg("once").output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        vault.exists("Done", "refs.md"),
        "{:?}\n{log}",
        vault.all_notes()
    );
    let text = vault.read("Done", "refs.md");
    let r = results_in(&text);
    assert_eq!(r.len(), calls.len(), "{text}");
    let said = |tool: &str| -> String {
        r.iter()
            .find(|x| x["name"] == tool)
            .unwrap_or_else(|| panic!("no result of {tool}: {text}"))["data"]["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(said("mcp__everything__echo"), "Echo: sandboxed");
    assert_eq!(
        std::fs::read_to_string(root.join("new.md")).unwrap(),
        "from fs"
    );
    assert!(
        said("mcp__fs__read_text_file").contains("the plan"),
        "{text}"
    );
    let graph = std::fs::read_to_string(memory.join("memory.jsonl")).unwrap();
    assert!(graph.contains("\"vaultd\""), "{graph}");
    assert!(said("mcp__think__sequentialthinking").contains("thoughtNumber"));
    assert!(
        said("mcp__time__get_current_time").contains("UTC"),
        "{text}"
    );
    assert!(said("mcp__git__git_log").contains("first"), "{text}");
}

/// Every `file:` secret of the config is kept from a sandboxed server like the person's
/// keys: here a command tool's token, outside the vault and the home directory. "Everything
/// but the secrets" granted it before, so any server could read another tool's token.
#[test]
fn a_server_cannot_read_the_file_secrets_of_the_config() {
    let vault = TestVault::new(NO_SEARCH, "");
    let secrets = vault.dir.path().join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    let token = secrets.join("tool-token");
    std::fs::write(&token, "tool-token-4821").unwrap();
    let plain = secrets.join("not-a-secret.txt");
    std::fs::write(&plain, "plain").unwrap();
    vault.write_config(
        NO_SEARCH,
        &format!(
            "[tools.command.t]\ndescription = \"A tool with a token\"\nargv = [\"true\"]\neffect = \"read_only\"\nenv = {{ TOKEN = \"file:{}\" }}\n{}",
            token.display(),
            hostile_config("")
        ),
    );
    let (token_s, plain_s) = (token.display().to_string(), plain.display().to_string());
    vault.drop_note(
        "probe.md",
        &note_with_calls(
            "Probe",
            &[
                probe("read", json!({ "path": token_s })),
                probe("read", json!({ "path": plain_s })),
                // Of /dev only what programs read: not a disk (or a terminal, the kernel log).
                probe("read", json!({ "path": "/dev/loop0" })),
                probe("read", json!({ "path": "/dev/null" })),
            ],
        ),
    );
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
    let text = vault.read("Done", "probe.md");
    let p = probes(&text);
    let (ok, detail) = &p[&format!("read {token_s}")];
    assert!(!ok, "the tool's token was read: {detail}");
    let (ok, detail) = &p[&format!("read {plain_s}")];
    assert!(ok, "a file beside it is readable: {detail}");
    if std::path::Path::new("/dev/loop0").exists() {
        let (ok, detail) = &p["read /dev/loop0"];
        assert!(
            !ok && (detail.contains("Permission denied") || detail.contains("Errno 13")),
            "a disk device was read: {detail}"
        );
    }
    let (ok, detail) = &p["read /dev/null"];
    assert!(ok, "/dev/null: {detail}");
}
