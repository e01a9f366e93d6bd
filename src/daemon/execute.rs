//! Running a claimed note: its journal facts read, its calls planned
//! ([`plan`](crate::pipeline::plan)), their decisions spent, what may run run (a worker permit
//! taken before each call task is spawned; results in call order) and the outcome handed to
//! the write back. The decisions are the pipeline's ([`crate::pipeline::execute`]); this is
//! the daemon doing them.

use crate::call::CallResult;
use crate::daemon::claim::{Claimed, IdentityWrite, Stamp};
use crate::daemon::write_back::Finished;
use crate::daemon::{Daemon, DaemonError, Identity, NoteRun, Pass, reload};
use crate::guard::budget;
use crate::guard::hold_alert::HeldSummary;
use crate::note::{ParsedNote, parse_note};
use crate::pipeline::next_state::{Ending, next_state, outcome_reason, place_as_written};
use crate::pipeline::plan::{self, Facts, Step};
use crate::runner::{BeforeRun, Ran, RunOf};
use crate::tools::Effect;
use crate::vault::State;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;
use tokio::task::JoinHandle;

use crate::pipeline::execute::{
    Gathered, asked_a_person, rules, stamp_after_start, stamp_at_claim,
};

/// The results write's temp file while it is made ([`Daemon::temp_ahead`]).
type TempAhead = Option<JoinHandle<std::io::Result<crate::note::TempFile>>>;

/// A run's calls, started, and the temp file its results go into, on its way.
struct Started {
    calls: Vec<Option<CallTask>>,
    ahead: TempAhead,
}

/// A call started by [`Daemon::start_calls`] (a task of its own), or one that ran already.
pub(crate) enum CallTask {
    Spawned(JoinHandle<Ran>),
    Ran(Ran),
}

impl CallTask {
    async fn ran(self) -> Result<Ran, tokio::task::JoinError> {
        match self {
            CallTask::Spawned(task) => task.await,
            CallTask::Ran(ran) => Ok(ran),
        }
    }

    fn abort(&self) {
        if let CallTask::Spawned(task) = self {
            task.abort();
        }
    }
}

/// What a run knows before anything of it is recorded under its run id: the note's text,
/// parsed, what the journal knew of its calls, and the plan. A claim makes it while its claim
/// record is on its way to the journal (`begin_and_execute`).
pub(crate) struct Prepared {
    text: String,
    parsed: ParsedNote,
    facts: Facts,
    in_note: Vec<String>,
    rules: plan::Rules,
    plan: plan::Plan,
}

impl Daemon {
    /// Runs the pending calls of a claimed note, writes the results, moves the note on.
    pub(crate) async fn execute(
        self: &Arc<Self>,
        mut note: NoteRun,
        read: Option<Claimed>,
    ) -> Result<(), DaemonError> {
        let Some(text) = self.read_claimed(&note, read).await? else {
            return Ok(());
        };
        let parsed = parse_note(&text);
        let prepared = self.prepare(&mut note.ident, note.pass, &note.live, text, parsed)?;
        self.execute_prepared(note, prepared).await
    }

    /// The run's facts and plan (see [`Prepared`]) for `text`, `parsed`; `ident`'s prior calls
    /// go into the facts.
    pub(crate) fn prepare(
        &self,
        ident: &mut Identity,
        pass: Pass,
        live: &reload::Live,
        text: String,
        parsed: ParsedNote,
    ) -> Result<Prepared, DaemonError> {
        let mut facts = self.facts_for(&parsed, pass, ident)?;
        facts.journal_lost = self.journal_lost(&text, &facts)?;
        // Results in the note that the journal holds only as recorded: their "written" mark
        // was lost in a crash (it is not waited for); recorded with this run's move, so that
        // deleting one later means "run again" (§9.3).
        let in_note: Vec<String> = if facts.stale.is_none() {
            parsed
                .results
                .iter()
                .filter(|r| {
                    matches!(
                        facts.prior.get(&r.call_id).map(|c| &c.progress),
                        Some(crate::journal::CallProgress::Finished(_))
                    )
                })
                .map(|r| r.call_id.clone())
                .collect()
        } else {
            Vec::new()
        };
        let rules = rules(&live.config, pass);
        let plan = plan::plan(&parsed, &live.runner.registry, &rules, &facts);
        Ok(Prepared {
            text,
            parsed,
            facts,
            in_note,
            rules,
            plan,
        })
    }

