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
//! sandbox (the caller's `enter`: rlimits, capabilities, Landlock, seccomp) and execs with
//! the argv and environment made before (`execve`, looking a name up in that environment's
//! `PATH` as `execvp` does, without `environ`: that is vaultd's when the memory is shared);
//! a step that fails, or the exec, leaves its errno in the supervisor's memory, and the
//! supervisor returns it as the spawn's error (std's exec-error pipe then carries it to
//! vaultd, as for any `pre_exec` error, or [`spawn`]'s report pipe).
//!
//! The supervisor is either a fork of vaultd (std's `Command` with a `pre_exec`, [`split`])
//! or, where it can be, runs in vaultd's own memory ([`spawn`]: `clone(CLONE_VM)`, no copy
//! of vaultd's page tables to make at each call and tear down at its end, about 1 ms of a
//! command call). Either way it runs in a threaded process's memory after a clone, so it
//! only makes raw system calls into stack buffers and memory made before: no allocation, no
//! locks (the same rule as any `pre_exec` code), and so does the program's process before
//! its exec; in shared memory, once the program has exec'd, only calls that leave `errno`
//! alone ([`super::raw`]). The supervisor is outside the program's Landlock domain, so
//! with Landlock ABI 6 (signal scoping) the program cannot signal or trace it; where the
//! kernel is older, a program that kills the supervisor first leaves its own orphans to
//! init (a per-call cgroup, where one can be had, still ends them: [`super::cgroup`]).

use std::ffi::{CString, OsStr, c_char, c_int, c_void};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicI32, Ordering};

use super::raw;

/// The stack of the program's process until its exec: the sandbox entry and libc's
/// `execvp` (which searches `PATH` in buffers on the stack) run on it.
const STACK_SIZE: usize = 256 * 1024;

/// What the program's process needs after the first fork, made before it: the program,
/// argv and environment as C strings with their pointer arrays, and a stack of its own.
/// Owned by the `pre_exec` closure; in vaultd it is dropped with the `Command`.
pub struct Program {
    /// The paths `execvp` would try, in its order: the program itself where it names a
    /// path, else the program in each folder of the environment's `PATH`. Looked up in
    /// the program's process without `execvp`, which reads the global `environ`: that
    /// process may share vaultd's memory ([`spawn`]), where setting `environ` for one
    /// program would hand it to every other spawn and to vaultd.
    candidates: Vec<CString>,
    /// For each candidate, the argv that runs it with `/bin/sh` (a file without `#!`
    /// that the kernel refuses with ENOEXEC, as `execvp` does).
    sh_argvs: Vec<Vec<*const c_char>>,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    /// What `argv` and `envp` point into (heap buffers that never move).
    _strings: Vec<CString>,
    stack: Stack,
}

/// The shell `execvp` runs a script without `#!` with (glibc's `_PATH_BSHELL`).
const BIN_SH: &std::ffi::CStr = c"/bin/sh";

/// Where `execvp` looks when the environment has no `PATH` (glibc's `_CS_PATH`).
const DEFAULT_EXEC_PATH: &[u8] = b"/bin:/usr/bin";

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
        let name = program.as_bytes();
        let candidates: Vec<CString> = if name.is_empty() {
            Vec::new()
        } else if name.contains(&b'/') {
            vec![c(name)?]
        } else {
            let path = vars
                .get(OsStr::new("PATH"))
                .map_or(DEFAULT_EXEC_PATH, |p| p.as_bytes());
            path.split(|&b| b == b':')
                .map(|dir| {
                    // An empty entry is the working directory, as for `execvp`.
                    let mut full = dir.to_vec();
                    if !full.is_empty() {
                        full.push(b'/');
                    }
                    full.extend_from_slice(name);
                    c(&full)
                })
                .collect::<std::io::Result<_>>()?
        };
        let argv = pointers(&argv_strings);
        let envp = pointers(&env_strings);
        let sh_argvs = candidates
            .iter()
            .map(|candidate| {
                [BIN_SH.as_ptr(), candidate.as_ptr()]
                    .into_iter()
                    .chain(argv[1..].iter().copied())
                    .collect()
            })
            .collect();
        argv_strings.extend(env_strings);
        Ok(Program {
            candidates,
            sh_argvs,
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

// SAFETY: a mapping owned alone; whoever holds it may unmap it from any thread.
unsafe impl Send for Stack {}

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
    // SAFETY: the caller's contract, which is `split_with`'s.
    unsafe { split_with(control, join, program, enter, None) }
}

/// [`split`], where the program execs with `exec_mask` (None: the mask this process had).
unsafe fn split_with(
    control: RawFd,
    join: &CgroupJoin,
    program: &Program,
    enter: &mut dyn FnMut() -> std::io::Result<()>,
    exec_mask: Option<&libc::sigset_t>,
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
        if let Some(exec_mask) = exec_mask {
            mask = *exec_mask;
        }
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

/// Whether supervisors are started in vaultd's own memory here ([`spawn`]): on x86_64,
/// where the supervisor's system calls can leave `errno` alone ([`raw`]), where
/// `pidfd_open` (Linux 5.3) lets vaultd wait for one without a thread, and where
/// `close_range` (Linux 5.9) closes every fd the supervisor got, however high (the report
/// pipe's end among them: its close tells the spawning thread the program has exec'd).
pub fn in_shared_memory() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| {
        cfg!(target_arch = "x86_64") && {
            let fd = raw::pidfd_open(raw::getpid());
            // SAFETY: the fd just opened, closed once; then the highest fd there can be,
            // which is not open (close_range of nothing is 0 where the call exists).
            fd >= 0
                && unsafe { raw::close(fd as RawFd) } == 0
                && unsafe { raw::close_range(u32::MAX, u32::MAX) } == 0
        }
    })
}

