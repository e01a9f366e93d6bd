//! Files read and made durable the careful way, for every layer: a note, a config or a vault
//! file is opened only as a regular file (never a FIFO that would block, never through a
//! symlink at its own name, docs/design.md §9.15), and folder fsyncs are shared between the
//! callers that need one at the same time. A leaf: it uses nothing of vaultd.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

/// Opens a file of the vault for reading: never through a symlink at its own name, never
/// waiting for a FIFO's writer (`O_NONBLOCK`), and only a regular file (docs/design.md §9.15): a FIFO
/// named `x.md`, a socket or a device gives an `InvalidInput` error that says what it is.
pub fn open_regular(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a symlink; vaultd never reads through one",
                    path.display()
                ),
            ),
            _ => e,
        })?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    let what = if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_dir() {
        "a folder"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is {what}, not a regular file; vaultd reads only regular files",
            path.display()
        ),
    ))
}

/// [`open_regular`], read whole.
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    read_rest(&open_regular(path)?, &mut bytes, NOTE_READ)?;
    Ok(bytes)
}

/// Room made for a note before it is read: most notes fit in one `read`.
pub const NOTE_READ: usize = 8 * 1024;

/// Reads `file` from where it is to its end into `bytes`, `room` bytes reserved first. Not
/// std's `File::read_to_end`, which asks the file's size and position first (a `statx` and
/// an `lseek` for every read, a note read three times on its way to Done): the reads grow
/// the buffer as they need, and a note that fits `room` takes one `read` and one more for
/// its end.
pub fn read_rest(mut file: &std::fs::File, bytes: &mut Vec<u8>, room: usize) -> io::Result<usize> {
    use std::io::Read;
    bytes.reserve(room);
    Read::by_ref(&mut file).take(u64::MAX).read_to_end(bytes)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path) -> io::Result<String> {
    String::from_utf8(read_regular(path)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}

/// A new file without a name in `folder` (`O_TMPFILE`), `mode` less the umask, open for
/// writing; `None` where the file system or kernel has no `O_TMPFILE` (NFS, some FUSE file
/// systems). [`link_unnamed`] gives it its name once it is written, so no reader ever finds
/// it in part.
pub fn unnamed_in(folder: &Path, mode: u32) -> Option<std::fs::File> {
    use rustix::fs::{Mode, OFlags};
    let folder = if folder.as_os_str().is_empty() {
        Path::new(".")
    } else {
        folder
    };
    rustix::fs::openat(
        rustix::fs::CWD,
        folder,
        OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .ok()
    .map(std::fs::File::from)
}

/// Names a file of [`unnamed_in`] `path` (in the same folder), never over an existing name
/// (`EEXIST`). Through `/proc/self/fd`: linking the descriptor itself (`AT_EMPTY_PATH`)
/// needs CAP_DAC_READ_SEARCH.
pub fn link_unnamed(file: &std::fs::File, path: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let by_fd = format!("/proc/self/fd/{}", file.as_raw_fd());
    rustix::fs::linkat(
        rustix::fs::CWD,
        by_fd.as_str(),
        rustix::fs::CWD,
        path,
        rustix::fs::AtFlags::SYMLINK_FOLLOW,
    )?;
    Ok(())
}

/// Makes renames into or out of `dir` durable, sharing fsyncs between callers (for throughput):
/// a caller that arrives while an fsync of the same folder runs waits for the next one, which
/// then serves every caller that arrived meanwhile — ten notes finishing together cost two
/// folder fsyncs, not ten. Each caller returns only after an fsync that *started* after its
/// call, so its own rename is covered. Errors are ignored: some file systems refuse fsync on
/// folders. Blocking: call it where blocking IO is allowed.
pub fn fsync_dir(dir: &Path) {
    static DIRS: std::sync::LazyLock<Mutex<HashMap<PathBuf, Arc<SharedSync>>>> =
        std::sync::LazyLock::new(Default::default);
    let shared = DIRS
        .lock()
        .expect("folder sync map poisoned")
        .entry(dir.to_path_buf())
        .or_default()
        .clone();
    shared.sync(|| {
        if let Ok(f) = std::fs::File::open(dir) {
            let _ = f.sync_all();
        }
    });
}

/// Makes renames into or out of `dir` durable *soon*, for a caller that need not wait: the
/// folder is marked, and a background thread fsyncs every marked folder once per round, a
/// round starting [`FLUSH_LINGER`] after the first mark (so one round covers every note that
/// moved meanwhile: under load, one fsync per folder for dozens of notes). What a crash can
/// cost of such a rename, and why that is safe where it is used, is argued in
/// `journal/mod.rs` ("Durability soon"). [`flush_folders`] waits for every mark so far.
pub fn fsync_dir_soon(dir: &Path) {
    FLUSHER.mark(dir);
}

/// Closes `file` soon, on the flusher's thread: for the last descriptor of a note that a
/// write replaced. Its close frees the old inode, and on a file system mounted with
/// `discard` (as cloud disks often are) that waits for the device to discard its blocks,
/// about 0.1 ms here for a note that had reached the disk: time that was spent between a
/// note's results write and its move. A few hundred waiting files at most; past that the
/// caller closes its own.
pub fn close_soon(file: std::fs::File) {
    FLUSHER.close(file);
}

/// Returns once every folder marked by [`fsync_dir_soon`] before the call is fsynced: at the
/// end of `once` and of `run`, and before anything that must find the moves durable.
pub fn flush_folders() {
    FLUSHER.flush();
}

/// How many folder marks ([`fsync_dir_soon`]) were made so far: what a later
/// [`flush_folders_through`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FolderMarks(u64);

/// The marks made so far, the caller's own among them.
pub fn folder_marks() -> FolderMarks {
    FolderMarks(FLUSHER.lock().marked)
}

/// Returns once every folder marked before `marks` were taken is fsynced; at once when a
/// round since covered them, whatever was marked after. A link claim's first name, dropped
/// a grace after the claim, so waits for its link's folder only, and finds it durable by
/// then: it no longer forces a round for the folders of the notes in flight since (which
/// put two folder fsyncs beside every note of a steady stream).
pub fn flush_folders_through(marks: FolderMarks) {
    FLUSHER.flush_to(marks.0);
}

/// How long the flusher waits after a first mark before its round: long enough for the notes
/// in flight to join it, short against what a crash could then cost (moves recovery redoes).
pub const FLUSH_LINGER: std::time::Duration = std::time::Duration::from_millis(50);

static FLUSHER: std::sync::LazyLock<Flusher> = std::sync::LazyLock::new(Flusher::default);

/// The folders marked and not yet fsynced, and the rounds: marks numbered, the last covered.
#[derive(Default)]
struct Flusher {
    state: Mutex<FlushState>,
    /// Wakes the thread: a first mark, or a flush that cannot wait for the linger.
    wake: Condvar,
    /// Wakes flushers: a round ended.
    done: Condvar,
}

#[derive(Default)]
struct FlushState {
    dirty: std::collections::BTreeSet<PathBuf>,
    /// Files to close in the next round ([`close_soon`]).
    closing: Vec<std::fs::File>,
    marked: u64,
    durable: u64,
    urgent: bool,
    started: bool,
}

impl FlushState {
    /// Nothing to do: the thread sleeps until a first mark or file.
    fn idle(&self) -> bool {
        self.dirty.is_empty() && self.closing.is_empty()
    }
}

impl Flusher {
    fn lock(&self) -> std::sync::MutexGuard<'_, FlushState> {
        // Only plain values inside: a panic while it was held left them consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mark(&'static self, dir: &Path) {
        let mut st = self.lock();
        // The thread waits for a first mark only: with work waiting it is in its linger or
        // its round, and waking it for every mark (a context switch each, several per note)
        // would only put it back to sleep.
        let first = st.idle();
        if !st.dirty.contains(dir) {
            st.dirty.insert(dir.to_path_buf());
        }
        st.marked += 1;
        if !self.started(&mut st) {
            // No thread to be had: this caller makes its own mark durable.
            drop(st);
            self.round();
            return;
        }
        if first {
            self.wake.notify_one();
        }
    }

    fn close(&'static self, file: std::fs::File) {
        /// Beyond this many the caller closes its own: descriptors are a limited resource.
        const MAX_CLOSING: usize = 256;
        let mut st = self.lock();
        if st.closing.len() >= MAX_CLOSING || !self.started(&mut st) {
            drop(st);
            drop(file);
            return;
        }
        let first = st.idle();
        st.closing.push(file);
        if first {
            self.wake.notify_one();
        }
    }

    /// Starts the thread if it is not running yet; false when no thread can be had.
    fn started(&'static self, st: &mut FlushState) -> bool {
        if !st.started {
            let spawned = std::thread::Builder::new()
                .name("vaultd-fsync".into())
                .spawn(move || {
                    crate::background::this_thread();
                    self.run()
                });
            st.started = spawned.is_ok();
        }
        st.started
    }

    fn flush(&self) {
        let target = self.lock().marked;
        self.flush_to(target);
    }

    /// Returns once the first `target` marks are durable.
    fn flush_to(&self, target: u64) {
        let mut st = self.lock();
        if st.durable >= target {
            return;
        }
        if !st.started {
            drop(st);
            self.round();
            return;
        }
        st.urgent = true;
        self.wake.notify_one();
        while st.durable < target {
            st = self.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn run(&self) {
        loop {
            let mut st = self.lock();
            while st.idle() {
                st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if !st.urgent {
                st = self
                    .wake
                    .wait_timeout_while(st, FLUSH_LINGER, |st| !st.urgent)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            drop(st);
            self.round();
        }
    }

    /// fsyncs every marked folder (each through the shared [`fsync_dir`]) and records the
    /// marks it covered.
    fn round(&self) {
        let (dirs, closing, covers) = {
            let mut st = self.lock();
            st.urgent = false;
            (
                std::mem::take(&mut st.dirty),
                std::mem::take(&mut st.closing),
                st.marked,
            )
        };
        for dir in &dirs {
            fsync_dir(dir);
        }
        {
            let mut st = self.lock();
            st.durable = st.durable.max(covers);
            self.done.notify_all();
        }
        // After the flushers are answered: a close can wait for the disk.
        drop(closing);
    }
}

/// One folder's shared fsync: generations requested and made durable.
#[derive(Default)]
struct SharedSync {
    state: Mutex<SyncState>,
    done: Condvar,
}

#[derive(Default)]
struct SyncState {
    /// Callers so far; a caller's number is its generation.
    requested: u64,
    /// Every generation up to this one is covered by a finished fsync.
    durable: u64,
    running: bool,
}

impl SharedSync {
    fn sync(&self, fsync: impl Fn()) {
        let mut st = self.state.lock().expect("folder sync poisoned");
        st.requested += 1;
        let mine = st.requested;
        while st.durable < mine {
            if st.running {
                st = self.done.wait(st).expect("folder sync poisoned");
                continue;
            }
            // This caller runs the fsync for everyone who asked before it starts.
            st.running = true;
            let covers = st.requested;
            drop(st);
            fsync();
            st = self.state.lock().expect("folder sync poisoned");
            st.running = false;
            st.durable = st.durable.max(covers);
            self.done.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn read_rest_reads_from_where_the_file_is_to_its_end_whatever_room_was_made() {
        use std::io::{Seek, SeekFrom};
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, 31, 32, 33, 100, 8 * 1024, 8 * 1024 + 1, 70_000] {
            let text: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let path = dir.path().join(format!("n{len}.md"));
            std::fs::write(&path, &text).unwrap();
            for room in [0, 1, len, len + 1, NOTE_READ] {
                let mut file = std::fs::File::open(&path).unwrap();
                let mut bytes = b"kept".to_vec();
                assert_eq!(read_rest(&file, &mut bytes, room).unwrap(), len);
                assert_eq!(&bytes[4..], &text[..], "len {len}, room {room}");
                assert_eq!(&bytes[..4], b"kept", "appended, not replacing");
                // From where the file is: after a seek, the rest only.
                let from = len / 2;
                file.seek(SeekFrom::Start(from as u64)).unwrap();
                let mut rest = Vec::new();
                read_rest(&file, &mut rest, room).unwrap();
                assert_eq!(rest, text[from..], "len {len}, room {room}, from {from}");
            }
        }
        assert_eq!(
            read_regular(&dir.path().join("n70000.md")).unwrap().len(),
            70_000
        );
    }

    /// A file handed to `close_soon` stays open until the round after it, then is closed.
    /// The round closes its files right after it answers the flushers (a close can wait for
    /// the disk), and other tests' marks share the process's flusher: so the close is waited
    /// for, a little, after the flush.
    #[test]
    fn a_file_closed_soon_is_closed_by_the_next_round() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replaced.md");
        std::fs::write(&path, "old").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let open = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .any(|target| {
                    target
                        .to_string_lossy()
                        .starts_with(&*path.to_string_lossy())
                })
        };
        assert!(open());
        close_soon(file);
        fsync_dir_soon(dir.path());
        flush_folders();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while open() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!open(), "closed by the round the flush waited for");
    }

    #[test]
    fn marked_folders_are_fsynced_in_shared_rounds_and_a_flush_waits_for_its_marks() {
        let flusher: &'static Flusher = Box::leak(Box::default());
        let dir = tempfile::tempdir().unwrap();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let sub = dir.path().join(format!("d{}", i % 3));
                std::fs::create_dir_all(&sub).unwrap();
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        flusher.mark(&sub);
                    }
                    let mine = flusher.lock().marked;
                    flusher.flush();
                    let st = flusher.lock();
                    assert!(
                        st.durable >= mine,
                        "a flush returned before its marks were covered"
                    );
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let st = flusher.lock();
        assert_eq!((st.marked, st.durable), (160, 160));
        assert!(st.dirty.is_empty(), "{:?}", st.dirty);
    }

    /// A flush through older marks returns at once when a round covered them, and does not
    /// force a round for the marks made since (they wait for their linger); one through the
    /// newest marks does. (Judged only on an attempt that took well under the linger: a round
    /// that came on its own would make any answer right.)
    #[test]
    fn a_flush_through_covered_marks_leaves_later_marks_to_their_round() {
        let dir = tempfile::tempdir().unwrap();
        for _ in 0..20 {
            let flusher: &'static Flusher = Box::leak(Box::default());
            flusher.mark(dir.path());
            let linked = flusher.lock().marked;
            flusher.flush();
            flusher.mark(dir.path()); // a later note's: its round is FLUSH_LINGER away
            let marked_at = std::time::Instant::now();
            let later = flusher.lock().marked;
            flusher.flush_to(linked);
            let st = flusher.lock();
            if marked_at.elapsed() > FLUSH_LINGER / 2 {
                continue; // too slow to tell
            }
            assert_eq!((st.durable, st.marked), (linked, later), "no round forced");
            drop(st);
            flusher.flush_to(later);
            assert_eq!(flusher.lock().durable, later);
            return;
        }
        panic!("no attempt took less than half of FLUSH_LINGER");
    }

    #[test]
    fn concurrent_folder_syncs_share_fsyncs_and_each_waits_for_one_started_after_it() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let shared = Arc::new(SharedSync::default());
        let fsyncs = Arc::new(AtomicU64::new(0));
        // Callers number themselves on arrival; each finished fsync raises `covered` to the
        // number of callers that had arrived when it started.
        let arrived = Arc::new(AtomicU64::new(0));
        let covered = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let (shared, fsyncs) = (shared.clone(), fsyncs.clone());
                let (arrived, covered) = (arrived.clone(), covered.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let me = arrived.fetch_add(1, Ordering::SeqCst) + 1;
                        shared.sync(|| {
                            let at_start = arrived.load(Ordering::SeqCst);
                            fsyncs.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_micros(200));
                            covered.fetch_max(at_start, Ordering::SeqCst);
                        });
                        let c = covered.load(Ordering::SeqCst);
                        assert!(
                            c >= me,
                            "caller {me} returned before an fsync covered it ({c})"
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let st = shared.state.lock().unwrap();
        assert_eq!((st.requested, st.durable, st.running), (800, 800, false));
        let n = fsyncs.load(Ordering::SeqCst);
        assert!(n < 800, "fsyncs were shared: {n} for 800 callers");
    }
}
