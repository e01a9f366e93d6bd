//! The vault tool source (docs/design.md §11): eleven `vault_*` tools that let an agent search, read,
//! list and change notes of its own vault, under one path policy ([`paths`]) and with every
//! change undoable ([`undo`]). Each tool is one module with its schema and its `run`; this
//! module owns the `[tools.vault]` / `[tools.vault_*]` config tables and the shared steps
//! (atomic writes, the write-ahead undo record, the trash).

/// The one list of vault tools, as `name: module`, in the order `vaultd tools` lists them.
/// Calls `$then!` with it (after the tokens given with it), so the tool modules,
/// [`TOOL_NAMES`], the `[tools.vault_*]` tables (`tools::sources`) and [`register`] are all
/// made from it.
///
/// # Adding a vault tool
///
/// One new file, `src/tools/vault/rename_tag.rs`, with `pub fn tool() -> ToolDef` (its
/// description, effect, approval by default, JSON Schema, `run`, and for a state change the
/// `planned` change a dry run previews) and `run`; plus one line here:
///
/// ```text
///             vault_rename_tag: rename_tag,
/// ```
macro_rules! vault_tools {
    ($then:ident $(, $($before:tt)*)?) => {
        $then! {
            $($($before)*)?
            vault_search: search,
            vault_read: read,
            vault_list: list,
            vault_tasks: tasks,
            vault_create: create,
            vault_append: append,
            vault_set_properties: set_properties,
            vault_complete_task: complete_task,
            vault_move: move_note,
            vault_delete: delete,
            vault_undo: undo,
        }
    };
}
pub(crate) use vault_tools;

macro_rules! declare_tools {
    ($($name:ident: $module:ident),* $(,)?) => {
        $(pub mod $module;)*

        /// Every vault tool, in the order `vaultd tools` lists them.
        pub const TOOL_NAMES: [&str; [$(stringify!($name)),*].len()] = [$(stringify!($name)),*];

        /// Every vault tool: its name and what its module says of it.
        fn tool_defs() -> Vec<(&'static str, ToolDef)> {
            vec![$((stringify!($name), $module::tool())),*]
        }
    };
}
vault_tools!(declare_tools);

pub mod paths;
mod preview;

#[cfg(test)]
mod tests;

use crate::call::{CallError, ErrorCode, ToolOutput, UndoRecord, VaultChange};
use crate::config::table::{ConfigError, RateLimit, RawRateLimit, TableContext};
use crate::journal::Journal;
use crate::tools::{
    ApprovalRule, Effect, Policy, Registry, RegistryError, Source, Tool, ToolCall, ToolFuture,
    ToolSpec,
};
use paths::{NotePath, PathPolicy};
use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Config.

/// `[tools.vault]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVault {
    pub enabled: Option<bool>,
    pub read: Option<Vec<String>>,
    pub write: Option<Vec<String>>,
    #[serde(default, with = "humantime_serde")]
    pub undo_keep: Option<Duration>,
}

/// `[tools.vault_search]`, `[tools.vault_delete]`, …: one tool's policy.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVaultTool {
    pub enabled: Option<bool>,
    /// `never` | `always`.
    pub approval: Option<ApprovalRule>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    pub rate_limit: Option<RawRateLimit>,
}

/// The validated vault tools config.
#[derive(Debug, Clone)]
pub struct VaultToolsConfig {
    pub enabled: bool,
    pub root: PathBuf,
    /// vaultd's own folders (every state folder, `[folders] dry_run`, `tool_results` and the
    /// gateway's `sessions`, whose notes hold other sessions' results): no tool reads or
    /// writes there.
    pub reserved: Vec<String>,
    pub read: Vec<String>,
    pub write: Vec<String>,
    /// How long pre-images are kept (`undo_keep`, default 30 days).
    pub undo_keep: Duration,
    /// Per tool, by name.
    pub tools: BTreeMap<String, Policy>,
}

