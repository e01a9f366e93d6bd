//! Synced vaults (docs/design.md §9.9) in the journal: the take-overs (`--take-over`: another
//! runner's notes up to that moment are history) and the pause a running daemon is in when it
//! saw a second runner, which `vaultd status` (another process) shows. Self-contained tables,
//! created at open.

use super::{Failure, Journal, JournalError, from_ms, now_ms};
use rusqlite::{OptionalExtension, params};
use std::time::SystemTime;

/// Created at every open (`IF NOT EXISTS`), outside the numbered migrations.
pub(super) const TABLES: &str = "
    CREATE TABLE IF NOT EXISTS runner_takeovers (
        id INTEGER PRIMARY KEY,
        at_ms INTEGER NOT NULL,
        runner TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS runner_pause (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        at_ms INTEGER NOT NULL,
        runner TEXT NOT NULL,
        other TEXT NOT NULL,
        note TEXT NOT NULL
    );
";

/// Why a running daemon stopped claiming: another runner's note it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerPause {
    pub at: SystemTime,
    /// This daemon's runner id.
    pub runner: String,
    /// The other runner's `tool_runner`.
    pub other: String,
    /// The note (vault-relative) that showed it.
    pub note: String,
}

impl Journal {
    /// Records a take-over by `runner` and returns its cutoff: notes of other runners updated
    /// up to it are history from now on. The cutoff is now, or `up_to` when that is later: a
    /// note the other host stamped with a clock ahead of ours (docs/design.md §9.14) is history too,
    /// and that host's later notes, stamped by the same clock, still come after it.
    pub fn record_take_over(
        &self,
        runner: &str,
        up_to: Option<SystemTime>,
    ) -> Result<SystemTime, JournalError> {
        let runner = runner.to_owned();
        let up_to = up_to.map(super::to_ms);
        self.write(move |tx| {
            let at = up_to.map_or_else(now_ms, |t| t.max(now_ms()));
            tx.execute(
                "INSERT INTO runner_takeovers (at_ms, runner) VALUES (?1, ?2)",
                params![at, runner],
            )?;
            Ok(from_ms(at))
        })
    }

    /// The latest take-over, if any.
    pub fn taken_over_at(&self) -> Result<Option<SystemTime>, JournalError> {
        self.read(|tx| {
            let at: Option<i64> = tx
                .query_row("SELECT MAX(at_ms) FROM runner_takeovers", [], |r| r.get(0))
                .optional()?
                .flatten();
            Ok(at.map(from_ms))
        })
    }

    /// Records that this daemon paused claiming because of `other`'s note `note` (one pause
    /// at a time; the first one seen is kept).
    pub fn record_pause(&self, runner: &str, other: &str, note: &str) -> Result<(), JournalError> {
        let (runner, other, note) = (runner.to_owned(), other.to_owned(), note.to_owned());
        self.write(move |tx| {
            tx.execute(
                "INSERT OR IGNORE INTO runner_pause (id, at_ms, runner, other, note)
                 VALUES (1, ?1, ?2, ?3, ?4)",
                params![now_ms(), runner, other, note],
            )?;
            Ok(())
        })
    }

    /// Forgets the pause: a daemon that starts is either refused or not paused.
    pub fn clear_pause(&self) -> Result<(), JournalError> {
        self.write(|tx| {
            tx.execute("DELETE FROM runner_pause", [])?;
            Ok(())
        })
    }

    pub fn pause(&self) -> Result<Option<RunnerPause>, JournalError> {
        self.read(|tx| {
            tx.query_row(
                "SELECT at_ms, runner, other, note FROM runner_pause WHERE id = 1",
                [],
                |r| {
                    Ok(RunnerPause {
                        at: from_ms(r.get(0)?),
                        runner: r.get(1)?,
                        other: r.get(2)?,
                        note: r.get(3)?,
                    })
                },
            )
            .optional()
            .map_err(Failure::from)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_overs_and_the_pause_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        assert_eq!(j.taken_over_at().unwrap(), None);
        assert_eq!(j.pause().unwrap(), None);
        let first = j.record_take_over("alpha-0a1b", None).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let second = j.record_take_over("alpha-0a1b", None).unwrap();
        assert!(second > first);
        j.record_pause("alpha-0a1b", "beta-1234", "Done/x.md")
            .unwrap();
        j.record_pause("alpha-0a1b", "gamma-5678", "Done/y.md")
            .unwrap();
        drop(j);
        let j = Journal::open(dir.path()).unwrap();
        assert_eq!(j.taken_over_at().unwrap(), Some(second));
        let p = j.pause().unwrap().unwrap();
        assert_eq!(
            (p.other.as_str(), p.note.as_str()),
            ("beta-1234", "Done/x.md")
        );
        j.clear_pause().unwrap();
        assert_eq!(j.pause().unwrap(), None);
    }
}
