//! Execute, decided: whether a claimed note is stamped before its calls run
//! ([`stamp_at_claim`]), what a run's steps came to ([`Gathered`]), which result is a question
//! for a person ([`asked_a_person`]), the rules a run plans with ([`rules`]). The daemon runs
//! the note (`daemon::execute`).

use crate::call::{CallResult, HeldCall};
use crate::config::Config;
use crate::note::{CallBody, ParsedNote};
use crate::pipeline::Pass;
use crate::pipeline::plan::{Facts, Plan, Rules, Step};
use crate::tools::{Effect, Registry};
use std::collections::HashSet;

/// What the steps of a note came to, in call order.
#[derive(Default)]
pub(crate) struct Gathered {
    pub(crate) results: Vec<CallResult>,
    /// Calls asked about now: their `[!question]` is written.
    pub(crate) held: Vec<HeldCall>,
    /// Some call waits for a person: the note goes to Pending_Approval.
    pub(crate) waiting: bool,
    /// Results recorded for the note a stale copy copies, not for this one (§9.6).
    pub(crate) foreign: HashSet<String>,
    /// The commits of the outcomes of calls that ran, queued: settled before the note moves.
    pub(crate) committed: Vec<crate::journal::Committed>,
}

/// Whether a claimed note gets its identity (`tool_note`, `tool_runner`, `tool_updated`)
/// written before its calls start (docs/design.md §9.2, §9.9), or only with its results.
///
/// The stamp is what ties the journal's records of a note's calls to the note if it is moved
/// by hand, copied or synced while they run; it matters for calls that must not run twice.
/// A note whose every planned step is a fresh `read_only` run, claimed from Needs_Action with
/// nothing in the journal for it (and not a copy whose id is replaced, checked by the caller),
/// has none: if it is moved or the daemon dies mid-run, its calls simply run again (§9.3),
/// and the results write adds the three properties. Skipping the stamp there saves one whole
/// note write (temp file, fsync, rename, folder fsync) per note, about a third of the daemon's
/// work on such a note (BENCHMARKS.md). docs/design.md §9.2 names this exception.
pub(crate) fn stamp_at_claim(plan: &Plan, pass: Pass, facts: &Facts) -> bool {
    if matches!(pass, Pass::Recover { .. }) {
        return false; // stamped by the recovery itself, before the note is read
    }
    let fresh_read_only = pass == Pass::Fresh
        && facts.prior.is_empty()
        && facts.stale.is_none()
        && !plan.steps.is_empty()
        && plan
            .steps
            .iter()
            .all(|(_, step)| matches!(step, Step::Run(call) if call.effect() == Effect::ReadOnly));
    !fresh_read_only
}

/// Whether a note stamped at its claim ([`stamp_at_claim`]), its text as claimed committed
/// with its claim record, has its stamp written by its first side effect's call, between
/// that call's start record and its run (`runner::BeforeRun`), rather than before any call
/// starts: when a call that is not `read_only` runs. Its start's commit, which must be
/// durable before it runs anyway, then makes the claimed text durable too: one fsync of the
/// journal less on a send note's way to Done ("The stamp" in `journal/mod.rs`).
pub(crate) fn stamp_after_start(plan: &Plan) -> bool {
    plan.steps
        .iter()
        .any(|(_, step)| matches!(step, Step::Run(call) if call.effect() != Effect::ReadOnly))
}

/// Whether the claim of this note is likely to be followed by [`stamp_at_claim`]: any pending
/// call that is not a well-formed call to a known `read_only` tool. Decided before the claim
/// record, which then keeps the note's text with it (`journal/mod.rs`, "The stamp"); a run
/// that stamps anyway keeps it then.
pub(crate) fn may_stamp_at_claim(parsed: &ParsedNote, registry: &Registry) -> bool {
    parsed.pending_calls().any(|c| match &c.body {
        CallBody::Call { name, .. } => registry
            .get(name)
            .is_none_or(|t| t.spec().effect != Effect::ReadOnly),
        CallBody::Broken(_) => true,
    })
}

/// A run that ended with its tool asking a person (NEEDS_ANSWER: an MCP server's question,
/// docs/design.md §10.4) is no result: its question is written and the note waits in
/// Pending_Approval. None for any other result.
pub(crate) fn asked_a_person(step: &Step, r: &CallResult) -> Option<HeldCall> {
    let (Step::Run(call), Err(e)) = (step, &r.outcome) else {
        return None;
    };
    if e.code != crate::call::ErrorCode::NeedsAnswer || e.details.is_none() {
        return None;
    }
    Some(HeldCall {
        call_id: r.call_id.clone(),
        name: r.name.clone(),
        parameters: call.parameters.clone(),
        reason: e.message.clone(),
        question: e.details.clone(),
    })
}

/// The limits and the approval mode a note run plans with, from the config it took.
pub(crate) fn rules(config: &Config, pass: Pass) -> Rules {
    Rules::for_config(config, pass == Pass::Approved)
}