    /// [`execute`](Self::execute) from its [`Prepared`] facts and plan on.
    pub(crate) async fn execute_prepared(
        self: &Arc<Self>,
        note: NoteRun,
        prepared: Prepared,
    ) -> Result<(), DaemonError> {
        let Prepared {
            mut text,
            mut parsed,
            facts,
            in_note,
            rules,
            mut plan,
        } = prepared;
        let (live, pass) = (note.live.clone(), note.pass);
        // A note that carries another note's id (a copy, given its own) is stamped, and before
        // any call starts: if none of its side effects reached the stamp (refused by a rate
        // limit, say), its results write would find the other id and leave it be.
        let carries_another = crate::note::frontmatter_property(&text, "tool_note")
            .is_some_and(|id| id != note.ident.note_id);
        let mut before_run = None;
        if stamp_at_claim(&plan, pass, &facts) || carries_another {
            let at = SystemTime::now();
            let stamp = if !note.text_kept {
                Some(Stamp::KeepThenUnsynced(&text))
            } else if stamp_after_start(&plan) && !carries_another {
                None
            } else {
                Some(Stamp::FlushThenUnsynced(&text))
            };
            let stamped = match stamp {
                // Written by the first side effect's call after its start record, whose
                // commit makes the claimed text durable with it ("The stamp" in
                // `journal/mod.rs`); planned on the text it writes, unless the note changes
                // before (then the results write reads it again).
                None => {
                    let stamped = crate::note::stamp_claim(
                        &text,
                        &note.ident.note_id,
                        &self.runners.me.to_string(),
                        at,
                    );
                    before_run = Some(self.stamp_before_run(&note, text.clone(), at));
                    Some(stamped)
                }
                Some(stamp) => match self
                    .write_identity(note.run, &note.path, &note.ident.note_id, stamp, at)
                    .await?
                {
                    IdentityWrite::Gone => return self.abandon(note.run, &note.path).await,
                    IdentityWrite::NotYet => None,
                    IdentityWrite::NotKept(e) => {
                        tracing::warn!(note = %self.vault.relative(&note.path), "{e}");
                        return self.wait_for_storage(&note, &HashSet::new(), vec![]).await;
                    }
                    IdentityWrite::Written(stamped) => Some(stamped),
                },
            };
            if let Some(stamped) = stamped {
                // Planned again on the note as written: the same calls and facts, but
                // their places (and the line numbers of INVALID_JSON) now count the
                // frontmatter the stamp added. The parse is moved, not made again, when
                // the stamp changed only the frontmatter.
                let claimed = std::mem::replace(&mut text, stamped);
                parsed = parsed
                    .restamped(&claimed, &text)
                    .unwrap_or_else(|| parse_note(&text));
                plan = plan::plan(&parsed, &live.runner.registry, &rules, &facts);
            }
        }
        // A call that runs spends its decision with its start record, in one transaction
        // (docs/design.md §4); the others' decisions are spent here, before their results.
        let runs: HashSet<&str> = plan
            .steps
            .iter()
            .filter(|(_, step)| matches!(step, Step::Run(_)))
            .map(|(call_id, _)| call_id.as_str())
            .collect();
        let (with_start, alone): (Vec<_>, Vec<_>) = std::mem::take(&mut plan.spend)
            .into_iter()
            .partition(|(call_id, _)| runs.contains(call_id.as_str()));
        let with_start: HashMap<String, String> = with_start.into_iter().collect();
        self.spend_decisions(alone).await?;
        self.report_left_pending(&note.path, plan.left_pending, rules.max_calls)
            .await;
        let ahead = self.temp_ahead(&note.path, &plan.steps);
        let calls = self
            .start_calls(
                note.run.into(),
                &note.live,
                &note.path,
                &note.ident.note_id,
                &plan.steps,
                &with_start,
                before_run,
            )
            .await;
        self.finish_calls(
            &note,
            &text,
            &parsed,
            plan.steps,
            Started { calls, ahead },
            &in_note,
        )
        .await
    }

