//! `[tools.send_notification]` and its `email`, `slack`, `discord` tables: as written (serde
//! enums, humantime durations, unknown keys refused) and validated into
//! [`SendNotificationConfig`], with the secrets it names (SMTP password, webhook URLs) and
//! what `vaultd config` shows of it.

use crate::config::table::{ApprovalVia, ConfigError, RateLimit, RawRateLimit, TableContext};
use crate::secret::{Secret, SecretHolder};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

const KEY: &str = "tools.send_notification";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_RATE_LIMIT: RateLimit = RateLimit {
    per_hour: Some(20),
    per_day: Some(100),
};

/// `[tools.send_notification]` exactly as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSendNotification {
    pub enabled: Option<bool>,
    pub approval: Option<Approval>,
    /// The old spelling of the top-level `approval_via`: still read (by `config`), with a
    /// warning naming its line.
    pub approval_via: Option<toml::Spanned<ApprovalVia>>,
    pub allowed_recipients: Option<Vec<String>>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    pub rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    pub email: RawEmail,
    #[serde(default)]
    pub slack: RawWebhooks,
    #[serde(default)]
    pub discord: RawWebhooks,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEmail {
    pub transport: Option<RawTransport>,
    pub outbox: Option<String>,
    pub smtp_url: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub from: Option<String>,
    /// STARTTLS policy for smtp:// URLs.
    pub starttls: Option<StartTls>,
    /// Host name used in `Message-ID: <call_id@host>`; defaults to the machine's host name.
    pub message_id_host: Option<String>,
}

