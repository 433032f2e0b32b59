//! Saving: reserving a slot, storing the upload's bytes (whole, by block, or by range through
//! [`super::ranges`]), assembling them and finalizing the entry. Every change to an upload is
//! decided on its loaded state and applied only at that state's revision ([`retry_stale`]).

use std::sync::Arc;

use futures_util::StreamExt;

use super::restore::OpenEntry;
use super::upload::{self, Finalizing, Reservation, Staging};
use super::{audit, retry_stale, Cache, CacheError, ForgetIfDropped};
use crate::auth::{Identity, LinkTarget};
use crate::blob::BlobError;
use crate::meta::{BlockState, MetaError, NewEntry, NewUpload, SlotRead, UploadChange, UploadRead};
use crate::model::{
    entry_digest, BlobName, BlockId, BlockRef, ByteStream, CacheKey, Chunk, EntryId, LogSafe,
    Millis, Provenance, Slot, Upload, UploadBlocks, UploadId, Version,
};
use crate::model::{EntryRecord, RefClass, ScopeClass, ToolObject};

/// An upload as a signed link found it: the upload and its blocks.
#[derive(Debug, Clone)]
pub struct LinkedUpload {
    pub upload: Upload,
    pub(super) blocks: UploadBlocks,
}

/// What a commit makes an entry of: stored chunks, and who wrote them.
pub(super) struct Commit<'a> {
    pub who: &'a Identity,
    pub slot: &'a Slot,
    /// The key as the writer spelled it.
    pub key: &'a str,
    pub written_by: Option<Provenance>,
    pub chunks: &'a [Chunk],
    /// What was stored: checked by the caller.
    pub size: u64,
    /// A build tool's object, with what it keeps.
    pub tool: Option<&'a ToolObject>,
    /// Where an entry stored on a local miss was read from (`read_through.rs`).
    pub read_through: Option<&'a str>,
}

/// An upload as a Put Block found it: the upload, what its staged blocks add up to and the
/// staged copy of the block being put, not the other blocks (the cost of a Put Block does not
/// grow with the upload).
#[derive(Debug, Clone)]
pub struct BlockTarget {
    pub upload: Upload,
    pub(super) state: BlockState,
}

impl Cache {
    /// CreateCacheEntry: reserves (repository, write scope, key, version) for `who`.
    /// `address` is the client's, as the protocol layer tells it (see `api::origin`).
    pub async fn reserve(
        &self,
        who: &Identity,
        address: Option<std::net::IpAddr>,
        key: &str,
        version: &str,
    ) -> Result<LinkTarget<UploadId>, CacheError> {
        let slot = self.write_slot(who, key, version)?;
        self.make_room().await?;
        let written_by = who.provenance(address);
        let (upload, now) = retry_stale(|_| self.try_reserve(&written_by, &slot)).await?;
        audit("reserve", who, &slot, upload.get());
        Ok(LinkTarget {
            id: upload,
            created_at: now,
        })
    }

    async fn try_reserve(
        &self,
        written_by: &Provenance,
        slot: &Slot,
    ) -> Result<(UploadId, Millis), CacheError> {
        let now = self.clock.now();
        let stale_before = now.saturating_sub(self.policy.reservation_ttl.as_millis() as i64);
        let read = SlotRead::Reserve {
            live_since: stale_before,
        };
        let state = self.meta.slot_state(slot, read).await?;
        let replacing =
            match upload::decide_reservation(&state, stale_before, self.policy.max_open_uploads) {
                Reservation::Conflict => return Err(CacheError::Conflict),
                Reservation::TooManyOpen => return Err(CacheError::TooManyUploads),
                Reservation::Create { replacing } => replacing,
            };
        // An abandoned upload's blocks, read before it is aborted; the revision check makes
        // sure they are still all it has.
        let garbage = match replacing {
            Some(old) => match self.meta.upload(old.id, UploadRead::Blocks).await? {
                Some(view) => view.blocks.blobs(),
                None => Vec::new(),
            },
            None => Vec::new(),
        };
        let new = NewUpload {
            slot,
            written_by,
            now,
        };
        let id = match self.meta.create_upload(new, replacing).await {
            Err(MetaError::Conflict) => return Err(CacheError::Conflict),
            other => other?,
        };
        self.collect(garbage).await;
        Ok((id, now))
    }

