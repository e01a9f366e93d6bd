//! Planning, pure: a note, the registry, the rules of this pass and the facts the journal
//! recorded (read beforehand) decide what each pending call gets — a result at once, the
//! result recorded before, a run, or a question for a person. No IO here: the daemon,
//! `vaultd check` and `vaultd approve`/`reject` all decide through [`plan`] and
//! [`held_calls`], and read or spend what the plan names themselves.

use crate::call::{CallError, CallResult, ErrorCode, HeldCall};
use crate::guard::budget;
use crate::journal::{CallProgress, Decision, JournalCall};
use crate::note::{CallBody, ParsedNote, params_hash};
use crate::tools::{Admission, Registry, ValidCall};
use serde_json::{Map, Value};
use std::collections::HashMap;

/// How this pass decides calls the policy holds (docs/design.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    /// `approval_via = "folder"`: the note being in Approved/ decides.
    Folder { in_approved: bool },
    /// `approval_via = "cli"`: only a decision `vaultd approve`/`reject` recorded does.
    Cli,
}

/// The rules a plan follows, from the config and the pass.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// `max_calls_per_note`: the first this many pending calls are planned per round, the
    /// next as many get QUOTA_EXCEEDED, the rest stay pending (§9.8).
    pub max_calls: usize,
    /// `note_budget` (§12.2); None: not applied (`vaultd check`).
    pub note_budget: Option<u64>,
    pub approval: Approval,
}

impl Rules {
    /// The limits and the approval mode the daemon plans a note with, from its config;
    /// `in_approved`: the note was claimed from Approved/ (`approval_via = "folder"`). A
    /// dry run plans with the same rules, so its decision is the daemon's (§12.1).
    pub fn for_config(config: &crate::config::Config, in_approved: bool) -> Rules {
        Rules {
            max_calls: config.max_calls_per_note,
            note_budget: Some(config.guard.note_budget),
            approval: if config.approval_via == crate::config::ApprovalVia::Cli {
                Approval::Cli
            } else {
                Approval::Folder { in_approved }
            },
        }
    }

    /// What `vaultd check` asks: every pending call judged on its own, nothing spent.
    pub fn check() -> Rules {
        Rules {
            max_calls: usize::MAX,
            note_budget: None,
            approval: Approval::Folder { in_approved: false },
        }
    }
}

/// What the journal recorded, read before planning.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The newest record of each call of this note (for a stale copy, of the note it copies
    /// too), by call id (§9.3, §9.6).
    pub prior: HashMap<String, JournalCall>,
    /// The note is a stale copy of another note (§9.6); `Some(true)` within
    /// `stale_copy_grace` (it is that note), `Some(false)` later.
    pub stale: Option<bool>,
    /// Recovery of a note in In_Progress that the journal knows nothing of (§8.15).
    pub unknown_to_journal: bool,
    /// The note was stamped by this machine's vaultd before its journal was lost and started
    /// afresh (`--new-journal`, §9.12): why its side effects may already have run.
    pub journal_lost: Option<String>,
    /// Unspent decisions on the questions the note shows, by call id and parameter hash
    /// (read with [`Facts::questions`] for `approval_via = "cli"`).
    pub decisions: HashMap<(String, String), Decision>,
    /// Calls this note ever started, for the note budget.
    pub calls_started: u64,
}

impl Facts {
    /// The (call id, parameter hash) of every pending call whose question the note shows:
    /// the decisions to read into [`Facts::decisions`].
    pub fn questions(note: &ParsedNote) -> Vec<(String, String)> {
        note.pending_calls()
            .filter_map(|c| match &c.body {
                CallBody::Call { name, parameters } => {
                    let hash = params_hash(name, parameters);
                    note.is_held_as(&c.call_id, &hash)
                        .then(|| (c.call_id.clone(), decision_hash(note, &c.call_id, &hash)))
                }
                CallBody::Broken(_) => None,
            })
            .collect()
    }
}

/// What one pending call gets this round.
#[derive(Debug)]
pub enum Step {
    /// A result without running: invalid, unknown tool, quota, unknown outcome, rejected.
    Fail(CallResult),
    /// Refused by policy (a disabled tool, a tool's own rules): a result without running.
    Denied(CallResult),
    /// The result the journal holds already: written, not run again.
    Recorded(CallResult),
    Run(ValidCall),
    /// Held, not asked yet with these parameters: a `[!question]` is written.
    Ask(HeldCall),
    /// Held, asked already with these exact parameters; no decision yet.
    Waiting(HeldCall),
}

impl Step {
    /// The result this step writes without running anything.
    pub fn result(&self) -> Option<&CallResult> {
        match self {
            Step::Fail(r) | Step::Denied(r) | Step::Recorded(r) => Some(r),
            _ => None,
        }
    }
}

