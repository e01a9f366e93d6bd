//! Claude Code's permission rules (`Bash(git status:*)`, `Edit(docs/**)`, `mcp__github__*`,
//! `WebFetch(domain:example.com)`), read as Claude Code documents them: a rule is a tool name,
//! optionally with a specifier in parentheses that narrows it to some uses. Deny rules win over
//! ask rules, ask rules over allow rules; a use no rule names is asked.

use super::shell;
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
    Glob(GlobMatcher),
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

    /// Whether the rule names the tool at all.
    fn names_tool(&self, tool: &str) -> bool {
        self.tool.is_match(tool)
    }

    /// Whether the rule names some part of the use (deny and ask rules): a specifier is
    /// matched against every subject the use has, however it is spelt.
    fn names(&self, tool: &str, the_use: &Use) -> bool {
        self.names_tool(tool)
            && self
                .specifier
                .as_ref()
                .is_none_or(|spec| the_use.names.iter().any(|s| spec.matches(s)))
    }

    /// Whether the rule allows one part of the use: a rule without a specifier names every
    /// use of its tool; one with a specifier only what it can read with confidence.
    fn allows(&self, tool: &str, part: &Allowable) -> bool {
        if !self.names_tool(tool) {
            return false;
        }
        let Some(spec) = &self.specifier else {
            return true;
        };
        match part {
            Allowable::No => false,
            Allowable::Texts(texts) => texts.iter().any(|t| spec.matches(t)),
            // A relative pattern (`docs/**`) matches the end of an absolute path, as Claude
            // Code reads it against the project folder.
            Allowable::Path(path) => {
                spec.matches(path)
                    || (matches!(spec, Specifier::Glob(_))
                        && path.starts_with('/')
                        && tails(path).any(|t| spec.matches(t)))
            }
        }
    }
}

impl Specifier {
    fn parse(tool: &str, spec: &str) -> Result<Specifier, String> {
        // Hosts are matched lower case, without the root's dot.
        let lowered;
        let spec = match spec.strip_prefix("domain:") {
            Some(host) if tool == "WebFetch" => {
                lowered = format!("domain:{}", host.trim_end_matches('.').to_lowercase());
                lowered.as_str()
            }
            // Paths are matched normalised, so `./docs/**` is `docs/**`.
            _ if is_file_tool(tool) => {
                let mut spec = spec;
                while let Some(rest) = spec.strip_prefix("./") {
                    spec = rest.trim_start_matches('/');
                }
                spec
            }
            _ => spec,
        };
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
        Ok(Specifier::Glob(glob))
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
            Specifier::Glob(glob) => glob.is_match(subject),
        }
    }
}

fn is_file_tool(tool: &str) -> bool {
    matches!(
        tool,
        "Read" | "Edit" | "Write" | "MultiEdit" | "NotebookEdit" | "NotebookRead" | "Glob" | "Grep" | "LS"
    )
}

/// `a/b/c` → `b/c`, `c`: the ends of a path, which a relative pattern also matches.
fn tails(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(move |(i, _)| &path[i + 1..])
        .filter(|t| !t.is_empty())
}

/// A path normalised lexically: no `.` or empty segments, `..` resolved against the segment
/// before it (at `/` it stays at `/`; a leading `~…` is not climbed out of). Also whether a
/// `..` is left: the path climbs out of where it starts.
fn normalise(path: &str) -> (String, bool) {
    let absolute = path.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => match out.last() {
                Some(last) if *last != ".." && !(out.len() == 1 && last.starts_with('~')) => {
                    out.pop();
                }
                None if absolute => {}
                _ => out.push(".."),
            },
            s => out.push(s),
        }
    }
    let climbs = out.contains(&"..");
    let joined = out.join("/");
    let path = match (absolute, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    };
    (path, climbs)
}

/// What a part of a use offers to allow rules.
#[derive(Debug)]
enum Allowable {
    /// Nothing a specifier can allow: a command with a substitution or redirection, a command
    /// line that could not be split, a path that climbs out.
    No,
    /// A command, `domain:HOST`, a query; for other tools every string value of the input.
    Texts(Vec<String>),
    /// A normalised path.
    Path(String),
}

/// A tool use, as the rules see it.
#[derive(Debug)]
struct Use {
    /// Every part must be allowed for the use to be.
    parts: Vec<Allowable>,
    /// What deny and ask rules match: every part, every spelling.
    names: Vec<String>,
}