impl VaultToolsConfig {
    /// Validates `[tools.vault]` and the per-tool tables; `own_folders` (vaultd's other
    /// folders: `tool_results`, the gateway's `sessions`) are reserved like the state folders.
    pub fn from_raw(
        raw: RawVault,
        per_tool: Vec<(&str, RawVaultTool)>,
        cx: &TableContext,
        own_folders: &[&str],
    ) -> Result<VaultToolsConfig, ConfigError> {
        let (root, folders) = (cx.vault, cx.folders);
        let read = raw.read.unwrap_or_else(|| vec!["**".to_string()]);
        let write = raw.write.unwrap_or_default();
        let reserved: Vec<String> = [
            &folders.needs_action,
            &folders.in_progress,
            &folders.pending_approval,
            &folders.approved,
            &folders.rejected,
            &folders.done,
            &folders.failed,
            &folders.dry_run,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(own_folders.iter().map(|s| s.to_string()))
        .collect();
        let names: Vec<&str> = reserved.iter().map(String::as_str).collect();
        PathPolicy::new(root.to_path_buf(), &names, &read, &write).map_err(|e| {
            cx.invalid(&e.key, format!("`{}` is not a glob: {}", e.glob, e.message))
        })?;
        let enabled = raw.enabled.unwrap_or(true);
        let mut per_tool: BTreeMap<&str, RawVaultTool> = per_tool.into_iter().collect();
        let mut tools = BTreeMap::new();
        for (name, def) in tool_defs() {
            let Some(t) = per_tool.remove(name) else {
                continue;
            };
            let approval = t.approval.unwrap_or(def.approval);
            tools.insert(
                name.to_string(),
                Policy {
                    enabled: enabled && t.enabled.unwrap_or(true),
                    timeout: t.timeout.unwrap_or(Duration::from_secs(30)),
                    rate_limit: t.rate_limit.map_or(RateLimit::default(), |r| RateLimit {
                        per_hour: r.per_hour,
                        per_day: r.per_day,
                    }),
                    approval: Some(approval),
                },
            );
        }
        Ok(VaultToolsConfig {
            enabled,
            root: root.to_path_buf(),
            reserved,
            read,
            write,
            undo_keep: raw.undo_keep.unwrap_or(Duration::from_secs(30 * 86_400)),
            tools,
        })
    }

    /// The effective `[tools.vault]` and per-tool settings, for `vaultd config`.
    pub fn describe(&self) -> Value {
        let mut out = serde_json::json!({
            "enabled": self.enabled,
            "read": self.read,
            "write": self.write,
            "undo_keep": humantime::format_duration(self.undo_keep).to_string(),
        });
        for (name, p) in &self.tools {
            out[name.as_str()] = serde_json::json!({
                "enabled": p.enabled,
                "approval": p.approval.map(ApprovalRule::as_str),
                "timeout": humantime::format_duration(p.timeout).to_string(),
                "rate_limit": { "per_hour": p.rate_limit.per_hour, "per_day": p.rate_limit.per_day },
            });
        }
        out
    }

    /// The folders the vault tools may write below: each `write` glob's leading folders, up
    /// to its first pattern (a glob naming one file: its folder; `**` or `{a,b}/…`: the whole
    /// vault). Where a killed write left its temp file, for the sweep at start-up. Only folders
    /// inside the vault reached without a symlink (a glob with `..` names none). Empty when the
    /// tools are off.
    pub fn write_roots(&self) -> Vec<PathBuf> {
        if !self.enabled {
            return Vec::new();
        }
        let Ok(vault) = self.root.canonicalize() else {
            return Vec::new();
        };
        let mut roots: Vec<PathBuf> = Vec::new();
        for glob in &self.write {
            let parts: Vec<&str> = glob
                .split('/')
                .filter(|p| !p.is_empty() && *p != ".")
                .collect();
            let mut fixed: Vec<&str> = parts
                .iter()
                .copied()
                .take_while(|p| !p.contains(['*', '?', '[', '{']))
                .collect();
            if fixed.len() == parts.len() && !glob.ends_with('/') {
                fixed.pop();
            }
            if fixed.contains(&"..") {
                continue;
            }
            let root = fixed.iter().fold(vault.clone(), |dir, part| dir.join(part));
            // A symlink on the way resolves elsewhere: not swept.
            if root.canonicalize().is_ok_and(|c| c == root) && !roots.contains(&root) {
                roots.push(root);
            }
        }
        // A root below another is swept with it.
        let all = roots.clone();
        roots.retain(|r| !all.iter().any(|o| o != r && r.starts_with(o)));
        roots
    }

    pub fn path_policy(&self) -> PathPolicy {
        let names: Vec<&str> = self.reserved.iter().map(String::as_str).collect();
        PathPolicy::new(self.root.clone(), &names, &self.read, &self.write)
            .expect("globs were checked when the config was read")
    }
}

// ---------------------------------------------------------------------------------------------
// Registration.

/// What every vault tool shares: the path policy and the journal (undo records).
pub struct VaultContext {
    pub paths: PathPolicy,
    /// `None` where no journal is open (`vaultd tools`, `vaultd check`): state changes then
    /// refuse to run rather than make a change that could not be undone.
    pub journal: Option<Arc<Journal>>,
}

/// A call, owned, so it can move to a blocking thread.
pub struct VaultCall {
    pub call_id: String,
    /// The vault-relative path of the note the call comes from.
    pub note: String,
    pub parameters: Map<String, Value>,
}

pub type RunFn = fn(&VaultContext, &VaultCall) -> Result<ToolOutput, CallError>;

/// What a state change would do to the vault as it is now, computed with the same code its
/// `run` uses and without writing anything: the `would` of a dry run (docs/design.md §12.1).
pub type PlanFn = fn(&VaultContext, &VaultCall) -> Result<Vec<Planned>, CallError>;

/// One file a state change would touch: its text before and after (`None`: absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub path: String,
    /// Set for a move: the file's old name (its text stays the same).
    pub moved_from: Option<String>,
    pub before: Option<String>,
    pub after: Option<String>,
}

