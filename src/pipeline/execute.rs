//! Execute: the pending calls of a claimed note are decided, run (concurrently, results in
//! call order) and handed to the write back.

use crate::call::{CallError, CallResult, ErrorCode, HeldCall};
use crate::daemon::Daemon;
use crate::daemon::intake::stamp;
use crate::daemon::{DaemonError, Identity, Pass};
use crate::guard::budget;
use crate::guard::hold_alert::HeldSummary;
use crate::journal::{CallProgress, Decision, JournalCall, RunId};
use crate::note::{self, CallBody, ParsedNote, parse_note};
use crate::pipeline::next_state::{WriteBack, outcome_reason};
use crate::tools::Admission;
use crate::vault::State;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// What becomes of a held call in this pass.
pub(crate) enum HeldDecision {
    Run,
    Rejected,
    /// Asked already, with these exact parameters; no decision yet.
    Waiting,
    /// Not asked yet with these parameters: write a `[!question]`.
    Ask,
}

impl Daemon {
    /// Runs the pending calls of a claimed note, writes the results, moves the note on.
    pub(crate) async fn execute(
        self: &Arc<Self>,
        run: RunId,
        path: &Path,
        pass: Pass,
        ident: Identity,
    ) -> Result<(), DaemonError> {
        let prior = &ident.prior;
        let read = {
            let path = path.to_path_buf();
            tokio::task::spawn_blocking(move || note::read_settled(&path))
                .await
                .expect("read task does not panic")
        };
        let text = match read {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(s) => s,
                Err(e) => {
                    // Became non-UTF-8 after the claim: give it back untouched.
                    let (len, mtime) = stamp(path);
                    self.problem(
                        path,
                        len,
                        mtime,
                        format!(
                            "note is not UTF-8 (invalid byte at offset {}); left untouched",
                            e.utf8_error().valid_up_to()
                        ),
                    );
                    return self
                        .finish_run(
                            run,
                            path,
                            State::Failed,
                            Vec::new(),
                            "the note is not UTF-8",
                        )
                        .await
                        .map(|_| ());
                }
            },
            Err(note::WriteError::Gone(_)) => {
                return self.abandon(run, path).await;
            }
            Err(e) => {
                // Unreadable now (permissions changed?): leave it, the run stays open and is
                // retried at the next scan.
                tracing::error!(note = %self.vault.relative(path), "cannot read the claimed note: {e}");
                return Ok(());
            }
        };
        let parsed = parse_note(&text);
        let registry = &self.runner.registry;
        let max = self.config.max_calls_per_note;

