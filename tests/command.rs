//! Command tools end to end (docs/design.md §10.5): real programs under the real `vaultd` binary, in
//! the real Landlock sandbox of this kernel. Each escape attempt ends as the contract says,
//! parameters reach the program as one argument each, and journal, approval, rate limits
//! and recovery behave as for built-in tools.

use crate::util::*;
use serde_json::{Value, json};
use std::net::TcpListener;
use std::path::{Path, PathBuf};

/// No search server is used here; the config still names one.
const NO_SEARCH: &str = "http://127.0.0.1:9";

/// A vault with the command tools of `tools` (TOML) and an `out/` folder tools may write.
fn command_vault(tools: &str) -> TestVault {
    let vault = TestVault::new(NO_SEARCH, tools);
    std::fs::create_dir_all(vault.root.join("out")).unwrap();
    std::fs::create_dir_all(vault.root.join("notes")).unwrap();
    vault
}

fn call(name: &str, parameters: Value) -> Value {
    json!({ "name": name, "parameters": parameters })
}

fn once_ok(vault: &TestVault) {
    let (code, log) = vault.once();
    assert_eq!(code, 0, "{log}");
}

/// A tool that runs one `sh` script given by the note; read_only so it runs at once.
const SH_TOOL: &str = r#"
[tools.command.sh]
description = "Run a shell script (test only)"
argv = ["sh", "-c", "{script}"]
parameters = { type = "object", properties = { script = { type = "string" } }, required = ["script"] }
effect = "read_only"
writable = ["out"]
max_output_bytes = 4096
"#;

#[test]
fn the_sandbox_denies_writes_and_reads_outside_and_caps_output() {
    let vault = command_vault(SH_TOOL);
    let outside = vault.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "the-outside-secret").unwrap();
    std::fs::write(vault.root.join("notes/a.md"), "three small words").unwrap();
    let o = outside.display();
    let scripts = [
        // 0: the vault is read-only (outside `writable`)...
        "echo x > notes/new.txt".to_string(),
        // 1: ...and so is everything outside it.
        format!("echo x > {o}/evil.txt"),
        // 2: a file outside the vault and system dirs cannot be read.
        format!("cat {o}/secret.txt"),
        // 3: `writable` folders and the scratch HOME can be written; the vault read.
        "echo ok > out/ok.txt && echo home > \"$HOME/h\" && cat \"$HOME/h\" && wc -w < notes/a.md"
            .to_string(),
        // 4: 50 MB on stdout: the first max_output_bytes kept, the rest drained.
        "yes | head -c 52428800; echo done >&2".to_string(),
        // 5: the environment is only the list of docs/design.md §10.5.
        "env | cut -d= -f1 | sort | tr '\\n' ' '".to_string(),
    ];
    let calls: Vec<Value> = scripts
        .iter()
        .map(|s| call("sh", json!({ "script": s })))
        .collect();
    vault.drop_note("escape.md", &note_with_calls("Escape", &calls));
    once_ok(&vault);
    let text = vault.read("Failed", "escape.md");
    let r = results_in(&text);
    assert_eq!(r.len(), 6, "{text}");

    assert_eq!(r[0]["error"]["code"], "EXECUTION_ERROR", "{}", r[0]);
    assert!(
        r[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Permission denied"),
        "{}",
        r[0]
    );
    assert!(!vault.root.join("notes/new.txt").exists());

    assert_eq!(r[1]["error"]["code"], "EXECUTION_ERROR", "{}", r[1]);
    assert!(!outside.join("evil.txt").exists());

    assert_eq!(r[2]["error"]["code"], "EXECUTION_ERROR", "{}", r[2]);
    assert_eq!(r[2]["error"]["details"]["exit_code"], 1);
    assert!(
        r[2]["error"]["details"]["stderr"]
            .as_str()
            .unwrap()
            .contains("Permission denied"),
        "{}",
        r[2]
    );
    assert!(!text.contains("the-outside-secret"));

    assert_eq!(r[3]["ok"], true, "{}", r[3]);
    assert_eq!(r[3]["data"]["stdout"], "home\n3\n");
    assert_eq!(r[3]["data"]["exit_code"], 0);
    assert_eq!(
        std::fs::read_to_string(vault.root.join("out/ok.txt")).unwrap(),
        "ok\n"
    );

    assert_eq!(r[4]["ok"], true, "{}", r[4]);
    assert_eq!(r[4]["data"]["stdout"].as_str().unwrap().len(), 4096);
    assert_eq!(r[4]["data"]["stdout_truncated"], true);
    assert_eq!(
        r[4]["data"]["stderr"], "done\n",
        "the program ran to its end"
    );

    assert_eq!(
        r[5]["data"]["stdout"], "HOME LANG PATH PWD TMPDIR VAULTD_CALL_ID VAULTD_NOTE_ID ",
        "PWD is the shell's own"
    );
    // Each call's scratch dir is gone afterwards.
    let scratch = vault.state.join("scratch");
    let left: Vec<_> = std::fs::read_dir(&scratch)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn tcp_is_denied_without_network_and_allowed_with_it() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let tool = |name: &str, network: bool| {
        format!(
            "[tools.command.{name}]\ndescription = \"connect\"\nargv = [\"bash\", \"-c\", 'exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected']\neffect = \"read_only\"\nnetwork = {network}\n"
        )
    };
    let vault = command_vault(&format!(
        "{}{}",
        tool("offline", false),
        tool("online", true)
    ));
    vault.drop_note(
        "net.md",
        &note_with_calls("Net", &[call("offline", json!({}))]),
    );
    once_ok(&vault);
    let r = &results_in(&vault.read("Failed", "net.md"))[0];
    assert_eq!(r["error"]["code"], "EXECUTION_ERROR", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Permission denied"),
        "{r}"
    );
    assert!(listener.accept().is_err(), "no connection arrived");

    vault.drop_note(
        "net2.md",
        &note_with_calls("Net", &[call("online", json!({}))]),
    );
    once_ok(&vault);
    let r = &results_in(&vault.read("Done", "net2.md"))[0];
    assert_eq!(r["data"]["stdout"], "connected\n", "{r}");
    assert!(listener.accept().is_ok(), "the connection arrived");
}

