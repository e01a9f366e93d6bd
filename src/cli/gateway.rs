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
    // A stop of this process's daemon for a failed fsync of the journal gets the backstop a
    // signal's stop gets, as under `vaultd run`.
    let storage_lock = lock.clone();
    daemon::on_storage_stop(move || exit_if_shutdown_hangs(grace, storage_lock.clone()));
    let outcome: Result<()> = runtime.block_on(async move {
        let own_daemon = if daemon::running_daemon(&config.vault).is_none() {
            let (cfg, redactor) = (config.clone(), redactor.clone());
            let (ready, started) = tokio::sync::oneshot::channel();
            let own = OwnDaemon::spawn(|until| {
                daemon::run_vault(cfg, Mode::Run, false, false, redactor, Some(ready), until)
            });
            // Its MCP servers up and their tools registered before the first `tools/list`;
            // a daemon that stops (another took the vault) or takes too long is not waited for.
            let _ = tokio::time::timeout(DAEMON_START, started).await;
            tracing::info!(vault = %config.vault.display(), "no vaultd ran on the vault: the gateway runs one");
            Some(own)
        } else {
            tracing::info!(vault = %config.vault.display(), "a vaultd runs on the vault: the gateway is its client");
            None
        };
        let signal = shutdown_signal();
        let session = async move {
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
            Ok(())
        };
        beside(session, own_daemon).await
    });
    runtime.shutdown_timeout(SHUTDOWN_LEFTOVERS);
    outcome?;
    Ok(0)
}

/// The daemon a gateway runs in its own process when none ran on the vault.
pub(crate) struct OwnDaemon {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), daemon::DaemonError>>,
}

impl OwnDaemon {
    /// Runs `run(until)` as a task, `until` resolving when [`beside`] stops it.
    fn spawn<F>(run: impl FnOnce(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> F) -> Self
    where
        F: Future<Output = Result<(), daemon::DaemonError>> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let until = Box::pin(async {
            let _ = stopped.await;
        });
        OwnDaemon {
            stop,
            task: tokio::spawn(run(until)),
        }
    }
}

