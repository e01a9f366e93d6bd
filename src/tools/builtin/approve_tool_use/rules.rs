//! Claude Code's permission rules (`Bash(git status:*)`, `Edit(docs/**)`, `mcp__github__*`,
//! `WebFetch(domain:example.com)`), read as Claude Code documents them: a rule is a tool name,
//! optionally with a specifier in parentheses that narrows it to some uses. Deny rules win over
//! ask rules, ask rules over allow rules; a use no rule names is asked.

use globset::{Glob, GlobBuilder, GlobMatcher};
use serde_json::{Map, Value};

/// What a rule list says about one tool use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// By the rule that allowed it.
    Allow(String),
    /// By the rule that denied it.
    Deny(String),
    /// By the rule that asks, or `None` when no rule names the use.
    Ask(Option<String>),
}

/// One rule, parsed.
#[derive(Debug, Clone)]
pub struct Rule {
    text: String,
    tool: GlobMatcher,
    specifier: Option<Specifier>,
}

#[derive(Debug, Clone)]
enum Specifier {
    /// `Bash(npm run test:*)`: the command starts with `npm run test`.
    Prefix(String),
    /// `Edit(docs/**)`, `Bash(git * --help)`: a glob over the use's subject.
    Glob(GlobMatcher, bool),
    /// `Bash(git status)`: exactly this subject.
    Exact(String),
}

impl Rule {
    /// `Tool`, `Tool(specifier)`; `mcp__server` stands for every tool of that server.
    pub fn parse(text: &str) -> Result<Rule, String> {
        let text = text.trim();
        let (name, specifier) = match text.split_once('(') {
            Some((name, rest)) => {
                let Some(spec) = rest.strip_suffix(')') else {
                    return Err(format!("`{text}`: a specifier ends with `)`"));
                };
                (name, Some(spec))
            }
            None => (text, None),
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '*'))
        {
            return Err(format!(
                "`{text}`: a rule starts with a tool name (letters, digits, _ - . and *), e.g. `Bash(git status:*)` or `mcp__github__*`"
            ));
        }
        // `mcp__server` alone: every tool of the server (Claude Code's spelling).
        let name_glob = match name.strip_prefix("mcp__") {
            Some(server) if !server.contains("__") && !name.contains('*') => {
                format!("{name}__*")
            }
            _ => name.to_string(),
        };
        let tool = Glob::new(&name_glob)
            .map_err(|e| format!("`{text}`: {e}"))?
            .compile_matcher();
        let specifier = match specifier {
            None => None,
            Some("") => return Err(format!("`{text}`: an empty specifier; write `{name}`")),
            Some(spec) => Some(Specifier::parse(name, spec).map_err(|e| format!("`{text}`: {e}"))?),
        };
        Ok(Rule {
            text: text.to_string(),
            tool,
            specifier,
        })
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the rule names this use of `tool` with `input`.
    pub fn matches(&self, tool: &str, input: &Map<String, Value>) -> bool {
        if !self.tool.is_match(tool) {
            return false;
        }
        let Some(specifier) = &self.specifier else {
            return true;
        };
        subjects(tool, input)
            .iter()
            .any(|subject| specifier.matches(subject))
    }
}

impl Specifier {
    fn parse(tool: &str, spec: &str) -> Result<Specifier, String> {
        if let Some(prefix) = spec.strip_suffix(":*") {
            return Ok(Specifier::Prefix(prefix.to_string()));
        }
        if !spec.contains('*') && !spec.contains('?') && !spec.contains('[') {
            return Ok(Specifier::Exact(spec.to_string()));
        }
        // File tools match paths the gitignore way (`*` stays within a folder, `**` crosses
        // them); a command's `*` matches anything.
        let path_like = is_file_tool(tool);
        let glob = GlobBuilder::new(spec)
            .literal_separator(path_like)
            .build()
            .map_err(|e| e.to_string())?
            .compile_matcher();
        Ok(Specifier::Glob(glob, path_like))
    }

    fn matches(&self, subject: &str) -> bool {
        match self {
            Specifier::Prefix(prefix) => {
                subject == prefix
                    || subject
                        .strip_prefix(prefix.as_str())
                        .is_some_and(|rest| rest.starts_with([' ', '\t']))
            }
            Specifier::Exact(exact) => subject == exact,
            Specifier::Glob(glob, path_like) => {
                glob.is_match(subject)
                    // A relative pattern (`docs/**`) matches the end of an absolute path, as
                    // Claude Code reads it against the project folder.
                    || (*path_like && subject.starts_with('/') && {
                        let mut tail = subject;
                        let mut hit = false;
                        while let Some((_, rest)) = tail.split_once('/') {
                            if glob.is_match(rest) {
                                hit = true;
                                break;
                            }
                            tail = rest;
                        }
                        hit
                    })
            }
        }
    }
}

fn is_file_tool(tool: &str) -> bool {
    matches!(
        tool,
        "Read" | "Edit" | "Write" | "MultiEdit" | "NotebookEdit" | "NotebookRead" | "Glob" | "Grep" | "LS"
    )
}

