//! Secret references (`env:NAME`, `file:PATH`, `credential:NAME`) and the redactor that every
//! outward string (note, journal, log line, `vaultd config`) passes through.

use base64::Engine;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(
        "`{0}` is not a secret reference: write env:NAME, file:PATH or credential:NAME (a literal secret in the config is refused)"
    )]
    NotAReference(String),
    #[error(
        "this plain value looks like a credential, and a credential is never written into the config: set it in vaultd's environment and write env:{0} (or file:PATH, credential:NAME) instead"
    )]
    LiteralCredential(String),
    #[error("environment variable {0} is not set or empty")]
    EnvMissing(String),
    #[error("cannot read secret file {path}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("credential:{0} needs $CREDENTIALS_DIRECTORY (set by systemd's LoadCredential=)")]
    NoCredentialsDirectory(String),
    #[error("secret {0} is empty")]
    Empty(String),
}

/// A resolved secret. `Debug` never shows the value; only `expose()` does, at the point of use.
#[derive(Clone)]
pub struct Secret {
    /// The reference as written in the config (`env:SMTP_PASSWORD`), safe to print.
    reference: String,
    value: String,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({})", self.reference)
    }
}

impl Secret {
    /// Resolves a reference. `file:` secrets have one trailing newline trimmed (docs/design.md §8.7).
    pub fn resolve(reference: &str) -> Result<Secret, SecretError> {
        let value = if let Some(name) = reference.strip_prefix("env:") {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| SecretError::EnvMissing(name.to_string()))?
        } else if let Some(path) = reference.strip_prefix("file:") {
            read_trimmed(crate::home::expand_tilde(path))?
        } else if let Some(name) = reference.strip_prefix("credential:") {
            let dir = std::env::var_os("CREDENTIALS_DIRECTORY")
                .filter(|v| !v.is_empty())
                .ok_or_else(|| SecretError::NoCredentialsDirectory(name.to_string()))?;
            read_trimmed(PathBuf::from(dir).join(name))?
        } else {
            return Err(SecretError::NotAReference(redact_literal(reference)));
        };
        if value.is_empty() {
            return Err(SecretError::Empty(reference.to_string()));
        }
        Ok(Secret {
            reference: reference.to_string(),
            value,
        })
    }

    /// A reference checked for its form but not read: for commands that run no tool
    /// (`status`, `log`), which must work while a secret's variable is unset.
    /// [`Secret::expose`] gives an empty string; [`Secret::is_resolved`] says so.
    pub fn unresolved(reference: &str) -> Result<Secret, SecretError> {
        if !["env:", "file:", "credential:"]
            .iter()
            .any(|p| reference.starts_with(p))
        {
            return Err(SecretError::NotAReference(redact_literal(reference)));
        }
        Ok(Secret {
            reference: reference.to_string(),
            value: String::new(),
        })
    }

    /// What a command loads: with `skip_unavailable` (commands that run no tool: `status`,
    /// `log`, `check`, `tools`, `config`), the secret if it can be read here, else the
    /// reference left [unresolved](Secret::unresolved), so an unset variable does not stop
    /// them (the caller names the unresolved ones); else [`Secret::resolve`]. A literal
    /// instead of a reference is refused either way.
    pub fn load(reference: &str, skip_unavailable: bool) -> Result<Secret, SecretError> {
        match Secret::resolve(reference) {
            Err(SecretError::NotAReference(r)) => Err(SecretError::NotAReference(r)),
            Err(_) if skip_unavailable => Secret::unresolved(reference),
            resolved => resolved,
        }
    }

    /// Why this secret is not resolved (it was loaded with [`Secret::load`] and could not be
    /// read): the reason [`Secret::resolve`] gives now. None when it is resolved.
    pub fn why_unresolved(&self) -> Option<String> {
        if self.is_resolved() {
            return None;
        }
        Some(match Secret::resolve(&self.reference) {
            Err(e) => e.to_string(),
            Ok(_) => "set now, but not when the config was read".to_string(),
        })
    }

    /// False for a reference loaded with [`Secret::unresolved`].
    pub fn is_resolved(&self) -> bool {
        !self.value.is_empty()
    }

    /// A secret from a literal value, for tests and for secrets that come from elsewhere.
    pub fn literal(reference: &str, value: &str) -> Secret {
        Secret {
            reference: reference.to_string(),
            value: value.to_string(),
        }
    }

    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The secret value itself. Call only where it is handed to a client.
    pub fn expose(&self) -> &str {
        &self.value
    }
}

