//! Restore bookkeeping (last-used time and hit count, and each repository's misses) kept in
//! memory and written in batches, with the family statistics (`super::family_stats`).
//!
//! Every hit used to be one write transaction on the lookup path; a restore-heavy workload then
//! queued on the database writer. Hits are now folded per entry and flushed every second (and at
//! shutdown), so a lookup does no write at all. The cost: after a crash, up to one second of hit
//! counts is lost, which only makes eviction slightly less precise.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::family_stats::FamilyStats;
use crate::meta::{MetaStore, RestoreStore};
use crate::model::{Clock, EntryId, Millis, RepoId};

pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Restores and misses not yet written.
#[derive(Debug, Default, Clone)]
pub struct UsageBuffer(Arc<Mutex<Pending>>);

#[derive(Debug, Default)]
struct Pending {
    /// Entry → (hits, latest use).
    hits: HashMap<EntryId, (u64, Millis)>,
    /// Repository → (its name, lookups that found nothing).
    misses: HashMap<RepoId, (String, u64)>,
}

type Batch = (Vec<(EntryId, u64, Millis)>, Vec<(RepoId, String, u64)>);

impl UsageBuffer {
    fn pending_batch(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn record(&self, entry: EntryId, now: Millis) {
        let mut pending = self.pending_batch();
        let slot = pending.hits.entry(entry).or_insert((0, now));
        slot.0 += 1;
        slot.1 = slot.1.max(now);
    }

    /// A lookup of `repository` (called `name` by its caller, or "") that found nothing.
    pub fn record_miss(&self, repository: &RepoId, name: &str) {
        let mut pending = self.pending_batch();
        match pending.misses.get_mut(repository) {
            Some(slot) => {
                slot.1 += 1;
                if slot.0.is_empty() && !name.is_empty() {
                    slot.0 = name.to_owned();
                }
            }
            None => {
                pending
                    .misses
                    .insert(repository.clone(), (name.to_owned(), 1));
            }
        }
    }

    /// The latest restore of `entry` not yet written, if any.
    pub fn pending_use(&self, entry: EntryId) -> Option<Millis> {
        self.pending_batch().hits.get(&entry).map(|(_, last)| *last)
    }

    /// What is pending, sorted: every process then writes rows in the same order, so two
    /// flushes to a shared database never wait on each other in a cycle.
    fn take(&self) -> Batch {
        let mut pending = self.pending_batch();
        let mut hits: Vec<_> = pending
            .hits
            .drain()
            .map(|(id, (hits, last))| (id, hits, last))
            .collect();
        let mut misses: Vec<_> = pending
            .misses
            .drain()
            .map(|(repository, (name, n))| (repository, name, n))
            .collect();
        drop(pending);
        hits.sort_unstable();
        misses.sort_unstable();
        (hits, misses)
    }

    /// Writes what is pending; on failure it is kept for the next try.
    pub async fn flush(&self, meta: &dyn RestoreStore) {
        let (hits, misses) = self.take();
        if !hits.is_empty() {
            if let Err(e) = meta.record_hits(&hits).await {
                tracing::warn!(error = %e, "could not record restores; will retry");
                let mut pending = self.pending_batch();
                for (id, n, last) in hits {
                    let slot = pending.hits.entry(id).or_insert((0, last));
                    slot.0 += n;
                    slot.1 = slot.1.max(last);
                }
            }
        }
        if !misses.is_empty() {
            if let Err(e) = meta.record_misses(&misses).await {
                tracing::warn!(error = %e, "could not record lookup misses; will retry");
                let mut pending = self.pending_batch();
                for (repository, name, n) in misses {
                    pending.misses.entry(repository).or_insert((name, 0)).1 += n;
                }
            }
        }
    }

    /// Flushes every [`FLUSH_EVERY`] until `stop`, then once more; the family statistics
    /// (`stats`) are written in the same round, after the restores.
    pub async fn run(
        self,
        meta: Arc<dyn MetaStore>,
        stats: FamilyStats,
        clock: Arc<dyn Clock>,
        stop: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => break,
            }
            self.flush(meta.as_ref()).await;
            stats.flush(meta.as_ref(), clock.now()).await;
        }
        self.flush(meta.as_ref()).await;
        stats.flush(meta.as_ref(), clock.now()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_fold_per_entry() {
        let buf = UsageBuffer::default();
        let (one, two) = (EntryId::new(1), EntryId::new(2));
        buf.record(one, 10);
        buf.record(one, 30);
        buf.record(one, 20);
        buf.record(two, 5);
        let (batch, _) = buf.take();
        assert_eq!(batch, [(one, 3, 30), (two, 1, 5)], "folded, in entry order");
        assert!(buf.take().0.is_empty());
    }

    #[test]
    fn misses_fold_per_repository_and_keep_a_name() {
        let buf = UsageBuffer::default();
        let (a, b) = (RepoId::new("1"), RepoId::new("2"));
        buf.record_miss(&b, "");
        buf.record_miss(&a, "octo/a");
        buf.record_miss(&a, "");
        buf.record_miss(&b, "octo/b");
        let (_, batch) = buf.take();
        assert_eq!(
            batch,
            [(a, "octo/a".into(), 2), (b, "octo/b".into(), 2)],
            "folded, named, in repository order"
        );
        assert!(buf.take().1.is_empty());
    }
}
