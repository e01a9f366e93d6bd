//! Every process a sandboxed program starts ends with it (docs/design.md §10.5): children,
//! grandchildren, a double-forked `setsid` daemon.
//!
//! The process vaultd spawns is a small supervisor, not the program. Between fork and exec
//! it makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`) and forks once more; the
//! grandchild enters the sandbox and execs the program, the supervisor never execs. Every
//! descendant the program orphans (a double fork) is re-parented to the supervisor instead
//! of init, so when the program exits — or vaultd ends the call by closing the supervisor's
//! control pipe (timeout, a dropped call, vaultd's own exit, even `kill -9`) — the
//! supervisor kills each of its children until it has none, then exits with the program's
//! status. No process of the call is left to hold stdout open or outlive vaultd.
//!
//! The supervisor runs in a copy of vaultd's memory after `fork` in a threaded process, so
//! it only makes raw system calls into stack buffers: no allocation, no locks (the same rule
//! as any `pre_exec` code). It is outside the program's Landlock domain, so with Landlock
//! ABI 6 (signal scoping) the program cannot signal or trace it; where the kernel is older, a
//! program that kills the supervisor first leaves its own orphans to init (a per-call
//! cgroup, where one can be had, still ends them: [`super::cgroup`]).

use std::os::fd::RawFd;

/// Runs in the child between fork and exec. Returns in the grandchild, which goes on to
/// enter the sandbox and exec the program; in the supervisor it never returns.
///
/// `control` is the read end of a pipe whose write end vaultd holds for the call: its
/// closing ends the call. `cgroup_procs` are open `cgroup.procs` files of the call's
/// cgroups, joined first so that every process of the call is in them.
///
/// # Safety
/// Only between fork and exec in the child (the contract of `CommandExt::pre_exec`).
pub unsafe fn split(control: RawFd, cgroup_procs: &[RawFd]) -> std::io::Result<()> {
    // SAFETY (whole function): raw system calls on integers and stack buffers.
    unsafe {
        if libc::setsid() < 0 {
            return Err(std::io::Error::last_os_error());
        }
        for &fd in cgroup_procs {
            // "0" is the writing process; its children are born inside.
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let supervisor = libc::getpid();
        match libc::fork() {
            -1 => Err(std::io::Error::last_os_error()),
            0 => {
                // The program dies with its supervisor, whoever kills that.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
                    || libc::getppid() != supervisor
                {
                    libc::_exit(127);
                }
                Ok(())
            }
            program => supervise(program, control),
        }
    }
}

/// A pipe whose ends close on exec: the supervisor (which never execs) keeps the read end.
pub fn control_pipe() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) writing two fds into a local array, owned at once below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: two fresh fds that nothing else owns.
    Ok(unsafe {
        {
            use std::os::fd::FromRawFd;
            (
                std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            )
        }
    })
}

