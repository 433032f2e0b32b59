//! Restoring: matching a lookup to an entry, opening it, and streaming its bytes (checked
//! against their hashes on the way, see [`super::integrity`]) or linking to them directly.

use std::sync::Arc;

use futures_util::StreamExt;

use super::{integrity, matching, recent, Cache, CacheError};
use crate::auth::{Identity, LinkTarget};
use crate::blob::BlobError;
use crate::meta::{EntryChunk, EntryState};
use crate::model::{
    ByteStream, CacheKey, Counters, Entry, EntryId, Lookup, LookupResult, Millis, RefClass, Slot,
};

/// The largest first chunk a download reads and checks whole before it is answered (see
/// [`Cache::read`]): small entries, most often one chunk, then fail with a status when damaged
/// rather than with a cut connection. It costs the time to read it, well within the 5 s a
/// client waits for its first byte (PROTOCOL.md §4.2), and no more memory than the store's
/// own reads of a block hold.
pub const CHECKED_BEFORE_ANSWER: u64 = 1 << 20;

/// A restore hit.
#[derive(Debug, Clone)]
pub struct Hit {
    /// What the download link opens.
    pub entry: LinkTarget<EntryId>,
    pub matched_key: String,
    /// The scope the entry was saved in (the v1 answer names it).
    pub scope: crate::model::Scope,
}

/// An entry opened for reading.
#[derive(Debug, Clone)]
pub struct OpenEntry {
    pub entry: Entry,
    pub(super) chunks: Vec<EntryChunk>,
}

