//! Dry run: a note in Dry_Run/ gets a preview of each pending call; nothing runs (docs/design.md §12.1).

use crate::daemon::Daemon;
use crate::daemon::DaemonError;
use crate::daemon::intake::stamp;
use crate::guard::{budget, dry_run};
use crate::note::{self, Block, parse_note};
use crate::vault::State;
use std::path::Path;
use std::time::SystemTime;

impl Daemon {
    /// A note in Dry_Run/: each pending call gets its preview, once; nothing runs, nothing is
    /// journaled, the note stays where it is (docs/design.md §12.1).
    pub(crate) async fn preview_note(&self, path: &Path) -> Result<(), DaemonError> {
        let Some(text) = self.read_note(path) else {
            return Ok(());
        };
        let registry = self.live().runner.registry.clone();
        let redactor = self.live().runner.redactor.clone();
        let note = self.vault.relative(path);
        // A note that ran before carries its id; a new one has spent nothing yet.
        let started = match note::frontmatter_property(&text, "tool_note") {
            Some(id) => {
                let key = id.to_string();
                self.blocking(move |j| budget::calls_started(j, &key))
                    .await?
            }
            None => 0,
        };
        let facts = dry_run::Facts {
            budget_left: Some(budget::remaining(
                self.live().config.guard.note_budget,
                started,
            )),
            note_budget: self.live().config.guard.note_budget,
            circuits: self.live().runner.breakers.snapshot(),
        };
        let path_buf = path.to_path_buf();
        let now = SystemTime::now();
        let runner = self.runners.me.clone();
        let root = self.vault.root().to_path_buf();
        let written = tokio::task::spawn_blocking(move || {
            note::update_note_beneath(&root, &path_buf, |current| {
                let parsed = parse_note(current);
                let previews =
                    dry_run::previews(&registry, &redactor, &parsed, current, &note, &facts);
                if previews.is_empty() {
                    return current.to_string();
                }
                let blocks: Vec<Block<'_>> = previews.iter().map(Block::Preview).collect();
                let text = note::append_blocks(current, &blocks, State::DryRun.as_str(), now);
                note::set_runner(&text, runner.as_str())
            })
        })
        .await
        .expect("write task does not panic");
        match written {
            Ok(_) | Err(note::WriteError::Gone(_)) => Ok(()),
            Err(e) => {
                let (len, mtime) = stamp(path);
                self.problem(
                    path,
                    len,
                    mtime,
                    format!("dry-run previews not written: {e}"),
                );
                Ok(())
            }
        }
    }
}