impl Planned {
    pub fn created(path: &str, text: String) -> Planned {
        Planned {
            path: path.to_string(),
            moved_from: None,
            before: None,
            after: Some(text),
        }
    }

    pub fn edited(path: &str, before: String, after: String) -> Planned {
        Planned {
            path: path.to_string(),
            moved_from: None,
            before: Some(before),
            after: Some(after),
        }
    }

    pub fn moved(from: &str, to: &str, text: String) -> Planned {
        Planned {
            path: to.to_string(),
            moved_from: Some(from.to_string()),
            before: Some(text.clone()),
            after: Some(text),
        }
    }
}

/// What each tool module describes itself with (its name is its line in [`vault_tools`]).
pub struct ToolDef {
    pub description: &'static str,
    pub effect: Effect,
    /// Whether a call waits for a person when `[tools.vault_NAME] approval` is not set.
    pub approval: ApprovalRule,
    /// The JSON Schema of the parameters.
    pub schema: Value,
    pub run: RunFn,
    /// The change a state change would make, for previews; `None` for the read-only tools.
    pub plan: Option<PlanFn>,
}

/// One vault tool: its spec and the function that runs it on a blocking thread (file IO and
/// SQLite are blocking).
struct VaultTool {
    spec: ToolSpec,
    context: Arc<VaultContext>,
    run: RunFn,
    /// The change a state change would make, for previews; `None` for the read-only tools.
    plan: Option<PlanFn>,
}

impl Tool for VaultTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(&'a self, call: ToolCall<'a>) -> ToolFuture<'a> {
        let owned = VaultCall {
            call_id: call.call_id.to_string(),
            note: call.note.to_string(),
            parameters: call.parameters.clone(),
        };
        let (context, run) = (self.context.clone(), self.run);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || run(&context, &owned))
                .await
                .map_err(|e| execution(format!("the tool's task failed: {e}")))?
        })
    }

    /// A state change shows the unified diff of every note it would touch (docs/design.md §12.1).
    fn preview(&self, call: ToolCall<'_>) -> Value {
        let Some(plan) = self.plan else {
            return serde_json::json!({
                "description": format!(
                    "would call {} (vault tool, {}) with the parameters above",
                    self.spec.name,
                    self.spec.effect.as_str()
                ),
            });
        };
        let owned = VaultCall {
            call_id: call.call_id.to_string(),
            note: call.note.to_string(),
            parameters: call.parameters.clone(),
        };
        match plan(&self.context, &owned) {
            Ok(files) => preview::would(&self.context.paths, &files),
            Err(e) => serde_json::json!({
                "description": format!(
                    "nothing changes: the call would fail with {}: {}",
                    e.code, e.message
                ),
                "error": { "code": e.code.as_str(), "message": e.message },
            }),
        }
    }
}