/// The steps of one note, in call order.
#[derive(Debug, Default)]
pub struct Plan {
    /// One per planned pending call, by call id order in the note.
    pub steps: Vec<(String, Step)>,
    /// Pending calls past twice `max_calls`: no result block each (§9.8).
    pub left_pending: usize,
    /// Decisions this plan acts on, by call id and parameter hash: spent (consumed in the
    /// journal) before the calls run, so each counts once.
    pub spend: Vec<(String, String)>,
}

/// Decides every pending call of `note`.
pub fn plan(note: &ParsedNote, registry: &Registry, rules: &Rules, facts: &Facts) -> Plan {
    let mut plan = Plan::default();
    let max = rules.max_calls;
    for (i, call) in note.pending_calls().enumerate() {
        let shown_name = call.name.as_deref().unwrap_or("tool_call");
        let step = if i >= max.saturating_mul(2) {
            plan.left_pending += 1;
            continue;
        } else if i >= max {
            Step::Fail(CallResult::failed_now(
                &call.call_id,
                shown_name,
                quota(max),
            ))
        } else {
            match &call.body {
                CallBody::Broken(e) => {
                    Step::Fail(CallResult::failed_now(&call.call_id, shown_name, e.clone()))
                }
                CallBody::Call { name, parameters } => {
                    let (step, spend) = plan_call(
                        note,
                        registry,
                        rules,
                        facts,
                        &call.call_id,
                        name,
                        parameters,
                    );
                    plan.spend.extend(spend);
                    step
                }
            }
        };
        plan.steps.push((call.call_id.clone(), step));
    }
    if let Some(note_budget) = rules.note_budget {
        apply_note_budget(
            &mut plan.steps,
            &facts.prior,
            note_budget,
            facts.calls_started,
        );
    }
    plan
}

/// One well-formed call, and the decision it spends if any.
fn plan_call(
    note: &ParsedNote,
    registry: &Registry,
    rules: &Rules,
    facts: &Facts,
    call_id: &str,
    name: &str,
    parameters: &Map<String, Value>,
) -> (Step, Option<(String, String)>) {
    if let Some(question) = asked(facts, call_id) {
        // A call edited since its question was shown is a new call: a first round, no state.
        let edited =
            note.is_held(call_id) && !note.is_held_as(call_id, &params_hash(name, parameters));
        if !edited {
            return plan_answer(
                note, registry, rules, facts, call_id, name, parameters, question,
            );
        }
    }
    let hold_reason = match recorded(facts, registry, call_id, name) {
        Recorded::Step(step) => return (step, None),
        Recorded::HoldAsCopy(reason) => Some(reason),
        Recorded::Nothing => None,
    };
    let call = match valid_call(registry, call_id, name, parameters) {
        Ok(call) => call,
        Err(step) => return (step, None),
    };
    let admission = match hold_reason {
        Some(reason) => Admission::Hold { reason },
        None => call.admit(),
    };
    let reason = match admission {
        Admission::Run => return (Step::Run(call), None),
        Admission::Deny(e) => {
            let result = CallResult::failed_now(call_id, name, e);
            return (Step::Denied(result), None);
        }
        Admission::Hold { reason } => reason,
    };
    decide_held(note, rules, facts, call, reason)
}

/// The call resolved against the registry, or the step that says why it cannot run (a
/// `Result` of two values the caller takes apart at once: their sizes do not matter).
#[allow(clippy::result_large_err)]
fn valid_call(
    registry: &Registry,
    call_id: &str,
    name: &str,
    parameters: &Map<String, Value>,
) -> Result<ValidCall, Step> {
    registry
        .valid_call(call_id, name, parameters)
        .map_err(|e| match e.code {
            ErrorCode::PolicyDenied => Step::Denied(CallResult::failed_now(call_id, name, e)),
            _ => Step::Fail(CallResult::failed_now(call_id, name, e)),
        })
}

/// The question the last run of `call_id` asked a person (an MCP server's elicitation,
/// docs/design.md §10.4), when that run was this note's (or its copy's within the grace).
fn asked<'a>(facts: &'a Facts, call_id: &str) -> Option<&'a Value> {
    // A copy never resumes the round of the note it copies: that note's answer is the one
    // that counts ([`recorded`] holds the copy's call instead).
    if facts.stale.is_some() {
        return None;
    }
    match &facts.prior.get(call_id)?.progress {
        CallProgress::Finished(r) => match &r.outcome {
            Err(e) if e.code == ErrorCode::NeedsAnswer => e.details.as_ref(),
            _ => None,
        },
        _ => None,
    }
}

