//! The one integration test binary: the real `vaultd` binary on temp vaults, against
//! servers on 127.0.0.1 that speak the real wire formats.

mod util;

mod approval;
mod cmark;
mod hostile;
mod limits;
mod pipeline;
mod recovery;
mod secrets;
mod service;
mod vault_tools;
