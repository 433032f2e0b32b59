//! How a background loop behaves while the database is away: each failed round doubles the
//! wait before the next try, from `first` up to `max`, so a long outage costs a try every
//! `max` (each try one acquire timeout) rather than one every interval; and the outage is
//! logged when it starts and when it ends, not on every round. A round that succeeds puts the
//! loop back on its own interval, and that round writes what the failed ones kept.

use std::time::Duration;

/// The failures of a loop's latest rounds.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    /// Rounds that failed in a row.
    failures: u32,
}

impl Backoff {
    /// Retries first after `first`, doubling up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max: max.max(first),
            failures: 0,
        }
    }

    /// How long to wait before the next try after failures; `None` when the last round
    /// succeeded (the loop keeps its own interval).
    pub fn retry_in(&self) -> Option<Duration> {
        let doublings = self.failures.checked_sub(1)?.min(16);
        Some(self.first.saturating_mul(1 << doublings).min(self.max))
    }

    /// A round failed; true if it is the first of an outage (the one to log loudly).
    pub fn failed(&mut self) -> bool {
        self.failures = self.failures.saturating_add(1);
        self.failures == 1
    }

    /// A round succeeded; the rounds that failed before it, if an outage just ended.
    pub fn succeeded(&mut self) -> Option<u32> {
        Some(std::mem::take(&mut self.failures)).filter(|&n| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn waits_double_up_to_the_bound_and_a_success_resets_them() {
        let mut b = Backoff::new(2 * S, 16 * S);
        assert_eq!(b.retry_in(), None, "healthy: the loop's own interval");
        assert!(b.failed(), "the first failure starts an outage");
        let mut waits = vec![b.retry_in().unwrap()];
        for _ in 0..5 {
            assert!(!b.failed(), "later failures are the same outage");
            waits.push(b.retry_in().unwrap());
        }
        assert_eq!(waits, [2 * S, 4 * S, 8 * S, 16 * S, 16 * S, 16 * S]);
        assert_eq!(b.succeeded(), Some(6), "the outage ends, with its length");
        assert_eq!(b.retry_in(), None);
        assert_eq!(b.succeeded(), None, "nothing to report twice");
        assert!(b.failed(), "a new outage is logged again");
    }

    #[test]
    fn a_long_outage_does_not_overflow() {
        let mut b = Backoff::new(10 * S, 600 * S);
        for _ in 0..100_000 {
            b.failed();
        }
        assert_eq!(b.retry_in(), Some(600 * S));
        assert_eq!(Backoff::new(5 * S, S).retry_in(), None);
    }
}