#[test]
fn hostile_parameter_values_reach_the_program_as_one_unexpanded_argument() {
    let vault = command_vault(
        r#"
[tools.command.echo_args]
description = "Print the argument count and each argument"
argv = ["sh", "-c", 'printf "%s|" "$#" "$@"', "sh", "{text}", "--fixed={n}"]
parameters = { type = "object", properties = { text = { type = "string" }, n = { type = "integer" } }, required = ["text"] }
effect = "read_only"
"#,
    );
    let values = [
        "two words",
        "it's \"quoted\"",
        "$(touch pwned) `id`",
        "; rm -rf / ; echo",
        "line one\nline two",
        "-n",
        "--help",
        "*",
    ];
    let calls: Vec<Value> = values
        .iter()
        .map(|v| call("echo_args", json!({ "text": v, "n": 7 })))
        .collect();
    vault.drop_note("args.md", &note_with_calls("Args", &calls));
    once_ok(&vault);
    let r = results_in(&vault.read("Done", "args.md"));
    assert_eq!(r.len(), values.len());
    for (v, r) in values.iter().zip(&r) {
        assert_eq!(r["data"]["stdout"], format!("2|{v}|--fixed=7|"), "{r}");
    }
    assert!(!vault.root.join("pwned").exists());
}

#[test]
fn a_timeout_kills_the_whole_process_group_and_leaves_no_orphan() {
    let vault = command_vault(
        r#"
[tools.command.slow]
description = "Start a grandchild and wait"
argv = ["sh", "-c", 'sleep 300 & echo $! > out/grandchild.pid; wait']
effect = "read_only"
timeout = "2s"
writable = ["out"]

[tools.command.quick]
description = "Answer"
argv = ["echo", "still here"]
effect = "read_only"
"#,
    );
    vault.drop_note(
        "slow.md",
        &note_with_calls("Slow", &[call("slow", json!({}))]),
    );
    once_ok(&vault);
    let r = &results_in(&vault.read("Failed", "slow.md"))[0];
    assert_eq!(r["error"]["code"], "TIMEOUT", "{r}");
    assert_eq!(r["error"]["retryable"], true);
    let pid: i32 = std::fs::read_to_string(vault.root.join("out/grandchild.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until("the grandchild is gone", DEADLINE, || !alive(pid));

    // The daemon is healthy: the next call runs.
    vault.drop_note(
        "quick.md",
        &note_with_calls("Quick", &[call("quick", json!({}))]),
    );
    once_ok(&vault);
    let r = &results_in(&vault.read("Done", "quick.md"))[0];
    assert_eq!(r["data"]["stdout"], "still here\n");
}

/// Whether `pid` is a live process (a zombie is dead).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

#[test]
fn a_fork_bomb_hits_the_process_limit() {
    let vault = command_vault(
        r#"
[tools.command.forker]
description = "Fork 100 sleeping children"
argv = ["perl", "-e", 'my $n = 0; for (1..100) { my $p = fork(); if (!defined $p) { print "forked $n then failed\n"; exit 3 } if ($p == 0) { sleep 60; exit 0 } $n++ } print "forked $n\n"']
effect = "read_only"
max_processes = 20
timeout = "20s"
"#,
    );
    vault.drop_note(
        "fork.md",
        &note_with_calls("Fork", &[call("forker", json!({}))]),
    );
    // The kernel never applies RLIMIT_NPROC to root, so a root test runs vaultd as nobody.
    let mut cmd = vault.cmd();
    if unsafe { libc::getuid() } == 0 {
        chown_all(vault.dir.path(), 65534);
        use std::os::unix::process::CommandExt;
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.arg("once").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = &results_in(&vault.read("Failed", "fork.md"))[0];
    assert_eq!(r["error"]["code"], "EXECUTION_ERROR", "{r}");
    assert_eq!(r["error"]["details"]["exit_code"], 3, "{r}");
    let stdout = r["error"]["details"]["stdout"].as_str().unwrap();
    let forked: u32 = stdout
        .strip_prefix("forked ")
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    eprintln!("fork bomb: {stdout}");
    assert!(forked <= 20, "{stdout}");
}

fn chown_all(path: &Path, id: u32) {
    std::os::unix::fs::lchown(path, Some(id), Some(id)).unwrap();
    if path.is_dir() && !path.is_symlink() {
        for e in std::fs::read_dir(path).unwrap().flatten() {
            chown_all(&e.path(), id);
        }
    }
}

#[test]
fn external_side_effects_wait_for_approval_and_rate_limits_count() {
    let vault = command_vault(
        r#"
[tools.command.notify]
description = "Append a line to out/sent.txt"
argv = ["sh", "-c", 'echo "$1" >> out/sent.txt', "sh", "{message}"]
parameters = { type = "object", properties = { message = { type = "string" } }, required = ["message"] }
writable = ["out"]

[tools.command.limited]
description = "Do nothing, at most once an hour"
argv = ["true"]
effect = "read_only"
rate_limit = { per_hour = 1 }
"#,
    );
    let sent = vault.root.join("out/sent.txt");
    vault.drop_note(
        "ask.md",
        &note_with_calls("Ask", &[call("notify", json!({ "message": "hello" }))]),
    );
    once_ok(&vault);
    let text = vault.read("Pending_Approval", "ask.md");
    assert!(
        text.contains("approval = \\\"always\\\"") || text.contains("needs approval"),
        "{text}"
    );
    assert!(!sent.exists(), "nothing ran before approval");
    vault.move_note("Pending_Approval", "Approved", "ask.md");
    once_ok(&vault);
    let r = &results_in(&vault.read("Done", "ask.md"))[0];
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(std::fs::read_to_string(&sent).unwrap(), "hello\n");

    vault.drop_note(
        "twice.md",
        &note_with_calls(
            "Twice",
            &[call("limited", json!({})), call("limited", json!({}))],
        ),
    );
    once_ok(&vault);
    let r = results_in(&vault.read("Failed", "twice.md"));
    // Calls of one note run in parallel: either may take the one slot.
    let ok = r.iter().filter(|x| x["ok"] == true).count();
    let limited = r
        .iter()
        .filter(|x| x["error"]["code"] == "RATE_LIMITED")
        .count();
    assert_eq!((ok, limited), (1, 1), "{r:?}");
}

#[test]
fn a_started_command_killed_with_the_daemon_is_unknown_outcome_never_run_twice() {
    let vault = command_vault(
        r#"
[tools.command.deploy]
description = "Record a run, then take long"
argv = ["sh", "-c", 'echo run >> out/runs.txt; echo $$ > out/pgid; sleep 60']
approval = "never"
timeout = "90s"
writable = ["out"]
"#,
    );
    let daemon = vault.start();
    vault.drop_note(
        "deploy.md",
        &note_with_calls("Deploy", &[call("deploy", json!({}))]),
    );
    let pgid_file = vault.root.join("out/pgid");
    wait_until("the command runs", DEADLINE, || {
        std::fs::read_to_string(&pgid_file).is_ok_and(|s| s.ends_with('\n'))
    });
    daemon.kill9();
    // The program does not outlive the killed daemon: its supervisor saw the control pipe
    // close with vaultd and killed it.
    let pid: i32 = std::fs::read_to_string(&pgid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until("the program dies with the daemon", DEADLINE, || !alive(pid));

    once_ok(&vault);
    let text = vault.read("Failed", "deploy.md");
    let r = results_in(&text);
    assert_eq!(r.len(), 1, "{text}");
    assert_eq!(r[0]["error"]["code"], "UNKNOWN_OUTCOME", "{text}");
    assert_eq!(
        std::fs::read_to_string(vault.root.join("out/runs.txt")).unwrap(),
        "run\n",
        "never a second run"
    );
}

#[test]
fn env_secrets_reach_the_program_and_are_redacted_from_the_note() {
    let vault = command_vault(
        r#"
[tools.command.leaky]
description = "Print its token"
argv = ["sh", "-c", 'echo "token=$TOKEN mode=$MODE"']
effect = "read_only"
env = { TOKEN = "env:VAULTD_TEST_COMMAND_TOKEN", MODE = "plain" }
"#,
    );
    vault.drop_note(
        "leak.md",
        &note_with_calls("Leak", &[call("leaky", json!({}))]),
    );
    let out = vault
        .cmd()
        .env("VAULTD_TEST_COMMAND_TOKEN", "s3cr3t-command-token")
        .arg("once")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = vault.read("Done", "leak.md");
    assert!(!text.contains("s3cr3t-command-token"), "{text}");
    let stdout = results_in(&text)[0]["data"]["stdout"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        stdout.starts_with("token=") && stdout.ends_with(" mode=plain\n"),
        "{stdout}"
    );
    assert_ne!(stdout, "token= mode=plain\n", "the program got the secret");
}

#[test]
fn tools_lists_command_tools_with_their_sandbox_for_openai_too() {
    let vault = command_vault(SH_TOOL);
    let out = vault.cmd().args(["tools", "--json"]).output().unwrap();
    assert!(out.status.success());
    let tools: Value = serde_json::from_slice(&out.stdout).unwrap();
    let sh = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "sh")
        .unwrap();
    assert_eq!(sh["source"], "command");
    assert_eq!(sh["details"]["sandbox"], "required");
    assert!(sh["details"]["landlock_abi"].as_i64().unwrap() >= 4, "{sh}");
    assert_eq!(sh["details"]["fully_enforced"], true, "{sh}");

    let out = vault
        .cmd()
        .args(["tools", "--format", "openai"])
        .output()
        .unwrap();
    let tools: Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "sh")
        .expect("the command tool is offered to OpenAI");
    assert_eq!(f["function"]["parameters"]["required"], json!(["script"]));

    let out = vault.cmd().arg("tools").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("sandbox: Landlock ABI"), "{text}");
}

#[test]
fn config_mistakes_stop_the_daemon_with_file_line_and_key() {
    let cases: [(&str, &str, &str); 5] = [
        (
            "argv = [\"echo\", \"{missing}\"]\nparameters = { properties = { x = { type = \"string\" } } }",
            "argv",
            "`{missing}` names no parameter",
        ),
        (
            "argv = [\"echo\", \"{list}\"]\nparameters = { properties = { list = { type = \"array\" } } }",
            "argv",
            "must have a scalar type",
        ),
        (
            "argv = [\"no-such-program-vaultd\"]",
            "argv",
            "program `no-such-program-vaultd` not found",
        ),
        (
            "argv = [\"echo\"]\nparameters = { properties = { x = { type = \"no-such-type\" } } }",
            "parameters",
            "does not compile",
        ),
        (
            "argv = [\"echo\"]\nwritable = [\"../outside\"]",
            "writable",
            "without `..`",
        ),
    ];
    for (table, key, says) in cases {
        let vault = command_vault(&format!(
            "[tools.command.bad]\ndescription = \"bad\"\n{table}\n"
        ));
        let config = std::fs::read_to_string(&vault.config).unwrap();
        let line = 1 + config
            .lines()
            .position(|l| l.starts_with(&format!("{key} =")))
            .unwrap();
        let (code, log) = vault.once();
        assert_ne!(code, 0, "{log}");
        let path: PathBuf = vault.config.clone();
        assert!(
            log.contains(&format!(
                "bad config {}, line {line}: key `tools.command.bad.{key}`",
                path.display()
            )),
            "{log}"
        );
        assert!(log.contains(says), "{log}");
    }
}

#[test]
fn the_example_vaults_command_tool_works_on_a_fresh_machine() {
    let vault = TestVault::new(NO_SEARCH, "");
    // Only the command tool's note: the example's other notes would reach the internet.
    for rel in ["Reference/Ideas.md", "Needs_Action/Count words.md"] {
        let to = vault.root.join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, example_vault_file(rel)).unwrap();
    }
    let mut config = String::from_utf8(example_vault_file(".vaultd.toml")).unwrap();
    config = config.replace(
        "state_dir = \".vaultd-state\"",
        &format!("state_dir = {:?}", vault.state.display().to_string()),
    );
    let config = format!("vault = {:?}\n{config}", vault.root.display().to_string());
    std::fs::write(&vault.config, config).unwrap();
    once_ok(&vault);
    let r = &results_in(&vault.read("Done", "Count words.md"))[0];
    assert_eq!(r["data"]["stdout"], "11 Reference/Ideas.md\n", "{r}");
}

