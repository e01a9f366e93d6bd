//! The vault's id and the default state dir it names (see the parent module). A leaf:
//! `config` needs the default state dir, and the rest of `state` needs `config`.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Where the vault's id lives, relative to the vault root.
pub const VAULT_ID_FILE: &str = ".vaultd/id";

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {message}")]
    VaultId { path: PathBuf, message: String },
}

/// The folder the per-vault state dirs live in (and the old shared default was):
/// `$STATE_DIRECTORY` under systemd, else the user's state dir (`directories`).
pub fn state_base() -> PathBuf {
    if let Some(dir) = std::env::var_os("STATE_DIRECTORY").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    directories::ProjectDirs::from("", "", "vaultd")
        .and_then(|d| d.state_dir().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from(".vaultd-state"))
}

/// The default state dir of the vault at `vault`: `state_base()/<vault id>`, the id made now
/// if the vault has none yet.
pub fn default_state_dir(vault: &Path) -> Result<PathBuf, StateError> {
    Ok(state_base().join(vault_id(vault)?))
}

pub(crate) fn is_valid_id(s: &str) -> bool {
    s.len() == 18
        && s.starts_with("v-")
        && s[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The id of the vault at `vault`, made (atomically: a second process making one at the same
/// time gets the first one's) when there is none. Read without following a symlink: an id
/// file planted as a link to another vault's is an error, not that vault's state.
pub fn vault_id(vault: &Path) -> Result<String, StateError> {
    let path = vault.join(VAULT_ID_FILE);
    let err = |message: String| StateError::VaultId {
        path: path.clone(),
        message,
    };
    if let Some(id) = read_id(&path).map_err(&err)? {
        return Ok(id);
    }
    let dir = path.parent().expect("the id file is inside a folder");
    match std::fs::symlink_metadata(dir) {
        Ok(m) if !m.is_dir() => return Err(err(".vaultd is not a folder".into())),
        Ok(_) => {}
        Err(_) => std::fs::create_dir(dir)
            .or_else(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| {
                err(format!(
                    "cannot keep the vault's id here ({e}); set `state_dir` to choose a state folder"
                ))
            })?,
    }
    let id = format!("v-{}", random_hex(8).map_err(|e| err(e.to_string()))?);
    // Written whole under a temporary name, then linked to its name: the link fails if
    // another process made the id first, and nobody ever reads half an id.
    let tmp = dir.join(format!(
        ".id-{}-{}.tmp",
        std::process::id(),
        random_hex(4).map_err(|e| err(e.to_string()))?
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        writeln!(f, "{id}")?;
        f.sync_all()
    })();
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, &path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            crate::vault::fsync_dir(dir);
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_id(&path)
            .map_err(&err)?
            .ok_or_else(|| err("the id file vanished while it was made".into())),
        Err(e) => Err(err(format!(
            "cannot keep the vault's id here ({e}); set `state_dir` to choose a state folder"
        ))),
    }
}

/// The id in `path`, None when there is no such file.
pub(crate) fn read_id(path: &Path) -> Result<Option<String>, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let mut file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err("is a symlink; a vault's id is a plain file".into());
        }
        Err(e) => return Err(format!("cannot read the vault's id: {e}")),
    };
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("is not a plain file".into());
    }
    let mut text = String::new();
    (&mut file)
        .take(64)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read the vault's id: {e}"))?;
    let id = text.trim();
    if is_valid_id(id) {
        Ok(Some(id.to_string()))
    } else {
        Err("does not hold a vault id (v- and 16 hex digits); remove it to give this vault a new id and a new, empty state".into())
    }
}

fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