/// Adds the eleven vault tools (unless `[tools.vault] enabled = false` — then they are listed
/// as disabled, so a call says how to enable them) and prunes expired undo records.
pub fn register(
    config: &VaultToolsConfig,
    journal: Option<Arc<Journal>>,
    registry: &mut Registry,
) -> Result<(), RegistryError> {
    if let Some(j) = &journal
        && let Some(cutoff) = std::time::SystemTime::now().checked_sub(config.undo_keep)
        && let Err(e) = j.prune_undo(cutoff)
    {
        tracing::warn!("could not prune old undo records: {e}");
    }
    let context = Arc::new(VaultContext {
        paths: config.path_policy(),
        journal,
    });
    for (name, def) in tool_defs() {
        let policy = config.tools.get(name).cloned().unwrap_or(Policy {
            enabled: config.enabled,
            timeout: Duration::from_secs(30),
            rate_limit: RateLimit::default(),
            approval: Some(def.approval),
        });
        registry.add(
            Box::new(VaultTool {
                spec: ToolSpec {
                    name: name.to_string(),
                    description: def.description.to_string(),
                    source: Source::Vault,
                    effect: def.effect,
                    schema: def.schema,
                },
                context: context.clone(),
                run: def.run,
                plan: def.plan,
            }),
            policy,
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Shared steps.

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) fn execution(message: impl Into<String>) -> CallError {
    CallError::new(ErrorCode::ExecutionError, message)
}

pub(crate) fn not_found(rel: &str) -> CallError {
    CallError::new(ErrorCode::NotFound, format!("no note at `{rel}`"))
        .with_details(serde_json::json!({ "path": rel }))
}

pub(crate) fn conflict(message: impl Into<String>) -> CallError {
    CallError::new(ErrorCode::Conflict, message)
}

/// A string parameter the schema made required.
pub(crate) fn param<'a>(call: &'a VaultCall, key: &str) -> &'a str {
    call.parameters
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

pub(crate) fn opt_param<'a>(call: &'a VaultCall, key: &str) -> Option<&'a str> {
    call.parameters.get(key).and_then(Value::as_str)
}

/// The file's bytes, or `None` when nothing is there.
pub(crate) fn current_bytes(abs: &Path) -> Result<Option<Vec<u8>>, CallError> {
    // Only a regular file, never waiting on a FIFO (docs/design.md §9.15).
    match crate::vault::read_regular(abs) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(execution(format!("cannot read {}: {e}", abs.display()))),
    }
}

/// The text of an existing note: `NOT_FOUND` when missing.
pub(crate) fn read_text(note: &NotePath) -> Result<String, CallError> {
    match current_bytes(&note.abs)? {
        None => Err(not_found(&note.rel)),
        Some(b) => {
            String::from_utf8(b).map_err(|_| execution(format!("note `{}` is not UTF-8", note.rel)))
        }
    }
}

pub(crate) fn journal(context: &VaultContext) -> Result<&Arc<Journal>, CallError> {
    context.journal.as_ref().ok_or_else(|| {
        execution("no journal is open here, so the change could not be undone: not made")
    })
}

/// The write-ahead undo record: committed before the vault is touched, so a kill between the
/// write and the outcome still leaves the change undoable.
pub(crate) fn prepare(
    context: &VaultContext,
    call: &VaultCall,
    tool: &str,
    changes: &[VaultChange],
) -> Result<(), CallError> {
    journal(context)?
        .undo_prepare(&call.call_id, &call.note, tool, changes)
        .map(|_| ())
        .map_err(undo_not_recorded)
}

