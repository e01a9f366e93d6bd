//! Undo (docs/design.md §11.3), shared by `vault_undo` and `vaultd undo`: a recorded change set is
//! put back when every file it touched still matches its post-image; otherwise `CANNOT_UNDO`
//! with a diff (`force` overrides). An undo is itself a recorded change set, so it can be
//! undone in turn.
//!
//! Files are restored by rename where the recorded content still exists under the other
//! name (undo of a move moves back, undo of a delete takes the note out of `.trash/`), by an
//! atomic write otherwise; a file the change created goes to `.trash/`, never unlinked.

use super::{
    ToolDef, VaultCall, VaultContext, conflict, create_file, current_bytes, execution, journal,
    move_file, param, sha256_hex,
};
use crate::call::{CallError, ErrorCode, ToolOutput, UndoRecord, VaultChange};
use crate::journal::Journal;
use crate::journal::undo::{UndoEntry, note_key};
use crate::tools::{ApprovalRule, Effect};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;

pub fn tool() -> ToolDef {
    ToolDef {
        description: "Undo the vault changes of an earlier call (by its call_id): restores every file it changed, if none was edited since. An undo can itself be undone.",
        effect: Effect::StateChange,
        approval: ApprovalRule::Never,
        schema: json!({
            "type": "object",
            "properties": {
                "call_id": { "type": "string", "pattern": "^[A-Za-z0-9_.-]{1,80}$" }
            },
            "required": ["call_id"],
            "additionalProperties": false
        }),
        run,
        plan: None,
    }
}

/// One step that puts a file back.
#[derive(Debug, Clone, PartialEq)]
enum UndoStep {
    /// The recorded content is there under another name: rename it back.
    Rename { from: String, to: String },
    /// Write the pre-image (over the current file, or as a new file).
    Write { path: String, bytes: Vec<u8> },
    /// The change created this file: move it to the trash.
    Trash { path: String, slot: String },
}

/// What undoing one entry would do, and which files no longer match their post-image.
#[derive(Debug, Clone)]
pub struct UndoPlan {
    pub entry_id: i64,
    pub call_id: String,
    steps: Vec<UndoStep>,
    /// What the steps change (the undo's own undo data), from the state they start from.
    changes: Vec<VaultChange>,
    /// Paths edited since the change (their current content is not the post-image).
    pub edited: Vec<String>,
    /// The unified diff from the current files to what the undo restores.
    pub diff: String,
}

impl UndoPlan {
    /// The vault-relative paths the undo writes, renames or trashes.
    pub fn paths(&self) -> Vec<&str> {
        self.changes.iter().map(|c| c.path.as_str()).collect()
    }

    /// The restored paths (for `{ restored: [...] }`).
    pub fn restored(&self) -> Vec<String> {
        self.steps
            .iter()
            .map(|s| match s {
                UndoStep::Rename { to, .. } => to.clone(),
                UndoStep::Write { path, .. } | UndoStep::Trash { path, .. } => path.clone(),
            })
            .collect()
    }
}

/// The vault as it will be after the plans made so far: several entries (a note's calls,
/// newest first) are planned against the state the previous ones leave, before any runs.
pub struct Overlay<'a> {
    root: &'a Path,
    files: HashMap<String, Option<Vec<u8>>>,
}

