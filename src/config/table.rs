//! The vocabulary every tool source's config shares with the core: the error type, the
//! context a table is validated in, rate limits and who approves. A leaf: the tool sources
//! use it, and `config` (which assembles every source's tables) re-exports it, so no source
//! depends on the module that depends on it (docs/architecture.md).

use crate::home::expand_tilde;
use crate::secret::{Secret, SecretError};
use crate::vault::Folders;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The cause is a `#[source]` and not in the message: `{:#}` (how `main` prints errors)
    // appends it once, after a colon, and callers can still walk the chain.
    #[error("cannot read config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not TOML at all: toml's error carries the line, column and an excerpt.
    #[error("bad config {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    /// Every unknown key of the file at once, each as `file:line:column: key`.
    #[error("bad config {path}: unknown keys (a typo?):\n{}", .keys.join("\n"))]
    UnknownKeys { path: PathBuf, keys: Vec<String> },
    #[error("bad config {path}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error("bad config {path}, line {line}: key `{key}`: {message}")]
    InvalidAt {
        path: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
    #[error("bad config {path}: key `{key}`")]
    Secret {
        path: PathBuf,
        key: String,
        #[source]
        source: SecretError,
    },
    #[error(transparent)]
    State(#[from] crate::state::id::StateError),
    #[error(
        "no vault found: {looked}; pass --vault DIR, run vaultd inside a vault, or create one with `vaultd init DIR`"
    )]
    NoVault { looked: String },
    #[error("no such vault: {path} ({reason})")]
    NoSuchVault { path: PathBuf, reason: String },
}

#[derive(Debug, Default, Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    pub per_hour: Option<u32>,
    pub per_day: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateLimit {
    pub per_hour: Option<u32>,
    pub per_day: Option<u32>,
}

impl RateLimit {
    /// A `rate_limit` table replaces the tool's default as a whole: `{ per_hour = 2 }` sets
    /// no daily limit.
    pub fn from_raw(raw: Option<RawRateLimit>, default: RateLimit) -> RateLimit {
        match raw {
            None => default,
            Some(r) => RateLimit {
                per_hour: r.per_hour,
                per_day: r.per_day,
            },
        }
    }

    /// What `vaultd config` shows.
    pub fn describe(&self) -> serde_json::Value {
        serde_json::json!({ "per_hour": self.per_hour, "per_day": self.per_day })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalVia {
    /// Moving the note into `Approved/` or `Rejected/` decides.
    Folder,
    /// Only `vaultd approve` / `vaultd reject` decide; folder moves are ignored.
    Cli,
}

impl ApprovalVia {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalVia::Folder => "folder",
            ApprovalVia::Cli => "cli",
        }
    }
}

/// What a tool source needs to validate its table: the file (named in messages), the folder
/// relative paths are resolved against, the vault and its folders (which a sandbox never
/// grants), the state dir, and whether to read secrets.
pub struct TableContext<'a> {
    pub path: &'a Path,
    /// The config file's folder: relative paths in it are relative to it.
    pub base: &'a Path,
    /// The vault root: what vault tools act on and command tools read.
    pub vault: &'a Path,
    /// vaultd's own folders in the vault: no tool writes there.
    pub folders: &'a Folders,
    pub state_dir: &'a Path,
    /// Commands that run no tool keep secret references unresolved
    /// ([`crate::config::Overrides`]).
    pub skip_secrets: bool,
}

impl TableContext<'_> {
    /// A bad value: the file and the dotted key at fault.
    pub fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// A bad value read as `toml::Spanned`: the file, the line of `span` and the dotted key.
    pub fn invalid_at(
        &self,
        key: &str,
        span: std::ops::Range<usize>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::InvalidAt {
            path: self.path.to_path_buf(),
            line: line_of(self.path, span.start),
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// The secret a reference names, resolved unless `skip_secrets`.
    pub fn secret(&self, key: &str, reference: &str) -> Result<Secret, ConfigError> {
        Secret::load(reference, self.skip_secrets).map_err(|source| ConfigError::Secret {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            source,
        })
    }

    /// A path as written in the file: `~` expanded, relative to the file's folder.
    pub fn path(&self, p: &str) -> PathBuf {
        let p = expand_tilde(p);
        if p.is_relative() {
            self.base.join(p)
        } else {
            p
        }
    }
}

/// The 1-based line of byte `offset` in the config file (read again: errors are rare).
fn line_of(path: &Path, offset: usize) -> usize {
    std::fs::read(path)
        .map(|text| {
            1 + text[..offset.min(text.len())]
                .iter()
                .filter(|&&b| b == b'\n')
                .count()
        })
        .unwrap_or(0)
}