/// Runs the gateway's `session` until it ends, then stops `own` (the gateway's own daemon) and
/// returns how they ended. A daemon that stops by itself with an error ends the session
/// first: the gateway has no daemon left to run its calls (they would all get `NO_DAEMON`),
/// and the error is this process's (a failed fsync of the journal: exit 75, for a service
/// manager to start it again; a daemon that could not start: 2). One that found the vault
/// taken by another vaultd leaves the session running: the gateway is that daemon's client.
/// (`run` ends without an error only when stopped, which only this function does.)
pub(crate) async fn beside(
    session: impl Future<Output = Result<()>>,
    own: Option<OwnDaemon>,
) -> Result<()> {
    let Some(OwnDaemon { stop, mut task }) = own else {
        return session.await;
    };
    tokio::pin!(session);
    let ended = tokio::select! {
        ended = &mut session => ended,
        stopped = &mut task => {
            let stopped = stopped.context("the gateway's daemon panicked")?;
            match stopped {
                Err(daemon::DaemonError::Locked(_)) => {
                    tracing::info!("another vaultd took the vault first: the gateway is its client");
                    return session.await;
                }
                Err(e) => {
                    tracing::error!("the gateway's daemon stopped: {e}; the MCP session ends");
                    return Err(e.into());
                }
                Ok(()) => return session.await,
            }
        }
    };
    let _ = stop.send(());
    match task.await.context("the gateway's daemon panicked")? {
        Err(daemon::DaemonError::Locked(_)) | Ok(()) => ended,
        // The daemon's error first: the status it gives (75 for a failed fsync) is what a
        // service manager acts on.
        Err(e) => {
            if let Err(session) = ended {
                tracing::error!("{session:#}");
            }
            tracing::error!("the gateway's daemon stopped: {e}");
            Err(e.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::storage::tests::{InProcess, call_of};
    use crate::tools::Effect;
    use crate::vault::State;

    /// A daemon in this process with a `send` tool (an external side effect), and a gateway
    /// over its vault, as `serve` makes one.
    fn daemon_and_gateway() -> (InProcess, Gateway) {
        let tools = [
            ("look", Effect::ReadOnly, None, true),
            ("send", Effect::ExternalSideEffect, None, true),
        ];
        let d = InProcess::start_with("", &tools);
        let gateway = Gateway::new(
            d.vault.clone(),
            d.config.gateway.clone(),
            crate::journal::Journal::open(&d.config.state_dir).unwrap(),
            Box::new(|| Ok(Vec::new())),
            Limits {
                session_budget: 100,
                max_note_bytes: d.config.max_note_bytes,
            },
        );
        (d, gateway)
    }

    /// Fails the journal's fsyncs from the claim of a note calling `send` on: the daemon
    /// refuses its start and stops by itself with `StorageLost`.
    fn lose_the_disk(d: &InProcess) {
        tokio::task::block_in_place(|| {
            d.lose_fsync_from_the_claim_of(&|| {
                let to = d.vault.folder(State::NeedsAction).join("s.md");
                std::fs::write(to, format!("# s\n{}", call_of("send", r#"{"q": "x"}"#))).unwrap();
            });
        });
    }

    /// How `beside` ended: with the daemon's `StorageLost`, exit 75.
    async fn ended_with_storage_lost(served: tokio::task::JoinHandle<Result<()>>) {
        let ended = tokio::time::timeout(Duration::from_secs(60), served)
            .await
            .expect("the gateway ended once its daemon stopped")
            .unwrap();
        let e = ended.expect_err("the gateway ends with the daemon's error");
        assert_eq!(crate::cli::exit_code(&e), 75, "{e:#}");
        assert!(format!("{e:#}").contains("cannot be made durable"), "{e:#}");
    }

    /// The gateway's own daemon stops by itself after a failed fsync of the journal (review 3
    /// of the fourteenth pass: the gateway kept serving, every call answered `NO_DAEMON`):
    /// the MCP session ends, its client sees the connection close, and the gateway ends with
    /// the daemon's `StorageLost` (exit 75).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_gateway_whose_daemon_stops_for_a_failed_fsync_ends_its_session_with_that_error() {
        let (mut d, gateway) = daemon_and_gateway();
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let session = async move {
            let service = gateway.serve(server_io).await?;
            service.waiting().await?;
            Ok(())
        };
        let (stop, task) = d.hand_over();
        let served = tokio::spawn(beside(session, Some(OwnDaemon { stop, task })));
        let client = ().serve(client_io).await.expect("the client's handshake");
        let offered = client.list_all_tools().await.expect("tools/list");
        assert!(offered.is_empty(), "{offered:?}");

        lose_the_disk(&d);
        ended_with_storage_lost(served).await;
        // Its client sees the session end.
        tokio::time::timeout(Duration::from_secs(10), client.waiting())
            .await
            .expect("the client saw its session close")
            .ok();
    }

    /// The same over `--listen unix:PATH`: the HTTP server ends too, and its socket is
    /// removed (the serving future is dropped, not shut down, so the removal is its drop's).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_http_gateway_whose_daemon_stops_ends_and_removes_its_socket() {
        let (mut d, gateway) = daemon_and_gateway();
        let socket = d.config.state_dir.join("gateway.sock");
        let (ready, bound) = tokio::sync::oneshot::channel();
        let session = {
            let socket = socket.clone();
            async move {
                crate::gateway::http::serve(
                    gateway,
                    Listen::Unix(socket),
                    None,
                    |at| {
                        let _ = ready.send(at);
                    },
                    std::future::pending(),
                )
                .await?;
                Ok(())
            }
        };
        let (stop, task) = d.hand_over();
        let served = tokio::spawn(beside(session, Some(OwnDaemon { stop, task })));
        let at = tokio::time::timeout(Duration::from_secs(10), bound)
            .await
            .expect("the gateway listens")
            .unwrap();
        assert!(at.starts_with("unix:"), "{at}");
        assert!(socket.exists(), "the socket is there while it serves");

        lose_the_disk(&d);
        ended_with_storage_lost(served).await;
        assert!(
            !socket.exists(),
            "the socket was left at {}",
            socket.display()
        );
    }
}
