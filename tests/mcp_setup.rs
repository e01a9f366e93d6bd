//! Moving MCP servers over (docs/design.md §10.4, "Coming from another client"), end to end
//! with the real `vaultd` binary: `vaultd mcp add` and `vaultd mcp import` write into a config
//! full of comments, keep them, refuse what the daemon would refuse, and the daemon then runs
//! the added server (the in-tree rmcp test server, found in PATH as the fixtures name it);
//! `vaultd tools --all` and `vaultd status` say what each server is doing.

use crate::util::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Output;

const NO_SEARCH: &str = "http://127.0.0.1:9";

/// Comments a person wrote, at the top, between keys and at the end.
const COMMENTS: &[&str] = &[
    "# My vault: keep these comments",
    "# before the search section",
    "# at the very end, after everything",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mcp-import")
        .join(name)
}

/// A vault whose config carries [`COMMENTS`], with the test server in PATH as
/// `vaultd-mcp-test-server` (the name the fixtures use).
fn commented_vault() -> TestVault {
    let vault = TestVault::new(NO_SEARCH, "");
    let text = std::fs::read_to_string(&vault.config).unwrap();
    let text = format!(
        "{}\n{}\n{}\n{}\n",
        COMMENTS[0],
        text.replace(
            "[tools.search_web]",
            &format!("{}\n[tools.search_web] # inline comment", COMMENTS[1])
        ),
        "[mcp.kept]   # a server configured by hand\ncommand = [\"vaultd-mcp-test-server\"]\nallow = [\"echo\"]   # only echo",
        COMMENTS[2],
    );
    std::fs::write(&vault.config, text).unwrap();
    vault
}

