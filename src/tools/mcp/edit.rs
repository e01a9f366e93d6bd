//! Writes `[mcp.NAME]` tables into the text of a config file with its comments and layout
//! kept (`toml_edit`): the one writer behind `vaultd mcp add` and `vaultd mcp import`
//! (docs/design.md §10.4, "Coming from another client"). Pure: text in, text out; reading,
//! validating and writing the file is the command's job.

use std::collections::{BTreeMap, BTreeSet};
use toml_edit::{Array, DocumentMut, InlineTable, Item, Table, Value};

/// One server as it will be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewServer {
    pub name: String,
    pub transport: NewTransport,
    /// Tool names that may be called; empty denies every tool (the product rule).
    pub allow: Vec<String>,
    /// `enabled = false` is written only for a server its old client had switched off.
    pub enabled: bool,
    /// `timeout` as written (`"300s"`), when the old client set one.
    pub timeout: Option<String>,
    /// Comment lines written above the table: where it came from, what is left to do.
    pub comments: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NewTransport {
    Stdio {
        /// The program and its arguments.
        command: Vec<String>,
        /// Plain values or secret references, as `[mcp.NAME] env` takes them.
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    Http {
        url: String,
        /// Header name -> secret reference.
        headers: BTreeMap<String, String>,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EditError {
    #[error("the config is not valid TOML: {0}")]
    Parse(String),
    #[error(
        "an MCP server named `{0}` is already configured ([mcp.{0}]); choose another name or edit that table"
    )]
    Exists(String),
    #[error(
        "`mcp` in the config is not a table of servers ([mcp.NAME] tables); add the server by hand"
    )]
    NotATable,
}

/// The names of the `[mcp.NAME]` tables in `text` (enabled or not).
pub fn configured_servers(text: &str) -> Result<BTreeSet<String>, EditError> {
    let doc = parse(text)?;
    Ok(match doc.get("mcp").and_then(Item::as_table_like) {
        Some(t) => t.iter().map(|(k, _)| k.to_string()).collect(),
        None => BTreeSet::new(),
    })
}

