//! The journal's schema: the numbered migrations (`PRAGMA user_version` says how many a
//! file has seen) and the pragmas every connection is opened with.

use super::Failure;
use rusqlite::{Connection, TransactionBehavior};
use std::time::Duration;

/// The schema, one entry per version; `PRAGMA user_version` says how many have been applied.
pub(super) const MIGRATIONS: &[&str] = &[
    // Version 1.
    "CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        note TEXT NOT NULL,
        claimed_at_ms INTEGER NOT NULL,
        ended_at_ms INTEGER,
        final_state TEXT
    );
    CREATE INDEX runs_open ON runs (note) WHERE ended_at_ms IS NULL;

    CREATE TABLE calls (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs (id),
        call_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        effect TEXT,
        params_json TEXT,
        started_at_ms INTEGER,
        ended_at_ms INTEGER,
        result_json TEXT,
        error_code TEXT,
        written_at_ms INTEGER
    );
    CREATE INDEX calls_by_run ON calls (run_id, call_id);
    CREATE INDEX calls_by_tool ON calls (tool, started_at_ms);

    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        at_ms INTEGER NOT NULL,
        event TEXT NOT NULL,
        run_id INTEGER,
        note TEXT NOT NULL,
        call_id TEXT,
        tool TEXT,
        outcome TEXT,
        duration_ms INTEGER,
        detail TEXT
    );
    CREATE INDEX events_at ON events (at_ms);
    CREATE INDEX events_kind ON events (event, id);

    CREATE TABLE approvals (
        call_id TEXT NOT NULL,
        params_hash TEXT NOT NULL,
        note TEXT NOT NULL,
        decision TEXT NOT NULL,
        at_ms INTEGER NOT NULL,
        consumed_at_ms INTEGER,
        PRIMARY KEY (call_id, params_hash)
    );",
    // Version 2: note identity (docs/design.md §9.2, §9.6).
    "ALTER TABLE runs ADD COLUMN note_id TEXT;
    ALTER TABLE runs ADD COLUMN claimed_from TEXT;
    ALTER TABLE runs ADD COLUMN copy_of TEXT;
    ALTER TABLE runs ADD COLUMN copy_within_grace INTEGER;
    CREATE INDEX runs_by_note_id ON runs (note_id);
    CREATE INDEX runs_by_claimed_from ON runs (claimed_from);",
    // Version 3: the first name a hard-link claim leaves behind for `moved_in_grace`.
    "ALTER TABLE runs ADD COLUMN left_behind TEXT;",
    // Version 4: start-up reads the recent left-behind names without scanning every run.
    "CREATE INDEX runs_left_behind ON runs (claimed_at_ms) WHERE left_behind IS NOT NULL;",
    // Version 5: the note's text as claimed (SHA-256), so that a sync client's duplicate of
    // it under another name is known (docs/design.md §9.10). Older runs have none: no match.
    "ALTER TABLE runs ADD COLUMN claimed_sha256 TEXT;",
    // Version 6: the note's text as claimed, kept while its identity stamp is written without
    // an fsync of its own (`journal/mod.rs`, "The stamp"); forgotten a minute after the run
    // ends (`forget_claimed_texts`).
    "ALTER TABLE runs ADD COLUMN claimed_text TEXT;
    CREATE INDEX runs_claimed_text ON runs (ended_at_ms) WHERE claimed_text IS NOT NULL;",
    // Version 7: a call stopped after its start record and before its tool ran (the identity
    // stamp it waited for failed: `runner::BeforeRun`) is marked, and counts against neither
    // its rate limit nor its note's budget. The rate limits' index holds the mark, so that
    // they still count from the index alone.
    "ALTER TABLE calls ADD COLUMN not_run INTEGER;
    DROP INDEX IF EXISTS calls_by_tool;
    CREATE INDEX calls_by_tool ON calls (tool, started_at_ms, not_run);",
];

/// Plans fixed when a statement is prepared, not redone for its bound values (SQLite's query
/// planner stability guarantee): a cached statement is then never prepared again.
/// SQLite gives each connection's page cache a bulk allocation of 20 pages (~86 KB) at its
/// first read; the journal's two connections kept ~170 KB so for the daemon's life while an
/// idle daemon's journal needs a few pages. Pages are then allocated one at a time, as
/// needed. A process-wide setting, made before SQLite's first connection (after it, SQLite
/// refuses it and keeps its default, which is harmless: tests open connections of their own).
pub(super) fn page_cache_on_demand() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: SQLITE_CONFIG_PAGECACHE takes (void*, int, int); a null buffer with N = 0
        // asks for no bulk allocation. Before sqlite3_initialize it is allowed; after, it
        // returns SQLITE_MISUSE and changes nothing.
        unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_PAGECACHE,
                std::ptr::null_mut::<std::ffi::c_void>(),
                0 as std::ffi::c_int,
                0 as std::ffi::c_int,
            );
        }
    });
}

fn stable_plans(conn: &Connection) -> Result<(), Failure> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// The read connection: waits for a writer like the write connection, and refuses to write.
pub(super) fn configure_reader(conn: &Connection) -> Result<(), Failure> {
    conn.busy_timeout(Duration::from_secs(5))?;
    stable_plans(conn)?;
    conn.set_prepared_statement_cache_capacity(32);
    conn.pragma_update(None, "query_only", true)?;
    Ok(())
}

