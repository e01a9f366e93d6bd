//! Notes that arrive by rename are claimed at once without breaking the program that moved
//! them. GNU `mv a.md b.md Needs_Action/` `lstat`s each note right after renaming it (to
//! refuse overwriting a file it just created); a note claimed (renamed away) in between made
//! `mv` fail. So a note renamed in is claimed by a hard link into `In_Progress/`: it runs at
//! once, while its first name stays for `moved_in_grace` and is then dropped — only if it
//! still names the claimed file (a note saved there meanwhile is never removed).
//!
//! Crash safety: the left-behind name's file key is recorded in the journal with the claim
//! (`Journal::begin_linked_run`); at start-up such names, and set-aside names of an
//! interrupted drop, are settled before the inbox is scanned, so a left-behind name is never
//! taken for a new note. A file system without hard links falls back to waiting
//! `moved_in_grace`, then renaming.

use crate::journal::LinkClaim;
use crate::recent::Recent;
use crate::vault::{FileKey, LeftBehind, Vault};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// The arrivals of one daemon: when each note was renamed in, and the names its link claims
/// left behind until they are dropped.
#[derive(Debug, Default)]
pub struct Arrivals {
    grace: Duration,
    /// Path -> when a rename brought it in, for one grace.
    arrived: Mutex<Recent>,
    /// First names of claimed notes, until dropped: a look at one is not a new note.
    left: Mutex<HashMap<PathBuf, FileKey>>,
    /// First names the end of the grace leaves alone: the claim was undone (its journal
    /// record failed), so the first name is the note again, or it was dropped already.
    kept: Mutex<Vec<LeftBehind>>,
    /// Notes renamed in, with their size and mtime then (docs/design.md §9.1: a note that arrives by
    /// rename is complete), until claimed or [`WHOLE_FOR`] has passed.
    whole: Mutex<Whole>,
}

/// How long a rename is remembered for [`Arrivals::arrived_whole`]: far longer than any
/// queue wait; a note looked at later is judged as if written in place (it waits at most
/// `settle_max`).
const WHOLE_FOR: Duration = Duration::from_secs(3600);

#[derive(Debug, Default)]
struct Whole {
    /// Path -> (size, mtime) when renamed in, and when.
    at: HashMap<PathBuf, (u64, SystemTime, Instant)>,
    /// The size at which old entries (and those of notes gone) are swept next.
    sweep_at: usize,
}

/// Size and mtime of the file at `path`, not following a symlink.
fn file_stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let meta = path.symlink_metadata().ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

impl Arrivals {
    pub fn new(grace: Duration) -> Arrivals {
        Arrivals {
            grace,
            arrived: Mutex::new(Recent::new(grace)),
            ..Arrivals::default()
        }
    }

    /// A note was renamed in (an inotify `moved_to`).
    pub fn arrived(&self, path: &Path) {
        if let Some((len, mtime)) = file_stamp(path) {
            let mut whole = self.whole.lock().expect("arrivals lock poisoned");
            if whole.at.len() >= whole.sweep_at.max(256) {
                whole
                    .at
                    .retain(|p, (_, _, at)| at.elapsed() < WHOLE_FOR && p.exists());
                whole.sweep_at = whole.at.len() * 2;
            }
            whole
                .at
                .insert(path.to_path_buf(), (len, mtime, Instant::now()));
        }
        if self.grace.is_zero() {
            return;
        }
        self.arrived
            .lock()
            .expect("arrivals lock poisoned")
            .note(path);
    }

    /// Whether the note at `path` arrived by rename and has not changed since (same size and
    /// mtime): it is complete as it is (docs/design.md §9.1), whatever its last block looks like.
    pub fn arrived_whole(&self, path: &Path) -> bool {
        let recorded = self
            .whole
            .lock()
            .expect("arrivals lock poisoned")
            .at
            .get(path)
            .copied();
        recorded.is_some_and(|(len, mtime, at)| {
            at.elapsed() < WHOLE_FOR && file_stamp(path) == Some((len, mtime))
        })
    }

