//! Durability against machine crashes, without an fsync per chunk.
//!
//! The blob store makes puts durable in batches ([`BlobStore::sync`], every `--sync-interval` and at
//! shutdown). After a machine crash, the store reports from which instant puts may be lost; the
//! entries finalized after that instant are forgotten at start-up, before any request is
//! served, so a lost or torn chunk is never served as a hit. A process crash loses nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::blob::BlobStore;
use crate::meta::{Health, MetaStore};

use super::CacheError;

/// At start-up: forgets what a machine crash may have destroyed, then records a fresh sync.
/// Does nothing after a clean stop or a process crash.
pub async fn recover(
    meta: &dyn MetaStore,
    blobs: &dyn BlobStore,
    now: crate::model::Millis,
) -> Result<(), CacheError> {
    if let Some(since) = blobs.lost_since() {
        let (entries, garbage) = meta.forget_after(since, now).await?;
        tracing::warn!(
            entries,
            "the machine restarted since the last sync to disk: forgot the entries finalized after it, and aborted open uploads"
        );
        // The forgetting reaches the disk before any chunk file goes: a crash in between then
        // forgets the same entries again, and never finds an entry whose chunks were deleted.
        meta.checkpoint().await?;
        // A chunk of a forgotten entry that a kept one names too (a promotion made the
        // forgotten entry over the chunks of an older one) stays.
        let mut kept = std::collections::HashSet::new();
        for batch in garbage.chunks(500) {
            kept.extend(meta.referenced(batch).await?);
        }
        for name in garbage.iter().filter(|name| !kept.contains(name)) {
            let _ = blobs.delete(name).await;
        }
        // Records this boot, so a later restart does not forget anything again.
        blobs.sync(true).await?;
    }
    Ok(())
}

/// Syncs the blob store, then checkpoints the metadata store.
async fn sync_both(meta: &dyn Health, blobs: &dyn BlobStore, force: bool) {
    if let Err(e) = blobs.sync(force).await {
        tracing::error!(error = %e, "could not sync stored chunks to disk");
    }
    if let Err(e) = meta.checkpoint().await {
        tracing::error!(error = %e, "could not checkpoint the database");
    }
}

/// Syncs every `every` until `stop`, then once more.
pub async fn run(
    meta: Arc<dyn Health>,
    blobs: Arc<dyn BlobStore>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = meta.wants_checkpoint() => {}
            () = stop.cancelled() => break,
        }
        sync_both(meta.as_ref(), blobs.as_ref(), false).await;
    }
    // At shutdown the record always advances: every entry finalized so far is durable.
    sync_both(meta.as_ref(), blobs.as_ref(), true).await;
}