/// What the supervisor is handed by [`spawn`]: read on vaultd's stack while the spawning
/// thread waits for the report.
struct Boot<'a> {
    stdio: [RawFd; 3],
    report: RawFd,
    cwd: &'a std::ffi::CStr,
    control: RawFd,
    join: &'a CgroupJoin,
    program: &'a Program,
    enter: &'a mut dyn FnMut() -> std::io::Result<()>,
}

/// A supervisor started by [`spawn`], in vaultd's memory on a stack of its own: reaped by
/// [`Supervisor::wait`], or when dropped (by a thread that waits for it; the stack goes
/// only once it has exited).
pub struct Supervisor {
    pid: libc::pid_t,
    /// Taken by `drop` when it is not reaped yet.
    pidfd: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    stack: Option<Stack>,
    status: Option<c_int>,
}

/// A started program: its supervisor and the read ends of its stdout and stderr.
pub struct Spawned {
    pub supervisor: Supervisor,
    pub stdout: std::os::fd::OwnedFd,
    pub stderr: std::os::fd::OwnedFd,
}

/// Starts the supervisor as [`split`] is started from std's fork, but without copying
/// vaultd: `clone(CLONE_VM)`, as `posix_spawn` makes its child, on a stack of its own. It
/// points stdin at /dev/null and stdout and stderr at two new pipes, changes to `cwd`,
/// sets SIGPIPE back to its default (as std's child does) and runs [`split`]; the program
/// execs with no signal blocked.
///
/// Copying vaultd (`fork`: its page tables, then the copy's teardown at exit, and a
/// copy-on-write fault in vaultd for each page it writes after) cost about 1 ms of every
/// command call on the 2-core test VM (BENCHMARKS.md, issue 31).
///
/// The spawning thread waits, with every signal blocked, until the program has exec'd
/// (the report pipe closes: the supervisor closes every fd but its control pipe, the
/// program's copy closes on exec) or failed to (the errno comes on the pipe): until
/// then the supervisor and the program read `program`, `join` and `enter` here, and write
/// `errno`, which is this thread's. After, the supervisor makes only [`raw`] system calls
/// on its own stack.
///
/// # Safety
/// As [`split`]: `enter` makes only system calls and allocates nothing on its success
/// path. Only where [`in_shared_memory`] holds, from inside a tokio runtime.
pub unsafe fn spawn(
    cwd: &std::path::Path,
    control: RawFd,
    join: &CgroupJoin,
    program: &Program,
    enter: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Result<Spawned> {
    use std::os::fd::{AsRawFd, OwnedFd};
    let cwd = CString::new(cwd.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let stdin = above_stdio(std::fs::File::open("/dev/null")?.into())?;
    let (out_read, out_write) = pipe()?;
    let (err_read, err_write) = pipe()?;
    let (report_read, report_write) = pipe()?;
    let stack = Stack::new()?;
    let mut boot = Boot {
        stdio: [
            stdin.as_raw_fd(),
            out_write.as_raw_fd(),
            err_write.as_raw_fd(),
        ],
        report: report_write.as_raw_fd(),
        cwd: &cwd,
        control,
        join,
        program,
        enter,
    };
    // SAFETY: signal masks and clone(2) on memory that lives until the report (below).
    let (pid, errno) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
        let pid = libc::clone(
            boot_supervisor,
            stack.top(),
            libc::CLONE_VM | libc::SIGCHLD,
            (&raw mut boot).cast(),
        );
        let mut errno = if pid < 0 {
            Some(std::io::Error::last_os_error())
        } else {
            None
        };
        // The supervisor has its own copies.
        drop((stdin, out_write, err_write, report_write));
        if pid > 0 {
            let mut report = [0u8; 4];
            let mut got = 0;
            loop {
                match raw::read(report_read.as_raw_fd(), &mut report[got..]) {
                    n if n > 0 => {
                        got += n as usize;
                        if got == report.len() {
                            break;
                        }
                    }
                    n if n == -(libc::EINTR as isize) => {}
                    _ => break,
                }
            }
            if got == report.len() {
                errno = Some(std::io::Error::from_raw_os_error(i32::from_ne_bytes(
                    report,
                )));
            }
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        (pid, errno)
    };
    if let Some(e) = errno {
        if pid > 0 {
            reap(pid);
        }
        return Err(e);
    }
    let pidfd = match raw::pidfd_open(pid) {
        // SAFETY: a new fd, owned here alone.
        fd if fd >= 0 => unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) },
        e => {
            // Cannot be waited for without it: the caller closes the control pipe, which
            // ends the program; its supervisor is reaped by a thread of its own.
            reap_later(pid, None, stack);
            return Err(std::io::Error::from_raw_os_error(-e as i32));
        }
    };
    // SAFETY: an OwnedFd, open and the same until the AsyncFd drops it.
    let pidfd = match unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    } {
        Ok(pidfd) => pidfd,
        Err(e) => {
            let (pidfd, e) = e.into_parts();
            // As above.
            reap_later(pid, Some(pidfd), stack);
            return Err(e);
        }
    };
    Ok(Spawned {
        supervisor: Supervisor {
            pid,
            pidfd: Some(pidfd),
            stack: Some(stack),
            status: None,
        },
        stdout: out_read,
        stderr: err_read,
    })
}

