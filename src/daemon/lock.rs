//! One daemon per vault: the `flock` on `<vault>/.vaultd.lock` (docs/design.md §9.5).

use crate::daemon::DaemonError;
use std::path::{Path, PathBuf};

/// Holds the vault lock while alive; removes the lock file when dropped (docs/design.md §9.5).
pub struct VaultLock {
    file: std::fs::File,
    path: PathBuf,
}

impl Drop for VaultLock {
    fn drop(&mut self) {
        // Removed while still locked, so no other daemon can hold a lock on this file; one
        // that opened it meanwhile sees the path gone (or another file) and starts over.
        let _ = std::fs::remove_file(&self.path);
        let _ = &self.file;
    }
}

/// Takes the one-daemon-per-vault lock (`flock` on `<vault>/.vaultd.lock`, which holds the
/// PID). A second daemon gets an error naming the PID of the first. The lock file is opened
/// without following a symlink (one planted there is an error, never written through) and is
/// private (0600).
pub fn lock_vault(vault: &Path) -> Result<VaultLock, DaemonError> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let path = vault.join(".vaultd.lock");
    let lock_error = |source| DaemonError::Lock {
        path: path.clone(),
        source,
    };
    for _ in 0..100 {
        let mut file = crate::private::open_file(&path).map_err(lock_error)?;
        // SAFETY: flock on a valid, open file descriptor.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(DaemonError::Locked(format!(
                    "another vaultd (PID {}) is already running on {}; stop it first",
                    if pid.is_empty() { "unknown" } else { pid },
                    vault.display()
                )));
            }
            return Err(lock_error(err));
        }
        // The daemon before us may have removed the file between our open and our flock:
        // our lock is then on a file nobody else will ever look at. Start over.
        let ours = file.metadata().map_err(lock_error)?;
        match std::fs::symlink_metadata(&path) {
            Ok(named) if named.ino() == ours.ino() && named.dev() == ours.dev() => {}
            _ => continue,
        }
        let _ = file.set_len(0);
        let _ = file.rewind();
        let _ = writeln!(file, "{}", std::process::id());
        let _ = file.sync_all();
        return Ok(VaultLock { file, path });
    }
    Err(lock_error(std::io::Error::other(
        "the lock file keeps being replaced",
    )))
}

/// The PID of the daemon holding the vault lock, if one is running.
pub fn running_daemon(vault: &Path) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let path = vault.join(".vaultd.lock");
    let file = std::fs::File::open(&path).ok()?;
    // SAFETY: flock on a valid, open file descriptor; a shared lock is released on drop.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if rc == 0 {
        return None;
    }
    std::fs::read_to_string(&path).ok()?.trim().parse().ok()
}
