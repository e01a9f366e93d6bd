//! One call, run safely: a permit from the global worker cap, the rate limit, a durable
//! "started" record before the tool runs, the per-call timeout, redaction of everything the
//! tool says, and the outcome recorded.

use crate::call::{CallError, CallResult, ErrorCode};
use crate::journal::{Journal, RunId};
use crate::secret::Redactor;
use crate::tools::{Registry, ToolCall};
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{Mutex, Semaphore};

pub struct Runner {
    pub registry: Arc<Registry>,
    pub journal: Arc<Journal>,
    pub redactor: Arc<Redactor>,
    /// The global cap of `workers` calls running at once, across all notes.
    permits: Arc<Semaphore>,
    /// Makes "count calls in the window, then record a start" atomic across concurrent calls,
    /// so two calls cannot both take the last slot of a rate limit.
    rate_gate: Mutex<()>,
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
            permits: Arc::new(Semaphore::new(workers)),
            rate_gate: Mutex::new(()),
        }
    }

    /// Runs one validated call of `run` and returns its result (never an `Err`: failures are
    /// results). `parameters` must have passed `Registry::resolve`.
    pub async fn run_call(
        &self,
        run: RunId,
        call_id: &str,
        name: &str,
        parameters: &Map<String, Value>,
    ) -> CallResult {
        let Some(tool) = self.registry.get(name) else {
            return CallResult::failed_now(
                call_id,
                name,
                CallError::new(ErrorCode::UnknownTool, format!("no tool named `{name}`")),
            );
        };
        let _permit = self
            .permits
            .acquire()
            .await
            .expect("the worker semaphore is never closed");

        // Rate limit check and durable start, as one step.
        {
            let _gate = self.rate_gate.lock().await;
            if let Err(e) = self.check_rate_limit(name, tool.rate_limit).await {
                return CallResult::failed_now(call_id, name, e);
            }
            let redacted = self.redact_value(Value::Object(parameters.clone()));
            let (j, cid, tname, effect) = (
                self.journal.clone(),
                call_id.to_string(),
                name.to_string(),
                tool.spec().effect,
            );
            let recorded = tokio::task::spawn_blocking(move || {
                j.call_started(run, &cid, &tname, effect, &redacted)
            })
            .await;
            if !matches!(recorded, Ok(Ok(()))) {
                let why = match recorded {
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => e.to_string(),
                    Ok(Ok(())) => unreachable!(),
                };
                return CallResult::failed_now(
                    call_id,
                    name,
                    CallError::new(
                        ErrorCode::ExecutionError,
                        format!("not run: the journal could not record the start: {why}"),
                    )
                    .retryable(true),
                );
            }
        }

        let started_at = SystemTime::now();
        let deadline = Instant::now() + tool.timeout;
        let call = ToolCall {
            call_id,
            parameters,
            deadline,
        };
        let outcome = match tokio::time::timeout(tool.timeout, tool.tool.run(call)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(CallError::new(
                ErrorCode::Timeout,
                format!(
                    "{name} did not finish within its timeout of {}",
                    humantime::format_duration(tool.timeout)
                ),
            )),
        };
        let result = CallResult {
            call_id: call_id.to_string(),
            name: name.to_string(),
            outcome: outcome
                .map(|mut out| {
                    out.data = self.redact_value(out.data);
                    out.summary = self.redactor.redact(&out.summary);
                    out
                })
                .map_err(|e| self.redact_error(e)),
            started_at,
            ended_at: SystemTime::now(),
        };
        let (j, r) = (self.journal.clone(), result.clone());
        match tokio::task::spawn_blocking(move || j.call_finished(run, &r)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(call_id, "journal could not record the outcome: {e}"),
            Err(e) => tracing::error!(call_id, "journal task failed: {e}"),
        }
        result
    }

    async fn check_rate_limit(
        &self,
        name: &str,
        limit: crate::config::RateLimit,
    ) -> Result<(), CallError> {
        let windows = [
            (limit.per_hour, Duration::from_secs(3600), "hour"),
            (limit.per_day, Duration::from_secs(86_400), "day"),
        ];
        for (max, window, label) in windows {
            let Some(max) = max else { continue };
            let since = SystemTime::now() - window;
            let (j, tool) = (self.journal.clone(), name.to_string());
            let counted = tokio::task::spawn_blocking(move || {
                let used = j.calls_started_since(&tool, since)?;
                let oldest = j.oldest_call_since(&tool, since)?;
                Ok::<_, crate::journal::JournalError>((used, oldest))
            })
            .await;
            let (used, oldest) = match counted {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => {
                    return Err(CallError::new(
                        ErrorCode::ExecutionError,
                        format!("not run: the journal could not count the rate limit: {e}"),
                    )
                    .retryable(true));
                }
                Err(e) => {
                    return Err(
                        CallError::new(ErrorCode::ExecutionError, e.to_string()).retryable(true)
                    );
                }
            };
            if used >= u64::from(max) {
                let reset = oldest.map(|t| t + window).unwrap_or_else(SystemTime::now);
                let reset_s = crate::call::rfc3339_seconds(reset);
                return Err(CallError::new(
                    ErrorCode::RateLimited,
                    format!(
                        "{name} is limited to {max} calls per {label}; {used} used; the next call is allowed at {reset_s}"
                    ),
                )
                .with_details(serde_json::json!({ "limit": max, "window": label, "used": used, "reset_at": reset_s })));
            }
        }
        Ok(())
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
