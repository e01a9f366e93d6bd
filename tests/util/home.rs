//! A newcomer's machine: a temp HOME with a vault made by `vaultd init`, and `vaultd` run
//! the way a person types it (from a folder inside the vault, no --vault, no --config).

use super::bin;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub struct Home {
    pub dir: tempfile::TempDir,
    /// `$HOME`.
    pub home: PathBuf,
    /// `~/Notes`, made by `vaultd init`.
    pub vault: PathBuf,
}

impl Home {
    /// A temp HOME with `vaultd init ~/Notes` done.
    pub fn with_vault() -> Home {
        let h = Home::empty();
        let out = h.vaultd_in(&h.home, &["init", "Notes"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        h
    }

    /// A temp HOME and nothing else.
    pub fn empty() -> Home {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().canonicalize().unwrap().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let vault = home.join("Notes");
        Home { dir, home, vault }
    }

    /// `vaultd ARGS` with its environment reduced to this HOME, run in `cwd`.
    pub fn command_in(&self, cwd: &Path) -> Command {
        let mut c = Command::new(bin());
        c.current_dir(cwd);
        c.env("HOME", &self.home);
        for var in [
            "VAULTD_CONFIG",
            "XDG_CONFIG_HOME",
            "XDG_STATE_HOME",
            "XDG_DATA_HOME",
            "NOTIFY_SOCKET",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "CREDENTIALS_DIRECTORY",
            "STATE_DIRECTORY",
            "CONFIGURATION_DIRECTORY",
            "JOURNAL_STREAM",
        ] {
            c.env_remove(var);
        }
        c.env("RUST_LOG", "info");
        c.stdin(Stdio::null());
        c
    }

    pub fn vaultd_in(&self, cwd: &Path, args: &[&str]) -> Output {
        self.command_in(cwd)
            .args(args)
            .output()
            .expect("run vaultd")
    }

    /// `vaultd ARGS` run from the vault root.
    pub fn vaultd(&self, args: &[&str]) -> Output {
        self.vaultd_in(&self.vault, args)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.vault.join(rel)
    }

    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A config file in HOME (outside the vault), for `--config`: its path.
    pub fn config_file(&self, name: &str, text: &str) -> String {
        let p = self.home.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// The default outbox of the file transport: `<state_dir>/outbox`, the state dir being
    /// `~/.local/state/vaultd/<vault id>` (docs/design.md §9.11).
    pub fn outbox(&self) -> Vec<PathBuf> {
        self.outbox_of(&self.vault)
    }

    /// The default outbox of the vault at `vault`.
    pub fn outbox_of(&self, vault: &Path) -> Vec<PathBuf> {
        let dir = self.state_dir_of(vault).join("outbox");
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// `~/.local/state/vaultd`: where the per-vault state dirs are (and the shared one was).
    pub fn state_base(&self) -> PathBuf {
        self.home.join(".local/state/vaultd")
    }

    /// The default state dir of the vault at `vault`, named by the id it keeps in
    /// `.vaultd/id` (made by the first command that needed it).
    pub fn state_dir_of(&self, vault: &Path) -> PathBuf {
        let id = std::fs::read_to_string(vault.join(".vaultd/id"))
            .unwrap_or_else(|e| panic!("{}: no vault id: {e}", vault.display()));
        self.state_base().join(id.trim())
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A note holding one email call.
pub fn email_note(recipient: &str) -> String {
    format!(
        "# Report\n\n```json\n{{\"tool_call\": {{\"name\": \"send_notification\", \"parameters\": {{\"recipient\": \"{recipient}\", \"subject\": \"Report\", \"body\": \"Done.\"}}}}}}\n```\n"
    )
}
