//! The built-in tool source: `search_web` and `send_notification`. Each tool is one module
//! that owns its `[tools.NAME]` table (as written and validated), its secrets and its policy,
//! through [`BuiltinTool`].
//!
//! # Adding a built-in tool
//!
//! One new file, `src/tools/builtin/word_of_the_day.rs`, holding the tool (a [`Tool`]), its
//! table (`Raw`: serde, `deny_unknown_fields`; `Config`: validated, a [`SecretHolder`]) and
//! `impl BuiltinTool for WordOfTheDay`; plus one line in `builtin_tools!`:
//!
//! ```text
//!             word_of_the_day: word_of_the_day::WordOfTheDay,
//! ```
//!
//! That line declares the module, adds `[tools.word_of_the_day]` to the config file (unknown
//! keys reported with file:line like every other table), registers the tool with its policy,
//! hands its secrets to the one redactor and its settings to `vaultd config`.

use crate::config::table::{ConfigError, TableContext};
use crate::secret::SecretHolder;
use crate::tools::{Policy, Registry, RegistryError, Tool};

/// The one list of built-in tools, as `table: module::Tool`: calls `$then!` with it, so the
/// config (`config::RawTools`, `config::ToolsConfig`), the modules and [`register`] are all
/// made from it.
macro_rules! builtin_tools {
    ($then:ident) => {
        $then! {
            search_web: search_web::SearchWeb,
            send_notification: send_notification::SendNotification,
            approve_tool_use: approve_tool_use::ApproveToolUse,
        }
    };
}
pub(crate) use builtin_tools;

macro_rules! declare_modules {
    ($($name:ident: $module:ident::$tool:ident),* $(,)?) => {
        $(pub mod $module;)*
    };
}
builtin_tools!(declare_modules);

mod retry;

/// What the built-in source needs from each of its tools besides [`Tool`].
pub trait BuiltinTool: Tool + Sized + 'static {
    /// `[tools.NAME]` exactly as written: serde, unknown keys refused.
    type Raw: serde::de::DeserializeOwned + Default + std::fmt::Debug;
    /// The table validated, secrets resolved: nothing downstream re-checks it.
    type Config: Clone + std::fmt::Debug + SecretHolder;

    /// Validates the table; errors name the file and the key.
    fn config(raw: Self::Raw, cx: &TableContext) -> Result<Self::Config, ConfigError>;

    /// What `vaultd config` shows of the table (secrets as their references).
    fn describe(config: &Self::Config) -> serde_json::Value;

    /// Enabled, timeout, rate limit, approval.
    fn policy(config: &Self::Config) -> Policy;

    /// The tool, ready to run; the HTTP client is shared by every tool.
    fn build(config: &Self::Config, http: reqwest::Client) -> Result<Self, RegistryError>;
}

/// Adds one built-in tool with its policy from its table (`tools::sources` adds each).
pub fn add<T: BuiltinTool>(
    config: &T::Config,
    http: reqwest::Client,
    registry: &mut Registry,
) -> Result<(), RegistryError> {
    registry.add(Box::new(T::build(config, http)?), T::policy(config))
}
