//! Paths inside the vault resolved without following symlinks (docs/design.md §9.13): every move of a
//! note into a state folder opens the folders on both sides from the vault root with
//! `openat2(RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)` (or, on kernels before 5.6, one
//! `openat(O_NOFOLLOW | O_DIRECTORY)` per component) and renames or links relative to those
//! descriptors, so a state folder swapped for a symlink while the daemon runs is never
//! written through: the operation fails with [`is_symlink_refusal`] errors instead.
//!
//! The vault root itself may be reached through a symlink (`~/vault` -> `/data/vault`): only
//! what lies below it is resolved strictly.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// The error inside every refusal, so callers (and the log) can tell it from an I/O failure.
#[derive(Debug, thiserror::Error)]
#[error(
    "{path}: a folder on the way is a symlink (or leads outside the vault); nothing is written through it"
)]
pub struct SymlinkRefused {
    pub path: std::path::PathBuf,
}

/// True for an error this module returned because a path component is a symlink.
pub fn is_symlink_refusal(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<SymlinkRefused>())
}

fn refusal(path: &Path) -> io::Error {
    io::Error::other(SymlinkRefused {
        path: path.to_path_buf(),
    })
}

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

/// Opens the vault root (following a symlink to it: that is the user's choice of path).
fn open_root(root: &Path) -> io::Result<OwnedFd> {
    let c = cstring(root)?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    owned(fd)
}

fn owned(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens the folder `rel` (relative, below `root`) as an `O_PATH` descriptor without following
/// any symlink on the way; a symlink or a `..` gives the refusal.
pub fn open_dir(root: &Path, rel: &Path) -> io::Result<OwnedFd> {
    let root_fd = open_root(root)?;
    Ok(open_below(&root_fd, root, rel)?.unwrap_or(root_fd))
}

/// [`open_dir`] from the root's descriptor; `None` when `rel` is empty (the root itself).
fn open_below(root_fd: &OwnedFd, root: &Path, rel: &Path) -> io::Result<Option<OwnedFd>> {
    if rel.as_os_str().is_empty() {
        return Ok(None);
    }
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(refusal(&root.join(rel)));
    }
    match openat2_beneath(root_fd, rel) {
        Ok(fd) => Ok(Some(fd)),
        // Kernels before 5.6, or a seccomp filter that hides openat2: one component at a time.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) => {
            walk_nofollow(root_fd, root, rel).map(Some)
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV)) => {
            Err(refusal(&root.join(rel)))
        }
        Err(e) => Err(e),
    }
}

fn openat2_beneath(dir: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    let c = cstring(rel)?;
    // SAFETY: open_how is plain data; zeroed is a valid value for every field.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_BENEATH;
    // SAFETY: valid descriptor, NUL-terminated path and a correctly sized open_how.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    owned(fd as RawFd)
}

/// `rel` (not empty) below `start`, one `openat(O_NOFOLLOW)` per component.
fn walk_nofollow(start: &OwnedFd, root: &Path, rel: &Path) -> io::Result<OwnedFd> {
    let mut walked: Option<OwnedFd> = None;
    for part in rel.components() {
        let dir = walked.as_ref().unwrap_or(start);
        let c = cstring(Path::new(part.as_os_str()))?;
        // SAFETY: valid descriptor and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        walked = Some(match owned(fd) {
            Ok(fd) => fd,
            // O_PATH|O_NOFOLLOW on a symlink opens the link itself; O_DIRECTORY then fails
            // with ENOTDIR (or ELOOP on some kernels).
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                let walked = root.join(rel);
                return Err(if is_symlink_at(dir, part.as_os_str()) {
                    refusal(&walked)
                } else {
                    e
                });
            }
            Err(e) => return Err(e),
        });
    }
    walked.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty folder path"))
}

/// The two folders of a rename or link below `root`, the root opened once and a folder
/// shared by both sides opened once.
struct Pair {
    root: OwnedFd,
    from: Option<OwnedFd>,
    to: Option<OwnedFd>,
    same: bool,
}

impl Pair {
    fn open(root: &Path, from: &Path, to: &Path) -> io::Result<Pair> {
        let root_fd = open_root(root)?;
        let same = from == to;
        let from_fd = open_below(&root_fd, root, from)?;
        let to_fd = if same {
            None
        } else {
            open_below(&root_fd, root, to)?
        };
        Ok(Pair {
            root: root_fd,
            from: from_fd,
            to: to_fd,
            same,
        })
    }

