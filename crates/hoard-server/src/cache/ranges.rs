//! The legacy protocol's uploads (PROTOCOL.md §5): a reservation is addressed by its id, each
//! `PATCH` range is a chunk at its offset, and the commit turns ranges that tile the entry
//! exactly into the same entry a v2 upload makes. No merge step: the ranges stay chunks.

use std::sync::Arc;

use super::upload::{self, RangeProblem};
use super::{retry_stale, Cache, CacheError, LinkedUpload, OpenEntry};
use crate::auth::Identity;
use crate::blob::ByteStream;
use crate::meta::UploadChange;
use crate::model::{
    BlockId, CacheKey, Entry, EntryFilter, EntryId, EntryPage, Slot, Upload, UploadId, UploadState,
    Version,
};

/// Most entries one listing returns.
pub const MAX_LISTED: usize = 100;

impl Cache {
    /// The upload `id` if `who` may write it: its repository and write scope. Anyone else's
    /// upload is not found, so ids reveal nothing.
    pub async fn writable_upload(
        &self,
        who: &Identity,
        id: UploadId,
    ) -> Result<LinkedUpload, CacheError> {
        self.check_writer_of(who, id).await?;
        let linked = self.upload(id).await?;
        writes_to(who, &linked.upload)?;
        Ok(linked)
    }

    /// Refuses a write unless the token has a write scope the write policy allows.
    fn check_writer(&self, who: &Identity) -> Result<(), CacheError> {
        let write_scope = who.write_scope.as_ref().ok_or(CacheError::WriteDenied)?;
        self.check_write_policy(who, write_scope)
    }

    /// [`Cache::check_writer`] for a write to upload `id`; a write the policy refuses ends
    /// the upload if it is `who`'s, so that its staged bytes never become an entry.
    async fn check_writer_of(&self, who: &Identity, id: UploadId) -> Result<(), CacheError> {
        match self.check_writer(who) {
            Err(refused @ CacheError::WriteDeniedByPolicy(_)) => {
                if let Ok(linked) = self.upload(id).await {
                    if writes_to(who, &linked.upload).is_ok() {
                        // Counted once: the upload ends here, so a later write finds none.
                        if let Ok(key) = CacheKey::parse(&linked.upload.key) {
                            self.count_refused_write(who, &linked.upload.scope, &key);
                        }
                        self.abandon_refused(id).await;
                    }
                }
                Err(refused)
            }
            other => other,
        }
    }

    /// `PATCH caches/{id}`: stores bytes `[start, start + len)` of the upload. A retried range
    /// (same start) replaces its earlier copy.
    pub async fn stage_range(
        &self,
        who: &Identity,
        id: UploadId,
        start: u64,
        len: u64,
        body: ByteStream,
    ) -> Result<(), CacheError> {
        let max = self.policy.max_entry_size;
        if start.saturating_add(len) > max {
            return Err(CacheError::TooLarge(max));
        }
        self.check_writer_of(who, id).await?;
        let block = BlockId::range(start);
        let target = self.block_target(id, &block).await?;
        writes_to(who, &target.upload)?;
        self.stage_block(&target, block, body, Some(len)).await
    }

    /// `POST caches/{id}`: the ranges must tile `[0, size)`; they become the entry. Ranges that
    /// do not (a gap, an overlap, another size) abort the upload: nothing becomes visible and
    /// the key is free for the next save. A retried commit answers the entry again.
    pub async fn commit_ranges(
        &self,
        who: &Identity,
        id: UploadId,
        size: u64,
    ) -> Result<EntryId, CacheError> {
        let max = self.policy.max_entry_size;
        if size > max {
            return Err(CacheError::TooLarge(max));
        }
        let linked = self.writable_upload(who, id).await?;
        let slot = slot_of(&linked.upload)?;
        match linked.upload.state {
            UploadState::Aborted => return Err(CacheError::UploadClosed),
            UploadState::Finalized => {}
            UploadState::Open => self.commit_tiled(&linked, size).await?,
        }
        retry_stale(|_| self.try_finalize(who, &slot, size, Some(id), None)).await
    }

    async fn commit_tiled(&self, linked: &LinkedUpload, size: u64) -> Result<(), CacheError> {
        let (linked, size) = (linked, size);
        let outcome = retry_stale(|attempt| async move {
            let (upload, blocks) = self.decide_on(linked, attempt).await?;
            let now = self.clock.now();
            match upload::tile_ranges(&blocks, size) {
                Ok(assembly) => {
                    self.meta
                        .change_upload(&upload, UploadChange::Commit(&assembly.parts), now)
                        .await?;
                    Ok(Ok(assembly.garbage))
                }
                Err(problem) => {
                    self.meta
                        .change_upload(&upload, UploadChange::Abort, now)
                        .await?;
                    Ok(Err((problem, blocks.blobs())))
                }
            }
        })
        .await?;
        match outcome {
            Ok(garbage) => {
                self.collect(garbage).await;
                Ok(())
            }
            Err((problem, garbage)) => {
                self.collect(garbage).await;
                Err(match problem {
                    RangeProblem::Size { stored, declared } => {
                        CacheError::SizeMismatch { stored, declared }
                    }
                    other => CacheError::BadRanges(other),
                })
            }
        }
    }

    /// `GET caches?key=`: the entries `who` may read whose key is `key` (any version), in
    /// scope order and newest first within a scope, at most [`MAX_LISTED`].
    pub async fn list_key(&self, who: &Identity, key: &str) -> Result<Vec<Entry>, CacheError> {
        let scopes = self.readable_scopes(who)?;
        let folded = CacheKey::parse(key)?.folded();
        let mut listed = Vec::new();
        for scope in scopes.iter().take(crate::model::MAX_READ_SCOPES) {
            let room = MAX_LISTED - listed.len();
            if room == 0 {
                break;
            }
            let filter = EntryFilter {
                repository_id: Some(who.repository.as_str().to_owned()),
                scope: Some(scope.clone()),
                folded_key: Some(folded.clone()),
                ..EntryFilter::default()
            };
            let newest_first = EntryPage {
                descending: true,
                ..EntryPage::by_creation(&filter, room)
            };
            let found = self.meta.select_entries(&newest_first).await?.entries;
            listed.extend(found.into_iter().map(|listed| listed.entry));
        }
        Ok(listed)
    }

    /// An entry `who` may read: its repository and one of its readable scopes (less those the
    /// write policy denies). Anyone else's entry is not found.
    pub async fn readable_entry(
        &self,
        who: &Identity,
        id: EntryId,
    ) -> Result<Arc<OpenEntry>, CacheError> {
        let scopes = self.readable_scopes(who)?;
        let open = self.open_entry(id).await?;
        let entry = &open.entry;
        if entry.repository != who.repository || !scopes.contains(&entry.scope) {
            return Err(CacheError::EntryNotFound);
        }
        Ok(open)
    }
}

/// Anyone else's upload (another repository, or a scope `who` does not write) is not found,
/// so ids reveal nothing.
fn writes_to(who: &Identity, upload: &Upload) -> Result<(), CacheError> {
    if upload.repository != who.repository || Some(&upload.scope) != who.write_scope.as_ref() {
        return Err(CacheError::UploadNotFound);
    }
    Ok(())
}

/// The slot an upload was reserved for.
fn slot_of(upload: &Upload) -> Result<Slot, CacheError> {
    Ok(Slot {
        repository: upload.repository.clone(),
        scope: upload.scope.clone(),
        key: CacheKey::parse(&upload.key)?,
        version: Version::parse(&upload.version)?,
    })
}
