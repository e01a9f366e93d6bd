//! Files and folders vaultd creates outside the vault (journal, lock, outbox, `init`'s config):
//! private to the user whatever the umask, and never opened through a symlink (docs/design.md §9.5,
//! §9.7).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of the files vaultd creates for itself.
pub const FILE_MODE: u32 = 0o600;
/// Mode of the folders vaultd creates for itself.
pub const DIR_MODE: u32 = 0o700;

/// Creates `dir` and its missing parents with mode 0700 (a folder that already exists keeps
/// its mode: a person chose it). The umask can only take bits away, and 0700 has none to take
/// from the owner.
pub fn create_dir(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    // A umask of 0o077 or less leaves 0700 as it is; a stricter one (0o277) is undone.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE))
}

/// Opens `path` for reading and writing, creating it 0600 if missing, without following a
/// symlink (O_NOFOLLOW: a symlink planted at the path is an error, not a redirect). An
/// existing file readable by others is narrowed to 0600.
pub fn open_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| symlink_error(path, e))?;
    let mode = file.metadata()?.permissions().mode();
    if mode & 0o077 != 0 || mode & 0o600 != 0o600 {
        file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    }
    Ok(file)
}

/// [`open_file`], closed again: makes sure `path` exists, private, and is no symlink.
pub fn touch_file(path: &Path) -> io::Result<()> {
    open_file(path).map(drop)
}

/// Creates a new file 0600 that must not exist yet (O_EXCL | O_NOFOLLOW).
pub fn create_new_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// Writes `bytes` as a new private file (0600) at `path`, which must not exist yet, and
/// returns it, named, for the caller to fsync. The file is written before it has a name
/// ([`crate::files::unnamed_in`]) and linked whole, so no reader (an outbox's mail pickup)
/// ever finds a part of it under its name. The fsync after the link makes the data and the
/// name durable together on the journaling file systems Linux runs on, as for a file created
/// by name (the folder's own fsync is the caller's); a power loss before it returns can leave
/// the file empty or missing. Where `O_TMPFILE` or `/proc` is missing, the file is created by
/// name and written in place (removed again if the write fails).
pub fn create_whole(path: &Path, bytes: &[u8]) -> io::Result<File> {
    use std::io::Write;
    let unnamed = path
        .parent()
        .and_then(|dir| crate::files::unnamed_in(dir, FILE_MODE));
    let linked = match unnamed {
        Some(mut file) => {
            file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
            file.write_all(bytes)?;
            match crate::files::link_unnamed(&file, path) {
                Ok(()) => Some(file),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(e),
                Err(_) => None, // no /proc: by name below
            }
        }
        None => None,
    };
    let file = match linked {
        Some(file) => file,
        None => {
            let mut file = create_new_file(path)?;
            if let Err(e) = file.write_all(bytes) {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
            file
        }
    };
    Ok(file)
}

/// Takes group and other permissions off an existing regular file (not through a symlink).
/// Missing files and failures are ignored: this only tidies what an older release left.
pub fn narrow(path: &Path) {
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && meta.file_type().is_file()
        && meta.permissions().mode() & 0o077 != 0
    {
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(FILE_MODE));
    }
}

fn symlink_error(path: &Path, e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        io::Error::other(format!(
            "{} is a symlink; vaultd never writes through one (remove it)",
            path.display()
        ))
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn created_files_and_folders_are_private_and_existing_ones_narrowed() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("a/b");
        create_dir(&state).unwrap();
        assert_eq!(mode(&state), 0o700);
        let f = state.join("j");
        touch_file(&f).unwrap();
        assert_eq!(mode(&f), 0o600);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        touch_file(&f).unwrap();
        assert_eq!(mode(&f), 0o600);
        let g = state.join("g");
        std::fs::write(&g, "x").unwrap();
        std::fs::set_permissions(&g, std::fs::Permissions::from_mode(0o666)).unwrap();
        narrow(&g);
        assert_eq!(mode(&g), 0o600);
    }

    #[test]
    fn a_whole_file_is_private_never_seen_in_part_and_never_over_an_existing_name() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("outbox");
        create_dir(&out).unwrap();
        // Written without a name: the folder shows nothing until the link.
        let mut unnamed = crate::files::unnamed_in(&out, FILE_MODE).expect("O_TMPFILE here");
        std::io::Write::write_all(&mut unnamed, b"half").unwrap();
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
        drop(unnamed);
        assert_eq!(
            std::fs::read_dir(&out).unwrap().count(),
            0,
            "an unlinked file leaves nothing"
        );
        let eml = out.join("a.eml");
        create_whole(&eml, b"Subject: hi\r\n\r\nbody")
            .unwrap()
            .sync_all()
            .unwrap();
        assert_eq!(std::fs::read(&eml).unwrap(), b"Subject: hi\r\n\r\nbody");
        assert_eq!(mode(&eml), 0o600);
        // Never over a file or through a symlink at the name.
        let err = create_whole(&eml, b"other").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        let target = dir.path().join("precious");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, out.join("b.eml")).unwrap();
        assert!(create_whole(&out.join("b.eml"), b"other").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 2);
    }

    #[test]
    fn symlinks_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "precious").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open_file(&link).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        assert!(create_new_file(&link).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
    }
}