    /// A note whose calls all run now and are `read_only`, with nothing to stamp, spend or
    /// wait for before them ([`Daemon::starts_before_claim`]): its calls start while its
    /// claim record (`claiming`, polled once: queued in the journal's writer) is on its way,
    /// their starts queued behind it under its `ticket` ("The claim" in `journal/mod.rs`).
    /// A claim record that fails stops them and puts the note back, as when nothing started.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn execute_while_claiming(
        self: &Arc<Self>,
        claimed: &Path,
        from: &str,
        left: Option<&crate::vault::LeftBehind>,
        pass: Pass,
        ident: &mut Identity,
        live: Arc<reload::Live>,
        prepared: Prepared,
        ticket: crate::journal::ClaimTicket,
        claiming: std::pin::Pin<
            &mut impl Future<Output = Result<crate::journal::RunId, crate::journal::JournalError>>,
        >,
    ) -> Result<(), DaemonError> {
        let Prepared {
            text,
            parsed,
            in_note,
            rules,
            plan,
            ..
        } = prepared;
        self.report_left_pending(claimed, plan.left_pending, rules.max_calls)
            .await;
        let (known, id) = tokio::sync::watch::channel(None);
        let run_of = RunOf::Claiming { ticket, id };
        let ahead = self.temp_ahead(claimed, &plan.steps);
        let (began, calls) = if let [(_, Step::Run(call))] = plan.steps.as_slice() {
            // One call: run here, beside the claim record's answer, not in a task of its own
            // (a spawn and a join less on the note's way to Done).
            let permit = live.runner.permit().await;
            let (note, note_id) = (self.vault.relative(claimed), ident.note_id.clone());
            let mut call = std::pin::pin!(
                live.runner
                    .run_call(run_of, &note, &note_id, call, None, permit, None)
            );
            let mut claiming = claiming;
            let mut ran = None;
            let began = loop {
                tokio::select! {
                    began = &mut claiming => break began,
                    r = &mut call, if ran.is_none() => ran = Some(r),
                }
            };
            let _ = known.send(Some(began.as_ref().ok().copied()));
            let ran = match (&began, ran) {
                (Err(_), _) => None, // the call is dropped: stopped where it is
                (Ok(_), Some(ran)) => Some(ran),
                (Ok(_), None) => Some(call.await),
            };
            (began, vec![ran.map(CallTask::Ran)])
        } else {
            let calls = self
                .start_calls(
                    run_of,
                    &live,
                    claimed,
                    &ident.note_id,
                    &plan.steps,
                    &HashMap::new(),
                    None,
                )
                .await;
            let began = claiming.await;
            let _ = known.send(Some(began.as_ref().ok().copied()));
            (began, calls)
        };
        let run = match began {
            Ok(run) => run,
            Err(e) => {
                for call in calls.iter().flatten() {
                    call.abort();
                }
                self.unclaim(claimed, from, left).await;
                return Err(e.into());
            }
        };
        tracing::debug!(note = %self.vault.relative(claimed), note_id = %ident.note_id, "claimed");
        let note = NoteRun {
            run,
            path: claimed.to_path_buf(),
            pass,
            ident: std::mem::take(ident),
            live,
            text_kept: false,
        };
        self.finish_calls(
            &note,
            &text,
            &parsed,
            plan.steps,
            Started { calls, ahead },
            &in_note,
        )
        .await
    }

    /// The temp file of the results write for the note at `path`, made in the blocking pool
    /// while its `steps` run ([`crate::note::TempFile`]): the open of its folder and the
    /// create off the note's way to Done. Only for a note worked on alone, with a call to
    /// wait for (as [`Daemon::on_this_thread`]): under load the pool's threads have other
    /// notes' work, and a note waits for its turn, not for its temp file.
    fn temp_ahead(&self, path: &Path, steps: &[(String, Step)]) -> TempAhead {
        if !self.note_slots.one_note() || !steps.iter().any(|(_, s)| matches!(s, Step::Run(_))) {
            return None;
        }
        let (root, path) = (self.vault.root().to_path_buf(), path.to_path_buf());
        Some(tokio::task::spawn_blocking(move || {
            crate::note::TempFile::beside(&root, &path)
        }))
    }

    /// Whether the calls of `prepared` may start before its claim record has run
    /// ([`execute_while_claiming`](Self::execute_while_claiming)): a fresh note whose every
    /// call runs now and is `read_only` ([`stamp_at_claim`] false), no decision to spend, and
    /// no other note's id to replace.
    pub(crate) fn starts_before_claim(prepared: &Prepared, pass: Pass, note_id: &str) -> bool {
        !stamp_at_claim(&prepared.plan, pass, &prepared.facts)
            && prepared.plan.spend.is_empty()
            && crate::note::frontmatter_property(&prepared.text, "tool_note")
                .is_none_or(|id| id == note_id)
    }

    /// The calls of `steps` started (`calls`): their results gathered, written into the note,
    /// and the note moved on.
    async fn finish_calls(
        &self,
        note: &NoteRun,
        text: &str,
        parsed: &ParsedNote,
        steps: Vec<(String, Step)>,
        started: Started,
        in_note: &[String],
    ) -> Result<(), DaemonError> {
        let Started { calls, ahead } = started;
        let ran: HashSet<String> = steps
            .iter()
            .filter(|(_, step)| matches!(step, Step::Run(_)))
            .map(|(call_id, _)| call_id.clone())
            .collect();
        let outcome = self.gather(note, text, steps, calls).await?;
        if outcome
            .results
            .iter()
            .any(crate::runner::start_not_recorded)
        {
            // The journal's storage failed, not the note (docs/design.md §9.12). The outcomes
            // of the calls that ran are waited for before their results are written.
            self.settle_outcomes(outcome.committed).await;
            return self.wait_for_storage(note, &ran, outcome.results).await;
        }
        self.write_and_move(note, text, parsed, outcome, in_note, ahead)
            .await
    }

    /// The identity stamp as the side effects of `note` wait for it ([`BeforeRun`]): written
    /// on `claimed` (the note's text as claimed) with `at` as its `tool_updated`, the text the
    /// run planned on. A note gone meanwhile runs none of them.
    fn stamp_before_run(
        self: &Arc<Self>,
        note: &NoteRun,
        claimed: String,
        at: SystemTime,
    ) -> BeforeRun {
        let (daemon, run, path) = (self.clone(), note.run, note.path.clone());
        let note_id = note.ident.note_id.clone();
        BeforeRun::new(move || {
            let (daemon, path) = (daemon.clone(), path.clone());
            let (note_id, claimed) = (note_id.clone(), claimed.clone());
            Box::pin(async move {
                match daemon
                    .write_identity(run, &path, &note_id, Stamp::Unsynced(&claimed), at)
                    .await
                {
                    Ok(IdentityWrite::Gone) => Err(format!(
                        "the note left {}/ (moved or deleted) before it could",
                        daemon.vault.folder_name(State::InProgress)
                    )),
                    // Written, or not now (logged; the results write adds the properties).
                    Ok(_) => Ok(()),
                    Err(e) => Err(format!(
                        "the note's identity could not be written first ({e})"
                    )),
                }
            })
        })
    }

    /// The claimed note's text, read once its writer is done; None when there is nothing to
    /// run (gone, not UTF-8 any more, unreadable for now).
    async fn read_claimed(
        &self,
        note: &NoteRun,
        read: Option<Claimed>,
    ) -> Result<Option<String>, DaemonError> {
        let (run, path) = (note.run, note.path.as_path());
        let read = match read {
            Some(read) => read,
            None => {
                let path = path.to_path_buf();
                tokio::task::spawn_blocking(move || crate::note::read_settled(&path))
                    .await
                    .expect("read task does not panic")
            }
        };
        match read {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(s) => Ok(Some(s)),
                Err(e) => {
                    // Became non-UTF-8 after the claim: give it back untouched.
                    self.problem_now(
                        path,
                        format!(
                            "note is not UTF-8 (invalid byte at offset {}); left untouched",
                            e.utf8_error().valid_up_to()
                        ),
                    );
                    self.finish_run(
                        run,
                        path,
                        State::Failed,
                        Vec::new(),
                        "the note is not UTF-8",
                    )
                    .await?;
                    Ok(None)
                }
            },
            Err(crate::note::WriteError::Gone(_)) => {
                self.abandon(run, path).await?;
                Ok(None)
            }
            Err(e) => {
                // Unreadable now (permissions changed?): leave it, the run stays open and is
                // retried at the next scan.
                tracing::error!(note = %self.vault.relative(path), "cannot read the claimed note: {e}");
                Ok(None)
            }
        }
    }

    /// What planning needs from the journal, read now (docs/design.md §9.3, §12.2, §4).
    fn facts_for(
        &self,
        parsed: &ParsedNote,
        pass: Pass,
        ident: &mut Identity,
    ) -> Result<Facts, DaemonError> {
        let decisions = if self.approval_via_cli() {
            let questions = Facts::questions(parsed);
            self.read_journal(|j| {
                let mut found = HashMap::new();
                for (call_id, hash) in questions {
                    if let Some(d) = j.approval(&call_id, &hash)? {
                        found.insert((call_id, hash), d);
                    }
                }
                Ok(found)
            })?
        } else {
            HashMap::new()
        };
        let calls_started = self.read_journal(|j| budget::calls_started(j, &ident.note_id))?;
        Ok(Facts {
            prior: std::mem::take(&mut ident.prior),
            stale: ident.stale.as_ref().map(|s| s.within_grace),
            unknown_to_journal: pass == (Pass::Recover { known: false }),
            // Read by `execute` from the note's text (`journal_lost`).
            journal_lost: None,
            decisions,
            calls_started,
        })
    }

    /// Consumes the decisions the plan acts on, so each counts once (with `approval_via =
    /// "folder"` a `vaultd approve` record, if any, is spent with the move that decided).
    async fn spend_decisions(&self, spend: Vec<(String, String)>) -> Result<(), DaemonError> {
        for (call_id, hash) in spend {
            self.blocking(move |j| j.consume_approval(&call_id, &hash))
                .await?;
        }
        Ok(())
    }

    async fn report_left_pending(&self, path: &Path, left_pending: usize, max: usize) {
        if left_pending == 0 {
            return;
        }
        let message = format!(
            "{left_pending} more pending calls left for a later round (at most {max} run and {max} get QUOTA_EXCEEDED per claim, max_calls_per_note)"
        );
        tracing::warn!(note = %self.vault.relative(path), "{message}");
        let rel = self.vault.relative(path);
        let _ = self
            .blocking(move |j| j.record_problem(&rel, &message))
            .await;
    }

    /// Starts every call that may run, each with its worker permit taken before its task is
    /// spawned. Vault changes (`state_change`) of one note run one after another in call
    /// order, so a note can create a note and then append to it.
    #[allow(clippy::too_many_arguments)]
    async fn start_calls(
        &self,
        run: RunOf,
        live: &Arc<reload::Live>,
        path: &Path,
        note_id: &str,
        steps: &[(String, Step)],
        spend: &HashMap<String, String>,
        before_run: Option<BeforeRun>,
    ) -> Vec<Option<CallTask>> {
        let mut handles = Vec::with_capacity(steps.len());
        let mut previous_change: Option<tokio::sync::oneshot::Receiver<()>> = None;
        for (_, step) in steps {
            let Step::Run(call) = step else {
                handles.push(None);
                continue;
            };
            let (after, finished) = if call.effect() == Effect::StateChange {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                (previous_change.replace(rx), Some(tx))
            } else {
                (None, None)
            };
            let permit = live.runner.permit().await;
            let (live, call, run) = (live.clone(), call.clone(), run.clone());
            let note = self.vault.relative(path);
            let note_id = note_id.to_string();
            let spend = spend.get(&call.call_id).cloned();
            let before_run = before_run.clone();
            handles.push(Some(CallTask::Spawned(tokio::spawn(async move {
                if let Some(previous) = after {
                    // Resolves when the previous change finished (its sender dropped).
                    let _ = previous.await;
                }
                let result = live
                    .runner
                    .run_call(
                        run,
                        &note,
                        &note_id,
                        &call,
                        spend.as_deref(),
                        permit,
                        before_run.as_ref(),
                    )
                    .await;
                drop(finished);
                result
            }))));
        }
        handles
    }

    /// Waits for outcomes queued by the runner (`Journal::call_finished_later`) where no
    /// results write settles them; a failed commit is logged.
    async fn settle_outcomes(&self, committed: Vec<crate::journal::Committed>) {
        if committed.is_empty() {
            return;
        }
        let journal = self.journal.clone();
        let settled = tokio::task::spawn_blocking(move || journal.settle_all(committed)).await;
        if let Err(e) = settled {
            tracing::error!("settling outcomes failed: {e}");
        }
    }

    /// Collects the steps' results in call order; the results of calls that never ran are
    /// journaled together, in one commit.
    async fn gather(
        &self,
        note: &NoteRun,
        text: &str,
        steps: Vec<(String, Step)>,
        calls: Vec<Option<CallTask>>,
    ) -> Result<Gathered, DaemonError> {
        let (run, ident) = (note.run, &note.ident);
        let mut out = Gathered::default();
        // Where in `out.results` the results planned from `text` now are (not run, not
        // recorded before): journaled here, after their INVALID_JSON lines are placed.
        let mut unrecorded: Vec<usize> = Vec::new();
        for ((_, step), call) in steps.into_iter().zip(calls) {
            match (step, call) {
                (step, Some(h)) => match h.ran().await {
                    Ok(Ran {
                        result: r,
                        committed,
                    }) => match asked_a_person(&step, &r) {
                        Some(mut held) => {
                            out.committed.extend(committed);
                            held.reason = format!("{}\n{}", held.reason, self.how_to_decide());
                            out.held.push(held);
                            out.waiting = true;
                        }
                        None => {
                            out.committed.extend(committed);
                            out.results.push(r)
                        }
                    },
                    Err(e) => tracing::error!("call task failed: {e}"),
                },
                (Step::Fail(r) | Step::Denied(r), None) => {
                    unrecorded.push(out.results.len());
                    out.results.push(self.redact_result(r))
                }
                (Step::Recorded(r), None) => {
                    if ident.stale.is_some() {
                        out.foreign.insert(r.call_id.clone());
                    }
                    out.results.push(r)
                }
                (Step::Ask(mut h), None) => {
                    h.reason = if h.question.is_some() {
                        // As the run that asked wrote it (`asked_a_person`).
                        format!("{}\n{}", h.reason, self.how_to_decide())
                    } else {
                        format!("{}. {}", h.reason, self.how_to_decide())
                    };
                    out.held.push(h);
                    out.waiting = true;
                }
                (Step::Waiting(_), None) => out.waiting = true,
                (Step::Run(_), None) => unreachable!("every Run step has a handle"),
            }
        }
        if !unrecorded.is_empty() {
            place_as_written(
                text,
                &ident.note_id,
                self.runners.me.as_str(),
                &mut out.results,
                &unrecorded,
                &out.held,
            );
            let unrecorded: Vec<CallResult> =
                unrecorded.iter().map(|i| out.results[*i].clone()).collect();
            let recorded = self
                .blocking(move |j| j.calls_finished(run, &unrecorded))
                .await;
            // The journal's storage failing is not the note's failure (§9.12): the results
            // are still written into the note, or planned again at its next claim.
            if let Err(e) = recorded {
                if !self.storage_paused() {
                    self.settle_outcomes(std::mem::take(&mut out.committed))
                        .await;
                    return Err(e);
                }
                tracing::warn!("{e}");
            }
        }
        Ok(out)
    }

    /// Writes the outcome into the note and moves it to its next state.
    async fn write_and_move(
        &self,
        note: &NoteRun,
        text: &str,
        parsed: &ParsedNote,
        outcome: Gathered,
        in_note: &[String],
        ahead: TempAhead,
    ) -> Result<(), DaemonError> {
        let (run, path, ident) = (note.run, note.path.as_path(), &note.ident);
        let Gathered {
            results,
            held,
            waiting,
            foreign,
            committed,
        } = outcome;
        // Results this run wrote before a crash count for Done or Failed (§8.5) as much as the
        // ones written now: a kill between the write and the move must not turn Failed into Done.
        let failed_before_crash = parsed
            .results
            .iter()
            .any(|r| !r.ok && ident.this_run.contains(&r.call_id));
        let next = next_state(waiting, failed_before_crash, &results);
        let reason = outcome_reason(&results, &held, waiting);
        let results = self.fit_results(path, text, &ident.note_id, results);
        let newly_held: Vec<HeldSummary> = held
            .iter()
            .map(|h| HeldSummary {
                call_id: h.call_id.clone(),
                name: h.name.clone(),
                reason: h.reason.clone(),
            })
            .collect();
        match self
            .write_back_and_finish(
                run,
                path,
                &ident.note_id,
                (results, held),
                Ending {
                    next,
                    reason: &reason,
                    foreign: &foreign,
                    in_note,
                    committed,
                    last_seen: text,
                    // Made long ago, as a rule: the calls ran meanwhile. One that could not be
                    // made is left to the write itself, which says why.
                    ahead: match ahead {
                        Some(made) => made.await.ok().and_then(Result::ok),
                        None => None,
                    },
                },
            )
            .await?
        {
            Finished::Moved(finished) => {
                if let Ok(dest) = &finished
                    && !newly_held.is_empty()
                {
                    let note = self.vault.relative(dest);
                    self.hold_alerts
                        .note_held(
                            &self.live().runner.registry,
                            &note,
                            &newly_held,
                            &self.how_to_decide(),
                        )
                        .await;
                }
                if let Err(e) = finished {
                    // A read-only destination, say: the results are in the note; the run stays
                    // open and the move is retried at the next scan.
                    let rel = self.vault.relative(path);
                    let message = format!("{e}; retried at the next scan");
                    let _ = self
                        .blocking(move |j| j.record_problem(&rel, &message))
                        .await;
                    return Err(e);
                }
            }
            Finished::Gone => self.abandon(run, path).await?,
            // The note stays in In_Progress with its run open; the next periodic scan (or
            // start-up) writes the recorded results from the journal and moves it on.
            Finished::Failed => {}
        }
        Ok(())
    }

    pub(crate) fn redact_result(&self, mut r: CallResult) -> CallResult {
        r.outcome = r.outcome.map_err(|e| self.live().runner.redact_error(e));
        r
    }
}

