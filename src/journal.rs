//! The journal: one SQLite file (WAL, synchronous=FULL) in the state dir recording every
//! claim, call start, call outcome, result write and move, so a daemon killed at any instant
//! restarts without losing a note, running a side effect twice or writing a result twice.
//! The only SQL in the crate lives here.

use crate::call::CallResult;
use crate::tools::Effect;
use serde_json::Value;
use std::path::Path;
use std::time::SystemTime;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {source}")]
    Sqlite {
        path: std::path::PathBuf,
        source: rusqlite::Error,
    },
    #[error("journal {path}: {message}")]
    Other {
        path: std::path::PathBuf,
        message: String,
    },
}

/// One claim of one note: from the rename into In_Progress to the move out of it.
pub type RunId = i64;

/// Where a call of a run got to before the daemon stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum CallProgress {
    /// Start committed, no outcome: a read_only call runs again, a side effect is UNKNOWN_OUTCOME.
    Started,
    /// Outcome recorded, not yet written into the note.
    Finished(CallResult),
    /// Result block written into the note.
    Written,
}

#[derive(Debug, Clone, PartialEq)]
pub struct JournalCall {
    pub call_id: String,
    pub tool: String,
    pub effect: Effect,
    pub progress: CallProgress,
}

/// A run whose note has not been moved out of In_Progress yet.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenRun {
    pub run_id: RunId,
    /// Vault-relative path of the note in In_Progress.
    pub note: String,
    pub calls: Vec<JournalCall>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approved,
    Rejected,
}

/// One row of `vaultd log`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LogEntry {
    /// RFC 3339 UTC.
    pub time: String,
    /// claim | call_start | call_end | written | move | problem | approval
    pub event: String,
    pub note: String,
    pub call_id: Option<String>,
    pub tool: Option<String>,
    /// For call_end: "ok" or the error code.
    pub outcome: Option<String>,
    pub duration_ms: Option<u64>,
    /// Error message, move destination, problem description.
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct LogFilter {
    pub since: Option<SystemTime>,
    pub tool: Option<String>,
    /// Substring of the note path.
    pub note: Option<String>,
    pub limit: Option<usize>,
}

pub struct Journal {
    _private: (),
}

impl Journal {
    pub fn open(_state_dir: &Path) -> Result<Journal, JournalError> {
        todo!()
    }
    pub fn begin_run(&self, _note: &str) -> Result<RunId, JournalError> {
        todo!()
    }
    pub fn call_started(
        &self,
        _run: RunId,
        _call_id: &str,
        _tool: &str,
        _effect: Effect,
        _params: &Value,
    ) -> Result<(), JournalError> {
        todo!()
    }
    pub fn call_finished(&self, _run: RunId, _result: &CallResult) -> Result<(), JournalError> {
        todo!()
    }
    pub fn results_written(&self, _run: RunId, _call_ids: &[&str]) -> Result<(), JournalError> {
        todo!()
    }
    pub fn note_moved(&self, _run: RunId, _to: &str, _ends_run: bool) -> Result<(), JournalError> {
        todo!()
    }
    pub fn open_runs(&self) -> Result<Vec<OpenRun>, JournalError> {
        todo!()
    }
    pub fn calls_started_since(
        &self,
        _tool: &str,
        _since: SystemTime,
    ) -> Result<u64, JournalError> {
        todo!()
    }
}

impl Journal {
    pub fn oldest_call_since(
        &self,
        _tool: &str,
        _since: SystemTime,
    ) -> Result<Option<SystemTime>, JournalError> {
        todo!()
    }
    pub fn record_problem(&self, _note: &str, _message: &str) -> Result<(), JournalError> {
        todo!()
    }
}
