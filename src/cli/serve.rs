//! `vaultd run` and `vaultd once`: load the config, start logging and the runtime, run the
//! daemon until it ends or a signal stops it (with a backstop for a shutdown that hangs).

use super::logging::init_tracing;
use super::{GlobalArgs, RunnerArgs, load};
use crate::daemon::{self, Mode};
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::sync::Arc;

pub(super) fn serve(g: &GlobalArgs, mode: Mode, runner: RunnerArgs) -> Result<i32> {
    let (config, redactor, runtime) = start(g)?;
    let (grace, lock) = (config.shutdown_grace, config.vault.join(".vaultd.lock"));
    // A stop for a failed fsync of the journal gets the backstop a signal's stop gets.
    let storage_lock = lock.clone();
    daemon::on_storage_stop(move || exit_if_shutdown_hangs(grace, storage_lock.clone()));
    let outcome = runtime.block_on(async move {
        let signal = shutdown_signal();
        let shutdown = async move {
            signal.await;
            exit_if_shutdown_hangs(grace, lock);
        };
        daemon::run_vault(
            config,
            mode,
            runner.take_over,
            runner.new_journal,
            redactor,
            None,
            shutdown,
        )
        .await
        .map_err(anyhow::Error::from)
    });
    // docs/design.md §9.15: a blocking-pool thread stuck in a read (a FIFO, a hung device) must not
    // keep the process alive: the runtime is not waited for beyond a moment.
    runtime.shutdown_timeout(SHUTDOWN_LEFTOVERS);
    outcome?;
    Ok(0)
}

/// What a command that runs the daemon starts with: the config (validated, secrets read),
/// logging through its redactor, the async runtime.
pub(super) fn start(
    g: &GlobalArgs,
) -> Result<(
    crate::config::Config,
    Arc<crate::secret::Redactor>,
    tokio::runtime::Runtime,
)> {
    let (config, _) = load(g)?;
    let redactor = Arc::new(daemon::redactor_for(&config));
    init_tracing(redactor.clone(), g.log_format);
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    Ok((config, redactor, runtime))
}

/// How long a finished `run`/`once` waits for blocking-pool threads still in a call.
pub(super) const SHUTDOWN_LEFTOVERS: std::time::Duration = std::time::Duration::from_secs(2);

/// Past `shutdown_grace` plus this, a shutdown that still has not ended exits anyway.
const SHUTDOWN_BACKSTOP: std::time::Duration = std::time::Duration::from_secs(8);

/// docs/design.md §9.15: SIGTERM and SIGINT end `run` within `shutdown_grace` plus a few seconds,
/// whatever a tool or file is doing. The drain already stops waiting after the grace; this
/// thread is the backstop for anything that still holds the process (a stuck thread, a child
/// that ignores its signals): it exits with status 1, saying so. Recovery at the next start
/// finishes what was interrupted (the journal knows which calls started). The lock file is
/// removed as a normal exit does (§9.5; the `flock` goes with the process).
pub(super) fn exit_if_shutdown_hangs(grace: std::time::Duration, lock: PathBuf) {
    let spawned = std::thread::Builder::new()
        .name("shutdown-backstop".into())
        .spawn(move || {
            std::thread::sleep(grace + SHUTDOWN_BACKSTOP);
            tracing::error!(
                "shutdown did not end within shutdown_grace + {}s (a tool or a read that does not return); exiting now, interrupted calls are finished at the next start",
                SHUTDOWN_BACKSTOP.as_secs()
            );
            let _ = std::fs::remove_file(&lock);
            std::process::exit(1);
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the shutdown backstop: {e}");
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed now, inside the runtime, not on
/// the first poll: the daemon polls this only from its main loop, and until then a SIGTERM
/// (systemd stopping the unit during start-up) would kill the process instead of waiting.
pub(super) fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler can be installed");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler can be installed");
    // SIGHUP's default action would kill the daemon mid-call: caught from here on. `run`
    // reloads the config on it (daemon::reload, which has its own handler); here it is only
    // acknowledged.
    let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler can be installed");
    async move {
        loop {
            tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); return }
                _ = int.recv() => { tracing::info!("SIGINT: shutting down"); return }
                _ = hup.recv() => {}
            }
        }
    }
}