/// A hostile program tries every kind of socket toward listeners the test runs outside the
/// sandbox: a unix socket by path, an abstract unix socket, UDP (v4 and v6), TCP, netlink,
/// raw and packet sockets. With `network = false` none is even created, and no listener
/// hears a byte.
#[test]
fn without_network_no_socket_of_any_family_reaches_a_listener_outside() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let outside = tempfile::tempdir().unwrap();
    let unix_path = outside.path().join("bus.sock");
    let unix = UnixListener::bind(&unix_path).unwrap();
    unix.set_nonblocking(true).unwrap();
    let abstract_name = format!("vaultd-test-{}", std::process::id());
    let abstract_unix =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap())
            .unwrap();
    abstract_unix.set_nonblocking(true).unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let udp6 = std::net::UdpSocket::bind("[::1]:0").ok();
    if let Some(u) = &udp6 {
        u.set_nonblocking(true).unwrap();
    }
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let script = r#"
use Socket qw(:DEFAULT inet_pton pack_sockaddr_in6);
my ($path, $abstract, $udp, $udp6, $tcp) = @ARGV;
sub attempt {
    my ($name, $domain, $type, $proto, $addr) = @_;
    if (!socket(my $s, $domain, $type, $proto)) { print "$name: no socket ($!)\n"; return }
    if (!defined $addr) { print "$name: OPENED\n"; return }
    if (!connect($s, $addr)) { print "$name: no connect ($!)\n"; return }
    send($s, "hostile", 0);
    print "$name: CONNECTED\n";
}
attempt("unix_path", AF_UNIX, SOCK_STREAM, 0, pack_sockaddr_un($path));
attempt("unix_abstract", AF_UNIX, SOCK_STREAM, 0, pack_sockaddr_un("\0" . $abstract));
attempt("unix_datagram", AF_UNIX, SOCK_DGRAM, 0, pack_sockaddr_un($path));
attempt("udp", AF_INET, SOCK_DGRAM, 0, pack_sockaddr_in($udp, inet_aton("127.0.0.1")));
attempt("udp6", AF_INET6, SOCK_DGRAM, 0, pack_sockaddr_in6($udp6, inet_pton(AF_INET6, "::1")));
attempt("tcp", AF_INET, SOCK_STREAM, 0, pack_sockaddr_in($tcp, inet_aton("127.0.0.1")));
attempt("netlink", 16, SOCK_RAW, 0, undef);
attempt("raw", AF_INET, SOCK_RAW, 1, undef);
attempt("packet", 17, SOCK_DGRAM, 0, undef);
"#;
    let vault = command_vault(&format!(
        "[tools.command.hostile]\ndescription = \"Try every socket\"\nargv = [\"perl\", \"-e\", '''{script}''', {:?}, {:?}, \"{}\", \"{}\", \"{}\"]\neffect = \"read_only\"\nnetwork = false\n",
        unix_path.display().to_string(),
        abstract_name,
        udp.local_addr().unwrap().port(),
        udp6.as_ref().map_or(9, |u| u.local_addr().unwrap().port()),
        tcp.local_addr().unwrap().port(),
    ));
    vault.drop_note(
        "sockets.md",
        &note_with_calls("Sockets", &[call("hostile", json!({}))]),
    );
    once_ok(&vault);
    let text = ["Done", "Failed"]
        .iter()
        .find(|f| vault.exists(f, "sockets.md"))
        .map(|f| vault.read(f, "sockets.md"))
        .expect("the note is done or failed");
    let r = &results_in(&text)[0];
    assert_eq!(r["ok"], true, "{text}");
    let stdout = r["data"]["stdout"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 9, "{stdout}");
    for line in &lines {
        assert!(
            line.ends_with(": no socket (Permission denied)"),
            "{stdout}"
        );
    }
    let nothing = |what: &str, r: std::io::Result<()>| match r {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("{what} heard from the sandbox: {other:?}"),
    };
    nothing("the unix listener", unix.accept().map(drop));
    nothing("the abstract listener", abstract_unix.accept().map(drop));
    nothing("the UDP listener", udp.recv(&mut [0; 64]).map(drop));
    if let Some(u) = &udp6 {
        nothing("the UDP6 listener", u.recv(&mut [0; 64]).map(drop));
    }
    nothing("the TCP listener", tcp.accept().map(drop));
}

