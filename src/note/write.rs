//! The one atomic note write: temp file in the same folder, fsync, rename, fsync the folder;
//! if the note changed meanwhile, rebuild from the new content so no other writer's change
//! is lost.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("note {0} is gone (deleted or moved away)")]
    Gone(std::path::PathBuf),
    #[error("note {path} is not UTF-8")]
    NotUtf8 { path: std::path::PathBuf },
    #[error("cannot write note {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl WriteError {
    /// A write refused because the note's folder is reached through a symlink (§9.13).
    pub fn is_symlink_refusal(&self) -> bool {
        matches!(self, WriteError::Io { source, .. } if crate::beneath::is_symlink_refusal(source))
    }
}

/// How often the note may change under us before we give up on this write (about 1.5 s of
/// back-off in all; the daemon retries the whole write later, so giving up loses nothing).
const MAX_ATTEMPTS: u32 = 20;
/// Back-off after a lost race: `BACKOFF_STEP` × attempt, at most `BACKOFF_MAX`.
const BACKOFF_STEP: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(100);
/// A note modified more recently than this may be half-written by an in-place writer (open,
/// truncate, write): replacing it now would drop the rest of that writer's bytes, which go
/// to the replaced inode. Wait for a quiet moment first.
const QUIET: Duration = Duration::from_millis(50);

