//! One vault, one state (docs/design.md §9.11): the id vaultd keeps in the vault, the default state
//! dir it names, the journal opened for its vault (refused for another one), and the journal
//! the releases before kept at one shared default, adopted by the vault whose notes it knows.
//!
//! # The vault's id
//! `<vault>/.vaultd/id` holds `v-` and 16 random hex digits, made at the first command that
//! needs the state. It is in the vault, so it moves with the folder (renamed, moved, restored
//! from a backup: same state); it is hidden, so it is never a note and no scan sees it. A sync
//! client that copies it to a replica gives the replica the same id, which is harmless: the
//! other machine has its own state folder anyway. Two vaults on one machine holding one id
//! (a vault copied with `cp -r`) are told apart by the path the journal records: when the
//! recorded vault still exists and still holds the id, the second one is refused until its
//! id is removed (it then gets a state of its own).
//!
//! # The default state dir
//! `$XDG_STATE_HOME/vaultd/<id>/` (or `$STATE_DIRECTORY/<id>/` under systemd). Before, every
//! vault used `$XDG_STATE_HOME/vaultd/` itself; a journal found there is adopted (moved into
//! the vault's own folder, with the runner id) by the vault whose notes it knows: it records
//! that vault, or, written before vaults were recorded, it holds runs of note ids (`tool_note`)
//! found in this vault. Any other vault leaves it where it is and starts its own.

use crate::config::Config;
pub mod id;
use crate::journal::{Journal, JournalError};
use crate::vault::{State, Vault};
use id::read_id;
pub use id::{StateError, VAULT_ID_FILE, default_state_dir, state_base, vault_id};
use std::io::Write;
use std::path::Path;

/// The journal's file name inside a state dir.
pub const JOURNAL_FILE: &str = "journal.sqlite";

/// Opens the journal of `config`'s vault: adopts the old shared journal first when the state
/// dir is the default one and has none yet, then refuses a journal recorded for another
/// vault (an error naming both) and records this vault in one that has none.
pub fn open_journal(config: &Config) -> Result<Journal, JournalError> {
    let vault = &config.vault;
    let id = vault_id(vault).map_err(|e| JournalError::Other {
        path: config.state_dir.join(JOURNAL_FILE),
        message: e.to_string(),
    })?;
    let base = state_base();
    if config.state_dir == base.join(&id) {
        adopt_shared_journal(config, &base, &id)?;
        inherit_runner_id(&config.state_dir, &base);
    }
    let journal = Journal::open(&config.state_dir)?;
    claim_journal(&journal, config, &id)?;
    Ok(journal)
}

/// A new per-vault state dir takes the runner id of the old shared one (`base`), if any: the
/// notes that runner stamped in this vault were run on this machine, and stay this runner's —
/// not a second runner's (§9.9), and, when this vault's journal is not the shared one, notes
/// whose journal is missing (§9.12: `--new-journal`). Vaults never see each other's notes, so
/// two of them sharing a runner id is harmless.
fn inherit_runner_id(state_dir: &Path, base: &Path) {
    let runner = state_dir.join(crate::synced::RUNNER_ID_FILE);
    let old = base.join(crate::synced::RUNNER_ID_FILE);
    if runner.exists() || !std::fs::symlink_metadata(&old).is_ok_and(|m| m.is_file()) {
        return;
    }
    let copied = crate::private::create_dir(state_dir).and_then(|()| {
        let text = std::fs::read(&old)?;
        let mut f = crate::private::create_new_file(&runner)?;
        f.write_all(&text)?;
        f.sync_all()
    });
    if let Err(e) = copied
        && !runner.exists()
    {
        tracing::warn!(
            "cannot copy the runner id {} into {}: {e}; a new one is made",
            old.display(),
            state_dir.display()
        );
    }
}

/// Records this vault as `journal`'s, or refuses it for another vault.
fn claim_journal(journal: &Journal, config: &Config, id: &str) -> Result<(), JournalError> {
    let here = config.vault.display().to_string();
    let refuse = |message: String| JournalError::Other {
        path: journal.path().to_path_buf(),
        message,
    };
    match journal.owner()? {
        Some(owner) if owner.key == id => {
            if owner.path != here && holds_id(Path::new(&owner.path), id) {
                return Err(refuse(format!(
                    "the vaults {} and {here} carry the same id {id} (one is a copy of the other?); \
                     remove {} from the copy to give it a state of its own",
                    owner.path,
                    Path::new(&here).join(VAULT_ID_FILE).display()
                )));
            }
        }
        Some(_) => {}
        None => {
            if journal.has_note_ids()? && !knows_notes_of(journal, config)? {
                return Err(refuse(format!(
                    "records the notes of another vault (none of its notes are in {here}); \
                     point `state_dir` (or --state-dir) at this vault's own state folder"
                )));
            }
        }
    }
    journal.record_owner(id, &here).map_err(|e| match e {
        JournalError::Other { path, message } => JournalError::Other {
            path,
            message: format!("{message}: refused; point `state_dir` (or --state-dir) at this vault's own state folder"),
        },
        other => other,
    })
}