/// The supervisor [`spawn`] starts: std's child steps, then [`split`]. Returns only by
/// exiting, after writing why the program did not start to the report pipe.
extern "C" fn boot_supervisor(arg: *mut c_void) -> c_int {
    // SAFETY (whole function): `arg` is the spawning thread's `Boot`, alive while that
    // thread waits for the report; system calls on integers and that memory.
    unsafe {
        let boot = &mut *arg.cast::<Boot<'_>>();
        let errno = 'failed: {
            for (fd, target) in boot.stdio.into_iter().zip(0..) {
                if libc::dup2(fd, target) < 0 {
                    break 'failed *libc::__errno_location();
                }
            }
            if libc::chdir(boot.cwd.as_ptr()) != 0 {
                break 'failed *libc::__errno_location();
            }
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            let e = split_with(
                boot.control,
                boot.join,
                boot.program,
                boot.enter,
                Some(&none),
            );
            let errno = e.raw_os_error().unwrap_or(libc::EINVAL);
            std::mem::forget(e);
            errno
        };
        let report = errno.max(1).to_ne_bytes();
        libc::write(boot.report, report.as_ptr().cast(), report.len());
        libc::_exit(127)
    }
}

impl Supervisor {
    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    /// Waits for the supervisor to exit (it exits as the program did) and reaps it.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        loop {
            if let Some(status) = self.status {
                return Ok(std::process::ExitStatus::from_raw(status));
            }
            let Some(pidfd) = &self.pidfd else {
                return Err(std::io::Error::from_raw_os_error(libc::ECHILD));
            };
            let mut ready = pidfd.readable().await?;
            let mut status = 0;
            // SAFETY: waitpid(2) of this process's own child, into a local.
            match unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) } {
                r if r == self.pid => {
                    self.status = Some(status);
                    // It is gone: nothing runs on its stack.
                    self.stack.take();
                }
                0 => ready.clear_ready(),
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }
}

