//! The domain: who may reserve, upload, finalize and restore what, and in which order entries
//! match. Talks only to [`MetaStore`] and [`BlobStore`]; knows nothing of HTTP.
//!
//! Every change follows one pattern: load state from the metadata store, decide with a pure
//! function of [`upload`] or [`matching`], and have the store apply the decision only if the
//! state it was made on is unchanged (the upload's revision). A change refused as stale is
//! decided again on fresh state, so concurrent requests, in this process or another one sharing
//! the database, never apply a decision made on state that no longer holds.

pub mod admin;
pub mod durability;
mod error;
mod integrity;
pub mod lifecycle;
pub mod matching;
mod ranges;
pub mod recent;
pub mod upload;
pub mod usage;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use crate::auth::{Identity, LinkTarget};
use crate::blob::{BlobError, BlobStore, ByteStream};
use crate::meta::{EntryChunk, MetaError, MetaStore, NewEntry, NewUpload};
use crate::model::{
    BlobName, BlockId, BlockRef, CacheKey, Clipped, Clock, Entry, EntryId, Lookup, Millis, Slot,
    Upload, UploadBlocks, UploadId, Version,
};
use upload::{Finalizing, Reservation, Staging};

pub use error::CacheError;

/// Domain settings.
#[derive(Debug, Clone)]
pub struct Policy {
    /// How long a reservation may stay open before another job may take the key
    /// (GitHub: 24 h, PROTOCOL.md §9).
    pub reservation_ttl: Duration,
    /// How often stored chunks are made durable against a machine crash.
    pub sync_interval: Duration,
    /// Most uploads one repository may have open at once.
    pub max_open_uploads: u32,
    /// Largest entry accepted, in bytes.
    pub max_entry_size: u64,
    /// How long a lookup's answer is reused (see [`recent`]); zero turns that off.
    pub lookup_cache_ttl: Duration,
    /// Quotas, limits, expiry and garbage collection (see [`lifecycle`]).
    pub lifecycle: lifecycle::Limits,
}

/// A restore hit.
#[derive(Debug, Clone)]
pub struct Hit {
    /// What the download link opens.
    pub entry: LinkTarget,
    pub matched_key: String,
    /// The scope the entry was saved in (the v1 answer names it).
    pub scope: crate::model::Scope,
}

/// An upload as a signed link found it: the upload and its blocks.
#[derive(Debug, Clone)]
pub struct LinkedUpload {
    pub upload: Upload,
    blocks: UploadBlocks,
}

/// An entry opened for reading.
#[derive(Debug, Clone)]
pub struct OpenEntry {
    pub entry: Entry,
    chunks: Vec<EntryChunk>,
}

