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

/// Resolves on SIGTERM or SIGINT. The handlers are installed now, not on the first poll: the
/// daemon polls this only from its main loop, and until then a SIGTERM (systemd stopping the
/// unit during start-up) would kill the process instead of waiting.
///
/// They are heard on a thread of their own, not by the async workers: tokio hears a signal
/// only on a thread that drives its I/O, and a worker stuck in a read of a hung file system
/// does not (the look at a note reads on its worker). With every worker so stuck, a signal
/// heard by the workers would never start the drain or its backstop (§9.15). The handlers
/// (through `signal-hook-registry`, which tokio's own go through too) write the signal's
/// number to a socket the thread reads. Where that cannot be set up, the workers hear them,
/// as before.
pub(super) fn shutdown_signal() -> impl Future<Output = ()> {
    let heard = heard_on_own_thread()
        .inspect_err(|e| {
            tracing::warn!(
                "cannot hear signals on a thread of their own, the async workers hear them: {e}"
            )
        })
        .ok();
    let here = heard
        .is_none()
        .then(|| listen_here().expect("SIGTERM, SIGINT and SIGHUP handlers can be installed"));
    async move {
        match (heard, here) {
            (Some(heard), _) => {
                if heard.await.is_err() {
                    // The thread ended without a signal (its socket failed).
                    listen_here()
                        .expect("signal handlers can be installed")
                        .await
                }
            }
            (None, here) => here.expect("installed when no thread hears them").await,
        }
    }
}

/// Installs the handlers and starts the `vaultd-signals` thread; what it returns resolves
/// when SIGTERM or SIGINT came. SIGHUP is caught too (its default action would kill the daemon
/// mid-call) and only acknowledged: `run` reloads on it with a handler of its own.
fn heard_on_own_thread() -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    use std::io::Read;
    use std::os::fd::IntoRawFd;
    let (mut numbers, write) = std::os::unix::net::UnixStream::pair()?;
    // Never blocks in a handler: a full socket already holds a signal the thread will read.
    write.set_nonblocking(true)?;
    // Open for the process's life: a handler may run at any time.
    let fd = write.into_raw_fd();
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let number = signal as u8;
        // SAFETY: the action only calls write(2), which is async-signal-safe, on a descriptor
        // that is never closed.
        unsafe {
            signal_hook_registry::register(signal, move || {
                libc::write(fd, (&raw const number).cast(), 1);
            })
        }?;
    }
    let (heard, hear) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("vaultd-signals".into())
        .spawn(move || {
            let mut number = [0u8; 1];
            loop {
                match numbers.read(&mut number) {
                    Ok(1) if i32::from(number[0]) == libc::SIGTERM => {
                        tracing::info!("SIGTERM: shutting down");
                        break;
                    }
                    Ok(1) if i32::from(number[0]) == libc::SIGINT => {
                        tracing::info!("SIGINT: shutting down");
                        break;
                    }
                    Ok(1) => {} // SIGHUP
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Ok(_) | Err(_) => return, // `hear` then falls back to the workers
                }
            }
            let _ = heard.send(());
        })?;
    Ok(hear)
}

/// SIGTERM, SIGINT and SIGHUP handlers on the current runtime; resolves on SIGTERM or SIGINT.
fn listen_here() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // SIGHUP's default action would kill the daemon mid-call: caught from here on. `run`
    // reloads the config on it (daemon::reload, which has its own handler); here it is only
    // acknowledged.
    let mut hup = signal(SignalKind::hangup())?;
    Ok(async move {
        loop {
            tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); return }
                _ = int.recv() => { tracing::info!("SIGINT: shutting down"); return }
                _ = hup.recv() => {}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    /// §9.15: SIGTERM is heard while every async worker is stuck, as in reads of a hung file
    /// system. (No other test of this process listens for SIGTERM.)
    #[test]
    fn sigterm_is_heard_while_every_async_worker_is_stuck() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let signal = {
            let _inside = runtime.enter();
            super::shutdown_signal()
        };
        let (started, all_stuck) = mpsc::channel();
        let releases: Vec<mpsc::Sender<()>> = (0..2)
            .map(|_| {
                let (release, stuck) = mpsc::channel::<()>();
                let started = started.clone();
                runtime.spawn(async move {
                    let _ = started.send(());
                    let _ = stuck.recv_timeout(Duration::from_secs(30));
                });
                release
            })
            .collect();
        for _ in 0..2 {
            all_stuck.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        let (heard, hear) = mpsc::channel();
        let handle = runtime.handle().clone();
        std::thread::spawn(move || {
            handle.block_on(signal);
            let _ = heard.send(());
        });
        // SAFETY: a signal to this process, whose SIGTERM handler tokio installed above.
        assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
        let in_time = hear.recv_timeout(Duration::from_secs(10)).is_ok();
        for release in releases {
            let _ = release.send(());
        }
        assert!(in_time, "SIGTERM not heard while the workers were stuck");
    }
}