impl Drop for Supervisor {
    /// Not reaped yet: a thread of its own waits for it (the caller ends the call by
    /// closing its control pipe), then unmaps its stack.
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        if let Some(stack) = self.stack.take() {
            let pidfd = self.pidfd.take().map(|fd| fd.into_inner());
            reap_later(self.pid, pidfd, stack);
        }
    }
}

/// How long a supervisor whose call has ended may take to end its program and exit
/// before it is sent SIGCONT (it kills what the program left within about 5 s; one the
/// program stopped with SIGSTOP, where Landlock cannot scope signals, never would), and
/// then how much longer before it is killed (a program stuck in the kernel, on a hung
/// mount, may hold it that long; killed, it could no longer end what the program left).
const SUPERVISOR_GRACE_MS: [c_int; 2] = [10_000, 60_000];

/// Reaps the supervisor `pid` on a thread of its own, then unmaps its `stack`. Not on
/// tokio's blocking pool: a task there is cancelled at the runtime's shutdown, and its
/// stack would go while the supervisor still runs on it. Woken, then killed, if it
/// outlives [`SUPERVISOR_GRACE_MS`] (its `pidfd` tells when it exits; it is not reaped
/// before, so its pid is its own). Where no thread can be started, its stack is left
/// mapped (and the zombie to vaultd's exit).
fn reap_later(pid: libc::pid_t, pidfd: Option<std::os::fd::OwnedFd>, stack: Stack) {
    let reaper = std::thread::Builder::new()
        .name("vaultd-reap".into())
        .spawn(move || {
            // No signal handler of vaultd's runs here (a SIGHUP would cut a wait short).
            // SAFETY: sigset operations on a local, then this thread's own mask.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
            }
            if let Some(pidfd) = &pidfd {
                use std::os::fd::AsRawFd;
                let exited = |ms| {
                    let mut ready = libc::pollfd {
                        fd: pidfd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: poll(2) on one live pollfd.
                    unsafe { libc::poll(&mut ready, 1, ms) != 0 }
                };
                if !exited(SUPERVISOR_GRACE_MS[0]) {
                    raw::kill(pid, libc::SIGCONT);
                    if !exited(SUPERVISOR_GRACE_MS[1]) {
                        raw::kill(pid, libc::SIGKILL);
                    }
                }
            }
            reap(pid);
            drop(stack);
        });
    if let Err(e) = reaper {
        tracing::warn!("a supervisor ({pid}) is left unreaped: no thread to wait for it: {e}");
    }
}

/// Waits for the child `pid` to exit, and reaps it.
fn reap(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waitpid(2) of this process's own child, into a local.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
    {}
}

/// A pipe, both ends closed on exec and above the standard fds.
fn pipe() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    let (read, write) = control_pipe()?;
    Ok((above_stdio(read)?, above_stdio(write)?))
}

/// `fd`, or a copy of it numbered 3 or above where it is 0, 1 or 2 (vaultd started with
/// one of those closed): the supervisor's dup2 onto 0, 1 and 2 must not close another.
fn above_stdio(fd: std::os::fd::OwnedFd) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 3)?)
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
                // As std's child does with `execvp`: a name is looked up in the program's
                // own `PATH`, which it gets as its whole environment.
                exec(start.program)
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

