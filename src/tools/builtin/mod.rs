//! The built-in tool source: `search_web` and `send_notification`, each one module that owns
//! its config table. Adding a built-in tool is one module here plus one line in [`register`].

mod retry;
pub mod search_web;
pub mod send_notification;

use crate::config::ToolsConfig;
use crate::tools::{Policy, Registry, RegistryError};

/// Adds every built-in tool with its policy from the config.
pub fn register(
    config: &ToolsConfig,
    http: reqwest::Client,
    registry: &mut Registry,
) -> Result<(), RegistryError> {
    let s = &config.search_web;
    registry.add(
        Box::new(search_web::SearchWeb::new(s, http.clone())),
        Policy {
            enabled: s.enabled,
            timeout: s.timeout,
            rate_limit: s.rate_limit,
            // send_notification-style recipient rules are the tool's own `admit`.
            approval: None,
        },
    )?;
    let n = &config.send_notification;
    registry.add(
        Box::new(send_notification::SendNotification::new(n, http)?),
        Policy {
            enabled: n.enabled,
            timeout: n.timeout,
            rate_limit: n.rate_limit,
            approval: None,
        },
    )?;
    Ok(())
}
