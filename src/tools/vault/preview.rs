//! The `would` of a vault state change in a dry run (docs/design.md §12.1): what each touched note
//! becomes, as one unified diff, computed from the change its tool plans ([`super::PlanFn`])
//! with the same code its `run` uses. Nothing is written.
//!
//! A note's text is shown only where an agent could read it anyway: the text of a note
//! outside `[tools.vault] read` (a note the agent may write but not read) stays out of the
//! diff, so a dry run is not a way around the read scope.

use super::Planned;
use super::paths::{Access, PathPolicy};
use serde_json::{Value, json};

/// A diff longer than this is cut (a preview is written into a note; the parameters above it
/// show the whole change anyway).
const MAX_DIFF_BYTES: usize = 64 * 1024;

/// `{ description, changes: [{ path, action, from? }], diff }`.
pub(super) fn would(paths: &PathPolicy, files: &[Planned]) -> Value {
    let mut diff = String::new();
    let mut changes = Vec::new();
    let mut said = Vec::new();
    for f in files {
        match (&f.moved_from, &f.before, &f.after) {
            (Some(from), _, _) => {
                said.push(format!("move {from} to {}", f.path));
                changes.push(json!({ "path": f.path, "action": "move", "from": from }));
                // The text does not change: a rename, as git shows one.
                diff.push_str(&format!("--- a/{from}\n+++ b/{}\n", f.path));
            }
            (None, None, Some(after)) => {
                said.push(format!("create {}", f.path));
                changes.push(json!({ "path": f.path, "action": "create" }));
                diff.push_str(&unified("/dev/null", &format!("b/{}", f.path), "", after));
            }
            (None, Some(before), after) => {
                let after = after.as_deref().unwrap_or("");
                changes.push(json!({ "path": f.path, "action": "edit" }));
                if paths.note(&f.path, Access::Read).is_err() {
                    said.push(format!(
                        "change {} (its text is not shown: the note is outside tools.vault.read)",
                        f.path
                    ));
                    diff.push_str(&format!("--- a/{0}\n+++ b/{0}\n", f.path));
                    continue;
                }
                let (added, removed) = counts(before, after);
                said.push(format!("change {} (+{added} −{removed} lines)", f.path));
                let a = format!("a/{}", f.path);
                let b = format!("b/{}", f.path);
                diff.push_str(&unified(&a, &b, before, after));
            }
            (None, None, None) => {}
        }
    }
    json!({
        "description": format!("would {}; nothing is written by this preview", said.join(", ")),
        "changes": changes,
        "diff": bounded(diff),
    })
}

/// The unified diff of one file, with its header even when nothing differs.
fn unified(a: &str, b: &str, before: &str, after: &str) -> String {
    let diff = similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .header(a, b)
        .to_string();
    if diff.is_empty() {
        format!("--- {a}\n+++ {b}\n")
    } else {
        diff
    }
}

/// Lines added and removed.
fn counts(before: &str, after: &str) -> (usize, usize) {
    let diff = similar::TextDiff::from_lines(before, after);
    let mut added = 0;
    let mut removed = 0;
    for change in diff.iter_all_changes() {
        match change.tag() {
            similar::ChangeTag::Insert => added += 1,
            similar::ChangeTag::Delete => removed += 1,
            similar::ChangeTag::Equal => {}
        }
    }
    (added, removed)
}

fn bounded(diff: String) -> String {
    if diff.len() <= MAX_DIFF_BYTES {
        return diff;
    }
    let mut cut = MAX_DIFF_BYTES;
    while !diff.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(
        "{}\n… (the diff is cut here: {} bytes in all)\n",
        &diff[..cut],
        diff.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn policy(read: &[&str]) -> PathPolicy {
        let read: Vec<String> = read.iter().map(|s| s.to_string()).collect();
        PathPolicy::new(
            PathBuf::from("/nonexistent-vault"),
            &["Needs_Action"],
            &read,
            &["**".to_string()],
        )
        .unwrap()
    }

    #[test]
    fn an_edit_is_shown_as_a_unified_diff() {
        let w = would(
            &policy(&["**"]),
            &[Planned::edited(
                "Agent/log.md",
                "# Log\n- one\n".into(),
                "# Log\n- one\n- two\n".into(),
            )],
        );
        assert_eq!(
            w["diff"],
            "--- a/Agent/log.md\n+++ b/Agent/log.md\n@@ -1,2 +1,3 @@\n # Log\n - one\n+- two\n"
        );
        assert_eq!(w["changes"][0]["action"], "edit");
        assert!(
            w["description"]
                .as_str()
                .unwrap()
                .contains("change Agent/log.md (+1 −0 lines)"),
            "{w}"
        );
    }

    #[test]
    fn a_creation_diffs_from_dev_null_and_a_move_is_a_rename() {
        let w = would(
            &policy(&["**"]),
            &[
                Planned::created("a.md", "x\n".into()),
                Planned::moved("b.md", "c/b.md", "secret text\n".into()),
            ],
        );
        let diff = w["diff"].as_str().unwrap();
        assert!(
            diff.starts_with("--- /dev/null\n+++ b/a.md\n@@ -0,0 +1 @@\n+x\n"),
            "{diff}"
        );
        assert!(diff.ends_with("--- a/b.md\n+++ b/c/b.md\n"), "{diff}");
        assert!(!diff.contains("secret text"));
    }

    #[test]
    fn a_note_outside_the_read_scope_keeps_its_text_out_of_the_diff() {
        let w = would(
            &policy(&["Public/**"]),
            &[Planned::edited(
                "Private/keys.md",
                "password: hunter2\n".into(),
                "password: hunter2\nmore\n".into(),
            )],
        );
        assert!(!w.to_string().contains("hunter2"), "{w}");
        assert!(
            w["description"]
                .as_str()
                .unwrap()
                .contains("tools.vault.read")
        );
    }

    #[test]
    fn a_huge_diff_is_cut_on_a_character_boundary() {
        let after = "é".repeat(MAX_DIFF_BYTES);
        let w = would(
            &policy(&["**"]),
            &[Planned::edited("a.md", String::new(), after)],
        );
        let diff = w["diff"].as_str().unwrap();
        assert!(diff.len() < MAX_DIFF_BYTES + 200);
        assert!(diff.contains("the diff is cut here"));
    }
}
