//! The session note (docs/design.md §14 item 4): one note per client session under
//! `[folders] sessions` (default `Agent/Sessions/`), named after the client and the start time,
//! to which every call of the session is appended with the callouts the daemon wrote into the
//! call's own note, so a person sees in Obsidian what the agent did. Its call blocks are quoted:
//! a session note moved into `Needs_Action/` by mistake runs nothing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// A client's name as it may appear in a file name: letters, digits, `-`, `_` and spaces,
/// at most 40 characters; `agent` when nothing is left.
pub(crate) fn file_safe(name: &str) -> String {
    let kept: String = name
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' || c == ' ' {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let kept = kept.trim().trim_matches('-').to_string();
    if kept.is_empty() {
        "agent".to_string()
    } else {
        kept
    }
}

/// `2026-11-25 10-45-00`: a UTC time that sorts and is a valid file name everywhere.
pub(crate) fn session_time(at: SystemTime) -> String {
    let text = humantime::format_rfc3339_seconds(at).to_string();
    text.trim_end_matches('Z')
        .replace('T', " ")
        .replace(':', "-")
}

/// One client session's note.
pub(crate) struct Session {
    /// `Claude-Code 2026-11-25 10-45-00 3f2a91c0`: the session note's name and the prefix of its
    /// call notes' names.
    pub(crate) stem: String,
    path: PathBuf,
    /// Appends are whole entries, one at a time.
    lock: Mutex<()>,
}

impl Session {
    /// The session of `client` starting now; its note is created by the first call.
    pub(crate) fn new(folder: &Path, client: &str) -> Self {
        use std::hash::{BuildHasher, Hasher};
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        // 32 random bits: two sessions starting in the same second (100 HTTP clients at
        // once) draw the same stem about once in 10^6 such starts, and even then the call
        // notes are kept apart (`courier::send` never reuses a name).
        let stem = format!(
            "{} {} {:08x}",
            file_safe(client),
            session_time(SystemTime::now()),
            random & 0xffff_ffff
        );
        Session {
            path: folder.join(format!("{stem}.md")),
            stem,
            lock: Mutex::new(()),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one call: its time, tool, call note, outcome line, the call quoted, and what the
    /// daemon wrote below it (`added`).
    pub(crate) fn append(
        &self,
        tool: &str,
        call_note: &str,
        outcome: &str,
        call_json: &str,
        added: &str,
    ) -> std::io::Result<()> {
        let _one = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut entry = String::new();
        if !self.path.exists() {
            entry.push_str(&format!(
                "# {}\n\nCalls an agent made through `vaultd mcp serve`; each one's own note is linked. `vaultd undo --note \"{}\"` undoes the vault changes of them all.\n",
                self.stem, self.stem
            ));
        }
        let link = call_note.trim_end_matches(".md");
        entry.push_str(&format!(
            "\n## {} `{tool}`\n\n- call note: [[{link}]]\n- outcome: {outcome}\n\n",
            session_time(SystemTime::now())
        ));
        for line in format!("```json\n{call_json}\n```").lines() {
            entry.push_str("> ");
            entry.push_str(line);
            entry.push('\n');
        }
        if !added.is_empty() {
            entry.push('\n');
            entry.push_str(added);
            entry.push('\n');
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        file.write_all(entry.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_names_become_safe_file_names() {
        assert_eq!(file_safe("claude-code"), "claude-code");
        assert_eq!(file_safe("../../etc/passwd"), "etc-passwd");
        assert_eq!(file_safe("a/b\\c:d"), "a-b-c-d");
        assert_eq!(file_safe(""), "agent");
        assert_eq!(file_safe("..."), "agent");
        assert_eq!(file_safe(&"x".repeat(100)).len(), 40);
    }

    #[test]
    fn a_stamp_is_a_file_name() {
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_764_067_500);
        assert_eq!(session_time(at), "2025-11-25 10-45-00");
    }

    #[test]
    fn entries_are_appended_with_the_call_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let session = Session::new(&dir.path().join("Agent/Sessions"), "Claude Code");
        session
            .append(
                "echo",
                "s call 1.md",
                "ok",
                "{\"tool_call\": {}}",
                "> [!success]- ok",
            )
            .unwrap();
        session
            .append("echo", "s call 2.md", "REJECTED: no", "{}", "")
            .unwrap();
        let text = std::fs::read_to_string(session.path()).unwrap();
        assert!(text.starts_with(&format!("# {}\n", session.stem)), "{text}");
        assert!(session.stem.starts_with("Claude Code "));
        assert!(text.contains("[[s call 1]]") && text.contains("[[s call 2]]"));
        assert!(text.contains("> ```json\n> {\"tool_call\": {}}\n> ```\n"));
        assert!(
            !text.contains("\n```json"),
            "no call block is left unquoted"
        );
        assert!(text.contains("- outcome: REJECTED: no"));
        assert_eq!(text.matches("# Claude Code").count(), 1, "one title");
    }
}