    /// How long the note's first name must still stay, if it arrived by rename within the
    /// grace: then it is to be claimed by link. (Called at every claim: the note leaves.)
    pub fn keep_first_name_for(&self, path: &Path) -> Option<Duration> {
        self.whole
            .lock()
            .expect("arrivals lock poisoned")
            .at
            .remove(path);
        let age = self
            .arrived
            .lock()
            .expect("arrivals lock poisoned")
            .take(path)?;
        Some(self.grace.saturating_sub(age)).filter(|d| !d.is_zero())
    }

    /// Marks the file at `path` (as `key` says) as being claimed: true when no other claim
    /// holds that file, under this name or another one. The name a link claim leaves behind
    /// can be renamed while the claim runs (`mv x.md y.md` in the inbox); the rename arrives
    /// as a new note, which must not be claimed a second time (docs/design.md §9.10). Checked and
    /// marked under one lock, so two claims of one file never both go ahead. Kept by
    /// [`hold`](Self::hold) until dropped, or given up with [`release`](Self::release).
    pub fn begin_claim(&self, path: &Path, key: FileKey) -> bool {
        let mut left = self.left.lock().expect("arrivals lock poisoned");
        if left.values().any(|k| *k == key) {
            return false;
        }
        left.insert(path.to_path_buf(), key);
        true
    }

    /// Gives up a [`begin_claim`](Self::begin_claim) mark (the note was renamed, not linked,
    /// or the claim failed).
    pub fn release(&self, path: &Path, key: FileKey) {
        let mut left = self.left.lock().expect("arrivals lock poisoned");
        if left.get(path) == Some(&key) {
            left.remove(path);
        }
    }

    /// Remembers a name a link claim left behind, until [`drop_one`](Self::drop_one).
    pub fn hold(&self, left: &LeftBehind) {
        self.left
            .lock()
            .expect("arrivals lock poisoned")
            .insert(left.path.clone(), left.file);
    }

    /// The name a link claim left behind at `path`, while it is held.
    pub fn held(&self, path: &Path) -> Option<LeftBehind> {
        self.left
            .lock()
            .expect("arrivals lock poisoned")
            .get(path)
            .map(|file| LeftBehind {
                path: path.to_path_buf(),
                file: *file,
            })
    }

    /// The end of the grace leaves `left` alone: the claim that left it behind was undone (the
    /// first name is the note again, claimed anew later), or the name was dealt with already.
    pub fn leave_first_name(&self, left: &LeftBehind) {
        self.kept
            .lock()
            .expect("arrivals lock poisoned")
            .push(left.clone());
        let mut held = self.left.lock().expect("arrivals lock poisoned");
        if held.get(&left.path) == Some(&left.file) {
            held.remove(&left.path);
        }
    }

    /// Whether the file at `path` is one a claim left behind (or is claiming), whatever it is
    /// called now: its first name, or a name it was renamed to since (docs/design.md §9.10). A
    /// different file saved under the first name is not (its file key differs).
    pub fn is_left_behind(&self, path: &Path) -> bool {
        // Nothing held (the usual case): no stat.
        if self.left.lock().expect("arrivals lock poisoned").is_empty() {
            return false;
        }
        let Ok(meta) = path.symlink_metadata() else {
            return false;
        };
        let key = FileKey::of(&meta);
        self.left
            .lock()
            .expect("arrivals lock poisoned")
            .values()
            .any(|k| *k == key)
    }

    /// Drops one left-behind name (blocking IO), found by its file key if it was renamed
    /// since the claim (in the inbox or into Approved/). Errors are logged: the name then
    /// stays and is dropped at the next start (the journal has it).
    pub fn drop_one(&self, vault: &Vault, left: &LeftBehind) {
        self.drop_one_after(vault, left, crate::files::folder_marks());
    }

