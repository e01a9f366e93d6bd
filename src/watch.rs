//! The only file that touches `notify`: watches the inbox folders (recursively) and turns raw
//! events into hints on a bounded channel. Events are hints; the folders are the truth: when
//! the channel or the kernel queue overflows, a `Rescan` is asked for instead.

use crate::config::WatchMode;
use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind, RenameMode};
use notify::{Event, EventKind, RecursiveMode, Watcher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// What the watcher tells the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hint {
    /// The file was renamed into place (moved in, or saved atomically): whole, look at it now.
    Ready(PathBuf),
    /// A writer closed the file after writing it in place: look once it stayed unchanged
    /// for `settle` (it may reopen it to append, docs/design.md §9.1).
    Closed(PathBuf),
    /// The file changed and may still be being written: look once it is closed and quiet.
    Changed(PathBuf),
    /// A folder appeared: its files may have been created before its watch was added.
    NewFolder(PathBuf),
    /// Events were lost: scan everything.
    Rescan,
}

/// Keeps the OS watcher alive; dropping it stops watching.
pub struct WatchHandle {
    _watcher: Arc<Mutex<Box<dyn Watcher + Send>>>,
    /// Set when a hint could not be queued; the daemon answers with a full scan.
    pub overflowed: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot watch {path}: {source}")]
pub struct WatchError {
    pub path: PathBuf,
    pub source: notify::Error,
}

/// Starts watching `folders` recursively; hints go to `tx`, except those `ignore` drops on the
/// watcher's own thread (the daemon's own writes: they need not wake it).
pub fn start(
    folders: &[PathBuf],
    mode: WatchMode,
    tx: mpsc::Sender<Hint>,
    ignore: impl Fn(&Hint) -> bool + Send + 'static,
) -> Result<WatchHandle, WatchError> {
    let overflowed = Arc::new(AtomicBool::new(false));
    let flag = overflowed.clone();
    let poll = matches!(mode, WatchMode::Poll(_));
    // A new folder's hint waits until the folder is surely watched (see `watch_new_folders`).
    let (new_folders, new_folders_rx) = std::sync::mpsc::channel::<PathBuf>();
    let daemon = tx.clone();
    // notify's thread runs the handler, and only it: put in the background at its first
    // event (the thread is notify's to spawn).
    let background = std::sync::Once::new();
    let handler = move |res: notify::Result<Event>| {
        background.call_once(crate::background::this_thread);
        let hints = match res {
            Ok(event) => hints_for(event, poll),
            Err(e) => {
                tracing::warn!("file watcher error, scanning everything: {e}");
                vec![Hint::Rescan]
            }
        };
        for hint in hints {
            // A folder renamed in (`mv batch/ Needs_Action/`) brings notes that have no
            // events of their own: it is a new folder to scan, not a note.
            let hint = match hint {
                Hint::Ready(path) if path.symlink_metadata().is_ok_and(|m| m.is_dir()) => {
                    Hint::NewFolder(path)
                }
                hint => hint,
            };
            if ignore(&hint) {
                continue;
            }
            match hint {
                Hint::NewFolder(dir) if !poll => {
                    let _ = new_folders.send(dir);
                }
                hint => {
                    if tx.try_send(hint).is_err() {
                        flag.store(true, Ordering::SeqCst);
                    }
                }
            }
        }
    };
    let mut watcher: Box<dyn Watcher + Send> =
        match mode {
            WatchMode::Events => Box::new(notify::recommended_watcher(handler).map_err(
                |source| WatchError {
                    path: folders.first().cloned().unwrap_or_default(),
                    source,
                },
            )?),
            WatchMode::Poll(interval) => Box::new(
                notify::PollWatcher::new(
                    handler,
                    notify::Config::default().with_poll_interval(interval),
                )
                .map_err(|source| WatchError {
                    path: folders.first().cloned().unwrap_or_default(),
                    source,
                })?,
            ),
        };
    for f in folders {
        watcher
            .watch(f, RecursiveMode::Recursive)
            .map_err(|source| WatchError {
                path: f.clone(),
                source,
            })?;
    }
    let watcher = Arc::new(Mutex::new(watcher));
    watch_new_folders(
        Arc::downgrade(&watcher),
        new_folders_rx,
        daemon,
        overflowed.clone(),
    );
    Ok(WatchHandle {
        _watcher: watcher,
        overflowed,
    })
}

/// Turns each new folder into a `NewFolder` hint once the folder is surely watched.
///
/// notify adds the watch on a new folder after it has passed the folder's creation on (notify
/// #727): a file created in between has no event, and the daemon's scan of the folder, made
/// on the hint, could run before the file existed. Under load that window grew long enough for
/// 53 of 2,000 notes dropped into a new folder to wait for the periodic rescan. Here the
/// folder is watched again (inotify keeps one watch per folder: adding it twice is harmless)
/// before the hint goes out, so every file is either there when the daemon scans or has an
/// event after. A thread of its own: `watch` waits for notify's event loop, which is the
/// thread that runs the handler.
fn watch_new_folders(
    watcher: std::sync::Weak<Mutex<Box<dyn Watcher + Send>>>,
    new_folders: std::sync::mpsc::Receiver<PathBuf>,
    daemon: mpsc::Sender<Hint>,
    overflowed: Arc<AtomicBool>,
) {
    let spawned = std::thread::Builder::new()
        .name("vaultd-new-folders".into())
        .spawn(move || {
            // Ends when the watcher, and with it the handler that sends here, is dropped.
            while let Ok(dir) = new_folders.recv() {
                let Some(watcher) = watcher.upgrade() else {
                    return;
                };
                let watched = watcher
                    .lock()
                    .expect("the watcher lock is never poisoned")
                    .watch(&dir, RecursiveMode::Recursive);
                drop(watcher);
                if let Err(e) = watched {
                    // Gone again, or no more watches: the scan on the hint still looks.
                    tracing::debug!("cannot watch new folder {}: {e}", dir.display());
                }
                if daemon.try_send(Hint::NewFolder(dir)).is_err() {
                    overflowed.store(true, Ordering::SeqCst);
                }
            }
        });
    if let Err(e) = spawned {
        // Without the thread new folders get no hint: the daemon's periodic rescan finds them.
        tracing::warn!("cannot start the new-folder watcher thread: {e}");
    }
}

/// Watches one file, `file`, for changes: its folder is watched (not recursively) and events
/// are filtered by name, since editors save by writing a new file and renaming it over the old
/// one, which a watch on the file itself would lose. Each change sends `()` on `tx`; a full
/// channel drops it, as one pending change stands for any number.
pub fn watch_file(
    file: &Path,
    mode: WatchMode,
    tx: mpsc::Sender<()>,
) -> Result<WatchHandle, WatchError> {
    let folder = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let name = file.file_name().map(|n| n.to_os_string());
    let handler = move |res: notify::Result<Event>| {
        let ours = match res {
            // A change of the file, of its name (renamed in or away), or lost events.
            Ok(event) => {
                // Reads (vaultd's own, an editor's) are not changes.
                let changed = matches!(
                    event.kind,
                    EventKind::Create(_)
                        | EventKind::Modify(_)
                        | EventKind::Remove(_)
                        | EventKind::Any
                        | EventKind::Access(AccessKind::Close(AccessMode::Write))
                );
                event.need_rescan()
                    || (changed && event.paths.iter().any(|p| p.file_name() == name.as_deref()))
            }
            Err(_) => true,
        };
        if ours {
            let _ = tx.try_send(());
        }
    };
    let error = |source| WatchError {
        path: folder.clone(),
        source,
    };
    let mut watcher: Box<dyn Watcher + Send> = match mode {
        WatchMode::Events => Box::new(notify::recommended_watcher(handler).map_err(error)?),
        WatchMode::Poll(interval) => Box::new(
            notify::PollWatcher::new(
                handler,
                notify::Config::default().with_poll_interval(interval),
            )
            .map_err(error)?,
        ),
    };
    watcher
        .watch(&folder, RecursiveMode::NonRecursive)
        .map_err(error)?;
    Ok(WatchHandle {
        _watcher: Arc::new(Mutex::new(watcher)),
        overflowed: Arc::new(AtomicBool::new(false)),
    })
}

fn hints_for(event: Event, poll: bool) -> Vec<Hint> {
    if event.need_rescan() {
        return vec![Hint::Rescan];
    }
    let mut paths = event.paths;
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => {
            paths.into_iter().map(Hint::Closed).collect()
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
            paths.into_iter().map(Hint::Ready).collect()
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
            // [from, to]: only the destination matters.
            paths.pop().map(Hint::Ready).into_iter().collect()
        }
        EventKind::Create(CreateKind::Folder) => paths.into_iter().map(Hint::NewFolder).collect(),
        EventKind::Create(_) | EventKind::Modify(ModifyKind::Data(_)) => {
            paths.into_iter().map(Hint::Changed).collect()
        }
        // Poll watchers report renames and metadata changes coarsely.
        EventKind::Modify(_) | EventKind::Any if poll => {
            paths.into_iter().map(Hint::Changed).collect()
        }
        EventKind::Modify(ModifyKind::Any) => paths.into_iter().map(Hint::Changed).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::Flag;

    #[test]
    fn moved_in_is_ready_at_once_and_close_write_settles() {
        let p = PathBuf::from("/v/Needs_Action/a.md");
        let e =
            Event::new(EventKind::Access(AccessKind::Close(AccessMode::Write))).add_path(p.clone());
        assert_eq!(hints_for(e, false), vec![Hint::Closed(p.clone())]);
        let e = Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Both)))
            .add_path(PathBuf::from("/v/Needs_Action/.a.tmp"))
            .add_path(p.clone());
        assert_eq!(hints_for(e, false), vec![Hint::Ready(p)]);
    }

    #[test]
    fn overflow_asks_for_a_rescan() {
        let e = Event::new(EventKind::Other).set_flag(Flag::Rescan);
        assert_eq!(hints_for(e, false), vec![Hint::Rescan]);
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_watchers_thread_runs_in_the_background() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        // `ignore` runs on notify's thread: it looks at that thread's policy.
        let seen = Arc::new(Mutex::new(None));
        let on_notify = seen.clone();
        let _watching = start(
            &[dir.path().to_path_buf()],
            WatchMode::Events,
            tx,
            move |_: &Hint| {
                // SAFETY: pthread_self has no preconditions.
                let me = unsafe { libc::pthread_self() };
                on_notify
                    .lock()
                    .unwrap()
                    .get_or_insert(crate::background::is_background(me));
                false
            },
        )
        .unwrap();
        std::fs::write(dir.path().join("a.md"), "x").unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("a hint for the new file")
            .expect("the watcher is running");
        assert_eq!(*seen.lock().unwrap(), Some(true));
    }

    #[test]
    fn opens_and_removals_are_not_hints() {
        let p = PathBuf::from("/v/Needs_Action/a.md");
        let e =
            Event::new(EventKind::Access(AccessKind::Open(AccessMode::Any))).add_path(p.clone());
        assert!(hints_for(e, false).is_empty());
        let e = Event::new(EventKind::Remove(notify::event::RemoveKind::File)).add_path(p);
        assert!(hints_for(e, false).is_empty());
    }
}
