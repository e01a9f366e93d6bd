//! `send_notification` (external_side_effect): email (file outbox or SMTP), Slack or Discord
//! webhook by configured name. Returns `{ "success": true, "message_id": "…" }`.
//!
//! Policy lives in [`SendNotification::admit`] and runs before anything is sent: webhook
//! recipients must be configured names (a note can never supply a URL, docs/design.md §8.6), email
//! recipients must be addresses, and `approval` decides which sends wait for a person.
//! Each method is one module: [`email`], [`slack`], [`discord`].

pub mod config;
mod discord;
mod email;
mod slack;

use crate::call::{CallError, ErrorCode, ToolOutput};
use crate::secret::{Redactor, Secret, SecretHolder};
use crate::tools::builtin::retry::Backoff;
use crate::tools::{
    Admission, Effect, RegistryError, Source, Tool, ToolCall, ToolFuture, ToolSpec,
};
pub use config::{Approval, EmailConfig, EmailTransport, SendNotificationConfig, StartTls};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const TOOL: &str = "send_notification";

pub struct SendNotification {
    spec: ToolSpec,
    /// Who may receive without a person approving (docs/design.md §4, §8.6).
    approval: Approval,
    allowed_recipients: Vec<AllowedRecipient>,
    email: email::Email,
    slack: Webhooks,
    discord: Webhooks,
    http: reqwest::Client,
    /// Every configured secret (SMTP password, webhook URLs): each outward message passes
    /// through it, in case a client or a server quotes one back.
    redactor: Redactor,
}

impl SendNotification {
    pub fn new(
        config: &SendNotificationConfig,
        http: reqwest::Client,
    ) -> Result<SendNotification, RegistryError> {
        let slack = Webhooks::new("slack", &config.slack)?;
        let discord = Webhooks::new("discord", &config.discord)?;
        let email = email::Email::new(&config.email, config.timeout)?;
        let redactor = Redactor::for_holders(&[config as &dyn SecretHolder]);
        Ok(SendNotification {
            spec: ToolSpec {
                name: TOOL.to_string(),
                description: "Send a notification by email, or to a configured Slack or Discord webhook (recipient = webhook name).".to_string(),
                source: Source::Builtin,
                effect: Effect::ExternalSideEffect,
                schema: json!({
                    "type": "object",
                    "properties": {
                        "recipient": { "type": "string", "minLength": 1, "maxLength": 320,
                                       "description": "Email address, or the name of a configured Slack/Discord webhook." },
                        "subject": { "type": "string", "maxLength": 998 },
                        "body": { "type": "string", "maxLength": 100000 },
                        "method": { "type": "string", "enum": ["email", "slack", "discord"], "default": "email" }
                    },
                    "required": ["recipient", "subject", "body"],
                    "additionalProperties": false
                }),
            },
            approval: config.approval,
            allowed_recipients: config
                .allowed_recipients
                .iter()
                .map(|r| AllowedRecipient::parse(r))
                .collect(),
            email,
            slack,
            discord,
            http,
            redactor,
        })
    }

    /// Everything `admit` decides except approval: the parameters, and where they point — a
    /// valid address or a configured webhook name.
    fn resolve<'p>(
        &self,
        parameters: &'p Map<String, Value>,
    ) -> Result<(Send<'p>, Target<'_>), CallError> {
        let send = Send::from_parameters(parameters)?;
        let target = match send.method {
            Method::Email => Target::Email(parse_address(send.recipient)?),
            Method::Slack => Target::Slack(self.slack.get(send.recipient)?),
            Method::Discord => Target::Discord(self.discord.get(send.recipient)?),
        };
        Ok((send, target))
    }

    fn redact(&self, mut error: CallError) -> CallError {
        error.message = self.redactor.redact(&error.message);
        error
    }
}