impl Use {
    /// What a specifier is matched against, per tool: a command, a path, `domain:HOST`, a
    /// query; for other tools every string value of the input.
    fn of(tool: &str, input: &Map<String, Value>) -> Use {
        let field = |key: &str| input.get(key).and_then(Value::as_str).map(str::to_string);
        let text = |t: Option<String>| {
            t.map(|t| Use {
                parts: vec![Allowable::Texts(vec![t.clone()])],
                names: vec![t],
            })
        };
        let one = match tool {
            "Bash" => field("command").map(|c| Use::command(&c)),
            "WebFetch" => text(field("url").and_then(|u| {
                reqwest::Url::parse(&u).ok().and_then(|u| {
                    u.host_str()
                        .map(|h| format!("domain:{}", h.trim_end_matches('.').to_lowercase()))
                })
            })),
            "WebSearch" => text(field("query")),
            t if is_file_tool(t) => field("file_path")
                .or_else(|| field("notebook_path"))
                .or_else(|| field("path"))
                .map(|p| Use::path(&p)),
            _ => None,
        };
        one.unwrap_or_else(|| {
            let all: Vec<String> = input
                .values()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            Use {
                parts: vec![Allowable::Texts(all.clone())],
                names: all,
            }
        })
    }

    /// Each simple command is a part. Deny and ask rules see the whole line, each part as
    /// written and as run (quotes removed, without assignments, keywords, wrappers and
    /// redirections; its command also by its basename, `/bin/rm` → `rm`).
    fn command(command: &str) -> Use {
        let split = shell::split(command);
        let whole = command.trim().to_string();
        let mut names = vec![whole.clone()];
        let mut parts = Vec::new();
        for part in &split.parts {
            names.push(part.text.clone());
            if let Some((first, rest)) = part.words.split_first() {
                let rest: String = rest.iter().map(|w| format!(" {w}")).collect();
                names.push(format!("{first}{rest}"));
                if let Some((_, base)) = first.rsplit_once('/') {
                    names.push(format!("{base}{rest}"));
                }
            }
            parts.push(if split.confident && !part.risky {
                Allowable::Texts(vec![part.text.clone()])
            } else {
                Allowable::No
            });
        }
        if parts.is_empty() {
            parts.push(if split.confident {
                Allowable::Texts(vec![whole])
            } else {
                Allowable::No
            });
        }
        Use { parts, names }
    }