/// A call whose tool asked a person: shown as a question with an answer block until the note
/// shows it, then decided like any held call. Approved, it runs again with the person's
/// answer as the next round ([`crate::tools::mcp::question::resume`]); an answer that does
/// not fit the server's schema is asked again, saying why; rejected, it ends REJECTED and the
/// server is not called again (a 2026 server keeps nothing between rounds: that is its
/// decline).
#[allow(clippy::too_many_arguments)]
fn plan_answer(
    note: &ParsedNote,
    registry: &Registry,
    rules: &Rules,
    facts: &Facts,
    call_id: &str,
    name: &str,
    parameters: &Map<String, Value>,
    question: &Value,
) -> (Step, Option<(String, String)>) {
    use crate::tools::mcp::question;
    let mut call = match valid_call(registry, call_id, name, parameters) {
        Ok(call) => call,
        Err(step) => return (step, None),
    };
    let hash = params_hash(name, parameters);
    let mut held = HeldCall {
        call_id: call_id.to_string(),
        name: name.to_string(),
        parameters: parameters.clone(),
        reason: question::describe(question),
        question: Some(question.clone()),
    };
    if !note.is_held_as(call_id, &hash) {
        return (Step::Ask(held), None);
    }
    // A decision binds the answer too: `vaultd approve` shows it, and an answer changed
    // afterwards (by an agent that writes the vault) is not the one approved.
    let hash = decision_hash(note, call_id, &hash);
    let spend = Some((call_id.to_string(), hash.clone()));
    let decision = match rules.approval {
        Approval::Folder { in_approved } => in_approved.then_some(Decision::Approved),
        Approval::Cli => facts.decisions.get(&(call_id.to_string(), hash)).cloned(),
    };
    match decision {
        None => (Step::Waiting(held), None),
        Some(Decision::Rejected) => (Step::Fail(rejected_result(call_id, name)), spend),
        Some(Decision::Approved) => {
            let next = note
                .answer_for(call_id)
                .ok_or("the note has no `tool_answer` block for this call")
                .and_then(|answer| answer)
                .map_err(str::to_string)
                .and_then(|answer| question::resume(question, answer));
            match next {
                Ok(next) => {
                    call.answer = Some(next);
                    (Step::Run(call), spend)
                }
                Err(why) => {
                    held.reason = format!(
                        "The answer was not sent: {why}. Correct the `tool_answer` block below and approve again.\n{}",
                        held.reason
                    );
                    (Step::Ask(held), spend)
                }
            }
        }
    }
}

/// What the journal's record of a call decides before the registry is asked (§9.3): by the
/// effect recorded at its start, never by what the registry says now.
enum Recorded {
    Step(Step),
    /// A stale copy past its grace: its started side effect is held, saying where it ran.
    HoldAsCopy(String),
    Nothing,
}

fn recorded(facts: &Facts, registry: &Registry, call_id: &str, name: &str) -> Recorded {
    let same_note = facts.stale.is_none();
    let within_grace = facts.stale == Some(true);
    match facts.prior.get(call_id) {
        Some(r) if same_note || within_grace => match (&r.progress, &r.recorded) {
            // A question, not a result: the call's tool acted on nothing yet ([`asked`]). In a
            // copy it is the copied note's question: answered there, not here, or the round
            // it resumes would run twice (once per note).
            (CallProgress::Finished(result), _)
                if result
                    .outcome
                    .as_ref()
                    .is_err_and(|e| e.code == ErrorCode::NeedsAnswer) =>
            {
                if same_note {
                    Recorded::Nothing
                } else {
                    Recorded::HoldAsCopy(format!(
                        "this call's question waits for its answer in {} (this note looks like a copy of it): answer it there; approving this copy asks the server again from the start",
                        r.note
                    ))
                }
            }
            (CallProgress::Finished(result), _) => Recorded::Step(Step::Recorded(result.clone())),
            // Written once and since deleted from the note: run again (§2), unless this is a
            // stale copy, which gets what the note it copies got.
            (CallProgress::Written, Some(result)) if !same_note => {
                Recorded::Step(Step::Recorded(result.clone()))
            }
            (CallProgress::Started, _) if !r.effect.safe_to_repeat() => {
                Recorded::Step(Step::Fail(unknown_outcome(call_id, name)))
            }
            _ => Recorded::Nothing,
        },
        Some(r) if r.started_at.is_some() && !r.effect.safe_to_repeat() => {
            let when = r
                .started_at
                .map(crate::call::rfc3339_seconds)
                .unwrap_or_default();
            let (what, stopped) = if r.not_run {
                ("was started", " and stopped before it ran")
            } else {
                ("already ran", "")
            };
            Recorded::HoldAsCopy(format!(
                "this call {what} at {when} from {}{stopped} (this note looks like an old copy of it)",
                r.note
            ))
        }
        Some(_) => Recorded::Nothing,
        // §9.12: the journal that knew this note was lost; it may have run. Held, never run
        // silently (and never failed: a person who knows it did not run approves it).
        None if facts.journal_lost.is_some()
            && registry
                .get(name)
                .is_some_and(|t| !t.spec().effect.safe_to_repeat()) =>
        {
            Recorded::HoldAsCopy(facts.journal_lost.clone().unwrap_or_default())
        }
        // §8.15: the journal knows nothing of the note; it may have run.
        None if facts.unknown_to_journal
            && registry
                .get(name)
                .is_some_and(|t| !t.spec().effect.safe_to_repeat()) =>
        {
            Recorded::Step(Step::Fail(unknown_outcome(call_id, name)))
        }
        None => Recorded::Nothing,
    }
}

