//! Every process a sandboxed program starts ends with it (docs/design.md §10.5): children,
//! grandchildren, a double-forked `setsid` daemon.
//!
//! The process vaultd spawns is a small supervisor, not the program. Between fork and exec
//! it makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`) and starts the program in a
//! process of its own; the supervisor never execs. Every descendant the program orphans (a
//! double fork) is re-parented to the supervisor instead of init, so when the program exits
//! — or vaultd ends the call by closing the supervisor's control pipe (timeout, a dropped
//! call, vaultd's own exit, even `kill -9`) — the supervisor kills each of its children
//! until it has none, then exits with the program's status. No process of the call is left
//! to hold stdout open or outlive vaultd.
//!
//! The program's process is made with `clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn`
//! does: it shares the supervisor's memory (no copy of vaultd's page tables, the cost of a
//! second `fork` of a large threaded process: BENCHMARKS.md, issue 27) and runs on a stack
//! of its own, mapped by vaultd before the first fork ([`Program`]); the supervisor is
//! suspended until the program execs or exits. Before it execs, the program's process
//! asks for `SIGKILL` when its supervisor dies, resets vaultd's signal handlers, enters the
//! sandbox (the caller's `enter`: rlimits, capabilities, Landlock, seccomp) and sets the
//! environment made before the fork; a step that fails, or the exec, leaves its errno in
//! the supervisor's memory, and the supervisor returns it as the spawn's error (std's
//! exec-error pipe then carries it to vaultd, as for any `pre_exec` error).
//!
//! The supervisor runs in a copy of vaultd's memory after `fork` in a threaded process, so
//! it only makes raw system calls into stack buffers and memory made before the fork: no
//! allocation, no locks (the same rule as any `pre_exec` code), and so does the program's
//! process before its exec. The supervisor is outside the program's Landlock domain, so
//! with Landlock ABI 6 (signal scoping) the program cannot signal or trace it; where the
//! kernel is older, a program that kills the supervisor first leaves its own orphans to
//! init (a per-call cgroup, where one can be had, still ends them: [`super::cgroup`]).

use std::ffi::{CString, OsStr, c_char, c_int, c_void};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicI32, Ordering};

/// The stack of the program's process until its exec: the sandbox entry and libc's
/// `execvp` (which searches `PATH` in buffers on the stack) run on it.
const STACK_SIZE: usize = 256 * 1024;

/// What the program's process needs after the first fork, made before it: the program,
/// argv and environment as C strings with their pointer arrays, and a stack of its own.
/// Owned by the `pre_exec` closure; in vaultd it is dropped with the `Command`.
pub struct Program {
    program: CString,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    /// What `argv` and `envp` point into (heap buffers that never move).
    _strings: Vec<CString>,
    stack: Stack,
}

// SAFETY: the pointers point into `_strings`, owned and never changed; nothing is shared
// but read-only C strings and a stack mapping used only by the program's process.
unsafe impl Send for Program {}
// SAFETY: as above; `&Program` gives no way to write.
unsafe impl Sync for Program {}

impl Program {
    /// The program (a path, or a name looked up in the `PATH` of `env`, as `execvp` does
    /// with std's `Command`), its argv (`argv0` first) and its whole environment. Later
    /// entries of `env` replace earlier ones with the same name, as `Command::env` does.
    /// A nul byte is refused with std's own error.
    pub fn new<A, E, K, V>(
        program: &OsStr,
        argv0: &OsStr,
        args: A,
        env: E,
    ) -> std::io::Result<Program>
    where
        A: IntoIterator,
        A::Item: AsRef<OsStr>,
        E: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let c = |s: &[u8]| {
            CString::new(s).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "nul byte found in provided data",
                )
            })
        };
        let mut vars = std::collections::BTreeMap::new();
        for (k, v) in env {
            vars.insert(k.as_ref().to_os_string(), v.as_ref().to_os_string());
        }
        let mut argv_strings = vec![c(argv0.as_bytes())?];
        for a in args {
            argv_strings.push(c(a.as_ref().as_bytes())?);
        }
        let mut env_strings = Vec::with_capacity(vars.len());
        for (k, v) in &vars {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            env_strings.push(c(&kv)?);
        }
        let pointers = |strings: &[CString]| {
            strings
                .iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        let argv = pointers(&argv_strings);
        let envp = pointers(&env_strings);
        argv_strings.extend(env_strings);
        Ok(Program {
            program: c(program.as_bytes())?,
            argv,
            envp,
            _strings: argv_strings,
            stack: Stack::new()?,
        })
    }
}