        enum Step {
            /// A result to write; `recorded` when the journal already holds it.
            Done(CallResult),
            Recorded(CallResult),
            Run {
                call_id: String,
                name: String,
                parameters: Map<String, Value>,
            },
            Hold(HeldCall),
            StillHeld,
        }
        let mut steps = Vec::new();
        let mut left_pending = 0usize;
        for (i, call) in parsed.pending_calls().enumerate() {
            let call_id = call.call_id.clone();
            let shown_name = call.name.clone().unwrap_or_else(|| "tool_call".to_string());
            if i >= 2 * max {
                // §9.8: past twice the cap, calls stay pending (no result block each), so a
                // note of 10,000 calls does not grow by 9,990 QUOTA_EXCEEDED blocks.
                left_pending += 1;
                continue;
            }
            if i >= max {
                steps.push(Step::Done(CallResult::failed_now(
                    &call_id,
                    &shown_name,
                    CallError::new(
                        ErrorCode::QuotaExceeded,
                        format!(
                            "only the first {max} pending calls of a note run per round (max_calls_per_note); write this call again to run it"
                        ),
                    ),
                )));
                continue;
            }
            let (name, parameters) = match &call.body {
                CallBody::Broken(e) => {
                    steps.push(Step::Done(CallResult::failed_now(
                        &call_id,
                        &shown_name,
                        e.clone(),
                    )));
                    continue;
                }
                CallBody::Call { name, parameters } => (name, parameters),
            };
            // §9.3: what the journal recorded for this call of this note decides, by the
            // effect recorded at its start, never by what the registry says now.
            let record = prior.get(&call_id);
            let same_note = ident.stale.is_none();
            let within_grace = ident.stale.as_ref().is_some_and(|s| s.within_grace);
            let mut stale_reason = None;
            match record {
                Some(r) if same_note || within_grace => match (&r.progress, &r.recorded) {
                    (CallProgress::Finished(result), _) => {
                        steps.push(Step::Recorded(result.clone()));
                        continue;
                    }
                    // Written once and since deleted from the note: run again (§2), unless
                    // this is a stale copy, which gets what the note it copies got.
                    (CallProgress::Written, Some(result)) if !same_note => {
                        steps.push(Step::Recorded(result.clone()));
                        continue;
                    }
                    (CallProgress::Started, _) if !r.effect.safe_to_repeat() => {
                        steps.push(Step::Done(unknown_outcome(&call_id, name)));
                        continue;
                    }
                    _ => {}
                },
                Some(r) if r.started_at.is_some() && !r.effect.safe_to_repeat() => {
                    // A stale copy past the grace: held, saying when and where it ran.
                    let when = r
                        .started_at
                        .map(crate::call::rfc3339_seconds)
                        .unwrap_or_default();
                    stale_reason = Some(format!(
                        "this call already ran at {when} from {} (this note looks like an old copy of it)",
                        r.note
                    ));
                }
                Some(_) => {}
                None if pass == (Pass::Recover { known: false })
                    && registry
                        .get(name)
                        .is_some_and(|t| !t.spec().effect.safe_to_repeat()) =>
                {
                    // §8.15: the journal knows nothing of the note; it may have run.
                    steps.push(Step::Done(unknown_outcome(&call_id, name)));
                    continue;
                }
                None => {}
            }
            let tool = match registry.resolve(name, parameters) {
                Ok(t) => t,
                Err(e) => {
                    steps.push(Step::Done(CallResult::failed_now(&call_id, name, e)));
                    continue;
                }
            };
            let admission = match stale_reason {
                Some(reason) => Admission::Hold { reason },
                None => tool.admit(parameters),
            };
            match admission {
                Admission::Run => steps.push(Step::Run {
                    call_id,
                    name: name.clone(),
                    parameters: parameters.clone(),
                }),
                Admission::Deny(e) => {
                    steps.push(Step::Done(CallResult::failed_now(&call_id, name, e)))
                }
                Admission::Hold { reason } => {
                    match self
                        .held_call_decision(pass, &parsed, &call_id, name, parameters)
                        .await?
                    {
                        HeldDecision::Run => steps.push(Step::Run {
                            call_id,
                            name: name.clone(),
                            parameters: parameters.clone(),
                        }),
                        HeldDecision::Rejected => {
                            steps.push(Step::Done(crate::approval::rejected_result(&call_id, name)))
                        }
                        HeldDecision::Waiting => steps.push(Step::StillHeld),
                        HeldDecision::Ask => steps.push(Step::Hold(HeldCall {
                            call_id,
                            name: name.clone(),
                            parameters: parameters.clone(),
                            reason: format!("{reason}. {}", self.how_to_decide()),
                        })),
                    }
                }
            }
        }

        if left_pending > 0 {
            let message = format!(
                "{left_pending} more pending calls left for a later round (at most {max} run and {max} get QUOTA_EXCEEDED per claim, max_calls_per_note)"
            );
            tracing::warn!(note = %self.vault.relative(path), "{message}");
            let rel = self.vault.relative(path);
            let _ = self
                .blocking(move |j| j.record_problem(&rel, &message))
                .await;
        }
        self.apply_note_budget(
            &ident.note_id,
            &mut steps,
            prior,
            |step| match step {
                Step::Run { call_id, name, .. } => Some((call_id.clone(), name.clone(), true)),
                Step::Hold(h) => Some((h.call_id.clone(), h.name.clone(), false)),
                _ => None,
            },
            |call_id, name, e| Step::Done(CallResult::failed_now(call_id, name, e)),
        )
        .await?;

