//! Hold alerts (docs/design.md §12.4): when a note is held for approval, one message naming the
//! note, what is held and how to approve goes out through send_notification's own transports
//! (`[notify] on_hold`). Never held itself, at most `on_hold_per_hour`, sent once per hold
//! (a rescan does not repeat it); a failure is logged and never touches the note.

use crate::guard::HoldAlertConfig;
use crate::tools::{Registry, ToolCall};
use serde_json::{Map, json};
use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One held call, as the alert lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSummary {
    pub call_id: String,
    pub name: String,
    pub reason: String,
}

pub struct HoldAlerts {
    config: Option<HoldAlertConfig>,
    per_hour: u32,
    /// When recent alerts went out, for the hourly cap.
    sent: Mutex<VecDeque<Instant>>,
    /// Holds already alerted: the note and its held call ids.
    alerted: Mutex<HashSet<(String, Vec<String>)>>,
}

/// What became of one alert (logged; returned for tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlertOutcome {
    NotConfigured,
    AlreadySent,
    RateLimited,
    Sent,
    Failed(String),
}

impl HoldAlerts {
    pub fn new(config: Option<HoldAlertConfig>, per_hour: u32) -> HoldAlerts {
        HoldAlerts {
            config,
            per_hour,
            sent: Mutex::new(VecDeque::new()),
            alerted: Mutex::new(HashSet::new()),
        }
    }

    /// Sends the alert for a note whose calls were just held (`note` is its vault-relative
    /// path in Pending_Approval/, `how_to_decide` the sentence the `[!question]` ends with).
    pub async fn note_held(
        &self,
        registry: &Registry,
        note: &str,
        held: &[HeldSummary],
        how_to_decide: &str,
    ) -> AlertOutcome {
        let Some(config) = &self.config else {
            return AlertOutcome::NotConfigured;
        };
        if held.is_empty() {
            return AlertOutcome::AlreadySent;
        }
        let mut ids: Vec<String> = held.iter().map(|h| h.call_id.clone()).collect();
        ids.sort();
        let key = (note.to_string(), ids.clone());
        if !self
            .alerted
            .lock()
            .expect("alert lock poisoned")
            .insert(key.clone())
        {
            return AlertOutcome::AlreadySent;
        }
        if !self.take_slot() {
            tracing::warn!(
                note,
                "hold alert not sent: {} alerts went out in the last hour (notify.on_hold_per_hour)",
                self.per_hour
            );
            return AlertOutcome::RateLimited;
        }
        let mut id_input = Map::new();
        id_input.insert("note".into(), json!(note));
        id_input.insert("calls".into(), json!(ids));
        let call_id = format!(
            "hold-{}",
            &crate::note::params_hash("hold_alert", &id_input)[..12]
        );
        let subject = format!("vaultd: {note} waits for approval");
        let outcome = send(
            registry,
            config,
            &call_id,
            note,
            subject,
            body(note, held, how_to_decide),
        )
        .await;
        match &outcome {
            AlertOutcome::Sent => tracing::info!(
                note,
                method = config.method,
                recipient = config.recipient,
                "hold alert sent"
            ),
            AlertOutcome::Failed(why) => tracing::error!(
                note,
                method = config.method,
                recipient = config.recipient,
                "hold alert failed (the note is unaffected): {why}"
            ),
            _ => {}
        }
        outcome
    }

    /// A daemon that paused because a second runner works on the vault (docs/design.md §9.9) says so
    /// through the same channel, once per pause (a pause lasts until a restart), within the
    /// hourly cap.
    pub async fn second_runner(
        &self,
        registry: &Registry,
        note: &str,
        message: &str,
    ) -> AlertOutcome {
        let Some(config) = &self.config else {
            return AlertOutcome::NotConfigured;
        };
        if !self.take_slot() {
            tracing::warn!(
                "second-runner alert not sent: {} alerts went out in the last hour (notify.on_hold_per_hour)",
                self.per_hour
            );
            return AlertOutcome::RateLimited;
        }
        let mut id_input = Map::new();
        id_input.insert("note".into(), json!(note));
        let call_id = format!(
            "runner-{}",
            &crate::note::params_hash("second_runner", &id_input)[..12]
        );
        let outcome = send(
            registry,
            config,
            &call_id,
            note,
            "vaultd paused: a second runner works on this vault".to_string(),
            message.to_string(),
        )
        .await;
        match &outcome {
            AlertOutcome::Sent => tracing::info!(
                method = config.method,
                recipient = config.recipient,
                "second-runner alert sent"
            ),
            AlertOutcome::Failed(why) => tracing::error!(
                method = config.method,
                recipient = config.recipient,
                "second-runner alert failed: {why}"
            ),
            _ => {}
        }
        outcome
    }

