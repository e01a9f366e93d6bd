//! `vaultd approve NOTE` / `vaultd reject NOTE`: a person's decision on the held calls of one
//! note, recorded in the journal and bound to the exact parameters its `[!question]` shows
//! (docs/design.md §4). They work whether or not the daemon runs.
//!
//! - **approve** records `Approved` for every held call whose question still matches the call
//!   (call id + [`params_hash`](crate::note::params_hash)) and moves the note to `Approved/`. The daemon runs a held call
//!   from there only if the journal holds such a decision, and consumes it as the call starts:
//!   with `approval_via = "cli"` a note an agent moves into `Approved/` by hand is left alone,
//!   and a call edited after approval is asked about again.
//! - **reject** records `Rejected`, writes a `REJECTED` result for every held call itself
//!   (the daemon's plan and write back, `tool_runner` stamped as docs/design.md §9.9 asks of whoever
//!   updates a note; no daemon needed: nothing runs) and moves the note to `Rejected/`.

use crate::config::Config;
use crate::journal::{Decision, JournalError};
use crate::note::{self, parse_note};
use crate::pipeline::next_state::append_results;
use crate::pipeline::plan::{self, HeldInNote};
use crate::synced::RunnerId;
use crate::vault::{State, Vault, VaultError};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error("{path}: no such note")]
    NotFound { path: PathBuf },
    #[error("{path}: {message}")]
    Note { path: PathBuf, message: String },
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Vault(#[from] VaultError),
    #[error("{path}: results not written: {message}")]
    Write { path: PathBuf, message: String },
}

pub use crate::pipeline::plan::rejected_result;

/// One held call a decision applies to.
#[derive(Debug, Clone, PartialEq)]
pub struct DecidedCall {
    pub call_id: String,
    pub name: String,
    pub parameters: Map<String, Value>,
    /// The answer decided with it, for a call whose tool asked a question.
    pub answer: Option<Value>,
}

/// What `approve` or `reject` did.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    pub decided: Vec<DecidedCall>,
    /// Held calls edited since their question was written: not approved; the daemon asks
    /// about them again when the note next runs.
    pub changed: Vec<String>,
    /// Where the note is now, relative to the vault.
    pub note: String,
    /// The note was in Approved/ already (moved there by hand): no rename tells the daemon,
    /// which finds it at its next full scan (`rescan_interval`).
    pub was_in_approved: bool,
}

/// The note a person named, checked to be a note of this vault that waits for a decision.
struct Target {
    vault: Vault,
    path: PathBuf,
    state: State,
    text: String,
}

fn open_target(config: &Config, note: &Path) -> Result<Target, ApprovalError> {
    let vault = Vault::new(config.vault.clone(), config.folders.clone());
    // As given (relative to the current folder), else relative to the vault root, else to
    // Pending_Approval/: `vaultd approve a.md` names the note waiting there.
    let candidates = [
        note.to_path_buf(),
        vault.root().join(note),
        vault.folder(State::PendingApproval).join(note),
    ];
    let Some(found) = candidates.iter().find(|p| p.is_file()) else {
        return Err(ApprovalError::NotFound {
            path: note.to_path_buf(),
        });
    };
    // Resolve the folder (the vault root is canonical) but never a symlinked note.
    let bad = |message: String| ApprovalError::Note {
        path: note.to_path_buf(),
        message,
    };
    let name = found
        .file_name()
        .ok_or_else(|| bad("not a note".to_string()))?;
    let parent = found
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let path = parent
        .canonicalize()
        .map_err(|e| bad(format!("cannot resolve its folder: {e}")))?
        .join(name);
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(bad("is a symlink; vaultd never follows them".to_string()));
    }
    let Some((state, _)) = vault.locate(&path) else {
        return Err(bad(format!(
            "not a note in a state folder of the vault {}",
            vault.root().display()
        )));
    };
    // Approved/ too: with approval_via = "cli" a note moved there by hand still waits.
    if !matches!(state, State::PendingApproval | State::Approved) {
        return Err(bad(format!(
            "is in {}/, not waiting for approval (only notes in {}/ are)",
            vault.folder_name(state),
            vault.folder_name(State::PendingApproval)
        )));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| bad(format!("cannot read: {e}")))?;
    Ok(Target {
        vault,
        path,
        state,
        text,
    })
}

fn held_calls(text: &str) -> Vec<HeldInNote> {
    plan::held_calls(&parse_note(text))
}

