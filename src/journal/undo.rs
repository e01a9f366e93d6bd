//! The undo table (docs/design.md §11.3): for every vault change, each file's pre-image (bytes, or
//! absent) and post-image hash, keyed by call id and note, so `vaultd undo` and `vault_undo`
//! can put the vault back.
//!
//! Self-contained: its tables are created with `CREATE TABLE IF NOT EXISTS` at open, outside
//! the numbered migrations, so it merges with other schema work.
//!
//! A change is recorded twice: *prepared* in its own transaction just before the file is
//! written (a write-ahead record: a kill between the write and the outcome still leaves an
//! undoable change), then *confirmed* — replaced by what was really written — in the same
//! transaction as the call's outcome (`record_outcome`). Undo always compares the file with
//! the recorded post-image hash first, so a prepared change that never reached the disk is
//! refused, never applied.

use super::{Failure, Journal, JournalError, Tx, exec, from_ms, now_ms, query_one};
use crate::call::{UndoRecord, VaultChange};
use rusqlite::{Connection, OptionalExtension, params};
use std::time::SystemTime;

pub(super) const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS undo_records (
        id INTEGER PRIMARY KEY,
        call_id TEXT NOT NULL,
        -- The note's identity: its path below its state folder until note ids exist.
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

pub(super) fn ensure_schema(conn: &Connection) -> Result<(), Failure> {
    conn.execute_batch(SCHEMA)?;
    Ok(())
}

/// One recorded change set, as `vaultd undo` and `vault_undo` see it.
#[derive(Debug, Clone, PartialEq)]
pub struct UndoEntry {
    pub id: i64,
    pub call_id: String,
    pub note_key: String,
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
        let (call_id, note, tool) = (call_id.to_owned(), note.to_owned(), tool.to_owned());
        let changes = changes.to_vec();
        self.write(move |tx| insert_record(tx, &call_id, &note, &tool, "prepared", &changes))
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
        self.read(|tx| entries(tx, "call_id = ?1", call_id))
    }

    /// Not-yet-undone records of the note `key` (see [`note_key`]), newest first.
    pub fn undo_entries_for_note(&self, key: &str) -> Result<Vec<UndoEntry>, JournalError> {
        self.read(|tx| entries(tx, "note_key = ?1", key))
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
    exec(
        tx,
        "INSERT INTO undo_records (call_id, note_key, note, tool, state, at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
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

fn entries(tx: &Tx<'_>, filter: &str, value: &str) -> Result<Vec<UndoEntry>, Failure> {
    let sql = format!(
        "SELECT id, call_id, note_key, note, tool, state, undone_by, at_ms FROM undo_records
         WHERE {filter} AND undone_by IS NULL ORDER BY id DESC"
    );
    let mut stmt = tx.prepare(&sql)?;
    let mut out: Vec<UndoEntry> = stmt
        .query_map(params![value], |r| {
            Ok(UndoEntry {
                id: r.get(0)?,
                call_id: r.get(1)?,
                note_key: r.get(2)?,
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