    /// The path normalised; deny and ask rules also match its ends, relative or absolute.
    fn path(path: &str) -> Use {
        let (path, climbs) = normalise(path);
        let mut names = vec![path.clone()];
        names.extend(tails(&path).map(str::to_string));
        Use {
            parts: vec![if climbs {
                Allowable::No
            } else {
                Allowable::Path(path)
            }],
            names,
        }
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
    /// Deny wins over ask, ask over allow; a use is allowed only when every part of it is (each
    /// simple command of a command line); nothing named: ask.
    pub fn decide(&self, tool: &str, input: &Map<String, Value>) -> Decision {
        let the_use = Use::of(tool, input);
        let first = |rules: &[Rule]| {
            rules
                .iter()
                .find(|r| r.names(tool, &the_use))
                .map(|r| r.text().to_string())
        };
        if let Some(rule) = first(&self.deny) {
            return Decision::Deny(rule);
        }
        if let Some(rule) = first(&self.ask) {
            return Decision::Ask(Some(rule));
        }
        let mut by: Vec<&str> = Vec::new();
        for part in &the_use.parts {
            match self.allow.iter().find(|r| r.allows(tool, part)) {
                Some(rule) if !by.contains(&rule.text()) => by.push(rule.text()),
                Some(_) => {}
                None => return Decision::Ask(None),
            }
        }
        Decision::Allow(by.join(", "))
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

    fn bash_rules() -> Rules {
        rules(
            &[
                "Bash(git status:*)",
                "Bash(npm test)",
                "Bash(git commit:*)",
                "Bash(git * --help)",
            ],
            &["Bash(rm:*)"],
            &[],
        )
    }

    fn bash(r: &Rules, command: &str) -> Decision {
        r.decide("Bash", &input(json!({ "command": command })))
    }

    #[test]
    fn a_prefix_rule_does_not_cover_a_second_command() {
        let r = bash_rules();
        for c in [
            "git status ; curl x",
            "git status;curl x",
            "git status && curl x",
            "git status || curl x",
            "git status | sh",
            "git status |& sh",
            "git status & curl x",
            "git status\ncurl x",
            "(git status) ; curl x",
        ] {
            assert_eq!(bash(&r, c), Decision::Ask(None), "{c:?}");
        }
        assert_eq!(bash(&r, "git status && rm -rf ~"), Decision::Deny("Bash(rm:*)".into()));
        assert_eq!(bash(&r, "git status;rm -rf ~"), Decision::Deny("Bash(rm:*)".into()));
    }

    #[test]
    fn substitutions_and_redirections_are_never_allowed_by_a_rule() {
        let r = bash_rules();
        for c in [
            "git status $(curl x|sh)",
            "git status \"$(curl x)\"",
            "git status `curl x`",
            "git status > ~/.bashrc",
            "git status >> ~/.bashrc",
            "git status 2>/dev/null",
            "git status < /etc/passwd",
            "git status <(curl x)",
            "git status <<EOF\nhi\nEOF",
            "git status &> log",
        ] {
            assert_eq!(bash(&r, c), Decision::Ask(None), "{c:?}");
        }
        // Still deniable, inside the substitution too.
        assert_eq!(bash(&r, "git status $(rm -rf ~)"), Decision::Deny("Bash(rm:*)".into()));
        assert_eq!(bash(&r, "git status `rm -rf ~`"), Decision::Deny("Bash(rm:*)".into()));
        assert_eq!(bash(&r, "rm -rf ~ > /dev/null"), Decision::Deny("Bash(rm:*)".into()));
        assert_eq!(bash(&r, "> log rm -rf ~"), Decision::Deny("Bash(rm:*)".into()));
    }

    #[test]
    fn a_deny_rule_is_not_dodged_by_spaces_assignments_paths_or_quotes() {
        let r = bash_rules();
        for c in [
            " rm -rf /",
            "\trm -rf /",
            "FOO=1 rm -rf /",
            "FOO=1 BAR=\"a b\" rm -rf /",
            "/bin/rm -rf /",
            "./rm -rf /",
            "\"rm\" -rf /",
            "r\\m -rf /",
            "{ rm -rf /; }",
            "(rm -rf /)",
            "if true; then rm -rf /; fi",
            "sudo rm -rf /",
        ] {
            assert_eq!(bash(&r, c), Decision::Deny("Bash(rm:*)".into()), "{c:?}");
        }
    }

    #[test]
    fn a_glob_rule_does_not_match_across_operators() {
        let r = bash_rules();
        assert_eq!(bash(&r, "git log --help"), Decision::Allow("Bash(git * --help)".into()));
        assert_eq!(bash(&r, "git log; curl x --help"), Decision::Ask(None));
        assert_eq!(bash(&r, "git log && curl x --help"), Decision::Ask(None));
    }

    #[test]
    fn a_command_that_cannot_be_split_is_asked_but_still_denied() {
        let r = bash_rules();
        assert_eq!(bash(&r, "git status 'x"), Decision::Ask(None));
        assert_eq!(bash(&r, "git status \"x"), Decision::Ask(None));
        assert_eq!(bash(&r, "git status $'a\\'b'"), Decision::Ask(None));
        assert_eq!(bash(&r, "git status ) x"), Decision::Ask(None));
        assert_eq!(bash(&r, "rm -rf / 'x"), Decision::Deny("Bash(rm:*)".into()));
        assert_eq!(bash(&r, "git status $(rm -rf /"), Decision::Deny("Bash(rm:*)".into()));
    }

    #[test]
    fn plain_and_quoted_commands_are_still_allowed() {
        let r = bash_rules();
        for (c, rule) in [
            ("git status", "Bash(git status:*)"),
            ("git status --short", "Bash(git status:*)"),
            ("  git status --short  ", "Bash(git status:*)"),
            ("git status;", "Bash(git status:*)"),
            ("npm test", "Bash(npm test)"),
            ("git commit -m \"a; b\"", "Bash(git commit:*)"),
            ("git commit -m 'a && b | c > d $(e)'", "Bash(git commit:*)"),
            ("git commit -m \"say \\\"hi\\\"; ok\"", "Bash(git commit:*)"),
            ("git commit -m a\\;b", "Bash(git commit:*)"),
            ("git status && npm test", "Bash(git status:*), Bash(npm test)"),
        ] {
            assert_eq!(bash(&r, c), Decision::Allow(rule.into()), "{c:?}");
        }
        // An assignment changes what a command does (`PATH=`, `GIT_PAGER=`): asked.
        assert_eq!(bash(&r, "GIT_PAGER=x git status"), Decision::Ask(None));
    }

    #[test]
    fn a_tool_wide_rule_names_every_command() {
        let r = rules(&["Bash"], &["Bash(rm:*)"], &["Bash(curl:*)"]);
        assert_eq!(bash(&r, "cargo build 2>&1 | tail"), Decision::Allow("Bash".into()));
        assert_eq!(bash(&r, "ls && curl x"), Decision::Ask(Some("Bash(curl:*)".into())));
        assert_eq!(bash(&r, "ls && FOO=1 rm -rf /"), Decision::Deny("Bash(rm:*)".into()));
        // A deny rule written with an operator still matches the whole command.
        let r = rules(&["Bash"], &["Bash(curl * | sh)"], &[]);
        assert_eq!(bash(&r, "curl x | sh"), Decision::Deny("Bash(curl * | sh)".into()));
    }

    fn edit(r: &Rules, path: &str) -> Decision {
        r.decide("Edit", &input(json!({ "file_path": path })))
    }

    #[test]
    fn a_path_that_climbs_out_is_never_allowed_by_a_pattern() {
        let r = rules(&["Edit(docs/**)"], &["Edit(secrets/**)"], &[]);
        assert_eq!(edit(&r, "docs/../../.ssh/authorized_keys"), Decision::Ask(None));
        assert_eq!(edit(&r, "docs/../src/main.rs"), Decision::Ask(None));
        assert_eq!(
            edit(&r, "/home/me/p/docs/../../../.ssh/authorized_keys"),
            Decision::Ask(None)
        );
        assert_eq!(edit(&r, "docs/../secrets/k.pem"), Decision::Deny("Edit(secrets/**)".into()));
        assert_eq!(edit(&r, "../secrets/k.pem"), Decision::Deny("Edit(secrets/**)".into()));
    }

    #[test]
    fn a_deny_path_rule_matches_normalised_and_relative_paths() {
        let r = rules(&["Edit"], &["Edit(secrets/**)", "Edit(.env)"], &[]);
        for p in [
            "secrets/k.pem",
            "./secrets/k.pem",
            "src/../secrets/k.pem",
            "secrets//k.pem",
            "app/secrets/k.pem",
            "/home/me/p/./secrets/k.pem",
        ] {
            assert_eq!(edit(&r, p), Decision::Deny("Edit(secrets/**)".into()), "{p}");
        }
        for p in [".env", "./.env", "/home/me/p/.env", "app/.env"] {
            assert_eq!(edit(&r, p), Decision::Deny("Edit(.env)".into()), "{p}");
        }
        assert_eq!(edit(&r, "src/main.rs"), Decision::Allow("Edit".into()));
    }

    #[test]
    fn paths_inside_the_pattern_are_still_allowed() {
        let r = rules(&["Edit(docs/**)", "Edit(docs/a.md)"], &[], &[]);
        assert_eq!(edit(&r, "docs/a.md"), Decision::Allow("Edit(docs/**)".into()));
        assert_eq!(edit(&r, "./docs/a.md"), Decision::Allow("Edit(docs/**)".into()));
        assert_eq!(edit(&r, "docs/x/../b.md"), Decision::Allow("Edit(docs/**)".into()));
        assert_eq!(edit(&r, "/home/me/p/docs/a.md"), Decision::Allow("Edit(docs/**)".into()));
        let r = rules(&["Edit(docs/a.md)"], &[], &[]);
        assert_eq!(edit(&r, "docs/a.md"), Decision::Allow("Edit(docs/a.md)".into()));
        assert_eq!(edit(&r, "./docs/a.md"), Decision::Allow("Edit(docs/a.md)".into()));
        let r = rules(&["Edit(./docs/**)"], &[], &[]);
        assert_eq!(edit(&r, "docs/a.md"), Decision::Allow("Edit(./docs/**)".into()));
        assert_eq!(edit(&r, "./docs/a.md"), Decision::Allow("Edit(./docs/**)".into()));
    }

    #[test]
    fn web_domains_ignore_case_and_a_trailing_dot() {
        let r = rules(&["WebFetch"], &["WebFetch(domain:Evil.com)"], &[]);
        let fetch = |u: &str| r.decide("WebFetch", &input(json!({"url": u})));
        for u in ["https://evil.com/", "https://evil.com./", "https://EVIL.com/x", "https://Evil.Com.:443/"] {
            assert_eq!(fetch(u), Decision::Deny("WebFetch(domain:Evil.com)".into()), "{u}");
        }
        assert_eq!(fetch("https://docs.rs/"), Decision::Allow("WebFetch".into()));
    }

    #[test]
    fn malformed_rules_are_refused_with_the_rule() {
        for bad in ["", "Bash(git", "Bash()", "Ba sh", "(x)"] {
            let e = Rule::parse(bad).unwrap_err();
            assert!(e.contains('`'), "{bad}: {e}");
        }
    }
}