impl OpenEntry {
    /// The entry a finalize just made visible, as a load would return it.
    pub(super) fn new(
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

impl Cache {
    /// GetCacheEntryDownloadURL: GitHub's matching over the token's readable scopes (less
    /// those the write policy denies, see [`super::policy`]). A hit
    /// counts as a use of the entry (last-used time and hit count, written within a second) and
    /// is recorded as a restore by `who` from `address` (the entry's restore records).
    pub async fn lookup(
        &self,
        who: &Identity,
        address: Option<std::net::IpAddr>,
        lookup: &Lookup,
    ) -> Result<Option<Hit>, CacheError> {
        if who.read_scopes.len() > crate::model::MAX_READ_SCOPES {
            return Err(CacheError::Invalid(crate::model::InvalidInput(format!(
                "the token grants {} readable scopes; lookups search at most {}",
                who.read_scopes.len(),
                crate::model::MAX_READ_SCOPES
            ))));
        }
        // The token's scopes, less those the write policy denies.
        let scopes = self.lookup_scopes(who, &lookup.keys)?;
        let folded: Vec<String> = lookup.keys.iter().map(CacheKey::folded).collect();
        let key = recent::RecentLookups::key(&who.repository, &lookup.version, &scopes, &folded);
        let candidates = self
            .lookups
            .get_or_load(key, self.clock.as_ref(), || {
                self.meta
                    .find_candidates(&who.repository, &lookup.version, &scopes, &folded)
            })
            .await?;
        let class = RefClass::of_caller(who.write_scope.as_ref(), &who.read_scopes);
        let now = self.clock.now();
        let Some(best) = matching::best_match(&scopes, &folded, &candidates) else {
            self.metrics.lookup(crate::metrics::LookupOutcome::Miss);
            self.metrics
                .repository_lookup(who.display_repository(), false);
            self.usage
                .record_miss(&who.repository, &who.repository_name);
            self.stats.lookup(
                &who.repository,
                &lookup.keys,
                &folded,
                class,
                &Counters::lookup(LookupResult::Miss, 0, false),
                now,
                |family| {
                    self.metrics.family_lookup(
                        who.display_repository(),
                        family,
                        LookupResult::Miss.label(),
                        false,
                    )
                },
            );
            return Ok(None);
        };
        let primary = folded.first().map_or("", String::as_str);
        let (outcome, result) = if best.key_folded == primary {
            (crate::metrics::LookupOutcome::Exact, LookupResult::ExactHit)
        } else if best.key_folded.starts_with(primary) {
            (
                crate::metrics::LookupOutcome::Prefix,
                LookupResult::RestoreKeyHit,
            )
        } else {
            (
                crate::metrics::LookupOutcome::RestoreKey,
                LookupResult::RestoreKeyHit,
            )
        };
        self.metrics.lookup(outcome);
        self.metrics
            .repository_lookup(who.display_repository(), true);
        self.usage.record(best.id, who, address, now);
        if best.promoted {
            self.metrics.promoted_hit();
        }
        self.stats.lookup(
            &who.repository,
            &lookup.keys,
            &folded,
            class,
            &Counters::lookup(result, best.size, best.promoted),
            now,
            |family| {
                self.metrics.family_lookup(
                    who.display_repository(),
                    family,
                    result.label(),
                    best.promoted,
                )
            },
        );
        Ok(Some(Hit {
            entry: LinkTarget {
                id: best.id,
                created_at: best.created_at,
            },
            matched_key: best.key.clone(),
            scope: best.scope.clone(),
        }))
    }

    /// The entry a signed download link names, opened for reading: [`CacheError::NoSuchLink`]
    /// unless the row is the one the link was signed for (same id and creation time).
    pub async fn open_link(&self, link: LinkTarget<EntryId>) -> Result<Arc<OpenEntry>, CacheError> {
        match self.open_entry(link.id).await {
            Ok(open) if open.entry.created_at == link.created_at => Ok(open),
            Ok(_) | Err(CacheError::EntryNotFound) => Err(CacheError::NoSuchLink),
            Err(e) => Err(e),
        }
    }

    /// The entry `id`, opened for reading (from the recent entries when known).
    pub(super) async fn open_entry(&self, id: EntryId) -> Result<Arc<OpenEntry>, CacheError> {
        self.entries
            .get_or_load(id, self.clock.as_ref(), || async {
                let (entry, chunks) = self
                    .meta
                    .entry(id, EntryState::Live)
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

    /// Streams bytes `[start, start + len)` of an entry, chunk after chunk, each chunk read
    /// whole checked against its hash (see [`integrity`]). The first chunk is opened before
    /// this returns, later ones as the stream reaches them; a first chunk read whole of at most
    /// [`CHECKED_BEFORE_ANSWER`] bytes is read and checked before this returns, so that its
    /// damage is [`CacheError::Damaged`] (and its store's failure [`CacheError::Storage`]),
    /// which the caller answers with a status. Past that, a damaged or missing chunk
    /// quarantines the entry and ends the stream with an error; so does a store that fails
    /// mid-stream. Either way one line is logged with the entry and the cause: the answer's
    /// headers are gone by then, and the client sees only a body cut short.
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
        let checked_before_answer =
            first.1 == 0 && first.2 == first.0.size && first.2 <= CHECKED_BEFORE_ANSWER;
        let mut head = self.open_chunk(entry, first).await?;
        if checked_before_answer {
            // Read and checked whole before the caller answers: damage found here is an error
            // with a status, not a body cut short.
            let mut frames = Vec::new();
            while let Some(frame) = head.next().await {
                match frame {
                    Ok(frame) => frames.push(Ok(frame)),
                    Err(e) => {
                        tracing::warn!(entry = entry.get(), error = %e, "a download failed before its headers were sent");
                        return Err(match integrity::damage_in(&e) {
                            Some(how) => CacheError::Damaged(how.to_owned()),
                            None => BlobError::Io {
                                what: format!("the first chunk of entry {}", entry.get()),
                                source: e,
                            }
                            .into(),
                        });
                    }
                }
            }
            head = Box::pin(futures_util::stream::iter(frames));
        }
        let counted = self.metrics.clone();
        let cache = self.clone();
        let tail = futures_util::stream::iter(parts)
            .then(move |part| {
                let cache = cache.clone();
                async move {
                    let blob = part.0.blob.clone();
                    match cache.open_chunk(entry, part).await {
                        Ok(stream) => stream,
                        Err(e) => {
                            let cause = match e {
                                CacheError::EntryNotFound => {
                                    format!("chunk {blob} is missing; the entry is quarantined")
                                }
                                e => format!("opening chunk {blob}: {e}"),
                            };
                            Box::pin(futures_util::stream::once(async move {
                                Err(std::io::Error::other(cause))
                            })) as ByteStream
                        }
                    }
                }
            })
            .flatten();
        // Bytes count as downloaded as they leave, so a cut-off download counts what went. The
        // stream's first error is its last: the response ends there.
        Ok(Box::pin(head.chain(tail).inspect(move |frame| match frame {
            Ok(bytes) => counted.downloaded(bytes.len() as u64),
            Err(e) => tracing::warn!(
                entry = entry.get(),
                error = %e,
                "a download broke off after its headers were sent; the client sees its body cut short"
            ),
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
                            tracing::error!(entry = entry.get(), error = %e, "could not quarantine a damaged entry");
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
                self.quarantine(entry, integrity::missing(&chunk)).await?;
                Err(CacheError::EntryNotFound)
            }
            Err(e) => Err(e.into()),
        }
    }
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