/// Shows the shape of a mistaken literal without the literal itself.
fn redact_literal(s: &str) -> String {
    if s.len() <= 4 {
        "[redacted]".into()
    } else {
        format!(
            "{}…[redacted]",
            &s[..s.char_indices().nth(2).map_or(s.len(), |(i, _)| i)]
        )
    }
}

fn read_trimmed(path: PathBuf) -> Result<String, SecretError> {
    let mut s = std::fs::read_to_string(&path).map_err(|source| SecretError::File {
        path: path.clone(),
        source,
    })?;
    if s.ends_with('\n') {
        s.pop();
        if s.ends_with('\r') {
            s.pop();
        }
    }
    Ok(s)
}

/// A part of the config that holds secrets (a tool source's table, an MCP server): it names
/// them, and [`Redactor::for_holders`] collects them into the one redactor, so no other code
/// needs to know where secrets live.
pub trait SecretHolder {
    /// Every secret this part holds.
    fn secrets(&self) -> Vec<&Secret>;

    /// User names sent beside a secret (SMTP AUTH): their encoded pairs are redacted too.
    fn usernames(&self) -> Vec<&str> {
        Vec::new()
    }
}

/// Replaces every known secret — plain, URL-encoded, base64 (SMTP AUTH), and escaped as JSON,
/// YAML, HTML or Rust's `Debug` would escape it (docs/design.md §10.8) — with `[redacted]`.
#[derive(Debug, Default)]
pub struct Redactor {
    /// Longest first, so a secret that contains another is replaced whole. Behind a lock
    /// because a reloaded config's new secrets are added ([`Redactor::learn`]) to the one
    /// redactor the log writer and the runner already hold.
    needles: std::sync::RwLock<Vec<String>>,
}

impl Clone for Redactor {
    fn clone(&self) -> Redactor {
        Redactor {
            needles: std::sync::RwLock::new(self.needles().clone()),
        }
    }
}

pub const REDACTED: &str = "[redacted]";