/// Where this process's temp file numbers start: the microseconds since the epoch at their
/// first use, above every number an earlier process with the same pid gave out (a
/// container's PID 1, restarted), so that [`is_stale_temp`] knows its leftovers from this
/// process's own files. A clock set back since makes such a leftover look like ours: it is
/// kept, and no file of ours is ever taken for a leftover.
static TEMP_BASE: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2))
});
/// Makes temp names unique among the writers of this process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The number of this process's next temp file (`.{name}.vaultd-{pid}-{n}.tmp`: the note
/// writes here and the vault tools' new files), from [`TEMP_BASE`] up.
pub(crate) fn next_temp_number() -> u64 {
    *TEMP_BASE + TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// Reads the note, computes its new text with `build(current)`, and replaces it atomically.
/// Returns the text written.
///
/// If the note changes between the read and the rename (an editor or the agent saved), the
/// temp file is dropped and `build` runs again on the new content, so the other writer's
/// change is kept. When `build` changes nothing, nothing is written.
pub fn update_note(path: &Path, build: impl Fn(&str) -> String) -> Result<String, WriteError> {
    update(None, path, build, Durable::Now, &mut || Ok(()), None, None)
}

/// [`update_note`] that calls `ready` once its temp file is written and fsynced, before the
/// note is replaced, and writes nothing if it fails (its error is the write's): a vault
/// tool's edit, which waits there for its write-ahead undo record to be durable
/// (`Journal::undo_prepared`), so that the journal's fsync and the temp file's overlap.
/// `ready` may be called on each attempt; it is the caller's to do its work once.
pub fn update_note_when_ready(
    path: &Path,
    build: impl Fn(&str) -> String,
    ready: &mut dyn FnMut() -> io::Result<()>,
) -> Result<String, WriteError> {
    update(None, path, build, Durable::Now, ready, None, None)
}

/// [`update_note`] for a note below the vault `root` (the daemon's writes into state folders,
/// docs/design.md §9.13): the note's folder must be reached from `root` without a symlink, checked
/// before the temp file is made, and the rename goes through that folder opened without
/// following symlinks; a folder swapped for a symlink gives an error whose source
/// [`crate::beneath::is_symlink_refusal`] recognises, and nothing is written through it.
pub fn update_note_beneath(
    root: &Path,
    path: &Path,
    build: impl Fn(&str) -> String,
) -> Result<String, WriteError> {
    update(
        Some(root),
        path,
        build,
        Durable::Now,
        &mut || Ok(()),
        None,
        None,
    )
}

/// [`update_note_beneath`] that calls `before_rename` once its temp file is written and
/// fsynced, before the note is replaced:
/// the results write, which waits there for its calls' outcomes to be durable in the journal
/// (`Journal::settle`), so that the fsyncs of the two overlap and a result block is never in
/// the note before its outcome is in the journal. `before_rename` may be called on each
/// attempt; it is the caller's to do its work once.
///
/// With `moves_on`, for a caller that moves the note on at once, the folder is not fsynced
/// after the rename: the move's fsync of the folder it leaves ([`crate::vault::Vault::move_to`])
/// makes this rename durable too, before anything is recorded as done. A caller whose move
/// then fails must fsync the folder itself ([`crate::files::fsync_dir`]).
///
/// `last_seen`, the note's text as the caller last read or wrote it, is taken for the note's
/// on the first attempt instead of reading the note again: the check under the lease before
/// the rename compares it with the note itself, and a note changed since is read and built
/// on at the next attempt (its temp file written for nothing).
///
/// `ahead`, a temp file made beside the note beforehand ([`TempFile::beside`]), is written
/// into by the first attempt instead of a new one.
pub fn update_note_settling(
    root: &Path,
    path: &Path,
    build: impl Fn(&str) -> String,
    moves_on: bool,
    before_rename: &mut dyn FnMut(),
    last_seen: Option<&str>,
    ahead: Option<TempFile>,
) -> Result<String, WriteError> {
    let durable = if moves_on {
        Durable::ByTheMove
    } else {
        Durable::Now
    };
    let mut ready = || {
        before_rename();
        Ok(())
    };
    update(
        Some(root),
        path,
        build,
        durable,
        &mut ready,
        last_seen,
        ahead,
    )
}

/// [`update_note_beneath`] without an fsync of its own: neither the temp file nor the folder
/// is synced now (the folder is left to the flusher, [`crate::files::fsync_dir_soon`]). A
/// crash may then leave the note as it was, as written, or — on a file system that does not
/// flush a file renamed over another — empty or zero-filled. Only for the identity stamp,
/// whose caller first made the text it replaces durable in the journal, from which recovery
/// puts a damaged note back (`journal/mod.rs`, "The stamp"). `last_seen` as for
/// [`update_note_settling`], and the text the journal holds: a note found changed since is
/// written with its temp file fsynced (its text is not the one recovery would put back).
pub fn update_note_unsynced(
    root: &Path,
    path: &Path,
    build: impl Fn(&str) -> String,
    last_seen: Option<&str>,
) -> Result<String, WriteError> {
    update(
        Some(root),
        path,
        build,
        Durable::Soon,
        &mut || Ok(()),
        last_seen,
        None,
    )
}

/// Puts `text` back as the note at `path` (temp file, fsync, rename, folder fsync), whatever
/// the note holds now: recovery's repair of a note a crash left damaged.
pub fn restore_note(root: &Path, path: &Path, text: &str) -> Result<(), WriteError> {
    let (folder, temp) = TempFile::beside(root, path)
        .and_then(|made| made.fill(text, true))
        .map_err(|e| io_error(path, e))?;
    if let Err(source) = folder.rename(file_name(&temp), file_name(path)) {
        let _ = folder.remove(file_name(&temp));
        return Err(io_error(path, source));
    }
    sync_parent(path);
    Ok(())
}

/// How a note write is made durable.
#[derive(Clone, Copy, PartialEq)]
enum Durable {
    /// The temp file fsynced before the rename, the folder after it.
    Now,
    /// The temp file fsynced; the folder's fsync left to the move that follows at once.
    ByTheMove,
    /// Neither now: see [`update_note_unsynced`].
    Soon,
}

fn update(
    root: Option<&Path>,
    path: &Path,
    build: impl Fn(&str) -> String,
    durable: Durable,
    before_rename: &mut dyn FnMut() -> io::Result<()>,
    last_seen: Option<&str>,
    mut ahead: Option<TempFile>,
) -> Result<String, WriteError> {
    // After a writer was caught in the rename (see below): what we wrote, and their text.
    let mut carried: Option<(String, String)> = None;
    let kept = last_seen;
    // The caller's text for the note, taken without a read on the first attempt; the last
    // attempt built on it, which was not the note's (no back-off: nobody was caught writing).
    let (mut guess, mut guessed_wrong) = (last_seen, false);
    for attempt in 1..=MAX_ATTEMPTS {
        if attempt > 1 && carried.is_none() && !std::mem::take(&mut guessed_wrong) {
            std::thread::sleep((BACKOFF_STEP * attempt).min(BACKOFF_MAX));
        }
        let guessed = guess.is_some();
        let current = match guess.take() {
            Some(text) => text.to_owned(),
            None => match read_current(path)? {
                Some(text) => text,
                None => continue,
            },
        };
        let base = carried_over(carried.take(), &current, path);
        let new = build(&base);
        if new == current {
            if guessed {
                guessed_wrong = true; // nothing to add to it: said of the note only once read
                continue;
            }
            return Ok(new);
        }
        // Unsynced (`Soon`) only on the text the caller's journal holds (the note as claimed):
        // on any other (a person's edit since), a crash must not leave the note empty, since
        // recovery would put back the claimed text, without the edit.
        let sync = durable != Durable::Soon || kept != Some(base.as_str());
        let made = match ahead.take().filter(|t| t.is_beside(path)) {
            Some(made) => Ok(made),
            None => TempFile::make(root, path),
        };
        let (folder, temp) = match made.and_then(|made| made.fill(&new, sync)) {
            Ok(filled) => filled,
            Err(source) if guessed && source.kind() == io::ErrorKind::NotFound => {
                // Its folder is gone: said (as `Gone`) by the read of the next attempt.
                guessed_wrong = true;
                continue;
            }
            Err(source) => return Err(io_error(path, source)),
        };
        let drop_temp = || {
            let _ = folder.remove(file_name(&temp));
        };
        if let Err(source) = before_rename() {
            drop_temp();
            return Err(io_error(path, source));
        }
        // From the check to the rename, other writers are kept out (see `Guard`); a note
        // changed meanwhile — saved in place, or a save renamed over it — starts us over on
        // its version.
        let mut guard = match Guard::take(path) {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                drop_temp();
                continue;
            }
            Err(e) => {
                drop_temp();
                return Err(e);
            }
        };
        // The note the guard opened by its path is the one in the folder this write opened:
        // a folder swapped since (for a symlink, say) is caught by the next attempt's open,
        // and nothing is renamed into the folder it replaced.
        if !folder.holds(file_name(path), &guard.file) {
            drop_temp();
            continue;
        }
        match guard.still(path, &current) {
            Ok(true) => {}
            Ok(false) => {
                drop_temp();
                guessed_wrong = guessed;
                continue;
            }
            Err(e) => {
                drop_temp();
                return Err(e);
            }
        }
        if let Err(source) = folder.rename(file_name(&temp), file_name(path)) {
            drop_temp();
            return Err(io_error(path, source));
        }
        guard.replaced = true;
        // A process that opened the note between the check and the rename waited for the
        // lease and now writes into the replaced file: its change is read from there once it
        // is done, and the note is written again on it.
        if let Some(theirs) = guard.missed_writer(path, &current)? {
            carried = Some((new, theirs));
            continue;
        }
        drop(guard);
        make_rename_durable(path, durable);
        return Ok(new);
    }
    Err(io_error(
        path,
        io::Error::other(format!(
            "note keeps changing ({MAX_ATTEMPTS} attempts); try again later"
        )),
    ))
}