impl Tool for SendNotification {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn admit(&self, parameters: &Map<String, Value>) -> Admission {
        let (send, target) = match self.resolve(parameters) {
            Ok(resolved) => resolved,
            Err(e) => return Admission::Deny(self.redact(e)),
        };
        match (self.approval, target) {
            (Approval::Never, _) => Admission::Run,
            (Approval::Always, _) => Admission::Hold {
                reason: "approval = \"always\": every send is held for a person".to_string(),
            },
            // A configured webhook name is its own allowlist (docs/design.md §8.6).
            (Approval::Unlisted, Target::Slack(_) | Target::Discord(_)) => Admission::Run,
            (Approval::Unlisted, Target::Email(address)) => {
                if self.allowed_recipients.iter().any(|a| a.matches(&address)) {
                    Admission::Run
                } else {
                    Admission::Hold {
                        reason: format!(
                            "recipient {} is not in allowed_recipients",
                            send.recipient
                        ),
                    }
                }
            }
        }
    }

    fn preview(&self, call: ToolCall<'_>) -> Value {
        let (send, target) = match self.resolve(call.parameters) {
            Ok(resolved) => resolved,
            Err(e) => {
                let e = self.redact(e);
                return json!({ "description": format!("would fail: {e}") });
            }
        };
        let would = match target {
            Target::Email(to) => self.email.preview(&call, to, send.subject, send.body),
            Target::Slack(hook) => json!({
                "description": format!("would POST this JSON to the Slack webhook `{}`", hook.name),
                "webhook": hook.name,
                "url": "[redacted: a configured secret]",
                "json": slack::payload(send.subject, send.body),
            }),
            Target::Discord(hook) => json!({
                "description": format!("would POST this JSON to the Discord webhook `{}` (?wait=true)", hook.name),
                "webhook": hook.name,
                "url": "[redacted: a configured secret]",
                "json": discord::payload(send.subject, send.body),
            }),
        };
        let text = would.to_string();
        let clean = self.redactor.redact(&text);
        if clean == text {
            would
        } else {
            serde_json::from_str(&clean).unwrap_or(Value::String(clean))
        }
    }

    fn run<'a>(&'a self, call: ToolCall<'a>) -> ToolFuture<'a> {
        Box::pin(async move {
            // The runner admitted this call already; resolving again costs nothing and keeps a
            // send to an unconfigured name impossible even if a caller skips `admit`.
            let (send, target) = self.resolve(call.parameters).map_err(|e| self.redact(e))?;
            tracing::info!(
                call_id = call.call_id,
                method = send.method.as_str(),
                recipient = send.recipient,
                "sending notification"
            );
            let outcome = match target {
                Target::Email(to) => self.email.send(&call, to, send.subject, send.body).await,
                Target::Slack(hook) => {
                    slack::post(&self.http, hook, send.subject, send.body, &call).await
                }
                Target::Discord(hook) => {
                    discord::post(&self.http, hook, send.subject, send.body, &call).await
                }
            };
            let message_id = outcome.map_err(|e| self.redact(e))?;
            Ok(ToolOutput {
                data: json!({ "success": true, "message_id": message_id }),
                summary: send.summary(),
                undo: None,
            })
        })
    }
}

impl crate::tools::builtin::BuiltinTool for SendNotification {
    type Raw = config::RawSendNotification;
    type Config = SendNotificationConfig;

    fn config(
        raw: Self::Raw,
        cx: &crate::config::table::TableContext,
    ) -> Result<SendNotificationConfig, crate::config::table::ConfigError> {
        SendNotificationConfig::from_raw(raw, cx)
    }

    fn describe(config: &SendNotificationConfig) -> Value {
        config.describe()
    }

    fn policy(config: &SendNotificationConfig) -> crate::tools::Policy {
        crate::tools::Policy {
            enabled: config.enabled,
            timeout: config.timeout,
            rate_limit: config.rate_limit,
            // The recipient rules are the tool's own `admit`.
            approval: None,
        }
    }

    fn build(
        config: &SendNotificationConfig,
        http: reqwest::Client,
    ) -> Result<SendNotification, RegistryError> {
        SendNotification::new(config, http)
    }
}