/// A held call (docs/design.md §4). A question the note shows binds the decision to the exact
/// parameters it lists: a call edited since is asked about again. With `approval_via =
/// "folder"` the note being in Approved/ decides (a `vaultd approve` record is spent with
/// it); with `"cli"` only a recorded decision does.
fn decide_held(
    note: &ParsedNote,
    rules: &Rules,
    facts: &Facts,
    call: ValidCall,
    reason: String,
) -> (Step, Option<(String, String)>) {
    let hash = params_hash(call.name(), &call.parameters);
    let held = HeldCall {
        call_id: call.call_id.clone(),
        name: call.name().to_string(),
        parameters: call.parameters.clone(),
        reason,
        question: None,
    };
    if !note.is_held_as(&call.call_id, &hash) {
        return (Step::Ask(held), None);
    }
    // As `vaultd approve` recorded it ([`held_calls`]): bound to an answer block the note
    // may still hold for this call (a copy of a question note, a call edited since).
    let hash = decision_hash(note, &call.call_id, &hash);
    let spend = Some((call.call_id.clone(), hash.clone()));
    match rules.approval {
        Approval::Folder { in_approved: false } => (Step::Waiting(held), None),
        Approval::Folder { in_approved: true } => (Step::Run(call), spend),
        Approval::Cli => match facts.decisions.get(&(call.call_id.clone(), hash)) {
            Some(Decision::Approved) => (Step::Run(call), spend),
            Some(Decision::Rejected) => (
                Step::Fail(rejected_result(&call.call_id, call.name())),
                spend,
            ),
            None => (Step::Waiting(held), None),
        },
    }
}

/// The note budget (docs/design.md §12.2): once the calls this note ever started reach the budget,
/// every further call that would run or be asked about gets QUOTA_EXCEEDED. Calls already
/// started (recovery) are not charged again.
fn apply_note_budget(
    steps: &mut [(String, Step)],
    prior: &HashMap<String, JournalCall>,
    note_budget: u64,
    started: u64,
) {
    let mut left = budget::remaining(note_budget, started);
    for (call_id, step) in steps.iter_mut() {
        let (name, runs) = match step {
            Step::Run(call) => (call.name().to_string(), true),
            Step::Ask(held) => (held.name.clone(), false),
            _ => continue,
        };
        if prior.contains_key(call_id.as_str()) {
            continue;
        }
        if left == 0 {
            *step = Step::Fail(CallResult::failed_now(
                call_id,
                &name,
                budget::spent(note_budget),
            ));
        } else if runs {
            left -= 1;
        }
    }
}

/// A held call of a note waiting for a decision: pending, with a `[!question]` in the note.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldInNote {
    pub call_id: String,
    pub name: String,
    pub parameters: Map<String, Value>,
    /// What a decision on it is bound to ([`decision_hash`]).
    pub hash: String,
    /// The question shows exactly these parameters (else the call was edited since).
    pub as_shown: bool,
    /// The person's answer in the note, for a call whose tool asked a question.
    pub answer: Option<Value>,
}

