//! A gateway call travels as a note (docs/design.md §14): it is written into `Needs_Action/`
//! like any agent's note, the daemon claims it, plans, journals and runs its call, and moves it
//! on; the gateway watches the folders the note can land in and reads the call's outcome from
//! the journal. So every call an MCP client makes goes through the one pipeline and the one
//! journal writer, and waits in `Pending_Approval/` for a person like any held call.

use crate::call::CallResult;
use crate::journal::Journal;
use crate::vault::{State, Vault};
use notify::Watcher;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;

/// How often the folders are looked at when no event came (events are hints: a synced vault
/// or a watcher that missed one still ends the wait).
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// A call note still underway after this many looks (about 5 s) with no daemon on the vault
/// is answered `NO_DAEMON` instead of waited for.
const ORPHANED_AFTER_LOOKS: u32 = 20;

/// The folders a call note ends in.
const FINISHED: [State; 3] = [State::Done, State::Failed, State::Rejected];

/// Where a call note is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Whereabouts {
    /// Not yet claimed, or being run (`Needs_Action/`, `In_Progress/`, `Approved/`, …).
    Underway,
    /// In `Pending_Approval/`: a person decides.
    Held(PathBuf),
    /// Not finished, and no daemon has held the vault for a while: nothing will move it until
    /// one runs again (the gateway's own daemon stopped, or the `vaultd run` it was a client of).
    Orphaned,
    /// In `Done/`, `Failed/` or `Rejected/` (the person refused; the note stays there), at
    /// this path.
    Finished(PathBuf),
    /// In none of the folders it runs or ends in: deleted, renamed, or moved elsewhere
    /// (`Dry_Run/`, a project folder) by a person. It will not run from there.
    Gone,
}

/// The folders a call note is on its way through: it runs, at most once, from there.
const UNDERWAY: [State; 3] = [State::NeedsAction, State::InProgress, State::Approved];

/// Writes a call note under its final name in one rename, so the daemon never reads half of
/// it. The temporary file is hidden (a dot name, no `.md`), which the daemon never claims. A
/// name that any state folder already holds is refused (`AlreadyExists`), and the rename never
/// replaces a note: two sessions can never share a call note.
pub(crate) fn send(vault: &Vault, name: &str, text: &str) -> std::io::Result<PathBuf> {
    let taken = State::ALL
        .iter()
        .any(|s| vault.folder(*s).join(name).symlink_metadata().is_ok());
    if taken {
        return Err(std::io::ErrorKind::AlreadyExists.into());
    }
    let folder = vault.folder(State::NeedsAction);
    let tmp = folder.join(format!(".{name}.vaultd-tmp"));
    let path = folder.join(name);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(text.as_bytes())?;
    drop(file);
    let renamed = crate::vault::rename_noreplace(vault.root(), &tmp, &path);
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed.map(|()| path)
}

/// Where the note named `name` is now.
pub(crate) fn whereabouts(vault: &Vault, name: &str) -> Whereabouts {
    for state in FINISHED {
        let path = vault.folder(state).join(name);
        if path.is_file() {
            return Whereabouts::Finished(path);
        }
    }
    let held = vault.folder(State::PendingApproval).join(name);
    if held.is_file() {
        return Whereabouts::Held(held);
    }
    if UNDERWAY
        .iter()
        .any(|s| vault.folder(*s).join(name).symlink_metadata().is_ok())
    {
        return Whereabouts::Underway;
    }
    // Looked for in one folder after another: a move between two looks can hide it once.
    if FINISHED
        .iter()
        .chain([State::PendingApproval].iter())
        .chain(UNDERWAY.iter())
        .any(|s| vault.folder(*s).join(name).symlink_metadata().is_ok())
    {
        return whereabouts(vault, name);
    }
    Whereabouts::Gone
}

/// A count bumped on every change in the folders a call note lands in; waiters look again
/// when it moves (and every [`LOOK_EVERY`] regardless).
pub(crate) struct Arrivals {
    _watcher: Option<notify::RecommendedWatcher>,
    changed: watch::Receiver<u64>,
}

