//! Threads that work behind a note, not on its way: the file watcher's, the journal's writer
//! and the folder flusher. On Linux they run as `SCHED_BATCH`: the same share of the CPU as
//! any thread (nice 0, no privilege needed), but a wake-up of theirs does not preempt the
//! thread running (the kernel's fair scheduler gives batch threads no wake-up preemption);
//! they run when it blocks or its slice ends, or at once on an idle core.
//!
//! A lone note's worker wakes each of them several times on its way (every open, link and
//! rename in a watched folder wakes the watcher's thread; each record queued wakes the
//! writer), and on a 2-core machine the woken thread often took the worker's core on the spot.
//! Note by note, drop to Done, 3 runs of 2,000 lone search notes: 0.040 to 0.064 ms less
//! (BENCHMARKS.md, twenty-seventh pass). Where the policy cannot be set, nothing changes.

/// Puts the calling thread in the background (see the module's text).
pub fn this_thread() {
    #[cfg(target_os = "linux")]
    set_batch(unsafe { libc::pthread_self() });
}

/// Puts `thread` in the background from the thread that spawned it, so that it is, before
/// it runs its first line.
pub fn thread<T>(thread: &std::thread::JoinHandle<T>) {
    #[cfg(target_os = "linux")]
    set_batch(std::os::unix::thread::JoinHandleExt::as_pthread_t(thread));
    #[cfg(not(target_os = "linux"))]
    let _ = thread;
}

#[cfg(target_os = "linux")]
fn set_batch(thread: libc::pthread_t) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `thread` is a live thread of this process (the caller's, or one whose handle is
    // held), and `param` outlives the call.
    let rc = unsafe { libc::pthread_setschedparam(thread, libc::SCHED_BATCH, &param) };
    if rc != 0 {
        tracing::debug!(
            "cannot make a background thread SCHED_BATCH: {}",
            std::io::Error::from_raw_os_error(rc)
        );
    }
}

/// Whether `thread` runs as a background thread.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn is_background(thread: libc::pthread_t) -> bool {
    let mut policy = 0;
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in `set_batch`; both out-pointers are valid.
    let rc = unsafe { libc::pthread_getschedparam(thread, &mut policy, &mut param) };
    rc == 0 && policy == libc::SCHED_BATCH
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::thread::JoinHandleExt;

    #[test]
    fn a_thread_put_in_the_background_runs_as_a_batch_thread_and_others_do_not() {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let held = std::thread::spawn(move || wait.recv().ok());
        assert!(!is_background(held.as_pthread_t()));
        thread(&held);
        assert!(is_background(held.as_pthread_t()));
        go.send(()).unwrap();
        held.join().unwrap();

        let own = std::thread::spawn(|| {
            this_thread();
            is_background(unsafe { libc::pthread_self() })
        });
        assert!(own.join().unwrap());
        // The test's own thread was left alone.
        assert!(!is_background(unsafe { libc::pthread_self() }));
    }
}
