//! The sandbox a command tool's program runs in (docs/design.md §10.5): its own session and process
//! group, no capabilities, `no_new_privs`, rlimits, and a Landlock ruleset (read-only vault
//! and system dirs, read-write scratch dir and `writable`, no TCP unless `network = true`).
//! Rulesets are built in the parent; the child only makes async-signal-safe system calls.

use super::config::{CommandToolConfig, SandboxMode};
use crate::tools::sandbox::cgroup::Cgroups;
use crate::tools::sandbox::{paths, seccomp};
use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, PathBeneath,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetError, RulesetStatus, Scope,
    path_beneath_rules,
};
use rustix::process::{Resource, Rlimit};
use std::path::{Path, PathBuf};

/// The Landlock rights vaultd asks for (and has tested): file system rights of ABI 5, TCP
/// of ABI 4, signal and abstract-socket scoping of ABI 6. Older kernels enforce a subset.
const FS_ABI: ABI = ABI::V5;
const NET_ABI: ABI = ABI::V4;
const SCOPE_ABI: ABI = ABI::V6;

/// The lowest kernel ABI that enforces what docs/design.md §10.5 asks for: file rights including
/// truncate (ABI 3) and, without `network`, TCP (ABI 4). `sandbox = "required"` refuses less.
fn required_abi(network: bool) -> i32 {
    if network { 3 } else { 4 }
}

/// System folders every program may read and execute: its libraries, locale, certificates;
/// of `/dev` only the devices a program reads (the terminals there would give a program the
/// keystrokes typed in them, the disks every file as root, the kernel log).
const SYSTEM_DIRS: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/dev/random",
    "/dev/urandom",
    "/proc",
    "/sys",
];
/// The devices every sandboxed program (an MCP server too) may read.
pub const READABLE_DEVICES: &[&str] = &["/dev/random", "/dev/urandom"];
/// Device files a program may also write (`> /dev/null`).
const WRITABLE_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// What this kernel's Landlock does, found once at start with a throwaway thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Support {
    /// The kernel's Landlock ABI (0: none, or disabled at boot).
    pub abi: i32,
    /// Whether every right vaultd asks for was enforced in the probe.
    pub fully_enforced: bool,
    /// Why Landlock is missing, when it is.
    pub problem: Option<String>,
    /// Why the seccomp filter (the sockets Landlock leaves open) cannot be installed.
    pub seccomp_problem: Option<String>,
}

impl Support {
    /// Restricts a throwaway thread with the full ruleset (allowing everything under `/`)
    /// and reads what the kernel did. Landlock restricts only the calling thread, which ends.
    pub fn probe() -> Support {
        Support {
            seccomp_problem: seccomp::probe().err(),
            ..Support::probe_landlock()
        }
    }

    fn probe_landlock() -> Support {
        let probe = std::thread::spawn(|| -> Result<landlock::RestrictionStatus, RulesetError> {
            base_ruleset(false, CompatLevel::BestEffort)?
                .create()?
                .add_rules(path_beneath_rules(["/"], AccessFs::from_all(FS_ABI)))?
                .restrict_self()
        })
        .join();
        match probe {
            Ok(Ok(status)) => {
                let (abi, problem) = match status.landlock {
                    LandlockStatus::Available {
                        effective_abi,
                        kernel_abi,
                    } => (kernel_abi.unwrap_or_else(|| abi_number(effective_abi)), None),
                    LandlockStatus::NotEnabled => {
                        (0, Some("Landlock is built in but not enabled at boot (add `landlock` to the lsm= kernel parameter)".to_string()))
                    }
                    LandlockStatus::NotImplemented => {
                        (0, Some("this kernel has no Landlock (Linux 5.13 or newer, built with CONFIG_SECURITY_LANDLOCK)".to_string()))
                    }
                };
                Support {
                    abi,
                    fully_enforced: status.ruleset == RulesetStatus::FullyEnforced,
                    problem,
                    seccomp_problem: None,
                }
            }
            Ok(Err(e)) => Support {
                abi: 0,
                fully_enforced: false,
                problem: Some(format!("Landlock could not be set up: {e}")),
                seccomp_problem: None,
            },
            Err(_) => Support {
                abi: 0,
                fully_enforced: false,
                problem: Some("the Landlock probe thread panicked".to_string()),
                seccomp_problem: None,
            },
        }
    }

