//! Retry with backoff for the built-in HTTP tools (docs/design.md §8.4): after a failed attempt, how
//! long to wait before the next one — jittered exponential steps, capped, at least what the
//! server's `Retry-After` asks — or why to stop (too many attempts, or the next attempt could
//! not start before the call's deadline). Callers decide *what* is worth retrying (search:
//! 429, 5xx and failed connections; webhooks: only a 429, because a 5xx may have posted);
//! this decides *when*, and is pure so it can be tested without a clock.

use reqwest::header::{HeaderMap, RETRY_AFTER};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A server's `Retry-After` longer than this is taken as this (it is past any deadline anyway).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// How one kind of request is retried.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    /// The first step; doubled each retry up to `max`. Zero: wait only what `Retry-After` says.
    pub base: Duration,
    pub max: Duration,
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The next attempt must be able to start at least this long before the deadline: one
    /// with less time would only turn a clear "answered 500" into a vague TIMEOUT.
    pub min_attempt_time: Duration,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Sleep this long, then try again.
    Wait(Duration),
    /// Give up, for this reason.
    Stop(Stop),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// `max_attempts` have been made.
    Attempts,
    /// Waiting would leave no time for another attempt before the deadline. `asked` is the
    /// server's `Retry-After` when that (not our own backoff) was the wait.
    Deadline { asked: Option<Duration> },
}

impl Backoff {
    /// After `attempts` failed attempts (the first failure is 1), with the server's
    /// `Retry-After` if it sent one, at `now`, for a call that must end by `deadline`.
    pub fn after_failure(
        &self,
        attempts: u32,
        retry_after: Option<Duration>,
        now: Instant,
        deadline: Instant,
    ) -> Decision {
        if attempts >= self.max_attempts {
            return Decision::Stop(Stop::Attempts);
        }
        let backoff = jittered(self.step(attempts.saturating_sub(1)));
        // Retry-After is the server's minimum; our own backoff still spaces attempts out when
        // it says 0.
        let delay = retry_after.map_or(backoff, |r| r.min(MAX_RETRY_AFTER).max(backoff));
        let fits = now
            .checked_add(delay + self.min_attempt_time)
            .is_some_and(|start| start < deadline);
        if !fits {
            let asked = retry_after.filter(|r| *r >= backoff);
            return Decision::Stop(Stop::Deadline { asked });
        }
        Decision::Wait(delay)
    }

    /// The un-jittered wait before retry number `retries_so_far + 1`: base, 2×base, 4×base, …
    /// up to `max`.
    fn step(&self, retries_so_far: u32) -> Duration {
        self.base
            .saturating_mul(1u32 << retries_so_far.min(16))
            .min(self.max)
    }
}

/// A delay between half and all of `step`, so that calls failing together do not retry
/// together. The randomness comes from the clock's nanoseconds: no rand crate needed.
fn jittered(step: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mixed = u64::from(nanos).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
    let fraction = mixed as f64 / (1u64 << 53) as f64;
    step / 2 + step.mul_f64(fraction / 2.0)
}

/// The `Retry-After` header in seconds (integer or decimal). The HTTP-date form is rare for
/// APIs and falls back to the caller's own backoff.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    parse_retry_after(headers.get(RETRY_AFTER)?.to_str().ok()?)
}

fn parse_retry_after(value: &str) -> Option<Duration> {
    seconds(value.trim().parse::<f64>().ok()?)
}

/// A wait given in seconds (a header, or a JSON body like Discord's `retry_after`); None when
/// negative or not a number.
pub(crate) fn seconds(s: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .map(|d| d.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEARCH_LIKE: Backoff = Backoff {
        base: Duration::from_millis(200),
        max: Duration::from_secs(5),
        max_attempts: 6,
        min_attempt_time: Duration::from_millis(250),
    };

    fn far() -> (Instant, Instant) {
        let now = Instant::now();
        (now, now + Duration::from_secs(3600))
    }

    fn wait(d: Decision) -> Duration {
        match d {
            Decision::Wait(d) => d,
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    #[test]
    fn steps_double_up_to_the_cap() {
        assert_eq!(SEARCH_LIKE.step(0), Duration::from_millis(200));
        assert_eq!(SEARCH_LIKE.step(1), Duration::from_millis(400));
        assert_eq!(SEARCH_LIKE.step(4), Duration::from_millis(3200));
        assert_eq!(SEARCH_LIKE.step(5), Duration::from_secs(5));
        assert_eq!(SEARCH_LIKE.step(40), Duration::from_secs(5));
    }

    #[test]
    fn waits_are_jittered_in_the_upper_half_of_the_capped_step() {
        let (now, deadline) = far();
        for attempts in 1..SEARCH_LIKE.max_attempts {
            let step = SEARCH_LIKE.step(attempts - 1);
            for _ in 0..50 {
                let d = wait(SEARCH_LIKE.after_failure(attempts, None, now, deadline));
                assert!(d >= step / 2 && d <= step, "{attempts}: {d:?} vs {step:?}");
                assert!(d <= SEARCH_LIKE.max);
            }
        }
    }

    #[test]
    fn retry_after_is_honoured_as_a_minimum() {
        let (now, deadline) = far();
        let d = wait(SEARCH_LIKE.after_failure(1, Some(Duration::from_secs(7)), now, deadline));
        assert_eq!(d, Duration::from_secs(7));
        // Retry-After: 0 does not mean hammering: the backoff still applies.
        let d = wait(SEARCH_LIKE.after_failure(3, Some(Duration::ZERO), now, deadline));
        assert!(d >= Duration::from_millis(400), "{d:?}");
        // Without a base (webhooks), the wait is exactly what the server asked.
        let exact = Backoff {
            base: Duration::ZERO,
            max: Duration::ZERO,
            ..SEARCH_LIKE
        };
        let d = wait(exact.after_failure(1, Some(Duration::from_millis(1500)), now, deadline));
        assert_eq!(d, Duration::from_millis(1500));
    }

    #[test]
    fn stops_after_max_attempts() {
        let (now, deadline) = far();
        assert!(matches!(
            SEARCH_LIKE.after_failure(5, None, now, deadline),
            Decision::Wait(_)
        ));
        assert_eq!(
            SEARCH_LIKE.after_failure(6, None, now, deadline),
            Decision::Stop(Stop::Attempts)
        );
    }

    #[test]
    fn stops_when_the_next_attempt_could_not_start_before_the_deadline() {
        let now = Instant::now();
        // 200 ms of backoff (at most) + 250 ms for the attempt do not fit in 300 ms.
        assert_eq!(
            SEARCH_LIKE.after_failure(1, None, now, now + Duration::from_millis(300)),
            Decision::Stop(Stop::Deadline { asked: None })
        );
        // They fit in a second.
        assert!(matches!(
            SEARCH_LIKE.after_failure(1, None, now, now + Duration::from_secs(1)),
            Decision::Wait(_)
        ));
        // A Retry-After past the deadline is named as the reason.
        assert_eq!(
            SEARCH_LIKE.after_failure(
                1,
                Some(Duration::from_secs(3600)),
                now,
                now + Duration::from_secs(30)
            ),
            Decision::Stop(Stop::Deadline {
                asked: Some(Duration::from_secs(3600))
            })
        );
        // A deadline already passed stops at once.
        assert_eq!(
            SEARCH_LIKE.after_failure(1, Some(Duration::ZERO), now, now),
            Decision::Stop(Stop::Deadline { asked: None })
        );
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_capped() {
        assert_eq!(parse_retry_after(" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("0"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2026 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(parse_retry_after("99999999"), Some(MAX_RETRY_AFTER));
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
    }
}
