//! Restore bookkeeping (last-used time and hit count) kept in memory and written in batches.
//!
//! Every hit used to be one write transaction on the lookup path; a restore-heavy workload then
//! queued on the database writer. Hits are now folded per entry and flushed every second (and at
//! shutdown), so a lookup does no write at all. The cost: after a crash, up to one second of hit
//! counts is lost, which only makes eviction slightly less precise.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::meta::MetaStore;
use crate::model::{EntryId, Millis};

pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Hits not yet written: entry → (hits, latest use).
#[derive(Debug, Default, Clone)]
pub struct UsageBuffer(Arc<Mutex<HashMap<EntryId, (u64, Millis)>>>);

impl UsageBuffer {
    pub fn record(&self, entry: EntryId, now: Millis) {
        let mut pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let slot = pending.entry(entry).or_insert((0, now));
        slot.0 += 1;
        slot.1 = slot.1.max(now);
    }

    /// The latest restore of `entry` not yet written, if any.
    pub fn pending_use(&self, entry: EntryId) -> Option<Millis> {
        let pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        pending.get(&entry).map(|(_, last)| *last)
    }

    fn take(&self) -> Vec<(EntryId, u64, Millis)> {
        let mut pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        pending
            .drain()
            .map(|(id, (hits, last))| (id, hits, last))
            .collect()
    }

    /// Writes what is pending; on failure the hits are kept for the next try.
    pub async fn flush(&self, meta: &dyn MetaStore) {
        let batch = self.take();
        if batch.is_empty() {
            return;
        }
        if let Err(e) = meta.record_hits(&batch).await {
            tracing::warn!(error = %e, "could not record restores; will retry");
            let mut pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
            for (id, hits, last) in batch {
                let slot = pending.entry(id).or_insert((0, last));
                slot.0 += hits;
                slot.1 = slot.1.max(last);
            }
        }
    }

    /// Flushes every [`FLUSH_EVERY`] until `stop`, then once more.
    pub async fn run(self, meta: Arc<dyn MetaStore>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.flush(meta.as_ref()).await,
                () = stop.cancelled() => break,
            }
        }
        self.flush(meta.as_ref()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_fold_per_entry() {
        let buf = UsageBuffer::default();
        buf.record(1, 10);
        buf.record(1, 30);
        buf.record(1, 20);
        buf.record(2, 5);
        let mut batch = buf.take();
        batch.sort();
        assert_eq!(batch, [(1, 3, 30), (2, 1, 5)]);
        assert!(buf.take().is_empty());
    }
}
