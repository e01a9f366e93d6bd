//! `vaultd init DIR`: a new vault with its folders, a commented config and a welcome note.

use crate::config;
use anyhow::{Context, Result};
use std::path::Path;

const INIT_CONFIG: &str = include_str!("../init_config.toml");
const WELCOME_NOTE: &str = include_str!("../welcome.md");

pub(super) fn init(dir: &Path) -> Result<i32> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let folders = config::Folders::default();
    let vault = crate::vault::Vault::new(dir.to_path_buf(), folders);
    vault.prepare()?;
    let config_path = dir.join(".vaultd.toml");
    let mut created = Vec::new();
    if std::fs::symlink_metadata(&config_path).is_err() {
        // §9.5: the config may name secrets' files; private whatever the umask.
        use std::io::Write;
        crate::private::create_new_file(&config_path)
            .and_then(|mut f| f.write_all(INIT_CONFIG.as_bytes()))
            .with_context(|| format!("cannot write {}", config_path.display()))?;
        created.push(config_path.display().to_string());
    }
    let welcome = vault
        .folder(crate::vault::State::NeedsAction)
        .join("Welcome.md");
    // Welcome.md is written only into a fresh vault: once processed it lives in Done/.
    let any_note = crate::vault::State::ALL
        .iter()
        .any(|s| !vault.scan(*s).is_empty());
    if !any_note {
        std::fs::write(&welcome, WELCOME_NOTE)?;
        created.push(welcome.display().to_string());
    }
    if created.is_empty() {
        println!(
            "{} is already a vaultd vault; nothing changed",
            dir.display()
        );
    } else {
        for c in created {
            println!("created {c}");
        }
        println!(
            "next: cd {} && vaultd once   (or `vaultd run` for the daemon; inside the vault no --vault is needed)",
            shell_quote(&dir.display().to_string())
        );
    }
    Ok(0)
}

pub(super) fn shell_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-~".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}