/// `transport`: which of the email keys apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RawTransport {
    File,
    Smtp,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWebhooks {
    /// Name (what a note writes as `recipient`) -> secret reference of the URL.
    #[serde(default)]
    pub webhooks: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Approval {
    Never,
    #[default]
    Unlisted,
    Always,
}

impl Approval {
    pub fn as_str(self) -> &'static str {
        match self {
            Approval::Never => "never",
            Approval::Unlisted => "unlisted",
            Approval::Always => "always",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartTls {
    #[default]
    Opportunistic,
    Required,
}

impl StartTls {
    pub fn as_str(self) -> &'static str {
        match self {
            StartTls::Opportunistic => "opportunistic",
            StartTls::Required => "required",
        }
    }
}

/// `send_notification`'s settings, validated and with every secret resolved.
#[derive(Debug, Clone)]
pub struct SendNotificationConfig {
    pub enabled: bool,
    pub approval: Approval,
    pub allowed_recipients: Vec<String>,
    pub timeout: Duration,
    pub rate_limit: RateLimit,
    pub email: EmailConfig,
    /// Slack incoming-webhook URLs by the name a note uses as `recipient`.
    pub slack: BTreeMap<String, Secret>,
    /// Discord webhook URLs by name.
    pub discord: BTreeMap<String, Secret>,
}

#[derive(Debug, Clone)]
pub enum EmailTransport {
    /// Write `.eml` files into this folder: the default, so a fresh install sends nothing.
    File { outbox: PathBuf },
    Smtp {
        /// `smtp://host[:port]` or `smtps://host[:port]`, without credentials.
        url: String,
        starttls: StartTls,
        username: Option<String>,
        password: Option<Secret>,
    },
}

#[derive(Debug, Clone)]
pub struct EmailConfig {
    pub transport: EmailTransport,
    pub from: String,
    pub message_id_host: String,
}

impl SendNotificationConfig {
    pub fn from_raw(
        raw: RawSendNotification,
        cx: &TableContext,
    ) -> Result<SendNotificationConfig, ConfigError> {
        let allowed_recipients = raw.allowed_recipients.unwrap_or_default();
        for r in &allowed_recipients {
            let ok = match r.strip_prefix("*@") {
                Some(domain) => !domain.is_empty() && !domain.contains('@'),
                None => r.contains('@'),
            };
            if !ok {
                return Err(cx.invalid(
                    &format!("{KEY}.allowed_recipients"),
                    format!("`{r}` is neither an address nor `*@domain`"),
                ));
            }
        }
        let webhooks = |kind: &str, raw: &RawWebhooks| {
            raw.webhooks
                .iter()
                .map(|(name, r)| {
                    let secret = cx.secret(&format!("{KEY}.{kind}.webhooks.{name}"), r)?;
                    Ok((name.clone(), secret))
                })
                .collect::<Result<BTreeMap<_, _>, ConfigError>>()
        };
        Ok(SendNotificationConfig {
            enabled: raw.enabled.unwrap_or(true),
            approval: raw.approval.unwrap_or_default(),
            allowed_recipients,
            timeout: raw.timeout.unwrap_or(DEFAULT_TIMEOUT),
            rate_limit: RateLimit::from_raw(raw.rate_limit, DEFAULT_RATE_LIMIT),
            email: EmailConfig::from_raw(raw.email, cx)?,
            slack: webhooks("slack", &raw.slack)?,
            discord: webhooks("discord", &raw.discord)?,
        })
    }

    /// What `vaultd config` shows: every secret as its reference only.
    pub fn describe(&self) -> Value {
        let hooks = |m: &BTreeMap<String, Secret>| {
            Value::Object(
                m.iter()
                    .map(|(k, v)| (k.clone(), json!(format!("{} [redacted]", v.reference()))))
                    .collect(),
            )
        };
        let mut email = match &self.email.transport {
            EmailTransport::File { outbox } => {
                json!({ "transport": "file", "outbox": outbox.display().to_string() })
            }
            EmailTransport::Smtp {
                url,
                starttls,
                username,
                password,
            } => json!({
                "transport": "smtp", "smtp_url": url,
                "starttls": starttls.as_str(),
                "username": username,
                "password": password.as_ref().map(|p| format!("{} [redacted]", p.reference())),
            }),
        };
        email["from"] = json!(self.email.from);
        json!({
            "enabled": self.enabled,
            "approval": self.approval.as_str(),
            "allowed_recipients": self.allowed_recipients,
            "timeout": humantime::format_duration(self.timeout).to_string(),
            "rate_limit": self.rate_limit.describe(),
            "email": email,
            "slack": { "webhooks": hooks(&self.slack) },
            "discord": { "webhooks": hooks(&self.discord) },
        })
    }
}

impl SecretHolder for SendNotificationConfig {
    fn secrets(&self) -> Vec<&Secret> {
        let mut secrets: Vec<&Secret> = self.slack.values().chain(self.discord.values()).collect();
        if let EmailTransport::Smtp { password, .. } = &self.email.transport {
            secrets.extend(password.iter());
        }
        secrets
    }

    fn usernames(&self) -> Vec<&str> {
        match &self.email.transport {
            EmailTransport::Smtp { username, .. } => username.iter().map(String::as_str).collect(),
            EmailTransport::File { .. } => Vec::new(),
        }
    }
}

impl EmailConfig {
    fn from_raw(e: RawEmail, cx: &TableContext) -> Result<EmailConfig, ConfigError> {
        let key = |k: &str| format!("{KEY}.email.{k}");
        let transport = match e.transport.unwrap_or(RawTransport::File) {
            RawTransport::File => EmailTransport::File {
                outbox: e
                    .outbox
                    .as_deref()
                    .map(|p| cx.path(p))
                    .unwrap_or_else(|| cx.state_dir.join("outbox")),
            },
            RawTransport::Smtp => {
                let Some(url) = e.smtp_url.clone() else {
                    return Err(cx.invalid(
                        &key("smtp_url"),
                        "transport = \"smtp\" needs smtp_url = \"smtp://host:port\" or \"smtps://host:port\"",
                    ));
                };
                let parsed = reqwest::Url::parse(&url).map_err(|err| {
                    cx.invalid(&key("smtp_url"), format!("`{url}` is not a URL: {err}"))
                })?;
                if !matches!(parsed.scheme(), "smtp" | "smtps") || parsed.host_str().is_none() {
                    return Err(cx.invalid(
                        &key("smtp_url"),
                        format!("`{url}` must be smtp://host[:port] or smtps://host[:port]"),
                    ));
                }
                if !parsed.username().is_empty() || parsed.password().is_some() {
                    return Err(cx.invalid(
                        &key("smtp_url"),
                        "put credentials in `username` and `password` (a secret reference), not in the URL",
                    ));
                }
                let password = match &e.password {
                    Some(r) => Some(cx.secret(&key("password"), r)?),
                    None => None,
                };
                EmailTransport::Smtp {
                    url,
                    starttls: e.starttls.unwrap_or_default(),
                    username: e.username.clone(),
                    password,
                }
            }
        };
        let from = e
            .from
            .clone()
            .unwrap_or_else(|| "vaultd <vaultd@localhost>".to_string());
        if from.parse::<lettre::message::Mailbox>().is_err() {
            return Err(cx.invalid(
                &key("from"),
                format!("`{from}` is not a mailbox like \"Name <a@b.org>\""),
            ));
        }
        Ok(EmailConfig {
            transport,
            from,
            message_id_host: e.message_id_host.clone().unwrap_or_else(local_hostname),
        })
    }
}

fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}