/// The supervisor's whole life: wait for the program or the end of the call, kill what is
/// left, exit as the program did.
unsafe fn supervise(program: libc::pid_t, control: RawFd) -> ! {
    // SAFETY (whole function): raw system calls on integers and stack buffers.
    unsafe {
        // vaultd's signal handlers (tokio's self-pipe) must not run here.
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        // A polite stop sent to the whole group (an MCP server's SIGTERM, systemd's stop)
        // is for the program: the supervisor outlives it to kill what the program leaves.
        // It ends by its pipe, or by SIGKILL.
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(sig, libc::SIG_IGN);
        }
        // Keep only the control pipe: the program has its own stdout and stderr, and the
        // exec-error pipe of the spawn (or any other call's pipe) must close with them.
        close_all_but(control);
        let pidfd = libc::syscall(libc::SYS_pidfd_open, program, 0) as RawFd;
        let mut status = 0;
        if pidfd >= 0 {
            loop {
                let mut fds = [
                    libc::pollfd {
                        fd: pidfd,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: control,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                if libc::poll(fds.as_mut_ptr(), 2, -1) < 0 {
                    continue; // EINTR
                }
                if fds[0].revents != 0 {
                    break;
                }
                if fds[1].revents != 0 {
                    // vaultd ended the call (or ended itself): the program goes first.
                    libc::kill(program, libc::SIGKILL);
                    break;
                }
            }
        }
        // Without pidfd_open (Linux < 5.3) the supervisor only follows the program; vaultd
        // then kills the process group when a call ends early.
        while libc::waitpid(program, &mut status, 0) < 0 && *libc::__errno_location() == libc::EINTR
        {
        }
        kill_every_child();
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

/// Closes every fd but `keep` (close_range, or one by one on kernels before 5.9).
unsafe fn close_all_but(keep: RawFd) {
    // SAFETY: close(2) on fds this process owns alone (it is a fork that never execs).
    unsafe {
        let keep = keep as libc::c_uint;
        let close_range = |first: libc::c_uint, last: libc::c_uint| {
            libc::syscall(libc::SYS_close_range, first, last, 0) == 0
        };
        let low = keep == 0 || close_range(0, keep - 1);
        let high = close_range(keep + 1, libc::c_uint::MAX);
        if !(low && high) {
            for fd in 0..4096 {
                if fd != keep as RawFd {
                    libc::close(fd);
                }
            }
        }
    }
}

/// Kills every child of this process (as the subreaper: every descendant the program left)
/// until there is none. A child that forks meanwhile leaves an orphan that is re-parented
/// here and found by the next round.
unsafe fn kill_every_child() {
    // SAFETY (whole function): raw system calls on integers and stack buffers.
    unsafe {
        let me = libc::getpid();
        let mut idle_rounds = 0;
        let mut status = 0;
        loop {
            // Reap what died; no child left means no descendant left. Asked before /proc is
            // read: a program that left nothing behind (the common case) costs no scan of
            // every process on the machine (~1 ms of a command call, BENCHMARKS.md).
            loop {
                let r = libc::waitpid(-1, &mut status, libc::WNOHANG);
                if r > 0 {
                    continue;
                }
                if r < 0 && *libc::__errno_location() == libc::ECHILD {
                    return;
                }
                break;
            }
            let killed = for_each_child(me, |pid| {
                libc::kill(pid, libc::SIGKILL);
            });
            if killed == 0 {
                // Children exist that /proc does not show (yet): wait a little, a bounded
                // number of times, rather than spin or hang.
                idle_rounds += 1;
                if idle_rounds > 500 {
                    return;
                }
                let pause = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 10_000_000,
                };
                libc::nanosleep(&pause, std::ptr::null_mut());
            } else {
                // At least one was killed: wait for one death before looking again.
                libc::waitpid(-1, &mut status, 0);
            }
        }
    }
}

/// Calls `f` with the pid of each process whose parent is `parent`, from /proc (the
/// `children` file needs CONFIG_PROC_CHILDREN, which many kernels lack). Returns how many.
unsafe fn for_each_child(parent: libc::pid_t, mut f: impl FnMut(libc::pid_t)) -> usize {
    // SAFETY (whole function): raw system calls into stack buffers.
    unsafe {
        let dir = libc::open(
            c"/proc".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if dir < 0 {
            return 0;
        }
        let mut found = 0;
        let mut buf = [0u8; 4096];
        loop {
            let n = libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len());
            if n <= 0 {
                break;
            }
            let mut at = 0usize;
            while at < n as usize {
                // struct linux_dirent64 { u64 ino; i64 off; u16 reclen; u8 type; char name[] }
                let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
                let name = &buf[at + 19..at + reclen];
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                at += reclen;
                let Some(pid) = parse_pid(name) else { continue };
                if parent_of(pid) == Some(parent) {
                    f(pid);
                    found += 1;
                }
            }
        }
        libc::close(dir);
        found
    }
}

fn parse_pid(name: &[u8]) -> Option<libc::pid_t> {
    if name.is_empty() || name.len() > 9 || !name.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        name.iter()
            .fold(0, |n, &d| n * 10 + (d - b'0') as libc::pid_t),
    )
}

/// The parent pid of `pid`, from `/proc/PID/stat` ("pid (comm) state ppid …"; `comm` may
/// hold spaces and parentheses, so the last `)` is the anchor).
unsafe fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let mut path = [0u8; 32];
    let mut len = 0;
    for &b in b"/proc/" {
        path[len] = b;
        len += 1;
    }
    let mut digits = [0u8; 10];
    let mut n = pid;
    let mut d = 0;
    loop {
        digits[d] = b'0' + (n % 10) as u8;
        d += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    while d > 0 {
        d -= 1;
        path[len] = digits[d];
        len += 1;
    }
    for &b in b"/stat" {
        path[len] = b;
        len += 1;
    }
    let mut stat = [0u8; 512];
    // SAFETY: open/read/close into stack buffers; `path` ends with a zero byte.
    let n = unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, stat.as_mut_ptr().cast(), stat.len());
        libc::close(fd);
        n
    };
    if n <= 0 {
        return None;
    }
    parse_ppid(&stat[..n as usize])
}

/// The ppid field of a `/proc/PID/stat` line.
fn parse_ppid(stat: &[u8]) -> Option<libc::pid_t> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    // ") S 1234 …"
    let mut fields = stat[close + 1..]
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty());
    fields.next()?;
    parse_pid(fields.next()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_past_a_hostile_command_name() {
        assert_eq!(parse_ppid(b"42 (a) b) (c) S 17 42 42 0"), Some(17));
        assert_eq!(parse_ppid(b"42 (sh) R 1 1 1"), Some(1));
        assert_eq!(parse_ppid(b"garbage"), None);
        assert_eq!(parse_pid(b"12a"), None);
        // SAFETY: reads /proc into stack buffers.
        assert_eq!(
            unsafe { parent_of(std::process::id() as i32) },
            Some(unsafe { libc::getppid() })
        );
    }
}