/// An anonymous mapping with a guard page at its low end (the stack grows down into it).
struct Stack {
    base: *mut c_void,
    len: usize,
}

impl Stack {
    fn new() -> std::io::Result<Stack> {
        // SAFETY: sysconf(3) reads a constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let len = STACK_SIZE + page;
        // SAFETY: a fresh private mapping, owned by the returned value and unmapped by it.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            let stack = Stack { base, len };
            if libc::mprotect(base, page, libc::PROT_NONE) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(stack)
        }
    }

    /// The highest address: where a downward-growing stack starts (page aligned).
    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// What the program's process is handed: read on its stack, in the supervisor's memory.
struct Start<'a> {
    supervisor: libc::pid_t,
    program: &'a Program,
    enter: &'a mut dyn FnMut() -> std::io::Result<()>,
    /// The signal mask to exec with (the one vaultd's spawning thread had).
    mask: libc::sigset_t,
    /// The errno of the step that failed; 0 while none has.
    failed: &'a AtomicI32,
    /// v1 `tasks` files of the call's cgroups, joined by the program's process.
    tasks: &'a [RawFd],
    /// The v2 cgroup's `cgroup.procs`, where the process was not born in that cgroup.
    unified_procs: Option<RawFd>,
}

/// The cgroups of one call, as the program's process joins them (see [`super::cgroup`]).
///
/// Writing a pid to a `cgroup.procs` file takes a lock of the whole machine for writing
/// (`cgroup_threadgroup_rwsem`), which first waits for an RCU grace period unless another
/// migration ran a moment before: 10 to 17 ms on the 2-core test VM for a call that
/// follows a pause (BENCHMARKS.md, issue 31). Two ways in skip that lock (they still take
/// the cgroup mutex), and are used:
/// a v1 hierarchy's `tasks` file, written "0" by the (single-threaded) process itself,
/// which moves that one thread; and for cgroup v2, being born inside, with
/// `clone3(CLONE_INTO_CGROUP)`.
#[derive(Debug, Default, Clone)]
pub struct CgroupJoin {
    /// v1 `tasks` files, open for writing.
    pub tasks: Vec<RawFd>,
    /// The v2 cgroup: its directory (for `CLONE_INTO_CGROUP`) and its `cgroup.procs` (for
    /// where clone3 is refused: Linux before 5.7, or a seccomp policy that refuses it).
    pub unified: Option<(RawFd, RawFd)>,
}

/// `CLONE_INTO_CGROUP` (linux/sched.h; not in the libc crate).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Starts the program's process as `libc::clone` does in [`split`] (`CLONE_VM |
/// CLONE_VFORK`, on `stack`, running `start_program(arg)`), but with clone3 and born in the
/// v2 cgroup `cgroup_dir`. Returns the pid, or -errno (ENOSYS where clone3 is refused,
/// as a seccomp policy such as systemd's `RestrictNamespaces=` does).
///
/// # Safety
/// As `libc::clone`: `arg` is a `Start` alive until the (vfork) child has exec'd or exited.
#[cfg(target_arch = "x86_64")]
unsafe fn clone_into(cgroup_dir: RawFd, stack: &Stack, arg: *mut c_void) -> libc::pid_t {
    #[cfg(test)]
    if REFUSE_CLONE3.get() {
        return -libc::ENOSYS;
    }
    // SAFETY: zeroed is a valid clone_args; every field set below.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = libc::CLONE_VM as u64 | libc::CLONE_VFORK as u64 | CLONE_INTO_CGROUP;
    args.exit_signal = libc::SIGCHLD as u64;
    args.stack = stack.base as u64;
    args.stack_size = stack.len as u64;
    args.cgroup = cgroup_dir as u64;
    let entry: extern "C" fn(*mut c_void) -> c_int = start_program;
    let ret: i64;
    // SAFETY: the clone3 system call, as glibc's clone3.S makes it. The child starts with
    // the parent's registers on the top of `stack`, clears the frame pointer (no unwinder
    // walks into the parent's stack), aligns the stack, calls `start_program(arg)` (r12 and
    // r13 survive into the child) and exits with what it returns; it never comes back
    // here. The parent (suspended until the child execs or exits, CLONE_VFORK) gets the pid
    // or -errno in rax; the kernel clobbers rcx and r11.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "and rsp, -16",
            "mov rdi, r13",
            "call r12",
            "mov edi, eax",
            "mov eax, {exit}",
            "syscall",
            "ud2",
            "2:",
            exit = const libc::SYS_exit,
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &raw const args,
            in("rsi") std::mem::size_of::<libc::clone_args>(),
            in("r12") entry,
            in("r13") arg,
            lateout("rcx") _,
            lateout("r11") _,
        );
    }
    ret as libc::pid_t
}