    /// Whether a tool with this `sandbox` and `network` may run here; the error says why not.
    pub fn allows(&self, mode: SandboxMode, network: bool) -> Result<(), String> {
        if mode == SandboxMode::BestEffort {
            return Ok(());
        }
        if let Some(p) = &self.seccomp_problem {
            return Err(format!(
                "sandbox = \"required\" but {p}: without it sockets other than TCP stay open; the tool is not run unsandboxed (set sandbox = \"best_effort\" to run it anyway)"
            ));
        }
        if self.abi >= required_abi(network) {
            return Ok(());
        }
        Err(match &self.problem {
            Some(p) => format!(
                "sandbox = \"required\" but {p}; the tool is not run unsandboxed (set sandbox = \"best_effort\" to run it without Landlock)"
            ),
            None => format!(
                "sandbox = \"required\" needs Landlock ABI {} or newer{}; this kernel has ABI {} (set sandbox = \"best_effort\" to run it with what the kernel enforces)",
                required_abi(network),
                if network { "" } else { " (TCP rules)" },
                self.abi
            ),
        })
    }

    /// One line for the log and `vaultd tools`.
    pub fn describe(&self) -> String {
        let seccomp = match &self.seccomp_problem {
            None => "seccomp (no sockets without `network`)".to_string(),
            Some(p) => format!("no seccomp: {p}"),
        };
        format!("{}; {seccomp}", self.describe_landlock())
    }

    fn describe_landlock(&self) -> String {
        match (&self.problem, self.fully_enforced) {
            (Some(p), _) => format!("no Landlock: {p}"),
            (None, true) => format!("Landlock ABI {}, fully enforced", self.abi),
            (None, false) => format!(
                "Landlock ABI {}, partially enforced (vaultd asks for ABI {}'s rights)",
                self.abi,
                abi_number(SCOPE_ABI)
            ),
        }
    }
}

fn abi_number(abi: ABI) -> i32 {
    match abi {
        ABI::Unsupported => 0,
        ABI::V1 => 1,
        ABI::V2 => 2,
        ABI::V3 => 3,
        ABI::V4 => 4,
        ABI::V5 => 5,
        ABI::V6 => 6,
        ABI::V7 => 7,
        ABI::V8 => 8,
        ABI::V9 => 9,
        _ => 10,
    }
}

fn base_ruleset(network: bool, level: CompatLevel) -> Result<landlock::Ruleset, RulesetError> {
    let mut ruleset = landlock::Ruleset::default()
        .set_compatibility(level)
        .handle_access(AccessFs::from_all(FS_ABI))?
        .scope(Scope::from_all(SCOPE_ABI))?;
    if !network {
        // Handled with no rule: every TCP bind and connect is denied.
        ruleset = ruleset.handle_access(AccessNet::from_all(NET_ABI))?;
    }
    Ok(ruleset)
}

/// The Landlock ruleset of one call, ready for `restrict_self` in the child. `writable`
/// and `read` are opened now, without following a symlink, and the rules are built from
/// the open fds (docs/design.md §10.5): a folder swapped for a symlink is refused, never followed.
pub fn ruleset(
    tool: &CommandToolConfig,
    vault: &Path,
    scratch: &Path,
) -> Result<RulesetCreated, RulesetBuildError> {
    let mut readable: Vec<PathBuf> = SYSTEM_DIRS.iter().map(PathBuf::from).collect();
    readable.push(vault.to_path_buf());
    // A program outside the system dirs (a script in ~/bin) may still be executed and read.
    readable.push(tool.program.clone());
    let mut opened = Vec::new();
    for rel in &tool.writable {
        let o = paths::open_beneath(vault, rel)
            .map_err(|e| RulesetBuildError::Path(format!("writable: {e}")))?;
        opened.push((o, Grant::Write));
    }
    for path in &tool.read {
        let o = paths::open_absolute(path)
            .map_err(|e| RulesetBuildError::Path(format!("read: {e}")))?;
        opened.push((o, Grant::Read));
    }
    build(Grants {
        network: tool.network,
        read_paths: readable,
        write_paths: vec![scratch.to_path_buf()],
        opened,
        read_each: Vec::new(),
    })
}

/// What a granted path may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Read and execute.
    Read,
    /// Everything: read, write, create, remove, truncate.
    Write,
}

