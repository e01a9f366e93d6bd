//! `send_notification` (external_side_effect): email (file outbox or SMTP), Slack or Discord
//! webhook by configured name. Returns `{ "success": true, "message_id": "…" }`.

use crate::config::SendNotificationConfig;
use crate::tools::{Effect, RegistryError, Tool, ToolCall, ToolFuture, ToolSpec};
use serde_json::json;

pub struct SendNotification {
    spec: ToolSpec,
    #[allow(dead_code)]
    config: SendNotificationConfig,
    #[allow(dead_code)]
    http: reqwest::Client,
}

impl SendNotification {
    pub fn new(
        config: &SendNotificationConfig,
        http: reqwest::Client,
    ) -> Result<SendNotification, RegistryError> {
        Ok(SendNotification {
            spec: ToolSpec {
                name: "send_notification",
                description: "Send a notification by email, or to a configured Slack or Discord webhook (recipient = webhook name).",
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
            config: config.clone(),
            http,
        })
    }
}

impl Tool for SendNotification {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(&'a self, _call: ToolCall<'a>) -> ToolFuture<'a> {
        Box::pin(async move { todo!("send_notification methods") })
    }
}