#[cfg(test)]
mod tests {
    use crate::daemon::claim::before_stamp;
    use crate::daemon::storage::tests::{InProcess, call_of};
    use crate::tools::Effect;
    use crate::vault::State;
    use std::sync::{Arc, Mutex};

    /// Idle tools: `act`, a side effect (the stamp waits for its start), and `look`.
    fn daemon() -> InProcess {
        InProcess::start_with(
            "",
            &[
                ("act", Effect::ExternalSideEffect, None, true),
                ("look", Effect::ReadOnly, None, true),
            ],
        )
    }

    /// `act` alone, limited to one call an hour.
    fn one_act_an_hour() -> InProcess {
        let limit = crate::config::RateLimit {
            per_hour: Some(1),
            per_day: None,
        };
        let tools = crate::tools::idle::registry_limited(
            &[("act", Effect::ExternalSideEffect, None, true)],
            limit,
        );
        InProcess::start_with_registry("", tools)
    }

    /// A note with one call to `tool`.
    fn drop_call(d: &InProcess, name: &str, tool: &str) -> String {
        let text = format!("# {name}\n\n{}", call_of(tool, r#"{"q": "x"}"#));
        std::fs::write(d.vault.folder(State::NeedsAction).join(name), &text).unwrap();
        text
    }

    /// A send note's identity stamp is written after its side effect's start record committed
    /// (that commit's fsync makes the claimed text durable, with no commit of its own) and
    /// before the tool runs: when the stamp is written, the start is in the journal, the note
    /// is still as claimed, and the call has no outcome yet.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_side_effects_note_is_stamped_after_its_start_record_and_before_its_run() {
        let d = daemon();
        let seen = Arc::new(Mutex::new(None));
        let (journal, put) = (d.journal.clone(), seen.clone());
        before_stamp::set("order.md", move |path| {
            let log = journal.log(&Default::default()).unwrap();
            let of = |event: &str| {
                log.iter()
                    .filter(|e| e.note.ends_with("order.md") && e.event == event)
                    .count()
            };
            let text = std::fs::read_to_string(path).unwrap();
            *put.lock().unwrap() = Some((of("call_start"), of("call_end"), text));
        });
        tokio::task::block_in_place(|| {
            let dropped = drop_call(&d, "order.md", "act");
            d.wait_for("order.md in Failed", &|| {
                d.in_state(State::Failed, "order.md")
            });
            let (starts, ends, text) = seen.lock().unwrap().take().expect("the note was stamped");
            assert_eq!(
                (starts, ends),
                (1, 0),
                "start and outcome records at the stamp"
            );
            assert_eq!(text, dropped, "the note as claimed, not stamped yet");
            // The tool ran after the stamp: its own (idle) failure is the result.
            let done =
                std::fs::read_to_string(d.vault.folder(State::Failed).join("order.md")).unwrap();
            assert!(done.contains("tool_note: n-"), "{done}");
            assert!(
                done.contains("not run") && !done.contains("did not run"),
                "the idle tool's own failure, not the stamp's: {done}"
            );
        });
        d.stop().await;
    }

    /// A copy of a note (its `tool_note` carried by a note that still exists) gets an id of
    /// its own, written before any call starts even when the call is a side effect: here the
    /// copy's new call is refused by the rate limit before its start, so no side effect would
    /// write the stamp, and its results write would find the original's id in it and leave it
    /// in In_Progress unwritten.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_whose_side_effect_is_refused_before_its_start_gets_its_own_id_and_results() {
        let d = one_act_an_hour();
        tokio::task::block_in_place(|| {
            drop_call(&d, "orig.md", "act");
            d.wait_for("orig.md in Failed", &|| {
                d.in_state(State::Failed, "orig.md")
            });
            let orig =
                std::fs::read_to_string(d.vault.folder(State::Failed).join("orig.md")).unwrap();
            let id = crate::note::frontmatter_property(&orig, "tool_note")
                .unwrap()
                .to_string();
            // A template made of the finished note, with a new call.
            let copy = format!("{orig}\n{}", call_of("act", r#"{"q": "again"}"#));
            std::fs::write(d.vault.folder(State::NeedsAction).join("copy.md"), copy).unwrap();
            d.wait_for("copy.md in Failed", &|| {
                d.in_state(State::Failed, "copy.md")
            });
            let text =
                std::fs::read_to_string(d.vault.folder(State::Failed).join("copy.md")).unwrap();
            let own = crate::note::frontmatter_property(&text, "tool_note").unwrap();
            assert_ne!(own, id, "{text}");
            assert!(text.contains("RATE_LIMITED"), "{text}");
        });
        d.stop().await;
    }

    /// A call the stamp stopped after its start record (its note was moved away) did not run:
    /// its start counts against neither the tool's rate limit nor the note's budget. With a
    /// limit of one call an hour, the next note's call runs (without the mark, it got
    /// `RATE_LIMITED` for a call that never ran).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_stopped_before_its_run_gives_back_its_rate_limit_slot() {
        let d = one_act_an_hour();
        let done = d.vault.folder(State::Done).join("stopped.md");
        let to = done.clone();
        before_stamp::set("stopped.md", move |path| {
            std::fs::rename(path, &to).unwrap()
        });
        tokio::task::block_in_place(|| {
            drop_call(&d, "stopped.md", "act");
            d.wait_for("stopped.md's run abandoned", &|| {
                d.journal.flush().unwrap();
                d.journal.open_runs().unwrap().is_empty()
                    && d.events_of("stopped.md", "call_end") == 1
            });
            let since = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
            let used = d.journal.rate_use("act", since, since).unwrap();
            assert_eq!(used.last_hour, 0, "a call that did not run used no slot");
            let log = d.journal.log(&Default::default()).unwrap();
            let stopped = log
                .iter()
                .find(|e| e.note.ends_with("stopped.md") && e.event == "call_end")
                .unwrap();
            assert!(
                stopped
                    .detail
                    .as_deref()
                    .unwrap_or_default()
                    .contains("did not run"),
                "{stopped:?}"
            );

            drop_call(&d, "next.md", "act");
            d.wait_for("next.md in Failed", &|| {
                d.in_state(State::Failed, "next.md")
            });
            let next =
                std::fs::read_to_string(d.vault.folder(State::Failed).join("next.md")).unwrap();
            assert!(!next.contains("RATE_LIMITED"), "{next}");
            assert!(
                next.contains("not run") && !next.contains("did not run"),
                "the idle tool ran (its own failure): {next}"
            );
            let used = d.journal.rate_use("act", since, since).unwrap();
            assert_eq!(used.last_hour, 1, "the call that ran used its slot");
        });
        d.stop().await;
    }

    /// A note taken out of In_Progress between its side effect's start record and the stamp
    /// (a person moved it): the stamp finds it gone, and the call does not run. Its recorded
    /// outcome says so (not "started, no outcome": a copy of the note gets that answer, not
    /// `UNKNOWN_OUTCOME`), and the moved note is left as it was.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_note_moved_away_before_its_stamp_runs_none_of_its_side_effects() {
        let d = daemon();
        let done = d.vault.folder(State::Done).join("gone.md");
        let to = done.clone();
        before_stamp::set("gone.md", move |path| std::fs::rename(path, &to).unwrap());
        tokio::task::block_in_place(|| {
            let dropped = drop_call(&d, "gone.md", "act");
            d.wait_for("gone.md's run abandoned", &|| {
                d.journal.flush().unwrap();
                d.journal.open_runs().unwrap().is_empty() && d.events_of("gone.md", "call_end") == 1
            });
            let log = d.journal.log(&Default::default()).unwrap();
            let end = log
                .iter()
                .find(|e| e.note.ends_with("gone.md") && e.event == "call_end")
                .unwrap();
            assert_eq!(end.outcome.as_deref(), Some("EXECUTION_ERROR"), "{end:?}");
            let detail = end.detail.as_deref().unwrap_or_default();
            assert!(
                detail.contains("act did not run: the note left In_Progress/"),
                "{detail}"
            );
            assert_eq!(std::fs::read_to_string(&done).unwrap(), dropped);
        });
        d.stop().await;
    }

