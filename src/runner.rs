//! One call, run safely: a permit from the global worker cap, the rate limit, a durable
//! "started" record before the tool runs, the per-call timeout, redaction of everything the
//! tool says, and the outcome recorded.

use crate::call::{CallError, CallResult, ErrorCode};
use crate::guard::BreakerConfig;
use crate::guard::breaker::{Breakers, Gate, circuit_key};
use crate::journal::{ClaimTicket, Committed, Journal, RateWindow, RunId, RunRef, StartAdmission};
use crate::results::ResultStore;
use crate::secret::Redactor;
use crate::tools::{Effect, Registry, ToolCall, ValidCall};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The run a call goes under: known, or still being claimed. A note whose calls are all
/// fresh `read_only` ones starts them while its claim record is on its way through the
/// journal's writer (`Daemon::begin_and_execute`): a start is queued behind that record and
/// names its run by the record's ticket; what is recorded after the tool ran waits for the
/// id ("The claim" in `journal/mod.rs`).
#[derive(Clone, Debug)]
pub enum RunOf {
    Known(RunId),
    Claiming {
        ticket: ClaimTicket,
        /// `Some(Some(id))` once the claim record ran, `Some(None)` when it failed.
        id: tokio::sync::watch::Receiver<Option<Option<RunId>>>,
    },
}

impl From<RunId> for RunOf {
    fn from(run: RunId) -> RunOf {
        RunOf::Known(run)
    }
}

impl RunOf {
    /// For a write queued now: the id once known, else the claim record's ticket (the
    /// writer runs that record first).
    fn for_writer(&self) -> RunRef {
        match self {
            RunOf::Known(run) => RunRef::Known(*run),
            RunOf::Claiming { ticket, id } => match *id.borrow() {
                Some(Some(run)) => RunRef::Known(run),
                _ => RunRef::Claimed(*ticket),
            },
        }
    }

    /// The run's id once its claim record ran; `None` when that record failed: nothing is
    /// recorded under it then (the daemon puts the note back, `Daemon::unclaim`).
    async fn id(&self) -> Option<RunId> {
        match self {
            RunOf::Known(run) => Some(*run),
            RunOf::Claiming { id, .. } => {
                let mut id = id.clone();
                id.wait_for(Option::is_some)
                    .await
                    .ok()
                    .and_then(|v| (*v).flatten())
            }
        }
    }
}

/// What a call that is not `read_only` waits for between its durable start record and its
/// tool's run: done once, by the first such call of a run to get there, and then answered to
/// every other from memory. The daemon's note identity stamp (`daemon::execute`, "The stamp"
/// in `journal/mod.rs`): written after a start's commit, which makes the note's text as
/// claimed durable with it, and before anything of the note can have an effect. `Err` says
/// why the calls must not run (the note is gone).
#[derive(Clone)]
pub struct BeforeRun(Arc<BeforeRunOnce>);

type BeforeRunFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

struct BeforeRunOnce {
    done: tokio::sync::OnceCell<Result<(), String>>,
    make: Box<dyn Fn() -> BeforeRunFuture + Send + Sync>,
}

impl BeforeRun {
    pub fn new(make: impl Fn() -> BeforeRunFuture + Send + Sync + 'static) -> BeforeRun {
        BeforeRun(Arc::new(BeforeRunOnce {
            done: tokio::sync::OnceCell::new(),
            make: Box::new(make),
        }))
    }

    /// Runs the step if no call has yet (a caller cancelled midway leaves it to the next),
    /// else waits for it; its answer.
    pub async fn pass(&self) -> Result<(), String> {
        self.0.done.get_or_init(|| (self.0.make)()).await.clone()
    }
}

pub struct Runner {
    pub registry: Arc<Registry>,
    pub journal: Arc<Journal>,
    pub redactor: Arc<Redactor>,
    /// Circuit breakers per tool or MCP server (docs/design.md §12.3); the daemon sets its own.
    pub breakers: Arc<Breakers>,
    /// The global cap of `workers` calls running at once, across all notes.
    permits: Arc<Semaphore>,
    /// The result size limit (docs/design.md §10.6); None keeps every result in the note.
    results: Option<ResultStore>,
}