impl Redactor {
    /// `secrets` are the values; `usernames` are used only to build the SMTP AUTH PLAIN form.
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a Secret>, usernames: &[&str]) -> Redactor {
        let mut needles = Vec::new();
        let b64 = base64::engine::general_purpose::STANDARD;
        for s in secrets {
            let v = s.expose();
            if v.len() < 4 {
                // Too short to redact without mangling ordinary text; config refuses empty ones.
                continue;
            }
            needles.push(v.to_string());
            let url = percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
            needles.push(url);
            let form: String = url_form_encode(v);
            needles.push(form);
            needles.push(b64.encode(v));
            needles.extend(escaped_forms(v));
            for u in usernames {
                needles.push(b64.encode(format!("\0{u}\0{v}")));
                needles.push(b64.encode(format!("{u}\0{u}\0{v}")));
            }
            // Webhook URLs: their path (the token part) is the secret too, wherever a client
            // quotes only the path.
            if let Ok(url) = reqwest::Url::parse(v)
                && url.path().len() > 8
            {
                needles.push(url.path().to_string());
                // The token alone (Slack's last part, Discord's), as a server may quote it.
                if let Some(token) = url.path_segments().and_then(|mut s| s.next_back())
                    && token.len() >= 8
                {
                    needles.push(token.to_string());
                }
            }
        }
        longest_first(&mut needles);
        Redactor {
            needles: std::sync::RwLock::new(needles),
        }
    }

    fn needles(&self) -> std::sync::RwLockReadGuard<'_, Vec<String>> {
        // A writer cannot panic while holding it (it only extends and sorts a Vec).
        self.needles
            .read()
            .expect("the redactor lock is never poisoned")
    }

    /// Adds what `other` hides (a reloaded config's secrets) to this redactor, which every log
    /// line and every result already goes through. What it hid stays hidden: a log line or a
    /// note may still quote a secret the config no longer names.
    pub fn learn(&self, other: &Redactor) {
        let new = other.needles().clone();
        let mut needles = self
            .needles
            .write()
            .expect("the redactor lock is never poisoned");
        needles.extend(new);
        longest_first(&mut needles);
    }

    /// The redactor for every secret the holders name.
    pub fn for_holders(holders: &[&dyn SecretHolder]) -> Redactor {
        let secrets: Vec<&Secret> = holders.iter().flat_map(|h| h.secrets()).collect();
        let usernames: Vec<&str> = holders.iter().flat_map(|h| h.usernames()).collect();
        Redactor::new(secrets, &usernames)
    }

    pub fn redact(&self, s: &str) -> String {
        let mut out = s.to_string();
        for n in self.needles().iter() {
            if out.contains(n.as_str()) {
                out = out.replace(n.as_str(), REDACTED);
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.needles().is_empty()
    }
}

/// Longest first (then in order, so equal ones are neighbours for `dedup`).
fn longest_first(needles: &mut Vec<String>) {
    needles.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    needles.dedup();
}

/// The forms in which a secret holding quotes, backslashes, control characters or non-ASCII
/// text shows up inside a quoted string (docs/design.md §10.8): a server that quotes it in a JSON error
/// body, vaultd writing an error message into a note's JSON block or the journal (escaped
/// once, or twice when the message already held JSON), a YAML string, an HTML error page, a
/// `{:?}` in a client's error. For a secret of plain characters every form is the secret
/// itself, and none is returned.
fn escaped_forms(v: &str) -> Vec<String> {
    let json = json_escape(v, JsonStyle::Plain);
    let ascii = json_escape(v, JsonStyle::AsciiOnly);
    let mut forms = vec![
        json_escape(&json, JsonStyle::Plain),
        // PHP's json_encode escapes `/` too (a webhook URL as a PHP server quotes it).
        ascii.replace('/', "\\/"),
        json.replace('/', "\\/"),
        ascii,
        // Rust's `Debug` (an error formatted with `{:?}`): like JSON for `"`, `\` and `\n`.
        format!("{v:?}").trim_matches('"').to_string(),
        // YAML: double-quoted strings escape as JSON does; single-quoted double the quote.
        v.replace('\'', "''"),
        html_escape(v),
        json,
    ];
    forms.retain(|f| f != v);
    forms.sort();
    forms.dedup();
    forms
}

#[derive(Clone, Copy, PartialEq)]
enum JsonStyle {
    /// serde_json, JavaScript: non-ASCII as is.
    Plain,
    /// Python's `json.dumps` default: non-ASCII as `\uXXXX` (lowercase, surrogate pairs).
    AsciiOnly,
}

/// The inside of a JSON string holding `v` (without the quotes).
fn json_escape(v: &str, style: JsonStyle) -> String {
    let quoted = serde_json::to_string(v).expect("a string always serializes");
    let inner = &quoted[1..quoted.len() - 1];
    if style == JsonStyle::Plain {
        return inner.to_string();
    }
    let mut out = String::with_capacity(inner.len());
    for c in inner.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// A secret as an HTML error page quotes it.
fn html_escape(v: &str) -> String {
    v.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn url_form_encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Whether an `env` value is a credential: by the variable's name (`…TOKEN`, `…API_KEY`,
/// `…SECRET`, `…PASSWORD`, …), by a known token shape (`ghp_…`, `sk-…`, `xoxb-…`, a JWT, a
/// PEM key, a URL with a password), or by being a long opaque string. A path is never one
/// (`GOOGLE_APPLICATION_CREDENTIALS=/home/me/key.json` names a file; the sandbox guards
/// files). Errs on the side of a reference: a wrong guess costs one variable to set.
pub fn looks_like_credential(key: &str, value: &str) -> bool {
    let v = value.trim();
    if v.starts_with('/') || v.starts_with("~/") || v.starts_with("./") || v.starts_with("../") {
        return false;
    }
    let k = key.to_ascii_uppercase();
    let secret_name = [
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "PASSPHRASE",
        "API_KEY",
        "APIKEY",
        "ACCESS_KEY",
        "PRIVATE_KEY",
        "AUTH",
        "CREDENTIAL",
        "COOKIE",
        "SESSION",
        "BEARER",
        "DSN",
        "CONNECTION_STRING",
        "DATABASE_URL",
    ]
    .iter()
    .any(|w| k.contains(w))
        || k == "KEY"
        || k.ends_with("_KEY")
        || k.ends_with("_PAT")
        || k == "PAT";
    if secret_name {
        return true;
    }
    let known_shape = [
        "ghp_",
        "gho_",
        "ghs_",
        "ghu_",
        "ghr_",
        "github_pat_",
        "glpat-",
        "sk-",
        "sk_live_",
        "rk_live_",
        "xoxb-",
        "xoxp-",
        "xoxa-",
        "xapp-",
        "AKIA",
        "ASIA",
        "AIza",
        "ntn_",
        "secret_",
        "lin_api_",
        "Bearer ",
        "Basic ",
        "eyJ",
        "-----BEGIN",
    ]
    .iter()
    .any(|p| v.starts_with(p));
    if known_shape {
        return true;
    }
    if let Ok(url) = reqwest::Url::parse(v)
        && url.password().is_some()
    {
        return true;
    }
    // A long opaque token: no spaces, letters and digits mixed, mostly alphanumeric.
    v.len() >= 24
        && !v.contains(char::is_whitespace)
        && v.chars().any(|c| c.is_ascii_digit())
        && v.chars().any(|c| c.is_ascii_alphabetic())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_+/=.".contains(c))
        && !v.contains("://")
}

/// A plain value the config loader refuses (docs/design.md §10.4: only literal values that
/// look like credentials are refused): what [`looks_like_credential`] says, less the few
/// words that only switch something (`AUTH_MODE = "none"`, `USE_TOKEN = "true"`).
pub fn literal_credential(key: &str, value: &str) -> bool {
    let switch = matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "" | "true" | "false" | "yes" | "no" | "on" | "off" | "none" | "0" | "1"
    );
    !switch && looks_like_credential(key, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_by_name_shape_or_look_paths_never() {
        for (k, v) in [
            ("GITHUB_TOKEN", "abc"),
            ("OPENAI_API_KEY", "x"),
            ("DB_PASSWORD", "hunter2"),
            ("ANYTHING", "ghp_0123456789abcdef"),
            ("ANYTHING", "sk-proj-abc"),
            ("ANYTHING", "postgres://u:pw@db/x"),
            ("ANYTHING", "eyJhbGciOiJIUzI1NiJ9.e30.x"),
            ("ANYTHING", "a8f5f167f44f4964e6c998dee827110c"),
        ] {
            assert!(looks_like_credential(k, v), "{k}={v}");
        }
        for (k, v) in [
            ("MEMORY_FILE_PATH", "/w/memory.jsonl"),
            ("GOOGLE_APPLICATION_CREDENTIALS", "/home/me/key.json"),
            ("LOG_LEVEL", "debug"),
            ("BASE_URL", "https://api.example.com/v1"),
            ("ALLOWED_DIRS", "notes"),
        ] {
            assert!(!looks_like_credential(k, v), "{k}={v}");
        }
    }

    #[test]
    fn the_loader_lets_switches_through() {
        assert!(literal_credential("DB_PASSWORD", "hunter2"));
        assert!(literal_credential("X", "ghp_0123456789abcdef"));
        for (k, v) in [
            ("AUTH_MODE", "none"),
            ("USE_TOKEN", "true"),
            ("LOG_LEVEL", "debug"),
        ] {
            assert!(!literal_credential(k, v), "{k}={v}");
        }
    }

    #[test]
    fn a_redactor_learns_new_secrets_and_keeps_hiding_the_old_ones() {
        let old = Secret::literal("env:OLD", "old-secret-value");
        let new = Secret::literal("env:NEW", "new-secret-value");
        let r = Redactor::new([&old], &[]);
        let shared = r.clone();
        r.learn(&Redactor::new([&new], &[]));
        assert_eq!(
            r.redact("old-secret-value new-secret-value"),
            "[redacted] [redacted]"
        );
        // A clone is a copy taken then, not a view.
        assert_eq!(shared.redact("new-secret-value"), "new-secret-value");
        r.learn(&Redactor::new([&new], &[]));
        assert_eq!(r.redact("new-secret-value"), "[redacted]");
    }

    #[test]
    fn redacts_plain_url_encoded_and_base64_forms() {
        let s = Secret::literal("env:X", "p@ss w/rd!");
        let r = Redactor::new([&s], &["agent"]);
        let b64 = base64::engine::general_purpose::STANDARD;
        for text in [
            "p@ss w/rd!".to_string(),
            "p%40ss%20w%2Frd%21".to_string(),
            "p%40ss+w%2Frd%21".to_string(),
            b64.encode("\0agent\0p@ss w/rd!"),
        ] {
            let out = r.redact(&format!("error near {text} here"));
            assert_eq!(out, "error near [redacted] here", "{text}");
        }
    }

    #[test]
    fn redacts_json_yaml_html_and_debug_escaped_forms() {
        let v = "q\"uo\\te\nline-\u{fc}n\u{ef}\u{20ac}-'s/\u{1f511}";
        let s = Secret::literal("env:X", v);
        let r = Redactor::new([&s], &[]);
        let json = serde_json::to_string(v).unwrap();
        let json = &json[1..json.len() - 1];
        assert!(json.starts_with(r#"q\"uo\\te\nline-"#), "{json}");
        let twice = serde_json::to_string(json).unwrap();
        for text in [
            json.to_string(),
            twice[1..twice.len() - 1].to_string(),
            // Python's json.dumps, the emoji as a surrogate pair.
            r#"q\"uo\\te\nline-\u00fcn\u00ef\u20ac-'s/\ud83d\udd11"#.to_string(),
            // PHP's json_encode.
            r#"q\"uo\\te\nline-\u00fcn\u00ef\u20ac-'s\/\ud83d\udd11"#.to_string(),
            format!("{v:?}").trim_matches('"').to_string(),
            "q\"uo\\te\nline-\u{fc}n\u{ef}\u{20ac}-''s/\u{1f511}".to_string(),
            "q&quot;uo\\te\nline-\u{fc}n\u{ef}\u{20ac}-&#39;s/\u{1f511}".to_string(),
        ] {
            let out = r.redact(&format!("error near {text} here"));
            assert_eq!(out, "error near [redacted] here", "{text}");
        }
        // A secret with nothing to escape adds no needles.
        assert!(escaped_forms("plainsecret").is_empty());
    }

    #[test]
    fn redacts_webhook_url_and_its_path() {
        let s = Secret::literal(
            "env:H",
            "https://hooks.slack.com/services/T000/B000/XXXXSECRET",
        );
        let r = Redactor::new([&s], &[]);
        assert_eq!(
            r.redact("POST https://hooks.slack.com/services/T000/B000/XXXXSECRET failed"),
            "POST [redacted] failed"
        );
        assert_eq!(
            r.redact("status for /services/T000/B000/XXXXSECRET"),
            "status for [redacted]"
        );
        assert_eq!(
            r.redact("invalid token XXXXSECRET"),
            "invalid token [redacted]"
        );
    }

    #[test]
    fn file_secrets_lose_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        std::fs::write(&p, "abc\n\n").unwrap();
        let s = Secret::resolve(&format!("file:{}", p.display())).unwrap();
        assert_eq!(s.expose(), "abc\n");
    }

    #[test]
    fn literals_are_refused_without_echoing_them() {
        let err = Secret::resolve("hunter2-verysecret")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2-verysecret"), "{err}");
    }

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::literal("env:X", "topsecret");
        assert!(!format!("{s:?}").contains("topsecret"));
    }
}
