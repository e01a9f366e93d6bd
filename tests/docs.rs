//! docs/configuration.md against what vaultd accepts: every documented key is one vaultd
//! takes (its unknown-key error does not name it), and every key `vaultd config` prints is
//! documented. A row left for a key that went, or a key added without its row, fails here.

use crate::util::home::{Home, text};
use std::collections::{BTreeMap, BTreeSet};

/// The name the reference's `NAME` placeholders (`[mcp.NAME]`, `[tools.command.NAME]`) get.
const NAME: &str = "docs_test";

/// (TOML table path, "" for the top level) -> the keys documented in its table's first column.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let mut tables: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Vec<String> = Vec::new();
    let mut in_code = false;
    for line in doc.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if line.starts_with('#') {
            current = if line.contains("Top-level keys") {
                vec![String::new()]
            } else if line.trim_start_matches('#').trim() == "`rate_limit`" {
                vec!["rate_limit".into()]
            } else if line.contains("The `on_hold` table") {
                vec!["notify.on_hold".into()]
            } else {
                // Every `[table]` the heading names (one heading may name several).
                line.split('`')
                    .skip(1)
                    .step_by(2)
                    .filter_map(|t| t.strip_prefix('[')?.strip_suffix(']'))
                    .map(|t| t.replace("NAME", NAME))
                    .collect()
            };
            continue;
        }
        let Some(row) = line.strip_prefix("| `") else {
            continue;
        };
        let key = row.split('`').next().unwrap();
        for table in &current {
            tables
                .entry(table.clone())
                .or_default()
                .insert(key.to_string());
        }
    }
    tables
}

/// The TOML that sets `key` in `table` (a value of any type: an unknown key is reported
/// whatever its value, a known one at most gets a value error), and the dotted path vaultd
/// names an unknown key by.
fn config_setting(table: &str, key: &str) -> (String, String) {
    match table {
        "" => (format!("{key} = 1\n"), key.to_string()),
        // The `rate_limit` inline table, as a built-in tool reads it.
        "rate_limit" => (
            format!("[tools.search_web.rate_limit]\n{key} = 1\n"),
            format!("tools.search_web.rate_limit.{key}"),
        ),
        t => (format!("[{t}]\n{key} = 1\n"), format!("{t}.{key}")),
    }
}

/// Every object key in `v`, at any depth.
fn all_keys(v: &serde_json::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                out.insert(k.clone());
                all_keys(v, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| all_keys(v, out)),
        _ => {}
    }
}

#[test]
fn the_configuration_reference_documents_only_keys_vaultd_accepts() {
    let documented = documented();
    assert!(
        documented.len() >= 15
            && documented.contains_key("")
            && documented.contains_key("folders")
            && documented.contains_key("notify.on_hold"),
        "docs/configuration.md's tables were not found: {documented:?}"
    );
    let h = Home::with_vault();
    // The check works: a key that is not one is reported by its path.
    h.write(".vaultd.toml", &config_setting("folders", "zz_not_a_key").0);
    let out = h.vaultd(&["config"]);
    assert!(
        text(&out.stderr).contains("`folders.zz_not_a_key`"),
        "{}",
        text(&out.stderr)
    );
    let mut wrong = Vec::new();
    for (table, keys) in &documented {
        for key in keys {
            let (toml, path) = config_setting(table, key);
            h.write(".vaultd.toml", &toml);
            let out = h.vaultd(&["config"]);
            let stderr = text(&out.stderr);
            if stderr.contains("unknown keys") && stderr.contains(&format!("`{path}`")) {
                wrong.push(format!("[{table}] `{key}` is documented but not accepted"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_key_vaultd_config_prints_is_documented() {
    let documented: BTreeSet<String> = documented().into_values().flatten().collect();
    let h = Home::with_vault();
    // One of every kind of table, so that each is printed.
    h.write(
        ".vaultd.toml",
        &format!(
            "[tools.send_notification]\nallowed_recipients = [\"me@example.com\"]\n\
             [tools.send_notification.slack.webhooks]\nops = \"env:DOCS_TEST_HOOK\"\n\
             [notify]\non_hold = {{ method = \"email\", recipient = \"me@example.com\" }}\n\
             [mcp.{NAME}]\ncommand = [\"true\"]\nallow = [\"*\"]\n\
             [mcp.{NAME}.tools.some_tool]\ntimeout = \"5s\"\n\
             [mcp.{NAME}_url]\nurl = \"http://127.0.0.1:9/mcp\"\noauth = {{ client_id = \"a\" }}\n"
        ),
    );
    let out = h.vaultd(&["config"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut keys = BTreeSet::new();
    all_keys(&printed, &mut keys);
    // Names the user chose, and `source` (where the file was found, not a key of it).
    for chosen in [NAME, &format!("{NAME}_url"), "some_tool", "ops", "source"] {
        keys.remove(chosen);
    }
    let undocumented: Vec<_> = keys.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "keys `vaultd config` prints that docs/configuration.md does not document: {undocumented:?}"
    );
}