/// With `network = true` a program reaches the network, but not a unix socket by path or
/// abstract name: those lead to what runs outside the sandbox on this machine (the session
/// bus can start a process outside it; an ssh agent signs with the person's keys). They were
/// allowed with `network = true`.
#[test]
fn with_network_a_unix_socket_outside_is_still_out_of_reach() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let outside = tempfile::tempdir().unwrap();
    let unix_path = outside.path().join("bus.sock");
    let unix = UnixListener::bind(&unix_path).unwrap();
    unix.set_nonblocking(true).unwrap();
    let abstract_name = format!("vaultd-net-test-{}", std::process::id());
    let abstract_unix =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap())
            .unwrap();
    abstract_unix.set_nonblocking(true).unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let script = r#"
use Socket;
my ($path, $abstract, $tcp) = @ARGV;
sub attempt {
    my ($name, $domain, $type, $addr) = @_;
    my $s;
    if (!socket($s, $domain, $type, 0)) { print "$name: no socket ($!)\n"; return }
    if (!connect($s, $addr)) { print "$name: no connect ($!)\n"; return }
    print "$name: CONNECTED\n";
}
attempt("unix_path", AF_UNIX, SOCK_STREAM, pack_sockaddr_un($path));
attempt("unix_abstract", AF_UNIX, SOCK_STREAM, pack_sockaddr_un("\0" . $abstract));
attempt("tcp", AF_INET, SOCK_STREAM, pack_sockaddr_in($tcp, inet_aton("127.0.0.1")));
"#;
    let vault = command_vault(&format!(
        "[tools.command.net]\ndescription = \"Try sockets with network\"\nargv = [\"perl\", \"-e\", '''{script}''', {:?}, {:?}, \"{}\"]\neffect = \"read_only\"\nnetwork = true\n",
        unix_path.display().to_string(),
        abstract_name,
        tcp.local_addr().unwrap().port(),
    ));
    let (r, text) = run_one(&vault, "net.md", "net");
    assert_eq!(r["ok"], true, "{text}");
    let stdout = r["data"]["stdout"].as_str().unwrap_or_default();
    assert!(
        stdout.contains("unix_path: no socket (Permission denied)")
            && stdout.contains("unix_abstract: no socket (Permission denied)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("tcp: CONNECTED"),
        "the network is reachable: {stdout}"
    );
    for (what, heard) in [
        ("the unix listener", unix.accept().map(drop)),
        ("the abstract listener", abstract_unix.accept().map(drop)),
    ] {
        assert!(
            matches!(&heard, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "{what} heard from the sandbox: {heard:?}"
        );
    }
}

/// A descriptor vaultd inherited open (not close-on-exec) from whatever started it does not
/// reach a program: here a file outside the vault, open as fd 7 when vaultd starts.
#[test]
fn a_descriptor_vaultd_inherited_does_not_reach_a_program() {
    use std::os::unix::process::CommandExt;
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "inherited secret\n").unwrap();
    let vault = command_vault(SH_TOOL);
    vault.drop_note(
        "fd.md",
        &note_with_calls(
            "Fd",
            &[call("sh", json!({ "script": "cat <&7 || echo no-fd-7" }))],
        ),
    );
    let file = std::fs::File::open(&secret).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let mut cmd = vault.cmd();
    cmd.arg("once");
    // SAFETY: dup2 in the child before exec, on descriptors it owns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, 7) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = ["Done", "Failed"]
        .iter()
        .find(|f| vault.exists(f, "fd.md"))
        .map(|f| vault.read(f, "fd.md"))
        .expect("the note is done or failed");
    assert!(!text.contains("inherited secret"), "{text}");
    assert!(text.contains("no-fd-7"), "{text}");
}