    fn from(&self) -> RawFd {
        self.from.as_ref().unwrap_or(&self.root).as_raw_fd()
    }

    fn to(&self) -> RawFd {
        if self.same {
            return self.from();
        }
        self.to.as_ref().unwrap_or(&self.root).as_raw_fd()
    }
}

fn is_symlink_at(dir: &OwnedFd, name: &std::ffi::OsStr) -> bool {
    let Ok(c) = cstring(Path::new(name)) else {
        return false;
    };
    // SAFETY: stat is plain data; fstatat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, NUL-terminated name, valid out pointer.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH,
        )
    };
    rc == 0 && st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// A path below `root` split into its folder (relative) and its file name.
fn split<'a>(root: &Path, path: &'a Path) -> io::Result<(&'a Path, &'a std::ffi::OsStr)> {
    let rel = path.strip_prefix(root).map_err(|_| refusal(path))?;
    let name = rel.file_name().ok_or_else(|| refusal(path))?;
    Ok((rel.parent().unwrap_or(Path::new("")), name))
}

/// Renames `from` to `to` (both below `root`), never replacing `to`, through folder
/// descriptors opened without following symlinks. `EINVAL`/`ENOSYS` (no `RENAME_NOREPLACE` on
/// this file system) are returned to the caller, which knows its fallback.
pub fn rename_noreplace(root: &Path, from: &Path, to: &Path) -> io::Result<()> {
    let (from_dir, from_name) = split(root, from)?;
    let (to_dir, to_name) = split(root, to)?;
    let dirs = Pair::open(root, from_dir, to_dir)?;
    let (f, t) = (cstring(Path::new(from_name))?, cstring(Path::new(to_name))?);
    // SAFETY: valid descriptors and NUL-terminated names for the duration of the call.
    let rc = unsafe {
        libc::renameat2(
            dirs.from(),
            f.as_ptr(),
            dirs.to(),
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    Err(io::Error::last_os_error())
}

/// Plain rename (replacing `to`), for file systems without `RENAME_NOREPLACE`, through the
/// same descriptors.
pub fn rename(root: &Path, from: &Path, to: &Path) -> io::Result<()> {
    let (from_dir, from_name) = split(root, from)?;
    let (to_dir, to_name) = split(root, to)?;
    let dirs = Pair::open(root, from_dir, to_dir)?;
    let (f, t) = (cstring(Path::new(from_name))?, cstring(Path::new(to_name))?);
    // SAFETY: as in `rename_noreplace`.
    let rc = unsafe { libc::renameat(dirs.from(), f.as_ptr(), dirs.to(), t.as_ptr()) };
    if rc == 0 {
        return Ok(());
    }
    Err(io::Error::last_os_error())
}

/// A second name `to` for the file `from` (both below `root`), through descriptors opened
/// without following symlinks; the file itself is never followed either (no `AT_SYMLINK_FOLLOW`).
pub fn hard_link(root: &Path, from: &Path, to: &Path) -> io::Result<()> {
    let (from_dir, from_name) = split(root, from)?;
    let (to_dir, to_name) = split(root, to)?;
    let dirs = Pair::open(root, from_dir, to_dir)?;
    let (f, t) = (cstring(Path::new(from_name))?, cstring(Path::new(to_name))?);
    // SAFETY: as in `rename_noreplace`.
    let rc = unsafe { libc::linkat(dirs.from(), f.as_ptr(), dirs.to(), t.as_ptr(), 0) };
    if rc == 0 {
        return Ok(());
    }
    Err(io::Error::last_os_error())
}

/// Creates the folder `dir` below `root` and its missing parents, one `mkdirat` at a time
/// relative to a descriptor opened without following symlinks.
pub fn create_dirs(root: &Path, dir: &Path) -> io::Result<()> {
    let rel = dir.strip_prefix(root).map_err(|_| refusal(dir))?;
    let mut walked = std::path::PathBuf::new();
    for part in rel.components() {
        let Component::Normal(name) = part else {
            return Err(refusal(dir));
        };
        let parent = open_dir(root, &walked)?;
        let c = cstring(Path::new(name))?;
        // SAFETY: valid descriptor and NUL-terminated name.
        let rc = unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o777) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(e);
            }
        }
        walked.push(name);
    }
    // What exists there now must be a real folder, not a symlink someone placed.
    open_dir(root, rel).map(drop)
}