/// [`update`]'s read of the note when the caller's text is not taken as it: `None` while a
/// writer has it open (tried again after a back-off).
fn read_current(path: &Path) -> Result<Option<String>, WriteError> {
    let Some(bytes) = read_unless_busy(path)? else {
        return Ok(None);
    };
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| WriteError::NotUtf8 {
            path: path.to_path_buf(),
        })
}

/// [`update`]'s base text: after a writer was caught in the rename (`carried`: what we wrote,
/// and their text), their text, built on while the note is still what we wrote over it.
fn carried_over(carried: Option<(String, String)>, current: &str, path: &Path) -> String {
    match carried {
        Some((ours, theirs)) if ours == current => theirs,
        Some(_) => {
            tracing::warn!(
                note = %path.display(),
                "a write that landed in the replaced copy of the note could not be carried over: the note changed again meanwhile"
            );
            current.to_owned()
        }
        None => current.to_owned(),
    }
}

/// The temp file of a note write, in the note's folder, created empty with the note's
/// permissions, then filled and renamed over the note. Every write makes its own, except a
/// results write begun while the note's calls still run, which has it made beforehand, off
/// the note's way to Done ([`update_note_settling`]'s `ahead`). Removed when dropped
/// unwritten; one left by a crash is swept as any other ([`is_stale_temp`]).
pub struct TempFile {
    /// The note it is made for, and its own path beside it.
    note: PathBuf,
    temp: PathBuf,
    /// Its folder and the file, open for writing, until it is filled.
    made: Option<(crate::beneath::Folder, File)>,
}

impl TempFile {
    /// Creates the temp file for the note at `path` below `root`, its folder reached as the
    /// write reaches it (without a symlink, docs/design.md §9.13).
    pub fn beside(root: &Path, path: &Path) -> io::Result<TempFile> {
        TempFile::make(Some(root), path)
    }

    /// The temp file for the note at `path`, its folder opened below `root` when given.
    fn make(root: Option<&Path>, path: &Path) -> io::Result<TempFile> {
        let folder = open_folder(root, path)?;
        let temp = temp_path(path);
        let file = create_temp(&folder, &temp, path)?;
        Ok(TempFile {
            note: path.to_path_buf(),
            temp,
            made: Some((folder, file)),
        })
    }

    fn is_beside(&self, path: &Path) -> bool {
        self.note == path
    }

    /// `new` written into it and (with `sync`) fsynced; its folder and its path, for the
    /// rename. Removed again if that fails.
    fn fill(mut self, new: &str, sync: bool) -> io::Result<(crate::beneath::Folder, PathBuf)> {
        let (folder, mut file) = self.made.take().expect("a temp file is filled once");
        let filled = file
            .write_all(new.as_bytes())
            .and_then(|()| if sync { file.sync_all() } else { Ok(()) });
        match filled {
            Ok(()) => Ok((folder, std::mem::take(&mut self.temp))),
            Err(e) => {
                let _ = folder.remove(file_name(&self.temp));
                Err(e)
            }
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some((folder, _)) = &self.made {
            let _ = folder.remove(file_name(&self.temp));
        }
    }
}

/// [`update`]'s last step, after the rename: its folder made durable as `durable` says. The
/// rename is done: a failed folder fsync only weakens durability after a crash, and
/// reporting it as a failed write would make the caller append twice.
fn make_rename_durable(path: &Path, durable: Durable) {
    match durable {
        Durable::Now => sync_parent(path),
        Durable::ByTheMove => {}
        Durable::Soon => {
            if let Some(parent) = path.parent() {
                crate::files::fsync_dir_soon(parent);
            }
        }
    }
}

/// Keeps other writers out of a note while it is replaced.
///
/// On Linux this is a write lease (`F_SETLEASE`, `F_WRLCK`): granted only while no other
/// process has the note open, and broken — which `still` sees — as soon as one opens
/// it, whose `open` then waits until the lease is released right after the rename. Where only
/// readers have the note open, a read lease shows that no one writes it; the re-read before
/// the rename is then the only guard. Where leases are refused (another user's note, network
/// file systems), a note modified within the last `QUIET` is taken to be busy.
struct Guard {
    file: File,
    write_lease: bool,
    /// The note was renamed over: `file` is the replaced one.
    replaced: bool,
}

impl Guard {
    /// `None` while another process has the note open for writing.
    fn take(path: &Path) -> Result<Option<Guard>, WriteError> {
        let file = crate::files::open_regular(path).map_err(|e| read_error(path, e))?;
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            ignore_lease_break_signal();
            let fd = file.as_raw_fd();
            // SAFETY: fcntl on a valid, open descriptor owned by `file`.
            if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) } == 0 {
                return Ok(Some(Guard {
                    file,
                    write_lease: true,
                    replaced: false,
                }));
            }
            if io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) {
                // Someone has it open: a writer (busy) or only readers (fine).
                return Ok((!writer_busy(path)?).then_some(Guard {
                    file,
                    write_lease: false,
                    replaced: false,
                }));
            }
        }
        if modified_within(path, QUIET)? {
            return Ok(None);
        }
        Ok(Some(Guard {
            file,
            write_lease: false,
            replaced: false,
        }))
    }

    /// Whether the note is still exactly `current`, read through the guard's own descriptor
    /// (opening the note again, even from this process, would break the lease), and — under
    /// a write lease — the path still names this file and no process has opened it since.
    fn still(&self, path: &Path, current: &str) -> Result<bool, WriteError> {
        use std::io::Seek;
        let mut bytes = Vec::new();
        let mut file = &self.file;
        // One byte more than `current`: a note that grew is told by the first read.
        file.rewind()
            .and_then(|_| crate::files::read_rest(file, &mut bytes, current.len() + 1))
            .map_err(|e| read_error(path, e))?;
        if bytes != current.as_bytes() {
            return Ok(false);
        }
        #[cfg(target_os = "linux")]
        if self.write_lease {
            use std::os::fd::AsRawFd;
            use std::os::unix::fs::MetadataExt;
            let named = fs::symlink_metadata(path).map_err(|e| read_error(path, e))?;
            let ours = self.file.metadata().map_err(|e| read_error(path, e))?;
            // SAFETY: fcntl on a valid, open descriptor owned by `self.file`.
            let lease = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_GETLEASE) };
            return Ok(named.ino() == ours.ino()
                && named.dev() == ours.dev()
                && lease == libc::F_WRLCK);
        }
        Ok(true)
    }
}