    /// Put Blob through a signed upload link: the whole body is the upload's one committed
    /// chunk.
    pub async fn put_blob(
        &self,
        link: LinkTarget<UploadId>,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<(), CacheError> {
        let linked = self.linked_upload(link).await?;
        self.put_whole(&linked, body, declared_len).await
    }

    /// Put Block through a signed upload link: stores one block; a retried block id replaces
    /// the earlier copy.
    pub async fn put_block(
        &self,
        link: LinkTarget<UploadId>,
        block: BlockId,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<(), CacheError> {
        let target = match self.block_target(link.id, &block).await {
            Ok(target) if target.upload.created_at == link.created_at => target,
            Ok(_) | Err(CacheError::UploadNotFound) => return Err(CacheError::NoSuchLink),
            Err(e) => return Err(e),
        };
        self.stage_block(&target, block, body, declared_len).await
    }

    /// Put Block List through a signed upload link. `list` reads the list from the request
    /// body, in the protocol's terms (hence its own error type); it is awaited only once the
    /// link names an upload that still accepts data, so a refused request's body is not read.
    pub async fn put_block_list<E: From<CacheError>>(
        &self,
        link: LinkTarget<UploadId>,
        list: impl std::future::Future<Output = Result<Vec<BlockRef>, E>>,
    ) -> Result<(), E> {
        let linked = self.linked_upload(link).await?;
        Self::accepts_data(&linked.upload)?;
        let list = list.await?;
        Ok(self.commit_block_list(&linked, &list).await?)
    }

    /// What Get Blob Properties and Get Block List show of the upload a signed link names: the
    /// upload and its staged and committed blocks. [`CacheError::NoSuchLink`] as for data
    /// requests.
    pub async fn upload_blocks(
        &self,
        link: LinkTarget<UploadId>,
    ) -> Result<(Upload, UploadBlocks), CacheError> {
        let linked = self.linked_upload(link).await?;
        Ok((linked.upload, linked.blocks))
    }

    /// The upload a signed link names, in whatever state: [`CacheError::NoSuchLink`] unless
    /// the row is the one the link was signed for (same id and creation time).
    async fn linked_upload(&self, link: LinkTarget<UploadId>) -> Result<LinkedUpload, CacheError> {
        match self.upload(link.id).await {
            Ok(linked) if linked.upload.created_at == link.created_at => Ok(linked),
            Ok(_) | Err(CacheError::UploadNotFound) => Err(CacheError::NoSuchLink),
            Err(e) => Err(e),
        }
    }

    /// The upload `id`, in whatever state, with its blocks: what a data request will be
    /// decided on unless another request changes the upload meanwhile.
    pub(super) async fn upload(&self, id: UploadId) -> Result<LinkedUpload, CacheError> {
        let view = self
            .meta
            .upload(id, UploadRead::Blocks)
            .await?
            .ok_or(CacheError::UploadNotFound)?;
        Ok(LinkedUpload {
            upload: view.upload,
            blocks: view.blocks,
        })
    }

    /// The upload `id`, in whatever state, as a Put Block of `block` decides on it.
    pub(super) async fn block_target(
        &self,
        id: UploadId,
        block: &BlockId,
    ) -> Result<BlockTarget, CacheError> {
        let view = self
            .meta
            .upload(id, UploadRead::Block(block))
            .await?
            .ok_or(CacheError::UploadNotFound)?;
        Ok(BlockTarget {
            upload: view.upload,
            state: view.block,
        })
    }

    /// The state attempt `attempt` decides on: the one loaded with the link at first, a fresh
    /// one after a stale refusal.
    pub(super) async fn decide_on(
        &self,
        linked: &LinkedUpload,
        attempt: usize,
    ) -> Result<(Upload, UploadBlocks), CacheError> {
        if attempt > 0 {
            return self.open_upload(linked.upload.id).await;
        }
        Self::accepts_data(&linked.upload)?;
        Ok((linked.upload.clone(), linked.blocks.clone()))
    }

    /// Refuses data for an upload that was finalized or abandoned, before its body is read.
    /// (The change that records the data checks again.)
    pub(super) fn accepts_data(upload: &Upload) -> Result<(), CacheError> {
        if !upload.is_open() {
            return Err(CacheError::UploadClosed);
        }
        Ok(())
    }

    /// Stores one block of a loaded upload; a retried block id replaces the earlier copy.
    /// `target` was loaded for this block; a stale refusal loads it again.
    pub(super) async fn stage_block(
        &self,
        target: &BlockTarget,
        block: BlockId,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<(), CacheError> {
        Self::accepts_data(&target.upload)?;
        let max = self.policy.max_entry_size;
        // Refused before the body is read when the link's state already says so.
        if let Some(refused) = upload::refused_before_body(&target.state, declared_len, max) {
            staged_or_refused(refused, max)?;
        }
        let name = BlobName::random();
        let chunk = self
            .store_chunk(&target.upload, &name, body, declared_len)
            .await?;
        let (block, chunk) = (&block, &chunk);
        let recorded = retry_stale(|attempt| async move {
            let fresh;
            let decided_on = if attempt == 0 {
                target
            } else {
                fresh = self.block_target(target.upload.id, block).await?;
                Self::accepts_data(&fresh.upload)?;
                &fresh
            };
            let (upload, state) = (&decided_on.upload, &decided_on.state);
            let garbage = staged_or_refused(upload::decide_stage(state, chunk, max), max)?;
            self.meta
                .change_upload(
                    upload,
                    UploadChange::Stage { block, chunk },
                    self.clock.now(),
                )
                .await?;
            Ok(garbage)
        })
        .await;
        self.settle(recorded, name).await
    }

    /// Put Blob on a loaded upload: the whole body is the upload's one committed chunk.
    pub(super) async fn put_whole(
        &self,
        linked: &LinkedUpload,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<(), CacheError> {
        Self::accepts_data(&linked.upload)?;
        let name = BlobName::random();
        let chunk = self
            .store_chunk(&linked.upload, &name, body, declared_len)
            .await?;
        let chunk = &chunk;
        let committed = retry_stale(|attempt| async move {
            let (upload, blocks) = self.decide_on(linked, attempt).await?;
            let assembly = upload::whole_blob(&blocks, chunk);
            self.meta
                .change_upload(
                    &upload,
                    UploadChange::Commit(&assembly.parts),
                    self.clock.now(),
                )
                .await?;
            Ok(assembly.garbage)
        })
        .await;
        self.settle(committed, name).await
    }

    /// After a chunk was stored: deletes what the recorded change left unreferenced, or the
    /// new chunk itself if the change was refused.
    async fn settle(
        &self,
        outcome: Result<Vec<BlobName>, CacheError>,
        new: BlobName,
    ) -> Result<(), CacheError> {
        match outcome {
            Ok(garbage) => {
                self.collect(garbage).await;
                Ok(())
            }
            Err(e) => {
                self.collect(vec![new]).await;
                Err(e)
            }
        }
    }

    /// Put Block List on a loaded upload: the listed blocks, in order, become the upload's content.
    pub(super) async fn commit_block_list(
        &self,
        linked: &LinkedUpload,
        list: &[BlockRef],
    ) -> Result<(), CacheError> {
        let garbage = retry_stale(|attempt| async move {
            let (upload, blocks) = self.decide_on(linked, attempt).await?;
            let assembly = upload::assemble(list, &blocks.staged, &blocks.parts)
                .map_err(|_| CacheError::UnknownBlock)?;
            self.meta
                .change_upload(
                    &upload,
                    UploadChange::Commit(&assembly.parts),
                    self.clock.now(),
                )
                .await?;
            Ok(assembly.garbage)
        })
        .await?;
        self.collect(garbage).await;
        Ok(())
    }

    /// An upload that is still open, with its blocks.
    async fn open_upload(&self, id: UploadId) -> Result<(Upload, UploadBlocks), CacheError> {
        let view = self
            .meta
            .upload(id, UploadRead::Blocks)
            .await?
            .ok_or(CacheError::UploadNotFound)?;
        Self::accepts_data(&view.upload)?;
        Ok((view.upload, view.blocks))
    }

    /// FinalizeCacheEntryUpload: makes the entry visible if the stored bytes add up to `size`.
    /// A retry of a finalize that already succeeded returns the same entry.
    pub async fn finalize(
        &self,
        who: &Identity,
        key: &str,
        version: &str,
        size: u64,
    ) -> Result<EntryId, CacheError> {
        let slot = match self.write_slot(who, key, version) {
            Err(refused @ CacheError::WriteDeniedByPolicy(_)) => {
                self.abandon_refused_slot(who, key, version).await;
                return Err(refused);
            }
            other => other?,
        };
        if size > self.policy.max_entry_size {
            return Err(CacheError::TooLarge(self.policy.max_entry_size));
        }
        retry_stale(|_| self.try_finalize(who, &slot, size, None, None)).await
    }

    /// Finalizes the slot's open upload; with `expected`, only if it is that upload (a v1
    /// commit names its upload, and must never finalize a later reservation of the slot);
    /// with `tool`, as that build tool's object.
    pub(super) async fn try_finalize(
        &self,
        who: &Identity,
        slot: &Slot,
        size: u64,
        expected: Option<UploadId>,
        tool: Option<&ToolObject>,
    ) -> Result<EntryId, CacheError> {
        let state = self.meta.slot_state(slot, SlotRead::Finalize).await?;
        let now = self.clock.now();
        if let (Some(id), Some(open)) = (expected, &state.open) {
            if open.id != id {
                return Err(CacheError::UploadClosed);
            }
        }
        match upload::decide_finalize(&state, size) {
            Finalizing::Commit {
                upload,
                chunks,
                garbage,
            } => {
                let commit = Commit {
                    who,
                    slot,
                    key: &upload.key,
                    written_by: upload.written_by.clone(),
                    chunks: &chunks,
                    size,
                    tool,
                    read_through: None,
                };
                self.commit_entry(commit, Some(upload), garbage).await
            }
            Finalizing::AlreadyDone(entry) => Ok(entry),
            Finalizing::NoUpload => Err(CacheError::NoReservation),
            Finalizing::NothingUploaded => Err(CacheError::NothingUploaded),
            Finalizing::SizeMismatch {
                upload,
                stored,
                garbage,
            } => {
                self.meta
                    .change_upload(upload, UploadChange::Abort, now)
                    .await?;
                self.collect(garbage).await;
                Err(CacheError::SizeMismatch {
                    stored,
                    declared: size,
                })
            }
        }
    }

    /// Makes `commit` an entry, finalizing `upload` if the bytes came through one (a build
    /// tool's object comes without); then what every new entry is owed: the statistics, the
    /// audit, the digest pass, the caches, the quota. `garbage` goes once it is committed.
    pub(super) async fn commit_entry(
        &self,
        commit: Commit<'_>,
        upload: Option<&Upload>,
        garbage: Vec<BlobName>,
    ) -> Result<EntryId, CacheError> {
        let Commit {
            who,
            slot,
            key,
            written_by,
            chunks,
            size,
            tool,
            read_through,
        } = commit;
        let now = self.clock.now();
        // Without a digest until the digest pass has hashed its large chunks.
        let digest = entry_digest(chunks);
        let class = ScopeClass::of(&slot.scope);
        let family = self
            .stats
            .family_of_save(&slot.repository, key, &slot.key.folded());
        let ref_class = RefClass::of_caller(who.write_scope.as_ref(), &who.read_scopes);
        // What a save knows on top of the slot and chunks; a column the save does not fill
        // (such as a promotion's origin) stays as `NewEntry::new` leaves it.
        let new = NewEntry {
            key,
            repository_name: &who.repository_name,
            record: EntryRecord {
                written_by: written_by.clone(),
                digest: digest.clone().unwrap_or_default(),
                tool: tool.cloned(),
                read_through: read_through.map(str::to_owned),
                ..EntryRecord::default()
            },
            scope_class: class,
            family: &family,
            ref_class,
            ..NewEntry::new(slot, chunks, now)
        };
        let started = self.entries.generation();
        let forget = ForgetIfDropped::new(self);
        let entry = match self.meta.finalize(upload, new).await {
            Err(MetaError::Conflict) => return Err(CacheError::Conflict),
            other => other?,
        };
        forget.disarm();
        // The next flush's record must cover this entry, even if no chunk comes after it.
        self.blobs.note_committed();
        self.stats
            .saved(&slot.repository, &family, ref_class, size, now);
        audit_finalize(
            who,
            slot,
            entry,
            written_by.as_ref(),
            digest.as_deref(),
            size,
        );
        if digest.is_none() {
            self.digests.push(entry);
        }
        self.lookups.invalidate();
        let open = OpenEntry::new(entry, slot, key, chunks, now);
        self.entries.put(entry, started, now, Arc::new(open));
        self.collect(garbage).await;
        // The entry is saved whatever happens here; a failed eviction is retried by the next
        // finalize of the repository.
        if let Err(e) = self
            .enforce_quota(&slot.repository, entry, class, size)
            .await
        {
            tracing::warn!(repository = %LogSafe(slot.repository.as_str()), error = %e, "could not enforce the repository quota");
        }
        Ok(entry)
    }

    /// The slot a write of `who` goes to, if the token and the write policy allow the write.
    pub(super) fn write_slot(
        &self,
        who: &Identity,
        key: &str,
        version: &str,
    ) -> Result<Slot, CacheError> {
        let key = CacheKey::parse(key)?;
        let version = Version::parse(version)?;
        let scope = who.write_scope.clone().ok_or(CacheError::WriteDenied)?;
        self.check_write_policy_of(who, &scope, &key)?;
        Ok(Slot {
            repository: who.repository.clone(),
            scope,
            key,
            version,
        })
    }

    /// Stores one chunk of `upload`, refusing bodies larger than an entry may be, declared or
    /// not. When the storage is full, the whole upload is abandoned and its chunks deleted at
    /// once: the save cannot succeed, and its staged bytes are what the disk needs back.
    async fn store_chunk(
        &self,
        upload: &Upload,
        name: &BlobName,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<crate::model::Chunk, CacheError> {
        let stored = self.put_chunk(name, body, declared_len).await;
        if let Err(CacheError::StorageFull) = stored {
            tracing::warn!(
                upload = upload.id.get(),
                "storage full: abandoning the upload and freeing its chunks"
            );
            if let Err(e) = self.abandon(upload.id).await {
                tracing::warn!(upload = upload.id.get(), error = %e, "could not abandon the upload");
            }
        }
        stored
    }

    /// Stores one chunk, refusing bodies larger than an entry may be, declared or not.
    pub(super) async fn put_chunk(
        &self,
        name: &BlobName,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<crate::model::Chunk, CacheError> {
        let max = self.policy.max_entry_size;
        if declared_len.is_some_and(|len| len > max) {
            return Err(CacheError::TooLarge(max));
        }
        match self.blobs.put(name, limit(body, max), declared_len).await {
            Err(BlobError::Body(e)) if e.kind() == std::io::ErrorKind::FileTooLarge => {
                Err(CacheError::TooLarge(max))
            }
            Err(e) if e.is_storage_full() => {
                tracing::warn!(error = %e, "storage full");
                Err(CacheError::StorageFull)
            }
            other => {
                let chunk = other?;
                self.metrics.uploaded(chunk.size);
                Ok(chunk)
            }
        }
    }

    /// A finalize the write policy refused ends the slot's open upload: bytes staged under a
    /// freeze never become an entry, not even once the freeze is lifted.
    async fn abandon_refused_slot(&self, who: &Identity, key: &str, version: &str) {
        let (Ok(key), Ok(version), Some(scope)) = (
            CacheKey::parse(key),
            Version::parse(version),
            who.write_scope.clone(),
        ) else {
            return;
        };
        let slot = Slot {
            repository: who.repository.clone(),
            scope,
            key,
            version,
        };
        let open = match self.meta.slot_state(&slot, SlotRead::Finalize).await {
            Ok(state) => state.open.map(|upload| upload.id),
            Err(e) => {
                tracing::warn!(error = %e, "cannot end an upload the write policy refused; it is swept when abandoned");
                return;
            }
        };
        if let Some(id) = open {
            self.abandon_refused(id).await;
        }
    }

    /// Ends upload `id` after the write policy refused a write to it, logging a failure (the
    /// sweep of abandoned uploads ends it later then).
    pub(super) async fn abandon_refused(&self, id: UploadId) {
        match self.abandon(id).await {
            Ok(true) => tracing::info!(
                target: "hoard::audit",
                action = "abort",
                reason = "write policy",
                id = id.get(),
            ),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot end an upload the write policy refused; it is swept when abandoned")
            }
        }
    }

    /// Aborts an upload, whatever its revision, and deletes its chunks. False if it was already
    /// closed or gone (finalized, or abandoned by another request or process).
    pub(super) async fn abandon(&self, id: UploadId) -> Result<bool, CacheError> {
        let aborted = retry_stale(|_| async {
            let (upload, blocks) = self.open_upload(id).await?;
            self.meta
                .change_upload(&upload, UploadChange::Abort, self.clock.now())
                .await?;
            Ok(blocks.blobs())
        })
        .await;
        match aborted {
            Ok(garbage) => {
                self.collect(garbage).await;
                Ok(true)
            }
            Err(CacheError::UploadClosed | CacheError::UploadNotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The audit line of a finalize: the slot, the entry, and who wrote it as the upload recorded
/// it at reservation (the finalizing caller's own identity when the upload predates records).
fn audit_finalize(
    who: &Identity,
    slot: &Slot,
    entry: EntryId,
    written_by: Option<&Provenance>,
    digest: Option<&str>,
    size: u64,
) {
    let unrecorded;
    let by = match written_by {
        Some(by) => by,
        None => {
            unrecorded = who.provenance(None);
            &unrecorded
        }
    };
    tracing::info!(
        target: "hoard::audit",
        action = "finalize",
        repository = %LogSafe(slot.repository.as_str()),
        scope = %LogSafe(slot.scope.as_str()),
        key = %LogSafe(slot.key.as_str()),
        version = %LogSafe(slot.version.as_str()),
        id = entry.get(),
        size,
        // The digest pass logs a `digest` line of its own once it has hashed the entry.
        digest = digest.unwrap_or("pending"),
        kind = %by.kind,
        issuer = %LogSafe(&by.issuer),
        subject = %LogSafe(&by.subject),
        run_id = %LogSafe(&by.run_id),
        job_id = %LogSafe(&by.job_id),
        address = %LogSafe(&by.address),
    );
}

/// What staging a block decided, for the protocols: the blobs recording it frees, or the limit
/// it would pass (`max` being the entry size limit).
fn staged_or_refused(staging: Staging, max: u64) -> Result<Vec<BlobName>, CacheError> {
    match staging {
        Staging::Record { garbage } => Ok(garbage),
        Staging::TooLarge => Err(CacheError::TooLarge(max)),
        Staging::TooManyBlocks => Err(CacheError::TooManyBlocks),
    }
}

/// Ends `body` with a `FileTooLarge` error once it has carried more than `max` bytes.
fn limit(body: ByteStream, max: u64) -> ByteStream {
    Box::pin(futures_util::stream::unfold(
        (body, 0u64, false),
        move |(mut body, seen, done)| async move {
            if done {
                return None;
            }
            match body.next().await? {
                Ok(bytes) if seen + bytes.len() as u64 > max => Some((
                    Err(std::io::Error::new(
                        std::io::ErrorKind::FileTooLarge,
                        "body exceeds the entry size limit",
                    )),
                    (body, seen, true),
                )),
                Ok(bytes) => {
                    let seen = seen + bytes.len() as u64;
                    Some((Ok(bytes), (body, seen, false)))
                }
                Err(e) => Some((Err(e), (body, seen, true))),
            }
        },
    ))
}