/// Of `/dev` a program reads only what programs read (null, zero, full, random, urandom):
/// not a terminal (the keystrokes typed in it), the kernel log, or a disk (every file, as
/// root). The whole of `/dev` was readable.
#[test]
fn a_program_reads_no_terminal_disk_or_kernel_log() {
    let vault = command_vault(SH_TOOL);
    let script = "for d in /dev/tty1 /dev/ptmx /dev/kmsg /dev/loop0 /dev/console; do \
                  if [ -e $d ]; then head -c1 $d >/dev/null 2>&1 && echo \"$d: READ\" || echo \"$d: denied\"; fi; done; \
                  head -c8 /dev/urandom | wc -c; echo x > /dev/null && echo null-ok";
    vault.drop_note(
        "dev.md",
        &note_with_calls("Dev", &[call("sh", json!({ "script": script }))]),
    );
    once_ok(&vault);
    let text = ["Done", "Failed"]
        .iter()
        .find(|f| vault.exists(f, "dev.md"))
        .map(|f| vault.read(f, "dev.md"))
        .expect("the note is done or failed");
    let r = &results_in(&text)[0];
    let stdout = r["data"]["stdout"].as_str().unwrap_or_default();
    assert!(!stdout.contains("READ"), "{stdout}");
    assert!(stdout.contains("denied"), "some device was tried: {stdout}");
    assert!(
        stdout.contains("8\n") && stdout.contains("null-ok"),
        "{stdout}"
    );
}

