//! The one atomic note write: temp file in the same folder, fsync, rename, fsync the folder;
//! if the note changed meanwhile, rebuild from the new content so no other writer's change
//! is lost.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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

/// How often the note may change under us before we give up on this write.
const MAX_ATTEMPTS: u32 = 20;
/// Back-off after a lost race: `BACKOFF_STEP` × attempt, at most `BACKOFF_MAX`.
const BACKOFF_STEP: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_millis(50);

/// Makes temp names unique among the writers of this process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Reads the note, computes its new text with `build(current)`, and replaces it atomically.
/// Returns the text written.
///
/// If the note changes between the read and the rename (an editor or the agent saved), the
/// temp file is dropped and `build` runs again on the new content, so the other writer's
/// change is kept. When `build` changes nothing, nothing is written.
pub fn update_note(path: &Path, build: impl Fn(&str) -> String) -> Result<String, WriteError> {
    for attempt in 1..=MAX_ATTEMPTS {
        let current = read_note(path)?;
        let new = build(&current);
        if new == current {
            return Ok(new);
        }
        let temp = temp_path(path);
        if let Err(source) = write_temp(&temp, path, new.as_bytes()) {
            let _ = fs::remove_file(&temp);
            return Err(io_error(path, source));
        }
        let unchanged = match fs::read(path) {
            Ok(bytes) => bytes == current.as_bytes(),
            Err(e) => {
                let _ = fs::remove_file(&temp);
                return Err(read_error(path, e));
            }
        };
        if !unchanged {
            let _ = fs::remove_file(&temp);
            std::thread::sleep((BACKOFF_STEP * attempt).min(BACKOFF_MAX));
            continue;
        }
        if let Err(source) = fs::rename(&temp, path) {
            let _ = fs::remove_file(&temp);
            return Err(io_error(path, source));
        }
        // The rename is done: a failed folder fsync only weakens durability after a crash,
        // and reporting it as a failed write would make the caller append twice.
        let _ = sync_parent(path);
        return Ok(new);
    }
    Err(io_error(
        path,
        io::Error::other(format!(
            "note keeps changing ({MAX_ATTEMPTS} attempts); try again later"
        )),
    ))
}

fn read_note(path: &Path) -> Result<String, WriteError> {
    let bytes = fs::read(path).map_err(|e| read_error(path, e))?;
    String::from_utf8(bytes).map_err(|_| WriteError::NotUtf8 {
        path: path.to_path_buf(),
    })
}

fn read_error(path: &Path, e: io::Error) -> WriteError {
    if e.kind() == io::ErrorKind::NotFound {
        WriteError::Gone(path.to_path_buf())
    } else {
        io_error(path, e)
    }
}

fn io_error(path: &Path, source: io::Error) -> WriteError {
    WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `.{name}.vaultd-{pid}-{n}.tmp` beside the note: hidden and `*.tmp`, so watchers (ours
/// included) ignore it. Long note names are cut so the temp name stays within NAME_MAX.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut cut = name.len().min(160);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let temp = format!(".{}.vaultd-{}-{n}.tmp", &name[..cut], std::process::id());
    path.with_file_name(temp)
}

/// Creates the temp file (never over an existing one) with the note's permissions, writes
/// and fsyncs it.
fn write_temp(temp: &Path, note: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(temp)?;
    if let Ok(meta) = fs::metadata(note) {
        file.set_permissions(meta.permissions())?;
    }
    file.write_all(bytes)?;
    file.sync_all()
}

fn sync_parent(path: &Path) -> io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}
