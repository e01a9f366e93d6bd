//! The `runs` table: one claim of one note, from the rename into In_Progress to the move
//! out of it, and what the note identity rules (docs/design.md §9.2, §9.6) ask of claims.

use super::calls::run_calls;
use super::events::{EventFields, event};
use super::{
    Failure, Journal, JournalCall, JournalError, Tx, exec, from_ms, now_ms, query_one, to_ms,
};
use super::{Wait, record_move, run_note};
use rusqlite::{OptionalExtension, params};
use std::time::SystemTime;

/// One claim of one note: from the rename into In_Progress to the move out of it.
pub type RunId = i64;

/// Names the run a claim record makes before its id is known: given out before the record is
/// queued ([`Journal::claim_ticket`]), so that a `read_only` call's start can be queued
/// behind it without waiting for the id (see "The claim" in the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimTicket(u64);

impl std::fmt::Display for ClaimTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "claim ticket {}", self.0)
    }
}

/// The run a write goes under: its id, or the ticket of the claim record that makes it
/// (resolved by the writer, which runs that record first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunRef {
    Known(RunId),
    Claimed(ClaimTicket),
}

impl From<RunId> for RunRef {
    fn from(run: RunId) -> RunRef {
        RunRef::Known(run)
    }
}

/// The newest claim made from one path (docs/design.md §9.6): which note it was and where it is now.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub note_id: String,
    pub claimed_at: SystemTime,
    /// The vault-relative path the note has now (as far as the journal knows).
    pub note: String,
    /// SHA-256 (hex) of the note's text as claimed, when recorded (docs/design.md §9.10).
    pub text_sha256: Option<String>,
}

/// A run whose note has not been moved out of In_Progress yet.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenRun {
    pub run_id: RunId,
    /// Vault-relative path of the note in In_Progress.
    pub note: String,
    /// The note's identity; None for a run recorded by a version 1 journal.
    pub note_id: Option<String>,
    pub calls: Vec<JournalCall>,
    /// The note's text as claimed, when its identity stamp was written without an fsync of
    /// its own ([`Journal::keep_claimed_text`]): what recovery puts back if a crash left
    /// the note damaged.
    pub claimed_text: Option<String>,
}

impl Journal {
    /// Records the claim of `note` (its vault-relative path in In_Progress).
    ///
    /// An open run already at that path is stale (its note moved out without the move being
    /// recorded, as a crash between rename and record leaves it): it is closed as
    /// `superseded`, since one path holds one note.
    pub fn begin_run(&self, note: &str) -> Result<RunId, JournalError> {
        self.begin_note_run(note, None, None, None)
    }

    /// [`begin_run`](Self::begin_run) of the note with identity `note_id`, claimed from the
    /// vault-relative path `claimed_from` (None for a note found in In_Progress); `copy_of`
    /// is the note a stale copy stands for, and whether it came within the grace (§9.6).
    pub fn begin_note_run(
        &self,
        note: &str,
        note_id: Option<&str>,
        claimed_from: Option<&str>,
        copy_of: Option<(&str, bool)>,
    ) -> Result<RunId, JournalError> {
        self.begin_claim(note, note_id, claimed_from, copy_of, None)
    }

    /// [`begin_note_run`](Self::begin_note_run) of a note claimed by hard link, whose first
    /// name (`claimed_from`) still names the file `left_behind` (a `FileKey` encoded by the
    /// vault) until the daemon drops it. Recorded with the claim, so that a restart after a
    /// crash in between knows that name for what it is: the claimed note, not a new one.
    pub fn begin_linked_run(
        &self,
        note: &str,
        note_id: &str,
        claimed_from: &str,
        copy_of: Option<(&str, bool)>,
        left_behind: &str,
    ) -> Result<RunId, JournalError> {
        self.begin_claim(
            note,
            Some(note_id),
            Some(claimed_from),
            copy_of,
            Some(left_behind),
        )
    }

