//! `vaultd mcp serve`: the gateway over stdio (docs/design.md §14). When no daemon runs on the
//! vault, it runs one in this process (`vaultd run`, stopped when the client goes away);
//! otherwise it is that daemon's client. Either way the journal has one writer.

use super::GlobalArgs;
use super::mcp::ServeArgs;
use super::serve::{SHUTDOWN_LEFTOVERS, exit_if_shutdown_hangs, shutdown_signal, start};
use crate::daemon::{self, Mode};
use crate::gateway::http::Listen;
use crate::gateway::{Gateway, Limits, ListTools};
use crate::vault::Vault;
use anyhow::{Context, Result};
use rmcp::ServiceExt;
use std::time::Duration;

/// How long the daemon this process starts may take to lock the vault (its MCP servers start
/// first, each within its `start_timeout`).
const DAEMON_START: Duration = Duration::from_secs(120);

pub(super) fn serve(g: &GlobalArgs, args: ServeArgs) -> Result<i32> {
    let listen = match &args.listen {
        Some(text) => Some(Listen::parse(text).map_err(|e| anyhow::anyhow!("--listen: {e}"))?),
        None => None,
    };
    let (config, redactor, runtime) = start(g)?;
    let token = match (&listen, &config.gateway.token, args.insecure_no_token) {
        (None, _, _) | (Some(_), None, true) => None,
        (Some(_), Some(token), false) => Some(token.expose().to_string()),
        (Some(_), Some(_), true) => {
            anyhow::bail!("--insecure-no-token with [gateway] token set: drop one of them")
        }
        (Some(_), None, false) => anyhow::bail!(
            "vaultd mcp serve --listen needs a token its HTTP clients send: set [gateway] token = \"env:VAULTD_GATEWAY_TOKEN\" (a secret reference) in {}, or pass --insecure-no-token for a test",
            config
                .source
                .as_ref()
                .map_or_else(|| "the config".to_string(), |p| p.display().to_string())
        ),
    };
    let (grace, lock) = (config.shutdown_grace, config.vault.join(".vaultd.lock"));
    let outcome: Result<()> = runtime.block_on(async move {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let own_daemon = if daemon::running_daemon(&config.vault).is_none() {
            let (cfg, redactor) = (config.clone(), redactor.clone());
            let (ready, started) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(async move {
                let until = async {
                    let _ = stopped.await;
                };
                let result =
                    daemon::run_vault(cfg, Mode::Run, false, false, redactor, Some(ready), until)
                        .await;
                match &result {
                    Err(daemon::DaemonError::Locked(_)) => tracing::info!(
                        "another vaultd took the vault first: the gateway is its client"
                    ),
                    Err(e) => tracing::error!("the gateway's daemon stopped: {e}"),
                    Ok(()) => {}
                }
                result
            });
            // Its MCP servers up and their tools registered before the first `tools/list`;
            // a daemon that stops (another took the vault) or takes too long is not waited for.
            let _ = tokio::time::timeout(DAEMON_START, started).await;
            tracing::info!(vault = %config.vault.display(), "no vaultd ran on the vault: the gateway runs one");
            Some(task)
        } else {
            tracing::info!(vault = %config.vault.display(), "a vaultd runs on the vault: the gateway is its client");
            None
        };
        let journal = crate::state::open_journal(&config)?;
        let list: ListTools = {
            let config = config.clone();
            Box::new(move || super::tools::runnable(&config).map_err(|e| format!("{e:#}")))
        };
        let vault = Vault::new(config.vault.clone(), config.folders.clone());
        let gateway = Gateway::new(
            vault,
            config.gateway.clone(),
            journal,
            list,
            Limits {
                session_budget: config.guard.note_budget,
                max_note_bytes: config.max_note_bytes,
            },
        );
        let signal = shutdown_signal();
        match listen {
            None => {
                let service = gateway
                    .serve(rmcp::transport::stdio())
                    .await
                    .context("the MCP client's handshake failed")?;
                tokio::select! {
                    ended = service.waiting() => {
                        if let Err(e) = ended {
                            tracing::warn!("the MCP session ended: {e}");
                        }
                    }
                    () = signal => exit_if_shutdown_hangs(grace, lock),
                }
            }
            Some(listen) => {
                let shown = args.listen.clone().unwrap_or_default();
                crate::gateway::http::serve(
                    gateway,
                    listen,
                    token,
                    |at| tracing::info!("vaultd mcp serve: listening on {at}"),
                    async move {
                        signal.await;
                        exit_if_shutdown_hangs(grace, lock);
                    },
                )
                .await
                .with_context(|| format!("cannot listen on {shown}"))?;
            }
        }
        let _ = stop.send(());
        if let Some(task) = own_daemon {
            match task.await.context("the gateway's daemon panicked")? {
                // Another gateway or `vaultd run` took the vault first: this one was its client.
                Err(daemon::DaemonError::Locked(_)) | Ok(()) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    });
    runtime.shutdown_timeout(SHUTDOWN_LEFTOVERS);
    outcome?;
    Ok(0)
}
