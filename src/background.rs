//! Threads that work behind a note, not on its way: the file watcher's and the folder
//! flusher. On Linux they run as `SCHED_BATCH`: the same share of the CPU as any thread (nice
//! 0, no privilege needed), but a wake-up of theirs does not preempt the thread running (the
//! kernel's fair scheduler gives batch threads no wake-up preemption); they run when it
//! blocks or its slice ends, or at once on an idle core.
//!
//! A lone note's worker wakes the watcher's thread several times on its way (every open, link
//! and rename in a watched folder), and on a 2-core machine the woken thread often took the
//! worker's core on the spot. Note by note, drop to Done, 2,000 lone search notes: 0.075 ms
//! less (BENCHMARKS.md, twenty-seventh pass). The journal's writer is not one of them: a send
//! waits for its commit, and under load a batch writer waits for a slice to end before it
//! commits (sends per second were lower in 6 of 8 rounds on the bench machine's disk with it).
//! Where the policy cannot be set, nothing changes.

/// Puts the calling thread in the background (see the module's text).
pub fn this_thread() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pthread_self is the calling thread, and `param` outlives the call.
        let rc =
            unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_BATCH, &param) };
        if rc != 0 {
            tracing::debug!(
                "cannot make a background thread SCHED_BATCH: {}",
                std::io::Error::from_raw_os_error(rc)
            );
        }
    }
}

/// Whether `thread` runs as a background thread.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn is_background(thread: libc::pthread_t) -> bool {
    let mut policy = 0;
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `thread` is a live thread of this process; both out-pointers are valid.
    let rc = unsafe { libc::pthread_getschedparam(thread, &mut policy, &mut param) };
    rc == 0 && policy == libc::SCHED_BATCH
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_put_in_the_background_runs_as_a_batch_thread_and_others_do_not() {
        let own = std::thread::spawn(|| {
            this_thread();
            // SAFETY: pthread_self has no preconditions.
            is_background(unsafe { libc::pthread_self() })
        });
        assert!(own.join().unwrap());
        // The test's own thread was left alone.
        assert!(!is_background(unsafe { libc::pthread_self() }));
    }
}
