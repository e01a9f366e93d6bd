//! System calls that never touch `errno`, for a supervisor that shares vaultd's memory.
//!
//! A supervisor started with `CLONE_VM` ([`super::supervise::spawn`]) runs beside vaultd's
//! threads in the same memory, on the thread-local storage of the thread that started it:
//! libc's `errno` there is that thread's. Once the program has exec'd (and that thread goes
//! on with its work), the supervisor makes its system calls here: each returns its result,
//! or `-errno`, and writes nothing but its own arguments' buffers.
//!
//! Elsewhere than x86_64 these go through libc (and its `errno`); there the supervisor is
//! always a fork of its own ([`super::supervise::in_shared_memory`]), so that is its own.

use std::ffi::{CStr, c_int, c_long};
use std::os::fd::RawFd;

/// One system call: its result, or -errno.
#[cfg(target_arch = "x86_64")]
unsafe fn call(n: c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the `syscall` instruction with the kernel's x86_64 convention; the caller
    // vouches for the arguments, as for any system call. The kernel clobbers rcx and r11.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") n as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn call(n: c_long, a: [usize; 6]) -> isize {
    // SAFETY: as above, through libc (used only where the process's errno is its own).
    unsafe {
        let r = libc::syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]);
        if r < 0 {
            -(*libc::__errno_location() as isize)
        } else {
            r as isize
        }
    }
}

/// # Safety
/// `fd` is owned by the caller, and nothing uses it after.
pub unsafe fn close(fd: RawFd) -> isize {
    // SAFETY: close(2) of an fd the caller owns.
    unsafe { call(libc::SYS_close, [fd as usize, 0, 0, 0, 0, 0]) }
}

/// # Safety
/// Every fd in the range is owned by the caller alone (a process that never execs).
pub unsafe fn close_range(first: u32, last: u32) -> isize {
    // SAFETY: close_range(2) on fds the caller owns alone.
    unsafe {
        call(
            libc::SYS_close_range,
            [first as usize, last as usize, 0, 0, 0, 0],
        )
    }
}

pub fn pidfd_open(pid: libc::pid_t) -> isize {
    // SAFETY: pidfd_open(2) on integers.
    unsafe { call(libc::SYS_pidfd_open, [pid as usize, 0, 0, 0, 0, 0]) }
}

/// Waits until one of `fds` is ready (no timeout).
pub fn poll(fds: &mut [libc::pollfd]) -> isize {
    // SAFETY: ppoll(2) on a live slice, no timeout, no signal mask.
    unsafe {
        call(
            libc::SYS_ppoll,
            [fds.as_mut_ptr() as usize, fds.len(), 0, 0, 0, 0],
        )
    }
}

/// wait4(2): the pid reaped (its status in `status`), 0 with WNOHANG and none, or -errno.
pub fn wait(pid: libc::pid_t, status: &mut c_int, options: c_int) -> isize {
    // SAFETY: wait4(2) writing into `status`.
    unsafe {
        call(
            libc::SYS_wait4,
            [
                pid as usize,
                status as *mut c_int as usize,
                options as usize,
                0,
                0,
                0,
            ],
        )
    }
}

pub fn kill(pid: libc::pid_t, sig: c_int) -> isize {
    // SAFETY: kill(2) on integers.
    unsafe { call(libc::SYS_kill, [pid as usize, sig as usize, 0, 0, 0, 0]) }
}

pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid(2).
    unsafe { call(libc::SYS_getpid, [0; 6]) as libc::pid_t }
}

/// Opens `path` read-only (close on exec): the fd, or -errno.
pub fn open(path: &CStr, flags: c_int) -> isize {
    // SAFETY: openat(2) with a nul-terminated path.
    unsafe {
        call(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as usize,
                path.as_ptr() as usize,
                (flags | libc::O_RDONLY | libc::O_CLOEXEC) as usize,
                0,
                0,
                0,
            ],
        )
    }
}

pub fn read(fd: RawFd, buf: &mut [u8]) -> isize {
    // SAFETY: read(2) into a live buffer.
    unsafe {
        call(
            libc::SYS_read,
            [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

pub fn getdents64(fd: RawFd, buf: &mut [u8]) -> isize {
    // SAFETY: getdents64(2) into a live buffer.
    unsafe {
        call(
            libc::SYS_getdents64,
            [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

pub fn sleep_ms(ms: u32) {
    let pause = libc::timespec {
        tv_sec: 0,
        tv_nsec: ms as libc::c_long * 1_000_000,
    };
    // SAFETY: nanosleep(2) reading a live timespec.
    unsafe {
        call(
            libc::SYS_nanosleep,
            [&raw const pause as usize, 0, 0, 0, 0, 0],
        );
    }
}

/// No core file from this process.
pub fn no_core() {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit64(2) on this process, reading a live rlimit.
    unsafe {
        call(
            libc::SYS_prlimit64,
            [
                0,
                libc::RLIMIT_CORE as usize,
                &raw const zero as usize,
                0,
                0,
                0,
            ],
        );
    }
}

/// Back to the default action for `sig` (the kernel's `struct sigaction`, all zero: no
/// handler, no flags, no restorer, an empty mask).
pub fn default_action(sig: c_int) {
    let action = [0usize; 4];
    // SAFETY: rt_sigaction(2) reading a live, zeroed kernel sigaction of the kernel's size
    // (8-byte sigset).
    unsafe {
        call(
            libc::SYS_rt_sigaction,
            [sig as usize, action.as_ptr() as usize, 0, 8, 0, 0],
        );
    }
}