    /// A read-only tool that says when it runs, and answers at once.
    struct Peek {
        spec: crate::tools::ToolSpec,
        ran: std::sync::mpsc::Sender<()>,
    }

    impl crate::tools::Tool for Peek {
        fn spec(&self) -> &crate::tools::ToolSpec {
            &self.spec
        }
        fn run<'a>(&'a self, _call: crate::tools::ToolCall<'a>) -> crate::tools::ToolFuture<'a> {
            let _ = self.ran.send(());
            Box::pin(async {
                Ok(crate::call::ToolOutput {
                    data: serde_json::json!({"seen": true}),
                    summary: "peeked".into(),
                    undo: None,
                })
            })
        }
    }

    /// A daemon with `peek` (read_only): each of its runs is sent on the returned receiver.
    fn peeking() -> (InProcess, std::sync::mpsc::Receiver<()>) {
        let (ran, runs) = std::sync::mpsc::channel();
        let mut tools = crate::tools::Registry::empty();
        let spec = crate::tools::ToolSpec {
            name: "peek".into(),
            description: String::new(),
            source: crate::tools::Source::Builtin,
            effect: Effect::ReadOnly,
            schema: serde_json::json!({
                "type": "object",
                "properties": { "q": { "type": "string" } },
                "additionalProperties": false
            }),
        };
        let policy = crate::tools::Policy {
            enabled: true,
            timeout: std::time::Duration::from_secs(5),
            rate_limit: crate::config::RateLimit::default(),
            approval: None,
        };
        tools.add(Box::new(Peek { spec, ran }), policy).unwrap();
        (InProcess::start_with_registry("", tools), runs)
    }

