//! The seccomp filter of a sandboxed program (docs/design.md §10.5): Landlock's network rules cover
//! TCP only, so sockets are closed here. With `network = false` no `socket()` of any family
//! is created (unix by path or abstract name, UDP, TCP, raw, netlink, packet): the call
//! fails with `EACCES` ("Permission denied"), the program is not killed. `socketpair()`
//! stays allowed: a pair of connected unix sockets reaches nothing outside the program.
//! With `network = true` only the families a networked program needs (IPv4, IPv6, netlink
//! for address lookups) are left: not unix sockets, by path or abstract name, which reach
//! what runs outside the sandbox on this machine (the session bus, that can start a process
//! outside it; an ssh agent; docker's socket) and which Landlock does not close before ABI 9. `io_uring` is closed either way: its requests
//! (`IORING_OP_SOCKET`, `IORING_OP_CONNECT`, …) would run past a filter on system calls.
//! No user namespace is made (`unshare` or `clone` with `CLONE_NEWUSER`: `EPERM`): inside
//! one a program holds every capability, and reaches kernel code (mounts, netfilter, …) that
//! is otherwise root's only, a large part of the kernel's history of privilege escalations.
//! `clone3` passes its flags in memory a filter cannot read, so it is answered `ENOSYS`, as
//! by a kernel without it: libc then makes the process with `clone`, whose flags are checked
//! (systemd's `RestrictNamespaces=` does the same).
//!
//! The filter is compiled in the parent (`seccompiler`, rust-vmm); the child only installs
//! it, an allocation-free `seccomp(2)` call.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// The socket families a program with `network = true` may create (`socketpair()` of unix
/// sockets stays allowed either way: a connected pair reaches nothing outside the program).
const NETWORK_FAMILIES: &[i32] = &[libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK];

/// On x86_64 the same system calls are reachable through the x32 numbering (this bit set),
/// under the same audit arch: each denied number is denied under both.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// A compiled filter, ready for [`apply`] in the child: the sockets, kills and `io_uring`
/// it refuses with `EACCES`, the namespaces with `EPERM`, `clone3` with `ENOSYS` (a filter
/// has one answer for what it matches: three filters).
#[derive(Debug, Clone)]
pub struct Filter {
    main: BpfProgram,
    namespaces: BpfProgram,
    clone3: BpfProgram,
}

/// Compiles the filter of a program with or without `network`.
pub fn filter(network: bool) -> Result<Filter, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("seccomp: no filter for {}: {e}", std::env::consts::ARCH))?;
    let socket_rules = if network {
        // Denied when the family (argument 0) is none of the allowed ones.
        let conditions = NETWORK_FAMILIES
            .iter()
            .map(|&family| {
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, family as u64)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        vec![SeccompRule::new(conditions).map_err(|e| e.to_string())?]
    } else {
        // No rule: every socket() matches and is denied.
        Vec::new()
    };
    // `kill()` of a process group or of every process (pid 0 or negative): the program's
    // group holds its supervisor, and `kill(-1)` reaches every process of the user, vaultd
    // too. Landlock scopes signals from ABI 6; this holds where the kernel is older. A
    // program still signals its own children by their pids.
    let group_kill = vec![
        SeccompRule::new(vec![
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, 0)
                .map_err(|e| e.to_string())?,
        ])
        .map_err(|e| e.to_string())?,
        SeccompRule::new(vec![
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ge, 0x8000_0000)
                .map_err(|e| e.to_string())?,
        ])
        .map_err(|e| e.to_string())?,
    ];
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_kill, group_kill.clone());
    rules.insert(libc::SYS_socket, socket_rules.clone());
    rules.insert(libc::SYS_io_uring_setup, Vec::new());
    #[cfg(target_arch = "x86_64")]
    {
        rules.insert(libc::SYS_socket | X32_SYSCALL_BIT, socket_rules);
        rules.insert(libc::SYS_kill | X32_SYSCALL_BIT, group_kill);
        rules.insert(libc::SYS_io_uring_setup | X32_SYSCALL_BIT, Vec::new());
    }
    let compile = |rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32| {
        SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            arch,
        )
        .and_then(BpfProgram::try_from)
        .map_err(|e| format!("seccomp: the filter does not compile: {e}"))
    };
    // `clone` and `unshare` with CLONE_NEWUSER (argument 0: the flags, on x86-64 and arm64).
    let new_user = vec![
        SeccompRule::new(vec![
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(libc::CLONE_NEWUSER as u64),
                libc::CLONE_NEWUSER as u64,
            )
            .map_err(|e| e.to_string())?,
        ])
        .map_err(|e| e.to_string())?,
    ];
    let mut namespaces: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    namespaces.insert(libc::SYS_clone, new_user.clone());
    namespaces.insert(libc::SYS_unshare, new_user.clone());
    let mut clone3: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, Vec::new());
    #[cfg(target_arch = "x86_64")]
    {
        namespaces.insert(libc::SYS_clone | X32_SYSCALL_BIT, new_user.clone());
        namespaces.insert(libc::SYS_unshare | X32_SYSCALL_BIT, new_user);
        clone3.insert(libc::SYS_clone3 | X32_SYSCALL_BIT, Vec::new());
    }
    Ok(Filter {
        main: compile(rules, libc::EACCES)?,
        namespaces: compile(namespaces, libc::EPERM)?,
        clone3: compile(clone3, libc::ENOSYS)?,
    })
}