impl Runner {
    pub fn new(
        registry: Arc<Registry>,
        journal: Arc<Journal>,
        redactor: Arc<Redactor>,
        workers: usize,
    ) -> Runner {
        Runner {
            registry,
            journal,
            redactor,
            breakers: Arc::new(Breakers::new(BreakerConfig::default())),
            permits: Arc::new(Semaphore::new(workers)),
            results: None,
        }
    }

    /// Applies the result size limit of every tool: oversized `data` is saved to the store.
    pub fn with_results(mut self, store: ResultStore) -> Runner {
        self.results = Some(store);
        self
    }

    /// This runner with a reloaded config's tools: the worker cap, the circuit breakers, the
    /// journal, the redactor and the result store stay the ones shared by every call, so a
    /// reload neither resets nor doubles them.
    pub fn with_registry(&self, registry: Arc<Registry>) -> Runner {
        Runner {
            registry,
            journal: self.journal.clone(),
            redactor: self.redactor.clone(),
            breakers: self.breakers.clone(),
            permits: self.permits.clone(),
            results: self.results.clone(),
        }
    }

    /// Oversized `data` saved whole and replaced by its §10.6 stand-in. A result that cannot
    /// be saved stays whole in the note: nothing is lost.
    fn limit_size(&self, note_id: &str, call_id: &str, data: Value) -> Value {
        let Some(store) = &self.results else {
            return data;
        };
        let backup = data.clone();
        match store.limit(note_id, call_id, data) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(call_id, "{e}; the whole result goes into the note");
                backup
            }
        }
    }

    /// A slot of the global worker cap; taken before a call's task is spawned (STYLE habit 3)
    /// and handed to [`Runner::run_call`], which gives it back as soon as the tool is done.
    pub async fn permit(&self) -> OwnedSemaphorePermit {
        self.permits
            .clone()
            .acquire_owned()
            .await
            .expect("the worker semaphore is never closed")
    }

    /// Runs one validated call of `run` under `permit` and returns its result (never an
    /// `Err`: failures are results). `spend`: the parameters hash of the approval the call
    /// runs on, spent with its start record (or with its refusal when a circuit is open).
    ///
    /// The outcome of a call that ran is queued, not waited for: its commit (durable for a
    /// side effect) is [`Ran::committed`], for the write back to settle before its result block
    /// replaces the note
    /// (`Journal::call_finished_later`). A call refused before it started is recorded before
    /// it is returned.
    ///
    /// `before_run`, when given, is passed by a call that is not `read_only` after its durable
    /// start and before its tool runs ([`BeforeRun`]); a call it stops does not run, and its
    /// outcome says why.
    #[allow(clippy::too_many_arguments)]
    pub async fn run_call(
        &self,
        run: impl Into<RunOf>,
        note: &str,
        note_id: &str,
        call: &ValidCall,
        spend: Option<&str>,
        permit: OwnedSemaphorePermit,
        before_run: Option<&BeforeRun>,
    ) -> Ran {
        let read_only = call.effect() == Effect::ReadOnly;
        let run = run.into();
        let result = self
            .run_unrecorded(&run, note, note_id, call, spend, permit, before_run)
            .await;
        let (result, not_run) = match result {
            Unrecorded::Recorded(result) => {
                return Ran {
                    result,
                    committed: None,
                };
            }
            Unrecorded::Ran(result) => (result, false),
            Unrecorded::Stopped(result) => (result, true),
        };
        let Some(run) = run.id().await else {
            // Its claim record failed: nothing of the note is recorded, and it goes back.
            return Ran {
                result,
                committed: None,
            };
        };
        let committed = if not_run {
            self.journal
                .call_not_run_later(run, &result, !read_only)
                .await
        } else {
            self.journal
                .call_finished_later(run, &result, !read_only)
                .await
        };
        if let Err(e) = &committed {
            tracing::error!(call_id = %result.call_id, "journal could not record the outcome: {e}");
        }
        let committed = committed.ok();
        Ran { result, committed }
    }

    /// [`run_call`](Self::run_call) up to its outcome's record: a call that ran, or that
    /// `before_run` stopped after its start, is returned unrecorded; one refused before it
    /// started is recorded already.
    #[allow(clippy::too_many_arguments)]
    async fn run_unrecorded(
        &self,
        run: &RunOf,
        note: &str,
        note_id: &str,
        call: &ValidCall,
        spend: Option<&str>,
        permit: OwnedSemaphorePermit,
        before_run: Option<&BeforeRun>,
    ) -> Unrecorded {
        let (tool, call_id, name, parameters) = (
            &call.tool,
            call.call_id.as_str(),
            call.name(),
            &call.parameters,
        );
        // An open circuit fails the call at once: no rate limit spent, no start record.
        // Asked with the permit in hand, so calls that queued for a worker while the circuit
        // opened do not go on to hammer the failing service.
        let circuit = circuit_key(tool.spec());
        let gate = match self.breakers.admit(&circuit, name) {
            Ok(gate) => gate,
            Err(e) => {
                drop(permit);
                if let Some(hash) = spend {
                    let (journal, id, hash) =
                        (self.journal.clone(), call_id.to_string(), hash.to_string());
                    let spent =
                        tokio::task::spawn_blocking(move || journal.consume_approval(&id, &hash))
                            .await;
                    if let Ok(Err(e)) = spent {
                        tracing::error!(call_id, "journal could not spend the approval: {e}");
                    }
                }
                return Unrecorded::Recorded(
                    self.record_under(run, CallResult::failed_now(call_id, name, e))
                        .await,
                );
            }
        };

        let started = self.record_start(run, call, spend).await;
        if gate == Gate::Trial && started.is_err() {
            self.breakers.release_trial(&circuit);
        }
        if let Err(refused) = started {
            return Unrecorded::Recorded(refused);
        }
        if call.effect() != Effect::ReadOnly
            && let Some(before) = before_run
            && let Err(why) = before.pass().await
        {
            if gate == Gate::Trial {
                self.breakers.release_trial(&circuit);
            }
            drop(permit);
            return Unrecorded::Stopped(CallResult::failed_now(
                call_id,
                name,
                CallError::new(
                    ErrorCode::ExecutionError,
                    format!("{name} did not run: {why}; nothing was done"),
                ),
            ));
        }

        let started_at = SystemTime::now();
        let timeout = tool.policy.timeout;
        let deadline = Instant::now() + timeout;
        let call = ToolCall {
            call_id,
            note,
            note_id,
            parameters,
            deadline,
            answer: call.answer.as_ref(),
        };
        let outcome = match tokio::time::timeout(timeout, tool.tool.run(call)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(CallError::new(
                ErrorCode::Timeout,
                format!(
                    "{name} did not finish within its timeout of {}",
                    humantime::format_duration(timeout)
                ),
            )),
        };
        self.breakers.record(&circuit, gate, &outcome);
        let result = CallResult {
            call_id: call_id.to_string(),
            name: name.to_string(),
            outcome: outcome
                .map(|mut out| {
                    out.data = self.limit_size(note_id, call_id, self.redact_value(out.data));
                    out.summary = self.redactor.redact(&out.summary);
                    out
                })
                .map_err(|e| self.redact_error(e)),
            started_at,
            ended_at: SystemTime::now(),
        };
        // The tool is done: its worker slot goes to the next call now, not after the outcome's
        // journal commit (which waits its turn behind other notes' commits).
        drop(permit);
        Unrecorded::Ran(result)
    }

    /// The rate limit check and the durable start, in one journal transaction, so two calls
    /// cannot both take the last slot and a crash after it never runs the call twice. `Err`:
    /// not started, with the call's result (a RATE_LIMITED one recorded).
    async fn record_start(
        &self,
        run: &RunOf,
        call: &ValidCall,
        spend: Option<&str>,
    ) -> Result<(), CallResult> {
        let (call_id, name) = (call.call_id.as_str(), call.name());
        let limits = rate_windows(call.tool.policy.rate_limit);
        let redacted = self.redact_value(Value::Object(call.parameters.clone()));
        let admitted = self
            .journal
            .call_started_within_async(
                run.for_writer(),
                call_id,
                name,
                call.effect(),
                &redacted,
                &limits,
                spend,
            )
            .await;
        let error = match admitted {
            Ok(StartAdmission::Started) => return Ok(()),
            Ok(StartAdmission::RateLimited { window, reset_at }) => {
                rate_limited(name, &window, reset_at)
            }
            Err(e) => {
                return Err(CallResult::failed_now(
                    call_id,
                    name,
                    journal_down(&e.to_string()),
                ));
            }
        };
        Err(self
            .record_under(run, CallResult::failed_now(call_id, name, error))
            .await)
    }

    /// [`record`](Self::record) under `run` once its id is known; nothing when its claim
    /// record failed.
    async fn record_under(&self, run: &RunOf, result: CallResult) -> CallResult {
        match run.id().await {
            Some(run) => self.record(run, result).await,
            None => result,
        }
    }

    /// Records a call's outcome in the journal (also for calls that never started, so
    /// `vaultd log` shows them) and returns it.
    pub async fn record(&self, run: RunId, result: CallResult) -> CallResult {
        if let Err(e) = self.journal.call_finished_async(run, &result).await {
            tracing::error!(call_id = %result.call_id, "journal could not record the outcome: {e}")
        }
        result
    }

    pub fn redact_error(&self, mut e: CallError) -> CallError {
        e.message = self.redactor.redact(&e.message);
        e.details = e.details.map(|d| self.redact_value(d));
        e
    }

    pub fn redact_value(&self, v: Value) -> Value {
        if self.redactor.is_empty() {
            return v;
        }
        let text = v.to_string();
        let clean = self.redactor.redact(&text);
        if clean == text {
            v
        } else {
            serde_json::from_str(&clean).unwrap_or(Value::String(clean))
        }
    }
}

