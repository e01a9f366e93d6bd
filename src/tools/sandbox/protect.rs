//! What a sandboxed program may never be granted (docs/design.md §10.5, §10.7): the vault root, a
//! state folder, a hidden path, vaultd's state dir, the config file, and the person's keys
//! and credentials (`~/.ssh`, `~/.gnupg`, cloud and registry tokens). Checked when the config
//! is read, with the entry and the reason in the error; the paths are opened again, without
//! following a symlink, each time a program starts.

use std::path::{Component, Path, PathBuf};

/// Paths under the home directory that hold keys, tokens or passwords: never readable by a
/// sandboxed program, whatever else it may read.
const HOME_SECRETS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials.toml",
    ".cargo/credentials",
    ".password-store",
    ".pki",
    ".mozilla",
    ".local/share/keyrings",
    ".config/gcloud",
    ".config/gh",
    ".config/vaultd",
    ".config/google-chrome",
    ".config/chromium",
];

/// System files only root reads: a server run by root (capabilities dropped, uid kept) would
/// otherwise still read them.
const SYSTEM_SECRETS: &[&str] = &["/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh"];

/// What `writable` and `read` may never name.
pub struct Protected<'a> {
    pub vault: &'a Path,
    pub state_dir: &'a Path,
    pub config: &'a Path,
    pub folders: &'a crate::vault::Folders,
}

impl Protected<'_> {
    /// Every path a sandboxed program may not read: the state dir, the config (and its
    /// folder when it is vaultd's own), systemd's credentials, the person's secrets. Real
    /// paths where they exist, so that a walk of the real tree finds them.
    pub fn secret_paths(&self) -> Vec<PathBuf> {
        let home = crate::home::expand_tilde("~");
        let mut out = vec![self.state_dir.to_path_buf(), self.config.to_path_buf()];
        if let Some(dir) = self.config.parent()
            && dir.file_name().is_some_and(|n| n == "vaultd")
        {
            out.push(dir.to_path_buf());
        }
        if let Some(creds) = std::env::var_os("CREDENTIALS_DIRECTORY") {
            out.push(PathBuf::from(creds));
        }
        out.extend(HOME_SECRETS.iter().map(|s| home.join(s)));
        out.extend(SYSTEM_SECRETS.iter().map(PathBuf::from));
        // vaultd's own first: an error names the state dir or the config before a key file.
        let real: Vec<PathBuf> = out.iter().filter_map(|p| p.canonicalize().ok()).collect();
        out.extend(real);
        let mut seen = std::collections::HashSet::new();
        out.retain(|p| seen.insert(p.clone()));
        out
    }

    /// A `writable` entry of a command tool as a vault-relative folder, checked now (it is
    /// opened again at every call: a folder swapped for a symlink later is refused then).
    pub fn check_writable(&self, folder: &str) -> Result<PathBuf, String> {
        let mut rel = PathBuf::new();
        for c in Path::new(folder).components() {
            match c {
                Component::CurDir => {}
                Component::Normal(n) => {
                    if n.to_string_lossy().starts_with('.') {
                        return Err(format!(
                            "`{folder}` is a hidden path (.obsidian, .git, the state dir, the config live there); name a visible folder"
                        ));
                    }
                    rel.push(n);
                }
                _ => {
                    return Err(format!(
                        "`{folder}` must be a folder relative to the vault, without `..`"
                    ));
                }
            }
        }
        if rel.as_os_str().is_empty() {
            return Err(format!(
                "`{folder}` names the vault root: the program could rewrite every note and the config; name a folder inside it"
            ));
        }
        self.check_in_vault(folder, &rel)?;
        let abs = self.vault.join(&rel);
        if self.state_dir.starts_with(&abs) || abs.starts_with(self.state_dir) {
            return Err(format!("`{folder}` holds vaultd's state dir"));
        }
        if self.config.starts_with(&abs) {
            return Err(format!("`{folder}` holds the config file"));
        }
        // The same by real paths: a config reached through a symlinked folder is still it.
        self.check_not_secret(folder, &abs)?;
        match super::paths::open_beneath(self.vault, &rel) {
            Ok(o) if o.is_dir => Ok(rel),
            Ok(_) => Err(format!(
                "`{folder}` is not a folder in the vault ({})",
                abs.display()
            )),
            Err(e) => Err(format!("{e} (in the vault, {})", self.vault.display())),
        }
    }

    /// A vault-relative path must not be in a state folder, nor hold one: a program writing
    /// there could approve or start calls. Compared component by component, so a nested state
    /// folder (`approved = "Inbox/Approved"`) is found under `Inbox` too.
    fn check_in_vault(&self, entry: &str, rel: &Path) -> Result<(), String> {
        match self.folders.state_names().into_iter().find(|s| {
            let state = Path::new(s);
            rel.starts_with(state) || state.starts_with(rel)
        }) {
            Some(state) => Err(format!(
                "`{entry}` is in or holds the state folder `{state}/`: a program writing there could approve or start calls; name another folder"
            )),
            None => Ok(()),
        }
    }

    /// A `read` entry as an absolute path (`~` expanded, relative to the config's folder).
    pub fn check_read(&self, entry: &str, base: &Path) -> Result<PathBuf, String> {
        let p = absolute(entry, base)?;
        self.check_not_secret(entry, &p)?;
        super::paths::open_absolute(&p).map_err(|e| e.to_string())?;
        Ok(p)
    }

    /// An MCP server's `writable` entry (docs/design.md §10.7): an absolute path (`~` expanded,
    /// relative to the config's folder) to a folder or file that exists, that holds no
    /// secret and is in none, and is neither the vault root, a folder holding it, nor in a
    /// state folder.
    pub fn check_writable_anywhere(&self, entry: &str, base: &Path) -> Result<PathBuf, String> {
        let p = absolute(entry, base)?;
        let real_vault = self
            .vault
            .canonicalize()
            .unwrap_or_else(|_| self.vault.to_path_buf());
        for vault in [self.vault, real_vault.as_path()] {
            if vault.starts_with(&p) {
                return Err(format!(
                    "`{entry}` holds the vault root: the program could rewrite every note and start or approve calls; name a folder inside it"
                ));
            }
            if let Ok(rel) = p.strip_prefix(vault) {
                self.check_in_vault(entry, rel)?;
            }
        }
        self.check_not_secret(entry, &p)?;
        super::paths::open_absolute(&p).map_err(|e| match e {
            super::paths::PathError::Io { source, .. }
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                format!(
                    "`{entry}` does not exist ({}); create it first (a file the server writes, e.g. a memory file: `touch` it)",
                    p.display()
                )
            }
            other => other.to_string(),
        })?;
        Ok(p)
    }

    fn check_not_secret(&self, entry: &str, p: &Path) -> Result<(), String> {
        let real = p.canonicalize().ok();
        let secrets = self.secret_paths();
        let hit = secrets.iter().find(|s| {
            std::iter::once(p)
                .chain(real.as_deref())
                .any(|p| s.starts_with(p) || p.starts_with(s))
        });
        match hit {
            Some(s) => Err(format!(
                "`{entry}` would let the program reach {} (the state dir, the config and keys such as ~/.ssh are never granted); name a narrower folder",
                s.display()
            )),
            None => Ok(()),
        }
    }
}

/// `~` expanded, a relative path taken from `base`; `..` refused.
fn absolute(entry: &str, base: &Path) -> Result<PathBuf, String> {
    let p = crate::home::expand_tilde(entry);
    let p = if p.is_relative() { base.join(p) } else { p };
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(format!("`{entry}` must not contain `..`"));
    }
    Ok(p)
}