    /// A read-only tool that waits (up to 5 s) for a temp file beside its note in
    /// In_Progress/ and sends its inode (None if none came), then answers.
    struct SeeTemp {
        spec: crate::tools::ToolSpec,
        root: Arc<std::sync::OnceLock<std::path::PathBuf>>,
        seen: std::sync::mpsc::Sender<Option<u64>>,
    }

    impl crate::tools::Tool for SeeTemp {
        fn spec(&self) -> &crate::tools::ToolSpec {
            &self.spec
        }
        fn run<'a>(&'a self, call: crate::tools::ToolCall<'a>) -> crate::tools::ToolFuture<'a> {
            use std::os::unix::fs::MetadataExt;
            let note = self.root.get().unwrap().join(call.note);
            Box::pin(async move {
                let name = note.file_name().unwrap().to_string_lossy().into_owned();
                let prefix = format!(".{name}.vaultd-");
                let mut seen = None;
                for _ in 0..500 {
                    seen = std::fs::read_dir(note.parent().unwrap())
                        .unwrap()
                        .flatten()
                        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                        .map(|e| e.metadata().unwrap().ino());
                    if seen.is_some() {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                let _ = self.seen.send(seen);
                Ok(crate::call::ToolOutput {
                    data: serde_json::json!({"seen": seen.is_some()}),
                    summary: "looked beside".into(),
                    undo: None,
                })
            })
        }
    }

    /// A note worked on alone has its results write's temp file made while its call runs
    /// (`temp_ahead`: the folder's open and the create off its way to Done), and its results
    /// are written into that very file: the note in Done is the temp file the tool saw beside
    /// it, and no temp file is left behind. So for the first, early, path and the second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_notes_results_are_written_into_the_temp_file_made_while_its_call_ran() {
        use std::os::unix::fs::MetadataExt;
        let policy = crate::tools::Policy {
            enabled: true,
            timeout: std::time::Duration::from_secs(10),
            rate_limit: crate::config::RateLimit::default(),
            approval: None,
        };
        // A daemon for each, so that each note is surely alone (`one_note`).
        for (name, tool, effect) in [
            ("early.md", "see", Effect::ReadOnly),
            ("later.md", "see_and_act", Effect::ExternalSideEffect),
        ] {
            let (seen, saw) = std::sync::mpsc::channel();
            let root = Arc::new(std::sync::OnceLock::new());
            let see = SeeTemp {
                spec: crate::tools::ToolSpec {
                    name: tool.into(),
                    description: String::new(),
                    source: crate::tools::Source::Builtin,
                    effect,
                    schema: serde_json::json!({"type": "object"}),
                },
                root: root.clone(),
                seen,
            };
            let mut tools = crate::tools::Registry::empty();
            tools.add(Box::new(see), policy.clone()).unwrap();
            let d = InProcess::start_with_registry("", tools);
            root.set(d.vault.root().to_path_buf()).unwrap();
            tokio::task::block_in_place(|| {
                drop_call(&d, name, tool);
                let temp = saw
                    .recv_timeout(std::time::Duration::from_secs(10))
                    .unwrap();
                let temp = temp.unwrap_or_else(|| panic!("{name}: no temp file while it ran"));
                d.wait_for("the note in Done", &|| d.in_state(State::Done, name));
                let done = d.vault.folder(State::Done).join(name);
                assert_eq!(std::fs::metadata(&done).unwrap().ino(), temp, "{name}");
                let text = std::fs::read_to_string(&done).unwrap();
                assert!(text.contains("looked beside"), "{text}");
                let left: Vec<_> = std::fs::read_dir(d.vault.folder(State::InProgress))
                    .unwrap()
                    .flatten()
                    .map(|e| e.file_name())
                    .collect();
                assert!(left.is_empty(), "{name}: {left:?}");
            });
            d.stop().await;
        }
    }

