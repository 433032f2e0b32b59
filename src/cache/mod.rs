//! The domain: who may reserve, upload, finalize and restore what, and in which order entries
//! match. Talks only to [`MetaStore`] and [`BlobStore`]; knows nothing of HTTP.

pub mod durability;
pub mod matching;
pub mod model;
pub mod scope;
pub mod upload;
pub mod usage;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use crate::auth::{Identity, LinkTarget};
use crate::blob::{BlobError, BlobStore, ByteStream};
use crate::meta::{
    Committed, EntryChunk, FinalizeRequest, Finalized, MetaError, MetaStore, NewUpload, Reserved,
    Staged,
};
use model::{
    now_millis, BlobName, BlockId, CacheKey, Entry, EntryId, Lookup, Upload, UploadId, UploadState,
    Version,
};
use upload::BlockRef;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{0}")]
    Invalid(#[from] model::InvalidInput),
    #[error("cache write denied: token has no writable scopes")]
    WriteDenied,
    #[error("cache read denied: token has no readable scopes")]
    ReadDenied,
    #[error("cache entry with the same key, version, and scope already exists")]
    Conflict,
    #[error("no such upload")]
    UploadNotFound,
    #[error("the upload is already finalized or was abandoned")]
    UploadClosed,
    #[error("the block list names a block that was not uploaded")]
    UnknownBlock,
    #[error("no reservation for this key and version")]
    NoReservation,
    #[error("nothing was uploaded for this key and version")]
    NothingUploaded,
    #[error("uploaded {stored} bytes but the client declared {declared}")]
    SizeMismatch { stored: u64, declared: u64 },
    #[error("no such entry")]
    EntryNotFound,
    #[error("too many uploads are open for this repository; retry later")]
    TooManyUploads,
    #[error("entries are limited to {0} bytes")]
    TooLarge(u64),
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error(transparent)]
    Meta(#[from] MetaError),
}

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
}

/// A restore hit.
#[derive(Debug, Clone)]
pub struct Hit {
    /// What the download link opens.
    pub entry: LinkTarget,
    pub matched_key: String,
}

/// An entry opened for reading.
#[derive(Debug, Clone)]
pub struct OpenEntry {
    pub entry: Entry,
    chunks: Vec<EntryChunk>,
}

#[derive(Debug, Clone)]
pub struct Cache {
    meta: Arc<dyn MetaStore>,
    blobs: Arc<dyn BlobStore>,
    policy: Policy,
    usage: usage::UsageBuffer,
}

impl Cache {
    pub fn new(meta: Arc<dyn MetaStore>, blobs: Arc<dyn BlobStore>, policy: Policy) -> Self {
        Self {
            meta,
            blobs,
            policy,
            usage: usage::UsageBuffer::default(),
        }
    }

    /// Start-up recovery: forgets entries a machine crash may have damaged (see
    /// [`durability`]). Run before serving.
    pub async fn recover(&self) -> Result<(), CacheError> {
        durability::recover(self.meta.as_ref(), self.blobs.as_ref()).await
    }

    /// Starts the background work of the domain (writing restore counts, syncing chunks to
    /// disk); the returned task ends after `stop`, once both loops have done their last round.
    pub fn spawn_background(
        &self,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let usage = tokio::spawn(self.usage.clone().run(self.meta.clone(), stop.clone()));
        let sync = tokio::spawn(durability::run(
            self.meta.clone(),
            self.blobs.clone(),
            self.policy.sync_interval,
            stop,
        ));
        tokio::spawn(async move {
            let _ = usage.await;
            let _ = sync.await;
        })
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
        let key = CacheKey::parse(key)?;
        let version = Version::parse(version)?;
        let scope = who.write_scope.as_ref().ok_or(CacheError::WriteDenied)?;
        let now = now_millis();
        let outcome = self
            .meta
            .reserve(NewUpload {
                repository: &who.repository,
                scope,
                key: &key,
                version: &version,
                created_by: &who.subject,
                now,
                stale_before: now.saturating_sub(self.policy.reservation_ttl.as_millis() as i64),
                max_open: self.policy.max_open_uploads,
            })
            .await?;
        match outcome {
            Reserved::Created { upload, garbage } => {
                self.collect(garbage).await;
                audit("reserve", who, scope, &key, &version, upload);
                Ok(LinkTarget {
                    id: upload,
                    created_at: now,
                })
            }
            Reserved::Conflict => Err(CacheError::Conflict),
            Reserved::TooManyOpen => Err(CacheError::TooManyUploads),
        }
    }