#[cfg(test)]
thread_local! {
    /// Set by a test: clone3 is refused to the spawns of this thread (the supervisor is a
    /// fork of it, with a copy of this value; const-initialized, read without allocating).
    pub static REFUSE_CLONE3: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Elsewhere the program's process joins its v2 cgroup by `cgroup.procs`.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone_into(_cgroup_dir: RawFd, _stack: &Stack, _arg: *mut c_void) -> libc::pid_t {
    -libc::ENOSYS
}

/// Whether a program's process can be born in its v2 cgroup here (see [`CgroupJoin`]):
/// clone3 is there and not refused. Asked with a size too small to start anything: EINVAL
/// where the call is there, ENOSYS where it is not or a seccomp policy refuses it.
pub fn can_clone_into_cgroup() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    // SAFETY: clone3 with a null argument of size 0 starts nothing.
    let r = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<c_void>(), 0usize) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    r < 0 && errno != Some(libc::ENOSYS) && errno != Some(libc::EPERM)
}

unsafe extern "C" {
    static mut environ: *const *const c_char;
}

/// Becomes the supervisor of the program: runs in the child of std's fork, between fork and
/// exec (a `pre_exec` closure), and starts `program` in a process of its own, which calls
/// `enter` (the sandbox entry, run in the program's process only) and then execs. Returns
/// only on failure: setting the supervisor up, starting the process, `enter`, or the exec
/// itself (a missing program is `ENOENT`, as from std); the caller returns it from its
/// `pre_exec` closure. Once the program has exec'd, the supervisor never returns.
///
/// `control` is the read end of a pipe whose write end vaultd holds for the call: its
/// closing ends the call. `join` names the call's cgroups, which the program's process
/// joins before anything else, so that every process the program starts is born in them
/// (the supervisor stays outside).
///
/// # Safety
/// Only between fork and exec in the child (the contract of `CommandExt::pre_exec`), once.
/// `enter` must make only async-signal-safe system calls and allocate nothing on its
/// success path: it runs in a process that shares the supervisor's memory.
pub unsafe fn split(
    control: RawFd,
    join: &CgroupJoin,
    program: &Program,
    enter: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Error {
    // SAFETY (whole function): raw system calls on integers, stack buffers and memory made
    // before the fork; see `start_program` for the process that shares it.
    unsafe {
        if libc::setsid() < 0 {
            return std::io::Error::last_os_error();
        }
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return std::io::Error::last_os_error();
        }
        // No signal is handled while the two processes share memory: vaultd's handlers
        // would run in either. The program's process restores the mask before its exec,
        // the supervisor once it has reset its handlers.
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut mask);
        let failed = AtomicI32::new(0);
        let mut start = Start {
            supervisor: libc::getpid(),
            program,
            enter,
            mask,
            failed: &failed,
            tasks: &join.tasks,
            unified_procs: None,
        };
        // Born in the v2 cgroup where the kernel can (Linux 5.7, where clone3 is not
        // refused); else the program's process writes itself into its `cgroup.procs`.
        let mut pid = -1;
        if let Some((dir, procs)) = join.unified {
            pid = clone_into(dir, &program.stack, (&raw mut start).cast());
            match -pid {
                // Not there, or refused by a seccomp policy: by `cgroup.procs`.
                libc::ENOSYS | libc::EPERM | libc::EINVAL | libc::E2BIG => {
                    start.unified_procs = Some(procs);
                    pid = -1;
                }
                // Any other refusal (EAGAIN: the cgroup's pids.max) is the spawn's.
                errno if errno > 0 => {
                    libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
                    return std::io::Error::from_raw_os_error(errno);
                }
                _ => {}
            }
        }
        if pid < 0 {
            pid = libc::clone(
                start_program,
                program.stack.top(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                (&raw mut start).cast(),
            );
        }
        // Here the program has exec'd, or its process has exited.
        if pid < 0 {
            let e = std::io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
            return e;
        }
        let errno = failed.load(Ordering::Acquire);
        if errno != 0 {
            let mut status = 0;
            while libc::waitpid(pid, &mut status, 0) < 0 && *libc::__errno_location() == libc::EINTR
            {
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
            return std::io::Error::from_raw_os_error(errno);
        }
        supervise(pid, control, &mask)
    }
}

/// The program's process until its exec, on its own stack in the supervisor's memory (the
/// supervisor is suspended meanwhile): what std's child does after the `pre_exec` closures,
/// with the sandbox entry first. Never returns: execs, or records why not and exits.
extern "C" fn start_program(arg: *mut c_void) -> c_int {
    // SAFETY (whole function): `arg` is the supervisor's `Start`, alive while it is
    // suspended; only raw system calls, and `enter`, held to the same rule.
    unsafe {
        let start = &mut *arg.cast::<Start<'_>>();
        // The program dies with its supervisor, whoever kills that.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
            || libc::getppid() != start.supervisor
        {
            libc::_exit(127);
        }
        // Into the call's cgroups first: what the program starts is born in them. "0" is
        // the writing thread, here the whole process (see `CgroupJoin`).
        for &fd in start.tasks.iter().chain(start.unified_procs.as_ref()) {
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                start
                    .failed
                    .store((*libc::__errno_location()).max(1), Ordering::Release);
                libc::_exit(127);
            }
        }
        // vaultd's handlers must not run in this process (its table is its own copy): back
        // to the default. Ignored signals stay ignored, as across a fork and exec.
        for sig in 1..=64 {
            let mut action: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut action) == 0
                && action.sa_sigaction != libc::SIG_DFL
                && action.sa_sigaction != libc::SIG_IGN
            {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &default, std::ptr::null_mut());
            }
        }
        let errno = match (start.enter)() {
            Ok(()) => {
                libc::pthread_sigmask(libc::SIG_SETMASK, &start.mask, std::ptr::null_mut());
                // As std's child does: the environment is set, then `execvp` (a name is
                // looked up in the program's own `PATH`).
                environ = start.program.envp.as_ptr();
                libc::execvp(start.program.program.as_ptr(), start.program.argv.as_ptr());
                *libc::__errno_location()
            }
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::EINVAL);
                // Not dropped: a custom error's drop would free.
                std::mem::forget(e);
                errno
            }
        };
        start.failed.store(errno.max(1), Ordering::Release);
        libc::_exit(127)
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
/// `mask` is the signal mask to restore once vaultd's handlers are gone.
unsafe fn supervise(program: libc::pid_t, control: RawFd, mask: &libc::sigset_t) -> ! {
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
        libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut());
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
    use std::os::unix::process::CommandExt;

    /// Runs `program` under a supervisor as vaultd does, with `enter` as the sandbox entry;
    /// returns the supervisor's pid and output, or the spawn's error.
    fn run(
        program: Program,
        mut enter: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
    ) -> std::io::Result<(u32, std::process::Output)> {
        let (control_read, control_write) = control_pipe().unwrap();
        let control = std::os::fd::AsRawFd::as_raw_fd(&control_read);
        let mut cmd = std::process::Command::new("/nonexistent/never-run-by-std");
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        // SAFETY: `split` and the test's `enter` make only system calls.
        unsafe {
            cmd.pre_exec(move || Err(split(control, &CgroupJoin::default(), &program, &mut enter)));
        }
        let child = cmd.spawn();
        drop(control_read);
        let child = child?;
        let supervisor = child.id();
        let output = child.wait_with_output().unwrap();
        drop(control_write);
        Ok((supervisor, output))
    }

    fn sh(script: &str, env: &[(&str, &str)]) -> Program {
        Program::new(
            OsStr::new("sh"),
            OsStr::new("argv-zero"),
            ["-c", script],
            env.iter().copied(),
        )
        .unwrap()
    }

    fn no_new_privs() -> std::io::Result<()> {
        // SAFETY: prctl(2) on integers.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The program is the supervisor's child and runs with the argv and only the
    /// environment it was given (a name found in that environment's `PATH`); the sandbox
    /// entry ran in the program's process, not the supervisor's; no signal is left blocked,
    /// and what the supervisor ignores (SIGTERM) the program does not.
    #[test]
    fn the_program_is_the_supervisors_child_with_its_argv_env_and_sandbox() {
        // The shell's own mask changes while it waits for a child: what it had at start is
        // read by the program it execs last.
        let script = "echo \"$0 $PPID $FOO $(env | wc -l)\"; \
             grep NoNewPrivs /proc/$PPID/status | sed 's/^/supervisor /'; \
             exec grep -E '^(NoNewPrivs|SigBlk|SigIgn)' /proc/self/status";
        let program = sh(
            script,
            &[("FOO", "one"), ("PATH", "/usr/bin:/bin"), ("FOO", "bar")],
        );
        let (supervisor, out) = run(program, no_new_privs).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        let mut lines = stdout.lines();
        // sh adds PWD (and may add SHLVL, _) to what it was given: PATH and FOO.
        let first: Vec<&str> = lines.next().unwrap().split(' ').collect();
        assert_eq!(
            first[..3],
            ["argv-zero", &supervisor.to_string(), "bar"],
            "{stdout}"
        );
        assert!(first[3].parse::<u32>().unwrap() <= 5, "{stdout}");
        assert!(stdout.contains("NoNewPrivs:\t1"), "{stdout}");
        assert!(stdout.contains("supervisor NoNewPrivs:\t0"), "{stdout}");
        assert!(stdout.contains("SigBlk:\t0000000000000000"), "{stdout}");
        let ignored = stdout
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:\t"))
            .map(|m| u64::from_str_radix(m, 16).unwrap())
            .unwrap();
        assert_eq!(ignored & (1 << (libc::SIGTERM - 1)), 0, "{stdout}");
    }

    /// A program that is not there, or not executable, fails the spawn with the errno
    /// std's own `spawn` gives; so does a failed sandbox entry. Nothing runs.
    #[test]
    fn exec_and_sandbox_failures_are_the_spawns_error() {
        let missing = Program::new(
            OsStr::new("/nonexistent/program"),
            OsStr::new("x"),
            [""; 0],
            [("PATH", "/bin")],
        )
        .unwrap();
        let e = run(missing, || Ok(())).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        let by_name = Program::new(
            OsStr::new("no-such-program-vaultd"),
            OsStr::new("x"),
            [""; 0],
            [("PATH", "/bin:/usr/bin")],
        )
        .unwrap();
        assert_eq!(
            run(by_name, || Ok(())).unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-executable");
        std::fs::write(&file, "#!/bin/sh\necho ran\n").unwrap();
        let plain = Program::new(file.as_os_str(), OsStr::new("x"), [""; 0], [("A", "b")]);
        assert_eq!(
            run(plain.unwrap(), || Ok(())).unwrap_err().raw_os_error(),
            Some(libc::EACCES)
        );
        let refused = sh("echo ran", &[]);
        let e = run(refused, || Err(rustix::io::Errno::PERM.into())).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        assert!(
            Program::new(OsStr::new("sh"), OsStr::new("x"), ["a\0b"], [("A", "b")]).is_err(),
            "a nul byte"
        );
    }

    /// As with `execvp`: a script without `#!` runs with /bin/sh.
    #[test]
    fn a_script_without_an_interpreter_line_runs_with_sh() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("script");
        std::fs::write(&file, "echo \"ran $1\"\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        let program = Program::new(
            file.as_os_str(),
            OsStr::new("x"),
            ["one"],
            [("PATH", "/bin:/usr/bin")],
        )
        .unwrap();
        let (_, out) = run(program, || Ok(())).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ran one\n", "{out:?}");
    }

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
