//! When the digest pass may run: while the cache is quiet, or once the work has waited long
//! enough.
//!
//! The pass's thread runs in the kernel's idle class, so it never holds a core a request wants.
//! That is not enough on a small machine: between two requests it fills every gap, and the
//! cores' caches, the memory bus and the page cache's locks are then shared with a SHA-256 over
//! gigabytes. Measured on 2 cores, the requests of a busy fleet moved 10–15% less with the pass
//! running beside them than without it. So the pass also waits until the cache has served no
//! request for [`QUIET`] (none in flight, none ended since), and runs regardless once an entry
//! has waited [`MAX_DEFERRAL`]: under unbroken load, digests lag by about that much, and
//! then as much as the idle class allows. The pass looks again before each block it reads, so a
//! request that arrives while a large chunk is being hashed stops the hashing within a block.
//!
//! Only the cache's own requests count (lookups, saves, downloads): an operator polling the admin
//! API or a scrape of the metrics does not hold the pass back.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::{Clock, Millis};

/// How long the cache must have served nothing before the pass runs.
pub(super) const QUIET: Duration = Duration::from_millis(250);

/// How long an entry waits for a quiet moment at most.
pub(super) const MAX_DEFERRAL: Duration = Duration::from_secs(30);

/// The machine's monotonic time since the process started: a change of the wall clock never
/// stalls the pass.
#[derive(Debug)]
pub(super) struct Monotonic(Instant);

impl Default for Monotonic {
    fn default() -> Self {
        Self(Instant::now())
    }
}

impl Clock for Monotonic {
    fn now(&self) -> Millis {
        self.0.elapsed().as_millis() as Millis
    }
}

/// The cache's requests in flight, and when one last ended: the server counts each
/// request of the cache's protocols from its arrival to the end of its response.
#[derive(Debug)]
pub struct Traffic {
    clock: Arc<dyn Clock>,
    in_flight: AtomicUsize,
    last_request: AtomicI64,
}

/// A request being served; it ends when this is dropped.
#[derive(Debug)]
pub struct Serving(Arc<Traffic>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.request_ended();
        // Release: whoever sees the count drop also sees when the request ended.
        self.0.in_flight.fetch_sub(1, Ordering::Release);
    }
}

impl Default for Traffic {
    fn default() -> Self {
        Self::new(Arc::new(Monotonic::default()))
    }
}

impl Traffic {
    pub(super) fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            in_flight: AtomicUsize::new(0),
            last_request: AtomicI64::new(Millis::MIN / 2),
        }
    }

    /// The time work is queued at, on this clock.
    pub(super) fn now(&self) -> Millis {
        self.clock.now()
    }

    /// A request begins; it is in flight until the value returned is dropped. Its start needs
    /// no time of its own: the pass waits while it is in flight, and then from its end.
    pub fn begin(self: &Arc<Self>) -> Serving {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Serving(self.clone())
    }

    /// A request ends: the quiet starts over.
    pub(super) fn request_ended(&self) {
        self.last_request.store(self.clock.now(), Ordering::Relaxed);
    }

    /// How long work queued at `queued` should still wait; zero once it may run.
    pub(super) fn wait_for(&self, queued: Millis) -> Duration {
        let now = self.clock.now();
        let millis = |d: Duration| d.as_millis() as Millis;
        let quiet_in = if self.in_flight.load(Ordering::Acquire) > 0 {
            millis(QUIET)
        } else {
            self.last_request.load(Ordering::Relaxed) + millis(QUIET) - now
        };
        let overdue_in = queued.saturating_add(millis(MAX_DEFERRAL)) - now;
        Duration::from_millis(quiet_in.min(overdue_in).max(0) as u64)
    }

    /// Blocks the calling thread until work queued at `queued` may run.
    pub(super) fn block_until_ready(&self, queued: Millis) {
        loop {
            let wait = self.wait_for(queued);
            if wait.is_zero() {
                return;
            }
            std::thread::sleep(wait);
        }
    }

    /// Waits until work queued at `queued` may run.
    pub(super) async fn until_ready(&self, queued: Millis) {
        loop {
            let wait = self.wait_for(queued);
            if wait.is_zero() {
                return;
            }
            // Requests may come meanwhile: look again after the wait.
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ManualClock;

    fn traffic() -> (Arc<ManualClock>, Traffic) {
        let clock = Arc::new(ManualClock::starting_at(1_000_000));
        (clock.clone(), Traffic::new(clock))
    }

    #[test]
    fn work_runs_at_once_on_a_cache_that_served_nothing() {
        let (_, traffic) = traffic();
        assert_eq!(traffic.wait_for(traffic.now()), Duration::ZERO);
    }

    #[test]
    fn work_waits_until_the_cache_has_been_quiet_long_enough() {
        let (clock, traffic) = traffic();
        let queued = traffic.now();
        traffic.request_ended();
        assert_eq!(traffic.wait_for(queued), QUIET);
        clock.advance(Duration::from_millis(100));
        assert_eq!(traffic.wait_for(queued), QUIET - Duration::from_millis(100));
        // Another request starts the quiet over.
        traffic.request_ended();
        assert_eq!(traffic.wait_for(queued), QUIET);
        clock.advance(QUIET);
        assert_eq!(traffic.wait_for(queued), Duration::ZERO);
    }

    #[test]
    fn work_that_waited_its_longest_runs_under_unbroken_traffic() {
        let (clock, traffic) = traffic();
        let queued = traffic.now();
        let step = Duration::from_millis(100);
        let mut waited = Duration::ZERO;
        while waited + step < MAX_DEFERRAL {
            traffic.request_ended();
            assert!(!traffic.wait_for(queued).is_zero(), "after {waited:?}");
            clock.advance(step);
            waited += step;
        }
        traffic.request_ended();
        assert_eq!(traffic.wait_for(queued), MAX_DEFERRAL - waited);
        clock.advance(MAX_DEFERRAL - waited);
        traffic.request_ended();
        assert_eq!(traffic.wait_for(queued), Duration::ZERO);
        // Work queued later still waits for its own quiet.
        assert_eq!(traffic.wait_for(traffic.now()), QUIET);
    }

    #[test]
    fn a_request_in_flight_keeps_the_cache_busy_until_it_ends() {
        let (clock, traffic) = traffic();
        let traffic = Arc::new(traffic);
        let queued = traffic.now();
        let long_download = traffic.begin();
        clock.advance(QUIET * 4);
        assert_eq!(traffic.wait_for(queued), QUIET, "busy while it streams");
        drop(long_download);
        assert_eq!(traffic.wait_for(queued), QUIET, "quiet counts from its end");
        clock.advance(QUIET);
        assert_eq!(traffic.wait_for(queued), Duration::ZERO);
    }
}
