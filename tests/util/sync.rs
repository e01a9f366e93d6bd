//! A small sync client for the synced-vault tests (docs/design.md §9.9): keeps two vault folders in
//! sync the way Syncthing-like clients do. Every `delay` after a note changed on one side
//! (written, created, renamed, deleted) the change reaches the other side: written to a hidden
//! temp file and renamed into place, with the source's mtime. When both sides changed a note,
//! the incoming version takes the name and the other is kept as a `.sync-conflict-` copy; a
//! deletion never beats a modification. Renames are a deletion plus a creation, as a client
//! that does not detect moves shows them. Real clients' merge rules are not simulated.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// One file's content as the client last saw it (None: absent).
type Content = Option<(Vec<u8>, SystemTime)>;

/// Two vaults kept in sync until dropped.
pub struct SyncPair {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Changes carried across so far.
    pub applied: Arc<AtomicUsize>,
}

impl SyncPair {
    /// Copies `a` onto `b` (notes only), then keeps them in sync with `delay`.
    pub fn start(a: &Path, b: &Path, delay: Duration) -> SyncPair {
        let mut base: HashMap<String, Vec<u8>> = HashMap::new();
        for (rel, (bytes, mtime)) in scan(a) {
            write_atomically(&b.join(&rel), &bytes, mtime);
            base.insert(rel, bytes);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let applied = Arc::new(AtomicUsize::new(0));
        let mut client = Client {
            sides: [a.to_path_buf(), b.to_path_buf()],
            base,
            pending: HashMap::new(),
            delay,
            conflicts: 0,
            applied: applied.clone(),
        };
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                client.step();
                std::thread::sleep(Duration::from_millis(25));
            }
        });
        SyncPair {
            stop,
            thread: Some(thread),
            applied,
        }
    }
}

impl Drop for SyncPair {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Client {
    sides: [PathBuf; 2],
    /// The last content both sides agreed on, per note.
    base: HashMap<String, Vec<u8>>,
    /// (from side, note) -> the content to carry over and when it is due.
    pending: HashMap<(usize, String), (Content, Instant)>,
    delay: Duration,
    conflicts: usize,
    applied: Arc<AtomicUsize>,
}

impl Client {
    fn step(&mut self) {
        let now = Instant::now();
        let snaps = [scan(&self.sides[0]), scan(&self.sides[1])];
        // New changes on either side are queued (a change that changes again waits anew).
        for (from, snap) in snaps.iter().enumerate() {
            let mut names: Vec<&String> = snap.keys().collect();
            names.extend(self.base.keys().filter(|k| !snap.contains_key(*k)));
            for rel in names {
                let current = snap.get(rel).cloned();
                let same_as_base = match (&current, self.base.get(rel)) {
                    (Some((bytes, _)), Some(b)) => bytes == b,
                    (None, None) => true,
                    _ => false,
                };
                let key = (from, rel.clone());
                if same_as_base {
                    self.pending.remove(&key);
                    continue;
                }
                let queued_same = self
                    .pending
                    .get(&key)
                    .is_some_and(|(c, _)| bytes_of(c) == bytes_of(&current));
                if !queued_same {
                    self.pending.insert(key, (current, now + self.delay));
                }
            }
        }
        let due: Vec<(usize, String)> = self
            .pending
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            let Some((content, _)) = self.pending.remove(&key) else {
                continue;
            };
            let (from, rel) = key;
            self.carry(from, &rel, content);
        }
    }

    /// Applies one side's version of `rel` to the other side.
    fn carry(&mut self, from: usize, rel: &str, content: Content) {
        let to = 1 - from;
        // The source may have changed again since: that version is queued on its own.
        if bytes_of(&read(&self.sides[from].join(rel))) != bytes_of(&content) {
            return;
        }
        let target = self.sides[to].join(rel);
        let there = read(&target);
        let base = self.base.get(rel).cloned();
        let there_unchanged = bytes_of(&there) == base.as_deref();
        match (&content, &there) {
            _ if bytes_of(&there) == bytes_of(&content) => {}
            // Deleted here, modified there: the modification wins (it comes back the other way).
            (None, Some(_)) if !there_unchanged => return,
            (None, _) => {
                let _ = std::fs::remove_file(&target);
            }
            (Some((bytes, mtime)), Some((old, old_mtime))) if !there_unchanged => {
                self.conflicts += 1;
                let copy = conflict_name(&target, self.conflicts);
                write_atomically(&copy, old, *old_mtime);
                write_atomically(&target, bytes, *mtime);
                self.pending.remove(&(to, rel.to_string()));
            }
            (Some((bytes, mtime)), _) => write_atomically(&target, bytes, *mtime),
        }
        match content {
            Some((bytes, _)) => self.base.insert(rel.to_string(), bytes),
            None => self.base.remove(rel),
        };
        self.applied.fetch_add(1, Ordering::SeqCst);
    }
}

fn bytes_of(c: &Content) -> Option<&[u8]> {
    c.as_ref().map(|(b, _)| b.as_slice())
}

fn read(path: &Path) -> Content {
    let bytes = std::fs::read(path).ok()?;
    let mtime = std::fs::metadata(path).ok()?.modified().ok()?;
    Some((bytes, mtime))
}

/// `a.md` -> `a.sync-conflict-<n>.md` (Syncthing's shape; vaultd ignores it).
fn conflict_name(path: &Path, n: usize) -> PathBuf {
    let stem = path.file_stem().unwrap().to_string_lossy();
    path.with_file_name(format!("{stem}.sync-conflict-{n}.md"))
}

/// What a sync client does: a hidden temp file beside the target, then a rename.
fn write_atomically(target: &Path, bytes: &[u8], mtime: SystemTime) {
    static TEMPS: AtomicUsize = AtomicUsize::new(0);
    let Some(dir) = target.parent() else { return };
    let _ = std::fs::create_dir_all(dir);
    let tmp = dir.join(format!(
        ".syncing-{}.tmp",
        TEMPS.fetch_add(1, Ordering::SeqCst)
    ));
    if std::fs::write(&tmp, bytes).is_err() {
        return;
    }
    if let Ok(f) = std::fs::File::options().write(true).open(&tmp) {
        let _ = f.set_modified(mtime);
    }
    if std::fs::rename(&tmp, target).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Every note (`*.md`, no hidden part, no temp file) under `root`, by relative path.
fn scan(root: &Path) -> HashMap<String, (Vec<u8>, SystemTime)> {
    let mut out = HashMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut HashMap<String, (Vec<u8>, SystemTime)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            walk(root, &path, out);
        } else if ft.is_file()
            && name.ends_with(".md")
            && let Some(c) = read(&path)
        {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.insert(rel, c);
        }
    }
}