    /// A note whose calls are all read_only starts them while its claim record is still on
    /// its way through the journal's writer ("The claim" in `journal/mod.rs`): here the
    /// record holds the writer until the tool has run, which it could not without the early
    /// start (the call would wait for the record's run id). The start is recorded under the
    /// record's run, named by its ticket, and the note ends in Done with its result.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_only_call_starts_while_its_claim_record_is_in_the_writer() {
        let (d, runs) = peeking();
        let seen = Arc::new(Mutex::new(None));
        let put = seen.clone();
        crate::journal::claim_hook::set("early.md", move || {
            let ran = runs
                .recv_timeout(std::time::Duration::from_secs(10))
                .is_ok();
            *put.lock().unwrap() = Some(ran);
            Ok(())
        });
        tokio::task::block_in_place(|| {
            drop_call(&d, "early.md", "peek");
            d.wait_for("early.md in Done", &|| d.in_state(State::Done, "early.md"));
            assert_eq!(
                *seen.lock().unwrap(),
                Some(true),
                "the tool ran while the claim record held the writer"
            );
            let done =
                std::fs::read_to_string(d.vault.folder(State::Done).join("early.md")).unwrap();
            assert!(done.contains("peeked"), "{done}");
            d.wait_for("early.md's move recorded", &|| {
                d.journal.flush().unwrap();
                d.events_of("early.md", "move") == 1
            });
            assert_eq!(d.events_of("early.md", "claim"), 1);
            assert_eq!(d.events_of("early.md", "call_start"), 1);
            assert_eq!(d.events_of("early.md", "call_end"), 1);
            assert!(d.journal.open_runs().unwrap().is_empty());
        });
        d.stop().await;
    }