/// Installs the filter on the calling thread; runs in the child between fork and exec
/// (`no_new_privs` is already set, and is set again by seccompiler: one prctl).
pub fn apply(filter: &Filter) -> std::io::Result<()> {
    for program in [&filter.clone3, &filter.namespaces, &filter.main] {
        seccompiler::apply_filter(program).map_err(|_| rustix::io::Errno::PERM)?;
    }
    Ok(())
}

/// Whether this kernel takes a seccomp filter at all (probed on a throwaway thread, which a
/// filter binds for its life only).
pub fn probe() -> Result<(), String> {
    let f = filter(false)?;
    std::thread::spawn(move || apply(&f).map_err(|e| format!("seccomp is not available: {e}")))
        .join()
        .unwrap_or_else(|_| Err("the seccomp probe thread panicked".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, OwnedFd};

    /// `socket()` of each family fails with EACCES.
    fn denied(families: &[i32]) {
        for &family in families {
            let e = socket(family, libc::SOCK_DGRAM).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EACCES), "family {family}");
        }
    }

    /// A connected pair of unix sockets (it reaches nothing outside) is still made.
    fn a_socketpair_is_made() {
        let mut pair = [0; 2];
        // SAFETY: socketpair(2) writing two fds into a local array.
        assert_eq!(
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) },
            0
        );
    }

    fn socket(family: i32, kind: i32) -> std::io::Result<OwnedFd> {
        // SAFETY: socket(2) with plain integer arguments; the fd is owned at once.
        let fd = unsafe { libc::socket(family, kind, 0) };
        if fd < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            // SAFETY: a fresh fd that nothing else owns.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        }
    }

    /// Installs each filter on a thread of its own and tries every family there.
    #[test]
    fn no_socket_without_network_and_only_common_families_with_it() {
        let offline = filter(false).unwrap();
        std::thread::spawn(move || {
            apply(&offline).unwrap();
            denied(&[
                libc::AF_UNIX,
                libc::AF_INET,
                libc::AF_INET6,
                libc::AF_NETLINK,
                libc::AF_PACKET,
            ]);
            a_socketpair_is_made();
        })
        .join()
        .unwrap();
        let online = filter(true).unwrap();
        std::thread::spawn(move || {
            apply(&online).unwrap();
            socket(libc::AF_INET, libc::SOCK_DGRAM).unwrap();
            // Not a unix socket: by path or abstract name it reaches what runs outside.
            denied(&[libc::AF_UNIX, libc::AF_PACKET]);
            a_socketpair_is_made();
        })
        .join()
        .unwrap();
    }

    /// No user namespace, by `unshare` or by `clone`; clone3 looks absent, and a process is
    /// still made (std's spawn, libc's fork) the way libc then makes it.
    #[test]
    fn no_user_namespace_and_processes_are_still_made() {
        let filter = filter(false).unwrap();
        std::thread::spawn(move || {
            apply(&filter).unwrap();
            let errno = || std::io::Error::last_os_error().raw_os_error();
            // SAFETY: unshare(2) and clone3(2) with arguments that start nothing here.
            unsafe {
                assert_eq!(
                    (libc::unshare(libc::CLONE_NEWUSER), errno()),
                    (-1, Some(libc::EPERM))
                );
                let none = std::ptr::null::<u8>();
                assert_eq!(
                    (libc::syscall(libc::SYS_clone3, none, 0usize), errno()),
                    (-1, Some(libc::ENOSYS))
                );
            }
            // Other namespaces' flags without a user namespace are the kernel's to refuse
            // (they need capabilities); plain processes are made.
            let out = std::process::Command::new("sh")
                .args(["-c", "echo made"])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), "made\n");
            let out = std::process::Command::new("unshare")
                .args(["-U", "true"])
                .output();
            if let Ok(out) = out {
                assert!(!out.status.success(), "{out:?}");
            }
        })
        .join()
        .unwrap();
    }

    /// A program cannot signal its process group (its supervisor is in it) or every process
    /// of the user (`kill(-1)`, vaultd among them); its own children it can, by pid. Signal 0
    /// only asks whether the kill would be allowed.
    #[test]
    fn no_kill_of_a_group_or_of_everyone() {
        let filter = filter(false).unwrap();
        std::thread::spawn(move || {
            apply(&filter).unwrap();
            // SAFETY: kill(2) with signal 0 sends nothing.
            let kill = |pid: i32| unsafe {
                if libc::kill(pid, 0) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error().raw_os_error())
                }
            };
            assert_eq!(kill(-1), Err(Some(libc::EACCES)), "kill(-1)");
            assert_eq!(kill(0), Err(Some(libc::EACCES)), "kill(0)");
            // SAFETY: getpid(2) and getpgrp(2) read the caller's ids.
            let (me, group) = unsafe { (libc::getpid(), libc::getpgrp()) };
            assert_eq!(kill(-group), Err(Some(libc::EACCES)), "kill(-pgid)");
            assert_eq!(kill(me), Ok(()), "a process by its pid");
        })
        .join()
        .unwrap();
    }
}