/// `vaultd ARGS` in `vault`, with the test server's folder first in PATH.
fn vaultd(vault: &TestVault, args: &[&str]) -> Output {
    let server = mcp_test_server();
    let path = format!(
        "{}:{}",
        server.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    vault
        .cmd()
        .env("PATH", path)
        .args(args)
        .output()
        .expect("run vaultd")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn config_text(vault: &TestVault) -> String {
    std::fs::read_to_string(&vault.config).unwrap()
}

fn assert_comments_kept(config: &str) {
    for c in COMMENTS {
        assert!(config.contains(c), "lost {c:?}:\n{config}");
    }
    assert!(
        config.contains("[tools.search_web] # inline comment")
            && config.contains("[mcp.kept]   # a server configured by hand")
            && config.contains("allow = [\"echo\"]   # only echo"),
        "{config}"
    );
}

/// Every line of `before` is in `after`, in the same order (the writer only adds).
fn assert_lines_kept(before: &str, after: &str) {
    let mut rest = after;
    for line in before.lines() {
        let at = rest
            .find(line)
            .unwrap_or_else(|| panic!("lost or moved {line:?}:\n{after}"));
        rest = &rest[at + line.len()..];
    }
}

/// `vaultd once` with the test server in PATH (the daemon looks a bare program up there).
fn once(vault: &TestVault, env: &[(&str, &str)]) -> (i32, String) {
    let server = mcp_test_server();
    let path = format!(
        "{}:{}",
        server.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = vault.cmd();
    cmd.env("PATH", path);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.arg("once").output().expect("run vaultd once");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn call(name: &str, parameters: Value) -> Value {
    json!({ "name": name, "parameters": parameters })
}

#[test]
fn add_keeps_the_comments_and_the_daemon_runs_the_added_server() {
    let vault = commented_vault();
    let before = config_text(&vault);
    let out = vaultd(
        &vault,
        &[
            "mcp",
            "add",
            "added",
            "--env",
            "MEMORY_FILE_PATH=/tmp/plain/value.jsonl",
            "--allow",
            "echo",
            "--allow",
            "show_env",
            "--",
            "vaultd-mcp-test-server",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("added [mcp.added]")
            && stdout.contains("command = [\"vaultd-mcp-test-server\"]")
            && stdout.contains("vaultd tools --all"),
        "{stdout}"
    );
    let after = config_text(&vault);
    assert_lines_kept(&before, &after);
    assert_comments_kept(&after);

    // A person gives the tools their effect, then an agent calls them.
    let mut with_policy = after.clone();
    with_policy.push_str(
        "\n[mcp.added.tools.echo]\neffect = \"read_only\"\n[mcp.added.tools.show_env]\neffect = \"read_only\"\n",
    );
    std::fs::write(&vault.config, with_policy).unwrap();
    vault.drop_note(
        "a.md",
        &note_with_calls(
            "Added",
            &[
                call("mcp__added__echo", json!({ "text": "added by mcp add" })),
                call("mcp__added__show_env", json!({})),
            ],
        ),
    );
    let (code, log) = once(&vault, &[]);
    assert_eq!(code, 0, "{log}");
    let note = vault.read("Done", "a.md");
    let r = results_in(&note);
    assert_eq!(
        r[0]["data"]["content"][0]["text"], "added by mcp add",
        "{note}"
    );
    let env = r[1]["data"]["content"][0]["text"].as_str().unwrap();
    assert!(env.split(',').any(|v| v == "MEMORY_FILE_PATH"), "{env}");
}

#[test]
fn add_refuses_a_duplicate_a_bad_table_and_a_literal_credential_and_writes_nothing() {
    let vault = commented_vault();
    let before = config_text(&vault);
    for (args, says) in [
        (
            vec!["mcp", "add", "kept", "--", "x"],
            "an MCP server named `kept` is already configured",
        ),
        (vec!["mcp", "add", "a__b", "--", "x"], "mcp.a__b"),
        (
            vec!["mcp", "add", "web", "--url", "http://example.com/mcp"],
            "loopback",
        ),
        (
            vec![
                "mcp",
                "add",
                "gh",
                "--env",
                "GITHUB_TOKEN=ghp_literal0123456789",
                "--",
                "x",
            ],
            "--env GITHUB_TOKEN=env:GITHUB_TOKEN",
        ),
        (
            vec![
                "mcp",
                "add",
                "docs",
                "--url",
                "https://d.example/mcp",
                "--header",
                "Authorization=Bearer abc",
            ],
            "--header Authorization=env:DOCS_AUTHORIZATION",
        ),
    ] {
        let out = vaultd(&vault, &args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("ghp_literal") && !stdout.contains("ghp_literal"));
        assert_eq!(config_text(&vault), before, "{args:?} changed the config");
    }
    // A url server with a header reference is fine; --dry-run writes nothing.
    let out = vaultd(
        &vault,
        &[
            "mcp",
            "add",
            "docs",
            "--url",
            "https://d.example/mcp",
            "--header",
            "Authorization=env:DOCS_AUTH",
            "--dry-run",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("[mcp.docs]\nurl = \"https://d.example/mcp\"\nheaders = { Authorization = \"env:DOCS_AUTH\" }\nallow = []"),
        "{stdout}"
    );
    assert_eq!(config_text(&vault), before);
}

#[test]
fn import_from_claude_desktop_moves_credentials_out_and_the_server_runs() {
    let vault = commented_vault();
    let before = config_text(&vault);
    let file = fixture("claude_desktop_config.json");
    let out = vaultd(&vault, &["mcp", "import", file.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let config = config_text(&vault);
    assert_comments_kept(&config);
    assert_lines_kept(&before, &config);
    // The token is in neither the config nor the output; a reference and a hint are.
    for secret in ["ghp_FIXTUREtoken", "a8f5f167f44f4964e6c998dee827110c"] {
        assert!(!config.contains(secret), "{config}");
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{stdout}"
        );
    }
    assert!(
        config.contains("GITHUB_PERSONAL_ACCESS_TOKEN = \"env:GITHUB_PERSONAL_ACCESS_TOKEN\"")
            && config.contains("MEMORY_FILE_PATH = \"/tmp/vaultd-import-fixture/memory.jsonl\"")
            && config.contains("OPENWEATHER_API_KEY = \"env:OPENWEATHER_API_KEY\""),
        "{config}"
    );
    assert!(config.contains("[mcp.weather-server]"), "{config}");
    assert!(
        stdout.contains("GITHUB_PERSONAL_ACCESS_TOKEN")
            && stdout.contains("legacy: skipped")
            && stdout.contains("SSE")
            && stdout.contains("npx"),
        "{stdout}"
    );
    // The imported server denies every tool until a person allows them.
    let value: toml::Table = toml::from_str(&config).unwrap();
    assert_eq!(value["mcp"]["memory"]["allow"], toml::Value::Array(vec![]));

    // The person allows a tool and sets the variable; the daemon runs it.
    let config = config.replace("[mcp.memory]\n", "[mcp.memory]\n# allowed by the person\n");
    let config = format!("{config}\n[mcp.memory.tools.show_env]\neffect = \"read_only\"\n")
        .replacen("allow = []\n", "allow = [\"show_env\"]\n", 1);
    std::fs::write(&vault.config, &config).unwrap();
    // weather-server needs npx and a key: switched off for this run.
    let config = config.replace(
        "[mcp.weather-server]\n",
        "[mcp.weather-server]\nenabled = false\n",
    );
    std::fs::write(&vault.config, &config).unwrap();
    vault.drop_note(
        "env.md",
        &note_with_calls("Env", &[call("mcp__memory__show_env", json!({}))]),
    );
    let (code, log) = once(
        &vault,
        &[("GITHUB_PERSONAL_ACCESS_TOKEN", "set-for-vaultd")],
    );
    assert_eq!(code, 0, "{log}");
    let note = vault.read("Done", "env.md");
    let names = results_in(&note)[0]["data"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    for var in ["GITHUB_PERSONAL_ACCESS_TOKEN", "MEMORY_FILE_PATH"] {
        assert!(names.split(',').any(|n| n == var), "{var} not in {names}");
    }
    assert!(
        !log.contains("set-for-vaultd"),
        "the secret is redacted in the log"
    );

    // Importing again skips what is configured, and writes nothing new.
    let before = config_text(&vault);
    let out = vaultd(&vault, &["mcp", "import", file.to_str().unwrap()]);
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    assert!(
        stdout.contains("memory: skipped: [mcp.memory] is already configured"),
        "{stdout}"
    );
    assert_eq!(config_text(&vault), before);
}

#[test]
fn import_reads_claude_code_cursor_and_goose_files() {
    let vault = commented_vault();
    let before = config_text(&vault);
    let dry = |name: &str| {
        let file = fixture(name);
        let out = vaultd(
            &vault,
            &["mcp", "import", file.to_str().unwrap(), "--dry-run"],
        );
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{name}: {stdout}{stderr}");
        assert_eq!(config_text(&vault), before, "--dry-run wrote to the config");
        stdout
    };
    let code = dry("claude-code.mcp.json");
    assert!(
        code.contains("[mcp.echo]")
            && code.contains("API_KEY = \"env:ECHO_API_KEY\"")
            && code.contains("LOG_LEVEL = \"env:LOG_LEVEL\"")
            && code.contains("[mcp.linear]\n")
            && code.contains("url = \"https://mcp.linear.app/mcp\"")
            && code.contains("headers = { Authorization = \"env:LINEAR_AUTHORIZATION\" }")
            && code.contains("--dry-run: nothing written"),
        "{code}"
    );
    let cursor = dry("cursor-mcp.json");
    assert!(
        cursor.contains("headers = { Authorization = \"env:NOTION_AUTHORIZATION\" }")
            && cursor.contains("CLOCK_TOKEN = \"env:CURSOR_CLOCK_TOKEN\"")
            && cursor.contains("TZ = \"UTC\"")
            && !cursor.contains("ntn_FIXTURE"),
        "{cursor}"
    );
    let goose = dry("goose-config.yaml");
    assert!(
        goose.contains("developer: skipped")
            && goose.contains("old: skipped")
            && goose.contains(
                "[mcp.github]\nenabled = false\ncommand = [\"github-mcp-server\", \"stdio\"]"
            )
            && goose
                .contains("GITHUB_PERSONAL_ACCESS_TOKEN = \"env:GITHUB_PERSONAL_ACCESS_TOKEN\"")
            && goose.contains("[mcp.docs]")
            && goose.contains("Authorization = \"env:DOCS_AUTHORIZATION\"")
            && goose.contains("timeout = \"60s\"")
            && !goose.contains("sk-FIXTURE"),
        "{goose}"
    );
    // --only picks servers; a name the file lacks is an error naming the ones it has.
    let file = fixture("claude-code.mcp.json");
    let out = vaultd(
        &vault,
        &["mcp", "import", file.to_str().unwrap(), "--only", "echo"],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("[mcp.echo]") && !stdout.contains("[mcp.linear]"),
        "{stdout}"
    );
    let config = config_text(&vault);
    assert_comments_kept(&config);
    assert!(config.contains("[mcp.echo]") && !config.contains("[mcp.linear]"));
    let out = vaultd(
        &vault,
        &["mcp", "import", file.to_str().unwrap(), "--only", "nope"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).1.contains("it has: echo, linear"),
        "{}",
        text(&out).1
    );
}

#[test]
fn a_malformed_file_is_a_readable_error_and_the_config_is_untouched() {
    let vault = commented_vault();
    let before = config_text(&vault);
    let bad = vault.dir.path().join("claude_desktop_config.json");
    std::fs::write(
        &bad,
        "{\n  \"mcpServers\": {\n    \"x\": { \"command\": \"a\", }\n  }\n}\n",
    )
    .unwrap();
    let out = vaultd(&vault, &["mcp", "import", bad.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!("{}: not valid JSON (line 3", bad.display())),
        "{stderr}"
    );
    let yaml = vault.dir.path().join("config.yaml");
    std::fs::write(&yaml, "extensions:\n  x: [unclosed\n").unwrap();
    let out = vaultd(&vault, &["mcp", "import", yaml.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).1.contains("config.yaml: not valid YAML"),
        "{}",
        text(&out).1
    );
    let missing = vault.dir.path().join("missing.json");
    let out = vaultd(&vault, &["mcp", "import", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("cannot read"), "{}", text(&out).1);
    assert_eq!(config_text(&vault), before);
}

#[test]
fn tools_all_and_status_show_not_allowed_tools_and_a_server_that_never_ran() {
    let vault = commented_vault();
    // `kept` allows echo only; give `fail` a policy so a call fails (and is recorded).
    let config = config_text(&vault).replace(
        "allow = [\"echo\"]   # only echo",
        "allow = [\"echo\", \"fail\", \"gone\"]   # only echo\n[mcp.kept.tools.fail]\napproval = \"never\"",
    );
    std::fs::write(&vault.config, config).unwrap();
    vault.drop_note(
        "f.md",
        &note_with_calls("Fail", &[call("mcp__kept__fail", json!({}))]),
    );
    let (code, log) = once(&vault, &[]);
    assert_eq!(code, 0, "{log}");
    // A server added after that run has never listed its tools.
    let out = vaultd(
        &vault,
        &["mcp", "add", "fresh", "--", "vaultd-mcp-test-server"],
    );
    assert!(out.status.success(), "{}", text(&out).1);

    let out = vaultd(&vault, &["tools", "--all"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("mcp__kept__secret_tool (mcp:kept)\n  not allowed: add \"secret_tool\" to mcp.kept.allow")
            && stdout.contains("Never allowed in the tests")
            && stdout.contains("mcp__fresh__* (mcp:fresh)\n  never listed yet")
            && stdout.contains("mcp__kept__gone (mcp:kept)\n  in mcp.kept.allow, but the server did not offer it"),
        "{stdout}"
    );
    // Without --all the usable list is as before: no not-allowed tool.
    let plain = text(&vaultd(&vault, &["tools"])).0;
    assert!(
        !plain.contains("secret_tool") && !plain.contains("Not usable"),
        "{plain}"
    );
    let json: Vec<Value> =
        serde_json::from_slice(&vaultd(&vault, &["tools", "--all", "--json"]).stdout).unwrap();
    let secret = json
        .iter()
        .find(|t| t["name"] == "mcp__kept__secret_tool")
        .expect("listed with --all --json");
    assert_eq!(secret["usable"], false);
    assert_eq!(secret["reason"], "not_allowed");
    assert!(
        json.iter()
            .any(|t| t["name"] == "mcp__fresh__*" && t["reason"] == "never_listed")
    );

    let status = vault.status_json();
    let servers = status["mcp_servers"].as_array().expect("mcp_servers");
    let kept = servers.iter().find(|s| s["name"] == "kept").unwrap();
    assert_eq!(kept["listed"], true, "{kept}");
    assert_eq!(kept["tools_allowed"], 2, "echo and fail: {kept}");
    assert_eq!(kept["pins"]["accepted"], 2);
    assert!(kept["tools_not_allowed"].as_u64().unwrap() > 5, "{kept}");
    assert_eq!(kept["last_failure"]["tool"], "mcp__kept__fail", "{kept}");
    assert_eq!(kept["last_failure"]["outcome"], "EXECUTION_ERROR");
    // `vaultd once` started it and stopped it on its way out.
    assert_eq!(kept["live"]["state"], "stopped", "{kept}");
    assert_eq!(kept["live"]["restarts"], 0, "{kept}");
    assert!(
        kept["live"]["about"]
            .as_str()
            .unwrap()
            .contains("MCP protocol"),
        "{kept}"
    );
    let fresh = servers.iter().find(|s| s["name"] == "fresh").unwrap();
    assert_eq!(fresh["listed"], false, "{fresh}");
    assert!(fresh["live"].is_null(), "never started: {fresh}");
    assert_eq!(fresh["transport"]["stdio"], "vaultd-mcp-test-server");

    let out = vault.cmd().arg("status").output().unwrap();
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains("MCP servers")
            && stdout.contains("  fresh  stdio vaultd-mcp-test-server\n    never listed yet")
            && stdout.contains("    stopped at ")
            && stdout.contains("last failed call:")
            && stdout.contains("mcp__kept__fail EXECUTION_ERROR"),
        "{stdout}"
    );
}

/// `vaultd mcp login` / `logout` around the edges the conformance suite does not reach (its
/// auth scenarios run the login itself: tests/conformance.rs): which servers can log in,
/// what a missing secret says, and what `status` and `config` show of a login: never a token.
#[test]
fn oauth_login_edges_status_and_logout() {
    let vault = TestVault::new(NO_SEARCH, "");
    vault.write_config(
        NO_SEARCH,
        "[mcp.gh]\nurl = \"http://127.0.0.1:9/mcp\"\noauth = { client_id = \"vaultd-app\", client_secret = \"env:VAULTD_TEST_GH_SECRET\", scopes = [\"repo\"] }\n[mcp.local]\ncommand = [\"vaultd-mcp-test-server\"]\n",
    );
    let run = |args: &[&str]| {
        let out = vault
            .cmd()
            .args(args)
            .env_remove("VAULTD_TEST_GH_SECRET")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, _, err) = run(&["mcp", "login", "local"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("stdio server") && err.contains("only a `url` server"),
        "{err}"
    );
    let (code, _, err) = run(&["mcp", "login", "nope"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("no MCP server `nope`") && err.contains("gh, local"),
        "{err}"
    );
    let (code, _, err) = run(&["mcp", "login", "gh"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("mcp.gh.oauth.client_secret") && err.contains("env:VAULTD_TEST_GH_SECRET"),
        "{err}"
    );

    // A login's tokens, as `vaultd mcp login` keeps them.
    let tokens = vault.state.join("oauth/gh.json");
    std::fs::create_dir_all(tokens.parent().unwrap()).unwrap();
    std::fs::write(
        &tokens,
        json!({
            "url": "http://127.0.0.1:9/mcp",
            "redirect_uri": "http://127.0.0.1:1/callback",
            "credentials": {
                "client_id": "vaultd-app",
                "token_response": {"access_token": "secret-access-1234", "token_type": "bearer",
                    "expires_in": 3600, "refresh_token": "secret-refresh-5678"},
                "granted_scopes": ["repo"],
                "token_received_at": 1_900_000_000u64,
            },
        })
        .to_string(),
    )
    .unwrap();
    let (code, out, err) = run(&["status"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "OAuth: logged in, access token until 2030-03-17T18:46:40Z (refreshed by vaultd)"
        ),
        "{out}"
    );
    let (_, json_out, _) = run(&["status", "--json"]);
    let (_, config_out, _) = run(&["config"]);
    for shown in [&out, &json_out, &config_out] {
        assert!(
            !shown.contains("secret-access") && !shown.contains("secret-refresh"),
            "{shown}"
        );
    }
    assert!(
        config_out.contains("env:VAULTD_TEST_GH_SECRET [redacted]"),
        "{config_out}"
    );

    let (code, out, _) = run(&["mcp", "logout", "gh"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("logged out of gh"), "{out}");
    assert!(!tokens.exists());
    let (_, out, _) = run(&["mcp", "logout", "gh"]);
    assert!(out.contains("gh had no login"), "{out}");
}

#[test]
fn an_oauth_table_is_checked_at_start() {
    let vault = TestVault::new(NO_SEARCH, "");
    for (table, key) in [
        (
            "oauth = { client_secret = \"env:X\" }",
            "mcp.s.oauth.client_secret",
        ),
        (
            "oauth = { client_metadata_url = \"http://x/doc.json\" }",
            "mcp.s.oauth.client_metadata_url",
        ),
        ("oauth = { scope = \"repo\" }", "scope"),
    ] {
        vault.write_config(
            NO_SEARCH,
            &format!("[mcp.s]\nurl = \"http://127.0.0.1:9/mcp\"\n{table}\n"),
        );
        let out = vault.cmd().arg("config").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(key), "{table}: {err}");
    }
    vault.write_config(
        NO_SEARCH,
        "[mcp.s]\ncommand = [\"x\"]\noauth = { client_id = \"a\" }\n",
    );
    let out = vault.cmd().arg("config").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mcp.s.oauth") && err.contains("only a `url` server"),
        "{err}"
    );
}

/// Every bad value of an `[mcp.NAME]` table stops start-up naming the file, the line and the
/// key, as a command tool's does: the key's own line, or its table's where the value is a
/// table or no single key is at fault.
#[test]
fn a_bad_value_in_an_mcp_table_names_its_file_line_and_key() {
    let vault = TestVault::new(NO_SEARCH, "");
    // (the table's body, the key named, the line it is on, what the message says)
    let cases = [
        (
            "url = \"http://example.com/mcp\"",
            "mcp.s.url",
            "url =",
            "loopback",
        ),
        (
            "command = [\"srv\"]\nurl = \"https://a.example/mcp\"",
            "mcp.s",
            "[mcp.s]",
            "not both",
        ),
        (
            "command = [\"\"]",
            "mcp.s.command",
            "command =",
            "names no program",
        ),
        (
            "url = \"http://127.0.0.1:9/mcp\"\ncwd = \"/tmp\"",
            "mcp.s.cwd",
            "cwd =",
            "only a `command` server takes cwd",
        ),
        (
            "command = [\"srv\"]\n[mcp.s.oauth]\nclient_id = \"a\"",
            "mcp.s.oauth",
            "[mcp.s.oauth]",
            "only a `url` server",
        ),
        (
            "command = [\"srv\"]\n[mcp.s.tools.t]\neffect = \"read_only\"",
            "mcp.s.tools.t",
            "[mcp.s.tools.t]",
            "is not in `allow`",
        ),
    ];
    for (table, key, on, says) in cases {
        vault.write_config(NO_SEARCH, &format!("[mcp.s]\n{table}\n"));
        let config = std::fs::read_to_string(&vault.config).unwrap();
        let line = 1 + config.lines().position(|l| l.starts_with(on)).unwrap();
        let out = vault.cmd().arg("config").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{table}: {err}");
        assert!(
            err.contains(&format!(
                "bad config {}, line {line}: key `{key}`: ",
                vault.config.display()
            )) && err.contains(says),
            "{table}: {err}"
        );
    }
}

/// A server that lets anyone connect but wants a login for calls
/// (tests/fixtures/oauth-mcp-server.py), under a running daemon: a call before the login is
/// refused naming `vaultd mcp login`; after a login (its token file, as `vaultd mcp login`
/// writes it) the next call runs, on a session the daemon opened again with the tokens. The
/// session opened before the login kept sending no token until vaultd was restarted.
#[test]
fn a_login_made_while_the_daemon_runs_is_used_by_the_next_call() {
    let vault = TestVault::new(NO_SEARCH, "");
    let port_file = vault.dir.path().join("port");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oauth-mcp-server.py");
    let mut server = std::process::Command::new("python3")
        .arg(&script)
        .args(["--token", "good-token-4821", "--port-file"])
        .arg(&port_file)
        .spawn()
        .expect("start the OAuth fixture server");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let port = loop {
        if let Ok(p) = std::fs::read_to_string(&port_file)
            && !p.is_empty()
        {
            break p;
        }
        if let Ok(Some(status)) = server.try_wait() {
            panic!("the fixture server exited: {status}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the fixture server did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _server = Kill(server);
    let url = format!("http://127.0.0.1:{port}/mcp");
    vault.write_config(
        NO_SEARCH,
        &format!(
            "[mcp.h]\nurl = {url:?}\nallow = [\"hello\"]\n[mcp.h.tools.hello]\neffect = \"read_only\"\n"
        ),
    );
    let daemon = vault.start();
    daemon.wait_for_log("MCP server is up");

    vault.drop_note(
        "before.md",
        &note_with_calls("before", &[call("mcp__h__hello", json!({}))]),
    );
    let text = vault.wait_until_in("Failed", "before.md");
    let r = &results_in(&text)[0];
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("vaultd mcp login h"),
        "{text}"
    );

    // The person logs in: the token file as `vaultd mcp login` keeps it.
    let tokens = vault.state.join("oauth/h.json");
    std::fs::create_dir_all(tokens.parent().unwrap()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    std::fs::write(
        &tokens,
        json!({
            "url": url,
            "redirect_uri": "http://127.0.0.1:1/callback",
            "credentials": {
                "client_id": "vaultd-test",
                "token_response": {"access_token": "good-token-4821", "token_type": "bearer",
                    "expires_in": 3600, "refresh_token": "refresh-4821"},
                "granted_scopes": [],
                "token_received_at": now,
            },
        })
        .to_string(),
    )
    .unwrap();

    vault.drop_note(
        "after.md",
        &note_with_calls("after", &[call("mcp__h__hello", json!({}))]),
    );
    let text = vault.wait_until_in("Done", "after.md");
    let r = &results_in(&text)[0];
    assert_eq!(r["ok"], true, "{text}");
    assert_eq!(
        r["data"]["content"][0]["text"], "hello, logged-in caller",
        "{text}"
    );
    daemon.wait_for_log("a new OAuth login since the session began");
    assert!(
        !daemon.log_text().contains("good-token-4821"),
        "the token reached the log"
    );
}
