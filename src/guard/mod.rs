//! Guardrails for agent loops left alone (docs/design.md §12): dry run previews ([`dry_run`]), the
//! per-note call budget ([`budget`]), circuit breakers per tool or MCP server ([`breaker`]),
//! alerts when a note is held ([`hold_alert`]) and escaping of untrusted text ([`text`]).
//! This file reads their config keys: `note_budget`, `[notify]`, `[circuit_breaker]`.

pub mod breaker;
pub mod budget;
pub mod dry_run;
pub mod hold_alert;

use crate::config::table::ConfigError;
use crate::tools::builtin::send_notification::SendNotificationConfig;
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

/// `[notify]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNotify {
    pub on_hold: Option<RawOnHold>,
    /// At most this many hold alerts per hour (default 20); the rest are logged only.
    pub on_hold_per_hour: Option<u32>,
}

/// `on_hold = { method = "slack", recipient = "ops" }`, or just an email address.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawOnHold {
    Address(String),
    Table(RawHoldAlert),
}

/// `on_hold = { method = "slack", recipient = "ops" }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHoldAlert {
    pub method: Option<String>,
    pub recipient: Option<String>,
}

/// `[circuit_breaker]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCircuitBreaker {
    /// Consecutive retryable failures that open a circuit (default 5).
    pub failures: Option<u32>,
    /// How long an open circuit fails calls at once (default "60s").
    #[serde(default, with = "humantime_serde")]
    pub open_for: Option<Duration>,
}

/// The validated guardrail settings.
#[derive(Debug, Clone)]
pub struct GuardConfig {
    /// At most this many calls ever run for one note, across rounds (docs/design.md §12.2).
    pub note_budget: u64,
    /// Where a message goes when a note is held; `None` sends nothing.
    pub on_hold: Option<HoldAlertConfig>,
    pub on_hold_per_hour: u32,
    pub breaker: BreakerConfig,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldAlertConfig {
    /// `email`, `slack` or `discord`: a send_notification method.
    pub method: String,
    /// An email address, or the name of a configured webhook.
    pub recipient: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    pub failures: u32,
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures: 5,
            open_for: Duration::from_secs(60),
        }
    }
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            note_budget: 100,
            on_hold: None,
            on_hold_per_hour: 20,
            breaker: BreakerConfig::default(),
        }
    }
}

/// Validates the guardrail keys. A hold alert must name a method and a recipient that
/// send_notification can reach: a configured webhook name, or an email address.
pub fn config_from_raw(
    note_budget: Option<u64>,
    notify: RawNotify,
    breaker: RawCircuitBreaker,
    send: &SendNotificationConfig,
    path: &Path,
) -> Result<GuardConfig, ConfigError> {
    let invalid = |key: &str, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        key: key.to_string(),
        message,
    };
    let d = GuardConfig::default();
    let note_budget = note_budget.unwrap_or(d.note_budget);
    if note_budget == 0 {
        return Err(invalid("note_budget", "must be at least 1".into()));
    }
    let on_hold = match notify.on_hold {
        None => None,
        Some(on_hold) => {
            let raw = match on_hold {
                RawOnHold::Address(address) => RawHoldAlert {
                    method: None,
                    recipient: Some(address),
                },
                RawOnHold::Table(table) => table,
            };
            let Some(recipient) = raw.recipient.filter(|r| !r.trim().is_empty()) else {
                return Err(invalid(
                    "notify.on_hold.recipient",
                    "give the webhook name or email address the alert goes to".into(),
                ));
            };
            let method = raw.method.unwrap_or_else(|| "email".to_string());
            let configured = match method.as_str() {
                "email" => {
                    if recipient.parse::<lettre::Address>().is_err() {
                        return Err(invalid(
                            "notify.on_hold.recipient",
                            format!("`{recipient}` is not an email address"),
                        ));
                    }
                    true
                }
                "slack" => send.slack.contains_key(&recipient),
                "discord" => send.discord.contains_key(&recipient),
                other => {
                    return Err(invalid(
                        "notify.on_hold.method",
                        format!("`{other}` is not one of email, slack, discord"),
                    ));
                }
            };
            if !configured {
                return Err(invalid(
                    "notify.on_hold.recipient",
                    format!(
                        "no {method} webhook named `{recipient}`: add it under [tools.send_notification.{method}.webhooks]"
                    ),
                ));
            }
            Some(HoldAlertConfig { method, recipient })
        }
    };
    let on_hold_per_hour = notify.on_hold_per_hour.unwrap_or(d.on_hold_per_hour);
    let failures = breaker.failures.unwrap_or(d.breaker.failures);
    if failures == 0 {
        return Err(invalid(
            "circuit_breaker.failures",
            "must be at least 1".into(),
        ));
    }
    let open_for = breaker.open_for.unwrap_or(d.breaker.open_for);
    Ok(GuardConfig {
        note_budget,
        on_hold,
        on_hold_per_hour,
        breaker: BreakerConfig { failures, open_for },
    })
}

#[cfg(test)]
mod tests {
    use crate::config::{Overrides, from_raw, parse_raw};
    use std::path::PathBuf;

    fn load(text: &str) -> Result<crate::config::Config, crate::config::ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = PathBuf::from("test.toml");
        from_raw(
            parse_raw(text, &path)?,
            Some(path),
            &Overrides {
                vault: Some(dir.path().to_path_buf()),
                ..Default::default()
            },
        )
    }

    #[test]
    fn defaults_match_the_design() {
        let c = load("").unwrap();
        assert_eq!(c.guard.note_budget, 100);
        assert_eq!(c.guard.breaker.failures, 5);
        assert_eq!(c.guard.breaker.open_for, std::time::Duration::from_secs(60));
        assert!(c.guard.on_hold.is_none());
        assert_eq!(c.folders.dry_run, "Dry_Run");
    }

    #[test]
    fn on_hold_takes_a_table_or_an_address() {
        let c = load("[notify]\non_hold = \"ops@example.com\"\n").unwrap();
        let h = c.guard.on_hold.unwrap();
        assert_eq!(
            (h.method.as_str(), h.recipient.as_str()),
            ("email", "ops@example.com")
        );
        let c =
            load("[notify]\non_hold = { method = \"email\", recipient = \"a@b.org\" }\n").unwrap();
        assert_eq!(c.guard.on_hold.unwrap().recipient, "a@b.org");
    }

    #[test]
    fn bad_guard_keys_name_the_key() {
        for (text, key) in [
            ("note_budget = 0\n", "note_budget"),
            (
                "[notify]\non_hold = \"not an address\"\n",
                "notify.on_hold.recipient",
            ),
            (
                "[notify]\non_hold = { method = \"pager\", recipient = \"x\" }\n",
                "notify.on_hold.method",
            ),
            (
                "[notify]\non_hold = { method = \"discord\", recipient = \"x\" }\n",
                "notify.on_hold.recipient",
            ),
            (
                "[circuit_breaker]\nopen_for = \"soon\"\n",
                "circuit_breaker.open_for",
            ),
            (
                "[circuit_breaker]\nfailures = 0\n",
                "circuit_breaker.failures",
            ),
            ("[folders]\ndry_run = \"Done\"\n", "folders.dry_run"),
        ] {
            let err = load(text).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
    }
}
