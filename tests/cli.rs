//! The command line as a new user meets it (docs/design.md §13): the vault found from the current
//! folder, NOTE arguments, `init` then `once`, quiet closed pipes, error wording, `check`'s
//! decisions, progress, completions, help, `mv` of several notes, the README's quick start.

use crate::util::home::{Home, email_note, text};
use crate::util::{bin, count_notes, property, results_in, wait_for_progress};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// 1. The vault from the current folder; NOTE arguments.

#[test]
fn every_command_finds_the_vault_by_walking_up_from_the_current_folder() {
    let h = Home::with_vault();
    let deep = h.path("Done/projects/2026");
    std::fs::create_dir_all(&deep).unwrap();
    let out = h.vaultd_in(&deep, &["status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("vault  {}", h.vault.display())),
        "{}",
        text(&out.stdout)
    );
    // `once` from inside the vault runs the Welcome note, with no --vault.
    let out = h.vaultd_in(&deep, &["once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(h.path("Done/Welcome.md").is_file());
    // A vault that holds only Needs_Action/ (no .vaultd.toml) is found too.
    let bare = h.home.join("Bare");
    std::fs::create_dir_all(bare.join("Needs_Action/sub")).unwrap();
    let out = h.vaultd_in(&bare.join("Needs_Action/sub"), &["config"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let config: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(config["vault"], bare.display().to_string());
}

#[test]
fn outside_any_vault_the_error_says_what_to_do() {
    let h = Home::empty();
    let out = h.vaultd_in(&h.home, &["status"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("no vault found"), "{err}");
    assert!(err.contains("vaultd init"), "{err}");
    assert!(!err.contains("looked for no config"), "{err}");
}

#[test]
fn note_arguments_are_paths_from_here_or_the_vault_root_or_a_bare_name() {
    let h = Home::with_vault();
    h.write("Needs_Action/report.md", &email_note("boss@example.net"));
    let out = h.vaultd(&["once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(h.path("Pending_Approval/report.md").is_file());

    // A path from the vault root, run from another folder of the vault.
    let done = h.path("Done");
    let out = h.vaultd_in(&done, &["check", "Pending_Approval/report.md"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // A path from the current folder.
    let out = h.vaultd_in(&h.path("Pending_Approval"), &["check", "report.md"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // A bare name, as the README writes it, from anywhere in the vault.
    let out = h.vaultd_in(&done, &["approve", "report"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("approved"),
        "{}",
        text(&out.stdout)
    );
    assert!(h.path("Approved/report.md").is_file());
}

#[test]
fn a_bare_name_matching_two_held_notes_names_both_and_does_nothing() {
    let h = Home::with_vault();
    h.write("Needs_Action/a/x.md", &email_note("one@example.net"));
    h.write("Needs_Action/b/x.md", &email_note("two@example.net"));
    let out = h.vaultd(&["once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let before_a = h.read("Pending_Approval/a/x.md");
    let out = h.vaultd(&["approve", "x.md"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("Pending_Approval/a/x.md") && err.contains("Pending_Approval/b/x.md"),
        "{err}"
    );
    assert!(err.contains("nothing was done"), "{err}");
    assert_eq!(h.read("Pending_Approval/a/x.md"), before_a);
    assert!(h.path("Pending_Approval/b/x.md").is_file());
    assert!(!h.path("Approved").read_dir().unwrap().any(|_| true));
}

// ---------------------------------------------------------------------------------------------
// 2. `vaultd init`: the comments show what runs.

#[test]
fn init_then_once_ends_the_welcome_note_in_done_with_its_email_in_the_outbox() {
    let h = Home::with_vault();
    let out = h.vaultd(&["once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let note = h.read("Done/Welcome.md");
    assert_eq!(property(&note, "tool_status").as_deref(), Some("done"));
    let r = &results_in(&note)[0];
    assert_eq!(r["ok"], true, "{note}");
    assert_eq!(h.outbox().len(), 1);
}

#[test]
fn every_commented_value_of_the_init_config_is_the_value_that_runs() {
    let h = Home::with_vault();
    let written = h.read(".vaultd.toml");
    // Uncomment every `# key = value` line except the marked examples.
    let mut uncommented = String::new();
    let mut n = 0;
    for line in written.lines() {
        let candidate = line.strip_prefix("# ").filter(|rest| {
            let key = rest.split(" = ").next().unwrap_or("");
            rest.contains(" = ")
                && !key.is_empty()
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !rest.ends_with("# example")
                && !rest.contains("# example (")
        });
        match candidate {
            Some(rest) => {
                n += 1;
                uncommented.push_str(rest);
            }
            None => uncommented.push_str(line),
        }
        uncommented.push('\n');
    }
    assert!(n >= 20, "only {n} commented values found:\n{written}");
    let other = h.home.join("uncommented.toml");
    std::fs::write(&other, &uncommented).unwrap();
    let effective = |args: &[&str]| {
        let out = h.vaultd(args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_object_mut().unwrap().remove("source");
        v
    };
    assert_eq!(
        effective(&["config"]),
        effective(&["config", "--config", other.to_str().unwrap()]),
        "uncommented:\n{uncommented}"
    );
}

#[test]
fn the_init_configs_header_names_every_key_it_sets() {
    let h = Home::with_vault();
    let written = h.read(".vaultd.toml");
    let header: Vec<&str> = written
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim())
        .collect();
    let header = header.join(" ");
    // Every uncommented `key = value` line, with its table.
    let mut table = String::new();
    let mut set = Vec::new();
    for line in written.lines() {
        if let Some(name) = line.strip_prefix('[') {
            table = name.trim_end_matches(']').to_string();
        } else if !line.starts_with('#')
            && let Some((key, _)) = line.split_once(" = ")
        {
            set.push((table.clone(), key.trim().to_string()));
        }
    }
    let count = [
        "No keys are",
        "One key is",
        "Two keys are",
        "Three keys are",
    ][set.len()];
    assert!(
        header.contains(&format!("{count} set")),
        "{set:?} are set; the header: {header}"
    );
    for (table, key) in &set {
        assert!(
            header.contains(&format!("`{key}` under [{table}]")),
            "the header does not name `{key}` under [{table}]: {header}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Output into a closed pipe.

/// Runs `vaultd ARGS` with stdout a pipe whose reading end is already closed.
fn into_closed_pipe(h: &Home, args: &[&str]) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = h
        .command_in(&h.vault)
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (out.status, text(&out.stderr))
}

#[test]
fn output_into_a_closed_pipe_ends_quietly_for_every_command() {
    use std::os::unix::process::ExitStatusExt;
    let h = Home::with_vault();
    h.write("Needs_Action/report.md", &email_note("boss@example.net"));
    assert!(h.vaultd(&["once"]).status.success());
    for args in [
        &["tools"][..],
        &["tools", "--json"],
        &["tools", "--format", "openai"],
        &["status"],
        &["status", "--json"],
        &["log"],
        &["log", "--json"],
        &["config"],
        &["check", "Pending_Approval/report.md"],
        &["check", "--json", "Pending_Approval/report.md"],
        &["completions", "bash"],
        &["init", "."],
        &["once"],
        &["--help"],
    ] {
        let (status, err) = into_closed_pipe(&h, args);
        let quiet = status.success() || status.signal() == Some(libc_sigpipe());
        assert!(quiet, "vaultd {args:?}: {status:?}\n{err}");
        assert!(!err.contains("panicked"), "vaultd {args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "vaultd {args:?}: {err}");
    }
}

fn libc_sigpipe() -> i32 {
    13
}

// ---------------------------------------------------------------------------------------------
// 4. Error wording; one validation for every command.

#[test]
fn every_unknown_key_is_reported_at_once_with_file_and_line() {
    let h = Home::with_vault();
    let cfg = h.home.join("typos.toml");
    std::fs::write(
        &cfg,
        "workerz = 3\n\n[tools.search_web]\nprovidr = \"brave\"\nrate_limit = { per_hourr = 2 }\n",
    )
    .unwrap();
    for cmd in ["run", "once", "config", "status", "log", "tools"] {
        let out = h.vaultd(&[cmd, "--config", cfg.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        let err = text(&out.stderr);
        let file = cfg.display().to_string();
        for (line, key) in [
            (1, "workerz"),
            (4, "tools.search_web.providr"),
            (5, "tools.search_web.rate_limit.per_hourr"),
        ] {
            assert!(
                err.contains(&format!("{file}:{line}:")) && err.contains(key),
                "{cmd}: {key} at line {line}: {err}"
            );
        }
    }
}

#[test]
fn the_old_approval_via_spelling_still_works_with_a_warning_naming_file_and_line() {
    let h = Home::with_vault();
    let cfg = h.home.join("old.toml");
    std::fs::write(
        &cfg,
        "[tools.send_notification]\napproval_via = \"cli\"\nallowed_recipients = [\"me@example.com\"]\n",
    )
    .unwrap();
    let config = cfg.to_str().unwrap();
    let out = h.vaultd(&["once", "--config", config]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{}:2: ", cfg.display())) && err.contains("approval_via = \"cli\""),
        "{err}"
    );
    let out = h.vaultd(&["config", "--config", config]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let effective: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(effective["approval_via"], "cli");
    // Both spellings, saying different things: refused at start, naming the line.
    std::fs::write(
        &cfg,
        "approval_via = \"folder\"\n[tools.send_notification]\napproval_via = \"cli\"\n",
    )
    .unwrap();
    let out = h.vaultd(&["once", "--config", config]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("line 3") && err.contains("contradicts"),
        "{err}"
    );
}

#[test]
fn a_vault_that_does_not_exist_is_no_such_vault() {
    let h = Home::empty();
    let out = h.vaultd_in(&h.home, &["run", "--vault", "/nonexistent/vault"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("no such vault: /nonexistent/vault"), "{err}");
    assert!(!err.contains("<defaults>"), "{err}");
}

#[test]
fn a_secret_error_says_its_message_once() {
    let h = Home::with_vault();
    let cfg = h.home.join("secret.toml");
    std::fs::write(
        &cfg,
        "[tools.send_notification.email]\ntransport = \"smtp\"\nsmtp_url = \"smtps://smtp.example.com\"\nusername = \"agent\"\npassword = \"file:/nonexistent/vaultd-password\"\n",
    )
    .unwrap();
    let out = h.vaultd(&["once", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    assert_eq!(
        err.matches("/nonexistent/vaultd-password").count(),
        1,
        "{err}"
    );
}

#[test]
fn config_refuses_a_plain_http_webhook_as_once_does() {
    let h = Home::with_vault();
    let cfg = h.home.join("hook.toml");
    std::fs::write(
        &cfg,
        "[tools.send_notification.slack.webhooks]\nops = \"env:VAULTD_TEST_HOOK\"\n",
    )
    .unwrap();
    let run = |cmd: &str| {
        h.command_in(&h.vault)
            .args([cmd, "--config", cfg.to_str().unwrap()])
            .env(
                "VAULTD_TEST_HOOK",
                "http://hooks.example.com/services/T0/B0/secret",
            )
            .output()
            .unwrap()
    };
    for cmd in ["once", "config"] {
        let out = run(cmd);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {}", text(&out.stdout));
        let err = text(&out.stderr);
        assert!(err.contains("must be an https:// URL"), "{cmd}: {err}");
        assert!(!err.contains("secret"), "{cmd}: the URL leaked: {err}");
    }
}

// ---------------------------------------------------------------------------------------------
// 5. INVALID_JSON in the note as written; titles; the pointer of the parameters object.

#[test]
fn invalid_json_names_the_line_of_the_note_as_written_and_says_so_in_the_title() {
    let h = Home::with_vault();
    let text_in =
        "# Broken\n\nSome text.\n\n```json\n{\"tool_call\": {\"name\": \"search_web\",}}\n```\n";
    h.write("Needs_Action/broken.md", text_in);
    assert!(h.vaultd(&["once"]).status.success());
    let note = h.read("Failed/broken.md");
    let r = &results_in(&note)[0];
    assert_eq!(r["error"]["code"], "INVALID_JSON");
    let line = r["error"]["details"]["line"].as_u64().unwrap() as usize;
    let column = r["error"]["details"]["column"].as_u64().unwrap() as usize;
    let at = note.lines().nth(line - 1).unwrap();
    assert_eq!(
        at, "{\"tool_call\": {\"name\": \"search_web\",}}",
        "line {line} of\n{note}"
    );
    assert!(
        note.contains(&format!(
            "> [!failure]- broken call · INVALID_JSON at {line}:{column}\n"
        )),
        "{note}"
    );
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("line {line}, column {column}")),
        "{r}"
    );
}

#[test]
fn a_missing_required_parameter_points_at_the_parameters_object() {
    let h = Home::with_vault();
    h.write(
        "Needs_Action/p.md",
        "```json\n{\"tool_call\": {\"name\": \"search_web\", \"parameters\": {}}}\n```\n",
    );
    assert!(h.vaultd(&["once"]).status.success());
    let r = &results_in(&h.read("Failed/p.md"))[0];
    assert_eq!(r["error"]["code"], "INVALID_PARAMS");
    let v = &r["error"]["details"]["violations"][0];
    assert_eq!(v["pointer"], "", "{r}");
    assert!(v["message"].as_str().unwrap().contains("query"), "{r}");
}

// ---------------------------------------------------------------------------------------------
// 6. `check` shows the decision.

#[test]
fn check_shows_whether_each_call_runs_is_held_or_is_denied_and_why() {
    let h = Home::with_vault();
    let note = format!(
        "{}\n{}\n```json\n{{\"tool_call\": {{\"name\": \"send_notification\", \"parameters\": {{\"recipient\": \"nobody\", \"subject\": \"s\", \"body\": \"b\", \"method\": \"slack\"}}}}}}\n```\n",
        email_note("me@example.com"),
        email_note("boss@example.net").replace("Report", "Other"),
    );
    h.write("Needs_Action/mixed.md", &note);
    let out = h.vaultd(&["check", "mixed.md"]);
    assert_eq!(out.status.code(), Some(1), "the slack call is denied");
    let shown = text(&out.stdout);
    assert!(shown.contains("-> runs"), "{shown}");
    assert!(
        shown.contains(
            "-> held for approval: recipient boss@example.net is not in allowed_recipients"
        ),
        "{shown}"
    );
    assert!(shown.contains("-> denied: "), "{shown}");

    let out = h.vaultd(&["check", "--json", "mixed.md"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let decisions: Vec<&str> = v["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["decision"]["action"].as_str().unwrap())
        .collect();
    assert_eq!(decisions, ["run", "held", "denied"]);
    assert!(
        v["calls"][1]["decision"]["reason"]
            .as_str()
            .unwrap()
            .contains("allowed_recipients")
    );
    assert_eq!(v["calls"][1]["status"], "pending");
    assert_eq!(v["calls"][2]["status"], "invalid");
    // Nothing ran: check only looks.
    assert!(h.path("Needs_Action/mixed.md").is_file());
    assert!(h.outbox().is_empty());
}

// ---------------------------------------------------------------------------------------------
// 7. The start-up count; held calls in the frontmatter.

#[test]
fn the_start_up_count_leaves_out_notes_without_calls() {
    let h = Home::with_vault();
    h.write("Needs_Action/draft.md", "# A draft, no call yet\n");
    h.write(
        "Needs_Action/idea.md",
        "# Another\n\n```json\n{\"not\": \"a call\"}\n```\n",
    );
    let out = h.vaultd(&["once"]);
    let err = text(&out.stderr);
    assert!(
        err.contains("queued=1"),
        "only Welcome.md holds a call: {err}"
    );
    assert!(h.path("Needs_Action/draft.md").is_file());
}

#[test]
fn a_held_note_counts_its_held_calls_in_tool_held() {
    let h = Home::with_vault();
    let note = format!(
        "{}{}",
        email_note("boss@example.net"),
        email_note("me@example.com").replace("Report", "Mine")
    );
    h.write("Needs_Action/held.md", &note);
    let out = h.vaultd(&["once"]);
    assert!(out.status.success());
    // The log says how to approve (§13: every refusal says what to do next).
    let log = text(&out.stderr);
    assert!(
        log.contains("note held for approval: ")
            && log.contains("To send it, move this note to `Approved/`"),
        "{log}"
    );
    let text = h.read("Pending_Approval/held.md");
    assert_eq!(property(&text, "tool_held").as_deref(), Some("1"), "{text}");
    assert_eq!(
        property(&text, "tool_calls").as_deref(),
        Some("1"),
        "{text}"
    );
    // Approved and sent: nothing is held any more.
    assert!(h.vaultd(&["approve", "held"]).status.success());
    assert!(h.vaultd(&["once"]).status.success());
    let text = h.read("Done/held.md");
    assert_eq!(property(&text, "tool_held").as_deref(), Some("0"), "{text}");
    assert_eq!(
        property(&text, "tool_calls").as_deref(),
        Some("2"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// 9. Progress, completions, help.

fn broken_notes(h: &Home, n: usize) {
    for i in 0..n {
        h.write(
            &format!("Needs_Action/n{i}.md"),
            &format!("```json\n{{\"tool_call\": {{\"name\": \"no_such_tool_{i}\"}}}}\n```\n"),
        );
    }
}

#[test]
fn once_draws_a_progress_bar_on_a_terminal_and_plain_lines_otherwise() {
    let h = Home::with_vault();
    broken_notes(&h, 30);
    // Under a pseudo-terminal (script(1)).
    let cmd = format!("{} once", bin().display());
    let tty = Command::new("script")
        .current_dir(&h.vault)
        .env("HOME", &h.home)
        .env_remove("VAULTD_CONFIG")
        .env_remove("JOURNAL_STREAM")
        .env("TERM", "xterm")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("script(1) from util-linux");
    assert!(tty.status.success(), "{}", text(&tty.stderr));
    let shown = text(&tty.stdout);
    assert!(shown.contains("31/31 notes"), "a finished bar: {shown}");
    assert!(shown.contains("start-up backlog done"), "{shown}");

    // Not a terminal: log lines only.
    broken_notes(&h, 30);
    let out = h.vaultd(&["once"]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("/30 notes"), "no bar in a log: {err}");
    assert!(err.contains("queued=30"), "{err}");
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    let h = Home::empty();
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef vaultd"),
        ("fish", "complete -c vaultd"),
    ] {
        let out = h.vaultd_in(&h.home, &["completions", shell]);
        assert!(out.status.success(), "{shell}");
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(script.contains("approve"), "{shell}");
    }
}

#[test]
fn help_lists_the_commands_in_the_order_of_the_loop_with_an_example_each() {
    let h = Home::empty();
    let out = h.vaultd_in(&h.home, &["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    let order = [
        "init",
        "run",
        "once",
        "check",
        "tools",
        "status",
        "approve",
        "reject",
        "log",
        "config",
        "completions",
    ];
    let (commands, examples) = help.split_once("Examples").expect("an Examples section");
    let listed: Vec<&str> = commands
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| order.contains(w))
        .collect();
    assert_eq!(listed, order, "{help}");
    for (line, cmd) in commands
        .lines()
        .filter(|l| {
            order
                .iter()
                .any(|c| l.trim_start().starts_with(&format!("{c} ")))
        })
        .zip(order)
    {
        assert!(
            line.len() > cmd.len() + 10,
            "a one-line description: {line}"
        );
    }
    let mut at = 0;
    for cmd in order {
        let found = examples[at..]
            .find(&format!("vaultd {cmd}"))
            .unwrap_or_else(|| panic!("no example of {cmd} (in order): {examples}"));
        at += found;
    }
}

// ---------------------------------------------------------------------------------------------
// 10. `mv a.md b.md Needs_Action/`.

#[test]
fn mv_of_several_notes_into_needs_action_always_succeeds() {
    let h = Home::with_vault();
    let state = h.home.join("state");
    let log = h.home.join("daemon.log");
    let daemon = crate::util::RunningDaemon::start(
        {
            let mut c = h.command_in(&h.vault);
            c.args(["--state-dir", state.to_str().unwrap()]);
            c
        },
        log,
    );
    let staging = h.home.join("staging");
    std::fs::create_dir_all(&staging).unwrap();
    let rounds = 25;
    const NOTES_PER_MV: usize = 8;
    for round in 0..rounds {
        let mut args = Vec::new();
        for k in 0..NOTES_PER_MV {
            let p = staging.join(format!("r{round}-{k}.md"));
            written_long_ago(
                &p,
                &format!("```json\n{{\"tool_call\": {{\"name\": \"nope_{round}_{k}\"}}}}\n```\n"),
            );
            args.push(p);
        }
        let out = Command::new("mv")
            .args(&args)
            .arg(h.path("Needs_Action/"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "round {round}: mv failed: {}",
            text(&out.stderr)
        );
    }
    // What makes it fail: for every note but the last, GNU mv stats the destination right
    // after its rename ("cannot stat" when it is gone). The same, as mv does it when the
    // scheduler pauses it for 25 ms in between (as on a busy machine).
    for k in 0..20 {
        let from = staging.join(format!("paused-{k}.md"));
        written_long_ago(
            &from,
            &format!("```json\n{{\"tool_call\": {{\"name\": \"nope_paused_{k}\"}}}}\n```\n"),
        );
        let to = h.path(&format!("Needs_Action/paused-{k}.md"));
        std::fs::rename(&from, &to).unwrap();
        std::thread::sleep(Duration::from_millis(25));
        assert!(
            std::fs::symlink_metadata(&to).is_ok(),
            "note {k} was claimed before mv could look at it"
        );
    }
    let settled = rounds * NOTES_PER_MV + 20;
    wait_for_progress(
        "notes in Failed/",
        settled,
        || count_notes(&h.path("Failed")),
        || format!("Needs_Action/: {}", count_notes(&h.path("Needs_Action"))),
    );
    drop(daemon);
}

/// A note as a person moves it: written some time ago (a fresh one is read only once quiet).
fn written_long_ago(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// 11. The template unit.

#[test]
fn the_template_unit_runs_one_vault_per_instance_and_verifies() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/vaultd@.service"),
    )
    .unwrap();
    assert!(unit.contains("ExecStart=%h/.cargo/bin/vaultd run --vault %f\n"));
    assert!(unit.contains("ReadWritePaths=%f\n"));
    assert!(
        unit.contains("StateDirectory=vaultd/%i\n"),
        "one journal per vault"
    );
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("systemd-analyze missing: scripts/test installs it; verify skipped here");
        return;
    }
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/verify-units"))
        .output()
        .unwrap();
    let shown = text(&out.stdout);
    assert!(
        shown.contains("ok   verify --user systemd/vaultd@.service as vaultd@srv-notes.service"),
        "{shown}{}",
        text(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// 12. Commands that run no tool; --since; control characters.

#[test]
fn status_and_log_work_while_a_secrets_variable_is_unset() {
    let h = Home::with_vault();
    let cfg = h.home.join("secrets.toml");
    std::fs::write(
        &cfg,
        "[tools.search_web]\nprovider = \"brave\"\napi_key = \"env:VAULTD_TEST_UNSET_KEY\"\n[tools.send_notification.slack.webhooks]\nops = \"env:VAULTD_TEST_UNSET_HOOK\"\n",
    )
    .unwrap();
    for cmd in ["status", "log"] {
        let out = h
            .command_in(&h.vault)
            .args([cmd, "--config", cfg.to_str().unwrap()])
            .env_remove("VAULTD_TEST_UNSET_KEY")
            .env_remove("VAULTD_TEST_UNSET_HOOK")
            .output()
            .unwrap();
        assert!(out.status.success(), "{cmd}: {}", text(&out.stderr));
    }
    // A command that runs tools still needs them.
    let out = h.vaultd(&["once", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("VAULTD_TEST_UNSET_KEY"));
}

#[test]
fn status_and_log_work_while_a_command_tool_or_mcp_servers_secret_is_unset() {
    let h = Home::with_vault();
    let command = h.config_file(
        "command.toml",
        "[tools.command.greet]\ndescription = \"Says hello.\"\nargv = [\"true\"]\n\
         env = { TOKEN = \"env:VAULTD_TEST_UNSET_COMMAND\" }\n",
    );
    let mcp = h.config_file(
        "mcp.toml",
        "[mcp.stdio]\ncommand = [\"true\"]\nenv = { API_KEY = \"env:VAULTD_TEST_UNSET_STDIO\" }\n\
         [mcp.web]\nurl = \"https://mcp.example.com/mcp\"\n\
         headers = { Authorization = \"env:VAULTD_TEST_UNSET_HEADER\" }\n",
    );
    let unset = [
        "VAULTD_TEST_UNSET_COMMAND",
        "VAULTD_TEST_UNSET_STDIO",
        "VAULTD_TEST_UNSET_HEADER",
    ];
    for (cfg, key, refs) in [
        (
            command.as_str(),
            "tools.command.greet.env.TOKEN",
            &unset[..1],
        ),
        (mcp.as_str(), "mcp.stdio.env.API_KEY", &unset[1..]),
    ] {
        for cmd in ["status", "log"] {
            let mut c = h.command_in(&h.vault);
            c.args([cmd, "--config", cfg]);
            for var in unset {
                c.env_remove(var);
            }
            let out = c.output().unwrap();
            let err = text(&out.stderr);
            assert!(out.status.success(), "{cmd} with {cfg}: {err}");
            for r in refs {
                assert!(
                    err.contains(&format!("env:{r}")),
                    "{cmd} warns of {r}: {err}"
                );
            }
        }
        // The commands that run tools still stop at start, naming the key.
        for cmd in ["once", "run"] {
            let out = h.vaultd(&[cmd, "--config", cfg]);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd} with {cfg}: {err}");
            assert!(err.contains(key) && err.contains(refs[0]), "{cmd}: {err}");
        }
    }
}

#[test]
fn log_since_further_back_than_the_clock_shows_everything() {
    let h = Home::with_vault();
    assert!(h.vaultd(&["once"]).status.success());
    let out = h.vaultd(&["log", "--since", "9999999999999999999s"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("Welcome.md"));
}

#[test]
fn control_characters_in_note_names_are_escaped_in_every_printed_path() {
    let h = Home::with_vault();
    let forged = "x\n2026-01-01T00:00:00Z  INFO forged line\u{1b}[2J.md";
    h.write(
        &format!("Needs_Action/{forged}"),
        "```json\n{\"tool_call\": {\"name\": \"no_such_tool\"}}\n```\n",
    );
    let out = h.vaultd(&["once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(!err.lines().any(|l| l.starts_with("2026-01-01")), "{err}");
    assert!(err.contains("x\\n2026-01-01"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err}");
    let out = h.vaultd(&["log"]);
    let shown = text(&out.stdout);
    assert!(
        !shown.lines().any(|l| l.starts_with("2026-01-01")),
        "{shown}"
    );
    assert!(shown.contains("x\\n2026-01-01"), "{shown}");
    assert!(!shown.contains('\u{1b}'), "{shown}");
    let out = h.vaultd(&["status"]);
    assert!(!text(&out.stdout).contains('\u{1b}'));
    let out = h.vaultd(&["check", &format!("Failed/{forged}")]);
    let shown = text(&out.stdout);
    assert!(shown.contains("x\\n2026-01-01"), "{shown}");
    assert!(
        !shown.lines().any(|l| l.starts_with("2026-01-01")),
        "{shown}"
    );
}

// ---------------------------------------------------------------------------------------------
// The README's quick start, copied here: the test fails when either changes alone.

const QUICK_START: &str = r#"vaultd init ~/Notes                 # folders, ~/Notes/.vaultd.toml, Needs_Action/Welcome.md
cd ~/Notes                          # inside the vault no command needs --vault
vaultd once                         # runs the Welcome note's call: it ends in Done/
printf '```json\n{"tool_call": {"name": "send_notification", "parameters": {"recipient": "boss@example.net", "subject": "Report", "body": "Done."}}}\n```\n' > Needs_Action/report.md
vaultd check report.md              # -> held for approval: recipient boss@example.net is not in allowed_recipients
vaultd once                         # the note waits in Pending_Approval/
vaultd approve report.md            # approve exactly what the question shows
vaultd once                         # sent (an .eml in ~/.local/state/vaultd/<vault id>/outbox); the note ends in Done/
vaultd status                       # notes per state, failures, rate limits
vaultd log --since 1h               # what happened"#;

#[test]
fn the_readme_quick_start_runs_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    assert!(
        readme.contains(QUICK_START),
        "README.md's quick start differs from this test's copy"
    );
    let h = Home::empty();
    let bin_dir = bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = h
        .command_in(&h.home)
        .env("PATH", path)
        .env("RUST_LOG", "warn")
        .env_remove("VAULTD_CONFIG")
        .arg0_is_shell(QUICK_START)
        .output()
        .unwrap();
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}\n{}", text(&out.stderr));
    assert!(
        shown.contains(
            "-> held for approval: recipient boss@example.net is not in allowed_recipients"
        ),
        "{shown}"
    );
    assert!(shown.contains("approved"), "{shown}");
    assert!(h.path("Done/Welcome.md").is_file());
    assert!(h.path("Done/report.md").is_file());
    assert_eq!(h.outbox().len(), 2);
    assert!(
        shown.contains("Done/report.md"),
        "the log shows the move: {shown}"
    );
}

/// Turns a `vaultd` command into `bash -euo pipefail -c SCRIPT` with the same environment.
trait Shell {
    fn arg0_is_shell(&mut self, script: &str) -> Command;
}

impl Shell for Command {
    fn arg0_is_shell(&mut self, script: &str) -> Command {
        let mut c = Command::new("bash");
        c.args(["-euo", "pipefail", "-c", script]);
        for (k, v) in self.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(dir) = self.get_current_dir() {
            c.current_dir(dir);
        }
        c.stdin(Stdio::null());
        c
    }
}
