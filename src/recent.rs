//! Paths noted recently, each forgotten a fixed time after it was last noted: what the
//! daemon keeps of its own writes (`synced.rs`) and of notes renamed in (`arrivals.rs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Smallest size at which expired entries are swept.
const FIRST_SWEEP: usize = 256;

/// A map of path -> when it was last noted, whose entries older than `ttl` count as absent.
///
/// Expired entries are swept when the map has doubled since the last sweep, so noting a path
/// costs amortised O(1) however many paths are live. (Sweeping on every insert once past a
/// fixed size cost O(live) per insert: at 1,000 notes/s with a 5 s time to live, ~15,000
/// entries scanned for each of the three writes of every note, as a CPU profile showed.)
#[derive(Debug)]
pub struct Recent {
    ttl: Duration,
    at: HashMap<PathBuf, Instant>,
    sweep_at: usize,
}

impl Default for Recent {
    /// Nothing counts as recent: a zero time to live.
    fn default() -> Recent {
        Recent::new(Duration::ZERO)
    }
}

impl Recent {
    pub fn new(ttl: Duration) -> Recent {
        Recent {
            ttl,
            at: HashMap::new(),
            sweep_at: FIRST_SWEEP,
        }
    }

    /// Notes `path` now.
    pub fn note(&mut self, path: &Path) {
        let now = Instant::now();
        if self.at.len() >= self.sweep_at {
            let ttl = self.ttl;
            self.at.retain(|_, at| now.duration_since(*at) < ttl);
            self.sweep_at = (self.at.len() * 2).max(FIRST_SWEEP);
        }
        self.at.insert(path.to_path_buf(), now);
    }

    /// How long ago `path` was noted, if within the time to live.
    pub fn age(&self, path: &Path) -> Option<Duration> {
        self.at
            .get(path)
            .map(Instant::elapsed)
            .filter(|age| *age < self.ttl)
    }

    /// Forgets `path`, returning how long ago it was noted if within the time to live.
    pub fn take(&mut self, path: &Path) -> Option<Duration> {
        self.at
            .remove(path)
            .map(|at| at.elapsed())
            .filter(|age| *age < self.ttl)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.at.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_counts_until_its_time_to_live_is_over() {
        // A long time to live while counting (a loaded machine may pause this thread for
        // long), then a tiny one to see it expire: no outcome depends on the scheduler.
        let mut r = Recent::new(Duration::from_secs(600));
        r.note(Path::new("a"));
        assert!(r.age(Path::new("a")).is_some());
        assert!(r.age(Path::new("b")).is_none());
        r.ttl = Duration::from_millis(1);
        std::thread::sleep(Duration::from_millis(5));
        assert!(r.age(Path::new("a")).is_none());
        assert!(
            r.take(Path::new("a")).is_none(),
            "an expired path is not taken"
        );
        r.ttl = Duration::from_secs(600);
        r.note(Path::new("a"));
        assert!(r.take(Path::new("a")).is_some());
        assert!(r.take(Path::new("a")).is_none());
    }

    #[test]
    fn expired_entries_are_swept_and_live_ones_kept() {
        let mut r = Recent::new(Duration::from_millis(30));
        for i in 0..FIRST_SWEEP {
            r.note(Path::new(&format!("old-{i}")));
        }
        std::thread::sleep(Duration::from_millis(40));
        r.note(Path::new("new")); // at the sweep size: the expired ones go
        assert_eq!(r.len(), 1);
        // Live entries are never swept: the next sweep waits until the map has doubled.
        let mut r = Recent::new(Duration::from_secs(60));
        for i in 0..10 * FIRST_SWEEP {
            r.note(Path::new(&format!("live-{i}")));
        }
        assert_eq!(r.len(), 10 * FIRST_SWEEP);
        assert!(r.sweep_at > r.len() / 2, "sweeps are spaced by doubling");
    }
}