/// Where a send goes, once checked against the config.
enum Target<'t> {
    Email(lettre::Address),
    Slack(&'t Webhook),
    Discord(&'t Webhook),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Email,
    Slack,
    Discord,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Email => "email",
            Method::Slack => "slack",
            Method::Discord => "discord",
        }
    }
}

/// The parameters of one send, borrowed from the validated call.
#[derive(Debug, Clone, Copy)]
struct Send<'p> {
    method: Method,
    recipient: &'p str,
    subject: &'p str,
    body: &'p str,
}

impl<'p> Send<'p> {
    /// The schema has checked the shapes already; the errors here only guard against a
    /// caller that skipped validation.
    fn from_parameters(parameters: &'p Map<String, Value>) -> Result<Send<'p>, CallError> {
        let text = |key: &str| {
            parameters.get(key).and_then(Value::as_str).ok_or_else(|| {
                invalid_param(key, format!("`{key}` is required and must be a string"))
            })
        };
        let method = match parameters.get("method").map(|m| m.as_str()) {
            None | Some(Some("email")) => Method::Email,
            Some(Some("slack")) => Method::Slack,
            Some(Some("discord")) => Method::Discord,
            Some(_) => {
                return Err(invalid_param(
                    "method",
                    "`method` must be one of email, slack, discord".to_string(),
                ));
            }
        };
        Ok(Send {
            method,
            recipient: text("recipient")?,
            subject: text("subject")?,
            body: text("body")?,
        })
    }

    /// The callout title: "email to bob@x.org", "slack ops", "discord alerts".
    fn summary(&self) -> String {
        match self.method {
            Method::Email => format!("email to {}", self.recipient),
            Method::Slack | Method::Discord => {
                format!("{} {}", self.method.as_str(), self.recipient)
            }
        }
    }
}

fn invalid_param(key: &str, message: String) -> CallError {
    CallError::new(ErrorCode::InvalidParams, message.clone()).with_details(json!({
        "violations": [ { "pointer": format!("/{key}"), "message": message } ]
    }))
}

fn parse_address(recipient: &str) -> Result<lettre::Address, CallError> {
    recipient.parse::<lettre::Address>().map_err(|e| {
        invalid_param(
            "recipient",
            format!(
                "recipient `{recipient}` is not an email address ({e}); write the bare address, like bob@example.org"
            ),
        )
    })
}

/// One `allowed_recipients` entry (the config has checked its shape).
#[derive(Debug, Clone, PartialEq, Eq)]
enum AllowedRecipient {
    /// An exact address, compared case-insensitively.
    Address(String),
    /// `*@domain`: that domain exactly, case-insensitively, not its subdomains (docs/design.md §8.6).
    Domain(String),
}

impl AllowedRecipient {
    fn parse(entry: &str) -> AllowedRecipient {
        match entry.strip_prefix("*@") {
            Some(domain) => AllowedRecipient::Domain(domain.to_string()),
            None => AllowedRecipient::Address(entry.to_string()),
        }
    }