/// Runs `vaultd once` on one call of `tool` in the note `rel`; returns its result.
fn run_one(vault: &TestVault, rel: &str, tool: &str) -> (Value, String) {
    vault.drop_note(rel, &note_with_calls("Call", &[call(tool, json!({}))]));
    once_ok(vault);
    let text = ["Done", "Failed"]
        .iter()
        .find(|f| vault.exists(f, rel))
        .map(|f| vault.read(f, rel))
        .unwrap_or_else(|| {
            panic!(
                "{rel} is in neither Done nor Failed: {:?}",
                vault.all_notes()
            )
        });
    (results_in(&text)[0].clone(), text)
}

/// Between two calls, the `writable` folder becomes a symlink to a folder outside the vault
/// (what a program of the first call, or anyone, could do). The second call is refused, and
/// nothing is written outside.
#[test]
fn a_writable_folder_swapped_for_a_symlink_between_calls_is_refused() {
    let vault = command_vault(
        r#"
[tools.command.write]
description = "Write into out/"
argv = ["sh", "-c", 'echo written > out/file.txt']
effect = "read_only"
writable = ["out"]
"#,
    );
    // One running daemon: the config check at start-up would refuse the symlink; the swap
    // happens while `run` runs, between two calls.
    let daemon = vault.start();
    vault.drop_note(
        "one.md",
        &note_with_calls("Call", &[call("write", json!({}))]),
    );
    let one = vault.wait_until_in("Done", "one.md");
    assert_eq!(results_in(&one)[0]["ok"], true, "{one}");
    let outside = vault.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::rename(vault.root.join("out"), vault.root.join("out.before")).unwrap();
    std::os::unix::fs::symlink(&outside, vault.root.join("out")).unwrap();
    vault.drop_note(
        "two.md",
        &note_with_calls("Call", &[call("write", json!({}))]),
    );
    let two = vault.wait_until_in("Failed", "two.md");
    let r = &results_in(&two)[0];
    assert_eq!(r["error"]["code"], "POLICY_DENIED", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("`out` is a symbolic link"), "{message}");
    assert!(
        !outside.join("file.txt").exists(),
        "written outside the vault"
    );
    drop(daemon);
}

#[test]
fn writable_and_read_may_not_name_the_root_a_state_folder_a_hidden_path_or_secrets() {
    let cases = [
        ("writable = [\".\"]", "writable", "names the vault root"),
        ("writable = [\"Done\"]", "writable", "state folder `Done/`"),
        (
            "writable = [\"Needs_Action/sub\"]",
            "writable",
            "state folder `Needs_Action/`",
        ),
        // A state folder nested in another folder is found under it too.
        (
            "writable = [\"Inbox\"]\n[folders]\napproved = \"Inbox/Approved\"",
            "writable",
            "holds the state folder `Inbox/Approved/`",
        ),
        ("writable = [\".obsidian\"]", "writable", "is a hidden path"),
        ("read = [\"/\"]", "read", "never granted"),
        ("read = [\"~\"]", "read", "never granted"),
        (
            "max_processes = 0",
            "max_processes",
            "the program itself is one",
        ),
    ];
    for (line, key, says) in cases {
        let vault = command_vault(&format!(
            "[tools.command.bad]\ndescription = \"bad\"\nargv = [\"true\"]\n{line}\n"
        ));
        std::fs::create_dir_all(vault.root.join(".obsidian")).unwrap();
        let (code, log) = vault.once();
        assert_ne!(code, 0, "{line}: {log}");
        assert!(
            log.contains(&format!("key `tools.command.bad.{key}`")),
            "{line}: {log}"
        );
        assert!(log.contains(says), "{line}: {log}");
    }
}