/// [`prepare`] queued: the caller writes its new file meanwhile and calls
/// [`durable`](WriteAhead::durable) before that file takes its place. Nothing in the vault
/// changes before then, so the record still comes first; only the two fsyncs overlap.
pub(crate) struct WriteAhead<'c> {
    journal: &'c Journal,
    queued: Option<crate::journal::UndoPrepared>,
    failed: Option<CallError>,
}

impl<'c> WriteAhead<'c> {
    pub(crate) fn queue(
        context: &'c VaultContext,
        call: &VaultCall,
        tool: &str,
        changes: &[VaultChange],
    ) -> Result<Self, CallError> {
        let journal = journal(context)?;
        let queued = journal
            .undo_prepare_later(&call.call_id, &call.note, tool, changes)
            .map_err(undo_not_recorded)?;
        Ok(WriteAhead {
            journal,
            queued: Some(queued),
            failed: None,
        })
    }

    /// Waits (once) until the record is durable; every later call answers the same.
    pub(crate) fn durable(&mut self) -> std::io::Result<()> {
        if let Some(queued) = self.queued.take()
            && let Err(e) = self.journal.undo_prepared(queued)
        {
            self.failed = Some(undo_not_recorded(e));
        }
        match &self.failed {
            Some(e) => Err(std::io::Error::other(e.message.clone())),
            None => Ok(()),
        }
    }

    /// The error to give for a write that failed: the record's, when that is why.
    pub(crate) fn or(self, other: CallError) -> CallError {
        self.failed.unwrap_or(other)
    }
}

fn undo_not_recorded(e: crate::journal::JournalError) -> CallError {
    execution(format!("the journal could not record the undo data: {e}"))
}

/// The output of a state change: `data` plus the undo record the runner commits with the
/// outcome.
pub(crate) fn changed(data: Value, summary: String, changes: Vec<VaultChange>) -> ToolOutput {
    ToolOutput {
        data,
        summary,
        undo: Some(UndoRecord {
            changes,
            undoes: Vec::new(),
        }),
    }
}

/// Edits an existing note through the one atomic note write (`note::write::update_note`):
/// `edit` runs on the current text (again on the new text if an editor saved meanwhile, so
/// that save is kept). Returns the change (true pre-image, post hash) and the new text.
pub(crate) fn edit_note(
    context: &VaultContext,
    call: &VaultCall,
    tool: &str,
    note: &NotePath,
    edit: impl Fn(&str) -> Result<String, CallError>,
) -> Result<(VaultChange, String), CallError> {
    let first = read_text(note)?;
    let planned = edit(&first)?;
    let mut ahead = WriteAhead::queue(
        context,
        call,
        tool,
        &[VaultChange {
            path: note.rel.clone(),
            before: Some(first.clone().into_bytes()),
            after_sha256: Some(sha256_hex(planned.as_bytes())),
        }],
    )?;
    let seen = std::sync::Mutex::new((first, None::<CallError>));
    let mut ready = || ahead.durable();
    let written = crate::note::update_note_when_ready(
        &note.abs,
        |current| {
            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            seen.0 = current.to_string();
            match edit(current) {
                Ok(new) => {
                    seen.1 = None;
                    new
                }
                // The note changed under us so that the edit no longer applies: write nothing.
                Err(e) => {
                    seen.1 = Some(e);
                    current.to_string()
                }
            }
        },
        &mut ready,
    );
    let written = written.map_err(|e| match e {
        crate::note::write::WriteError::Gone(_) => not_found(&note.rel),
        other => ahead.or(execution(other.to_string())),
    })?;
    let (before, error) = seen.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = error {
        return Err(e);
    }
    Ok((
        VaultChange {
            path: note.rel.clone(),
            before: Some(before.into_bytes()),
            after_sha256: Some(sha256_hex(written.as_bytes())),
        },
        written,
    ))
}