    fn matches(&self, address: &lettre::Address) -> bool {
        match self {
            AllowedRecipient::Address(a) => a.eq_ignore_ascii_case(address.as_ref()),
            AllowedRecipient::Domain(d) => d.eq_ignore_ascii_case(address.domain()),
        }
    }
}

/// A configured webhook: the name notes use and the secret URL they never see.
struct Webhook {
    /// `slack` or `discord`, for messages.
    kind: &'static str,
    name: String,
    url: reqwest::Url,
}

/// The webhooks of one method, by name.
struct Webhooks {
    kind: &'static str,
    hooks: BTreeMap<String, Webhook>,
}

impl Webhooks {
    fn new(
        kind: &'static str,
        config: &BTreeMap<String, Secret>,
    ) -> Result<Webhooks, RegistryError> {
        let mut hooks = BTreeMap::new();
        for (name, secret) in config {
            if !secret.is_resolved() {
                // Loaded for a command that runs no tool (`status`): nothing to check or send.
                continue;
            }
            // The parse error never quotes the URL; the reference is safe to print.
            let setup = |why: String| RegistryError::Setup {
                tool: TOOL.to_string(),
                message: format!("{kind} webhook `{name}` ({}) {why}", secret.reference()),
            };
            let url = reqwest::Url::parse(secret.expose()).map_err(|e| {
                RegistryError::SetupFailed {
                    tool: TOOL.to_string(),
                    message: format!("{kind} webhook `{name}` ({}) is not a URL", secret.reference()),
                    source: Box::new(e),
                }
            })?;
            if !matches!(url.scheme(), "https" | "http") {
                return Err(setup("must be an https:// (or http://) URL".to_string()));
            }
            // The URL is the credential: it never crosses an unencrypted connection to
            // another machine (docs/design.md §8.12).
            if url.scheme() == "http" && !url.host_str().is_some_and(crate::tools::http::is_loopback_host) {
                return Err(setup(
                    "must be an https:// URL (plain http:// is allowed only to a loopback address)"
                        .to_string(),
                ));
            }
            hooks.insert(
                name.clone(),
                Webhook {
                    kind,
                    name: name.clone(),
                    url,
                },
            );
        }
        Ok(Webhooks { kind, hooks })
    }

    /// The webhook a note names, or POLICY_DENIED listing the names (never the URLs).
    fn get(&self, name: &str) -> Result<&Webhook, CallError> {
        self.hooks.get(name).ok_or_else(|| {
            let configured = if self.hooks.is_empty() {
                "none are configured".to_string()
            } else {
                format!(
                    "configured: {}",
                    self.hooks.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            };
            CallError::new(
                ErrorCode::PolicyDenied,
                format!(
                    "no {} webhook named `{name}` is configured ({configured})",
                    self.kind
                ),
            )
        })
    }
}

/// Webhook posts: how a failed request reads, without its URL (webhook URLs are secrets).
fn request_error(hook: &Webhook, error: reqwest::Error) -> CallError {
    let error = error.without_url();
    let kind = capitalized(hook.kind);
    if error.is_timeout() {
        return CallError::new(
            ErrorCode::Timeout,
            format!(
                "{kind} webhook `{}` did not answer before the call's deadline; the message may or may not have been posted",
                hook.name
            ),
        );
    }
    // A connection that failed or broke is worth retrying (docs/design.md §8.4). A request that could
    // not be built, or a TLS handshake that failed (the TLS layer reports invalid data, e.g.
    // an untrusted certificate), fails the same way next time.
    let retryable =
        !error.is_builder() && io_error_kind(&error) != Some(std::io::ErrorKind::InvalidData);
    CallError::new(
        ErrorCode::ExecutionError,
        format!(
            "{kind} webhook `{}` could not be reached: {}",
            hook.name,
            root_cause(&error)
        ),
    )
    .retryable(retryable)
}

/// A non-success HTTP answer: "Slack webhook `ops` answered 404: no_service".
fn status_error(hook: &Webhook, status: reqwest::StatusCode, detail: &str) -> CallError {
    let retryable = status == reqwest::StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
    let detail = detail.trim();
    let message = if detail.is_empty() {
        format!(
            "{} webhook `{}` answered {}",
            capitalized(hook.kind),
            hook.name,
            status.as_u16()
        )
    } else {
        format!(
            "{} webhook `{}` answered {}: {}",
            capitalized(hook.kind),
            hook.name,
            status.as_u16(),
            truncate_chars(detail, 300)
        )
    };
    CallError::new(ErrorCode::ExecutionError, message).retryable(retryable)
}

/// Webhooks retry only a 429 (a 5xx may already have posted), waiting exactly what the server
/// asks (no backoff of our own), at most four attempts, and only when the wait leaves room
/// for the request before the deadline.
const WEBHOOK_BACKOFF: Backoff = Backoff {
    base: Duration::ZERO,
    max: Duration::ZERO,
    max_attempts: 4,
    min_attempt_time: Duration::from_millis(200),
};

/// The time left before the deadline, or TIMEOUT when none is.
fn time_left(hook: &Webhook, deadline: Instant) -> Result<Duration, CallError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(CallError::new(
            ErrorCode::Timeout,
            format!(
                "{} webhook `{}`: the call's deadline passed before the message could be posted",
                capitalized(hook.kind),
                hook.name
            ),
        ));
    }
    Ok(left)
}