/// A program double-forks a `setsid` daemon that keeps stdout open and sleeps, then exits
/// at once. The call ends when the program does, with its output, and the daemon is gone.
#[test]
fn a_double_forked_setsid_daemon_ends_with_the_call_and_does_not_hold_its_output() {
    let vault = command_vault(
        r#"
[tools.command.daemonize]
description = "Leave a daemon behind"
argv = ["perl", "-MPOSIX", "-e", 'if (fork() == 0) { POSIX::setsid(); if (fork() == 0) { open(my $f, ">", "out/daemon.pid.tmp"); print $f $$; close($f); rename("out/daemon.pid.tmp", "out/daemon.pid"); sleep 300; exit 0 } exit 0 } wait(); while (!-e "out/daemon.pid") { select(undef, undef, undef, 0.02) } print "parent done\n"']
effect = "read_only"
writable = ["out"]
timeout = "60s"
"#,
    );
    let started = std::time::Instant::now();
    let (r, _) = run_one(&vault, "daemon.md", "daemonize");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["data"]["stdout"], "parent done\n", "{r}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(50),
        "the daemon held the call: {:?}",
        started.elapsed()
    );
    let pid: i32 = std::fs::read_to_string(vault.root.join("out/daemon.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until("the daemon is gone", DEADLINE, || !alive(pid));
}

/// A sandboxed program makes no user namespace (where it would hold every capability):
/// `unshare -U` is refused, and the call fails saying so; the program's own children are
/// still made (`sh` starts `true`).
#[test]
fn a_program_makes_no_user_namespace_but_still_starts_processes() {
    if std::process::Command::new("unshare")
        .arg("--help")
        .output()
        .is_err()
    {
        eprintln!("skipped: no unshare(1) here");
        return;
    }
    let vault = command_vault(
        "[tools.command.userns]\ndescription = \"unshare\"\nargv = [\"unshare\", \"-U\", \"true\"]\neffect = \"read_only\"\n\n[tools.command.child]\ndescription = \"a child\"\nargv = [\"sh\", \"-c\", \"true; echo started\"]\neffect = \"read_only\"\n",
    );
    let (r, _) = run_one(&vault, "userns.md", "userns");
    assert_eq!(r["error"]["code"], "EXECUTION_ERROR", "{r}");
    let stderr = r["error"]["details"]["stderr"].as_str().unwrap_or_default();
    assert!(stderr.contains("Operation not permitted"), "{r}");
    let (r, _) = run_one(&vault, "child.md", "child");
    assert_eq!(r["data"]["stdout"], "started\n", "{r}");
}

/// What `vaultd tools` says bounds a call here (a cgroup, or per process).
fn sandbox_status(vault: &TestVault) -> String {
    let out = vault.cmd().args(["tools", "--json"]).output().unwrap();
    let tools: Value = serde_json::from_slice(&out.stdout).unwrap();
    tools
        .as_array()
        .unwrap()
        .iter()
        .find_map(|t| t["details"]["sandbox_status"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// As root (where RLIMIT_NPROC never applies), the call's pids cgroup bounds a fork bomb;
/// and four processes of 200 MB each do not all fit in `max_memory` = 400 MB together.
/// Skipped, saying so, where vaultd cannot make a cgroup.
#[test]
fn the_calls_cgroup_bounds_processes_and_memory_of_the_whole_call() {
    let vault = command_vault(
        r#"
[tools.command.forker]
description = "Fork 100 sleeping children"
argv = ["perl", "-e", 'my $n = 0; for (1..100) { my $p = fork(); if (!defined $p) { print "forked $n then failed\n"; exit 3 } if ($p == 0) { sleep 60; exit 0 } $n++ } print "forked $n\n"']
effect = "read_only"
max_processes = 20
timeout = "30s"

[tools.command.hog]
description = "Four processes of 200 MB"
argv = ["perl", "-e", 'for (1..4) { if (fork() == 0) { my $x = "a" x (200 * 1024 * 1024); sleep 10; exit 0 } } my $ok = 0; while ((my $p = wait()) > 0) { $ok++ if $? == 0 } print "$ok of 4\n"']
effect = "read_only"
max_memory = 419430400
timeout = "60s"
"#,
    );
    let status = sandbox_status(&vault);
    if !(status.contains("cgroup per call (memory, pids")) {
        eprintln!("skipped: no per-call cgroup here: {status}");
        return;
    }
    let (r, _) = run_one(&vault, "fork.md", "forker");
    assert_eq!(r["error"]["details"]["exit_code"], 3, "{r}");
    let stdout = r["error"]["details"]["stdout"].as_str().unwrap();
    let forked: u32 = stdout
        .strip_prefix("forked ")
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    // The program is one of the 20; its supervisor is none of them.
    assert_eq!(forked, 19, "{stdout}");

    let (r, _) = run_one(&vault, "hog.md", "hog");
    let stdout = r["data"]["stdout"].as_str().unwrap_or_default();
    assert!(stdout.ends_with(" of 4\n") && stdout != "4 of 4\n", "{r}");
}

/// pyenv's python (under ~/.pyenv, outside the system dirs) runs with `read` naming its
/// prefix, and fails without it with the denial explained; its temporary directory is the
/// call's private TMPDIR.
#[test]
fn an_interpreter_under_home_runs_with_read_and_the_denial_names_the_key() {
    let probe = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, os; print(os.path.realpath(sys.executable)); print(sys.prefix)",
        ])
        .output();
    let Ok(probe) = probe else {
        eprintln!("skipped: no python3");
        return;
    };
    let text = String::from_utf8_lossy(&probe.stdout).to_string();
    let mut lines = text.lines();
    let (Some(exe), Some(prefix)) = (lines.next(), lines.next()) else {
        eprintln!("skipped: python3 did not answer");
        return;
    };
    if prefix.starts_with("/usr") {
        eprintln!("skipped: python3 is the system's ({prefix})");
        return;
    }
    let script =
        "import tempfile, os; f = tempfile.NamedTemporaryFile(); print(os.path.dirname(f.name))";
    let vault = command_vault(&format!(
        "[tools.command.with_read]\ndescription = \"py\"\nargv = [{exe:?}, \"-c\", {script:?}]\neffect = \"read_only\"\nread = [{prefix:?}]\n\n[tools.command.without]\ndescription = \"py\"\nargv = [{exe:?}, \"-c\", {script:?}]\neffect = \"read_only\"\n"
    ));
    let (r, _) = run_one(&vault, "with.md", "with_read");
    assert_eq!(r["ok"], true, "{r}");
    let tmp = r["data"]["stdout"].as_str().unwrap().trim();
    assert!(
        tmp.starts_with(vault.state.join("scratch").to_str().unwrap()) && tmp.ends_with("/tmp"),
        "{tmp}"
    );
    let (r, _) = run_one(&vault, "without.md", "without");
    let message = r["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"));
    assert!(message.contains("denied by the sandbox: "), "{message}");
    assert!(
        message.contains("allow it with `read = [...]`"),
        "{message}"
    );
}

/// The program is started by its supervisor (docs/design.md §10.5), yet a program that
/// cannot be run is still the call's clear error, as when std's spawn ran it: one made
/// non-executable, then one removed, while the daemon runs (the config check at start-up
/// found both fine). Nothing else runs in their place.
#[test]
fn a_program_made_non_executable_or_removed_is_the_calls_clear_error() {
    use std::os::unix::fs::PermissionsExt;
    let bin = tempfile::tempdir().unwrap();
    let program = bin.path().join("tool.sh");
    std::fs::write(&program, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let vault = command_vault(&format!(
        "[tools.command.prog]\ndescription = \"A script\"\nargv = [{:?}]\neffect = \"read_only\"\n",
        program.to_str().unwrap()
    ));
    let daemon = vault.start();
    let run = |rel: &str, folder: &str| {
        vault.drop_note(rel, &note_with_calls("Call", &[call("prog", json!({}))]));
        let text = vault.wait_until_in(folder, rel);
        results_in(&text)[0].clone()
    };
    let r = run("one.md", "Done");
    assert_eq!(r["data"]["stdout"], "ran\n", "{r}");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = run("two.md", "Failed");
    assert_eq!(r["error"]["code"], "EXECUTION_ERROR", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("could not be started: Permission denied (os error 13)"),
        "{message}"
    );
    std::fs::remove_file(&program).unwrap();
    let r = run("three.md", "Failed");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("could not be started: No such file or directory (os error 2)"),
        "{message}"
    );
    drop(daemon);
}

/// vaultd's own open files do not grow with the calls it runs: the program's process
/// shares vaultd's memory where the supervisor is started in it, and what that process
/// takes and closes (the call's Landlock ruleset, its pipes) must still be closed in
/// vaultd's own fd table.
#[test]
fn calls_leave_no_open_file_behind_in_the_daemon() {
    let vault = command_vault(
        "[tools.command.noop]\ndescription = \"Nothing\"\nargv = [\"true\"]\neffect = \"read_only\"\n",
    );
    let daemon = vault.start();
    let open_files = || {
        std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
            .unwrap()
            .count()
    };
    vault.drop_note(
        "warm.md",
        &note_with_calls("Warm", &[call("noop", json!({}))]),
    );
    vault.wait_until_in("Done", "warm.md");
    // Once the warm call's clean-up is over: the count holds still.
    let mut before = open_files();
    for _ in 0..40 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = open_files();
        if now == before {
            break;
        }
        before = now;
    }
    let calls: Vec<Value> = (0..10).map(|_| call("noop", json!({}))).collect();
    for i in 0..4 {
        vault.drop_note(&format!("n{i}.md"), &note_with_calls("Calls", &calls));
    }
    vault.wait_for_notes_in("Done", 5);
    // Clean-up (scratch dirs, cgroups) runs after each call: let it finish. A few more
    // may stay open for good (a connection a busier moment opened); one per call may not.
    let slack = 12;
    let mut after = open_files();
    for _ in 0..200 {
        if after <= before + slack {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        after = open_files();
    }
    assert!(
        after <= before + slack,
        "{before} open files before 40 calls, {after} after"
    );
    drop(daemon);
}
