//! vaultd turns an Obsidian-style markdown vault into a safe tool-calling loop.
//!
//! ```text
//!  Needs_Action/ ──watch/scan──▶ daemon::intake (settle, queue, note slot)
//!                                      │
//!                        daemon::claim (rename into In_Progress, identity)
//!                                      │
//!   journal facts ──▶ pipeline::plan (pure: parse ─▶ ValidCall ─▶ policy, approval, budget)
//!                                      │
//!                     pipeline::execute ─▶ runner (permit, rate limit, start record, timeout)
//!                                      │        results in call order; every claim, start,
//!                                      │        outcome and move recorded in the journal
//!          pipeline::next_state: append callouts + frontmatter (atomic write), then
//!          move ─▶ Done/ | Failed/ | Pending_Approval/
//! ```
//!
//! # Layout
//! - [`cli`]: the command line.
//! - [`config`]: TOML -> validated `Config`.
//! - [`secret`]: secret references and the redactor.
//! - [`home`]: `~` in paths a person writes.
//! - [`private`]: files vaultd keeps for itself: 0600/0700, never through a symlink.
//! - [`call`]: error codes, results: the shared vocabulary.
//! - [`note`]: parse, render, atomic write of one note.
//! - [`vault`]: folders, states, moves, ignore rules.
//! - [`beneath`]: paths below the vault root resolved without following symlinks.
//! - [`watch`]: filesystem events into a bounded channel.
//! - [`background`]: the threads behind a note (the watcher's, the flusher) never preempt it.
//! - [`runner`]: one call under permit, timeout, rate limit and policy.
//! - [`results`]: results too big for a note, saved to `Tool_Results/`.
//! - [`journal`]: the SQLite record of every claim, call and move.
//! - [`state`]: one state dir per vault, named by the id kept in the vault; the journal opened for its vault.
//! - [`tools`]: the registry and the tool sources (built-in, MCP servers).
//! - [`arrivals`]: notes renamed in are claimed at once by hard link; their first name goes after `moved_in_grace`.
//! - [`daemon`]: run, supervise and drain; intake and settle, the claim, recovery.
//! - [`pipeline`]: one claimed note: plan its calls (pure), execute them, write back, move it on.
//! - [`guard`]: dry run, note budget, circuit breaker, hold alerts, untrusted text.
//! - [`approval`]: `vaultd approve` / `vaultd reject`, decisions bound to parameters.

pub mod approval;
pub mod arrivals;
pub mod background;
pub mod beneath;
pub mod call;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod files;
pub mod gateway;
pub mod guard;
pub mod home;
pub mod journal;
pub mod note;
pub mod pipeline;
pub mod private;
pub mod recent;
pub mod results;
pub mod runner;
pub mod secret;
pub mod state;
pub mod synced;
#[cfg(test)]
mod test_hooks;
pub mod tools;
pub mod vault;
pub mod watch;