    /// [`drop_one`](Self::drop_one) for the claim whose link was marked before `linked`
    /// ([`Vault::drop_left_behind_after`]): the grace's end after a link claim.
    pub fn drop_one_after(
        &self,
        vault: &Vault,
        left: &LeftBehind,
        linked: crate::files::FolderMarks,
    ) {
        {
            let mut kept = self.kept.lock().expect("arrivals lock poisoned");
            if let Some(i) = kept.iter().position(|k| k == left) {
                kept.remove(i);
                return;
            }
        }
        let dropped = vault.drop_left_behind_after(left, linked);
        if let Ok(false) = dropped
            && let Some(renamed) = find_by_key(vault, left.file)
        {
            tracing::info!(
                note = %vault.relative(&renamed),
                first_name = %vault.relative(&left.path),
                "a name a claim left behind was renamed: it is the claimed note, not a new one; removed"
            );
            let renamed = LeftBehind {
                path: renamed,
                file: left.file,
            };
            if let Err(e) = vault.drop_left_behind_after(&renamed, linked) {
                tracing::warn!(note = %vault.relative(&renamed.path), "cannot remove the name a claim left behind: {e}");
            }
        } else if let Err(e) = dropped {
            tracing::warn!(note = %vault.relative(&left.path), "cannot remove the name a claim left behind: {e}");
        }
        let mut held = self.left.lock().expect("arrivals lock poisoned");
        if held.get(&left.path) == Some(&left.file) {
            held.remove(&left.path);
        }
    }

    /// Drops every name still held (at shutdown: `mv` has long finished).
    pub fn drop_all(&self, vault: &Vault) {
        let held: Vec<_> = self
            .left
            .lock()
            .expect("arrivals lock poisoned")
            .iter()
            .map(|(path, file)| LeftBehind {
                path: path.clone(),
                file: *file,
            })
            .collect();
        for left in &held {
            self.drop_one(vault, left);
        }
    }
}

/// At start-up, before the inbox is scanned: names set aside by an interrupted drop get their
/// names back; then every name a link claim left behind (recorded in the journal, or still
/// sharing its inode with a note in In_Progress) that still names the claimed file is dropped.
/// A recorded one only while the claimed note is found (at the run's recorded note, or under
/// its name in a state folder carrying the run's `tool_note`): the link's folder fsync was the
/// flusher's, and a crash that undid the link left the first name the note's only one.
/// Returns how many were dropped.
pub fn settle_after_crash(vault: &Vault, recorded: &[LinkClaim], in_progress: &[PathBuf]) -> usize {
    use std::os::unix::fs::MetadataExt;
    let restored = vault.restore_set_aside();
    if restored > 0 {
        tracing::info!(
            restored,
            "notes set aside by an interrupted claim got their names back"
        );
    }
    let claimed_note_found = |claim: &LinkClaim| {
        let note = vault.root().join(&claim.note);
        if note.symlink_metadata().is_ok() {
            return true;
        }
        let (Some(name), Some(id)) = (note.file_name(), claim.note_id.as_deref()) else {
            return false;
        };
        // Only where a run moves its note: the folders notes are claimed from hold the first
        // name itself, which carries the run's id when the note had one before its claim.
        // And never the claimed file itself (its results write made a new one).
        let first = FileKey::decode(&claim.file_key);
        let is_the_note = |candidate: &Path| {
            let other_file = candidate
                .symlink_metadata()
                .is_ok_and(|m| Some(FileKey::of(&m)) != first);
            other_file
                && crate::vault::read_regular_text(candidate).is_ok_and(|text| {
                    crate::note::frontmatter_property(&text, "tool_note") == Some(id)
                })
        };
        use crate::vault::State::{Done, Failed, InProgress, PendingApproval};
        let moved_to = [InProgress, PendingApproval, Done, Failed];
        // Under its name; else under any (moved on under a numbered name, `a (2).md`): a
        // scan of those folders, made only after a crash inside a link claim's grace.
        moved_to
            .iter()
            .any(|state| is_the_note(&vault.folder(*state).join(name)))
            || moved_to
                .iter()
                .any(|state| vault.scan(*state).iter().any(|p| is_the_note(p)))
    };
    let mut left: Vec<LeftBehind> = recorded
        .iter()
        .filter(|claim| {
            let found = claimed_note_found(claim);
            if !found {
                tracing::warn!(
                    note = %claim.first_name,
                    "a claim by link was lost in a crash: the note stays where it was claimed from"
                );
            }
            found
        })
        .filter_map(|claim| {
            Some(LeftBehind {
                path: vault.root().join(&claim.first_name),
                file: FileKey::decode(&claim.file_key)?,
            })
        })
        .collect();
    // Killed between the link and its journal record: the claimed note still shares its
    // inode with the first name (the claim stamp, which makes a new file, comes later).
    let linked: HashMap<(u64, u64), &PathBuf> = in_progress
        .iter()
        .filter_map(|p| {
            let m = p.symlink_metadata().ok()?;
            (m.nlink() > 1).then(|| ((m.dev(), m.ino()), p))
        })
        .collect();
    if !linked.is_empty() {
        for state in [
            crate::vault::State::NeedsAction,
            crate::vault::State::Approved,
        ] {
            for path in vault.scan(state) {
                if let Ok(m) = path.symlink_metadata()
                    && linked.contains_key(&(m.dev(), m.ino()))
                {
                    left.push(LeftBehind {
                        file: FileKey::of(&m),
                        path,
                    });
                }
            }
        }
    }
    let mut dropped = 0;
    for l in &left {
        let same = l
            .path
            .symlink_metadata()
            .is_ok_and(|m| FileKey::of(&m) == l.file);
        // Renamed after the claim (docs/design.md §9.10): the same file under another name.
        let l = if same {
            l.clone()
        } else if let Some(path) = find_by_key(vault, l.file) {
            LeftBehind { path, file: l.file }
        } else {
            continue;
        };
        if vault.drop_left_behind(&l).unwrap_or(false) {
            dropped += 1;
        }
    }
    if dropped > 0 {
        tracing::info!(
            dropped,
            "removed names that claims interrupted by a crash had left in the inbox"
        );
    }
    dropped
}