/// Whether `vault` (a path a journal recorded) still exists and holds the id `id`.
fn holds_id(vault: &Path, id: &str) -> bool {
    matches!(read_id(&vault.join(VAULT_ID_FILE)), Ok(Some(found)) if found == id)
}

/// Whether `journal` has runs for any note (by `tool_note`) in `config`'s vault.
fn knows_notes_of(journal: &Journal, config: &Config) -> Result<bool, JournalError> {
    let ids = note_ids_in(config);
    Ok(ids
        .chunks(500)
        .map(|chunk| journal.known_note_ids(chunk))
        .collect::<Result<Vec<_>, _>>()?
        .iter()
        .any(|known| !known.is_empty()))
}

/// The `tool_note` of every note in the vault's state folders (notes over `max_note_bytes`
/// are skipped: vaultd never ran them).
fn note_ids_in(config: &Config) -> Vec<String> {
    let vault = Vault::new(config.vault.clone(), config.folders.clone());
    let mut ids = Vec::new();
    for state in State::ALL {
        for path in vault.scan(state) {
            if std::fs::metadata(&path).is_ok_and(|m| m.len() > config.max_note_bytes) {
                continue;
            }
            if let Ok(text) = std::fs::read_to_string(&path)
                && let Some(id) = crate::note::frontmatter_property(&text, "tool_note")
            {
                ids.push(id.to_string());
            }
        }
    }
    ids
}

/// The old shared default (`base/journal.sqlite`), adopted into `config.state_dir` when it is
/// this vault's; left where it is otherwise.
fn adopt_shared_journal(config: &Config, base: &Path, id: &str) -> Result<(), JournalError> {
    let old = base.join(JOURNAL_FILE);
    let new = config.state_dir.join(JOURNAL_FILE);
    if new.exists() || !std::fs::symlink_metadata(&old).is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    let shared = Journal::open(base)?;
    let ours = match shared.owner()? {
        Some(owner) => owner.key == id,
        None => knows_notes_of(&shared, config)?,
    };
    if !ours {
        tracing::info!(
            "the journal at {} (kept there by vaultd before each vault had its own) is another vault's; this vault starts its own at {}",
            old.display(),
            new.display()
        );
        return Ok(());
    }
    // Recorded before the move: a crash anywhere below leaves a journal that says whose it is.
    shared.record_owner(id, &config.vault.display().to_string())?;
    drop(shared);
    let mut wal = old.clone().into_os_string();
    wal.push("-wal");
    if Path::new(&wal).exists() {
        // Closing the last connection checkpoints the WAL into the file and removes it: one
        // still there means another process has the journal open.
        return Err(JournalError::Other {
            path: old,
            message: "is this vault's journal, to be moved to its own state folder, but another process has it open (an older vaultd still running?); stop it and start again".into(),
        });
    }
    let fail = |what: &str, e: std::io::Error| JournalError::Other {
        path: old.clone(),
        message: format!(
            "cannot {what} while adopting it into {}: {e}",
            new.display()
        ),
    };
    crate::private::create_dir(&config.state_dir)
        .map_err(|e| fail("create the vault's state folder", e))?;
    std::fs::rename(&old, &new).map_err(|e| fail("move the journal", e))?;
    let mut shm = old.clone().into_os_string();
    shm.push("-shm");
    let _ = std::fs::remove_file(Path::new(&shm));
    crate::vault::fsync_dir(&config.state_dir);
    crate::vault::fsync_dir(base);
    tracing::warn!(
        "adopted the journal at {} (shared by every vault before vaultd kept one per vault): it knows this vault's notes; it is now at {}",
        old.display(),
        new.display()
    );
    Ok(())
}

/// The file in the state dir where a running daemon says why it paused for its storage.
const STORAGE_PAUSE_FILE: &str = "storage_pause";