    /// Names left behind by link claims since `since`, with the run's note. The daemon checks
    /// them at start-up (see [`begin_linked_run`](Self::begin_linked_run)).
    pub fn left_behind_since(&self, since: SystemTime) -> Result<Vec<LinkClaim>, JournalError> {
        self.read(|tx| {
            let mut st = tx.prepare_cached(
                "SELECT claimed_from, left_behind, note, note_id FROM runs
                 WHERE left_behind IS NOT NULL AND claimed_at_ms >= ?1",
            )?;
            let rows = st.query_map(params![to_ms(since)], |r| {
                Ok(LinkClaim {
                    first_name: r.get(0)?,
                    file_key: r.get(1)?,
                    note: r.get(2)?,
                    note_id: r.get(3)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn begin_claim(
        &self,
        note: &str,
        note_id: Option<&str>,
        claimed_from: Option<&str>,
        copy_of: Option<(&str, bool)>,
        left_behind: Option<&str>,
    ) -> Result<RunId, JournalError> {
        let note = note.to_owned();
        let (note_id, claimed_from) = (note_id.map(str::to_owned), claimed_from.map(str::to_owned));
        let copy_of = copy_of.map(|(of, grace)| (of.to_owned(), grace));
        let left_behind = left_behind.map(str::to_owned);
        self.write(claim_job(
            note,
            note_id,
            claimed_from,
            copy_of,
            left_behind,
            None,
            None,
            None,
        ))
    }
}

/// A run's claim by hard link, as recorded: the first name it left behind, to be dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkClaim {
    /// The vault-relative name the note was claimed from.
    pub first_name: String,
    /// The claimed file's key (`FileKey::encode`), which that name held.
    pub file_key: String,
    /// The run's note, where it was last recorded (In_Progress, or where it moved on to: that
    /// record is not waited for, so it can lag behind the note).
    pub note: String,
    /// The run's note id (`tool_note`).
    pub note_id: Option<String>,
}

/// The job of a claim's run record (see [`Journal::begin_note_run`]).
#[allow(clippy::too_many_arguments)]
fn claim_job(
    note: String,
    note_id: Option<String>,
    claimed_from: Option<String>,
    copy_of: Option<(String, bool)>,
    left_behind: Option<String>,
    claimed_sha256: Option<String>,
    claimed_text: Option<String>,
    ticket: Option<ClaimTicket>,
) -> impl FnOnce(&Tx<'_>) -> Result<RunId, Failure> + Send + 'static {
    move |tx: &Tx<'_>| {
        let (note, note_id, claimed_from) =
            (note.as_str(), note_id.as_deref(), claimed_from.as_deref());
        let copy_of = copy_of.as_ref().map(|(of, grace)| (of.as_str(), *grace));
        let now = now_ms();
        let stale = exec(
            tx,
            "UPDATE runs SET ended_at_ms = ?1, final_state = 'superseded'
                 WHERE note = ?2 AND ended_at_ms IS NULL",
            params![now, note],
        )?;
        if stale > 0 {
            tracing::warn!(note, "journal: closing a stale open run of the same note");
        }
        // Above every id this writer gave out, even one whose record a failed commit lost.
        exec(
            tx,
            "INSERT INTO runs (id, note, claimed_at_ms, note_id, claimed_from, copy_of,
                                   copy_within_grace, left_behind, claimed_sha256, claimed_text)
                 VALUES (max(coalesce((SELECT max(id) FROM runs), 0), ?10) + 1,
                         ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                note,
                now,
                note_id,
                claimed_from,
                copy_of.map(|c| c.0),
                copy_of.map(|c| c.1),
                left_behind,
                claimed_sha256,
                claimed_text,
                tx.run_floor()
            ],
        )?;
        let run = tx.last_insert_rowid();
        tx.recorded_run(run);
        event(tx, now, "claim", Some(run), note, &EventFields::default())?;
        #[cfg(test)]
        claim_hook::call(note)?;
        // Last: a record that failed before names no run.
        if let Some(ticket) = ticket {
            tx.claimed_as(ticket, run);
        }
        Ok(run)
    }
}

impl Journal {
    /// A new ticket for the next claim record ([`begin_claim_async`](Self::begin_claim_async)).
    pub fn claim_ticket(&self) -> ClaimTicket {
        ClaimTicket(
            self.tickets
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1,
        )
    }

    /// The daemon's claim record, for async callers: [`begin_linked_run`]
    /// (Self::begin_linked_run) when `left_behind` is given, else [`begin_note_run`]
    /// (Self::begin_note_run). Returns once it ran in the writer's transaction, not once it
    /// is durable (see "The claim" in the module doc): reads see it after its group commits.
    /// `claimed_sha256` is the SHA-256 of the note's text as claimed (docs/design.md §9.10).
    /// With `claimed_text` (a note whose identity stamp will be written without an fsync of
    /// its own, "The stamp" in the module doc) the text is kept with the run and the record
    /// is waited for until it committed (readers see it), not until it is durable: the stamp
    /// waits for that, as a durable write made after it (a side effect's start, or
    /// [`flush`](Self::flush)) makes it.
    #[allow(clippy::too_many_arguments)]
    pub async fn begin_claim_async(
        &self,
        note: &str,
        note_id: &str,
        claimed_from: &str,
        copy_of: Option<(&str, bool)>,
        left_behind: Option<&str>,
        claimed_sha256: Option<&str>,
        claimed_text: Option<&str>,
        ticket: Option<ClaimTicket>,
    ) -> Result<RunId, JournalError> {
        let wait = match claimed_text {
            Some(_) => Wait::Committed,
            None => Wait::Executed,
        };
        let job = claim_job(
            note.to_owned(),
            Some(note_id.to_owned()),
            Some(claimed_from.to_owned()),
            copy_of.map(|(of, grace)| (of.to_owned(), grace)),
            left_behind.map(str::to_owned),
            claimed_sha256.map(str::to_owned),
            claimed_text.map(str::to_owned),
            ticket,
        );
        self.write_async(wait, job).await
    }

    /// Keeps `text`, the note as claimed, with its run, and returns once that is durable: the
    /// identity stamp is then written without an fsync of its own, and recovery puts `text`
    /// back if a crash leaves the note damaged (`journal/mod.rs`, "The stamp"). The run's end
    /// clears it.
    pub fn keep_claimed_text(&self, run: RunId, text: &str) -> Result<(), JournalError> {
        let text = text.to_owned();
        self.write(move |tx| {
            tx.refuse_lost(run)?;
            exec(
                tx,
                "UPDATE runs SET claimed_text = ?1 WHERE id = ?2",
                params![text, run],
            )?;
            Ok(())
        })
    }

    /// The newest claimed text kept for a note now at one of `paths` (the same name in each
    /// state folder; the run open or ended): what recovery puts back when a crash left that
    /// note damaged ("The stamp" in the module doc).
    pub fn claimed_text_at(&self, paths: &[String]) -> Result<Option<String>, JournalError> {
        self.read(|tx| {
            let mut newest: Option<(i64, String)> = None;
            for path in paths {
                let found: Option<(i64, String)> = query_one(
                    tx,
                    "SELECT id, claimed_text FROM runs
                     WHERE note = ?1 AND claimed_text IS NOT NULL ORDER BY id DESC LIMIT 1",
                    params![path],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
                if let Some(f) = found
                    && newest.as_ref().is_none_or(|n| f.0 > n.0)
                {
                    newest = Some(f);
                }
            }
            Ok(newest.map(|(_, text)| text))
        })
    }

    /// Forgets the claimed texts of runs that ended before `ended_before`: their notes' last
    /// writes and moves are durable by then. Not waited for; an idle daemon writes nothing
    /// (a read, on the partial index, says whether there is anything to forget).
    pub fn forget_claimed_texts(&self, ended_before: SystemTime) -> Result<(), JournalError> {
        let before = to_ms(ended_before);
        let any: bool = self.read(|tx| {
            Ok(query_one(
                tx,
                "SELECT EXISTS (SELECT 1 FROM runs
                     WHERE claimed_text IS NOT NULL AND ended_at_ms < ?1)",
                params![before],
                |r| r.get(0),
            )?)
        })?;
        if !any {
            return Ok(());
        }
        self.write_queued("forgetting claimed texts", move |tx| {
            exec(
                tx,
                "UPDATE runs SET claimed_text = NULL
                 WHERE claimed_text IS NOT NULL AND ended_at_ms < ?1",
                params![before],
            )?;
            Ok(())
        })
    }

    /// Records a rename of the run's note to `to` (vault-relative). `ends_run` closes the run
    /// (Done, Failed, Rejected, Pending_Approval): a later claim of the note is a new run.
    /// Otherwise the run stays open at its new path.
    pub fn note_moved(&self, run: RunId, to: &str, ends_run: bool) -> Result<(), JournalError> {
        let to = to.to_owned();
        self.writer
            .submit(Wait::Recorded, move |tx| {
                record_move(tx, run, &to, ends_run)
            })
            .map_err(|e| self.failed(e))
    }

    /// Closes a run whose note is gone from In_Progress without a recorded move (a person
    /// moved or deleted it), recording `reason` as a problem.
    pub fn abandon_run(&self, run: RunId, reason: &str) -> Result<(), JournalError> {
        let reason = reason.to_owned();
        self.write(move |tx| {
            let reason = reason.as_str();
            let note = run_note(tx, run)?;
            let now = now_ms();
            exec(
                tx,
                "UPDATE runs SET ended_at_ms = ?1, final_state = 'abandoned'
                 WHERE id = ?2 AND ended_at_ms IS NULL",
                params![now, run],
            )?;
            let fields = EventFields {
                detail: Some(reason),
                ..EventFields::default()
            };
            event(tx, now, "problem", Some(run), &note, &fields)
        })
    }

    /// Every run not yet moved out of In_Progress, oldest first, with its calls in start order.
    pub fn open_runs(&self) -> Result<Vec<OpenRun>, JournalError> {
        self.read(|tx| {
            type Row = (RunId, String, Option<String>, Option<String>);
            let runs: Vec<Row> = {
                let mut stmt = tx.prepare(
                    "SELECT id, note, note_id, claimed_text FROM runs
                     WHERE ended_at_ms IS NULL ORDER BY id",
                )?;
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                    .collect::<Result<_, _>>()?
            };
            runs.into_iter()
                .map(|(run_id, note, note_id, claimed_text)| {
                    Ok(OpenRun {
                        run_id,
                        note,
                        note_id,
                        calls: run_calls(tx, run_id)?,
                        claimed_text,
                    })
                })
                .collect()
        })
    }

    /// The open run whose note is now at `note`, if any.
    pub fn run_for_note(&self, note: &str) -> Result<Option<OpenRun>, JournalError> {
        self.read(|tx| {
            let run: Option<(RunId, Option<String>, Option<String>)> = query_one(
                tx,
                "SELECT id, note_id, claimed_text FROM runs WHERE note = ?1 AND ended_at_ms IS NULL
                     ORDER BY id DESC LIMIT 1",
                params![note],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
            run.map(|(run_id, note_id, claimed_text)| {
                Ok(OpenRun {
                    run_id,
                    note: note.to_string(),
                    note_id,
                    calls: run_calls(tx, run_id)?,
                    claimed_text,
                })
            })
            .transpose()
        })
    }

    /// Gives a run recorded without a note id (a version 1 journal) the identity its note now
    /// carries, so its calls are found by note id from now on.
    pub fn adopt_run(&self, run: RunId, note_id: &str) -> Result<(), JournalError> {
        let note_id = note_id.to_owned();
        self.write(move |tx| {
            tx.refuse_lost(run)?;
            let note_id = note_id.as_str();
            exec(
                tx,
                "UPDATE runs SET note_id = ?1 WHERE id = ?2 AND note_id IS NULL",
                params![note_id, run],
            )?;
            Ok(())
        })
    }

    /// The newest claim of a note with an identity from the vault-relative path `from`.
    pub fn last_claim_from(&self, from: &str) -> Result<Option<Claim>, JournalError> {
        self.read(|tx| last_claim_in(tx, from))
    }

    /// [`last_claim_from`](Self::last_claim_from) of each path, in one read.
    pub fn last_claims_from(&self, froms: &[String]) -> Result<Vec<Option<Claim>>, JournalError> {
        self.read(|tx| froms.iter().map(|from| last_claim_in(tx, from)).collect())
    }

    /// The note the note `note_id` is a stale copy of, if it is one (its first claim said so),
    /// and whether it came within the grace (docs/design.md §9.6).
    pub fn copy_of(&self, note_id: &str) -> Result<Option<(String, bool)>, JournalError> {
        self.read(|tx| {
            Ok(query_one(
                tx,
                "SELECT copy_of, copy_within_grace FROM runs
                 WHERE note_id = ?1 AND copy_of IS NOT NULL ORDER BY id LIMIT 1",
                params![note_id],
                |r| Ok((r.get(0)?, r.get::<_, Option<bool>>(1)?.unwrap_or(false))),
            )
            .optional()?)
        })
    }

    /// The path the note `note_id` had at its newest run's last recorded move or claim.
    pub fn note_path(&self, note_id: &str) -> Result<Option<String>, JournalError> {
        self.read(|tx| {
            Ok(query_one(
                tx,
                "SELECT note FROM runs WHERE note_id = ?1 ORDER BY id DESC LIMIT 1",
                params![note_id],
                |r| r.get(0),
            )
            .optional()?)
        })
    }
}

/// The statement of [`Journal::last_claim_from`] (its plan is checked in `schema.rs`).
pub(super) const LAST_CLAIM_FROM: &str =
    "SELECT note_id, claimed_at_ms, note, claimed_sha256 FROM runs
     WHERE claimed_from = ?1 AND note_id IS NOT NULL ORDER BY id DESC LIMIT 1";

fn last_claim_in(tx: &Tx<'_>, from: &str) -> Result<Option<Claim>, Failure> {
    let row: Option<(String, i64, String, Option<String>)> =
        query_one(tx, LAST_CLAIM_FROM, params![from], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    Ok(row.map(|(note_id, at, note, text_sha256)| Claim {
        note_id,
        claimed_at: from_ms(at),
        note,
        text_sha256,
    }))
}

#[cfg(test)]
mod tests {
    use crate::journal::testing::*;
    use crate::journal::*;

    #[test]
    fn ending_move_closes_the_run_and_a_new_claim_starts_another() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        start_search(&journal, run, "c-1");
        journal
            .note_moved(run, "Done/a.md", true)
            .expect("note_moved");
        assert!(journal.open_runs().unwrap().is_empty());
        assert!(journal.run_for_note("In_Progress/a.md").unwrap().is_none());
        assert!(journal.run_for_note("Done/a.md").unwrap().is_none());
        assert!(journal.running_calls().unwrap().is_empty());

        let again = journal.begin_run("In_Progress/a.md").unwrap();
        assert_ne!(again, run);
        let open = journal.open_runs().unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].run_id, again);
        assert!(open[0].calls.is_empty());
    }

    #[test]
    fn a_claimed_text_outlives_its_run_until_forgotten_and_is_found_by_the_note_s_name() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        journal.keep_claimed_text(run, "as claimed").unwrap();
        assert_eq!(
            journal.open_runs().unwrap()[0].claimed_text.as_deref(),
            Some("as claimed")
        );
        journal.note_moved(run, "Done/a.md", true).unwrap();
        let names = ["In_Progress/a.md".to_string(), "Done/a.md".to_string()];
        assert_eq!(
            journal.claimed_text_at(&names).unwrap().as_deref(),
            Some("as claimed"),
            "kept past the run's end"
        );
        // Runs that ended after the cut-off keep theirs.
        let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        journal.forget_claimed_texts(long_ago).unwrap();
        journal.flush().unwrap();
        assert!(journal.claimed_text_at(&names).unwrap().is_some());
        journal
            .forget_claimed_texts(std::time::SystemTime::now() + std::time::Duration::from_secs(1))
            .unwrap();
        journal.flush().unwrap();
        assert_eq!(journal.claimed_text_at(&names).unwrap(), None);
    }

    #[test]
    fn non_ending_move_keeps_the_run_at_its_new_path() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/a.md").unwrap();
        start_search(&journal, run, "c-1");
        journal
            .note_moved(run, "In_Progress/a (2).md", false)
            .unwrap();
        let open = journal.open_runs().unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].note, "In_Progress/a (2).md");
        assert!(journal.run_for_note("In_Progress/a.md").unwrap().is_none());
        let found = journal
            .run_for_note("In_Progress/a (2).md")
            .unwrap()
            .expect("open run at new path");
        assert_eq!(found.run_id, run);
        assert_eq!(found.calls.len(), 1);

        let moves: Vec<_> = journal
            .log(&LogFilter::default())
            .unwrap()
            .into_iter()
            .filter(|e| e.event == "move")
            .map(|e| (e.note, e.detail))
            .collect();
        assert_eq!(
            moves,
            vec![(
                "In_Progress/a.md".to_string(),
                Some("In_Progress/a (2).md".to_string())
            )]
        );
    }