        // Run what may run, concurrently; results stay in call order. Vault changes
        // (`state_change`) of one note run one after another in call order, so a note can
        // create a note and then append to it.
        let mut handles = Vec::with_capacity(steps.len());
        let mut previous_change: Option<tokio::sync::oneshot::Receiver<()>> = None;
        for step in &steps {
            if let Step::Run {
                call_id,
                name,
                parameters,
            } = step
            {
                let me = self.clone();
                let (call_id, name, parameters) =
                    (call_id.clone(), name.clone(), parameters.clone());
                let note = self.vault.relative(path);
                let changes_vault = self
                    .runner
                    .registry
                    .get(&name)
                    .is_some_and(|t| t.spec().effect == crate::tools::Effect::StateChange);
                let (after, finished) = if changes_vault {
                    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                    (previous_change.replace(rx), Some(tx))
                } else {
                    (None, None)
                };
                let note_id = ident.note_id.clone();
                handles.push(Some(tokio::spawn(async move {
                    if let Some(previous) = after {
                        // Resolves when the previous change finished (its sender dropped).
                        let _ = previous.await;
                    }
                    let result = me
                        .runner
                        .run_call(run, &note, &note_id, &call_id, &name, &parameters)
                        .await;
                    drop(finished);
                    result
                })));
            } else {
                handles.push(None);
            }
        }
        let mut results: Vec<CallResult> = Vec::new();
        let mut held: Vec<HeldCall> = Vec::new();
        let mut waiting = false;
        let mut foreign: HashSet<String> = HashSet::new();
        // Results of calls that never ran, journaled together in one commit below.
        let mut unrecorded: Vec<CallResult> = Vec::new();
        for (step, handle) in steps.into_iter().zip(handles) {
            match (step, handle) {
                (_, Some(h)) => match h.await {
                    Ok(r) => results.push(r),
                    Err(e) => tracing::error!("call task failed: {e}"),
                },
                (Step::Done(r), None) => {
                    let r = self.redact_result(r);
                    unrecorded.push(r.clone());
                    results.push(r)
                }
                (Step::Recorded(r), None) => {
                    if ident.stale.is_some() {
                        // Recorded for the note this copies, not for this one.
                        foreign.insert(r.call_id.clone());
                    }
                    results.push(r)
                }
                (Step::Hold(h), None) => {
                    held.push(h);
                    waiting = true;
                }
                (Step::StillHeld, None) => waiting = true,
                (Step::Run { .. }, None) => unreachable!("every Run step has a handle"),
            }
        }

        if !unrecorded.is_empty() {
            self.blocking(move |j| j.calls_finished(run, &unrecorded))
                .await?;
        }