    /// The upload a signed URL names, in whatever state.
    pub async fn upload(&self, id: UploadId) -> Result<Upload, CacheError> {
        self.meta
            .upload(id)
            .await?
            .ok_or(CacheError::UploadNotFound)
    }

    /// Refuses data for an upload that was finalized or abandoned, before its body is read.
    /// (The metadata store checks again when the data is recorded.)
    pub fn accepts_data(upload: &Upload) -> Result<(), CacheError> {
        if upload.state != UploadState::Open {
            return Err(CacheError::UploadClosed);
        }
        Ok(())
    }

    /// Put Block: stores one block; a retried block id replaces the earlier copy.
    pub async fn stage_block(
        &self,
        upload: &Upload,
        block: BlockId,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<(), CacheError> {
        Self::accepts_data(upload)?;
        let name = BlobName::random();
        let chunk = self.store_chunk(&name, body, declared_len).await?;
        let max = self.policy.max_entry_size;
        let refused = match self
            .meta
            .stage_block(upload.id, &block, &chunk, max, now_millis())
            .await
        {
            Ok(Staged::Recorded { garbage }) => {
                self.collect(garbage).await;
                return Ok(());
            }
            Ok(Staged::UploadClosed) => CacheError::UploadClosed,
            Ok(Staged::TooLarge) => CacheError::TooLarge(max),
            Err(e) => e.into(),
        };
        self.collect(vec![name]).await;
        Err(refused)
    }

    /// Put Blob: the whole body is the upload's one committed chunk.
    pub async fn put_whole(
        &self,
        upload: &Upload,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<(), CacheError> {
        Self::accepts_data(upload)?;
        let name = BlobName::random();
        let chunk = self.store_chunk(&name, body, declared_len).await?;
        let refused = match self
            .meta
            .commit_whole(upload.id, &chunk, now_millis())
            .await
        {
            Ok(Committed::Done { garbage }) => {
                self.collect(garbage).await;
                return Ok(());
            }
            Ok(_) => CacheError::UploadClosed,
            Err(e) => e.into(),
        };
        self.collect(vec![name]).await;
        Err(refused)
    }

    /// Put Block List: the listed blocks, in order, become the upload's content.
    pub async fn commit_block_list(
        &self,
        upload: UploadId,
        list: &[BlockRef],
    ) -> Result<(), CacheError> {
        match self
            .meta
            .commit_block_list(upload, list, now_millis())
            .await?
        {
            Committed::Done { garbage } => {
                self.collect(garbage).await;
                Ok(())
            }
            Committed::UnknownBlock(_) => Err(CacheError::UnknownBlock),
            Committed::UploadClosed => Err(CacheError::UploadClosed),
        }
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
        let key = CacheKey::parse(key)?;
        let version = Version::parse(version)?;
        let scope = who.write_scope.as_ref().ok_or(CacheError::WriteDenied)?;
        if size > self.policy.max_entry_size {
            return Err(CacheError::TooLarge(self.policy.max_entry_size));
        }
        let outcome = self
            .meta
            .finalize(FinalizeRequest {
                repository: &who.repository,
                scope,
                key: &key,
                version: &version,
                size,
                now: now_millis(),
            })
            .await?;
        match outcome {
            Finalized::Done { entry, garbage } => {
                self.collect(garbage).await;
                audit("finalize", who, scope, &key, &version, entry);
                Ok(entry)
            }
            Finalized::NoUpload => Err(CacheError::NoReservation),
            Finalized::NothingUploaded => Err(CacheError::NothingUploaded),
            Finalized::SizeMismatch { stored, garbage } => {
                self.collect(garbage).await;
                Err(CacheError::SizeMismatch {
                    stored,
                    declared: size,
                })
            }
        }
    }

    /// GetCacheEntryDownloadURL: GitHub's matching over the token's readable scopes. A hit
    /// counts as a use of the entry (last-used time and hit count, written within a second).
    pub async fn lookup(&self, who: &Identity, lookup: &Lookup) -> Result<Option<Hit>, CacheError> {
        if who.read_scopes.is_empty() {
            return Err(CacheError::ReadDenied);
        }
        let folded: Vec<String> = lookup.keys.iter().map(CacheKey::folded).collect();
        let candidates = self
            .meta
            .find_candidates(&who.repository, &lookup.version, &who.read_scopes, &folded)
            .await?;
        let Some(best) = matching::best_match(&who.read_scopes, &folded, &candidates) else {
            return Ok(None);
        };
        self.usage.record(best.id, now_millis());
        Ok(Some(Hit {
            entry: LinkTarget {
                id: best.id,
                created_at: best.created_at,
            },
            matched_key: best.key.clone(),
        }))
    }

    pub async fn open_entry(&self, id: EntryId) -> Result<OpenEntry, CacheError> {
        let (entry, chunks) = self
            .meta
            .entry(id)
            .await?
            .ok_or(CacheError::EntryNotFound)?;
        Ok(OpenEntry { entry, chunks })
    }

    /// Streams bytes `[start, start + len)` of an entry, chunk after chunk. The first chunk is
    /// opened before this returns; later ones as the stream reaches them.
    pub async fn read(
        &self,
        open: &OpenEntry,
        start: u64,
        len: u64,
    ) -> Result<ByteStream, CacheError> {
        let slices = slices(&open.chunks, start, len);
        let Some(((first, first_off, first_len), rest)) = slices.split_first() else {
            return Ok(Box::pin(futures_util::stream::empty()));
        };
        let head = self
            .blobs
            .get(&open.chunks[*first].chunk.blob, *first_off, *first_len)
            .await?;
        let blobs = self.blobs.clone();
        let names: Vec<(BlobName, u64, u64)> = rest
            .iter()
            .map(|(i, off, len)| (open.chunks[*i].chunk.blob.clone(), *off, *len))
            .collect();
        let tail = futures_util::stream::iter(names)
            .then(move |(name, off, len)| {
                let blobs = blobs.clone();
                async move {
                    match blobs.get(&name, off, len).await {
                        Ok(stream) => stream,
                        Err(e) => Box::pin(futures_util::stream::once(async move {
                            Err(std::io::Error::other(e.to_string()))
                        })) as ByteStream,
                    }
                }
            })
            .flatten();
        Ok(Box::pin(head.chain(tail)))
    }

    /// Stores one chunk, refusing bodies larger than an entry may be, declared or not.
    async fn store_chunk(
        &self,
        name: &BlobName,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<model::Chunk, CacheError> {
        let max = self.policy.max_entry_size;
        if declared_len.is_some_and(|len| len > max) {
            return Err(CacheError::TooLarge(max));
        }
        match self.blobs.put(name, limit(body, max), declared_len).await {
            Err(BlobError::Body(e)) if e.kind() == std::io::ErrorKind::FileTooLarge => {
                Err(CacheError::TooLarge(max))
            }
            other => Ok(other?),
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

/// The audit trail of writes: who reserved or finalized what (issue #4, point 5).
fn audit(
    action: &str,
    who: &Identity,
    scope: &model::Scope,
    key: &CacheKey,
    version: &Version,
    id: i64,
) {
    tracing::info!(
        target: "hoard::audit",
        action,
        repository = %who.repository,
        scope = %scope,
        key = %key,
        version = %version,
        subject = %who.subject,
        run = %who.run,
        id,
    );
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
mod tests {
    use super::*;
    use model::Chunk;

    fn chunks(sizes: &[u64]) -> Vec<EntryChunk> {
        let mut start = 0;
        sizes
            .iter()
            .map(|&size| {
                let c = EntryChunk {
                    start,
                    chunk: Chunk {
                        blob: BlobName::random(),
                        size,
                        sha256: [0; 32],
                    },
                };
                start += size;
                c
            })
            .collect()
    }

    #[test]
    fn a_range_maps_onto_the_chunks_it_touches() {
        let c = chunks(&[10, 10, 5]);
        assert_eq!(slices(&c, 0, 25), [(0, 0, 10), (1, 0, 10), (2, 0, 5)]);
        assert_eq!(slices(&c, 5, 10), [(0, 5, 5), (1, 0, 5)]);
        assert_eq!(slices(&c, 20, 5), [(2, 0, 5)]);
        assert_eq!(slices(&c, 0, 1), [(0, 0, 1)]);
        assert_eq!(slices(&c, 24, 100), [(2, 4, 1)]);
        assert!(slices(&c, 25, 1).is_empty());
    }

    #[test]
    fn empty_chunks_are_skipped() {
        let c = chunks(&[0, 4]);
        assert_eq!(slices(&c, 0, 4), [(1, 0, 4)]);
    }
}