    /// Takes one of the hour's alert slots, if any is free.
    fn take_slot(&self) -> bool {
        let mut sent = self.sent.lock().expect("alert lock poisoned");
        let now = Instant::now();
        while sent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(3600))
        {
            sent.pop_front();
        }
        if sent.len() >= self.per_hour as usize {
            return false;
        }
        sent.push_back(now);
        true
    }
}

/// One alert, straight to send_notification's transport: an alert is never itself held.
async fn send(
    registry: &Registry,
    config: &HoldAlertConfig,
    call_id: &str,
    note: &str,
    subject: String,
    body: String,
) -> AlertOutcome {
    let Some(tool) = registry.get("send_notification") else {
        return AlertOutcome::Failed("send_notification is not registered".into());
    };
    let mut parameters = Map::new();
    parameters.insert("method".into(), json!(config.method));
    parameters.insert("recipient".into(), json!(config.recipient));
    parameters.insert("subject".into(), json!(subject));
    parameters.insert("body".into(), json!(body));
    let timeout = tool.policy.timeout.max(Duration::from_millis(1));
    let call = ToolCall {
        call_id,
        note,
        note_id: "",
        parameters: &parameters,
        deadline: Instant::now() + timeout,
        answer: None,
    };
    match tokio::time::timeout(timeout, tool.tool.run(call)).await {
        Ok(Ok(_)) => AlertOutcome::Sent,
        Ok(Err(e)) => AlertOutcome::Failed(e.to_string()),
        Err(_) => AlertOutcome::Failed(format!(
            "no answer within {}",
            humantime::format_duration(timeout)
        )),
    }
}

/// The message: the note, each held call with why, and how to decide.
fn body(note: &str, held: &[HeldSummary], how_to_decide: &str) -> String {
    let mut s = format!("The note {note} waits for a person:\n");
    for h in held {
        s.push_str(&format!(
            "- {} ({}): {}\n",
            h.name,
            h.call_id,
            first_sentence(&h.reason)
        ));
    }
    s.push('\n');
    s.push_str(how_to_decide);
    s
}

/// A held call's reason ends with the how-to sentence, which the alert states once.
fn first_sentence(reason: &str) -> &str {
    reason.split(". To ").next().unwrap_or(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_names_the_note_the_calls_and_how_to_approve() {
        let held = [HeldSummary {
            call_id: "c-1".into(),
            name: "send_notification".into(),
            reason: "recipient bob@x.org is not in allowed_recipients. To send it, move this note to `Approved/`".into(),
        }];
        let b = body(
            "Pending_Approval/a.md",
            &held,
            "To send it, move this note to `Approved/`.",
        );
        assert!(b.contains("Pending_Approval/a.md"));
        assert!(b.contains(
            "- send_notification (c-1): recipient bob@x.org is not in allowed_recipients\n"
        ));
        assert!(b.ends_with("move this note to `Approved/`."));
    }

    #[test]
    fn the_hourly_cap_holds() {
        let a = HoldAlerts::new(None, 2);
        assert!(a.take_slot());
        assert!(a.take_slot());
        assert!(!a.take_slot());
    }

    #[tokio::test]
    async fn without_config_nothing_is_sent() {
        let registry = Registry::empty();
        let a = HoldAlerts::new(None, 2);
        let held = [HeldSummary {
            call_id: "c".into(),
            name: "t".into(),
            reason: "r".into(),
        }];
        assert_eq!(
            a.note_held(&registry, "n.md", &held, "").await,
            AlertOutcome::NotConfigured
        );
    }
}