    #[test]
    fn a_second_claim_of_the_same_path_supersedes_a_stale_run() {
        let (_dir, journal) = fresh_journal();
        let stale = journal.begin_run("In_Progress/a.md").unwrap();
        let fresh = journal.begin_run("In_Progress/a.md").unwrap();
        let open = journal.open_runs().unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].run_id, fresh);
        assert_ne!(stale, fresh);
    }

    #[test]
    fn abandoned_run_is_closed_and_reported() {
        let (_dir, journal) = fresh_journal();
        let run = journal.begin_run("In_Progress/gone.md").unwrap();
        journal
            .abandon_run(run, "note no longer in In_Progress")
            .unwrap();
        assert!(journal.open_runs().unwrap().is_empty());
        let problems = journal.problems(10).unwrap();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].note, "In_Progress/gone.md");
    }
}

/// Tests: what a claim record does before it names its run, by the note's path, once.
#[cfg(test)]
pub(crate) mod claim_hook {
    use super::Failure;
    use crate::test_hooks::OnceHooks;
    use std::path::Path;

    type Hook = Box<dyn FnOnce() -> Result<(), String> + Send>;

    static HOOKS: OnceHooks<Hook> = OnceHooks::new();

    /// Runs `hook` in the writer when the claim record of the note named `file_name` runs;
    /// an `Err` fails the record.
    pub(crate) fn set(file_name: &str, hook: impl FnOnce() -> Result<(), String> + Send + 'static) {
        HOOKS.set(file_name, Box::new(hook));
    }

    pub(super) fn call(note: &str) -> Result<(), Failure> {
        match HOOKS.take(Path::new(note)) {
            Some(hook) => hook().map_err(Failure::Other),
            None => Ok(()),
        }
    }
}
