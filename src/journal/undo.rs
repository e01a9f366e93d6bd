//! The undo table (docs/design.md §11.3): for every vault change, each file's pre-image (bytes, or
//! absent) and post-image hash, keyed by call id and note, so `vaultd undo` and `vault_undo`
//! can put the vault back.
//!
//! A note is known by its id (`tool_note`, docs/design.md §9.2), taken from the open run of the note
//! the call came from: renaming or moving the note keeps its history. Records written before
//! note ids were kept here (and changes made outside a run: `vaultd undo`'s own) have none
//! and are found by `note_key`, the note's path below its state folder, as before.
//!
//! Self-contained: its tables are created with `CREATE TABLE IF NOT EXISTS` at open, outside
//! the numbered migrations, so it merges with other schema work; the `note_id` column is
//! added in place to a journal made before it (see [`ensure_schema`]).
//!
//! A change is recorded twice: *prepared* in its own transaction before the file is
//! written (a write-ahead record: a kill between the write and the outcome still leaves an
//! undoable change), then *confirmed* — replaced by what was really written — in the same
//! transaction as the call's outcome (`record_outcome`). Undo always compares the file with
//! the recorded post-image hash first, so a prepared change that never reached the disk is
//! refused, never applied. An edit or a new file may be written and fsynced beside its target
//! while the prepared record commits ([`Journal::undo_prepare_later`]): it takes the
//! target's place (a rename, or a link) only once the record is durable
//! ([`Journal::undo_prepared`]). A kill or a power loss at any point leaves the target as it
//! was, or changed with its undo data on disk; a kill before the rename also leaves the
//! hidden temp file (`.{name}.vaultd-{pid}-{n}.tmp`), which the next start removes
//! (`daemon/recover.rs`, below the `write` globs' folders).

use super::{Failure, Journal, JournalError, Tx, UndoPrepared, exec, from_ms, now_ms, query_one};
use crate::call::{UndoRecord, VaultChange};
use rusqlite::{Connection, OptionalExtension, params};
use std::time::SystemTime;