    /// A claim record that fails after the note's read_only call started under its ticket:
    /// the start is refused (recorded under no run), the call's result is dropped, and the
    /// note goes back to Needs_Action untouched, to be claimed again; that claim runs the call
    /// again and writes one result.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_only_call_started_under_a_claim_record_that_fails_is_not_recorded() {
        let (d, runs) = peeking();
        let runs = Arc::new(Mutex::new(runs));
        let (first, early) = (runs.clone(), Arc::new(Mutex::new(None)));
        let put = early.clone();
        crate::journal::claim_hook::set("back.md", move || {
            let ran = first
                .lock()
                .unwrap()
                .recv_timeout(std::time::Duration::from_secs(10));
            *put.lock().unwrap() = Some(ran.is_ok());
            Err("no space left on device (a test's)".into())
        });
        tokio::task::block_in_place(|| {
            let dropped = drop_call(&d, "back.md", "peek");
            d.wait_for("back.md in Done", &|| d.in_state(State::Done, "back.md"));
            assert_eq!(
                *early.lock().unwrap(),
                Some(true),
                "the call started before its claim record ran"
            );
            let again = runs
                .lock()
                .unwrap()
                .recv_timeout(std::time::Duration::from_secs(5));
            assert!(again.is_ok(), "the second claim ran the call again");
            let done =
                std::fs::read_to_string(d.vault.folder(State::Done).join("back.md")).unwrap();
            assert!(
                done.contains(dropped.trim_end()),
                "the note as dropped: {done}"
            );
            assert_eq!(done.matches("peeked").count(), 1, "one result: {done}");
            d.wait_for("back.md's move recorded", &|| {
                d.journal.flush().unwrap();
                d.events_of("back.md", "move") == 1
            });
            // The failed record and the start behind it left nothing in the journal.
            assert_eq!(d.events_of("back.md", "claim"), 1);
            assert_eq!(d.events_of("back.md", "call_start"), 1);
            assert!(d.journal.open_runs().unwrap().is_empty());
        });
        d.stop().await;
    }
}
