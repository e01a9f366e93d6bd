//! The vocabulary every stage shares about one tool call: its error codes, its error value,
//! its outcome, what the tool does to the world ([`Effect`]) and whether it waits for a
//! person by default ([`ApprovalRule`]). Parser, runner, tools, renderer and journal all speak these types.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::SystemTime;

/// The closed set of error codes of docs/design.md §4; agents match on these strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    InvalidJson,
    InvalidCall,
    UnknownTool,
    InvalidParams,
    PolicyDenied,
    Rejected,
    NotConfigured,
    Timeout,
    RateLimited,
    QuotaExceeded,
    ExecutionError,
    UnknownOutcome,
    NotFound,
    Conflict,
    CannotUndo,
    NothingToUndo,
    /// Not an end: an MCP server asked a person something (elicitation) and the call waits
    /// for the answer in a `[!question]` (docs/design.md §10.4). Never written as a result;
    /// the journal records the question under it until the call is resumed.
    NeedsAnswer,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "INVALID_JSON",
            ErrorCode::InvalidCall => "INVALID_CALL",
            ErrorCode::UnknownTool => "UNKNOWN_TOOL",
            ErrorCode::InvalidParams => "INVALID_PARAMS",
            ErrorCode::PolicyDenied => "POLICY_DENIED",
            ErrorCode::Rejected => "REJECTED",
            ErrorCode::NotConfigured => "NOT_CONFIGURED",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::QuotaExceeded => "QUOTA_EXCEEDED",
            ErrorCode::ExecutionError => "EXECUTION_ERROR",
            ErrorCode::UnknownOutcome => "UNKNOWN_OUTCOME",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::Conflict => "CONFLICT",
            ErrorCode::CannotUndo => "CANNOT_UNDO",
            ErrorCode::NothingToUndo => "NOTHING_TO_UNDO",
            ErrorCode::NeedsAnswer => "NEEDS_ANSWER",
        }
    }

    pub fn parse(s: &str) -> Option<ErrorCode> {
        serde_json::from_value(Value::String(s.to_string())).ok()
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `error` object of a failed `tool_result` (docs/design.md §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallError {
    pub code: ErrorCode,
    pub message: String,
    /// docs/design.md §8.4: true for TIMEOUT, RATE_LIMITED and transport-level EXECUTION_ERRORs.
    pub retryable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

impl CallError {
    /// An error with the default `retryable` of its code (TIMEOUT and RATE_LIMITED retry).
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        CallError {
            code,
            message: message.into(),
            retryable: matches!(code, ErrorCode::Timeout | ErrorCode::RateLimited),
            details: None,
        }
    }

    pub fn retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for CallError {}

/// What a tool returns on success: the `data` object and a short human summary for the
/// callout title ("3 results", "sent to ops").
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolOutput {
    pub data: Value,
    pub summary: String,
    /// What a `state_change` tool did to the vault (docs/design.md §11.3): the journal stores it in
    /// the same transaction as the call's outcome, so every recorded change is undoable.
    /// Never written into the note.
    pub undo: Option<UndoRecord>,
}

/// The vault changes of one call, enough to put every file back (docs/design.md §11.3).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UndoRecord {
    /// In the order they were made.
    pub changes: Vec<VaultChange>,
    /// Journal ids of the undo records this call undid (`vault_undo`): marked undone in the
    /// same transaction.
    pub undoes: Vec<i64>,
}

/// One file's before and after.
#[derive(Debug, Clone, PartialEq)]
pub struct VaultChange {
    /// Vault-relative, `/`-separated.
    pub path: String,
    /// The whole file before the change; `None`: it did not exist.
    pub before: Option<Vec<u8>>,
    /// SHA-256 (hex) of the file after the change; `None`: it no longer exists.
    pub after_sha256: Option<String>,
}

/// One finished call, ready to be rendered into the note and recorded in the journal.
#[derive(Debug, Clone, PartialEq)]
pub struct CallResult {
    pub call_id: String,
    /// The tool name as written in the call (may be unknown, or `tool_call` for broken blocks).
    pub name: String,
    pub outcome: Result<ToolOutput, CallError>,
    pub started_at: SystemTime,
    pub ended_at: SystemTime,
}

impl CallResult {
    /// A result that never ran (validation, policy, quota): started and ended now.
    pub fn failed_now(call_id: &str, name: &str, error: CallError) -> Self {
        let now = SystemTime::now();
        CallResult {
            call_id: call_id.to_string(),
            name: name.to_string(),
            outcome: Err(error),
            started_at: now,
            ended_at: now,
        }
    }

    pub fn is_ok(&self) -> bool {
        self.outcome.is_ok()
    }

    pub fn duration_ms(&self) -> u64 {
        self.ended_at
            .duration_since(self.started_at)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A call held for a person's approval (docs/design.md §4): rendered as a `[!question]` callout.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldCall {
    pub call_id: String,
    pub name: String,
    pub parameters: serde_json::Map<String, Value>,
    /// Why approval is needed, shown to the person ("recipient bob@x.org is not in allowed_recipients").
    pub reason: String,
    /// A server's question the approval answers (docs/design.md §10.4), as the tool returned
    /// it in its NEEDS_ANSWER error's `details`; None for a policy hold.
    pub question: Option<Value>,
}

/// RFC 3339 UTC with milliseconds, the one timestamp format vaultd writes.
pub fn rfc3339_millis(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// RFC 3339 UTC with seconds, for frontmatter (`tool_updated`).
pub fn rfc3339_seconds(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// What a tool does to the world (docs/design.md §10.2); decides recovery after a crash (§9.3) and
/// the default approval. Recovery uses the effect recorded at the call's start, never the
/// live registry's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Safe to run again after a crash.
    ReadOnly,
    /// Changes the vault; undoable (§11). Never run twice.
    StateChange,
    /// Never run twice: an unrecorded outcome becomes UNKNOWN_OUTCOME.
    ExternalSideEffect,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::ReadOnly => "read_only",
            Effect::StateChange => "state_change",
            Effect::ExternalSideEffect => "external_side_effect",
        }
    }

    pub fn parse(s: &str) -> Option<Effect> {
        match s {
            "read_only" => Some(Effect::ReadOnly),
            "state_change" => Some(Effect::StateChange),
            "external_side_effect" => Some(Effect::ExternalSideEffect),
            _ => None,
        }
    }

    /// Whether a started call with no recorded outcome may simply run again (§9.3).
    pub fn safe_to_repeat(self) -> bool {
        self == Effect::ReadOnly
    }
}

/// `approval` of a tool without rules of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalRule {
    Never,
    Always,
}

impl ApprovalRule {
    /// docs/design.md §10.3: `always` for external side effects of command and MCP tools, `never`
    /// otherwise.
    pub fn default_for(effect: Effect) -> ApprovalRule {
        match effect {
            Effect::ExternalSideEffect => ApprovalRule::Always,
            Effect::ReadOnly | Effect::StateChange => ApprovalRule::Never,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalRule::Never => "never",
            ApprovalRule::Always => "always",
        }
    }
}