/// Creates `abs` with `bytes` atomically and never over an existing file: a hidden temp file
/// beside it (fsynced), hard-linked into place (which fails if the name is taken), then
/// removed. Missing parent folders are created.
pub(crate) fn create_file(abs: &Path, bytes: &[u8]) -> Result<(), std::io::Error> {
    create_file_when_ready(abs, bytes, || Ok(()))
}

/// [`create_file`] that calls `ready` once the temp file is written and fsynced, before it is
/// linked into place, and creates nothing if it fails ([`WriteAhead::durable`]).
pub(crate) fn create_file_when_ready(
    abs: &Path,
    bytes: &[u8],
    ready: impl FnOnce() -> std::io::Result<()>,
) -> Result<(), std::io::Error> {
    let dir = abs.parent().unwrap_or(Path::new("."));
    // Missing folders are part of the change: made only once `ready` said it may happen.
    let mut ready = Some(ready);
    if !dir.is_dir()
        && let Some(ready) = ready.take()
    {
        ready()?;
    }
    std::fs::create_dir_all(dir)?;
    let name = abs
        .file_name()
        .map(|n| n.to_string_lossy().chars().take(64).collect::<String>())
        .unwrap_or_default();
    let temp = dir.join(format!(
        ".{name}.vaultd-{}-{}.tmp",
        std::process::id(),
        crate::note::write::next_temp_number()
    ));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        if let Some(ready) = ready.take() {
            ready()?;
        }
        std::fs::hard_link(&temp, abs)
    })();
    let _ = std::fs::remove_file(&temp);
    result?;
    crate::vault::fsync_dir(dir);
    Ok(())
}

/// Moves `from` to `to` without ever replacing a file at `to` (hard link, then unlink: a kill
/// in between leaves both names, never none).
pub(crate) fn move_file(from: &Path, to: &Path) -> Result<(), std::io::Error> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::hard_link(from, to)?;
    std::fs::remove_file(from)?;
    if let Some(dir) = to.parent() {
        crate::vault::fsync_dir(dir);
    }
    if let Some(dir) = from.parent() {
        crate::vault::fsync_dir(dir);
    }
    Ok(())
}

/// A free name in the trash for `rel`: `.trash/<rel>`, then ` (2)`, ` (3)`, … before `.md`.
pub(crate) fn trash_slot(root: &Path, rel: &str) -> String {
    let stem = rel.strip_suffix(".md").unwrap_or(rel);
    (1..)
        .map(|n| {
            if n == 1 {
                format!("{}/{stem}.md", paths::TRASH)
            } else {
                format!("{}/{stem} ({n}).md", paths::TRASH)
            }
        })
        .find(|candidate| std::fs::symlink_metadata(root.join(candidate)).is_err())
        .expect("some numbered name is free")
}

/// A look-alike sibling of a new name (see [`paths::look_alike`]) is a CONFLICT.
pub(crate) fn refuse_look_alike(note: &NotePath) -> Result<(), CallError> {
    let (Some(dir), Some(name)) = (note.abs.parent(), note.abs.file_name()) else {
        return Ok(());
    };
    let name = name.to_string_lossy();
    match paths::look_alike(dir, &name) {
        Some(other) => Err(conflict(format!(
            "`{}` differs from the existing `{other}` only in case or accents; on many file systems they are the same file: use the existing name or another one",
            note.rel
        ))),
        None => Ok(()),
    }
}

/// `{ path, sha256 }`, the data of most state changes.
pub(crate) fn path_and_hash(rel: &str, text: &str) -> Value {
    serde_json::json!({ "path": rel, "sha256": sha256_hex(text.as_bytes()) })
}

/// `if_sha256`: CONFLICT unless the note's current hash matches.
pub(crate) fn check_if_sha256(call: &VaultCall, rel: &str, text: &str) -> Result<(), CallError> {
    if let Some(want) = opt_param(call, "if_sha256") {
        let have = sha256_hex(text.as_bytes());
        if !want.eq_ignore_ascii_case(&have) {
            return Err(conflict(format!(
                "`{rel}` changed: its sha256 is {have}, not {want}; read it again and retry"
            ))
            .with_details(serde_json::json!({ "path": rel, "sha256": have })));
        }
    }
    Ok(())
}