/// Its size, reserved when the daemon starts: a message written later overwrites bytes the
/// file already has, which a full disk still allows (no new block is needed).
const STORAGE_PAUSE_BYTES: usize = 1024;

/// Where a running daemon tells `vaultd status` (another process) that it paused because the
/// journal cannot be written (docs/design.md §9.12); the journal itself cannot carry that message.
#[derive(Debug)]
pub struct StoragePauseBoard {
    file: std::fs::File,
}

impl StoragePauseBoard {
    /// Made (or reset) at start, while the disk takes writes, at its full size.
    pub fn create(state_dir: &Path) -> std::io::Result<StoragePauseBoard> {
        let file = crate::private::open_file(&state_dir.join(STORAGE_PAUSE_FILE))?;
        let board = StoragePauseBoard { file };
        board.write("")?;
        board.file.sync_all()?;
        Ok(board)
    }

    /// Says `why` (empty: not paused), in place, padded to the reserved size.
    pub fn write(&self, why: &str) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut bytes = vec![b' '; STORAGE_PAUSE_BYTES];
        let mut end = why.len().min(STORAGE_PAUSE_BYTES);
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        bytes[..end].copy_from_slice(&why.as_bytes()[..end]);
        self.file.write_all_at(&bytes, 0)
    }
}

/// Why the daemon running on this state dir paused for its storage, if it says so. Only a
/// running daemon's word counts (`daemon_pid`): a daemon killed while paused leaves its file.
pub fn storage_pause(state_dir: &Path, daemon_pid: Option<u32>) -> Option<String> {
    daemon_pid?;
    let text = std::fs::read_to_string(state_dir.join(STORAGE_PAUSE_FILE)).ok()?;
    let why = text.trim();
    (!why.is_empty()).then(|| why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::id::is_valid_id;

    #[test]
    fn a_vault_gets_one_id_kept_in_the_vault() {
        let dir = tempfile::tempdir().unwrap();
        let id = vault_id(dir.path()).unwrap();
        assert!(is_valid_id(&id), "{id}");
        assert_eq!(vault_id(dir.path()).unwrap(), id);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(vault_id(other.path()).unwrap(), id);
        // Moved: the same id.
        let moved = other.path().join("moved");
        std::fs::rename(dir.path().join(".vaultd"), {
            std::fs::create_dir(&moved).unwrap();
            moved.join(".vaultd")
        })
        .unwrap();
        assert_eq!(vault_id(&moved).unwrap(), id);
    }

    #[test]
    fn a_damaged_or_planted_id_is_an_error_not_a_new_state() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".vaultd")).unwrap();
        std::fs::write(dir.path().join(VAULT_ID_FILE), "garbage\n").unwrap();
        let err = vault_id(dir.path()).expect_err("garbage").to_string();
        assert!(err.contains("does not hold a vault id"), "{err}");

        // A link to another vault's id does not borrow that vault's state.
        let other = tempfile::tempdir().unwrap();
        let theirs = vault_id(other.path()).unwrap();
        std::fs::remove_file(dir.path().join(VAULT_ID_FILE)).unwrap();
        std::os::unix::fs::symlink(
            other.path().join(VAULT_ID_FILE),
            dir.path().join(VAULT_ID_FILE),
        )
        .unwrap();
        let err = vault_id(dir.path()).expect_err("symlink").to_string();
        assert!(err.contains("symlink"), "{err}");
        assert!(!err.contains(&theirs));
    }

    #[test]
    fn the_pause_board_is_rewritten_in_place_and_read_only_while_a_daemon_runs() {
        let dir = tempfile::tempdir().unwrap();
        let board = StoragePauseBoard::create(dir.path()).unwrap();
        assert_eq!(storage_pause(dir.path(), Some(1)), None);
        board.write("the disk is full").unwrap();
        assert_eq!(
            storage_pause(dir.path(), Some(1)).as_deref(),
            Some("the disk is full")
        );
        assert_eq!(storage_pause(dir.path(), None), None);
        board.write(&"é".repeat(STORAGE_PAUSE_BYTES)).unwrap();
        let len = std::fs::metadata(dir.path().join(STORAGE_PAUSE_FILE))
            .unwrap()
            .len();
        assert_eq!(len, STORAGE_PAUSE_BYTES as u64);
        board.write("").unwrap();
        assert_eq!(storage_pause(dir.path(), Some(1)), None);
    }

    #[test]
    fn two_processes_making_the_id_at_once_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let ids: Vec<String> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8)
                .map(|_| s.spawn(|| vault_id(&path).unwrap()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    }
}