/// The innermost error, which says what happened ("Connection refused (os error 111)");
/// the outer layers only repeat it ("Connection error: Connection error: …").
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut last = error;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

/// The kind of the first I/O error in the chain, if any.
fn io_error_kind(error: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        next = e.source();
    }
    None
}

fn capitalized(kind: &str) -> String {
    let mut chars = kind.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// What the tests of every method share: a config, a tool, a call, the secret checks.
#[cfg(test)]
mod tests_support {
    use super::SendNotification;
    use super::{Approval, EmailConfig, EmailTransport, SendNotificationConfig};
    use crate::call::{CallError, ToolOutput};
    use crate::config::table::RateLimit;
    use crate::secret::Secret;
    use crate::tools::{Tool, ToolCall};
    use serde_json::{Map, Value, json};
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    /// Approval `never`, no webhooks, the file transport into a folder no test writes to
    /// unless it says so.
    pub fn base_config() -> SendNotificationConfig {
        SendNotificationConfig {
            enabled: true,
            approval: Approval::Never,
            allowed_recipients: Vec::new(),
            timeout: Duration::from_secs(10),
            rate_limit: RateLimit::default(),
            email: EmailConfig {
                transport: EmailTransport::File {
                    outbox: std::env::temp_dir().join("vaultd-notify-tests-unused-outbox"),
                },
                from: "Vault Agent <agent@example.com>".into(),
                message_id_host: "vault.test".into(),
            },
            slack: BTreeMap::new(),
            discord: BTreeMap::new(),
        }
    }

    pub fn secret(value: &str) -> Secret {
        Secret::literal("env:TEST_SECRET", value)
    }

    pub fn tool(config: &SendNotificationConfig) -> SendNotification {
        SendNotification::new(config, reqwest::Client::new()).expect("test config is valid")
    }

    pub fn params(method: &str, recipient: &str, subject: &str, body: &str) -> Map<String, Value> {
        let Value::Object(map) = json!({
            "method": method, "recipient": recipient, "subject": subject, "body": body
        }) else {
            unreachable!()
        };
        map
    }

    pub fn email_params(recipient: &str, subject: &str, body: &str) -> Map<String, Value> {
        let mut p = params("email", recipient, subject, body);
        // `email` is the default: leave it out, as most notes will.
        p.remove("method");
        p
    }

    pub fn slack_params(name: &str, subject: &str, body: &str) -> Map<String, Value> {
        params("slack", name, subject, body)
    }

    pub fn discord_params(name: &str, subject: &str, body: &str) -> Map<String, Value> {
        params("discord", name, subject, body)
    }

    /// Runs one call with a 10 s deadline.
    pub async fn run(
        tool: &SendNotification,
        call_id: &str,
        parameters: Map<String, Value>,
    ) -> Result<ToolOutput, CallError> {
        tool.run(ToolCall {
            note: "Needs_Action/test.md",
            note_id: "n-000000000001",
            call_id,
            parameters: &parameters,
            deadline: Instant::now() + Duration::from_secs(10),
            answer: None,
        })
        .await
    }

    /// The webhook URL is a secret: neither it nor its token path may show.
    pub fn assert_no_url(message: &str, base: &str, token_path: &str) {
        assert!(!message.contains(base), "{message}");
        assert!(!message.contains(token_path), "{message}");
        let token = token_path
            .rsplit('/')
            .next()
            .expect("a path has a last part");
        assert!(!message.contains(token), "{message}");
    }

    /// A loopback URL where nothing listens.
    pub fn closed_port_uri() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("bound").port();
        drop(listener);
        format!("http://127.0.0.1:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;
    use crate::tools::Admission;

    fn config(approval: Approval) -> SendNotificationConfig {
        let mut c = base_config();
        c.approval = approval;
        c.allowed_recipients = vec!["me@example.com".into(), "*@example.org".into()];
        c.slack.insert(
            "ops".into(),
            secret("https://hooks.slack.com/services/T0/B0/SECRETSLACK"),
        );
        c.slack.insert(
            "dev".into(),
            secret("https://hooks.slack.com/services/T0/B1/SECRETDEV"),
        );
        c.discord.insert(
            "alerts".into(),
            secret("https://discord.com/api/webhooks/1/SECRETDISCORD"),
        );
        c
    }

    fn admit(approval: Approval, p: Map<String, Value>) -> Admission {
        tool(&config(approval)).admit(&p)
    }

    fn held(reason: &str) -> Admission {
        Admission::Hold {
            reason: reason.to_string(),
        }
    }

    const ALWAYS: &str = "approval = \"always\": every send is held for a person";

    #[test]
    fn never_runs_every_valid_send() {
        assert_eq!(
            admit(Approval::Never, email_params("bob@x.org", "s", "b")),
            Admission::Run
        );
        assert_eq!(
            admit(Approval::Never, slack_params("ops", "s", "b")),
            Admission::Run
        );
        assert_eq!(
            admit(Approval::Never, discord_params("alerts", "s", "b")),
            Admission::Run
        );
    }

    #[test]
    fn always_holds_every_send() {
        assert_eq!(
            admit(Approval::Always, email_params("me@example.com", "s", "b")),
            held(ALWAYS)
        );
        assert_eq!(
            admit(Approval::Always, slack_params("ops", "s", "b")),
            held(ALWAYS)
        );
        assert_eq!(
            admit(Approval::Always, discord_params("alerts", "s", "b")),
            held(ALWAYS)
        );
    }

    #[test]
    fn unlisted_runs_listed_emails_and_configured_webhooks() {
        assert_eq!(
            admit(Approval::Unlisted, email_params("me@example.com", "s", "b")),
            Admission::Run
        );
        assert_eq!(
            admit(Approval::Unlisted, email_params("ME@Example.COM", "s", "b")),
            Admission::Run
        );
        assert_eq!(
            admit(Approval::Unlisted, slack_params("ops", "s", "b")),
            Admission::Run
        );
        assert_eq!(
            admit(Approval::Unlisted, discord_params("alerts", "s", "b")),
            Admission::Run
        );
        assert_eq!(
            admit(Approval::Unlisted, email_params("bob@x.org", "s", "b")),
            held("recipient bob@x.org is not in allowed_recipients")
        );
    }

    #[test]
    fn a_domain_entry_matches_that_domain_only() {
        assert_eq!(
            admit(Approval::Unlisted, email_params("A@Example.ORG", "s", "b")),
            Admission::Run
        );
        assert_eq!(
            admit(
                Approval::Unlisted,
                email_params("a@sub.example.org", "s", "b")
            ),
            held("recipient a@sub.example.org is not in allowed_recipients")
        );
        assert_eq!(
            admit(
                Approval::Unlisted,
                email_params("a@example.org.evil.com", "s", "b")
            ),
            held("recipient a@example.org.evil.com is not in allowed_recipients")
        );
        // An exact entry is not a domain entry.
        assert_eq!(
            admit(
                Approval::Unlisted,
                email_params("you@example.com", "s", "b")
            ),
            held("recipient you@example.com is not in allowed_recipients")
        );
    }

    fn denied(a: Admission) -> CallError {
        match a {
            Admission::Deny(e) => e,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[test]
    fn unknown_webhook_names_are_denied_in_every_mode() {
        for approval in [Approval::Never, Approval::Unlisted, Approval::Always] {
            let e = denied(admit(approval, slack_params("ceo", "s", "b")));
            assert_eq!(e.code, ErrorCode::PolicyDenied);
            assert_eq!(
                e.message,
                "no slack webhook named `ceo` is configured (configured: dev, ops)"
            );
            let e = denied(admit(approval, discord_params("ops", "s", "b")));
            assert_eq!(e.code, ErrorCode::PolicyDenied);
            assert_eq!(
                e.message,
                "no discord webhook named `ops` is configured (configured: alerts)"
            );
        }
    }

    #[test]
    fn a_url_as_recipient_is_denied_without_printing_configured_urls() {
        let e = denied(admit(
            Approval::Never,
            slack_params("https://hooks.slack.com/services/T0/B9/OTHER", "s", "b"),
        ));
        assert_eq!(e.code, ErrorCode::PolicyDenied);
        assert!(!e.message.contains("SECRET"), "{}", e.message);
        // Even the configured URL itself, written into a note, is only a name that does not exist.
        let e = denied(admit(
            Approval::Never,
            slack_params(
                "https://hooks.slack.com/services/T0/B0/SECRETSLACK",
                "s",
                "b",
            ),
        ));
        assert_eq!(e.code, ErrorCode::PolicyDenied);
        assert!(!e.message.contains("SECRETSLACK"), "{}", e.message);
    }

    #[test]
    fn no_webhooks_configured_says_so() {
        let e = denied(tool(&base_config()).admit(&discord_params("alerts", "s", "b")));
        assert_eq!(
            e.message,
            "no discord webhook named `alerts` is configured (none are configured)"
        );
    }

    #[test]
    fn a_bad_address_is_invalid_params() {
        for approval in [Approval::Never, Approval::Unlisted, Approval::Always] {
            for bad in ["bob", "bob@", "Bob <bob@x.org>", "a b@x.org"] {
                let e = denied(admit(approval, email_params(bad, "s", "b")));
                assert_eq!(e.code, ErrorCode::InvalidParams, "{bad}");
                assert!(
                    e.message.contains("is not an email address"),
                    "{}",
                    e.message
                );
                assert_eq!(
                    e.details.as_ref().unwrap()["violations"][0]["pointer"],
                    "/recipient"
                );
            }
        }
    }

    #[test]
    fn summaries_name_the_recipient() {
        let p = email_params("bob@x.org", "s", "b");
        assert_eq!(
            Send::from_parameters(&p).unwrap().summary(),
            "email to bob@x.org"
        );
        let p = slack_params("ops", "s", "b");
        assert_eq!(Send::from_parameters(&p).unwrap().summary(), "slack ops");
    }

    #[test]
    fn plain_http_webhooks_are_refused_unless_loopback() {
        let mut c = base_config();
        c.slack.insert(
            "ops".into(),
            secret("http://hooks.example.com/services/T0/B0/SECRETVALUE"),
        );
        let err = SendNotification::new(&c, reqwest::Client::new())
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("loopback"), "{err}");
        assert!(!err.contains("SECRETVALUE"), "{err}");
        for ok in [
            "http://127.0.0.1:9/services/T0/B0/SECRETVALUE",
            "http://[::1]:9/services/T0/B0/SECRETVALUE",
            "http://localhost:9/services/T0/B0/SECRETVALUE",
            "https://hooks.example.com/services/T0/B0/SECRETVALUE",
        ] {
            let mut c = base_config();
            c.discord.insert("alerts".into(), secret(ok));
            assert!(
                SendNotification::new(&c, reqwest::Client::new()).is_ok(),
                "{ok}"
            );
        }
    }

    #[test]
    fn webhook_urls_must_be_urls_and_the_error_shows_only_the_reference() {
        let mut c = base_config();
        c.slack
            .insert("ops".into(), secret("not a url SECRETVALUE"));
        let err = SendNotification::new(&c, reqwest::Client::new())
            .err()
            .expect("refused");
        let text = err.to_string();
        assert!(text.contains("env:TEST_SECRET"), "{text}");
        assert!(!text.contains("SECRETVALUE"), "{text}");
    }
}