fn decided(h: HeldInNote) -> DecidedCall {
    DecidedCall {
        call_id: h.call_id,
        name: h.name,
        parameters: h.parameters,
        answer: h.answer,
    }
}

/// `vaultd approve NOTE`.
pub fn approve(config: &Config, note: &Path) -> Result<Decided, ApprovalError> {
    let target = open_target(config, note)?;
    let held = held_calls(&target.text);
    if held.is_empty() {
        return Err(ApprovalError::Note {
            path: note.to_path_buf(),
            message: "has no call waiting for approval".to_string(),
        });
    }
    let (shown, changed): (Vec<HeldInNote>, Vec<HeldInNote>) =
        held.into_iter().partition(|h| h.as_shown);
    let changed: Vec<String> = changed.into_iter().map(|h| h.call_id).collect();
    if shown.is_empty() {
        return Err(ApprovalError::Note {
            path: note.to_path_buf(),
            message: format!(
                "every held call ({}) changed after its question was written; nothing approved. vaultd asks again when the note next runs",
                changed.join(", ")
            ),
        });
    }
    let journal = crate::state::open_journal(config)?;
    let rel = target.vault.relative(&target.path);
    for h in &shown {
        journal.record_approval(&rel, &h.call_id, &h.hash, Decision::Approved)?;
    }
    // A note already in Approved/ (moved there by hand) is picked up at the daemon's next
    // full scan; one in Pending_Approval/ moves now and the watcher sees it at once.
    let dest = if target.state == State::Approved {
        target.path.clone()
    } else {
        target.vault.move_to(&target.path, State::Approved)?
    };
    Ok(Decided {
        decided: shown.into_iter().map(decided).collect(),
        changed,
        note: target.vault.relative(&dest),
        was_in_approved: target.state == State::Approved,
    })
}

/// `vaultd reject NOTE`: every held call gets its REJECTED result now.
pub fn reject(config: &Config, note: &Path) -> Result<Decided, ApprovalError> {
    let target = open_target(config, note)?;
    let held = held_calls(&target.text);
    if held.is_empty() {
        return Err(ApprovalError::Note {
            path: note.to_path_buf(),
            message: "has no call waiting for approval".to_string(),
        });
    }
    let journal = crate::state::open_journal(config)?;
    let runner = RunnerId::load_or_create(&config.state_dir).map_err(|e| ApprovalError::Note {
        path: note.to_path_buf(),
        message: format!(
            "cannot read this vault's runner id in {}: {e}",
            config.state_dir.display()
        ),
    })?;
    let rel = target.vault.relative(&target.path);
    for h in &held {
        journal.record_approval(&rel, &h.call_id, &h.hash, Decision::Rejected)?;
    }
    // Under the note's identity, so its calls' newest record is the rejection (what a copy of
    // the note, or `vaultd mcp serve` waiting for it, reads).
    let note_id = note::frontmatter_property(&target.text, "tool_note");
    let run = journal.begin_note_run(&rel, note_id, None, None)?;
    let results = plan::rejections(&parse_note(&target.text));
    for r in &results {
        journal.call_finished(run, r)?;
    }
    let now = SystemTime::now();
    // The daemon's write back: results not shown yet, `tool_status`, and this vault's
    // `tool_runner` (docs/design.md §9.9: whoever updates a note is its runner).
    note::update_note(&target.path, |current| {
        append_results(
            current,
            "",
            &results,
            &[],
            State::Rejected,
            runner.as_str(),
            now,
        )
        .unwrap_or_else(|| current.to_string())
    })
    .map_err(|e| ApprovalError::Write {
        path: note.to_path_buf(),
        message: e.to_string(),
    })?;
    let ids: Vec<&str> = results.iter().map(|r| r.call_id.as_str()).collect();
    journal.results_written(run, &ids)?;
    // The decisions are spent: a call run again later (its result deleted) is asked anew.
    for h in &held {
        journal.consume_approval(&h.call_id, &h.hash)?;
    }
    let dest = target.vault.move_to(&target.path, State::Rejected)?;
    let dest_rel = target.vault.relative(&dest);
    journal.note_moved(run, &dest_rel, true)?;
    Ok(Decided {
        decided: held.into_iter().map(decided).collect(),
        changed: Vec::new(),
        note: dest_rel,
        was_in_approved: false,
    })
}