/// Runs the program as `execvp` would with the program's own environment (each candidate
/// in turn; a file the kernel cannot run, with /bin/sh), without touching `environ`.
/// Returns the errno `execvp` would leave.
unsafe fn exec(program: &Program) -> c_int {
    // SAFETY (whole function): execve(2) with nul-terminated strings and pointer arrays.
    unsafe {
        let mut eacces = false;
        let mut errno = libc::ENOENT;
        for (candidate, sh_argv) in program.candidates.iter().zip(&program.sh_argvs) {
            libc::execve(
                candidate.as_ptr(),
                program.argv.as_ptr(),
                program.envp.as_ptr(),
            );
            errno = *libc::__errno_location();
            if errno == libc::ENOEXEC {
                libc::execve(BIN_SH.as_ptr(), sh_argv.as_ptr(), program.envp.as_ptr());
                errno = *libc::__errno_location();
            }
            match errno {
                libc::EACCES => eacces = true,
                // Not here: the next folder of `PATH` (glibc's list).
                libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => return errno,
            }
        }
        if eacces { libc::EACCES } else { errno }
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
        // vaultd's signal handlers (tokio's self-pipe) must not run here, real-time ones
        // included: in shared memory they would run on vaultd's data.
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                raw::default_action(sig);
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
        // From here on no call touches libc's errno: in shared memory it is the spawning
        // thread's (`spawn`), which goes on once the lines above closed its report pipe.
        let pidfd = raw::pidfd_open(program) as RawFd;
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
                if raw::poll(&mut fds) < 0 {
                    continue; // EINTR
                }
                if fds[0].revents != 0 {
                    break;
                }
                if fds[1].revents != 0 {
                    // vaultd ended the call (or ended itself): the program goes first.
                    raw::kill(program, libc::SIGKILL);
                    break;
                }
            }
        }
        // Without pidfd_open (Linux < 5.3) the supervisor only follows the program; vaultd
        // then kills the process group when a call ends early.
        while raw::wait(program, &mut status, 0) == -(libc::EINTR as isize) {}
        kill_every_child();
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            raw::default_action(sig);
            raw::no_core();
            raw::kill(raw::getpid(), sig);
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
        let close_range =
            |first: libc::c_uint, last: libc::c_uint| raw::close_range(first, last) == 0;
        let low = keep == 0 || close_range(0, keep - 1);
        let high = close_range(keep + 1, libc::c_uint::MAX);
        if !(low && high) {
            for fd in 0..4096 {
                if fd != keep as RawFd {
                    raw::close(fd);
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
        let me = raw::getpid();
        let mut idle_rounds = 0;
        let mut status = 0;
        loop {
            // Reap what died; no child left means no descendant left. Asked before /proc is
            // read: a program that left nothing behind (the common case) costs no scan of
            // every process on the machine (~1 ms of a command call, BENCHMARKS.md).
            loop {
                let r = raw::wait(-1, &mut status, libc::WNOHANG);
                if r > 0 {
                    continue;
                }
                if r == -(libc::ECHILD as isize) {
                    return;
                }
                break;
            }
            let killed = for_each_child(me, |pid| {
                raw::kill(pid, libc::SIGKILL);
            });
            if killed == 0 {
                // Children exist that /proc does not show (yet): wait a little, a bounded
                // number of times, rather than spin or hang.
                idle_rounds += 1;
                if idle_rounds > 500 {
                    return;
                }
                raw::sleep_ms(10);
            } else {
                // At least one was killed: wait for one death before looking again.
                raw::wait(-1, &mut status, 0);
            }
        }
    }
}

/// Calls `f` with the pid of each process whose parent is `parent`, from /proc (the
/// `children` file needs CONFIG_PROC_CHILDREN, which many kernels lack). Returns how many.
unsafe fn for_each_child(parent: libc::pid_t, mut f: impl FnMut(libc::pid_t)) -> usize {
    // SAFETY (whole function): raw system calls into stack buffers.
    unsafe {
        let dir = raw::open(c"/proc", libc::O_DIRECTORY) as RawFd;
        if dir < 0 {
            return 0;
        }
        let mut found = 0;
        let mut buf = [0u8; 4096];
        loop {
            let n = raw::getdents64(dir, &mut buf);
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
        raw::close(dir);
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
        let Ok(path) = std::ffi::CStr::from_bytes_until_nul(&path) else {
            return None;
        };
        let fd = raw::open(path, 0) as RawFd;
        if fd < 0 {
            return None;
        }
        let n = raw::read(fd, &mut stat);
        raw::close(fd);
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

    /// Runs `program` under a supervisor as vaultd does, with `enter` as the sandbox entry,
    /// both ways: forked by std, then (where it can be) in this process's memory; checks
    /// both gave the same; returns the supervisor's pid and output, or the spawn's error.
    fn run(
        program: impl Fn() -> Program,
        mut enter: impl FnMut() -> std::io::Result<()> + Clone + Send + Sync + 'static,
    ) -> std::io::Result<(u32, std::process::Output)> {
        let forked = run_forked(program(), enter.clone());
        if !in_shared_memory() {
            return forked;
        }
        let shared = run_shared(program(), &mut enter);
        match (&forked, &shared) {
            (Ok((_, a)), Ok((_, b))) => {
                assert_eq!(a.status, b.status);
                // The supervisor's pid is in the output of some tests.
                let strip = |o: &[u8]| String::from_utf8_lossy(o).replace(char::is_numeric, "");
                assert_eq!(strip(&a.stdout), strip(&b.stdout), "forked, then shared");
                assert_eq!(strip(&a.stderr), strip(&b.stderr), "forked, then shared");
            }
            (Err(a), Err(b)) => assert_eq!(a.raw_os_error(), b.raw_os_error()),
            _ => panic!("forked: {forked:?}, shared: {shared:?}"),
        }
        shared
    }

    /// `run` by [`spawn`].
    fn run_shared(
        program: Program,
        enter: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> std::io::Result<(u32, std::process::Output)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (control_read, control_write) = control_pipe().unwrap();
            let control = std::os::fd::AsRawFd::as_raw_fd(&control_read);
            let cwd = std::env::current_dir().unwrap();
            // SAFETY: the test's `enter` makes only system calls.
            let spawned = unsafe { spawn(&cwd, control, &CgroupJoin::default(), &program, enter) };
            drop(control_read);
            drop(program);
            let Spawned {
                mut supervisor,
                stdout,
                stderr,
            } = spawned?;
            let read = |fd| async move {
                use tokio::io::AsyncReadExt;
                let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?;
                let mut all = Vec::new();
                pipe.read_to_end(&mut all).await.map(|_| all)
            };
            let (status, stdout, stderr) =
                tokio::join!(supervisor.wait(), read(stdout), read(stderr));
            drop(control_write);
            Ok((
                supervisor.id(),
                std::process::Output {
                    status: status?,
                    stdout: stdout?,
                    stderr: stderr?,
                },
            ))
        })
    }

    /// `run` by std's fork.
    fn run_forked(
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
        let program = || {
            sh(
                script,
                &[("FOO", "one"), ("PATH", "/usr/bin:/bin"), ("FOO", "bar")],
            )
        };
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
        let missing = || {
            Program::new(
                OsStr::new("/nonexistent/program"),
                OsStr::new("x"),
                [""; 0],
                [("PATH", "/bin")],
            )
            .unwrap()
        };
        let e = run(missing, || Ok(())).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        let by_name = || {
            Program::new(
                OsStr::new("no-such-program-vaultd"),
                OsStr::new("x"),
                [""; 0],
                [("PATH", "/bin:/usr/bin")],
            )
            .unwrap()
        };
        assert_eq!(
            run(by_name, || Ok(())).unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-executable");
        std::fs::write(&file, "#!/bin/sh\necho ran\n").unwrap();
        let plain = || Program::new(file.as_os_str(), OsStr::new("x"), [""; 0], [("A", "b")]);
        assert_eq!(
            run(|| plain().unwrap(), || Ok(()))
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EACCES)
        );
        // Found in `PATH` but not executable, and nowhere else: EACCES, as from `execvp`.
        let in_path = || {
            Program::new(
                OsStr::new("not-executable"),
                OsStr::new("x"),
                [""; 0],
                [("PATH", format!("/nonexistent:{}", dir.path().display()))],
            )
            .unwrap()
        };
        assert_eq!(
            run(in_path, || Ok(())).unwrap_err().raw_os_error(),
            Some(libc::EACCES)
        );
        let refused = || sh("echo ran", &[]);
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
        let program = || {
            Program::new(
                file.as_os_str(),
                OsStr::new("x"),
                ["one"],
                [("PATH", "/bin:/usr/bin")],
            )
            .unwrap()
        };
        let (_, out) = run(program, || Ok(())).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ran one\n", "{out:?}");
        // The same script found by name in the program's own `PATH` (an empty entry, the
        // working directory, first: skipped, as there is no such file there).
        let by_name = || {
            Program::new(
                OsStr::new("script"),
                OsStr::new("x"),
                ["two"],
                [("PATH", format!(":{}", dir.path().display()))],
            )
            .unwrap()
        };
        let (_, out) = run(by_name, || Ok(())).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ran two\n", "{out:?}");
    }

    /// Supervisors started in this process's memory at once, from many threads, each run
    /// their own program with their own environment, and leave this process's
    /// environment as it was (`execvp` would have set the shared `environ` for each).
    #[test]
    fn programs_started_at_once_in_shared_memory_each_get_their_own_environment() {
        if !in_shared_memory() {
            eprintln!("skipped: supervisors are forked here");
            return;
        }
        let before: Vec<_> = std::env::vars_os().collect();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..10 {
                        let mine = format!("{t}-{i}");
                        let program = Program::new(
                            OsStr::new("sh"),
                            OsStr::new("sh"),
                            ["-c", "printf %s \"$MINE\""],
                            [("MINE", mine.as_str()), ("PATH", "/usr/bin:/bin")],
                        )
                        .unwrap();
                        let (_, out) = run_shared(program, &mut || Ok(())).unwrap();
                        assert!(out.status.success(), "{out:?}");
                        assert_eq!(String::from_utf8_lossy(&out.stdout), mine);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let after: Vec<_> = std::env::vars_os().collect();
        assert_eq!(before, after);
    }

    /// A supervisor dropped before its program ends is reaped once the call ends (its
    /// control pipe closes): the program and what it started are killed, no zombie is
    /// left, and its stack outlives it (were it unmapped first, the supervisor would die of
    /// SIGSEGV: the program would die with it, by its death signal, but the grandchild,
    /// re-parented away, would live on).
    #[test]
    fn a_supervisor_dropped_while_its_program_runs_is_ended_and_reaped() {
        use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};
        use std::os::fd::AsRawFd;
        if !in_shared_memory() {
            eprintln!("skipped: supervisors are forked here");
            return;
        }
        // A reaping task handed to tokio's blocking pool while the runtime shuts down is
        // cancelled at once, and the stack would go with it, before the call ends.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let grandchild_file = dir.path().join("grandchild");
        let script = format!(
            "sleep 300 & echo $! > {}; exec sleep 300",
            grandchild_file.display()
        );
        let program = Program::new(
            OsStr::new("sh"),
            OsStr::new("sh"),
            ["-c", &script],
            [("PATH", "/usr/bin:/bin")],
        )
        .unwrap();
        let (control_read, control_write) = control_pipe().unwrap();
        let control = control_read.as_raw_fd();
        let cwd = std::env::current_dir().unwrap();
        // The processes by pidfd, opened while they run: a pid may be reused once reaped.
        let pidfd = |pid: libc::pid_t| pidfd_open(Pid::from_raw(pid).unwrap(), PidfdFlags::empty());
        let (supervisor, started) = rt.block_on(async {
            // SAFETY: an `enter` that does nothing.
            let spawned = unsafe {
                spawn(&cwd, control, &CgroupJoin::default(), &program, &mut || {
                    Ok(())
                })
            }
            .unwrap();
            drop(control_read);
            let supervisor = spawned.supervisor.id() as libc::pid_t;
            // The program is the supervisor's only child; its own child wrote its pid.
            let mut sleeper = None;
            let mut grandchild = None;
            for _ in 0..500 {
                // SAFETY: reads /proc into stack buffers.
                unsafe { for_each_child(supervisor, |pid| sleeper = Some(pid)) };
                grandchild = std::fs::read_to_string(&grandchild_file)
                    .ok()
                    .and_then(|p| p.trim().parse::<libc::pid_t>().ok());
                if sleeper.is_some() && grandchild.is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let started = [
                pidfd(sleeper.expect("the program runs")).unwrap(),
                pidfd(grandchild.expect("the program's child runs")).unwrap(),
            ];
            let supervisor = pidfd(supervisor).unwrap();
            // Dropped with its task, as the runtime shuts down (vaultd's SIGTERM path).
            drop(tokio::spawn(async move {
                let _spawned = spawned;
                std::future::pending::<()>().await
            }));
            tokio::task::yield_now().await;
            (supervisor, started)
        });
        rt.shutdown_background();
        // Whatever was to unmap the stack before the supervisor exits has done it by now.
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(control_write);
        let exited = |fd: &std::os::fd::OwnedFd| {
            let mut ready = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll(2) on one live pollfd, no wait.
            unsafe { libc::poll(&mut ready, 1, 0) == 1 }
        };
        // Reaped: no longer this process's child (waitid finds none).
        let reaped = || {
            // SAFETY: waitid(2) on a pidfd into a zeroed siginfo, without reaping.
            unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                libc::waitid(
                    libc::P_PIDFD,
                    supervisor.as_raw_fd() as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                ) < 0
            }
        };
        for _ in 0..500 {
            if reaped() && started.iter().all(exited) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        for (fd, who) in started.iter().zip(["the program", "its child"]) {
            let alive = !exited(fd);
            if alive {
                let _ = pidfd_send_signal(fd, Signal::KILL);
            }
            assert!(!alive, "{who} was not killed");
        }
        assert!(reaped(), "the supervisor was not reaped");
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