impl OpenEntry {
    /// The entry a finalize just made visible, as a load would return it.
    fn new(
        id: EntryId,
        slot: &Slot,
        key: &str,
        chunks: &[crate::model::Chunk],
        now: Millis,
    ) -> Self {
        let chunks = EntryChunk::place(chunks);
        let size = chunks.last().map_or(0, |c| c.start + c.chunk.size);
        Self {
            entry: Entry {
                id,
                repository: slot.repository.clone(),
                scope: slot.scope.clone(),
                key: key.to_owned(),
                version: slot.version.as_str().to_owned(),
                size,
                created_at: now,
                last_used_at: now,
                hits: 0,
            },
            chunks,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Cache {
    meta: Arc<dyn MetaStore>,
    blobs: Arc<dyn BlobStore>,
    policy: Policy,
    clock: Arc<dyn Clock>,
    usage: usage::UsageBuffer,
    /// Recent lookup answers (see [`recent`]).
    lookups: Arc<recent::RecentLookups>,
    /// Entries recently finalized or opened here: immutable once visible, so a download needs
    /// no query while its entry is known (same TTL and generations as lookups).
    entries: Arc<recent::Recent<EntryId, OpenEntry>>,
    /// Entries this process quarantined.
    quarantined: Arc<std::sync::atomic::AtomicU64>,
    /// Repositories whose quota a finalize is enforcing (see [`Cache::enforce_quota`]).
    evicting: Arc<lifecycle::Evicting>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Cache {
    pub fn new(
        meta: Arc<dyn MetaStore>,
        blobs: Arc<dyn BlobStore>,
        policy: Policy,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let policy_ttl = policy.lookup_cache_ttl;
        Self {
            meta,
            blobs,
            policy,
            clock,
            usage: usage::UsageBuffer::default(),
            lookups: Arc::new(recent::RecentLookups::new(policy_ttl)),
            entries: Arc::new(recent::Recent::new(policy_ttl)),
            quarantined: Arc::default(),
            evicting: Arc::default(),
            metrics: Arc::default(),
        }
    }

    /// Counts into `metrics` (shared with the stores' timing) instead of a registry of its own.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Start-up recovery: forgets entries a machine crash may have damaged (see
    /// [`durability`]). Run before serving.
    pub async fn recover(&self) -> Result<(), CacheError> {
        let recovered =
            durability::recover(self.meta.as_ref(), self.blobs.as_ref(), self.clock.now()).await;
        self.lookups.invalidate();
        self.entries.invalidate();
        recovered
    }

    /// Starts the background work of the domain (writing restore counts, syncing chunks to
    /// disk, the maintenance pass); the returned task ends after `stop`, once every loop has
    /// done its last round.
    pub fn spawn_background(
        &self,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let usage = tokio::spawn(self.usage.clone().run(self.meta.clone(), stop.clone()));
        let sync = tokio::spawn(durability::run(
            self.meta.clone(),
            self.blobs.clone(),
            self.policy.sync_interval,
            stop.clone(),
        ));
        let maintenance = tokio::spawn(self.clone().run_maintenance(stop));
        tokio::spawn(async move {
            let _ = usage.await;
            let _ = sync.await;
            let _ = maintenance.await;
        })
    }

    /// What this process counts (see [`crate::metrics`]).
    pub fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        &self.metrics
    }

    /// What the metadata database holds: bytes, entries, open uploads.
    pub async fn totals(&self) -> Result<crate::model::Totals, CacheError> {
        Ok(self.meta.totals().await?)
    }

    pub async fn ready(&self) -> Result<(), CacheError> {
        self.meta.ping().await?;
        self.blobs.ping().await?;
        Ok(())
    }

    /// CreateCacheEntry: reserves (repository, write scope, key, version) for `who`.
    pub async fn reserve(
        &self,
        who: &Identity,
        key: &str,
        version: &str,
    ) -> Result<LinkTarget, CacheError> {
        let slot = self.write_slot(who, key, version)?;
        self.make_room().await?;
        let (upload, now) = retry_stale(|_| self.try_reserve(who, &slot)).await?;
        audit("reserve", who, &slot, upload);
        Ok(LinkTarget {
            id: upload,
            created_at: now,
        })
    }

    async fn try_reserve(
        &self,
        who: &Identity,
        slot: &Slot,
    ) -> Result<(UploadId, Millis), CacheError> {
        let now = self.clock.now();
        let stale_before = now.saturating_sub(self.policy.reservation_ttl.as_millis() as i64);
        let state = self.meta.slot_state(slot, stale_before).await?;
        let replacing =
            match upload::decide_reservation(&state, stale_before, self.policy.max_open_uploads) {
                Reservation::Conflict => return Err(CacheError::Conflict),
                Reservation::TooManyOpen => return Err(CacheError::TooManyUploads),
                Reservation::Create { replacing } => replacing,
            };
        // An abandoned upload's blocks, read before it is aborted; the revision check makes
        // sure they are still all it has.
        let garbage = match replacing {
            Some(old) => match self.meta.upload_with_blocks(old.id).await? {
                Some((_, blocks)) => blocks.blobs(),
                None => Vec::new(),
            },
            None => Vec::new(),
        };
        let new = NewUpload {
            slot,
            created_by: &who.subject,
            now,
        };
        let id = match self.meta.create_upload(new, replacing).await {
            Err(MetaError::Conflict) => return Err(CacheError::Conflict),
            other => other?,
        };
        self.collect(garbage).await;
        Ok((id, now))
    }

    /// The upload a signed URL names, in whatever state, with its blocks: what the data
    /// request will be decided on unless another request changes the upload meanwhile.
    pub async fn upload(&self, id: UploadId) -> Result<LinkedUpload, CacheError> {
        let (upload, blocks) = self
            .meta
            .upload_with_blocks(id)
            .await?
            .ok_or(CacheError::UploadNotFound)?;
        Ok(LinkedUpload { upload, blocks })
    }

    /// The state attempt `attempt` decides on: the one loaded with the link at first, a fresh
    /// one after a stale refusal.
    async fn decide_on(
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
    pub fn accepts_data(upload: &Upload) -> Result<(), CacheError> {
        if !upload.is_open() {
            return Err(CacheError::UploadClosed);
        }
        Ok(())
    }

    /// Put Block: stores one block; a retried block id replaces the earlier copy.
    pub async fn stage_block(
        &self,
        linked: &LinkedUpload,
        block: BlockId,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<(), CacheError> {
        Self::accepts_data(&linked.upload)?;
        let max = self.policy.max_entry_size;
        // Refused before the body is read when the link's state already says so.
        if let Some(refused) =
            upload::refused_before_body(&linked.blocks, &block, declared_len, max)
        {
            staged_or_refused(refused, max)?;
        }
        let name = BlobName::random();
        let chunk = self.store_chunk(linked, &name, body, declared_len).await?;
        let (block, chunk) = (&block, &chunk);
        let recorded = retry_stale(|attempt| async move {
            let (upload, blocks) = self.decide_on(linked, attempt).await?;
            let garbage = staged_or_refused(upload::decide_stage(&blocks, block, chunk, max), max)?;
            self.meta
                .stage_block(&upload, block, chunk, self.clock.now())
                .await?;
            Ok(garbage)
        })
        .await;
        self.settle(recorded, name).await
    }

    /// Put Blob: the whole body is the upload's one committed chunk.
    pub async fn put_whole(
        &self,
        linked: &LinkedUpload,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<(), CacheError> {
        Self::accepts_data(&linked.upload)?;
        let name = BlobName::random();
        let chunk = self.store_chunk(linked, &name, body, declared_len).await?;
        let chunk = &chunk;
        let committed = retry_stale(|attempt| async move {
            let (upload, blocks) = self.decide_on(linked, attempt).await?;
            let assembly = upload::whole_blob(&blocks, chunk);
            self.meta
                .commit_parts(&upload, &assembly.parts, self.clock.now())
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

    /// Put Block List: the listed blocks, in order, become the upload's content.
    pub async fn commit_block_list(
        &self,
        linked: &LinkedUpload,
        list: &[BlockRef],
    ) -> Result<(), CacheError> {
        let garbage = retry_stale(|attempt| async move {
            let (upload, blocks) = self.decide_on(linked, attempt).await?;
            let assembly = upload::assemble(list, &blocks.staged, &blocks.parts)
                .map_err(|_| CacheError::UnknownBlock)?;
            self.meta
                .commit_parts(&upload, &assembly.parts, self.clock.now())
                .await?;
            Ok(assembly.garbage)
        })
        .await?;
        self.collect(garbage).await;
        Ok(())
    }

    /// An upload that is still open, with its blocks.
    async fn open_upload(&self, id: UploadId) -> Result<(Upload, UploadBlocks), CacheError> {
        let (upload, blocks) = self
            .meta
            .upload_with_blocks(id)
            .await?
            .ok_or(CacheError::UploadNotFound)?;
        Self::accepts_data(&upload)?;
        Ok((upload, blocks))
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
        let slot = self.write_slot(who, key, version)?;
        if size > self.policy.max_entry_size {
            return Err(CacheError::TooLarge(self.policy.max_entry_size));
        }
        let entry = retry_stale(|_| self.try_finalize(who, &slot, size, None)).await?;
        audit("finalize", who, &slot, entry);
        Ok(entry)
    }

    /// Finalizes the slot's open upload; with `expected`, only if it is that upload (a v1
    /// commit names its upload, and must never finalize a later reservation of the slot).
    async fn try_finalize(
        &self,
        who: &Identity,
        slot: &Slot,
        size: u64,
        expected: Option<UploadId>,
    ) -> Result<EntryId, CacheError> {
        let state = self.meta.finalize_state(slot).await?;
        let now = self.clock.now();
        if let (Some(id), Some((open, _))) = (expected, &state.open) {
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
                let new = NewEntry {
                    slot,
                    key: &upload.key,
                    repository_name: &who.repository_name,
                    chunks: &chunks,
                    now,
                };
                let started = self.entries.generation();
                let forget = ForgetIfDropped::new(self);
                let entry = match self.meta.finalize(upload, new).await {
                    Err(MetaError::Conflict) => return Err(CacheError::Conflict),
                    other => other?,
                };
                forget.disarm();
                self.lookups.invalidate();
                let open = OpenEntry::new(entry, slot, &upload.key, &chunks, now);
                self.entries.put(entry, started, now, Arc::new(open));
                self.collect(garbage).await;
                // The entry is saved whatever happens here; a failed eviction is retried by
                // the next finalize of the repository.
                if let Err(e) = self.enforce_quota(&slot.repository, entry).await {
                    tracing::warn!(repository = %slot.repository, error = %e, "could not enforce the repository quota");
                }
                Ok(entry)
            }
            Finalizing::AlreadyDone(entry) => Ok(entry),
            Finalizing::NoUpload => Err(CacheError::NoReservation),
            Finalizing::NothingUploaded => Err(CacheError::NothingUploaded),
            Finalizing::SizeMismatch {
                upload,
                stored,
                garbage,
            } => {
                self.meta.abort_upload(upload, now).await?;
                self.collect(garbage).await;
                Err(CacheError::SizeMismatch {
                    stored,
                    declared: size,
                })
            }
        }
    }

    /// The slot a write of `who` goes to.
    fn write_slot(&self, who: &Identity, key: &str, version: &str) -> Result<Slot, CacheError> {
        let key = CacheKey::parse(key)?;
        let version = Version::parse(version)?;
        let scope = who.write_scope.clone().ok_or(CacheError::WriteDenied)?;
        Ok(Slot {
            repository: who.repository.clone(),
            scope,
            key,
            version,
        })
    }

    /// GetCacheEntryDownloadURL: GitHub's matching over the token's readable scopes. A hit
    /// counts as a use of the entry (last-used time and hit count, written within a second).
    pub async fn lookup(&self, who: &Identity, lookup: &Lookup) -> Result<Option<Hit>, CacheError> {
        if who.read_scopes.is_empty() {
            return Err(CacheError::ReadDenied);
        }
        if who.read_scopes.len() > crate::model::MAX_READ_SCOPES {
            return Err(CacheError::Invalid(crate::model::InvalidInput(format!(
                "the token grants {} readable scopes; lookups search at most {}",
                who.read_scopes.len(),
                crate::model::MAX_READ_SCOPES
            ))));
        }
        let folded: Vec<String> = lookup.keys.iter().map(CacheKey::folded).collect();
        let key =
            recent::RecentLookups::key(&who.repository, &lookup.version, &who.read_scopes, &folded);
        let candidates = self
            .lookups
            .get_or_load(key, self.clock.as_ref(), || {
                self.meta.find_candidates(
                    &who.repository,
                    &lookup.version,
                    &who.read_scopes,
                    &folded,
                )
            })
            .await?;
        let Some(best) = matching::best_match(&who.read_scopes, &folded, &candidates) else {
            self.metrics.lookup(crate::metrics::LookupOutcome::Miss);
            self.metrics
                .repository_lookup(who.display_repository(), false);
            self.usage
                .record_miss(&who.repository, &who.repository_name);
            return Ok(None);
        };
        let primary = folded.first().map_or("", String::as_str);
        self.metrics.lookup(if best.key_folded == primary {
            crate::metrics::LookupOutcome::Exact
        } else if best.key_folded.starts_with(primary) {
            crate::metrics::LookupOutcome::Prefix
        } else {
            crate::metrics::LookupOutcome::RestoreKey
        });
        self.metrics
            .repository_lookup(who.display_repository(), true);
        self.usage.record(best.id, self.clock.now());
        Ok(Some(Hit {
            entry: LinkTarget {
                id: best.id,
                created_at: best.created_at,
            },
            matched_key: best.key.clone(),
            scope: best.scope.clone(),
        }))
    }

    pub async fn open_entry(&self, id: EntryId) -> Result<Arc<OpenEntry>, CacheError> {
        self.entries
            .get_or_load(id, self.clock.as_ref(), || async {
                let (entry, chunks) = self
                    .meta
                    .entry(id)
                    .await?
                    .ok_or(CacheError::EntryNotFound)?;
                Ok(OpenEntry { entry, chunks })
            })
            .await
    }

    /// A link straight to the stored object holding the whole of `open`, valid for `ttl`, if
    /// the store can make one and the entry is one non-empty chunk (the store's object is then
    /// byte for byte the entry, ranges included). Its bytes are not checked on the way, since
    /// they do not pass through here.
    pub async fn direct_link(
        &self,
        open: &OpenEntry,
        ttl: std::time::Duration,
    ) -> Result<Option<url::Url>, CacheError> {
        match open.chunks.as_slice() {
            [only] if only.chunk.size > 0 && only.chunk.size == open.entry.size => {
                Ok(self.blobs.presigned_get(&only.chunk.blob, ttl).await?)
            }
            _ => Ok(None),
        }
    }

    /// Whether the store can presign links with the credentials it has (`--direct-downloads`
    /// checks at start-up rather than on every download).
    pub async fn can_presign(&self) -> Result<(), String> {
        let probe = crate::model::BlobName::random();
        match self
            .blobs
            .presigned_get(&probe, std::time::Duration::from_secs(60))
            .await
        {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(format!(
                "{} storage has no presigned links",
                self.blobs.kind()
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    /// What kind of store holds the chunks: `file`, `s3`, `gcs` or `azure`.
    pub fn storage_kind(&self) -> &'static str {
        self.blobs.kind()
    }

    /// Streams bytes `[start, start + len)` of an entry, chunk after chunk, each chunk read
    /// whole checked against its hash (see [`integrity`]). The first chunk is opened before
    /// this returns, later ones as the stream reaches them. A damaged or missing chunk
    /// quarantines the entry and ends the stream with an error.
    pub async fn read(
        &self,
        open: &OpenEntry,
        start: u64,
        len: u64,
    ) -> Result<ByteStream, CacheError> {
        let entry = open.entry.id;
        let mut parts = slices(&open.chunks, start, len)
            .into_iter()
            .map(|(i, off, len)| (open.chunks[i].chunk.clone(), off, len))
            .collect::<Vec<_>>()
            .into_iter();
        let Some(first) = parts.next() else {
            return Ok(Box::pin(futures_util::stream::empty()));
        };
        let head = self.open_chunk(entry, first).await?;
        let counted = self.metrics.clone();
        let cache = self.clone();
        let tail = futures_util::stream::iter(parts)
            .then(move |part| {
                let cache = cache.clone();
                async move {
                    match cache.open_chunk(entry, part).await {
                        Ok(stream) => stream,
                        Err(e) => Box::pin(futures_util::stream::once(async move {
                            Err(std::io::Error::other(e.to_string()))
                        })) as ByteStream,
                    }
                }
            })
            .flatten();
        // Bytes count as downloaded as they leave, so a cut-off download counts what went.
        Ok(Box::pin(head.chain(tail).inspect(move |frame| {
            if let Ok(bytes) = frame {
                counted.downloaded(bytes.len() as u64);
            }
        })))
    }

    /// Opens `len` bytes of a chunk of `entry` from `offset`, checked if the read is whole.
    async fn open_chunk(
        &self,
        entry: EntryId,
        (chunk, offset, len): (crate::model::Chunk, u64, u64),
    ) -> Result<ByteStream, CacheError> {
        match self.blobs.get(&chunk.blob, offset, len).await {
            Ok(stream) if offset == 0 && len == chunk.size => {
                let cache = self.clone();
                let on_damage: integrity::OnDamage = Box::new(move |how| {
                    tokio::spawn(async move {
                        if let Err(e) = cache.quarantine(entry, how).await {
                            tracing::error!(entry, error = %e, "could not quarantine a damaged entry");
                        }
                    });
                });
                Ok(integrity::verified(
                    stream,
                    &chunk,
                    integrity::Check::Fast,
                    on_damage,
                ))
            }
            Ok(stream) => Ok(stream),
            Err(BlobError::NotFound(_)) => {
                self.quarantine(entry, format!("chunk {} is missing", chunk.blob))
                    .await?;
                Err(CacheError::EntryNotFound)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Stores one chunk of `linked`, refusing bodies larger than an entry may be, declared or
    /// not. When the storage is full, the whole upload is abandoned and its chunks deleted at
    /// once: the save cannot succeed, and its staged bytes are what the disk needs back.
    async fn store_chunk(
        &self,
        linked: &LinkedUpload,
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
                tracing::warn!(upload = linked.upload.id, error = %e, "storage full: abandoning the upload and freeing its chunks");
                if let Err(e) = self.abandon(linked.upload.id).await {
                    tracing::warn!(upload = linked.upload.id, error = %e, "could not abandon the upload");
                }
                Err(CacheError::StorageFull)
            }
            other => {
                let chunk = other?;
                self.metrics.uploaded(chunk.size);
                Ok(chunk)
            }
        }
    }

    /// Aborts an upload, whatever its revision, and deletes its chunks. False if it was already
    /// closed or gone (finalized, or abandoned by another request or process).
    async fn abandon(&self, id: UploadId) -> Result<bool, CacheError> {
        let aborted = retry_stale(|_| async {
            let (upload, blocks) = self.open_upload(id).await?;
            self.meta.abort_upload(&upload, self.clock.now()).await?;
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

    /// Deletes blobs no metadata refers to any more. Failures only leave orphans behind.
    async fn collect(&self, garbage: Vec<BlobName>) {
        for name in garbage {
            if let Err(e) = self.blobs.delete(&name).await {
                tracing::warn!(blob = %name, error = %e, "could not delete an unreferenced chunk");
            }
        }
    }
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

/// Forgets every reused answer (lookups and entries' chunk lists) unless disarmed: held across
/// a change that outdates answers, so that a change committed after its caller gave up (another
/// caller's batch may commit it, `meta/group_commit.rs`) outdates them all the same. Forgetting
/// too much only costs a query.
pub(crate) struct ForgetIfDropped<'a> {
    cache: &'a Cache,
    armed: bool,
}

impl<'a> ForgetIfDropped<'a> {
    pub(crate) fn new(cache: &'a Cache) -> Self {
        Self { cache, armed: true }
    }

    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ForgetIfDropped<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.cache.lookups.invalidate();
            self.cache.entries.invalidate();
        }
    }
}

/// The audit trail of writes: who reserved or finalized what (issue #4, point 5). The token's
/// claims are the client's text, so they are clipped.
fn audit(action: &str, who: &Identity, slot: &Slot, id: i64) {
    tracing::info!(
        target: "hoard::audit",
        action,
        repository = %slot.repository,
        scope = %slot.scope,
        key = %slot.key,
        version = %slot.version,
        subject = %Clipped(&who.subject),
        run = %Clipped(&who.run),
        id,
    );
}

/// How often a change refused as stale (another request changed the same upload between this
/// one's read and write) is decided again before the request gives up.
const MAX_ATTEMPTS: usize = 16;

/// Runs `attempt` (told how many tries came before it) again while the store refuses its
/// change as stale.
async fn retry_stale<T, F, Fut>(mut attempt: F) -> Result<T, CacheError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, CacheError>>,
{
    for tries in 0..MAX_ATTEMPTS {
        match attempt(tries).await {
            Err(CacheError::Meta(MetaError::Stale)) => tokio::task::yield_now().await,
            other => return other,
        }
    }
    Err(CacheError::Busy)
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

/// Maps the byte range `[start, start + len)` of an entry onto its chunks:
/// `(chunk index, offset in chunk, length)` for each chunk the range touches.
pub fn slices(chunks: &[EntryChunk], start: u64, len: u64) -> Vec<(usize, u64, u64)> {
    let end = start.saturating_add(len);
    chunks
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let (c_start, c_end) = (c.start, c.start + c.chunk.size);
            let from = start.max(c_start);
            let to = end.min(c_end);
            (from < to).then(|| (i, from - c_start, to - from))
        })
        .collect()
}

#[cfg(test)]
mod tests;