pub(super) const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS undo_records (
        id INTEGER PRIMARY KEY,
        call_id TEXT NOT NULL,
        -- The note's path below its state folder: how records without note_id are found.
        note_key TEXT NOT NULL,
        -- The note's path when the call ran.
        note TEXT NOT NULL,
        tool TEXT NOT NULL,
        -- 'prepared' (written ahead of the change) or 'done' (confirmed with the outcome).
        state TEXT NOT NULL,
        -- The call (or CLI undo) that undid this record.
        undone_by TEXT,
        at_ms INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS undo_by_call ON undo_records (call_id, id);
    CREATE INDEX IF NOT EXISTS undo_by_note ON undo_records (note_key, id);
    CREATE TABLE IF NOT EXISTS undo_changes (
        record_id INTEGER NOT NULL REFERENCES undo_records (id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        path TEXT NOT NULL,
        before BLOB,
        after_sha256 TEXT,
        PRIMARY KEY (record_id, seq)
    );";

/// The note id column, added after the table first shipped: a new journal gets it with the
/// table, an older one by `ALTER TABLE` (its rows keep `note_id` NULL and are found by path).
const NOTE_ID: &str = "
    ALTER TABLE undo_records ADD COLUMN note_id TEXT;
    CREATE INDEX IF NOT EXISTS undo_by_note_id ON undo_records (note_id, id);";

pub(super) fn ensure_schema(conn: &Connection) -> Result<(), Failure> {
    conn.execute_batch(SCHEMA)?;
    let has_note_id: bool = conn
        .prepare("SELECT 1 FROM pragma_table_info('undo_records') WHERE name = 'note_id'")?
        .exists([])?;
    if !has_note_id {
        conn.execute_batch(NOTE_ID)?;
    }
    Ok(())
}

/// One recorded change set, as `vaultd undo` and `vault_undo` see it.
#[derive(Debug, Clone, PartialEq)]
pub struct UndoEntry {
    pub id: i64,
    pub call_id: String,
    pub note_key: String,
    /// The `tool_note` of the note whose call made the change (None: recorded before note
    /// ids were kept, or outside a run).
    pub note_id: Option<String>,
    pub note: String,
    pub tool: String,
    /// False while only the write-ahead record exists (the outcome was never recorded).
    pub confirmed: bool,
    pub undone_by: Option<String>,
    pub at: SystemTime,
    pub changes: Vec<VaultChange>,
}

/// A note's identity for undo: its path below its state folder (`In_Progress/a/b.md` ->
/// `a/b.md`), which stays the same while the note moves between state folders.
pub fn note_key(note: &str) -> String {
    match note.split_once('/') {
        Some((_, rest)) => rest.to_string(),
        None => note.to_string(),
    }
}

impl Journal {
    /// Records the changes a call is about to make, before it makes them. Returns the
    /// record's id.
    pub fn undo_prepare(
        &self,
        call_id: &str,
        note: &str,
        tool: &str,
        changes: &[VaultChange],
    ) -> Result<i64, JournalError> {
        self.undo_prepared(self.undo_prepare_later(call_id, note, tool, changes)?)
    }

    /// [`undo_prepare`](Self::undo_prepare) queued, not waited for: the caller writes its
    /// new file meanwhile (the journal's fsync and the file's overlap) and calls
    /// [`undo_prepared`](Self::undo_prepared) before that file takes the old one's place.
    pub fn undo_prepare_later(
        &self,
        call_id: &str,
        note: &str,
        tool: &str,
        changes: &[VaultChange],
    ) -> Result<UndoPrepared, JournalError> {
        let (call_id, note, tool) = (call_id.to_owned(), note.to_owned(), tool.to_owned());
        let changes = changes.to_vec();
        self.writer
            .submit_later_blocking(super::Wait::Durable, move |tx| {
                insert_record(tx, &call_id, &note, &tool, "prepared", &changes)
            })
            .map(UndoPrepared)
            .map_err(|e| self.failed(e))
    }

    /// Waits until the record [`undo_prepare_later`](Self::undo_prepare_later) queued is
    /// durable. Returns its id.
    pub fn undo_prepared(&self, prepared: UndoPrepared) -> Result<i64, JournalError> {
        prepared.0.wait().map_err(|e| self.failed(e))
    }

    /// Records a change made outside the runner (`vaultd undo`): prepared and confirmed in
    /// one go is not possible, so the CLI prepares first and confirms with this.
    pub fn undo_confirm(
        &self,
        call_id: &str,
        note: &str,
        tool: &str,
        record: &UndoRecord,
    ) -> Result<(), JournalError> {
        let (call_id, note, tool) = (call_id.to_owned(), note.to_owned(), tool.to_owned());
        let record = record.clone();
        self.write(move |tx| confirm(tx, &call_id, &note, &tool, &record))
    }

    /// Not-yet-undone records of `call_id`, newest first.
    pub fn undo_entries_for_call(&self, call_id: &str) -> Result<Vec<UndoEntry>, JournalError> {
        self.read(|tx| entries(tx, "call_id = ?1", &[call_id]))
    }

    /// Not-yet-undone records of the note `key` (see [`note_key`]), newest first.
    pub fn undo_entries_for_note(&self, key: &str) -> Result<Vec<UndoEntry>, JournalError> {
        self.read(|tx| entries(tx, "note_key = ?1", &[key]))
    }

    /// Not-yet-undone records of the note with id `note_id` whatever its path was, and those
    /// recorded without an id under its path `key` (older journals), newest first.
    pub fn undo_entries_for_note_id(
        &self,
        note_id: &str,
        key: &str,
    ) -> Result<Vec<UndoEntry>, JournalError> {
        self.read(|tx| {
            entries(
                tx,
                "(note_id = ?1 OR (note_id IS NULL AND note_key = ?2))",
                &[note_id, key],
            )
        })
    }

    /// Whether `call_id` has records that were all undone already (NOTHING_TO_UNDO rather
    /// than NOT_FOUND), and by what.
    pub fn undone_by(&self, call_id: &str) -> Result<Option<String>, JournalError> {
        self.read(|tx| {
            Ok(query_one(
                tx,
                "SELECT undone_by FROM undo_records WHERE call_id = ?1 AND undone_by IS NOT NULL
                 ORDER BY id DESC LIMIT 1",
                params![call_id],
                |r| r.get(0),
            )
            .optional()?)
        })
    }

    /// Drops pre-images older than `before` (`undo_keep`). Returns how many records went.
    pub fn prune_undo(&self, before: SystemTime) -> Result<usize, JournalError> {
        let cutoff = super::to_ms(before);
        self.write(move |tx| {
            exec(
                tx,
                "DELETE FROM undo_changes WHERE record_id IN
                   (SELECT id FROM undo_records WHERE at_ms < ?1)",
                params![cutoff],
            )?;
            Ok(exec(
                tx,
                "DELETE FROM undo_records WHERE at_ms < ?1",
                params![cutoff],
            )?)
        })
    }
}

fn insert_record(
    tx: &Tx<'_>,
    call_id: &str,
    note: &str,
    tool: &str,
    state: &str,
    changes: &[VaultChange],
) -> Result<i64, Failure> {
    // The note's id is its open run's: the call runs while its note is in In_Progress.
    exec(
        tx,
        "INSERT INTO undo_records (call_id, note_key, note, tool, state, at_ms, note_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6,
                 (SELECT note_id FROM runs WHERE note = ?3 AND ended_at_ms IS NULL
                  ORDER BY id DESC LIMIT 1))",
        params![call_id, note_key(note), note, tool, state, now_ms()],
    )?;
    let id = tx.last_insert_rowid();
    insert_changes(tx, id, changes)?;
    Ok(id)
}

fn insert_changes(tx: &Tx<'_>, id: i64, changes: &[VaultChange]) -> Result<(), Failure> {
    for (seq, c) in changes.iter().enumerate() {
        exec(
            tx,
            "INSERT INTO undo_changes (record_id, seq, path, before, after_sha256)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, seq as i64, c.path, c.before, c.after_sha256],
        )?;
    }
    Ok(())
}

/// Inside the outcome's transaction: the newest prepared record of this call and note
/// becomes what was really written; records it undid are marked.
pub(super) fn confirm(
    tx: &Tx<'_>,
    call_id: &str,
    note: &str,
    tool: &str,
    record: &UndoRecord,
) -> Result<(), Failure> {
    let prepared: Option<i64> = query_one(
        tx,
        "SELECT id FROM undo_records WHERE call_id = ?1 AND note = ?2 AND state = 'prepared'
         ORDER BY id DESC LIMIT 1",
        params![call_id, note],
        |r| r.get(0),
    )
    .optional()?;
    match prepared {
        Some(id) => {
            exec(
                tx,
                "DELETE FROM undo_changes WHERE record_id = ?1",
                params![id],
            )?;
            insert_changes(tx, id, &record.changes)?;
            exec(
                tx,
                "UPDATE undo_records SET state = 'done', at_ms = ?2 WHERE id = ?1",
                params![id, now_ms()],
            )?;
        }
        None => {
            insert_record(tx, call_id, note, tool, "done", &record.changes)?;
        }
    }
    for undone in &record.undoes {
        exec(
            tx,
            "UPDATE undo_records SET undone_by = ?1 WHERE id = ?2",
            params![call_id, undone],
        )?;
    }
    Ok(())
}

fn entries(tx: &Tx<'_>, filter: &str, values: &[&str]) -> Result<Vec<UndoEntry>, Failure> {
    let sql = format!(
        "SELECT id, call_id, note_key, note, tool, state, undone_by, at_ms, note_id
         FROM undo_records WHERE {filter} AND undone_by IS NULL ORDER BY id DESC"
    );
    let mut stmt = tx.prepare(&sql)?;
    let mut out: Vec<UndoEntry> = stmt
        .query_map(rusqlite::params_from_iter(values), |r| {
            Ok(UndoEntry {
                id: r.get(0)?,
                call_id: r.get(1)?,
                note_key: r.get(2)?,
                note_id: r.get(8)?,
                note: r.get(3)?,
                tool: r.get(4)?,
                confirmed: r.get::<_, String>(5)? == "done",
                undone_by: r.get(6)?,
                at: from_ms(r.get(7)?),
                changes: Vec::new(),
            })
        })?
        .collect::<Result<_, _>>()?;
    let mut changes = tx.prepare_cached(
        "SELECT path, before, after_sha256 FROM undo_changes WHERE record_id = ?1 ORDER BY seq",
    )?;
    for e in &mut out {
        e.changes = changes
            .query_map(params![e.id], |r| {
                Ok(VaultChange {
                    path: r.get(0)?,
                    before: r.get(1)?,
                    after_sha256: r.get(2)?,
                })
            })?
            .collect::<Result<_, _>>()?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::testing::fresh_journal;
    use super::*;

    fn change(path: &str) -> VaultChange {
        VaultChange {
            path: path.to_string(),
            before: None,
            after_sha256: Some("00".repeat(32)),
        }
    }

    #[test]
    fn a_change_is_found_by_its_notes_id_after_the_note_was_renamed() {
        let (_d, j) = fresh_journal();
        let run = j
            .begin_note_run("In_Progress/Round3.md", Some("n-aaaaaaaaaaaa"), None, None)
            .unwrap();
        j.undo_prepare(
            "make",
            "In_Progress/Round3.md",
            "vault_create",
            &[change("Agent/a.md")],
        )
        .unwrap();
        j.note_moved(run, "Done/Round3.md", true).unwrap();
        // An older record, from before note ids were kept: found by its path.
        j.undo_prepare("old", "cli/x", "vault_create", &[change("Agent/b.md")])
            .unwrap();
        let by_id = j
            .undo_entries_for_note_id("n-aaaaaaaaaaaa", "Round4.md")
            .unwrap();
        assert_eq!(by_id.len(), 1);
        assert_eq!(by_id[0].call_id, "make");
        assert_eq!(by_id[0].note_id.as_deref(), Some("n-aaaaaaaaaaaa"));
        let with_old = j.undo_entries_for_note_id("n-bbbbbbbbbbbb", "x").unwrap();
        assert_eq!(with_old.len(), 1, "{with_old:?}");
        assert_eq!(with_old[0].call_id, "old");
        assert!(
            j.undo_entries_for_note_id("n-cccccccccccc", "y")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn an_undo_table_from_before_note_ids_gets_the_column_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(dir.path().join("journal.sqlite")).unwrap();
            conn.execute_batch(SCHEMA).unwrap();
            conn.execute(
                "INSERT INTO undo_records (call_id, note_key, note, tool, state, at_ms)
                 VALUES ('c', 'r.md', 'In_Progress/r.md', 'vault_create', 'done', 1)",
                [],
            )
            .unwrap();
        }
        let conn = Connection::open(dir.path().join("journal.sqlite")).unwrap();
        assert!(ensure_schema(&conn).is_ok());
        assert!(ensure_schema(&conn).is_ok()); // twice: nothing more to add
        let (key, id): (String, Option<String>) = conn
            .query_row("SELECT note_key, note_id FROM undo_records", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!((key.as_str(), id), ("r.md", None));
    }
}
