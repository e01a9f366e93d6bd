//! The vault a journal belongs to (docs/design.md §9.11), and where the journal itself came from
//! (§9.12: started afresh with `--new-journal`). Self-contained tables, created at open.
//!
//! The owner is the vault's key (the id vaultd keeps in the vault, `state.rs`) and the path
//! the vault was last seen at: the key decides, the path names the vault in messages and
//! tells a moved vault (its old path gone) from a copy (two paths holding one key).

use super::{Failure, Journal, JournalError, from_ms, now_ms};
use rusqlite::{OptionalExtension, params};
use std::collections::HashSet;
use std::time::SystemTime;

/// Created at every open (`IF NOT EXISTS`), outside the numbered migrations.
pub(super) const TABLES: &str = "
    CREATE TABLE IF NOT EXISTS vault_owner (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        vault_key TEXT NOT NULL,
        vault_path TEXT NOT NULL,
        since_ms INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS journal_origin (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        new_journal_at_ms INTEGER NOT NULL,
        runner TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS storage_probe (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        at_ms INTEGER NOT NULL
    );
";

/// The vault a journal records as its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub key: String,
    /// Where the vault was when this journal last opened for it.
    pub path: String,
}

impl Journal {
    /// The vault this journal belongs to; None for a journal written before vaults were
    /// recorded (or a new one).
    pub fn owner(&self) -> Result<Option<Owner>, JournalError> {
        self.read(|tx| {
            tx.query_row(
                "SELECT vault_key, vault_path FROM vault_owner WHERE id = 1",
                [],
                |r| {
                    Ok(Owner {
                        key: r.get(0)?,
                        path: r.get(1)?,
                    })
                },
            )
            .optional()
            .map_err(Failure::from)
        })
    }

    /// Records `key` at `path` as this journal's vault. Refused (an error naming both vaults)
    /// when another vault's key is recorded; the same key at a new path records the move.
    pub fn record_owner(&self, key: &str, path: &str) -> Result<(), JournalError> {
        let (key, path) = (key.to_owned(), path.to_owned());
        self.write(move |tx| {
            let current: Option<(String, String)> = tx
                .query_row(
                    "SELECT vault_key, vault_path FROM vault_owner WHERE id = 1",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            match current {
                Some((k, p)) if k != key => Err(Failure::Other(format!(
                    "belongs to the vault {p} (id {k}), not to {path} (id {key})"
                ))),
                Some((_, p)) if p == path => Ok(()),
                _ => {
                    tx.execute(
                        "INSERT INTO vault_owner (id, vault_key, vault_path, since_ms)
                         VALUES (1, ?1, ?2, ?3)
                         ON CONFLICT (id) DO UPDATE SET vault_path = excluded.vault_path",
                        params![key, path, now_ms()],
                    )?;
                    Ok(())
                }
            }
        })
    }

    /// Whether the journal has recorded any claim at all.
    pub fn has_runs(&self) -> Result<bool, JournalError> {
        self.read(|tx| {
            Ok(tx
                .query_row("SELECT 1 FROM runs LIMIT 1", [], |_| Ok(()))
                .optional()?
                .is_some())
        })
    }

    /// The note ids (`tool_note`) among `ids` that this journal has runs for.
    pub fn known_note_ids(&self, ids: &[String]) -> Result<HashSet<String>, JournalError> {
        self.read(|tx| {
            let mut st = tx.prepare_cached("SELECT 1 FROM runs WHERE note_id = ?1 LIMIT 1")?;
            let mut known = HashSet::new();
            for id in ids {
                if st.exists([id])? {
                    known.insert(id.clone());
                }
            }
            Ok(known)
        })
    }

    /// Whether any run of this journal carries a note id (journals of version 1 have none).
    pub fn has_note_ids(&self) -> Result<bool, JournalError> {
        self.read(|tx| {
            Ok(tx
                .query_row(
                    "SELECT 1 FROM runs WHERE note_id IS NOT NULL LIMIT 1",
                    [],
                    |_| Ok(()),
                )
                .optional()?
                .is_some())
        })
    }

    /// Records that this journal was started afresh (`--new-journal`) by `runner`, now,
    /// once: notes stamped before it may have run calls this journal never saw (§9.12).
    pub fn record_new_journal(&self, runner: &str) -> Result<SystemTime, JournalError> {
        let runner = runner.to_owned();
        let at = self.write(move |tx| {
            tx.execute(
                "INSERT OR IGNORE INTO journal_origin (id, new_journal_at_ms, runner)
                 VALUES (1, ?1, ?2)",
                params![now_ms(), runner],
            )?;
            let at: i64 = tx.query_row(
                "SELECT new_journal_at_ms FROM journal_origin WHERE id = 1",
                [],
                |r| r.get(0),
            )?;
            Ok(from_ms(at))
        })?;
        *self.origin.lock().expect("origin lock poisoned") = Some(Some(at));
        Ok(at)
    }

    /// When this journal was started afresh with `--new-journal`, if it was.
    pub fn new_journal_at(&self) -> Result<Option<SystemTime>, JournalError> {
        if let Some(known) = *self.origin.lock().expect("origin lock poisoned") {
            return Ok(known);
        }
        let read = self.read(|tx| {
            let at: Option<i64> = tx
                .query_row(
                    "SELECT new_journal_at_ms FROM journal_origin WHERE id = 1",
                    [],
                    |r| r.get(0),
                )
                .optional()?;
            Ok(at.map(from_ms))
        })?;
        *self.origin.lock().expect("origin lock poisoned") = Some(read);
        Ok(read)
    }

    /// A real write, durable or failed: whether the journal's storage takes writes again
    /// (§9.12). An empty transaction would commit without touching the disk, so it rewrites a
    /// row (a WAL frame and an fsync).
    pub fn probe_storage(&self) -> Result<(), JournalError> {
        self.write(|tx| {
            tx.execute(
                "INSERT INTO storage_probe (id, at_ms) VALUES (1, ?1)
                 ON CONFLICT (id) DO UPDATE SET at_ms = excluded.at_ms",
                [now_ms()],
            )?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::journal::testing::*;

    #[test]
    fn the_owner_is_recorded_once_and_another_vault_is_refused_by_name() {
        let (dir, journal) = fresh_journal();
        assert_eq!(journal.owner().unwrap(), None);
        journal.record_owner("v-aaaa", "/home/a/Notes").unwrap();
        journal.record_owner("v-aaaa", "/home/a/Notes").unwrap();
        let err = journal
            .record_owner("v-bbbb", "/home/b/Work")
            .expect_err("another vault");
        let text = err.to_string();
        for part in ["/home/a/Notes", "v-aaaa", "/home/b/Work", "v-bbbb"] {
            assert!(text.contains(part), "{part}: {text}");
        }
        // The vault moved: the same key at a new path.
        journal.record_owner("v-aaaa", "/home/a/Moved").unwrap();
        drop(journal);
        let journal = crate::journal::Journal::open(dir.path()).unwrap();
        let owner = journal.owner().unwrap().unwrap();
        assert_eq!(
            (owner.key.as_str(), owner.path.as_str()),
            ("v-aaaa", "/home/a/Moved")
        );
    }

    #[test]
    fn known_note_ids_are_those_with_runs() {
        let (_dir, journal) = fresh_journal();
        assert!(!journal.has_runs().unwrap());
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        assert!(journal.has_runs().unwrap());
        assert!(!journal.has_note_ids().unwrap());
        journal.adopt_run(run, "n-000000000001").unwrap();
        assert!(journal.has_note_ids().unwrap());
        let known = journal
            .known_note_ids(&["n-000000000001".into(), "n-000000000002".into()])
            .unwrap();
        assert_eq!(known.len(), 1);
        assert!(known.contains("n-000000000001"));
    }

    #[test]
    fn the_new_journal_mark_is_kept_once() {
        let (_dir, journal) = fresh_journal();
        assert_eq!(journal.new_journal_at().unwrap(), None);
        let first = journal.record_new_journal("host-0a1b").unwrap();
        let again = journal.record_new_journal("host-0a1b").unwrap();
        assert_eq!(first, again);
        assert_eq!(journal.new_journal_at().unwrap(), Some(first));
        journal.probe_storage().unwrap();
    }
}