impl Arrivals {
    /// Watches `Done/`, `Failed/`, `Rejected/` and `Pending_Approval/`. Without a watcher (none could be
    /// made) waiters look every [`LOOK_EVERY`].
    pub(crate) fn watch(vault: &Vault) -> Self {
        let (tx, rx) = watch::channel(0u64);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if event.is_ok() {
                tx.send_modify(|n| *n += 1);
            }
        })
        .and_then(|mut w| {
            for state in FINISHED.into_iter().chain([State::PendingApproval]) {
                w.watch(&vault.folder(state), notify::RecursiveMode::NonRecursive)?;
            }
            Ok(w)
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(
                    "cannot watch the vault's folders ({e}): the gateway looks every 250 ms"
                );
                None
            }
        };
        Arrivals {
            _watcher: watcher,
            changed: rx,
        }
    }

    /// Waits until the note named `name` is no longer [`Whereabouts::Underway`] and, if it is
    /// held, until it has left `Pending_Approval/` or `until` has passed. Returns where it is.
    pub(crate) async fn wait(
        &self,
        vault: &Vault,
        name: &str,
        until: Option<tokio::time::Instant>,
    ) -> Whereabouts {
        let mut changed = self.changed.clone();
        // Quiet looks in a row that found no daemon on the vault.
        let mut no_daemon = 0;
        // Looks in a row that found the note nowhere (once can be a move between folders).
        let mut gone = 0;
        let mut quiet = false;
        loop {
            let now = whereabouts(vault, name);
            gone = if now == Whereabouts::Gone {
                gone + 1
            } else {
                0
            };
            match (&now, until) {
                (Whereabouts::Gone, _) if gone >= 2 => return now,
                (Whereabouts::Finished(_), _) => return now,
                (Whereabouts::Held(_), None) => return now,
                (Whereabouts::Held(_), Some(t)) if tokio::time::Instant::now() >= t => return now,
                _ => {}
            }
            // Only when nothing moved for a look: a note arriving in a folder is a daemon at
            // work, and every waiter wakes on it (the lock is not probed on that path).
            if quiet {
                if crate::daemon::running_daemon(vault.root()).is_some() {
                    no_daemon = 0;
                } else {
                    no_daemon += 1;
                    // A daemon restarting (a reload, systemd) takes the lock again within a
                    // second.
                    if no_daemon > ORPHANED_AFTER_LOOKS && now == Whereabouts::Underway {
                        return Whereabouts::Orphaned;
                    }
                }
            }
            quiet = match tokio::time::timeout(LOOK_EVERY, changed.changed()).await {
                Ok(Ok(())) => false,
                Err(_) => true,
                // No watcher (it could not be made): a look every LOOK_EVERY.
                Ok(Err(_)) => {
                    tokio::time::sleep(LOOK_EVERY).await;
                    true
                }
            };
        }
    }
}

/// The outcome of the note's (only) call, from the journal. The daemon has the outcome
/// committed before the result block replaces the note (`note::update_note_settling`), so it
/// is there once the note has moved; looked for again for up to 2 s all the same (another
/// process's reader may see the commit a moment later). A note a person moved into
/// Rejected/ (`rejected`) is there before its rejection is recorded: the daemon records it
/// and then writes the REJECTED results, which are waited for first.
pub(crate) async fn outcome(journal: &Journal, note: &Path, rejected: bool) -> Option<CallResult> {
    if rejected {
        wait_for_rejections(note).await;
    }
    let text = tokio::fs::read_to_string(note).await.ok()?;
    let note_id = crate::note::frontmatter_property(&text, "tool_note")?.to_string();
    for _ in 0..100 {
        if let Ok(calls) = journal.note_calls(&note_id)
            && let Some(result) = calls.into_iter().find_map(|c| c.recorded)
        {
            return Some(result);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// How long a note moved into Rejected/ is waited for to show its REJECTED results.
const REJECTIONS_WAIT: Duration = Duration::from_secs(10);

/// Waits, up to [`REJECTIONS_WAIT`], until no held call of `note` is without a result: the
/// daemon has recorded the rejections and written them (`Daemon::reject_held`), or the note
/// is gone.
async fn wait_for_rejections(note: &Path) {
    let deadline = tokio::time::Instant::now() + REJECTIONS_WAIT;
    while tokio::time::Instant::now() < deadline {
        match tokio::fs::read_to_string(note).await {
            Ok(text)
                if !crate::pipeline::plan::rejections(&crate::note::parse_note(&text))
                    .is_empty() => {}
            _ => return,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vault::Folders;

    #[test]
    fn a_note_is_underway_then_held_then_finished() {
        let dir = tempfile::tempdir().unwrap();
        let vault = Vault::new(dir.path().to_path_buf(), Folders::default());
        vault.prepare().unwrap();
        let sent = send(&vault, "a call.md", "body").unwrap();
        assert_eq!(whereabouts(&vault, "a call.md"), Whereabouts::Underway);
        let held = vault.folder(State::PendingApproval).join("a call.md");
        std::fs::rename(&sent, &held).unwrap();
        assert_eq!(
            whereabouts(&vault, "a call.md"),
            Whereabouts::Held(held.clone())
        );
        let done = vault.folder(State::Done).join("a call.md");
        std::fs::rename(&held, &done).unwrap();
        assert_eq!(
            whereabouts(&vault, "a call.md"),
            Whereabouts::Finished(done)
        );
        let left: Vec<_> = std::fs::read_dir(vault.folder(State::NeedsAction))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "no temporary file is left behind");
        // The name is taken now (in Done/): a second note under it is refused.
        let again = send(&vault, "a call.md", "other").unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
        std::fs::write(vault.folder(State::NeedsAction).join("b.md"), "first").unwrap();
        assert!(send(&vault, "b.md", "second").is_err());
        assert_eq!(
            std::fs::read_to_string(vault.folder(State::NeedsAction).join("b.md")).unwrap(),
            "first",
            "never replaced"
        );
    }
}
