//! A [`MetaStore`] that times every operation of the store it wraps, for
//! `hoard_database_operation_duration_seconds{operation}` (the operation is the method's name).

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use super::{
    EntryChunk, EntryFilter, EntryPage, FinalizeState, ListedEntry, MetaError, MetaStore, NewEntry,
    NewUpload, Removal, RepositoryUsage, SlotState, Totals,
};
use crate::metrics::Metrics;
use crate::model::{
    BlobName, BlockId, Candidate, Chunk, Entry, EntryId, EntryUse, Millis, RepoId, Scope, Slot,
    Upload, UploadBlocks, UploadId, Version,
};

#[derive(Debug)]
pub struct Timed {
    inner: Arc<dyn MetaStore>,
    metrics: Arc<Metrics>,
}

impl Timed {
    pub fn new(inner: Arc<dyn MetaStore>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    async fn time<T>(&self, operation: &'static str, work: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = work.await;
        self.metrics.database(operation, started.elapsed());
        out
    }
}

#[async_trait]
impl MetaStore for Timed {
    async fn ping(&self) -> Result<(), MetaError> {
        self.time("ping", self.inner.ping()).await
    }

    async fn checkpoint(&self) -> Result<(), MetaError> {
        self.time("checkpoint", self.inner.checkpoint()).await
    }

    async fn wants_checkpoint(&self) {
        self.inner.wants_checkpoint().await
    }

    async fn slot_state(&self, slot: &Slot, live_since: Millis) -> Result<SlotState, MetaError> {
        self.time("slot_state", self.inner.slot_state(slot, live_since))
            .await
    }

    async fn upload(&self, id: UploadId) -> Result<Option<Upload>, MetaError> {
        self.time("upload", self.inner.upload(id)).await
    }

    async fn upload_with_blocks(
        &self,
        id: UploadId,
    ) -> Result<Option<(Upload, UploadBlocks)>, MetaError> {
        self.time("upload_with_blocks", self.inner.upload_with_blocks(id))
            .await
    }

    async fn finalize_state(&self, slot: &Slot) -> Result<FinalizeState, MetaError> {
        self.time("finalize_state", self.inner.finalize_state(slot))
            .await
    }

    async fn find_candidates(
        &self,
        repository: &RepoId,
        version: &Version,
        scopes: &[Scope],
        folded_keys: &[String],
    ) -> Result<Vec<Candidate>, MetaError> {
        self.time(
            "find_candidates",
            self.inner
                .find_candidates(repository, version, scopes, folded_keys),
        )
        .await
    }

    async fn entries_with_key(
        &self,
        repository: &RepoId,
        scope: &Scope,
        folded_key: &str,
        limit: usize,
    ) -> Result<Vec<Entry>, MetaError> {
        self.time(
            "entries_with_key",
            self.inner
                .entries_with_key(repository, scope, folded_key, limit),
        )
        .await
    }

    async fn entry(&self, id: EntryId) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        self.time("entry", self.inner.entry(id)).await
    }

    async fn create_upload(
        &self,
        new: NewUpload<'_>,
        replacing: Option<&Upload>,
    ) -> Result<UploadId, MetaError> {
        self.time("create_upload", self.inner.create_upload(new, replacing))
            .await
    }

    async fn stage_block(
        &self,
        upload: &Upload,
        block: &BlockId,
        chunk: &Chunk,
        now: Millis,
    ) -> Result<(), MetaError> {
        self.time(
            "stage_block",
            self.inner.stage_block(upload, block, chunk, now),
        )
        .await
    }

    async fn abort_upload(&self, upload: &Upload, now: Millis) -> Result<(), MetaError> {
        self.time("abort_upload", self.inner.abort_upload(upload, now))
            .await
    }

    async fn finalize(&self, upload: &Upload, entry: NewEntry<'_>) -> Result<EntryId, MetaError> {
        self.time("finalize", self.inner.finalize(upload, entry))
            .await
    }

    async fn list_entries(&self, page: &EntryPage<'_>) -> Result<Vec<ListedEntry>, MetaError> {
        self.time("list_entries", self.inner.list_entries(page))
            .await
    }

