//! `vaultd config`: the effective configuration, secrets redacted.

use super::{GlobalArgs, validated_without_secrets};
use crate::config;
use crate::daemon;
use anyhow::Result;
use serde_json::json;

pub(super) fn print_config(g: &GlobalArgs) -> Result<i32> {
    let (c, _) = validated_without_secrets(g)?;
    let effective = json!({
        "source": c.source.as_ref().map(|p| p.display().to_string()),
        "vault": c.vault.display().to_string(),
        "state_dir": c.state_dir.display().to_string(),
        "workers": c.workers,
        "max_calls_per_note": c.max_calls_per_note,
        "max_note_bytes": c.max_note_bytes,
        "shutdown_grace": humantime::format_duration(c.shutdown_grace).to_string(),
        "watch": match c.watch { config::WatchMode::Events => "events".to_string(), config::WatchMode::Poll(d) => format!("poll every {}", humantime::format_duration(d)) },
        "rescan_interval": humantime::format_duration(c.rescan_interval).to_string(),
        "settle": humantime::format_duration(c.settle).to_string(),
        "settle_max": humantime::format_duration(c.settle_max).to_string(),
        "stale_copy_grace": humantime::format_duration(c.stale_copy_grace).to_string(),
        "stale_copy_window": humantime::format_duration(c.stale_copy_window).to_string(),
        "runner_window": humantime::format_duration(c.runner_window).to_string(),
        "approval_via": c.approval_via.as_str(),
        "folders": {
            "needs_action": c.folders.needs_action, "in_progress": c.folders.in_progress,
            "pending_approval": c.folders.pending_approval, "approved": c.folders.approved,
            "rejected": c.folders.rejected, "done": c.folders.done, "failed": c.folders.failed,
            "dry_run": c.folders.dry_run,
        },
        "note_budget": c.guard.note_budget,
        "notify": { "on_hold": c.guard.on_hold.as_ref().map(|h| json!({ "method": h.method, "recipient": h.recipient })), "on_hold_per_hour": c.guard.on_hold_per_hour },
        "circuit_breaker": { "failures": c.guard.breaker.failures, "open_for": humantime::format_duration(c.guard.breaker.open_for).to_string() },
        "tools": c.tools.describe(),
    });
    let mut effective = effective;
    effective["max_result_bytes"] = json!(c.max_result_bytes);
    effective["folders"]["tool_results"] = json!(c.tool_results);
    effective["mcp"] = crate::tools::mcp::config::describe(&c.mcp);
    effective["folders"]["sessions"] = json!(c.gateway.sessions);
    // `approve_tool_use`'s rules are written in `[gateway.permissions]`: shown there.
    let permissions = effective["tools"]
        .as_object_mut()
        .and_then(|t| t.remove("approve_tool_use"));
    effective["gateway"] = json!({
        "approval_wait": humantime::format_duration(c.gateway.approval_wait).to_string(),
        "token": c.gateway.token.as_ref().map(|t| format!("{} [redacted]", t.reference())),
        "permissions": permissions,
    });
    let redactor = daemon::redactor_for(&c);
    let text = serde_json::to_string_pretty(&effective)?;
    println!("{}", redactor.redact(&text));
    Ok(0)
}
