//! Results too big for a note (docs/design.md §10.6): saved whole to `Tool_Results/<note id>/<call
//! id>.md` (a JSON block in a note, in a folder vaultd never watches), the callout's `data`
//! replaced by `{ truncated, bytes, full: "[[…]]", preview }`. Binary content of MCP results
//! goes beside it as an attachment.

use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;

/// Default of `max_result_bytes`.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 65_536;
/// Default folder (vault-relative) of saved results.
pub const DEFAULT_FOLDER: &str = "Tool_Results";
/// How much of an oversized result the callout keeps.
const PREVIEW_CHARS: usize = 1_000;

/// A note id as one safe path segment (it names a folder inside the vault). Note ids are
/// `n-` + hex (docs/design.md §9.2); anything else is cleaned rather than trusted.
fn id_segment(note_id: &str) -> String {
    let clean: String = note_id
        .chars()
        .map(|c| if c == '/' || c == '\\' { '_' } else { c })
        .collect();
    let clean = clean.trim_start_matches('.').to_string();
    if clean.is_empty() {
        "note".into()
    } else {
        clean
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot save the result to {path}: {source}")]
pub struct SaveError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Where results and attachments are saved, and the size limit.
#[derive(Debug, Clone)]
pub struct ResultStore {
    /// The vault root.
    pub vault: PathBuf,
    /// Vault-relative folder, `Tool_Results` by default.
    pub folder: String,
    /// `data` larger than this (as compact JSON) is saved instead of written into the note.
    pub max_result_bytes: usize,
}

impl ResultStore {
    pub fn new(vault: PathBuf, folder: String, max_result_bytes: usize) -> ResultStore {
        ResultStore {
            vault,
            folder,
            max_result_bytes,
        }
    }

    /// `data` as the note gets it: unchanged when small enough, else saved whole and replaced
    /// by the §10.6 stand-in.
    pub fn limit(&self, note_id: &str, call_id: &str, data: Value) -> Result<Value, SaveError> {
        if data.to_string().len() <= self.max_result_bytes {
            return Ok(data);
        }
        self.save_whole(note_id, call_id, &data)
    }

    /// Saves `data` whole, whatever its size, and returns the §10.6 stand-in (also used to keep
    /// a note under `max_note_bytes`, docs/design.md §9.8).
    pub fn save_whole(
        &self,
        note_id: &str,
        call_id: &str,
        data: &Value,
    ) -> Result<Value, SaveError> {
        let compact = data.to_string();
        let rel = format!(
            "{}/{}/{}.md",
            self.folder,
            id_segment(note_id),
            safe_name(call_id)
        );
        let pretty = serde_json::to_string_pretty(data).unwrap_or_else(|_| compact.clone());
        let fence = fence_for(&pretty);
        let text = format!(
            "# Result of {call_id}\n\nThe whole `data` of call `{call_id}` from note `{}`.\n\n{fence}json\n{pretty}\n{fence}\n",
            id_segment(note_id)
        );
        self.save(&rel, text.as_bytes())?;
        Ok(json!({
            "truncated": true,
            "bytes": compact.len(),
            "full": format!("[[{}]]", rel.trim_end_matches(".md")),
            "preview": preview(&compact),
        }))
    }

    /// Saves one attachment (`Tool_Results/<note id>/<call id>-<n>.<ext>`) and returns its
    /// vault-relative path.
    pub fn attach(
        &self,
        note_id: &str,
        call_id: &str,
        n: usize,
        ext: &str,
        bytes: &[u8],
    ) -> Result<String, SaveError> {
        let rel = format!(
            "{}/{}/{}-{n}.{}",
            self.folder,
            id_segment(note_id),
            safe_name(call_id),
            safe_name(ext)
        );
        self.save(&rel, bytes)?;
        Ok(rel)
    }

    /// Writes a new file atomically (temp file, fsync, rename) without following symlinks.
    fn save(&self, rel: &str, bytes: &[u8]) -> Result<(), SaveError> {
        let path = self.vault.join(rel);
        let err = |source| SaveError {
            path: path.clone(),
            source,
        };
        let dir = path.parent().expect("a saved result has a folder");
        // Every folder from the vault root down made and opened without following a symlink
        // (docs/design.md §9.13): a `Tool_Results/` swapped for one is refused, never written through.
        crate::beneath::create_dirs(&self.vault, dir).map_err(err)?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".vaultd-")
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(err)?;
        tmp.write_all(bytes).map_err(err)?;
        tmp.as_file().sync_all().map_err(err)?;
        let temp = tmp.into_temp_path();
        // The rename goes through the folder opened from the root without following symlinks.
        crate::beneath::rename(&self.vault, &temp, &path).map_err(err)?;
        // Renamed away: nothing is left for the guard to remove.
        let _ = temp.keep();
        Ok(())
    }
}

/// The first [`PREVIEW_CHARS`] characters of the compact JSON.
fn preview(compact: &str) -> String {
    match compact.char_indices().nth(PREVIEW_CHARS) {
        Some((i, _)) => format!("{}…", &compact[..i]),
        None => compact.to_string(),
    }
}

/// A backtick fence longer than any backtick run in `text`.
fn fence_for(text: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    "`".repeat((longest + 1).max(3))
}

fn safe_name(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect::<String>()
        .trim_start_matches('.')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_data_passes_big_data_is_saved_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = ResultStore::new(dir.path().to_path_buf(), "Tool_Results".into(), 100);
        let small = json!({ "a": 1 });
        assert_eq!(store.limit("n", "c-1", small.clone()).unwrap(), small);

        let big = json!({ "text": "x```y".repeat(100) });
        let out = store.limit("n", "c-2", big.clone()).unwrap();
        assert_eq!(out["truncated"], true);
        assert_eq!(out["bytes"], big.to_string().len());
        assert_eq!(out["full"], "[[Tool_Results/n/c-2]]");
        assert!(out["preview"].as_str().unwrap().starts_with("{\"text\""));
        let saved = std::fs::read_to_string(dir.path().join("Tool_Results/n/c-2.md")).unwrap();
        let body = saved.split("````json\n").nth(1).unwrap();
        let json_text = body.rsplit_once("\n````").unwrap().0;
        let back: Value = serde_json::from_str(json_text).unwrap();
        assert_eq!(back, big);
    }

    #[test]
    fn note_ids_are_one_visible_segment() {
        assert_eq!(id_segment("n-0123456789ab"), "n-0123456789ab");
        assert_eq!(id_segment("../x"), "_x");
        assert_eq!(id_segment(".hidden"), "hidden");
    }
}