/// The name the file `key` has now in a folder notes are claimed from, if any: a name a
/// link claim left behind and someone renamed. The key holds size and modification time
/// besides the inode, so a new file that reuses a freed inode number is not taken for it.
fn find_by_key(vault: &Vault, key: FileKey) -> Option<PathBuf> {
    [
        crate::vault::State::NeedsAction,
        crate::vault::State::Approved,
    ]
    .into_iter()
    .flat_map(|state| vault.scan(state))
    .find(|p| p.symlink_metadata().is_ok_and(|m| FileKey::of(&m) == key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vault::State;

    fn vault() -> (tempfile::TempDir, Vault) {
        let d = tempfile::tempdir().unwrap();
        let v = Vault::new(d.path().to_path_buf(), crate::config::Folders::default());
        v.prepare().unwrap();
        (d, v)
    }

    #[test]
    fn a_name_left_by_a_claim_killed_before_its_journal_record_is_dropped() {
        let (_d, v) = vault();
        let note = v.folder(State::NeedsAction).join("a.md");
        std::fs::write(&note, "calls").unwrap();
        let (claimed, _left) = v.link_to(&note, State::InProgress).unwrap();
        assert_eq!(
            settle_after_crash(&v, &[], std::slice::from_ref(&claimed)),
            1
        );
        assert!(!note.exists());
        assert_eq!(std::fs::read_to_string(&claimed).unwrap(), "calls");
    }

    #[test]
    fn a_recorded_name_is_dropped_only_while_it_names_the_claimed_file() {
        let (_d, v) = vault();
        let na = v.folder(State::NeedsAction);
        std::fs::write(na.join("a.md"), "a").unwrap();
        std::fs::write(na.join("b.md"), "b").unwrap();
        let (ca, left_a) = v.link_to(&na.join("a.md"), State::InProgress).unwrap();
        let (_cb, left_b) = v.link_to(&na.join("b.md"), State::InProgress).unwrap();
        // a's claim was stamped (a new file); b's first name was replaced by a new note.
        std::fs::write(ca.with_extension("tmp"), "a + tool_note").unwrap();
        std::fs::rename(ca.with_extension("tmp"), &ca).unwrap();
        std::fs::remove_file(na.join("b.md")).unwrap();
        std::fs::write(na.join("b.md"), "a new b").unwrap();
        let recorded = [
            link_claim("a.md", left_a.file.encode(), "In_Progress/a.md"),
            link_claim("b.md", left_b.file.encode(), "In_Progress/b.md"),
            link_claim("gone.md", left_b.file.encode(), "In_Progress/b.md"),
            link_claim("junk.md", "not a key".to_string(), "In_Progress/b.md"),
        ];
        assert_eq!(settle_after_crash(&v, &recorded, &[]), 1);
        assert!(!na.join("a.md").exists());
        assert_eq!(std::fs::read_to_string(na.join("b.md")).unwrap(), "a new b");
    }

    fn link_claim(first_name: &str, file_key: String, note: &str) -> LinkClaim {
        LinkClaim {
            first_name: format!("Needs_Action/{first_name}"),
            file_key,
            note: note.to_string(),
            note_id: Some(id_of(first_name)),
        }
    }

    /// The note id of the test claim of `name`: one per note.
    fn id_of(name: &str) -> String {
        format!("n-{:012x}", name.as_bytes()[0])
    }

    #[test]
    fn a_recorded_name_whose_link_a_crash_undid_is_kept() {
        // The link's folder fsync is the flusher's: a crash can keep the claim's record and
        // lose the link. The first name is then the note's only one: it stays, to be claimed
        // again (its run's calls are the stale-copy rule's, never run twice).
        let (_d, v) = vault();
        let na = v.folder(State::NeedsAction);
        for name in ["a.md", "c.md", "d.md"] {
            std::fs::write(na.join(name), name).unwrap();
        }
        let (ca, left_a) = v.link_to(&na.join("a.md"), State::InProgress).unwrap();
        let (cc, left_c) = v.link_to(&na.join("c.md"), State::InProgress).unwrap();
        let (cd, left_d) = v.link_to(&na.join("d.md"), State::InProgress).unwrap();
        std::fs::remove_file(&ca).unwrap(); // the link a crash undid
        // An older note of that name in Done/ is another note (another tool_note).
        std::fs::write(
            v.folder(State::Done).join("a.md"),
            "---\ntool_note: n-00000000000f\n---\nolder",
        )
        .unwrap();
        // c's run moved on to Done with its results, the record of that move not committed
        // yet when it was killed: found there by its tool_note.
        // (the results write: a new file renamed over the claimed one)
        let results = cc.with_extension("tmp");
        std::fs::write(&results, format!("---\ntool_note: {}\n---\nc", id_of("c"))).unwrap();
        std::fs::rename(&results, v.folder(State::Done).join("c.md")).unwrap();
        std::fs::remove_file(&cc).unwrap();
        // Moved on under a numbered name: found by its tool_note all the same.
        std::fs::write(na.join("f.md"), "f.md").unwrap();
        let (cf, left_f) = v.link_to(&na.join("f.md"), State::InProgress).unwrap();
        let results = cf.with_extension("tmp");
        std::fs::write(&results, format!("---\ntool_note: {}\n---\nf", id_of("f"))).unwrap();
        std::fs::rename(&results, v.folder(State::Done).join("f (2).md")).unwrap();
        std::fs::remove_file(&cf).unwrap();
        // d's note is where its run recorded it (not stamped yet: found by that path).
        let recorded = [
            link_claim("a.md", left_a.file.encode(), "In_Progress/a.md"),
            link_claim("c.md", left_c.file.encode(), "In_Progress/c.md"),
            link_claim("d.md", left_d.file.encode(), "In_Progress/d.md"),
            link_claim("f.md", left_f.file.encode(), "In_Progress/f.md"),
        ];
        assert_eq!(settle_after_crash(&v, &recorded, &[]), 3);
        assert!(!na.join("f.md").exists());
        assert_eq!(std::fs::read_to_string(na.join("a.md")).unwrap(), "a.md");
        // A note that had its id before the claim (approved by a move into Approved/):
        // its first name carries the run's id and is not taken for the claimed note.
        let approved = v.folder(State::Approved).join("e.md");
        std::fs::write(&approved, format!("---\ntool_note: {}\n---\ne", id_of("e"))).unwrap();
        let (ce, left_e) = v.link_to(&approved, State::InProgress).unwrap();
        std::fs::remove_file(&ce).unwrap(); // the link a crash undid
        let recorded = [LinkClaim {
            first_name: "Approved/e.md".to_string(),
            ..link_claim("e.md", left_e.file.encode(), "In_Progress/e.md")
        }];
        assert_eq!(settle_after_crash(&v, &recorded, &[]), 0);
        assert!(approved.exists(), "the note's only name is kept");
        assert!(!na.join("c.md").exists());
        assert!(!na.join("d.md").exists());
        assert_eq!(std::fs::read_to_string(&cd).unwrap(), "d.md");
    }

    #[test]
    fn arrivals_are_claimed_by_link_only_within_the_grace() {
        let none = Arrivals::new(Duration::ZERO);
        none.arrived(Path::new("/v/Needs_Action/a.md"));
        assert_eq!(
            none.keep_first_name_for(Path::new("/v/Needs_Action/a.md")),
            None
        );
        let some = Arrivals::new(Duration::from_secs(60));
        some.arrived(Path::new("/v/Needs_Action/a.md"));
        let keep = some.keep_first_name_for(Path::new("/v/Needs_Action/a.md"));
        assert!(
            keep.is_some_and(|k| k > Duration::from_secs(50)),
            "{keep:?}"
        );
        assert_eq!(
            some.keep_first_name_for(Path::new("/v/Needs_Action/a.md")),
            None,
            "used once"
        );
        assert_eq!(
            some.keep_first_name_for(Path::new("/v/Needs_Action/b.md")),
            None
        );
    }

    #[test]
    fn a_held_name_counts_as_left_behind_until_dropped() {
        let (_d, v) = vault();
        let note = v.folder(State::NeedsAction).join("a.md");
        std::fs::write(&note, "calls").unwrap();
        let (_claimed, left) = v.link_to(&note, State::InProgress).unwrap();
        let arrivals = Arrivals::new(Duration::from_secs(1));
        assert!(!arrivals.is_left_behind(&note));
        arrivals.hold(&left);
        assert!(arrivals.is_left_behind(&note));
        arrivals.drop_all(&v);
        assert!(!arrivals.is_left_behind(&note));
        assert!(!note.exists());
    }

    #[test]
    fn a_left_behind_name_renamed_is_still_left_behind_and_dropped_by_its_key() {
        let (_d, v) = vault();
        let na = v.folder(State::NeedsAction);
        let note = na.join("x.md");
        std::fs::write(&note, "calls").unwrap();
        let arrivals = Arrivals::new(Duration::from_secs(60));
        let (_claimed, left) = v.link_to(&note, State::InProgress).unwrap();
        arrivals.hold(&left);
        std::fs::rename(&note, na.join("y.md")).unwrap();
        assert!(arrivals.is_left_behind(&na.join("y.md")), "the same file");
        assert!(
            !arrivals.begin_claim(&na.join("y.md"), left.file),
            "never claimed twice"
        );
        std::fs::write(na.join("z.md"), "another note").unwrap();
        assert!(!arrivals.is_left_behind(&na.join("z.md")));
        arrivals.drop_one(&v, &left);
        assert!(!na.join("y.md").exists(), "dropped under its new name");
        assert!(na.join("z.md").exists());
        assert!(!arrivals.is_left_behind(&na.join("z.md")));
    }

    #[test]
    fn a_recorded_name_renamed_before_a_restart_is_dropped_by_its_key() {
        let (_d, v) = vault();
        let na = v.folder(State::NeedsAction);
        std::fs::write(na.join("x.md"), "calls").unwrap();
        let (claimed, left) = v.link_to(&na.join("x.md"), State::InProgress).unwrap();
        // Stamped (a new file in In_Progress), then the first name renamed into Approved/.
        std::fs::write(claimed.with_extension("tmp"), "calls + tool_note").unwrap();
        std::fs::rename(claimed.with_extension("tmp"), &claimed).unwrap();
        let approved = v.folder(State::Approved).join("y.md");
        std::fs::rename(na.join("x.md"), &approved).unwrap();
        let recorded = [link_claim("x.md", left.file.encode(), "In_Progress/x.md")];
        assert_eq!(settle_after_crash(&v, &recorded, &[]), 1);
        assert!(!approved.exists());
        assert_eq!(
            std::fs::read_to_string(&claimed).unwrap(),
            "calls + tool_note"
        );
    }

    #[test]
    fn a_file_is_claimed_once_until_released() {
        let (_d, v) = vault();
        let note = v.folder(State::NeedsAction).join("a.md");
        std::fs::write(&note, "calls").unwrap();
        let key = FileKey::of(&note.symlink_metadata().unwrap());
        let arrivals = Arrivals::new(Duration::from_secs(1));
        assert!(arrivals.begin_claim(&note, key));
        assert!(!arrivals.begin_claim(&note, key));
        arrivals.release(&note, key);
        assert!(arrivals.begin_claim(&note, key));
    }
}