/// What a decision on the held call `call_id` (parameters hashed to `params_hash`) is bound
/// to: its parameters and, when the note holds a `tool_answer` block for it, that answer
/// (docs/design.md §4: approval bound to exactly what was shown; the answer is the next
/// round's input).
pub fn decision_hash(note: &ParsedNote, call_id: &str, params_hash: &str) -> String {
    match note.answer_for(call_id) {
        Some(Ok(answer)) => {
            use sha2::{Digest, Sha256};
            let bound = format!(
                "{params_hash}\n{}",
                crate::note::parse::canonical_json(answer)
            );
            Sha256::digest(bound.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        }
        _ => params_hash.to_string(),
    }
}

/// Every held call of `note` (what `vaultd approve`/`reject` and a note moved into Rejected/
/// decide on).
pub fn held_calls(note: &ParsedNote) -> Vec<HeldInNote> {
    note.pending_calls()
        .filter(|c| note.is_held(&c.call_id))
        .filter_map(|c| match &c.body {
            CallBody::Call { name, parameters } => {
                let hash = params_hash(name, parameters);
                Some(HeldInNote {
                    as_shown: note.is_held_as(&c.call_id, &hash),
                    hash: decision_hash(note, &c.call_id, &hash),
                    call_id: c.call_id.clone(),
                    name: name.clone(),
                    parameters: parameters.clone(),
                    answer: note.answer_for(&c.call_id).and_then(Result::ok).cloned(),
                })
            }
            CallBody::Broken(_) => None,
        })
        .collect()
}

/// A REJECTED result for every held call of `note` (a person refused them all: `vaultd
/// reject`, or the note moved into Rejected/).
pub fn rejections(note: &ParsedNote) -> Vec<CallResult> {
    note.pending_calls()
        .filter(|c| note.is_held(&c.call_id))
        .map(|c| rejected_result(&c.call_id, c.name.as_deref().unwrap_or("tool_call")))
        .collect()
}

/// The result block of a held call a person refused.
pub fn rejected_result(call_id: &str, name: &str) -> CallResult {
    CallResult::failed_now(
        call_id,
        name,
        CallError::new(
            ErrorCode::Rejected,
            "a person rejected this call; it was not run",
        ),
    )
}

fn quota(max: usize) -> CallError {
    CallError::new(
        ErrorCode::QuotaExceeded,
        format!(
            "only the first {max} pending calls of a note run per round (max_calls_per_note); write this call again to run it"
        ),
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::note::{Block, append_blocks, parse_note};
    use crate::tools::{ApprovalRule, Effect};
    use serde_json::json;
    use std::time::SystemTime;

    /// `look` (read_only), `send` (external, always held), `off` (disabled).
    fn registry() -> Registry {
        crate::tools::idle::registry(&[
            ("look", Effect::ReadOnly, None, true),
            (
                "send",
                Effect::ExternalSideEffect,
                Some(ApprovalRule::Always),
                true,
            ),
            ("off", Effect::ReadOnly, None, false),
        ])
    }

    fn call(name: &str, q: &str) -> String {
        format!(
            "```json\n{}\n```\n",
            json!({ "tool_call": { "name": name, "parameters": { "q": q } } })
        )
    }

    /// A call with its own `id`: editing its parameters keeps its id.
    fn call_with_id(name: &str, q: &str, id: &str) -> String {
        format!(
            "```json\n{}\n```\n",
            json!({ "tool_call": { "name": name, "parameters": { "q": q }, "id": id } })
        )
    }

    fn ids(text: &str) -> Vec<String> {
        parse_note(text)
            .pending_calls()
            .map(|c| c.call_id.clone())
            .collect()
    }

    fn rules() -> Rules {
        Rules {
            max_calls: 10,
            note_budget: None,
            approval: Approval::Folder { in_approved: false },
        }
    }

    fn plan_of(text: &str, rules: &Rules, facts: &Facts) -> Plan {
        plan(&parse_note(text), &registry(), rules, facts)
    }

    fn code(step: &Step) -> Option<ErrorCode> {
        step.result()
            .and_then(|r| r.outcome.as_ref().err())
            .map(|e| e.code)
    }

    fn kinds(plan: &Plan) -> Vec<String> {
        plan.steps
            .iter()
            .map(|(_, s)| match s {
                Step::Run(c) => format!("run {}", c.name()),
                Step::Ask(h) => format!("ask {}", h.name),
                Step::Waiting(h) => format!("wait {}", h.name),
                Step::Recorded(_) => "recorded".to_string(),
                Step::Denied(_) => format!("denied {:?}", code(s).unwrap()),
                Step::Fail(_) => format!("fail {:?}", code(s).unwrap()),
            })
            .collect()
    }

    fn record(call_id: &str, effect: Effect, progress: CallProgress) -> JournalCall {
        JournalCall {
            call_id: call_id.to_string(),
            tool: "x".to_string(),
            effect,
            progress,
            recorded: None,
            started_at: Some(SystemTime::UNIX_EPOCH),
            note: "Done/old.md".to_string(),
            not_run: false,
        }
    }

    /// The note with the question of its only (held) call written, as vaultd writes it.
    fn asked(text: &str) -> String {
        let p = plan_of(text, &rules(), &Facts::default());
        let Step::Ask(held) = &p.steps[0].1 else {
            panic!("not asked: {:?}", p.steps)
        };
        append_blocks(
            text,
            &[Block::Held(held)],
            "pending_approval",
            SystemTime::now(),
        )
    }

    #[test]
    fn a_question_is_shown_then_resumed_with_the_answer_or_asked_again() {
        let text = call("look", "a");
        let call_id = ids(&text)[0].clone();
        let question = crate::tools::mcp::question::question(
            "t",
            vec![(
                "q".into(),
                "Which branch?".into(),
                json!({ "type": "object", "properties": { "branch": { "type": "string" } } }),
            )],
            Some("state".into()),
            Map::new(),
        );
        let asked_result = CallResult::failed_now(
            &call_id,
            "look",
            CallError::new(ErrorCode::NeedsAnswer, "asks").with_details(question.clone()),
        );
        let mut facts = Facts::default();
        facts.prior.insert(
            call_id.clone(),
            record(
                &call_id,
                Effect::ReadOnly,
                CallProgress::Finished(asked_result),
            ),
        );
        // Not shown yet (the run that asked crashed before its write): shown now.
        let p = plan_of(&text, &rules(), &facts);
        let Step::Ask(held) = &p.steps[0].1 else {
            panic!("{:?}", p.steps)
        };
        assert_eq!(held.question.as_ref(), Some(&question));
        let shown = append_blocks(
            &text,
            &[Block::Held(held)],
            "pending_approval",
            SystemTime::now(),
        );
        assert_eq!(kinds(&plan_of(&shown, &rules(), &facts)), ["wait look"]);

        let approved = Rules {
            approval: Approval::Folder { in_approved: true },
            ..rules()
        };
        // The template's null is no answer: asked again, saying why, and the decision spent.
        let p = plan_of(&shown, &approved, &facts);
        let Step::Ask(again) = &p.steps[0].1 else {
            panic!("{:?}", p.steps)
        };
        assert!(
            again.reason.contains("`branch` is not filled in"),
            "{}",
            again.reason
        );
        assert_eq!(p.spend.len(), 1);
        // Filled in: run with the next round.
        let answered = shown.replace("\"branch\": null", "\"branch\": \"main\"");
        let p = plan_of(&answered, &approved, &facts);
        let Step::Run(c) = &p.steps[0].1 else {
            panic!("{:?}", p.steps)
        };
        let next = c.answer.as_ref().unwrap();
        assert_eq!(next["request_state"], "state");
        assert_eq!(next["responses"]["q"]["content"]["branch"], "main");
        // A later answer that is broken is no fallback to the earlier one: asked again.
        for broken in [
            format!(
                "{{\"tool_answer\": {{\"call_id\": \"{call_id}\", \"answer\": {{\"branch\": \"prod\",}}}}}}"
            ),
            format!(
                "{{\"tool_answer\": {{\"id\": \"{call_id}\", \"answer\": {{\"branch\": \"prod\"}}}}}}"
            ),
        ] {
            let again = format!("{answered}\n```json\n{broken}\n```\n");
            let p = plan_of(&again, &approved, &facts);
            let Step::Ask(asked) = &p.steps[0].1 else {
                panic!("{broken}: {:?}", p.steps)
            };
            assert!(
                asked.reason.contains("`tool_answer` block"),
                "{}",
                asked.reason
            );
        }
        // Rejected with `vaultd reject` (approval_via = "cli"): REJECTED, the server not called.
        // Bound to the answer too (an answer changed after `vaultd reject` is asked again).
        let hash = decision_hash(
            &parse_note(&answered),
            &call_id,
            &params_hash("look", &c.parameters),
        );
        facts
            .decisions
            .insert((call_id.clone(), hash), Decision::Rejected);
        let cli = Rules {
            approval: Approval::Cli,
            ..rules()
        };
        assert_eq!(kinds(&plan_of(&answered, &cli, &facts)), ["fail Rejected"]);
    }

    #[test]
    fn a_call_edited_since_its_question_runs_again_from_its_first_round() {
        let text = call_with_id("look", "a", "x1");
        let question = crate::tools::mcp::question::question(
            "t",
            vec![("q".into(), "Sure?".into(), json!({ "type": "object" }))],
            Some("state".into()),
            Map::new(),
        );
        let mut facts = Facts::default();
        let asked_result = CallResult::failed_now(
            "x1",
            "look",
            CallError::new(ErrorCode::NeedsAnswer, "asks").with_details(question),
        );
        facts.prior.insert(
            "x1".into(),
            record("x1", Effect::ReadOnly, CallProgress::Finished(asked_result)),
        );
        let p = plan_of(&text, &rules(), &facts);
        let Step::Ask(held) = &p.steps[0].1 else {
            panic!("{:?}", p.steps)
        };
        let shown = append_blocks(
            &text,
            &[Block::Held(held)],
            "pending_approval",
            SystemTime::now(),
        );
        let edited = shown.replacen("\"q\":\"a\"", "\"q\":\"b\"", 1);
        assert_ne!(edited, shown);
        let approved = Rules {
            approval: Approval::Folder { in_approved: true },
            ..rules()
        };
        let p = plan_of(&edited, &approved, &facts);
        let Step::Run(c) = &p.steps[0].1 else {
            panic!("{:?}", p.steps)
        };
        assert!(c.answer.is_none(), "no state of the old round");
        assert_eq!(c.parameters["q"], "b");
    }

    #[test]
    fn a_valid_call_runs_with_its_tool_resolved_once() {
        let p = plan_of(&call("look", "a"), &rules(), &Facts::default());
        let Step::Run(c) = &p.steps[0].1 else {
            panic!("{:?}", p.steps)
        };
        assert_eq!(c.call_id, p.steps[0].0);
        assert_eq!(c.effect(), Effect::ReadOnly);
        assert_eq!(c.parameters["q"], "a");
        assert!(p.spend.is_empty());
    }

    #[test]
    fn bad_calls_get_their_error_and_policy_refusals_are_denied() {
        let text = format!(
            "{}{}{}```json\n{{\"tool_call\": 1}}\n```\n",
            call("nope", "a"),
            call("off", "a"),
            call("look", "").replace("\"q\":\"\"", "\"z\":1"),
        );
        assert_eq!(
            kinds(&plan_of(&text, &rules(), &Facts::default())),
            [
                "fail UnknownTool",
                "denied PolicyDenied",
                "fail InvalidParams",
                "fail InvalidCall"
            ]
        );
    }

    #[test]
    fn past_the_cap_calls_get_quota_exceeded_and_past_twice_the_cap_stay_pending() {
        let text: String = (0..5).map(|i| call("look", &i.to_string())).collect();
        let rules = Rules {
            max_calls: 2,
            ..rules()
        };
        let p = plan_of(&text, &rules, &Facts::default());
        assert_eq!(
            kinds(&p),
            [
                "run look",
                "run look",
                "fail QuotaExceeded",
                "fail QuotaExceeded"
            ]
        );
        assert_eq!(p.left_pending, 1);
    }

    #[test]
    fn the_recorded_effect_decides_a_started_call_not_the_registry() {
        let text = format!("{}{}", call("look", "a"), call("look", "b"));
        let ids = ids(&text);
        let mut facts = Facts::default();
        // `look` is read_only now, but the first call started as a side effect.
        facts.prior.insert(
            ids[0].clone(),
            record(&ids[0], Effect::ExternalSideEffect, CallProgress::Started),
        );
        facts.prior.insert(
            ids[1].clone(),
            record(&ids[1], Effect::ReadOnly, CallProgress::Started),
        );
        assert_eq!(
            kinds(&plan_of(&text, &rules(), &facts)),
            ["fail UnknownOutcome", "run look"]
        );
    }

    #[test]
    fn a_finished_call_gets_its_recorded_result_and_is_not_run_again() {
        let text = call("look", "a");
        let id = ids(&text).remove(0);
        let mut facts = Facts::default();
        let result = CallResult::failed_now(&id, "look", quota(1));
        facts.prior.insert(
            id.clone(),
            record(
                &id,
                Effect::ReadOnly,
                CallProgress::Finished(result.clone()),
            ),
        );
        let p = plan_of(&text, &rules(), &facts);
        assert!(matches!(&p.steps[0].1, Step::Recorded(r) if *r == result));
    }

    #[test]
    fn a_note_unknown_to_the_journal_does_not_repeat_a_side_effect() {
        let text = format!("{}{}", call("send", "a"), call("look", "b"));
        let facts = Facts {
            unknown_to_journal: true,
            ..Facts::default()
        };
        assert_eq!(
            kinds(&plan_of(&text, &rules(), &facts)),
            ["fail UnknownOutcome", "run look"]
        );
    }

    #[test]
    fn a_note_whose_journal_was_lost_holds_its_side_effects_and_runs_the_rest() {
        let text = format!("{}{}", call("send", "a"), call("look", "b"));
        let facts = Facts {
            journal_lost: Some("may already have run".into()),
            unknown_to_journal: true,
            ..Facts::default()
        };
        assert_eq!(
            kinds(&plan_of(&text, &rules(), &facts)),
            ["ask send", "run look"]
        );
    }

    #[test]
    fn an_old_copy_holds_a_side_effect_its_original_already_ran() {
        let text = call("look", "a");
        let id = ids(&text).remove(0);
        let mut facts = Facts {
            stale: Some(false),
            ..Facts::default()
        };
        facts.prior.insert(
            id.clone(),
            record(&id, Effect::ExternalSideEffect, CallProgress::Written),
        );
        let p = plan_of(&text, &rules(), &facts);
        let Step::Ask(held) = &p.steps[0].1 else {
            panic!("{:?}", p.steps)
        };
        assert!(held.reason.contains("already ran at"), "{}", held.reason);
        assert!(held.reason.contains("Done/old.md"), "{}", held.reason);
    }

    /// A start the stamp stopped before its tool ran did nothing: the old copy is still held
    /// (a person decides), and the reason says the call did not run there.
    #[test]
    fn an_old_copy_of_a_call_stopped_before_it_ran_is_held_saying_so() {
        let text = call("look", "a");
        let id = ids(&text).remove(0);
        let mut facts = Facts {
            stale: Some(false),
            ..Facts::default()
        };
        let mut stopped = record(&id, Effect::ExternalSideEffect, CallProgress::Written);
        stopped.not_run = true;
        facts.prior.insert(id.clone(), stopped);
        let p = plan_of(&text, &rules(), &facts);
        let Step::Ask(held) = &p.steps[0].1 else {
            panic!("{:?}", p.steps)
        };
        assert!(
            held.reason.contains("stopped before it ran") && !held.reason.contains("already ran"),
            "{}",
            held.reason
        );
    }

    #[test]
    fn a_held_call_is_asked_then_waits_then_runs_from_approved_spending_the_decision() {
        let text = call("send", "a");
        assert_eq!(
            kinds(&plan_of(&text, &rules(), &Facts::default())),
            ["ask send"]
        );
        let shown = asked(&text);
        let questions = Facts::questions(&parse_note(&shown));
        assert_eq!(questions.len(), 1);
        assert_eq!(
            kinds(&plan_of(&shown, &rules(), &Facts::default())),
            ["wait send"]
        );
        let approved = Rules {
            approval: Approval::Folder { in_approved: true },
            ..rules()
        };
        let p = plan_of(&shown, &approved, &Facts::default());
        assert_eq!(kinds(&p), ["run send"]);
        assert_eq!(p.spend, questions);
    }

    #[test]
    fn a_held_call_edited_after_its_question_is_asked_again() {
        let shown = asked(&call_with_id("send", "a", "s1")).replace("\"q\":\"a\"", "\"q\":\"b\"");
        let approved = Rules {
            approval: Approval::Folder { in_approved: true },
            ..rules()
        };
        let p = plan_of(&shown, &approved, &Facts::default());
        assert_eq!(kinds(&p), ["ask send"]);
        assert_eq!(p.steps[0].0, "s1");
        assert!(p.spend.is_empty());
    }

    #[test]
    fn with_approval_via_cli_only_a_recorded_decision_counts() {
        let shown = asked(&call("send", "a"));
        let cli = Rules {
            approval: Approval::Cli,
            ..rules()
        };
        assert_eq!(
            kinds(&plan_of(&shown, &cli, &Facts::default())),
            ["wait send"]
        );
        let question = Facts::questions(&parse_note(&shown)).remove(0);
        for (decision, expected) in [
            (Decision::Approved, "run send"),
            (Decision::Rejected, "fail Rejected"),
        ] {
            let facts = Facts {
                decisions: HashMap::from([(question.clone(), decision)]),
                ..Facts::default()
            };
            let p = plan_of(&shown, &cli, &facts);
            assert_eq!(kinds(&p), [expected]);
            assert_eq!(p.spend, std::slice::from_ref(&question));
        }
    }

    #[test]
    fn the_note_budget_charges_new_runs_and_questions_but_not_started_calls() {
        let text: String = (0..4).map(|i| call("look", &i.to_string())).collect();
        let ids = ids(&text);
        let mut facts = Facts {
            calls_started: 1,
            ..Facts::default()
        };
        // Started before (recovery): runs again without being charged.
        facts.prior.insert(
            ids[0].clone(),
            record(&ids[0], Effect::ReadOnly, CallProgress::Started),
        );
        let rules = Rules {
            note_budget: Some(2),
            ..rules()
        };
        assert_eq!(
            kinds(&plan_of(&text, &rules, &facts)),
            [
                "run look",
                "run look",
                "fail QuotaExceeded",
                "fail QuotaExceeded"
            ]
        );
    }

    #[test]
    fn held_calls_are_the_pending_calls_with_a_question() {
        let text = format!(
            "{}{}",
            asked(&call_with_id("send", "a", "s1")),
            call("look", "b")
        );
        let held = held_calls(&parse_note(&text));
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].name, "send");
        assert!(held[0].as_shown);
        let edited = text.replace("\"q\":\"a\"", "\"q\":\"c\"");
        assert!(!held_calls(&parse_note(&edited))[0].as_shown);
    }
}