        // Results this run wrote before a crash count for Done or Failed (§8.5) as much as the
        // ones written now: a kill between the write and the move must not turn Failed into Done.
        let failed_before_crash = parsed
            .results
            .iter()
            .any(|r| !r.ok && ident.this_run.contains(&r.call_id));
        let next = if waiting {
            State::PendingApproval
        } else if failed_before_crash || results.iter().any(|r| !r.is_ok()) {
            State::Failed
        } else {
            State::Done
        };
        let reason = outcome_reason(&results, &held, waiting);
        let results = self.fit_results(path, &text, &ident.note_id, results);
        let newly_held: Vec<HeldSummary> = held
            .iter()
            .map(|h| HeldSummary {
                call_id: h.call_id.clone(),
                name: h.name.clone(),
                reason: h.reason.clone(),
            })
            .collect();
        match self
            .write_back(path, &ident.note_id, results, held, next)
            .await?
        {
            WriteBack::Written(mut ids) => {
                ids.retain(|id| !foreign.contains(id));
                let finished = self.finish_run(run, path, next, ids, &reason).await;
                if let Ok(dest) = &finished
                    && !newly_held.is_empty()
                {
                    let note = self.vault.relative(dest);
                    self.hold_alerts
                        .note_held(
                            &self.runner.registry,
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
            WriteBack::Gone => self.abandon(run, path).await?,
            // The note stays in In_Progress with its run open; the next periodic scan (or
            // start-up) writes the recorded results from the journal and moves it on.
            WriteBack::Failed => {}
        }
        Ok(())
    }

    /// What becomes of a call the policy holds (DESIGN §4). A question the note shows binds
    /// the decision to the exact parameters it lists: a call edited since is asked about
    /// again. With `approval_via = "folder"` the note being in Approved/ decides; with
    /// `"cli"` only a decision `vaultd approve`/`reject` recorded in the journal does, and it
    /// is consumed here so it counts once.
    pub(crate) async fn held_call_decision(
        &self,
        pass: Pass,
        parsed: &ParsedNote,
        call_id: &str,
        name: &str,
        parameters: &Map<String, Value>,
    ) -> Result<HeldDecision, DaemonError> {
        let hash = note::params_hash(name, parameters);
        if !parsed.is_held_as(call_id, &hash) {
            return Ok(HeldDecision::Ask);
        }
        let id = call_id.to_string();
        if !self.approval_via_cli() {
            if pass != Pass::Approved {
                return Ok(HeldDecision::Waiting);
            }
            // Moving the note decided; a `vaultd approve` record, if any, is spent with it.
            self.blocking(move |j| j.consume_approval(&id, &hash))
                .await?;
            return Ok(HeldDecision::Run);
        }
        Ok(
            match self
                .blocking(move |j| j.consume_approval(&id, &hash))
                .await?
            {
                Some(Decision::Approved) => HeldDecision::Run,
                Some(Decision::Rejected) => HeldDecision::Rejected,
                None => HeldDecision::Waiting,
            },
        )
    }

    /// The note budget (DESIGN §12.2): once the calls this note ever started reach
    /// `note_budget`, every further call that would run or be held gets QUOTA_EXCEEDED. Calls
    /// already started (recovery) are not charged again.
    pub(crate) async fn apply_note_budget<S>(
        &self,
        note_id: &str,
        steps: &mut [S],
        prior: &HashMap<String, JournalCall>,
        charged: impl Fn(&S) -> Option<(String, String, bool)>,
        spent: impl Fn(&str, &str, CallError) -> S,
    ) -> Result<(), DaemonError> {
        let budget = self.config.guard.note_budget;
        let key = note_id.to_string();
        let started = self
            .blocking(move |j| budget::calls_started(j, &key))
            .await?;
        let mut left = budget::remaining(budget, started);
        for step in steps.iter_mut() {
            let Some((call_id, name, runs)) = charged(step) else {
                continue;
            };
            if prior.contains_key(&call_id) {
                continue;
            }
            if left == 0 {
                *step = spent(&call_id, &name, budget::spent(budget));
            } else if runs {
                left -= 1;
            }
        }
        Ok(())
    }

    pub(crate) fn redact_result(&self, mut r: CallResult) -> CallResult {
        r.outcome = r.outcome.map_err(|e| self.runner.redact_error(e));
        r
    }
}

pub(crate) fn unknown_outcome(call_id: &str, name: &str) -> CallResult {
    CallResult::failed_now(
        call_id,
        name,
        CallError::new(
            ErrorCode::UnknownOutcome,
            "vaultd stopped (or the note was moved) while this call was running and its outcome was not recorded; it is not sent again. Check whether it arrived; write the call again to send it once more",
        ),
    )
}
