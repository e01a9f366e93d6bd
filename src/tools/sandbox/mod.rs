//! What every sandboxed program vaultd starts shares (docs/design.md §10.5, §10.7): the seccomp
//! filter that closes the sockets Landlock does not cover, the granted paths opened without
//! following symlinks, the supervisor that ends every process of a call, and the per-call
//! cgroup that bounds them together where one can be had.

pub mod cgroup;
pub mod paths;
pub mod protect;
pub mod raw;
pub mod seccomp;
pub mod supervise;