impl Guard {
    /// After the rename: when a process opened the replaced file under the lease (it waits for
    /// the lease to go, then writes there), that file's text once it is done, if it differs
    /// from `current`. The lease is released here.
    fn missed_writer(&self, path: &Path, current: &str) -> Result<Option<String>, WriteError> {
        #[cfg(target_os = "linux")]
        if self.write_lease {
            use std::io::Seek;
            use std::os::fd::AsRawFd;
            let fd = self.file.as_raw_fd();
            // SAFETY: fcntl on a valid, open descriptor owned by `self.file`.
            if unsafe { libc::fcntl(fd, libc::F_GETLEASE) } == libc::F_WRLCK {
                return Ok(None);
            }
            // SAFETY: as above; the waiting opener goes on.
            unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
            for attempt in 1..=MAX_ATTEMPTS {
                // SAFETY: as above; a read lease is granted once no one has it open to write.
                if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) } == 0 {
                    // SAFETY: as above.
                    unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
                    break;
                }
                std::thread::sleep((BACKOFF_STEP * attempt).min(BACKOFF_MAX));
            }
            let mut bytes = Vec::new();
            let mut file = &self.file;
            file.rewind()
                .and_then(|_| crate::files::read_rest(file, &mut bytes, current.len() + 1))
                .map_err(|e| read_error(path, e))?;
            if bytes == current.as_bytes() {
                return Ok(None);
            }
            return String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| WriteError::NotUtf8 {
                    path: path.to_path_buf(),
                });
        }
        Ok(None)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.write_lease {
            use std::os::fd::AsRawFd;
            // SAFETY: as above; releasing lets a waiting opener proceed.
            unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
        }
        // After the rename this is the replaced file's last descriptor: its close frees the
        // old inode, which can wait for the disk (`files::close_soon`). A second descriptor
        // keeps the inode until the flusher closes it. Never for a file that still has a name
        // (a hard-link claim's first name): an open descriptor would keep the next write
        // there from taking its lease.
        use std::os::unix::fs::MetadataExt;
        if self.replaced
            && self.file.metadata().is_ok_and(|m| m.nlink() == 0)
            && let Ok(kept) = self.file.try_clone()
        {
            crate::files::close_soon(kept);
        }
    }
}

/// A broken lease is signalled to its holder with SIGIO, whose default action ends the
/// process. vaultd learns of breaks by asking (`F_GETLEASE`), so the signal is ignored.
#[cfg(target_os = "linux")]
fn ignore_lease_break_signal() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
        unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
    });
}

/// Reads a note once it has been quiet for a moment (or after about a second and a half of
/// waiting, whatever its state), so a note half-written in place is not taken for the whole.
pub fn read_settled(path: &Path) -> Result<Vec<u8>, WriteError> {
    for attempt in 1..=MAX_ATTEMPTS {
        if let Some(bytes) = read_unless_busy(path)? {
            return Ok(bytes);
        }
        std::thread::sleep((BACKOFF_STEP * attempt).min(BACKOFF_MAX));
    }
    crate::files::read_regular(path).map_err(|e| read_error(path, e))
}

/// The note's bytes, or None while another process may still be writing it (as
/// [`writer_busy`] tells): one open where a check and a read took two (every note is read
/// so twice on its way to Done, so the saved open counts).
fn read_unless_busy(path: &Path) -> Result<Option<Vec<u8>>, WriteError> {
    // Only a regular file: a FIFO named like a note would block the read forever (§9.15).
    let mut file = crate::files::open_regular(path).map_err(|e| read_error(path, e))?;
    let (bytes, busy) = read_noting_writer(&mut file).map_err(|e| read_error(path, e))?;
    Ok((!busy).then_some(bytes))
}

/// Reads an open note to its end and says whether another process may be writing it (then
/// the bytes may be half a note), as [`writer_busy`] decides. On Linux the read happens under
/// the read lease that answers the question, so no writer can open the note before it is read.
pub(crate) fn read_noting_writer(file: &mut File) -> io::Result<(Vec<u8>, bool)> {
    let read = |file: &mut File| {
        // Most notes fit: one read() for the bytes, one for the end.
        let mut bytes = Vec::new();
        crate::files::read_rest(file, &mut bytes, crate::files::NOTE_READ).map(|_| bytes)
    };
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        ignore_lease_break_signal();
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on a valid, open descriptor; the lease is dropped before it closes.
        if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) } == 0 {
            let bytes = read(file);
            // SAFETY: as above.
            unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
            return bytes.map(|b| (b, false));
        }
        if io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) {
            return read(file).map(|b| (b, true));
        }
    }
    let busy = recently_modified(&file.metadata()?, QUIET);
    read(file).map(|b| (b, busy))
}