/// `text` with one `[mcp.NAME]` table per server added after the existing ones; every other
/// byte of `text` is kept. Refuses a name already present.
pub fn add_servers(text: &str, servers: &[NewServer]) -> Result<String, EditError> {
    let mut doc = parse(text)?;
    let mcp = doc
        .entry("mcp")
        .or_insert_with(|| {
            let mut t = Table::new();
            // `[mcp]` itself is never written: only its `[mcp.NAME]` tables.
            t.set_implicit(true);
            Item::Table(t)
        })
        .as_table_mut()
        .ok_or(EditError::NotATable)?;
    for s in servers {
        if mcp.contains_key(&s.name) {
            return Err(EditError::Exists(s.name.clone()));
        }
        mcp.insert(&s.name, Item::Table(table_of(s)));
    }
    let mut out = doc.to_string();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// The TOML that [`add_servers`] adds for `servers`, alone (what `--dry-run` prints).
pub fn render(servers: &[NewServer]) -> Result<String, EditError> {
    Ok(add_servers("", servers)?.trim_start().to_string())
}

fn parse(text: &str) -> Result<DocumentMut, EditError> {
    text.parse::<DocumentMut>()
        .map_err(|e| EditError::Parse(e.to_string()))
}

fn table_of(s: &NewServer) -> Table {
    let mut t = Table::new();
    let mut prefix = String::from("\n");
    for line in &s.comments {
        // One comment line per line of text: a newline in a name from a foreign file must
        // not end the comment and start a key.
        // Other control characters are not allowed in a TOML comment at all.
        for part in line.lines() {
            let part: String = part
                .chars()
                .map(|c| if c.is_control() && c != '\t' { '?' } else { c })
                .collect();
            prefix.push_str(&format!("# {part}\n"));
        }
    }
    t.decor_mut().set_prefix(prefix);
    if !s.enabled {
        t.insert("enabled", toml_edit::value(false));
    }
    match &s.transport {
        NewTransport::Stdio { command, env, cwd } => {
            t.insert("command", toml_edit::value(strings(command)));
            if !env.is_empty() {
                t.insert("env", toml_edit::value(inline(env)));
            }
            if let Some(cwd) = cwd {
                t.insert("cwd", toml_edit::value(cwd.as_str()));
            }
        }
        NewTransport::Http { url, headers } => {
            t.insert("url", toml_edit::value(url.as_str()));
            if !headers.is_empty() {
                t.insert("headers", toml_edit::value(inline(headers)));
            }
        }
    }
    t.insert("allow", toml_edit::value(strings(&s.allow)));
    if let Some(timeout) = &s.timeout {
        t.insert("timeout", toml_edit::value(timeout.as_str()));
    }
    t
}

fn strings(items: &[String]) -> Array {
    let mut a = Array::new();
    for i in items {
        a.push(i.as_str());
    }
    a
}

fn inline(pairs: &BTreeMap<String, String>) -> InlineTable {
    let mut t = InlineTable::new();
    for (k, v) in pairs {
        t.insert(k, Value::from(v.as_str()));
    }
    t.fmt();
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdio(name: &str) -> NewServer {
        NewServer {
            name: name.into(),
            transport: NewTransport::Stdio {
                command: vec!["mcp-server-memory".into(), "--flag".into()],
                env: BTreeMap::from([
                    ("MEMORY_FILE_PATH".into(), "/w/memory.jsonl".into()),
                    ("API_TOKEN".into(), "env:API_TOKEN".into()),
                ]),
                cwd: None,
            },
            allow: vec![],
            enabled: true,
            timeout: None,
            comments: vec!["from claude_desktop_config.json".into()],
        }
    }

    const COMMENTED: &str = "# my vault's config\nvault = \"/v\"   # where the notes are\n\n[tools.search_web]\n# the provider\nprovider = \"searxng\"\n\n[mcp.time]   # keep this one\ncommand = [\"mcp-server-time\"]\nallow = [\"*\"]\n\n[mcp.time.tools.get_current_time]\neffect = \"read_only\"\n\n# notify at the end\n[notify]\n";

    #[test]
    fn adding_keeps_every_byte_and_comment_of_the_file() {
        let out = add_servers(COMMENTED, &[stdio("memory")]).unwrap();
        // Every line of the original is still there, in order.
        let mut rest = out.as_str();
        for line in COMMENTED.lines() {
            let at = rest
                .find(line)
                .unwrap_or_else(|| panic!("lost {line:?} in:\n{out}"));
            rest = &rest[at + line.len()..];
        }
        assert!(
            out.contains("# from claude_desktop_config.json\n[mcp.memory]\ncommand = [\"mcp-server-memory\", \"--flag\"]\nenv = { API_TOKEN = \"env:API_TOKEN\", MEMORY_FILE_PATH = \"/w/memory.jsonl\" }\nallow = []\n"),
            "{out}"
        );
        // Placed after the last [mcp.…] table, before [notify].
        let new = out.find("[mcp.memory]").unwrap();
        assert!(new > out.find("[mcp.time.tools.get_current_time]").unwrap());
        assert!(new < out.find("[notify]").unwrap(), "{out}");
        let value: toml::Table = toml::from_str(&out).unwrap();
        assert_eq!(value["mcp"]["memory"]["allow"].as_array().unwrap().len(), 0);
        assert_eq!(
            configured_servers(&out).unwrap(),
            BTreeSet::from(["memory".to_string(), "time".to_string()])
        );
    }

    #[test]
    fn the_first_server_of_a_file_without_mcp_goes_at_the_end() {
        let text = "vault = \"/v\" # notes\n";
        let out = add_servers(text, &[stdio("memory")]).unwrap();
        assert!(out.starts_with(text), "{out}");
        assert!(!out.contains("[mcp]\n"), "{out}");
        assert!(out.contains("\n[mcp.memory]\n"), "{out}");
        let http = NewServer {
            name: "docs".into(),
            transport: NewTransport::Http {
                url: "https://docs.example.com/mcp".into(),
                headers: BTreeMap::from([("Authorization".into(), "env:DOCS_AUTH".into())]),
            },
            allow: vec!["search".into()],
            enabled: false,
            timeout: Some("300s".into()),
            comments: vec![],
        };
        let out = render(&[http]).unwrap();
        assert_eq!(
            out,
            "[mcp.docs]\nenabled = false\nurl = \"https://docs.example.com/mcp\"\nheaders = { Authorization = \"env:DOCS_AUTH\" }\nallow = [\"search\"]\ntimeout = \"300s\"\n"
        );
    }

    #[test]
    fn a_name_already_present_is_refused_and_bad_toml_is_an_error() {
        assert_eq!(
            add_servers(COMMENTED, &[stdio("time")]),
            Err(EditError::Exists("time".into()))
        );
        assert!(matches!(
            add_servers("vault = \n", &[stdio("x")]),
            Err(EditError::Parse(_))
        ));
        assert_eq!(
            add_servers("mcp = 3\n", &[stdio("x")]),
            Err(EditError::NotATable)
        );
    }

    #[test]
    fn a_comment_from_a_foreign_file_cannot_start_a_key() {
        let mut s = stdio("x");
        s.comments = vec!["from evil\nallow = [\"*\"]".into()];
        let out = render(&[s]).unwrap();
        let value: toml::Table = toml::from_str(&out).unwrap();
        assert_eq!(value["mcp"]["x"]["allow"].as_array().unwrap().len(), 0);
        assert!(out.contains("# allow = [\"*\"]\n"), "{out}");
    }
}