/// A call's result from [`Runner::run_call`], and the commit of its outcome when that was
/// left to the caller to wait for.
#[derive(Debug)]
pub struct Ran {
    pub result: CallResult,
    /// The outcome of a call that ran, queued: settle it before its result block replaces the note.
    pub committed: Option<Committed>,
}

/// What [`Runner::run_unrecorded`] returns.
enum Unrecorded {
    /// Refused before it started (open circuit, rate limit, no start record): recorded.
    Recorded(CallResult),
    /// The tool ran: its outcome is for the caller to record.
    Ran(CallResult),
    /// Started, then stopped before its tool ran (`before_run`): its outcome is for the
    /// caller to record, as not run.
    Stopped(CallResult),
}

fn rate_windows(limit: crate::config::RateLimit) -> Vec<RateWindow> {
    let mut v = Vec::new();
    if let Some(max) = limit.per_hour {
        v.push(RateWindow {
            max: u64::from(max),
            length: Duration::from_secs(3600),
        });
    }
    if let Some(max) = limit.per_day {
        v.push(RateWindow {
            max: u64::from(max),
            length: Duration::from_secs(86_400),
        });
    }
    v
}

fn rate_limited(name: &str, window: &RateWindow, reset_at: SystemTime) -> CallError {
    let label = if window.length >= Duration::from_secs(86_400) {
        "day"
    } else {
        "hour"
    };
    let reset_s = crate::call::rfc3339_seconds(reset_at);
    CallError::new(
        ErrorCode::RateLimited,
        format!(
            "{name} is limited to {} calls per {label}; the next call is allowed at {reset_s}",
            window.max
        ),
    )
    .with_details(serde_json::json!({ "limit": window.max, "window": label, "reset_at": reset_s }))
}

/// The `details` marking a call that never started because its start could not be recorded.
const START_NOT_RECORDED: &str = "start_not_recorded";

fn journal_down(why: &str) -> CallError {
    CallError::new(
        ErrorCode::ExecutionError,
        format!("not run: the journal could not record the start: {why}"),
    )
    .retryable(true)
    .with_details(serde_json::json!({ "journal": START_NOT_RECORDED }))
}

/// Whether `result` is a call that did not run because the journal could not record its
/// start: it stays pending in its note, never a failure of it (docs/design.md §9.12).
pub fn start_not_recorded(result: &CallResult) -> bool {
    matches!(&result.outcome, Err(e)
        if e.details.as_ref().and_then(|d| d.get("journal")).and_then(|j| j.as_str())
            == Some(START_NOT_RECORDED))
}