/// True while another process may still be writing the note in place.
///
/// On Linux the answer is exact and immediate: a read lease (`F_SETLEASE`, `F_RDLCK`) is
/// refused with EAGAIN exactly when some process holds the file open for writing. The lease
/// is released at once; no lease-break signal is asked for (no `F_SETOWN`). Where leases are
/// not allowed (a note owned by another user, a network file system), a note modified within
/// the last `QUIET` is taken to be busy.
pub fn writer_busy(path: &Path) -> Result<bool, WriteError> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        ignore_lease_break_signal();
        let file = crate::files::open_regular(path).map_err(|e| read_error(path, e))?;
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on a valid, open descriptor; the lease is dropped before it closes.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) };
        if rc == 0 {
            // SAFETY: as above.
            unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
            return Ok(false);
        }
        if io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) {
            return Ok(true);
        }
    }
    modified_within(path, QUIET)
}

/// True when the note's mtime is less than `quiet` ago (a clock step back counts as quiet).
fn modified_within(path: &Path, quiet: Duration) -> Result<bool, WriteError> {
    let meta = fs::metadata(path).map_err(|e| read_error(path, e))?;
    Ok(recently_modified(&meta, quiet))
}

fn recently_modified(meta: &fs::Metadata, quiet: Duration) -> bool {
    meta.modified()
        .ok()
        .and_then(|m| m.elapsed().ok())
        .is_some_and(|age| age < quiet)
}

fn read_error(path: &Path, e: io::Error) -> WriteError {
    if e.kind() == io::ErrorKind::NotFound {
        WriteError::Gone(path.to_path_buf())
    } else {
        io_error(path, e)
    }
}

fn io_error(path: &Path, source: io::Error) -> WriteError {
    WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `.{name}.vaultd-{pid}-{n}.tmp` beside the note: hidden and `*.tmp`, so watchers (ours
/// included) ignore it. Long note names are cut so the temp name stays within NAME_MAX.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut cut = name.len().min(160);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let n = next_temp_number();
    let temp = format!(".{}.vaultd-{}-{n}.tmp", &name[..cut], std::process::id());
    path.with_file_name(temp)
}

/// True for a temp file of [`update_note`] (`.{name}.vaultd-{pid}-{n}.tmp`) written by a
/// process that no longer runs: a daemon, or a `vaultd` command, killed mid-write left it. The
/// daemon holding the vault lock calls this at start; a command running beside it (`vaultd
/// undo`, `approve`) may be writing one now, and its pid is alive (Linux's `/proc`; where that
/// is missing, none is taken to be). One with this process's pid is an earlier process's (the
/// pid reused, as a container's PID 1 is) when its number is below this process's first
/// ([`TEMP_BASE`]).
pub fn is_stale_temp(file_name: &str) -> bool {
    let Some(inner) = file_name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(".tmp"))
    else {
        return false;
    };
    let Some((_, tail)) = inner.rsplit_once(".vaultd-") else {
        return false;
    };
    let Some((pid, n)) = tail.split_once('-') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(n) {
        return false;
    }
    if pid == std::process::id().to_string() {
        return n.parse::<u64>().is_ok_and(|n| n < *TEMP_BASE);
    }
    !Path::new("/proc").join(pid).exists()
}

/// The folder of the note at `path`, opened once for one write: below the vault `root` without
/// following symlinks when there is one (docs/design.md §9.13), else as given.
fn open_folder(root: Option<&Path>, path: &Path) -> io::Result<crate::beneath::Folder> {
    let dir = path.parent().unwrap_or(Path::new(""));
    match root {
        Some(root) => crate::beneath::Folder::beneath(root, dir),
        None => crate::beneath::Folder::plain(dir),
    }
}

fn file_name(path: &Path) -> &std::ffi::OsStr {
    path.file_name().unwrap_or_default()
}

/// The temp file `temp` for `note`, created in `folder` (never over an existing one) with the
/// note's permissions.
fn create_temp(folder: &crate::beneath::Folder, temp: &Path, note: &Path) -> io::Result<File> {
    let file = folder.create_new(file_name(temp))?;
    if let Some(mode) = folder.mode_of(file_name(note)) {
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) = file.set_permissions(fs::Permissions::from_mode(mode)) {
            let _ = folder.remove(file_name(temp));
            return Err(e);
        }
    }
    Ok(file)
}