/// Everything one sandboxed program may touch: a command tool's call or an MCP server's
/// life (docs/design.md §10.5, §10.7).
pub struct Grants {
    /// TCP (Landlock) allowed; the seccomp filter decides the other families.
    pub network: bool,
    /// Readable by path (the system dirs): opened by Landlock, symlinks followed.
    pub read_paths: Vec<PathBuf>,
    /// Writable by path (the program's own scratch dir); the devices are always added.
    pub write_paths: Vec<PathBuf>,
    /// Paths the person granted, already opened without following a symlink.
    pub opened: Vec<(paths::Opened, Grant)>,
    /// Readable, opened one at a time without following a symlink while the rules are
    /// added (a walk's many entries never hold many fds); one that cannot be opened is
    /// left out, never followed.
    pub read_each: Vec<PathBuf>,
}

/// Builds the ruleset of [`Grants`]; ready for [`enter`] in the child.
pub fn build(grants: Grants) -> Result<RulesetCreated, RulesetBuildError> {
    let read = AccessFs::from_read(FS_ABI);
    let all = AccessFs::from_all(FS_ABI);
    let writable = grants
        .write_paths
        .into_iter()
        .chain(WRITABLE_DEVICES.iter().map(PathBuf::from));
    let fd_rules = grants.opened.into_iter().map(|(opened, grant)| {
        let access = match grant {
            Grant::Read => read,
            Grant::Write => all,
        };
        let access = if opened.is_dir {
            access
        } else {
            access & AccessFs::from_file(FS_ABI)
        };
        Ok::<_, RulesetError>(PathBeneath::new(opened.fd, access))
    });
    let each_rules = grants.read_each.into_iter().filter_map(move |p| {
        let opened = paths::open_absolute(&p).ok()?;
        let access = if opened.is_dir {
            read
        } else {
            read & AccessFs::from_file(FS_ABI)
        };
        Some(Ok::<_, RulesetError>(PathBeneath::new(opened.fd, access)))
    });
    let built = || -> Result<RulesetCreated, RulesetError> {
        base_ruleset(grants.network, CompatLevel::BestEffort)?
            .create()?
            .add_rules(path_beneath_rules(grants.read_paths, read))?
            .add_rules(path_beneath_rules(writable, all))?
            .add_rules(fd_rules)?
            .add_rules(each_rules)
    };
    built().map_err(|e| RulesetBuildError::Landlock(e.to_string()))
}

/// Why a call's ruleset was not built: a granted path refused (never run, whatever the
/// `sandbox` mode), or Landlock itself (`best_effort` runs without it).
#[derive(Debug)]
pub enum RulesetBuildError {
    Path(String),
    Landlock(String),
}

/// The rlimits of one call, computed in the parent.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `None` for a program that lives as long as vaultd (an MCP server).
    pub cpu_seconds: Option<u64>,
    /// `None` when the call's cgroup bounds memory for the whole call (RLIMIT_AS, per
    /// process, also counts address space that is only reserved: it breaks node).
    pub address_space: Option<u64>,
    pub file_size: u64,
    /// `None` when the call's cgroup bounds processes, or when vaultd runs as root: the
    /// kernel never applies RLIMIT_NPROC to uid 0.
    pub processes: Option<u64>,
}

/// The largest file a program may write (RLIMIT_FSIZE): past it, SIGXFSZ.
pub const MAX_FILE_SIZE: u64 = 1024 * 1024 * 1024;

impl Limits {
    /// A program that lives as long as vaultd (an MCP server): no CPU budget, and no
    /// address-space limit (node reserves more than it uses); file size and core as for
    /// every program.
    pub fn for_server() -> Limits {
        Limits {
            cpu_seconds: None,
            address_space: None,
            file_size: MAX_FILE_SIZE,
            processes: None,
        }
    }

    pub fn for_tool(tool: &CommandToolConfig, cgroups: &Cgroups) -> Limits {
        Limits {
            // CPU seconds can only run past the wall-clock timeout with many processes;
            // the limit is a second backstop for a runaway loop.
            cpu_seconds: Some(tool.timeout.as_secs() + 1),
            address_space: (!cgroups.bounds_memory()).then_some(tool.max_memory),
            file_size: MAX_FILE_SIZE,
            processes: if cgroups.bounds_processes() {
                None
            } else {
                process_limit(tool.max_processes)
            },
        }
    }
}

/// RLIMIT_NPROC counts every task of the real user, vaultd's own threads included, so the
/// limit is the user's current count plus `max_processes`.
fn process_limit(extra: u64) -> Option<u64> {
    let uid = rustix::process::getuid();
    if uid.is_root() {
        return None;
    }
    Some(tasks_of_user(uid.as_raw()) + extra)
}

