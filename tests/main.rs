//! The one integration test binary: the real `vaultd` binary on temp vaults, against
//! servers on 127.0.0.1 that speak the real wire formats.

mod util;

mod approval;
mod cli;
mod cmark;
mod command;
mod conformance;
mod copies;
mod docs;
mod fake_searxng;
mod first_hour;
mod gateway;
mod guard;
mod hostile;
mod identity;
mod in_process;
mod limits;
mod mcp;
mod mcp_sandbox;
mod mcp_setup;
mod pipeline;
mod preview;
mod recovery;
mod reload;
mod secrets;
mod service;
mod shutdown;
mod state;
mod symlink_swap;
mod synced;
mod vault_tools;
