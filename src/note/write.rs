//! The one atomic note write: temp file in the same folder, fsync, rename, fsync the folder;
//! if the note changed meanwhile, rebuild from the new content so no other writer's change
//! is lost.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("note {0} is gone (deleted or moved away)")]
    Gone(std::path::PathBuf),
    #[error("note {path} is not UTF-8")]
    NotUtf8 { path: std::path::PathBuf },
    #[error("cannot write note {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Reads the note, computes its new text with `build(current)`, and replaces it atomically.
/// Returns the text written.
pub fn update_note(_path: &Path, _build: impl Fn(&str) -> String) -> Result<String, WriteError> {
    todo!("write")
}
