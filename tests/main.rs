//! The one integration test binary: the real `vaultd` binary on temp vaults, against
//! servers on 127.0.0.1 that speak the real wire formats.

mod util;

mod approval;
mod cli;
mod cmark;
mod command;
mod guard;
mod hostile;
mod identity;
mod in_process;
mod limits;
mod mcp;
mod pipeline;
mod recovery;
mod secrets;
mod service;
mod state;
mod synced;
mod vault_tools;
