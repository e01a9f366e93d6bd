//! The path policy of the vault tools (docs/design.md §11.2), in one place: what a note path from a
//! tool call may be, which notes the tools may read and write, and the one check that no
//! symlink is followed on the way.
//!
//! Decisions (docs/tools/vault.md):
//! - Paths are vault-relative, `/`-separated, end in `.md` (lower case) and are taken byte
//!   for byte: no case folding or Unicode normalization when a note is looked up, so `A.md`
//!   and `a.md` are two notes, as on Linux.
//! - A *new* name (create, move target) whose case- and accent-folded form equals an existing
//!   sibling's is a `CONFLICT`: on a case-insensitive or normalizing file system (macOS,
//!   Windows, a synced replica) the two would be one file, and a person cannot tell them
//!   apart.
//! - State folders are compared folded the same way, so `done/x.md` or an NFD spelling of a
//!   state folder is denied too.
//! - `..`, `.`, empty segments, absolute paths, drive prefixes, backslashes, control
//!   characters and percent-encoded dots, slashes and backslashes (`%2e`, `%2f`, `%5c`) are
//!   denied outright rather than interpreted.

use crate::call::{CallError, ErrorCode};
use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use std::path::{Path, PathBuf};

/// Which scope a path must be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// A note path that passed the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotePath {
    /// Vault-relative, as given (it passed every check).
    pub rel: String,
    pub abs: PathBuf,
}

/// Where the trash lives: hidden, so no tool can name it and watchers ignore it.
pub const TRASH: &str = ".trash";

#[derive(Debug, Clone)]
pub struct PathPolicy {
    root: PathBuf,
    /// State folders, folded (see [`fold`]), each split into segments.
    state_folders: Vec<Vec<String>>,
    read: GlobSet,
    write: GlobSet,
    /// The globs as configured, for messages.
    write_globs: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("key `{key}`: `{glob}` is not a glob: {message}")]
pub struct GlobError {
    pub key: String,
    pub glob: String,
    pub message: String,
}

fn compile(key: &str, globs: &[String]) -> Result<GlobSet, GlobError> {
    let mut b = GlobSetBuilder::new();
    for g in globs {
        let glob: Glob = GlobBuilder::new(g)
            .literal_separator(true)
            .build()
            .map_err(|e| GlobError {
                key: key.to_string(),
                glob: g.clone(),
                message: e.to_string(),
            })?;
        b.add(glob);
    }
    b.build().map_err(|e| GlobError {
        key: key.to_string(),
        glob: globs.join(", "),
        message: e.to_string(),
    })
}