/// The number of tasks (threads) whose owner is `uid`, from /proc.
fn tasks_of_user(uid: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        if !name.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        if entry.metadata().map(|m| m.uid()).ok() != Some(uid) {
            continue;
        }
        let threads = std::fs::read_to_string(entry.path().join("status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .unwrap_or(1);
        n += threads;
    }
    n
}

/// Runs in the child between fork and exec: only system calls, no allocation on success.
/// `ruleset` is taken (restrict_self consumes it); a `required` sandbox that the kernel did
/// not enforce fails the spawn with EPERM instead of running unsandboxed.
pub fn enter(
    ruleset: &mut Option<RulesetCreated>,
    filter: Option<&seccomp::Filter>,
    limits: Limits,
    mode: SandboxMode,
) -> std::io::Result<()> {
    // The session is the supervisor's (`supervise::split`): the program stays in its group.
    let limit = |r: Resource, v: u64| {
        rustix::process::setrlimit(
            r,
            Rlimit {
                current: Some(v),
                maximum: Some(v),
            },
        )
    };
    if let Some(seconds) = limits.cpu_seconds {
        limit(Resource::Cpu, seconds)?;
    }
    if let Some(bytes) = limits.address_space {
        limit(Resource::As, bytes)?;
    }
    limit(Resource::Fsize, limits.file_size)?;
    limit(Resource::Core, 0)?;
    if let Some(n) = limits.processes {
        limit(Resource::Nproc, n)?;
    }
    drop_capabilities()?;
    rustix::thread::set_no_new_privs(true)?;
    restrict_landlock(ruleset, mode)?;
    // Every descriptor past stdio closes at exec: vaultd's own are all close-on-exec, but one
    // vaultd inherited from whatever started it (a service manager, a shell) is not, and the
    // program would get it. Best effort: a kernel before 5.11 has no close_range.
    // SAFETY: close_range(2) on integers; it touches no memory.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
    // Last: the filter denies nothing the steps above need, but it binds what runs next.
    match filter {
        Some(f) => seccomp::apply(f),
        None if mode == SandboxMode::BestEffort => Ok(()),
        None => Err(rustix::io::Errno::PERM.into()),
    }
}

/// Applies the Landlock ruleset; a `required` sandbox the kernel did not enforce is EPERM.
fn restrict_landlock(
    ruleset: &mut Option<RulesetCreated>,
    mode: SandboxMode,
) -> std::io::Result<()> {
    match ruleset.take() {
        Some(r) => match r.restrict_self() {
            Ok(status)
                if status.ruleset == RulesetStatus::NotEnforced
                    && mode == SandboxMode::Required =>
            {
                Err(rustix::io::Errno::PERM.into())
            }
            Ok(_) => Ok(()),
            Err(_) if mode == SandboxMode::BestEffort => Ok(()),
            Err(_) => Err(rustix::io::Errno::PERM.into()),
        },
        None if mode == SandboxMode::BestEffort => Ok(()),
        None => Err(rustix::io::Errno::PERM.into()),
    }
}

/// A program started by root keeps no capability, now or after exec: the bounding set is
/// emptied first (while CAP_SETPCAP is still held), then the thread's own sets.
fn drop_capabilities() -> std::io::Result<()> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    let current = rustix::thread::capabilities(None)?;
    if current.permitted.is_empty() && current.effective.is_empty() {
        return Ok(());
    }
    for cap in CapabilitySet::all().iter() {
        // EINVAL for capabilities this kernel does not know; nothing to drop then.
        let _ = rustix::thread::remove_capability_from_bounding_set(cap);
    }
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_refuses_a_kernel_without_landlock_and_best_effort_runs() {
        let none = Support {
            abi: 0,
            fully_enforced: false,
            problem: Some("this kernel has no Landlock".into()),
            seccomp_problem: None,
        };
        let err = none.allows(SandboxMode::Required, false).unwrap_err();
        assert!(err.contains("not run unsandboxed"), "{err}");
        assert!(none.allows(SandboxMode::BestEffort, false).is_ok());
        let old = Support {
            abi: 3,
            fully_enforced: false,
            problem: None,
            seccomp_problem: None,
        };
        assert!(old.allows(SandboxMode::Required, true).is_ok());
        let err = old.allows(SandboxMode::Required, false).unwrap_err();
        assert!(err.contains("ABI 4"), "{err}");
    }

    #[test]
    fn the_probe_reports_this_kernel() {
        let s = Support::probe();
        // Whatever the kernel, the probe answers and says so in one line.
        assert!(!s.describe().is_empty());
        assert_eq!(s.problem.is_none(), s.abi > 0, "{s:?}");
    }
}