/// Pragmas, then the migrations the file has not seen yet.
pub(super) fn configure(conn: &mut Connection) -> Result<(), Failure> {
    // First, so that everything after it waits for a CLI or daemon holding the lock.
    conn.busy_timeout(Duration::from_secs(5))?;
    stable_plans(conn)?;
    // Room for every statement of the hot paths (about 20 with the writer's BEGIN, SAVEPOINT,
    // RELEASE and COMMIT), so none is prepared twice.
    conn.set_prepared_statement_cache_capacity(32);
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Failure::Other(format!(
            "cannot switch to WAL mode (the file system gave {mode})"
        )));
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", true)?;

    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(Failure::Other(format!(
            "schema version {version} was written by a newer vaultd (this one knows up to {known})"
        )));
    }
    for migration in &MIGRATIONS[version as usize..] {
        tx.execute_batch(migration)?;
    }
    if version < known {
        tx.pragma_update(None, "user_version", known)?;
    }
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::Effect;
    use crate::journal::testing::*;
    use crate::journal::{CallProgress, Journal};

    #[test]
    fn start_up_finds_left_behind_names_by_index_not_by_scanning_runs() {
        let (_dir, journal) = fresh_journal();
        let plan: Vec<String> = {
            let conn = journal.reader();
            let mut st = conn
                .prepare(
                    "EXPLAIN QUERY PLAN SELECT claimed_from, left_behind FROM runs
                     WHERE left_behind IS NOT NULL AND claimed_at_ms >= ?1",
                )
                .unwrap();
            st.query_map([0i64], |r| r.get::<_, String>(3))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        assert!(
            plan.iter().any(|step| step.contains("runs_left_behind")),
            "{plan:?}"
        );
    }

    /// The rate limits count starts from their index alone (version 7 added `not_run` to
    /// it), not by reading the row of every call of the tool.
    #[test]
    fn rate_limits_count_starts_from_their_index() {
        let (_dir, journal) = fresh_journal();
        let conn = journal.reader();
        let mut st = conn
            .prepare(&format!(
                "EXPLAIN QUERY PLAN {}",
                crate::journal::rates::COUNT_SINCE
            ))
            .unwrap();
        let plan: Vec<String> = st
            .query_map(rusqlite::params!["send_notification", 0i64], |r| {
                r.get::<_, String>(3)
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(
            plan.iter()
                .any(|step| step.contains("COVERING INDEX calls_by_tool")),
            "{plan:?}"
        );
    }

    /// A cached statement runs as prepared, whatever its parameters: with the query planner
    /// free to plan by bound values, SQLite marked hot-path statements to be prepared again
    /// whenever a parameter changed (7.7% of the daemon's CPU in the throughput profile, issue
    /// 16). Checked on the journal's own statement, through the connection's statement cache.
    #[test]
    fn hot_path_statements_are_not_prepared_again_for_new_parameters() {
        let (_dir, journal) = fresh_journal();
        for (i, from) in [
            "Needs_Action/a.md",
            "Needs_Action/b.md",
            "Needs_Action/c.md",
        ]
        .into_iter()
        .enumerate()
        {
            let run = journal.begin_run(&format!("In_Progress/{i}.md")).unwrap();
            journal.adopt_run(run, &format!("n-{i}")).unwrap();
            let _ = journal.last_claim_from(from).unwrap();
        }
        let conn = journal.reader();
        // The text of `last_claim_from`'s statement, so the cache hands back the same one.
        let st = conn
            .prepare_cached(crate::journal::runs::LAST_CLAIM_FROM)
            .unwrap();
        assert!(
            st.get_status(rusqlite::StatementStatus::VmStep) > 0,
            "it ran"
        );
        assert_eq!(st.get_status(rusqlite::StatementStatus::RePrepare), 0);
        // Each read's BEGIN and COMMIT too, from the cache.
        for sql in ["BEGIN DEFERRED", "COMMIT"] {
            let st = conn.prepare_cached(sql).unwrap();
            assert!(
                st.get_status(rusqlite::StatementStatus::VmStep) >= 3,
                "{sql} ran from the cache"
            );
        }
    }

    #[test]
    fn a_read_that_panicked_leaves_the_reader_fine_for_the_next() {
        let (_dir, journal) = fresh_journal();
        journal.begin_run("In_Progress/a.md").unwrap();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _: Result<(), _> = journal.read(|_| panic!("a read that panics"));
        }));
        assert!(panicked.is_err());
        // Its transaction is still open on the connection: rolled back by the next read.
        assert_eq!(journal.open_runs().unwrap().len(), 1);
    }

    #[test]
    fn a_version_1_journal_is_migrated_in_place_keeping_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(dir.path().join("journal.sqlite")).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.execute(
                "INSERT INTO runs (id, note, claimed_at_ms) VALUES (7, 'In_Progress/a.md', 1)",
                [],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO calls (run_id, call_id, tool, effect, started_at_ms)
                 VALUES (7, 'c-send', 'send_notification', 'external_side_effect', 2)",
                [],
            )
            .unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
        }
        let journal = Journal::open(dir.path()).unwrap();
        let version: i64 = journal
            .reader()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
        let open = journal.open_runs().unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].note_id, None);
        assert!(journal.note_calls("n-a").unwrap().is_empty());
        journal.adopt_run(7, "n-a").unwrap();
        let calls = journal.note_calls("n-a").unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].effect, Effect::ExternalSideEffect);
        assert_eq!(calls[0].progress, CallProgress::Started);
        assert_eq!(journal.calls_started_for_note("n-a").unwrap(), 1);
    }

    #[test]
    fn open_refuses_a_newer_schema() {
        let (dir, journal) = fresh_journal();
        // Through the writer: the reader connection refuses to write.
        journal
            .write(|tx| Ok(tx.pragma_update(None, "user_version", 99)?))
            .unwrap();
        drop(journal);
        let err = Journal::open(dir.path()).expect_err("newer schema");
        let text = err.to_string();
        assert!(text.contains("journal.sqlite"), "{text}");
        assert!(text.contains("newer vaultd"), "{text}");
    }
}