/// What a specifier is matched against, per tool: a command, a path, `domain:HOST`, a query;
/// for other tools every string value of the input.
fn subjects(tool: &str, input: &Map<String, Value>) -> Vec<String> {
    let field = |key: &str| input.get(key).and_then(Value::as_str).map(str::to_string);
    let one = match tool {
        "Bash" => field("command"),
        "WebFetch" => field("url").and_then(|u| {
            reqwest::Url::parse(&u)
                .ok()
                .and_then(|u| u.host_str().map(|h| format!("domain:{h}")))
        }),
        "WebSearch" => field("query"),
        t if is_file_tool(t) => field("file_path")
            .or_else(|| field("notebook_path"))
            .or_else(|| field("path")),
        _ => None,
    };
    match one {
        Some(s) => vec![s],
        None => input
            .values()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
    }
}

/// The three lists, parsed.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
    pub ask: Vec<Rule>,
}

impl Rules {
    /// Deny wins over ask, ask over allow; nothing named: ask.
    pub fn decide(&self, tool: &str, input: &Map<String, Value>) -> Decision {
        let first = |rules: &[Rule]| {
            rules
                .iter()
                .find(|r| r.matches(tool, input))
                .map(|r| r.text().to_string())
        };
        if let Some(rule) = first(&self.deny) {
            return Decision::Deny(rule);
        }
        if let Some(rule) = first(&self.ask) {
            return Decision::Ask(Some(rule));
        }
        if let Some(rule) = first(&self.allow) {
            return Decision::Allow(rule);
        }
        Decision::Ask(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(allow: &[&str], deny: &[&str], ask: &[&str]) -> Rules {
        let parse = |l: &[&str]| l.iter().map(|r| Rule::parse(r).unwrap()).collect();
        Rules {
            allow: parse(allow),
            deny: parse(deny),
            ask: parse(ask),
        }
    }

    fn input(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn bash_prefix_rules_match_whole_words() {
        let r = rules(&["Bash(git status:*)", "Bash(npm test)"], &["Bash(git push:*)"], &[]);
        let bash = |c: &str| r.decide("Bash", &input(json!({"command": c})));
        assert_eq!(bash("git status"), Decision::Allow("Bash(git status:*)".into()));
        assert_eq!(bash("git status --short"), Decision::Allow("Bash(git status:*)".into()));
        assert_eq!(bash("git statusx"), Decision::Ask(None), "a prefix is a whole word");
        assert_eq!(bash("npm test"), Decision::Allow("Bash(npm test)".into()));
        assert_eq!(bash("npm test && rm -rf /"), Decision::Ask(None), "exact means exact");
        assert_eq!(bash("git push origin main"), Decision::Deny("Bash(git push:*)".into()));
    }

    #[test]
    fn deny_wins_over_ask_and_ask_over_allow() {
        let r = rules(&["Edit"], &["Edit(secrets/**)"], &["Edit(docs/**)"]);
        let edit = |p: &str| r.decide("Edit", &input(json!({"file_path": p})));
        assert_eq!(edit("src/main.rs"), Decision::Allow("Edit".into()));
        assert_eq!(edit("docs/a/b.md"), Decision::Ask(Some("Edit(docs/**)".into())));
        assert_eq!(edit("/home/me/project/docs/x.md"), Decision::Ask(Some("Edit(docs/**)".into())));
        assert_eq!(edit("secrets/k.pem"), Decision::Deny("Edit(secrets/**)".into()));
    }

    #[test]
    fn path_globs_keep_star_within_a_folder() {
        let r = rules(&["Read(src/*.rs)"], &[], &[]);
        let read = |p: &str| r.decide("Read", &input(json!({"file_path": p})));
        assert_eq!(read("src/main.rs"), Decision::Allow("Read(src/*.rs)".into()));
        assert_eq!(read("src/a/main.rs"), Decision::Ask(None));
    }

    #[test]
    fn mcp_names_and_web_domains() {
        let r = rules(
            &["mcp__github", "mcp__vaultd__vault_*", "WebFetch(domain:docs.rs)"],
            &["mcp__vaultd__vault_delete"],
            &[],
        );
        let none = input(json!({}));
        assert!(matches!(r.decide("mcp__github__search_issues", &none), Decision::Allow(_)));
        assert!(matches!(r.decide("mcp__githubx__a", &none), Decision::Ask(None)));
        assert!(matches!(r.decide("mcp__vaultd__vault_read", &none), Decision::Allow(_)));
        assert!(matches!(r.decide("mcp__vaultd__vault_delete", &none), Decision::Deny(_)));
        let fetch = |u: &str| r.decide("WebFetch", &input(json!({"url": u})));
        assert!(matches!(fetch("https://docs.rs/tokio"), Decision::Allow(_)));
        assert_eq!(fetch("https://evil.example/docs.rs"), Decision::Ask(None));
    }

    #[test]
    fn malformed_rules_are_refused_with_the_rule() {
        for bad in ["", "Bash(git", "Bash()", "Ba sh", "(x)"] {
            let e = Rule::parse(bad).unwrap_err();
            assert!(e.contains('`'), "{bad}: {e}");
        }
    }
}
