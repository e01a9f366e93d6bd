//! Dry run: a note in Dry_Run/ gets a preview of each pending call; nothing runs (docs/design.md §12.1).

use crate::daemon::Daemon;
use crate::daemon::DaemonError;
use crate::guard::dry_run;
use crate::note::{self, Block, parse_note};
use crate::pipeline::plan::{self, Facts, Rules};
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
        let live = self.live();
        let registry = live.runner.registry.clone();
        let redactor = live.runner.redactor.clone();
        let note = self.vault.relative(path);
        // What the daemon would read to plan this note (docs/design.md §12.1): its calls'
        // records and started calls by its `tool_note` (a note without one never ran), the
        // decisions recorded on the questions it shows.
        let parsed = parse_note(&text);
        let note_id = note::frontmatter_property(&text, "tool_note").map(|id| id.to_string());
        let questions = if self.approval_via_cli() {
            Facts::questions(&parsed)
        } else {
            Vec::new()
        };
        let mut facts = self
            .blocking(move |j| dry_run::journal_facts(j, note_id.as_deref(), &questions))
            .await?;
        facts.journal_lost = self.journal_lost(&text, &facts)?;
        // A note in Dry_Run/ is not in Approved/: the rules of a fresh claim.
        let rules = Rules::for_config(&live.config, false);
        let circuits = live.runner.breakers.snapshot();
        let max_calls = live.config.max_calls_per_note;
        let path_buf = path.to_path_buf();
        let now = SystemTime::now();
        let runner = self.runners.me.clone();
        let root = self.vault.root().to_path_buf();
        let written = tokio::task::spawn_blocking(move || {
            note::update_note_beneath(&root, &path_buf, |current| {
                let parsed = parse_note(current);
                let plan = plan::plan(&parsed, &registry, &rules, &facts);
                let shown = dry_run::Shown {
                    registry: &registry,
                    redactor: &redactor,
                    note: &note,
                    circuits: &circuits,
                    max_calls,
                };
                let already = dry_run::previewed_ids(current);
                let previews = dry_run::previews(&shown, &parsed, &plan, &already);
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
                self.problem_now(path, format!("dry-run previews not written: {e}"));
                Ok(())
            }
        }
    }
}