    async fn count_entries(&self, filter: &EntryFilter) -> Result<u64, MetaError> {
        self.time("count_entries", self.inner.count_entries(filter))
            .await
    }

    async fn repositories(
        &self,
        only: Option<&str>,
        limit: usize,
    ) -> Result<Vec<RepositoryUsage>, MetaError> {
        self.time("repositories", self.inner.repositories(only, limit))
            .await
    }

    async fn count_repositories(&self) -> Result<u64, MetaError> {
        self.time("count_repositories", self.inner.count_repositories())
            .await
    }

    async fn repository_usage(&self, repository: &RepoId) -> Result<u64, MetaError> {
        self.time("repository_usage", self.inner.repository_usage(repository))
            .await
    }

    async fn total_usage(&self) -> Result<u64, MetaError> {
        self.time("total_usage", self.inner.total_usage()).await
    }

    async fn totals(&self) -> Result<Totals, MetaError> {
        self.time("totals", self.inner.totals()).await
    }

    async fn pending_deletions(&self) -> Result<u64, MetaError> {
        self.time("pending_deletions", self.inner.pending_deletions())
            .await
    }

    async fn least_recently_used(
        &self,
        repository: Option<&RepoId>,
        limit: usize,
    ) -> Result<Vec<EntryUse>, MetaError> {
        self.time(
            "least_recently_used",
            self.inner.least_recently_used(repository, limit),
        )
        .await
    }

    async fn expired(
        &self,
        unused_before: Millis,
        created_before: Option<Millis>,
        limit: usize,
    ) -> Result<Vec<EntryUse>, MetaError> {
        self.time(
            "expired",
            self.inner.expired(unused_before, created_before, limit),
        )
        .await
    }

    async fn remove_entries(
        &self,
        ids: &[EntryId],
        removal: Removal<'_>,
    ) -> Result<Vec<EntryUse>, MetaError> {
        self.time("remove_entries", self.inner.remove_entries(ids, removal))
            .await
    }

    async fn due_deletions(&self, now: Millis, limit: usize) -> Result<Vec<BlobName>, MetaError> {
        self.time("due_deletions", self.inner.due_deletions(now, limit))
            .await
    }

    async fn deletions_done(&self, names: &[BlobName]) -> Result<(), MetaError> {
        self.time("deletions_done", self.inner.deletions_done(names))
            .await
    }

    async fn referenced(&self, names: &[BlobName]) -> Result<Vec<BlobName>, MetaError> {
        self.time("referenced", self.inner.referenced(names)).await
    }

    async fn stale_uploads(
        &self,
        created_before: Millis,
        limit: usize,
    ) -> Result<Vec<UploadId>, MetaError> {
        self.time(
            "stale_uploads",
            self.inner.stale_uploads(created_before, limit),
        )
        .await
    }

    async fn prune_uploads(&self, created_before: Millis) -> Result<u64, MetaError> {
        self.time("prune_uploads", self.inner.prune_uploads(created_before))
            .await
    }

    async fn entry_ids(&self, after: EntryId, limit: usize) -> Result<Vec<EntryId>, MetaError> {
        self.time("entry_ids", self.inner.entry_ids(after, limit))
            .await
    }

    async fn forget_after(
        &self,
        since: Millis,
        now: Millis,
    ) -> Result<(usize, Vec<BlobName>), MetaError> {
        self.time("forget_after", self.inner.forget_after(since, now))
            .await
    }

    async fn commit_parts(
        &self,
        upload: &Upload,
        parts: &[(BlockId, Chunk)],
        now: Millis,
    ) -> Result<(), MetaError> {
        self.time("commit_parts", self.inner.commit_parts(upload, parts, now))
            .await
    }

    async fn record_hits(&self, hits: &[(EntryId, u64, Millis)]) -> Result<(), MetaError> {
        self.time("record_hits", self.inner.record_hits(hits)).await
    }

    async fn record_misses(&self, misses: &[(RepoId, String, u64)]) -> Result<(), MetaError> {
        self.time("record_misses", self.inner.record_misses(misses))
            .await
    }
}
