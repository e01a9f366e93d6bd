//! Every tool source in one place: the `[tools]` tables as written ([`RawTools`]) and
//! validated ([`ToolsConfig`]), and the registry built from them. `config` reads the file and
//! calls in here; no tool source depends on `config` (docs/architecture.md).

use crate::config::table::{ConfigError, TableContext};
use crate::secret::SecretHolder;
use crate::tools::builtin::BuiltinTool;
use crate::tools::mcp::McpSource;
use crate::tools::{Registry, RegistryError};
use serde::Deserialize;
use std::collections::BTreeMap;

/// `[tools]`, as written ([`RawTools`]) and validated ([`ToolsConfig`]): one table per built-in
/// tool, from the one list in [`crate::tools::builtin::builtin_tools`], then the command and
/// vault sources' tables, one per vault tool from [`crate::tools::vault::vault_tools`]. Each
/// built-in tool's table type is its own ([`BuiltinTool`]).
macro_rules! tools_tables {
    (
        [$($name:ident: $module:ident::$tool:ident),* $(,)?]
        $($vault_tool:ident: $vault_module:ident),* $(,)?
    ) => {
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct RawTools {
            $(
                #[serde(default)]
                pub $name: <crate::tools::builtin::$module::$tool as BuiltinTool>::Raw,
            )*
            /// `[tools.command.NAME]`, read and checked by the command tool source.
            #[serde(default)]
            pub command:
                BTreeMap<String, toml::Spanned<crate::tools::command::config::RawCommandTool>>,
            /// `[tools.vault]` and one table per vault tool: read by `tools::vault`.
            #[serde(default)]
            pub vault: crate::tools::vault::RawVault,
            $(
                #[serde(default)]
                pub $vault_tool: crate::tools::vault::RawVaultTool,
            )*
        }

        #[derive(Debug, Clone)]
        pub struct ToolsConfig {
            $(pub $name: <crate::tools::builtin::$module::$tool as BuiltinTool>::Config,)*
            pub command: crate::tools::command::config::CommandTools,
            pub vault: crate::tools::vault::VaultToolsConfig,
        }

        impl ToolsConfig {
            /// Adds every built-in tool with its policy from its table.
            fn register_builtins(
                &self,
                http: reqwest::Client,
                registry: &mut Registry,
            ) -> Result<(), RegistryError> {
                $(crate::tools::builtin::add::<crate::tools::builtin::$module::$tool>(
                    &self.$name,
                    http.clone(),
                    registry,
                )?;)*
                Ok(())
            }

            /// Each source validates its own tables.
            pub(crate) fn from_raw(
                t: RawTools,
                cx: &TableContext,
                own_folders: &[&str],
            ) -> Result<ToolsConfig, ConfigError> {
                Ok(ToolsConfig {
                    vault: crate::tools::vault::VaultToolsConfig::from_raw(
                        t.vault,
                        vec![$((stringify!($vault_tool), t.$vault_tool)),*],
                        cx,
                        own_folders,
                    )?,
                    $($name: <crate::tools::builtin::$module::$tool as BuiltinTool>::config(
                        t.$name, cx,
                    )?,)*
                    command: crate::tools::command::config::validate(t.command, cx)?,
                })
            }

            /// `vaultd config`'s `tools` object: each source describes its own tables.
            pub fn describe(&self) -> serde_json::Value {
                let mut tools = serde_json::Map::new();
                $(tools.insert(
                    stringify!($name).to_string(),
                    <crate::tools::builtin::$module::$tool as BuiltinTool>::describe(&self.$name),
                );)*
                tools.insert("vault".to_string(), self.vault.describe());
                serde_json::Value::Object(tools)
            }

            /// Every part of the `[tools]` tables that names secrets.
            pub(crate) fn secret_holders(&self) -> Vec<&dyn SecretHolder> {
                vec![$(&self.$name,)* &self.command]
            }
        }
    };
}
/// Hands the built-in tools to the vault tools' list, which hands both to `tools_tables`.
macro_rules! with_vault_tools {
    ($($builtin:tt)*) => {
        crate::tools::vault::vault_tools!(tools_tables, [$($builtin)*]);
    };
}
crate::tools::builtin::builtin_tools!(with_vault_tools);

impl Registry {
    /// Builds every tool of every source from the config: the one place a registry is made
    /// (the daemon, a reload, every command). The one HTTP client is shared so connections are
    /// reused across calls. The journal holds the vault tools' undo data; without one (listing
    /// tools, checking notes) their state changes refuse to run. `mcp`: the MCP servers'
    /// tools, from running servers or the journal's catalog ([`McpSource::none`] for none).
    pub fn from_config(
        config: &ToolsConfig,
        http: reqwest::Client,
        journal: Option<std::sync::Arc<crate::journal::Journal>>,
        mcp: &McpSource,
    ) -> Result<Registry, RegistryError> {
        let mut registry = Registry::empty();
        config.register_builtins(http, &mut registry)?;
        crate::tools::command::register(&config.command, &mut registry)?;
        crate::tools::vault::register(&config.vault, journal, &mut registry)?;
        mcp.register(&mut registry)?;
        Ok(registry)
    }
}
