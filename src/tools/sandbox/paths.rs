//! The paths a sandbox grants (`writable`, `read`), opened at every call without following
//! a symbolic link anywhere on the way (docs/design.md §10.5). The Landlock rules are then built
//! from the open fds, never from the path again: a `writable` folder swapped for a symlink
//! between two calls (or between the check and the rule) is refused, not followed outside
//! the vault.
//!
//! Each component is opened with `O_PATH | O_NOFOLLOW` relative to the one before, so a
//! symlink anywhere in the path is seen as such (`openat2`'s `RESOLVE_NO_SYMLINKS` does the
//! same in one call, but only from Linux 5.6; this works wherever vaultd runs).

use rustix::fs::{FileType, Mode, OFlags};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

/// What a granted path turned out to be.
#[derive(Debug)]
pub struct Opened {
    pub fd: OwnedFd,
    pub is_dir: bool,
}

/// Why a granted path cannot be granted at this call.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error(
        "`{path}` is a symbolic link (at `{at}`); the sandbox never follows one, so it is refused"
    )]
    Symlink { path: String, at: String },
    #[error("`{path}` cannot be opened (at `{at}`): {source}")]
    Io {
        path: String,
        at: String,
        source: std::io::Error,
    },
    #[error("`{path}` leaves its folder (`..`)")]
    Parent { path: String },
}

/// Opens `rel` below the directory `base` (the vault) without following a symlink in `rel`.
/// `base` itself is taken as configured.
pub fn open_beneath(base: &Path, rel: &Path) -> Result<Opened, PathError> {
    let shown = rel.display().to_string();
    let start = open_path(rustix::fs::CWD, base, OFlags::DIRECTORY).map_err(|e| PathError::Io {
        path: shown.clone(),
        at: base.display().to_string(),
        source: e.into(),
    })?;
    walk(start, rel, &shown)
}

/// Opens an absolute path (a `read` entry) from `/` without following any symlink in it.
pub fn open_absolute(path: &Path) -> Result<Opened, PathError> {
    let shown = path.display().to_string();
    let root = open_path(rustix::fs::CWD, Path::new("/"), OFlags::DIRECTORY).map_err(|e| {
        PathError::Io {
            path: shown.clone(),
            at: "/".into(),
            source: e.into(),
        }
    })?;
    walk(root, path, &shown)
}

/// Every path to grant so that the whole tree from `/` is covered except `excluded` (real
/// paths): the entries of each folder on the way to an excluded path, that path left out.
/// Landlock only allows, so "all but" is the siblings along the way. A symlink is never
/// granted: its target is covered, or not, where it really is. An entry the walk cannot
/// read is left out.
pub fn everything_but(excluded: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    siblings_but(Path::new("/"), excluded, &mut out);
    out
}

fn siblings_but(dir: &Path, excluded: &[PathBuf], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if excluded.contains(&path) {
            continue;
        }
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_symlink() {
            continue;
        }
        if kind.is_dir() && excluded.iter().any(|e| e.starts_with(&path)) {
            siblings_but(&path, excluded, out);
        } else {
            out.push(path);
        }
    }
}

fn walk(mut dir: OwnedFd, rel: &Path, shown: &str) -> Result<Opened, PathError> {
    let mut so_far = std::path::PathBuf::new();
    let mut is_dir = true;
    for component in rel.components() {
        let name = match component {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(n) => n,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(PathError::Parent { path: shown.into() });
            }
        };
        if !is_dir {
            return Err(PathError::Io {
                path: shown.into(),
                at: so_far.display().to_string(),
                source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
            });
        }
        so_far.push(name);
        let at = || so_far.display().to_string();
        let next =
            open_path(&dir, Path::new(name), OFlags::NOFOLLOW).map_err(|e| PathError::Io {
                path: shown.into(),
                at: at(),
                source: e.into(),
            })?;
        let kind = FileType::from_raw_mode(
            rustix::fs::fstat(&next)
                .map_err(|e| PathError::Io {
                    path: shown.into(),
                    at: at(),
                    source: e.into(),
                })?
                .st_mode,
        );
        if kind == FileType::Symlink {
            return Err(PathError::Symlink {
                path: shown.into(),
                at: at(),
            });
        }
        is_dir = kind == FileType::Directory;
        dir = next;
    }
    Ok(Opened { fd: dir, is_dir })
}

fn open_path(
    dir: impl std::os::fd::AsFd,
    path: &Path,
    extra: OFlags,
) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        path,
        OFlags::PATH | OFlags::CLOEXEC | extra,
        Mode::empty(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_anywhere_on_the_way_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("out/deep")).unwrap();
        std::fs::create_dir_all(root.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("out"), root.join("out/deep/loop")).unwrap();
        assert!(open_beneath(root, Path::new("out")).unwrap().is_dir);
        assert!(open_beneath(root, Path::new("out/deep")).unwrap().is_dir);
        for bad in ["link", "out/deep/loop", "out/deep/loop/deep"] {
            let e = open_beneath(root, Path::new(bad)).unwrap_err();
            assert!(matches!(e, PathError::Symlink { .. }), "{bad}: {e}");
        }
        assert!(matches!(
            open_beneath(root, Path::new("../x")).unwrap_err(),
            PathError::Parent { .. }
        ));
        let abs = open_absolute(&root.join("out")).unwrap();
        assert!(abs.is_dir);
        assert!(matches!(
            open_absolute(&root.join("link/x")).unwrap_err(),
            PathError::Symlink { .. }
        ));
    }

    #[test]
    fn everything_but_leaves_out_the_excluded_and_covers_their_siblings() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for d in ["home/.ssh", "home/notes", "state/journal", "other"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("home/.bashrc"), "").unwrap();
        std::os::unix::fs::symlink(root.join("home/.ssh"), root.join("home/keys")).unwrap();
        let granted = everything_but(&[root.join("home/.ssh"), root.join("state")]);
        let has = |p: &str| granted.contains(&root.join(p));
        assert!(has("home/notes") && has("home/.bashrc") && has("other"));
        // Neither the excluded paths, nor a folder holding them, nor a symlink to them.
        for never in [
            "home/.ssh",
            "state",
            "state/journal",
            "home",
            "home/keys",
            "",
        ] {
            assert!(!has(never), "{never:?} granted: {granted:?}");
        }
        assert!(!granted.iter().any(|g| g == Path::new("/")));
        // Elsewhere from `/` on, whole top-level folders are granted.
        assert!(granted.iter().any(|g| g == Path::new("/usr")));
    }
}