impl PathPolicy {
    pub fn new(
        root: PathBuf,
        state_folders: &[&str],
        read: &[String],
        write: &[String],
    ) -> Result<PathPolicy, GlobError> {
        Ok(PathPolicy {
            root,
            state_folders: state_folders
                .iter()
                .map(|f| f.split('/').map(fold).collect())
                .collect(),
            read: compile("tools.vault.read", read)?,
            write: compile("tools.vault.write", write)?,
            write_globs: write.to_vec(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The whole check for a note path from a call: syntax, state folders, scope, symlinks.
    pub fn note(&self, raw: &str, access: Access) -> Result<NotePath, CallError> {
        let segments = segments(raw).map_err(|why| denied(raw, &why))?;
        let last = segments.last().copied().unwrap_or_default();
        if !last.ends_with(".md") || last.len() <= 3 {
            return Err(denied(
                raw,
                "only notes (`*.md`) can be read or written by the vault tools",
            ));
        }
        self.not_in_state_folder(raw, &segments)?;
        self.in_scope(raw, access)?;
        let abs = self.no_symlink(raw, &segments)?;
        Ok(NotePath {
            rel: raw.to_string(),
            abs,
        })
    }

    /// A folder parameter (`vault_list`, `vault_search`, `vault_tasks`): `None` or `""` is
    /// the vault root.
    pub fn folder(&self, raw: Option<&str>) -> Result<(String, PathBuf), CallError> {
        let raw = raw.unwrap_or("").trim_end_matches('/');
        if raw.is_empty() {
            return Ok((String::new(), self.root.clone()));
        }
        let segments = segments(raw).map_err(|why| denied(raw, &why))?;
        self.not_in_state_folder(raw, &segments)?;
        let abs = self.no_symlink(raw, &segments)?;
        Ok((raw.to_string(), abs))
    }

    /// For walks: may a note found at `rel` be shown? (Not hidden, not in a state folder,
    /// in the read scope.) Symlinks are skipped by the walk itself.
    pub fn listable(&self, rel: &str) -> bool {
        let Ok(segments) = segments(rel) else {
            return false;
        };
        rel.ends_with(".md")
            && !self.is_state_path(&segments)
            && self.read.is_match(rel)
            && !crate::vault::is_ignored(Path::new(rel))
    }

    /// May a change be written at `rel`? Used by `vault_undo` for recorded paths.
    pub fn writable(&self, rel: &str) -> bool {
        self.write.is_match(rel)
    }

    fn is_state_path(&self, segments: &[&str]) -> bool {
        let folded: Vec<String> = segments.iter().map(|s| fold(s)).collect();
        self.state_folders
            .iter()
            .any(|f| folded.len() >= f.len() && folded[..f.len()] == f[..])
    }

    fn not_in_state_folder(&self, raw: &str, segments: &[&str]) -> Result<(), CallError> {
        if self.is_state_path(segments) {
            return Err(denied(
                raw,
                "state folders (Needs_Action/, Done/, Approved/, …) are vaultd's own: the vault tools never read or write there",
            ));
        }
        Ok(())
    }

    fn in_scope(&self, raw: &str, access: Access) -> Result<(), CallError> {
        match access {
            Access::Read if !self.read.is_match(raw) => Err(denied(
                raw,
                "it is outside the read scope: add a matching glob to `read` in [tools.vault]",
            )),
            Access::Write if !self.write.is_match(raw) => {
                let now = if self.write_globs.is_empty() {
                    "nothing (the default: deny)".to_string()
                } else {
                    self.write_globs.join(", ")
                };
                Err(denied(
                    raw,
                    &format!(
                        "it is outside the write scope ({now}): add a matching glob to `write` in [tools.vault], e.g. write = [\"Agent/**\"]"
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// No segment of the path may be a symlink (or anything but a folder, for the parents).
    fn no_symlink(&self, raw: &str, segments: &[&str]) -> Result<PathBuf, CallError> {
        let mut at = self.root.clone();
        for (i, s) in segments.iter().enumerate() {
            at.push(s);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(denied(
                        raw,
                        &format!(
                            "`{}` is a symlink; the vault tools never follow one",
                            segments[..=i].join("/")
                        ),
                    ));
                }
                Ok(m) if i + 1 < segments.len() && !m.is_dir() => {
                    return Err(CallError::new(
                        ErrorCode::NotFound,
                        format!("`{}` is not a folder", segments[..=i].join("/")),
                    ));
                }
                Ok(_) => {}
                // The rest does not exist yet: nothing below can be a symlink.
                Err(_) => {
                    at.extend(&segments[i + 1..]);
                    break;
                }
            }
        }
        Ok(at)
    }
}

/// The path's segments, or why it is not an acceptable vault path.
fn segments(raw: &str) -> Result<Vec<&str>, String> {
    if raw.is_empty() {
        return Err("the path is empty".into());
    }
    if raw.starts_with('/') || raw.starts_with('~') {
        return Err("absolute paths are not allowed: give a path relative to the vault".into());
    }
    if raw.len() >= 2 && raw.as_bytes()[1] == b':' {
        return Err("drive prefixes are not allowed: give a path relative to the vault".into());
    }
    if raw.contains('\\') {
        return Err("backslashes are not allowed: separate folders with `/`".into());
    }
    if raw.chars().any(char::is_control) {
        return Err("control characters are not allowed in a path".into());
    }
    let lower = raw.to_ascii_lowercase();
    if ["%2e", "%2f", "%5c", "%00"]
        .iter()
        .any(|p| lower.contains(p))
    {
        return Err(
            "percent-encoded dots or slashes are not allowed: write the path plainly".into(),
        );
    }
    let segments: Vec<&str> = raw.split('/').collect();
    for s in &segments {
        match *s {
            "" => return Err("empty path segments (`//`) are not allowed".into()),
            "." | ".." => return Err("`.` and `..` are not allowed in a path".into()),
            s if s.starts_with('.') => {
                return Err(format!("hidden files and folders (`{s}`) are not allowed"));
            }
            _ => {}
        }
    }
    Ok(segments)
}

fn denied(raw: &str, why: &str) -> CallError {
    CallError::new(
        ErrorCode::PolicyDenied,
        format!("path `{raw}` is denied: {why}"),
    )
    .with_details(serde_json::json!({ "path": raw }))
}

/// A name's folded form: lower case, accents and other combining marks dropped, so names
/// that differ only in case or Unicode normalization (`é` vs `e` + U+0301) fold alike.
pub fn fold(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars().flat_map(char::to_lowercase) {
        if is_combining(c) {
            continue;
        }
        out.push(base_letter(c));
    }
    out
}

fn is_combining(c: char) -> bool {
    matches!(c as u32, 0x0300..=0x036F | 0x1AB0..=0x1AFF | 0x1DC0..=0x1DFF | 0x20D0..=0x20FF | 0xFE20..=0xFE2F)
}

/// The base letter of a precomposed Latin letter (lower case), so a precomposed `é` folds
/// like a decomposed one.
fn base_letter(c: char) -> char {
    const TABLE: &[(&str, char)] = &[
        ("àáâãäåāăą", 'a'),
        ("çćĉċč", 'c'),
        ("ďđ", 'd'),
        ("èéêëēĕėęě", 'e'),
        ("ĝğġģ", 'g'),
        ("ĥħ", 'h'),
        ("ìíîïĩīĭįı", 'i'),
        ("ĵ", 'j'),
        ("ķ", 'k'),
        ("ĺļľŀł", 'l'),
        ("ñńņňŉ", 'n'),
        ("òóôõöøōŏő", 'o'),
        ("ŕŗř", 'r'),
        ("śŝşš", 's'),
        ("ţťŧ", 't'),
        ("ùúûüũūŭůűų", 'u'),
        ("ŵ", 'w'),
        ("ýÿŷ", 'y'),
        ("źżž", 'z'),
    ];
    if c.is_ascii() {
        return c;
    }
    TABLE
        .iter()
        .find(|(set, _)| set.contains(c))
        .map_or(c, |&(_, base)| base)
}

/// An existing entry of `dir` whose name folds like `name` but is spelled differently.
pub fn look_alike(dir: &Path, name: &str) -> Option<String> {
    let want = fold(name);
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let other = e.file_name().to_string_lossy().into_owned();
        (other != name && fold(&other) == want).then_some(other)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const STATE: [&str; 8] = [
        "Needs_Action",
        "In_Progress",
        "Pending_Approval",
        "Approved",
        "Rejected",
        "Done",
        "Failed",
        "Dry_Run",
    ];

    fn policy(root: &Path) -> PathPolicy {
        PathPolicy::new(
            root.to_path_buf(),
            &STATE,
            &["**".to_string()],
            &["Agent/**".to_string()],
        )
        .unwrap()
    }

    fn code(r: Result<NotePath, CallError>) -> ErrorCode {
        r.unwrap_err().code
    }

    #[test]
    fn plain_paths_pass_and_resolve_inside_the_vault() {
        let dir = tempfile::tempdir().unwrap();
        let p = policy(dir.path());
        let n = p.note("Agent/notes/a b.md", Access::Write).unwrap();
        assert_eq!(n.abs, dir.path().join("Agent/notes/a b.md"));
        assert!(p.note("Projects/x.md", Access::Read).is_ok());
        assert!(p.note("été.md", Access::Read).is_ok());
    }

    #[test]
    fn escapes_are_denied() {
        let dir = tempfile::tempdir().unwrap();
        let p = policy(dir.path());
        for bad in [
            "../x.md",
            "Agent/../../x.md",
            "Agent/./x.md",
            "/etc/passwd.md",
            "~/x.md",
            "C:/x.md",
            "%2e%2e/x.md",
            "Agent/%2E%2E/%2e%2e/x.md",
            "Agent%2fx.md",
            "Agent\\..\\x.md",
            "Agent\\x.md",
            "Agent//x.md",
            "",
            "Agent/x\n.md",
        ] {
            for access in [Access::Read, Access::Write] {
                assert_eq!(
                    code(p.note(bad, access)),
                    ErrorCode::PolicyDenied,
                    "{bad:?}"
                );
            }
        }
    }

    #[test]
    fn hidden_segments_and_non_notes_are_denied() {
        let dir = tempfile::tempdir().unwrap();
        let p = policy(dir.path());
        for bad in [
            ".obsidian/app.md",
            "Agent/.git/x.md",
            ".trash/x.md",
            "Agent/.x.md",
            "Agent/x.txt",
            "Agent/x.MD",
            "Agent/x.md.bak",
            "Agent/.md",
            "Agent/notes",
        ] {
            assert_eq!(
                code(p.note(bad, Access::Read)),
                ErrorCode::PolicyDenied,
                "{bad}"
            );
        }
    }

    #[test]
    fn every_state_folder_is_denied_in_any_case_or_normalization() {
        let dir = tempfile::tempdir().unwrap();
        let p = PathPolicy::new(
            dir.path().to_path_buf(),
            &STATE,
            &["**".to_string()],
            &["**".to_string()],
        )
        .unwrap();
        for folder in STATE {
            for spelling in [
                folder.to_string(),
                folder.to_lowercase(),
                folder.to_uppercase(),
            ] {
                let path = format!("{spelling}/x.md");
                assert_eq!(
                    code(p.note(&path, Access::Write)),
                    ErrorCode::PolicyDenied,
                    "{path}"
                );
                assert_eq!(
                    code(p.note(&format!("{spelling}/sub/x.md"), Access::Read)),
                    ErrorCode::PolicyDenied
                );
                assert!(p.folder(Some(&spelling)).is_err());
            }
        }
        // A state folder with an accent, spelled precomposed or decomposed.
        let p = PathPolicy::new(
            dir.path().to_path_buf(),
            &["Erledigt/Fertig\u{e9}"],
            &["**".to_string()],
            &["**".to_string()],
        )
        .unwrap();
        assert_eq!(
            code(p.note("erledigt/fertige\u{301}/x.md", Access::Write)),
            ErrorCode::PolicyDenied
        );
        // Only the leading folders count: a note *named* Done elsewhere is fine.
        assert!(p.note("Agent/Done/x.md", Access::Write).is_ok());
    }

    #[test]
    fn scopes_name_the_key_to_set() {
        let dir = tempfile::tempdir().unwrap();
        let p = policy(dir.path());
        let e = p.note("Projects/x.md", Access::Write).unwrap_err();
        assert_eq!(e.code, ErrorCode::PolicyDenied);
        assert!(
            e.message.contains("`write` in [tools.vault]"),
            "{}",
            e.message
        );
        let deny_all =
            PathPolicy::new(dir.path().to_path_buf(), &STATE, &["**".into()], &[]).unwrap();
        let e = deny_all.note("Agent/x.md", Access::Write).unwrap_err();
        assert!(e.message.contains("default: deny"), "{}", e.message);
        let narrow =
            PathPolicy::new(dir.path().to_path_buf(), &STATE, &["Public/**".into()], &[]).unwrap();
        let e = narrow.note("Private/x.md", Access::Read).unwrap_err();
        assert!(e.message.contains("`read`"), "{}", e.message);
        // `*` does not cross folders; `**` does.
        let star = PathPolicy::new(dir.path().to_path_buf(), &STATE, &["*".into()], &[]).unwrap();
        assert!(star.note("top.md", Access::Read).is_ok());
        assert!(star.note("a/deep.md", Access::Read).is_err());
    }

    #[test]
    fn a_symlinked_folder_pointing_out_is_denied() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.md"), "s").unwrap();
        std::fs::create_dir(dir.path().join("Agent")).unwrap();
        symlink(outside.path(), dir.path().join("Agent/out")).unwrap();
        symlink(
            outside.path().join("secret.md"),
            dir.path().join("Agent/link.md"),
        )
        .unwrap();
        let p = policy(dir.path());
        for bad in ["Agent/out/secret.md", "Agent/out/new.md", "Agent/link.md"] {
            let e = p.note(bad, Access::Write).unwrap_err();
            assert_eq!(e.code, ErrorCode::PolicyDenied, "{bad}");
            assert!(e.message.contains("symlink"), "{}", e.message);
        }
        assert!(p.folder(Some("Agent/out")).is_err());
        // A symlinked vault-internal folder is refused as well: never followed at all.
        std::fs::create_dir(dir.path().join("Real")).unwrap();
        symlink(dir.path().join("Real"), dir.path().join("Agent/inner")).unwrap();
        assert!(p.note("Agent/inner/x.md", Access::Read).is_err());
    }

    #[test]
    fn names_differing_only_in_case_or_normalization_fold_alike() {
        assert_eq!(fold("Caf\u{e9}.md"), fold("cafe\u{301}.md"));
        assert_eq!(fold("NOTES.md"), fold("notes.md"));
        assert_ne!(fold("a.md"), fold("b.md"));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Caf\u{e9}.md"), "x").unwrap();
        assert_eq!(
            look_alike(dir.path(), "cafe\u{301}.md").as_deref(),
            Some("Caf\u{e9}.md")
        );
        assert_eq!(look_alike(dir.path(), "Caf\u{e9}.md"), None);
        // Lookups stay exact: the other spelling is simply another (missing) note.
        let p = policy(dir.path());
        let n = p.note("cafe\u{301}.md", Access::Read).unwrap();
        assert!(!n.abs.exists());
    }
}