/// The folder fsync after a rename, shared with other writers of the same folder
/// ([`crate::files::fsync_dir`]).
fn sync_parent(path: &Path) {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    crate::files::fsync_dir(parent);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::fs::OpenOptions;

    fn note(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        fs::write(&path, bytes).unwrap();
        path
    }

    fn leftovers(dir: &tempfile::TempDir) -> Vec<String> {
        fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    /// A thread appending " more" to the note `guard` holds a write lease on; returns once
    /// the guard sees its open (which waits for the lease).
    #[cfg(target_os = "linux")]
    fn append_under(guard: &Guard, path: &Path) -> std::thread::JoinHandle<()> {
        let writer = {
            let path = path.to_path_buf();
            std::thread::spawn(move || {
                let mut f = OpenOptions::new().append(true).open(&path).unwrap();
                f.write_all(b" more").unwrap();
            })
        };
        let start = std::time::Instant::now();
        while guard.still(path, "text").unwrap() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the open was never seen"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        writer
    }

    #[test]
    fn a_half_written_note_is_left_to_its_writer_until_quiet() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"first half");
        let (opened_tx, opened_rx) = std::sync::mpsc::channel();
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                // An in-place writer still busy: appends every 10 ms for 200 ms.
                let mut f = OpenOptions::new().append(true).open(&path).unwrap();
                for i in 0..20 {
                    f.write_all(b" more").unwrap();
                    if i == 0 {
                        opened_tx.send(()).unwrap();
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        // Not a fixed sleep: on a loaded machine the writer had not opened the file 5 ms
        // later, and the update rightly found a quiet note (the test failed once in CI).
        opened_rx.recv().unwrap();
        let written = update_note(&path, |t| format!("{t}\nresult\n")).unwrap();
        writer.join().unwrap();
        assert_eq!(
            written,
            format!("first half{}\nresult\n", " more".repeat(20))
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), written);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_writer_opening_the_note_under_the_guard_is_seen_and_waits_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"text");
        let guard = Guard::take(&path)
            .unwrap()
            .expect("nobody has the note open");
        assert!(guard.write_lease, "a note of our own gets a write lease");
        assert!(guard.still(&path, "text").unwrap());
        // Blocks in open() until the guard is dropped.
        let writer = append_under(&guard, &path);
        drop(guard);
        writer.join().unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "text more");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_note_open_for_writing_is_not_read_until_its_writer_closes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"first half");
        let writer = OpenOptions::new().append(true).open(&path).unwrap();
        assert_eq!(read_unless_busy(&path).unwrap(), None);
        drop(writer);
        // Readers do not count; a note bigger than the first buffer is read whole.
        let _reader = File::open(&path).unwrap();
        let big = "line of a long note\n".repeat(5_000);
        fs::write(&path, &big).unwrap();
        assert_eq!(read_unless_busy(&path).unwrap(), Some(big.into_bytes()));
        assert!(matches!(
            read_unless_busy(&dir.path().join("gone.md")),
            Err(WriteError::Gone(_))
        ));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_writer_caught_in_the_rename_is_waited_for_and_its_text_read_from_the_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"text");
        let untouched = Guard::take(&path).unwrap().unwrap();
        assert_eq!(untouched.missed_writer(&path, "text").unwrap(), None);
        drop(untouched);
        let guard = Guard::take(&path).unwrap().unwrap();
        assert!(guard.write_lease);
        // Opens the file the name points to now; its open waits for the lease.
        let writer = append_under(&guard, &path);
        // The rename lands while that open waits: its write goes to the replaced file.
        let temp = dir.path().join(".a.md.new.tmp");
        fs::write(&temp, "text\nresult\n").unwrap();
        fs::rename(&temp, &path).unwrap();
        let theirs = guard.missed_writer(&path, "text").unwrap();
        writer.join().unwrap();
        assert_eq!(theirs.as_deref(), Some("text more"));
        assert_eq!(fs::read_to_string(&path).unwrap(), "text\nresult\n");
    }

    #[test]
    fn stale_temp_files_are_recognised_and_nothing_else() {
        assert!(is_stale_temp(".a.md.vaultd-4999998-7.tmp"));
        // Pids above Linux's largest (2^22) never run.
        assert!(is_stale_temp(".x.vaultd-y.md.vaultd-4999999-0.tmp"));
        let ours = temp_path(Path::new("/v/a.md"));
        assert!(!is_stale_temp(&ours.file_name().unwrap().to_string_lossy()));
        // An earlier process's with this pid (a container's PID 1, restarted): numbered below
        // this process's first.
        let me = std::process::id();
        let earlier = format!(".a.md.vaultd-{me}-{}.tmp", *TEMP_BASE - 1);
        assert!(is_stale_temp(&earlier));
        assert!(is_stale_temp(&format!(".a.md.vaultd-{me}-0.tmp")));
        let first = format!(".a.md.vaultd-{me}-{}.tmp", *TEMP_BASE);
        assert!(!is_stale_temp(&first));
        // A live process's (a `vaultd undo` beside the daemon): it may be writing it now.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let live = format!(".a.md.vaultd-{}-0.tmp", child.id());
        assert!(!is_stale_temp(&live));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(is_stale_temp(&live), "its process is gone");
        for other in [
            ".a.md.tmp",
            "a.md",
            ".a.md.vaultd-x-1.tmp",
            ".a.vaultd-1.tmp",
            "a.md.vaultd-1-2.tmp",
        ] {
            assert!(!is_stale_temp(other), "{other}");
        }
    }

    #[test]
    fn writes_the_built_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"hello\n");
        let written = update_note(&path, |t| format!("{t}world\n")).unwrap();
        assert_eq!(written, "hello\nworld\n");
        assert_eq!(fs::read_to_string(&path).unwrap(), "hello\nworld\n");
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn crlf_and_bom_bytes_are_preserved() {
        let dir = tempfile::tempdir().unwrap();
        let original = "\u{FEFF}a\r\nb  \r\n\r\nno newline";
        let path = note(&dir, "a.md", original.as_bytes());
        update_note(&path, |t| format!("{t}\r\nadded\r\n")).unwrap();
        let bytes = fs::read(&path).unwrap();
        assert!(bytes.starts_with(original.as_bytes()));
        assert_eq!(&bytes[original.len()..], b"\r\nadded\r\n");
    }

    #[test]
    fn permissions_are_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"x");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        update_note(&path, |t| format!("{t}y")).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
    }

    #[test]
    fn unchanged_text_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"same");
        let before = fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(update_note(&path, |t| t.to_string()).unwrap(), "same");
        assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), before);
    }

    #[test]
    fn gone_when_the_note_vanished() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.md");
        assert!(
            matches!(update_note(&path, |t| t.to_string()), Err(WriteError::Gone(p)) if p == path)
        );
    }

    #[test]
    fn gone_when_the_note_vanishes_during_build() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"x");
        let result = update_note(&path, |t| {
            let _ = fs::remove_file(&path);
            format!("{t}y")
        });
        assert!(matches!(result, Err(WriteError::Gone(_))), "{result:?}");
        assert!(!path.exists());
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn not_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"ok \xff\xfe bad");
        assert!(matches!(
            update_note(&path, |t| t.to_string()),
            Err(WriteError::NotUtf8 { .. })
        ));
        assert_eq!(fs::read(&path).unwrap(), b"ok \xff\xfe bad");
    }

    #[test]
    fn a_concurrent_change_is_kept_and_the_append_reapplied() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"original\n");
        let calls = Cell::new(0);
        let written = update_note(&path, |t| {
            calls.set(calls.get() + 1);
            if calls.get() == 1 {
                // Another writer (an editor) saves between our read and our rename.
                fs::write(&path, "original\nedited by a person\n").unwrap();
            }
            format!("{t}> result\n")
        })
        .unwrap();
        assert_eq!(calls.get(), 2);
        assert_eq!(written, "original\nedited by a person\n> result\n");
        assert_eq!(fs::read_to_string(&path).unwrap(), written);
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn gives_up_when_the_note_keeps_changing() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"0");
        let calls = Cell::new(0);
        let result = update_note(&path, |t| {
            calls.set(calls.get() + 1);
            fs::write(&path, calls.get().to_string()).unwrap();
            format!("{t}!")
        });
        match result {
            Err(WriteError::Io { source, .. }) => {
                assert!(source.to_string().contains("keeps changing"), "{source}")
            }
            other => panic!("expected an Io error, got {other:?}"),
        }
        // Attempts that find the note freshly modified wait without building.
        assert!((1..=MAX_ATTEMPTS as i32).contains(&calls.get()));
        assert_eq!(fs::read_to_string(&path).unwrap(), calls.get().to_string());
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn read_only_folder_is_an_io_error_and_the_note_is_unchanged() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            eprintln!("skipped: root ignores folder permissions");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"keep me");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o555)).unwrap();
        let result = update_note(&path, |t| format!("{t} changed"));
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(result, Err(WriteError::Io { .. })), "{result:?}");
        assert_eq!(fs::read(&path).unwrap(), b"keep me");
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn unwritable_folder_is_an_io_error_even_for_root() {
        // A temp file cannot be created where the folder is really a file's path.
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"keep me");
        let err = open_folder(None, &dir.path().join("a.md/b.md"))
            .map(drop)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotADirectory);
        assert_eq!(fs::read(&path).unwrap(), b"keep me");
    }

    #[test]
    fn a_folder_swapped_for_a_symlink_during_the_write_is_refused_and_nothing_lands_anywhere() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("vault");
        let folder = root.join("In_Progress");
        let (outside, moved) = (dir.path().join("outside"), dir.path().join("moved"));
        fs::create_dir_all(&folder).unwrap();
        fs::create_dir_all(&outside).unwrap();
        let path = folder.join("a.md");
        fs::write(&path, "text").unwrap();
        fs::write(outside.join("a.md"), "text").unwrap();
        // Between the temp file and the rename (the journal settle of a results write), the
        // folder is moved away and a symlink to a folder outside the vault takes its name.
        let mut swapped = false;
        let written = update_note_settling(
            &root,
            &path,
            |t| format!("{t} + result"),
            false,
            &mut || {
                if !std::mem::replace(&mut swapped, true) {
                    fs::rename(&folder, &moved).unwrap();
                    std::os::unix::fs::symlink(&outside, &folder).unwrap();
                }
            },
            None,
            None,
        );
        assert!(
            written.as_ref().is_err_and(WriteError::is_symlink_refusal),
            "{written:?}"
        );
        assert_eq!(fs::read_to_string(outside.join("a.md")).unwrap(), "text");
        assert_eq!(fs::read_to_string(moved.join("a.md")).unwrap(), "text");
        let left: Vec<_> = fs::read_dir(&moved)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 1, "no temp file left behind: {left:?}");
    }

    #[test]
    fn temp_files_are_hidden_tmp_beside_the_note_and_short() {
        let temp = temp_path(Path::new("/v/Needs_Action/a.md"));
        let name = temp.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(temp.parent(), Some(Path::new("/v/Needs_Action")));
        assert!(
            name.starts_with(".a.md.vaultd-") && name.ends_with(".tmp"),
            "{name}"
        );
        let long = format!("/v/{}.md", "é".repeat(120));
        let temp = temp_path(Path::new(&long));
        assert!(temp.file_name().unwrap().len() < 255);
        assert_ne!(
            temp_path(Path::new("/v/a.md")),
            temp_path(Path::new("/v/a.md"))
        );
    }

    /// A temp file made ahead ([`TempFile::beside`]) has the note's permissions and is the
    /// file the write fills and renames over the note; one made for another note is not
    /// used, and one dropped unwritten is removed: no temp file is left either way.
    #[test]
    fn a_temp_file_made_ahead_is_filled_for_its_own_note_and_removed_otherwise() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"old");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let ahead = TempFile::beside(dir.path(), &path).unwrap();
        let made = dir.path().join(&leftovers(&dir)[0]);
        let ino = fs::metadata(&made).unwrap().ino();
        assert_eq!(fs::metadata(&made).unwrap().mode() & 0o777, 0o640);
        let append_with = |ahead| {
            let append = |t: &str| format!("{t} + result");
            update_note_settling(dir.path(), &path, append, true, &mut || {}, None, ahead)
        };
        assert_eq!(append_with(Some(ahead)).unwrap(), "old + result");
        assert_eq!(fs::metadata(&path).unwrap().ino(), ino);
        assert_eq!(fs::read_to_string(&path).unwrap(), "old + result");
        assert!(leftovers(&dir).is_empty());

        let other = note(&dir, "b.md", b"other");
        let ahead = TempFile::beside(dir.path(), &other).unwrap();
        assert_eq!(append_with(Some(ahead)).unwrap(), "old + result + result");
        assert!(leftovers(&dir).is_empty());

        drop(TempFile::beside(dir.path(), &path).unwrap());
        assert!(leftovers(&dir).is_empty());
        assert_eq!(fs::read_to_string(&other).unwrap(), "other");
    }

    /// The results write's hook (where it waits for its outcomes to be durable) runs once
    /// the new text is in a fsynced temp file and before the note is replaced: a result block
    /// is never in the note before its outcome is in the journal.
    #[test]
    fn the_hook_runs_before_the_rename_with_the_new_text_in_its_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, "a.md", b"old");
        let mut seen = Vec::new();
        let written = update_note_settling(
            dir.path(),
            &path,
            |t| format!("{t} + result"),
            true,
            &mut || {
                let note_now = fs::read_to_string(&path).unwrap();
                let temps: Vec<String> = leftovers(&dir)
                    .iter()
                    .map(|t| fs::read_to_string(dir.path().join(t)).unwrap())
                    .collect();
                seen.push((note_now, temps));
            },
            None,
            None,
        )
        .unwrap();
        assert_eq!(written, "old + result");
        assert_eq!(
            seen,
            vec![("old".to_string(), vec!["old + result".to_string()])]
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "old + result");
        assert!(leftovers(&dir).is_empty());
    }

    /// The text the caller last saw is built on without reading the note first while it is
    /// the note's text; once the note changed (the agent added a line mid-run), the note is
    /// read and built on, and the other writer's change is kept. A last-seen text that needs
    /// nothing added says nothing of the note until it is read.
    #[test]
    fn the_callers_last_seen_text_is_built_on_only_while_it_is_the_notes() {
        let dir = tempfile::tempdir().unwrap();
        let built = std::cell::RefCell::new(Vec::new());
        let append = |t: &str| {
            built.borrow_mut().push(t.to_string());
            format!("{t} + result")
        };
        let write = |name: &str, on_disk: &[u8], last_seen: &str| {
            built.borrow_mut().clear();
            let path = note(&dir, name, on_disk);
            let written = update_note_settling(
                dir.path(),
                &path,
                append,
                true,
                &mut || {},
                Some(last_seen),
                None,
            )
            .unwrap();
            assert_eq!(fs::read_to_string(&path).unwrap(), written);
            (written, built.borrow().clone())
        };
        assert_eq!(
            write("a.md", b"old", "old"),
            ("old + result".to_string(), vec!["old".to_string()])
        );
        assert_eq!(
            write("b.md", b"old\nthe agent's line", "old"),
            (
                "old\nthe agent's line + result".to_string(),
                vec!["old".to_string(), "old\nthe agent's line".to_string()]
            )
        );
        let path = note(&dir, "c.md", b"changed");
        let written = update_note_settling(
            dir.path(),
            &path,
            |t| {
                if t == "done" {
                    t.to_string()
                } else {
                    format!("{t} + result")
                }
            },
            true,
            &mut || {},
            Some("done"),
            None,
        )
        .unwrap();
        assert_eq!(written, "changed + result");
        assert_eq!(fs::read_to_string(&path).unwrap(), "changed + result");
        assert!(leftovers(&dir).is_empty());
        // A note whose folder went away meanwhile is gone, as when it was read first.
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        let path = sub.join("d.md");
        fs::write(&path, "old").unwrap();
        fs::remove_dir_all(&sub).unwrap();
        let written = update_note_settling(
            dir.path(),
            &path,
            append,
            true,
            &mut || {},
            Some("old"),
            None,
        );
        assert!(matches!(written, Err(WriteError::Gone(_))), "{written:?}");
    }

    /// A file a write replaced under one name but that keeps another (a hard-link claim's
    /// first name) is closed at once: a descriptor kept for the flusher would keep the next
    /// write there from taking its lease.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_replaced_file_that_keeps_another_name_is_closed_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("first.md");
        let claimed = dir.path().join("claimed.md");
        fs::write(&first, "a\n").unwrap();
        fs::hard_link(&first, &claimed).unwrap();
        update_note(&claimed, |t| format!("{t}b\n")).unwrap();
        let guard = Guard::take(&first).unwrap().expect("no writer");
        assert!(guard.write_lease, "no descriptor of ours left open on it");
    }

    #[test]
    fn long_note_names_can_be_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = note(&dir, &format!("{}.md", "n".repeat(250)), b"x");
        assert_eq!(update_note(&path, |t| format!("{t}y")).unwrap(), "xy");
    }
}