/// The folder a note is written in, opened once per write: its temp file is created, renamed
/// over the note and (on failure) removed through the folder's descriptor, so the folder
/// checked — below the vault root, without symlinks — is the folder written in, and its path
/// is walked once instead of at each step.
pub struct Folder {
    fd: OwnedFd,
}

impl Folder {
    /// The folder `dir` below `root`, resolved as [`open_dir`] resolves it.
    pub fn beneath(root: &Path, dir: &Path) -> io::Result<Folder> {
        let rel = dir.strip_prefix(root).map_err(|_| refusal(dir))?;
        open_dir(root, rel).map(|fd| Folder { fd })
    }

    /// The folder `dir` as given, symlinks followed: for a note outside a vault.
    pub fn plain(dir: &Path) -> io::Result<Folder> {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        open_root(dir).map(|fd| Folder { fd })
    }

    /// The permission bits of the file `name` (symlinks followed), if it is there.
    pub fn mode_of(&self, name: &OsStr) -> Option<u32> {
        rustix::fs::statat(&self.fd, name, rustix::fs::AtFlags::empty())
            .ok()
            .map(|st| st.st_mode & 0o7777)
    }

    /// Whether the file `name` in this folder is `file` (same device and inode; `name` itself
    /// not followed). A note opened by its path is then the one in this folder: the path's
    /// folder was not swapped since this one was opened.
    pub fn holds(&self, name: &OsStr, file: &std::fs::File) -> bool {
        use std::os::unix::fs::MetadataExt;
        let (Ok(here), Ok(there)) = (
            rustix::fs::statat(&self.fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW),
            file.metadata(),
        ) else {
            return false;
        };
        here.st_dev == there.dev() && here.st_ino == there.ino()
    }

    /// Creates the file `name`, never over an existing one, open for writing.
    pub fn create_new(&self, name: &OsStr) -> io::Result<std::fs::File> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o666),
        )?;
        Ok(std::fs::File::from(fd))
    }

    /// Renames `from` to `to` in this folder, replacing `to`.
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        rustix::fs::renameat(&self.fd, from, &self.fd, to)?;
        Ok(())
    }

    /// Removes the file `name` from this folder.
    pub fn remove(&self, name: &OsStr) -> io::Result<()> {
        rustix::fs::unlinkat(&self.fd, name, rustix::fs::AtFlags::empty())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_swapped_for_a_symlink_is_refused_and_nothing_lands_outside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("vault");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("Needs_Action")).unwrap();
        std::fs::create_dir_all(root.join("Done/sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let note = root.join("Needs_Action/a.md");
        std::fs::write(&note, "a").unwrap();

        // A real folder: works.
        rename_noreplace(&root, &note, &root.join("Done/sub/a.md")).unwrap();
        rename_noreplace(&root, &root.join("Done/sub/a.md"), &note).unwrap();

        // Done/ swapped for a symlink to a folder outside.
        std::fs::rename(root.join("Done"), dir.path().join("Done.real")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("Done")).unwrap();
        for target in [root.join("Done/a.md"), root.join("Done/sub/a.md")] {
            let e = rename_noreplace(&root, &note, &target).unwrap_err();
            assert!(is_symlink_refusal(&e), "{e}");
            let e = hard_link(&root, &note, &target).unwrap_err();
            assert!(is_symlink_refusal(&e), "{e}");
        }
        let e = create_dirs(&root, &root.join("Done/new")).unwrap_err();
        assert!(is_symlink_refusal(&e), "{e}");
        let e = Folder::beneath(&root, &root.join("Done"))
            .map(drop)
            .unwrap_err();
        assert!(is_symlink_refusal(&e), "{e}");
        let e = Folder::beneath(&root, &root.join("Missing"))
            .map(drop)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        assert_eq!(std::fs::read_to_string(&note).unwrap(), "a");

        // The fallback walk refuses the same.
        let e =
            walk_nofollow(&open_root(&root).unwrap(), &root, Path::new("Done/sub")).unwrap_err();
        assert!(is_symlink_refusal(&e), "{e}");
        // A root reached through a symlink is the user's choice and fine.
        let alias = dir.path().join("alias");
        std::os::unix::fs::symlink(&root, &alias).unwrap();
        assert!(open_dir(&alias, Path::new("Needs_Action")).is_ok());
    }
}