impl<'a> Overlay<'a> {
    pub fn new(root: &'a Path) -> Overlay<'a> {
        Overlay {
            root,
            files: HashMap::new(),
        }
    }

    fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, CallError> {
        match self.files.get(rel) {
            Some(v) => Ok(v.clone()),
            None => current_bytes(&self.root.join(rel)),
        }
    }

    fn set(&mut self, rel: &str, v: Option<Vec<u8>>) {
        self.files.insert(rel.to_string(), v);
    }

    /// A free trash name for `rel`, on disk and in the plans so far.
    fn trash_slot(&self, rel: &str) -> String {
        let stem = rel.strip_suffix(".md").unwrap_or(rel);
        (1..)
            .map(|n| {
                if n == 1 {
                    format!("{}/{stem}.md", super::paths::TRASH)
                } else {
                    format!("{}/{stem} ({n}).md", super::paths::TRASH)
                }
            })
            .find(|c| match self.files.get(c) {
                Some(v) => v.is_none(),
                None => std::fs::symlink_metadata(self.root.join(c)).is_err(),
            })
            .expect("some numbered name is free")
    }
}

/// Plans the undo of `entry` against the vault as `overlay` says it will be, and updates the
/// overlay with the plan's effect.
pub fn plan(overlay: &mut Overlay<'_>, entry: &UndoEntry) -> Result<UndoPlan, CallError> {
    let mut edited = Vec::new();
    let mut now = Vec::new();
    for c in &entry.changes {
        let current = overlay.get(&c.path)?;
        let matches = match (&c.after_sha256, &current) {
            (None, None) => true,
            (Some(h), Some(b)) => sha256_hex(b) == *h,
            _ => false,
        };
        if !matches {
            edited.push(c.path.clone());
        }
        now.push(current);
    }
    let mut used = vec![false; entry.changes.len()];
    let mut steps = Vec::new();
    let mut changes = Vec::new();
    let mut diff = String::new();
    for (i, c) in entry.changes.iter().enumerate() {
        let Some(before) = &c.before else { continue };
        if now[i].as_deref() == Some(before.as_slice()) {
            continue;
        }
        if now[i].is_none() {
            // The same content under a name this change created: rename it back.
            let source = entry.changes.iter().enumerate().position(|(j, o)| {
                !used[j] && o.before.is_none() && now[j].as_deref() == Some(before.as_slice())
            });
            if let Some(j) = source {
                used[j] = true;
                let from = entry.changes[j].path.clone();
                diff.push_str(&format!("rename {from} -> {}\n", c.path));
                changes.push(VaultChange {
                    path: from.clone(),
                    before: now[j].clone(),
                    after_sha256: None,
                });
                changes.push(VaultChange {
                    path: c.path.clone(),
                    before: None,
                    after_sha256: Some(sha256_hex(before)),
                });
                overlay.set(&c.path, now[j].clone());
                overlay.set(&from, None);
                steps.push(UndoStep::Rename {
                    from,
                    to: c.path.clone(),
                });
                continue;
            }
        }
        diff.push_str(&unified(
            &c.path,
            now[i].as_deref().unwrap_or_default(),
            before,
            now[i].is_none(),
            false,
        ));
        changes.push(VaultChange {
            path: c.path.clone(),
            before: now[i].clone(),
            after_sha256: Some(sha256_hex(before)),
        });
        overlay.set(&c.path, Some(before.clone()));
        steps.push(UndoStep::Write {
            path: c.path.clone(),
            bytes: before.clone(),
        });
    }
    for (j, c) in entry.changes.iter().enumerate() {
        if used[j] || c.before.is_some() {
            continue;
        }
        let Some(current) = &now[j] else { continue };
        // Already in the trash (the trashed copy of a delete whose note came back otherwise).
        if c.path.starts_with(&format!("{}/", super::paths::TRASH)) {
            continue;
        }
        let slot = overlay.trash_slot(&c.path);
        diff.push_str(&unified(&c.path, current, b"", false, true));
        diff.push_str(&format!("(moved to {slot})\n"));
        changes.push(VaultChange {
            path: c.path.clone(),
            before: Some(current.clone()),
            after_sha256: None,
        });
        changes.push(VaultChange {
            path: slot.clone(),
            before: None,
            after_sha256: Some(sha256_hex(current)),
        });
        overlay.set(&slot, Some(current.clone()));
        overlay.set(&c.path, None);
        steps.push(UndoStep::Trash {
            path: c.path.clone(),
            slot,
        });
    }
    Ok(UndoPlan {
        entry_id: entry.id,
        call_id: entry.call_id.clone(),
        steps,
        changes,
        edited,
        diff,
    })
}

fn unified(path: &str, old: &[u8], new: &[u8], created: bool, removed: bool) -> String {
    let old = String::from_utf8_lossy(old);
    let new = String::from_utf8_lossy(new);
    let a = if created {
        "/dev/null".to_string()
    } else {
        format!("a/{path}")
    };
    let b = if removed {
        "/dev/null".to_string()
    } else {
        format!("b/{path}")
    };
    similar::TextDiff::from_lines(old.as_ref(), new.as_ref())
        .unified_diff()
        .header(&a, &b)
        .to_string()
}

/// Carries the plan out; returns what was changed (the undo's own undo data).
fn apply(root: &Path, plan: &UndoPlan) -> Result<Vec<VaultChange>, CallError> {
    for s in &plan.steps {
        let io = |what: &str, e: std::io::Error| execution(format!("undo: cannot {what}: {e}"));
        match s {
            UndoStep::Rename { from, to } => move_file(&root.join(from), &root.join(to))
                .map_err(|e| io(&format!("move {from} back to {to}"), e))?,
            UndoStep::Trash { path, slot } => move_file(&root.join(path), &root.join(slot))
                .map_err(|e| io(&format!("move {path} to the trash"), e))?,
            UndoStep::Write { path, bytes } => {
                let abs = root.join(path);
                if abs.exists() {
                    let text = String::from_utf8(bytes.clone()).map_err(|_| {
                        execution(format!("undo: the pre-image of {path} is not UTF-8"))
                    })?;
                    crate::note::write::update_note(&abs, |_| text.clone())
                        .map_err(|e| execution(format!("undo: cannot restore {path}: {e}")))?;
                } else {
                    create_file(&abs, bytes).map_err(|e| io(&format!("restore {path}"), e))?;
                }
            }
        }
    }
    Ok(plan.changes.clone())
}

/// Plans every entry, newest first; refuses (CANNOT_UNDO, with the diff) when a file was
/// edited since, unless `force`.
pub fn plan_all(
    root: &Path,
    entries: &[UndoEntry],
    force: bool,
) -> Result<Vec<UndoPlan>, CallError> {
    let mut overlay = Overlay::new(root);
    let plans: Vec<UndoPlan> = entries
        .iter()
        .map(|e| plan(&mut overlay, e))
        .collect::<Result<_, _>>()?;
    let edited: Vec<&UndoPlan> = plans.iter().filter(|p| !p.edited.is_empty()).collect();
    if !force && !edited.is_empty() {
        let paths: Vec<&str> = edited
            .iter()
            .flat_map(|p| p.edited.iter().map(String::as_str))
            .collect();
        let diff: String = edited.iter().map(|p| p.diff.as_str()).collect();
        return Err(CallError::new(
            ErrorCode::CannotUndo,
            format!(
                "{} changed since call {} wrote it; undoing would lose those edits (the diff shows what undo would do; `vaultd undo --force` overrides)",
                paths.join(", "),
                edited[0].call_id
            ),
        )
        .with_details(json!({ "edited": paths, "diff": diff })));
    }
    Ok(plans)
}

/// Undoes `plans` in order as the call `call_id` of `note`: write-ahead record, files, then
/// the undo data (with the undone entries) for the outcome.
pub fn execute(
    journal: &Journal,
    root: &Path,
    call_id: &str,
    note: &str,
    plans: &[UndoPlan],
) -> Result<UndoRecord, CallError> {
    let planned = collapse(plans.iter().flat_map(|p| p.changes.iter().cloned()));
    journal
        .undo_prepare(call_id, note, "vault_undo", &planned)
        .map_err(|e| execution(format!("the journal could not record the undo data: {e}")))?;
    let mut record = UndoRecord::default();
    let mut changes = Vec::new();
    for p in plans {
        changes.extend(apply(root, p)?);
        record.undoes.push(p.entry_id);
    }
    record.changes = collapse(changes.into_iter());
    Ok(record)
}

/// One change per path across several plans: the state before the first, the hash after the
/// last (an undo of a whole note touches one file once per call).
fn collapse(changes: impl Iterator<Item = VaultChange>) -> Vec<VaultChange> {
    let mut out: Vec<VaultChange> = Vec::new();
    for c in changes {
        match out.iter_mut().find(|o| o.path == c.path) {
            Some(o) => o.after_sha256 = c.after_sha256,
            None => out.push(c),
        }
    }
    out
}

/// The entries `vault_undo` / `vaultd undo CALL_ID` would undo: the call's records not undone
/// yet, of one note. `prefer_note` (the note key of the asking note) picks among notes whose
/// identical calls share a call id. NOT_FOUND / NOTHING_TO_UNDO / CONFLICT (ambiguous).
pub fn entries_for_call(
    journal: &Journal,
    call_id: &str,
    prefer_note: Option<&str>,
) -> Result<Vec<UndoEntry>, CallError> {
    let down = |e: crate::journal::JournalError| execution(format!("journal: {e}"));
    let mut entries = journal.undo_entries_for_call(call_id).map_err(down)?;
    if entries.is_empty() {
        return Err(match journal.undone_by(call_id).map_err(down)? {
            Some(by) => CallError::new(
                ErrorCode::NothingToUndo,
                format!("the changes of call {call_id} were already undone (by {by})"),
            ),
            None => CallError::new(
                ErrorCode::NotFound,
                format!(
                    "no recorded vault change for call {call_id} (or it is older than undo_keep)"
                ),
            ),
        });
    }
    if let Some(key) = prefer_note
        && entries.iter().any(|e| e.note_key == key)
    {
        entries.retain(|e| e.note_key == key);
    }
    let mut keys: Vec<&str> = entries.iter().map(|e| e.note_key.as_str()).collect();
    keys.sort();
    keys.dedup();
    if keys.len() > 1 {
        return Err(conflict(format!(
            "call {call_id} ran in several notes ({}); name the note (`vaultd undo {call_id} --note NOTE`)",
            keys.join(", ")
        )));
    }
    Ok(entries)
}

pub fn run(context: &VaultContext, call: &VaultCall) -> Result<ToolOutput, CallError> {
    let journal = journal(context)?;
    let target = param(call, "call_id");
    if target == call.call_id {
        return Err(CallError::new(
            ErrorCode::InvalidParams,
            "a call cannot undo itself",
        ));
    }
    let entries = entries_for_call(journal, target, Some(&note_key(&call.note)))?;
    let root = context.paths.root();
    let plans = plan_all(root, &entries, false)?;
    for p in &plans {
        for path in p.paths() {
            if !path.starts_with(&format!("{}/", super::paths::TRASH))
                && !context.paths.writable(path)
            {
                return Err(CallError::new(
                    ErrorCode::PolicyDenied,
                    format!(
                        "undo would write `{path}`, outside the write scope: add a matching glob to `write` in [tools.vault], or run `vaultd undo {target}`"
                    ),
                ));
            }
        }
    }
    let restored: Vec<String> = plans.iter().flat_map(UndoPlan::restored).collect();
    let record = execute(journal, root, &call.call_id, &call.note, &plans)?;
    let n = restored.len();
    Ok(ToolOutput {
        data: json!({ "restored": restored }),
        summary: format!("undid {target} ({n} files)"),
        undo: Some(record),
    })
}

// ---------------------------------------------------------------------------------------------
// `vaultd undo`.

/// What `vaultd undo` is asked to undo.
#[derive(Debug, Clone)]
pub enum Target {
    /// One call's changes (optionally of one note: `CALL_ID --note NOTE`).
    Call {
        call_id: String,
        note_key: Option<String>,
    },
    /// Every change made by a note's calls, newest first: by its `tool_note` when the note
    /// carries one (its history survives renames), else by its path below its state folder.
    Note {
        note_id: Option<String>,
        note_key: String,
        /// The NOTE argument named no note (what was tried): said when the journal has no
        /// change recorded under that path either.
        missing: Option<String>,
    },
}

/// What `vaultd undo` did (or, with `dry_run`, would do).
#[derive(Debug)]
pub struct CliUndo {
    /// The undo's own call id (undo it with `vaultd undo ID`); `None` on a dry run.
    pub call_id: Option<String>,
    pub restored: Vec<String>,
    pub diff: String,
}

/// `vaultd undo`: plans, refuses edited files unless `force`, prints nothing itself.
pub fn undo_from_cli(
    journal: &Journal,
    root: &Path,
    target: &Target,
    force: bool,
    dry_run: bool,
) -> Result<CliUndo, CallError> {
    let down = |e: crate::journal::JournalError| execution(format!("journal: {e}"));
    let entries = match target {
        Target::Call { call_id, note_key } => {
            let mut entries = entries_for_call(journal, call_id, note_key.as_deref());
            if let (Some(key), Ok(list)) = (note_key, &mut entries) {
                list.retain(|e| &e.note_key == key);
                if list.is_empty() {
                    return Err(CallError::new(
                        ErrorCode::NotFound,
                        format!("call {call_id} changed nothing from note {key}"),
                    ));
                }
            }
            entries?
        }
        Target::Note {
            note_id,
            note_key,
            missing,
        } => {
            let entries = match note_id {
                Some(id) => journal.undo_entries_for_note_id(id, note_key),
                None => journal.undo_entries_for_note(note_key),
            }
            .map_err(down)?;
            if entries.is_empty() {
                return Err(match missing {
                    Some(tried) => CallError::new(
                        ErrorCode::NotFound,
                        format!("{tried}, and the journal has no change recorded for {note_key}"),
                    ),
                    None => CallError::new(
                        ErrorCode::NothingToUndo,
                        format!("no change of note {note_key} is left to undo"),
                    ),
                });
            }
            entries
        }
    };
    let plans = match plan_all(root, &entries, force) {
        Ok(p) => p,
        Err(e) if dry_run => {
            // A dry run shows the diff even when a real run would refuse.
            let diff = e
                .details
                .as_ref()
                .and_then(|d| d["diff"].as_str())
                .unwrap_or_default()
                .to_string();
            return Ok(CliUndo {
                call_id: None,
                restored: Vec::new(),
                diff: format!("{diff}{}\n", e.message),
            });
        }
        Err(e) => return Err(e),
    };
    let diff: String = plans.iter().map(|p| p.diff.as_str()).collect();
    let restored: Vec<String> = plans.iter().flat_map(UndoPlan::restored).collect();
    if dry_run {
        return Ok(CliUndo {
            call_id: None,
            restored,
            diff,
        });
    }
    let call_id = format!(
        "undo-{}",
        &sha256_hex(format!("{:?}{}", std::time::SystemTime::now(), std::process::id()).as_bytes())
            [..12]
    );
    let note = "cli/vaultd undo";
    let record = execute(journal, root, &call_id, note, &plans)?;
    journal
        .undo_confirm(&call_id, note, "vaultd undo", &record)
        .map_err(down)?;
    Ok(CliUndo {
        call_id: Some(call_id),
        restored,
        diff,
    })
}

/// `vaultd undo`'s NOTE argument -> the note key its changes are recorded under: a path
/// (from the current folder or the vault root) or a bare vault-relative name; the leading
/// state folder is dropped (the key survives the note's moves between state folders).
pub fn note_key_of_arg(root: &Path, folders: &crate::vault::Folders, note: &Path) -> String {
    let candidates = [note.to_path_buf(), root.join(note)];
    let rel = candidates
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .find_map(|p| p.strip_prefix(root).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| note.to_path_buf());
    let rel = rel.to_string_lossy().replace('\\', "/");
    let f = folders;
    let states = [
        &f.needs_action,
        &f.in_progress,
        &f.pending_approval,
        &f.approved,
        &f.rejected,
        &f.done,
        &f.failed,
    ];
    for s in states {
        if let Some(rest) = rel.strip_prefix(&format!("{s}/")) {
            return rest.to_string();
        }
    }
    rel
}
