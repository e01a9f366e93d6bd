//! A state folder swapped for a symlink while the daemon runs (docs/design.md §9.13): the moves refuse
//! to go through it (`beneath.rs`), and this pauses claiming with one clear error until the
//! folders are real folders again, then resumes by itself (the periodic rescan picks up what
//! arrived meanwhile).

use super::{Daemon, DaemonError};
use crate::vault::VaultError;
use std::sync::Mutex;

/// Why claiming is paused, if it is: the refused folder.
#[derive(Default)]
pub(crate) struct FolderPause {
    why: Mutex<Option<String>>,
}

impl Daemon {
    /// Pauses claiming when `e` is a move refused because a folder on the way is a symlink
    /// (logged once, as an error); true if it was one.
    pub(crate) fn pause_if_symlinked(&self, e: &VaultError) -> bool {
        if !e.is_symlink_refusal() {
            return false;
        }
        let mut why = self
            .folder_pause
            .why
            .lock()
            .expect("folder pause lock poisoned");
        if why.is_none() {
            let message = e.to_string();
            tracing::error!(
                "claiming paused: {message}. Notes stay where they are in the vault; put the real folder back in place of the symlink, and claiming resumes by itself"
            );
            *why = Some(message);
        }
        true
    }

    /// [`pause_if_symlinked`](Self::pause_if_symlinked) for a note task's error.
    pub(crate) fn pause_if_symlinked_error(&self, e: &DaemonError) -> bool {
        matches!(e, DaemonError::Vault(v) if self.pause_if_symlinked(v))
    }

    /// False while claiming is paused for a symlinked state folder; while paused, each call
    /// looks at the folders again and resumes once every one is a real folder in the vault.
    pub(crate) fn folders_safe(&self) -> bool {
        let mut why = self
            .folder_pause
            .why
            .lock()
            .expect("folder pause lock poisoned");
        if why.is_none() {
            return true;
        }
        if self.vault.refuse_symlinked_folders().is_err() {
            return false;
        }
        tracing::info!("the state folders are real folders again: claiming resumes");
        *why = None;
        true
    }
}
