//! Integrity on read: every chunk read whole is hashed as it streams, and compared with what
//! was recorded when it was written.
//!
//! Downloads check the chunk's XXH3-64, a non-cryptographic checksum about ten times cheaper
//! than SHA-256: checking SHA-256 on every download halved download throughput on a 2-core
//! machine (docs/benchmarks-history.md), and damage on disk is not an adversary that could
//! forge a checksum. Chunks recorded before XXH3 was check the SHA-256; `hoard verify` checks the
//! SHA-256 where it is known, else the XXH3 (a chunk the digest pass has not hashed yet).
//!
//! The frame that completes a chunk is passed on only once the hash is checked, so a reader of
//! a damaged chunk never receives all of its bytes: the stream ends with an error instead, and
//! the HTTP response is cut short of its `Content-Length` (a failed download, never a
//! complete-looking wrong one). Nothing else is held back: a block is sent as soon as it is read.
//!
//! A range that covers only part of a chunk cannot be checked against the whole chunk's hash
//! and is served unchecked; `hoard verify` checks every chunk whole.

use bytes::Bytes;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use super::{Cache, CacheError};
use crate::blob::{BlobError, ByteStream};
use crate::meta::{EntryState, EntryWalk};
use crate::model::{Chunk, EntryId};

/// Called once when a chunk turns out damaged, with a sentence saying how.
pub type OnDamage = Box<dyn FnOnce(String) + Send>;

/// The error a checked stream ends with when its chunk is damaged (inside an
/// [`std::io::Error`] of kind `InvalidData`): how, in one sentence. Told apart from the store's
/// own failures by [`damage_in`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Damage(pub String);

/// How the chunk was damaged, if `e` is the error a checked stream ends with for damage.
pub fn damage_in(e: &std::io::Error) -> Option<&str> {
    e.get_ref()?.downcast_ref::<Damage>().map(|d| d.0.as_str())
}

/// How a chunk is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// XXH3 where recorded, else SHA-256: downloads and the digest pass.
    Fast,
    /// SHA-256 where recorded, else XXH3: `hoard verify`.
    Full,
}

enum Hasher {
    Sha256(Sha256),
    Xxh3(Box<twox_hash::XxHash3_64>, u64),
}

impl Hasher {
    fn update(&mut self, bytes: &[u8]) {
        match self {
            Self::Sha256(h) => h.update(bytes),
            Self::Xxh3(h, _) => std::hash::Hasher::write(h.as_mut(), bytes),
        }
    }

    /// Whether what was hashed matches the record.
    fn matches(self, chunk: &Chunk) -> bool {
        match self {
            Self::Sha256(h) => Some(<[u8; 32]>::from(h.finalize())) == chunk.sha256,
            Self::Xxh3(h, expected) => std::hash::Hasher::finish(h.as_ref()) == expected,
        }
    }
}

/// How a chunk the metadata names but the store lacks is reported (and quarantined).
pub(super) fn missing(chunk: &Chunk) -> String {
    format!("chunk {} is missing", chunk.blob)
}

/// A whole chunk's check as its bytes go by: its length, and the hash `check` picks.
pub(super) struct WholeChunk {
    hasher: Hasher,
    seen: u64,
}

impl WholeChunk {
    pub(super) fn new(chunk: &Chunk, check: Check) -> Self {
        // Every chunk has at least one of the two: the stores record XXH3 since it was added,
        // and SHA-256 before.
        let xxh3 = |expected| Hasher::Xxh3(crate::blob::new_xxh3(), expected);
        let hasher = match (check, chunk.xxh3, chunk.sha256) {
            (Check::Fast, Some(expected), _) | (Check::Full, Some(expected), None) => {
                xxh3(expected)
            }
            _ => Hasher::Sha256(Sha256::new()),
        };
        Self { hasher, seen: 0 }
    }

    pub(super) fn update(&mut self, bytes: &[u8]) {
        self.seen += bytes.len() as u64;
        self.hasher.update(bytes);
    }

    /// `None` when the bytes seen are the whole of `chunk`, intact; else a sentence saying how
    /// they are not.
    pub(super) fn damage(self, chunk: &Chunk) -> Option<String> {
        let seen = self.seen;
        (seen != chunk.size || !self.hasher.matches(chunk)).then(|| {
            format!(
                "chunk {} does not match its recorded checksum ({seen} bytes read, {} recorded)",
                chunk.blob, chunk.size
            )
        })
    }
}

struct Checking {
    body: ByteStream,
    check: Option<WholeChunk>,
    expected: Chunk,
    on_damage: Option<OnDamage>,
    done: bool,
}

impl Checking {
    fn damaged(&mut self, how: String) -> std::io::Error {
        self.done = true;
        if let Some(report) = self.on_damage.take() {
            report(how.clone());
        }
        std::io::Error::new(std::io::ErrorKind::InvalidData, Damage(how))
    }

    /// Checks the bytes seen so far against the record, once they are all of them.
    fn check(&mut self) -> Result<(), std::io::Error> {
        match self
            .check
            .take()
            .and_then(|check| check.damage(&self.expected))
        {
            Some(how) => Err(self.damaged(how)),
            None => Ok(()),
        }
    }
}

/// `body`, the whole of `chunk`, checked against the chunk's recorded length and hash. Frames
/// pass on as they come, but the one that brings the recorded length is passed on only once the
/// hash matches: a damaged chunk's stream ends with an error before its last byte, and nothing
/// is held back in the meantime.
pub fn verified(body: ByteStream, chunk: &Chunk, check: Check, on_damage: OnDamage) -> ByteStream {
    let state = Checking {
        body,
        check: Some(WholeChunk::new(chunk, check)),
        expected: chunk.clone(),
        on_damage: Some(on_damage),
        done: false,
    };
    Box::pin(futures_util::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        match s.body.next().await {
            Some(Ok(frame)) => {
                let Some(check) = s.check.as_mut() else {
                    if frame.is_empty() {
                        return Some((Ok(frame), s));
                    }
                    // More than the recorded length: the check already passed on the frame
                    // that completed it.
                    let how = format!("chunk {} is longer than recorded", s.expected.blob);
                    let error = s.damaged(how);
                    return Some((Err(error), s));
                };
                check.update(&frame);
                if check.seen >= s.expected.size {
                    if let Err(error) = s.check() {
                        return Some((Err(error), s));
                    }
                }
                Some((Ok(frame), s))
            }
            Some(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                let how = format!("chunk {} is shorter than recorded: {e}", s.expected.blob);
                let error = s.damaged(how);
                Some((Err(error), s))
            }
            Some(Err(e)) => {
                s.done = true;
                Some((Err(e), s))
            }
            None => {
                s.done = true;
                // Shorter than recorded (or empty, as recorded): checked now.
                match s.check() {
                    Err(error) => Some((Err(error), s)),
                    Ok(()) => None,
                }
            }
        }
    }))
}

/// What `hoard verify` found.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    pub entries: u64,
    pub chunks: u64,
    pub bytes: u64,
    /// Entries quarantined, and why.
    pub damaged: Vec<(EntryId, String)>,
}

impl Cache {
    /// Reads every chunk of every entry whole and checks it; quarantines the entries whose
    /// chunks are damaged or missing. Calls `progress` after each entry.
    pub async fn verify_all(
        &self,
        mut progress: impl FnMut(&VerifyReport),
    ) -> Result<VerifyReport, CacheError> {
        let mut report = VerifyReport::default();
        let mut after = EntryId::new(0);
        loop {
            let entries = self
                .meta
                .walk_entries(EntryWalk::All { after }, 500)
                .await?;
            let Some(last) = entries.last() else { break };
            after = last.id;
            for id in entries.iter().map(|e| e.id) {
                let Some((_, chunks)) = self.meta.entry(id, EntryState::Live).await? else {
                    continue; // removed meanwhile
                };
                let mut damage = None;
                for placed in &chunks {
                    report.chunks += 1;
                    report.bytes += placed.chunk.size;
                    damage = self
                        .read_checked(&placed.chunk, Check::Full, |_| async {})
                        .await?;
                    if damage.is_some() {
                        break;
                    }
                }
                report.entries += 1;
                if let Some(how) = damage {
                    self.quarantine(id, how.clone()).await?;
                    report.damaged.push((id, how));
                }
                progress(&report);
            }
        }
        Ok(report)
    }

    /// Reads a chunk whole, checked as `check` says, giving each frame to `each` (the last
    /// only once the check passed): `Some(how)` if it is damaged or missing.
    pub(super) async fn read_checked<F, Fut>(
        &self,
        chunk: &Chunk,
        check: Check,
        mut each: F,
    ) -> Result<Option<String>, CacheError>
    where
        F: FnMut(Bytes) -> Fut + Send,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let stream = match self.blobs.get(&chunk.blob, 0, chunk.size).await {
            Ok(stream) => stream,
            Err(BlobError::NotFound(_)) => return Ok(Some(missing(chunk))),
            Err(e) => return Err(e.into()),
        };
        let found = std::sync::Arc::new(std::sync::Mutex::new(None));
        let sink = found.clone();
        let mut checked = verified(
            stream,
            chunk,
            check,
            Box::new(move |how| *sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(how)),
        );
        while let Some(frame) = checked.next().await {
            match frame {
                Ok(frame) => each(frame).await,
                Err(e) => {
                    let how = found.lock().unwrap_or_else(|p| p.into_inner()).take();
                    return match how {
                        Some(how) => Ok(Some(how)),
                        None => Err(BlobError::Io {
                            what: format!("chunk {}", chunk.blob),
                            source: e,
                        }
                        .into()),
                    };
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::BlobName;
    use futures_util::TryStreamExt;
    use std::sync::{Arc, Mutex};

    fn frames(data: &[u8], size: usize) -> ByteStream {
        let frames: Vec<std::io::Result<Bytes>> = data
            .chunks(size)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        Box::pin(futures_util::stream::iter(frames))
    }

    fn chunk_of(data: &[u8]) -> Chunk {
        Chunk {
            blob: BlobName::random(),
            size: data.len() as u64,
            sha256: Some(Sha256::digest(data).into()),
            xxh3: Some(crate::blob::xxh3_64(data)),
        }
    }

    /// Whether `data` passes as `recorded` under `check`.
    async fn passes(data: &[u8], recorded: &Chunk, check: Check) -> bool {
        let (report, _) = reporter();
        verified(frames(data, 1_000), recorded, check, report)
            .try_collect::<Vec<Bytes>>()
            .await
            .is_ok()
    }

    fn reporter() -> (OnDamage, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        (Box::new(move |how| sink.lock().unwrap().push(how)), seen)
    }

    #[tokio::test]
    async fn intact_chunks_pass_through_unchanged() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let (report, reports) = reporter();
        let out: Vec<Bytes> = verified(frames(&data, 777), &chunk_of(&data), Check::Fast, report)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(out.concat(), data);
        assert!(reports.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_flipped_byte_ends_the_stream_with_an_error_before_the_last_frame() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let recorded = chunk_of(&data);
        let mut damaged = data.clone();
        damaged[5_000] ^= 1;
        let (report, reports) = reporter();
        let mut stream = verified(frames(&damaged, 1_000), &recorded, Check::Fast, report);
        let mut received = 0;
        let mut failed = false;
        while let Some(item) = stream.next().await {
            match item {
                Ok(frame) => received += frame.len(),
                Err(e) => {
                    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
                    let how = damage_in(&e).expect("told apart from a store's failure");
                    assert!(
                        how.contains("does not match its recorded checksum"),
                        "{how}"
                    );
                    assert_eq!(e.to_string(), how);
                    failed = true;
                }
            }
        }
        assert!(failed, "the reader sees an error");
        assert!(received < data.len(), "the reader never gets every byte");
        assert_eq!(damage_in(&std::io::Error::other("store failed")), None);
        assert_eq!(
            reports.lock().unwrap().len(),
            1,
            "the damage is reported once"
        );
    }

    #[tokio::test]
    async fn each_check_reads_the_digest_it_should_and_any_recorded_one_catches_a_flipped_byte() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut damaged = data.clone();
        damaged[9_999] ^= 0x10;
        let both = chunk_of(&data);
        // Written before XXH3 was recorded; written without SHA-256 (the digest pass's to add).
        let sha256_only = Chunk {
            xxh3: None,
            ..both.clone()
        };
        let xxh3_only = Chunk {
            sha256: None,
            ..both.clone()
        };
        for recorded in [&both, &sha256_only, &xxh3_only] {
            for check in [Check::Fast, Check::Full] {
                assert!(
                    passes(&data, recorded, check).await,
                    "{recorded:?} {check:?}"
                );
                assert!(
                    !passes(&damaged, recorded, check).await,
                    "{recorded:?} {check:?}"
                );
            }
        }
        // Which one each reads: a wrong SHA-256 is caught by verify's check only, a wrong
        // XXH3 by the downloads' only.
        let wrong_sha256 = Chunk {
            sha256: Some([0; 32]),
            ..both.clone()
        };
        assert!(passes(&data, &wrong_sha256, Check::Fast).await);
        assert!(!passes(&data, &wrong_sha256, Check::Full).await);
        let wrong_xxh3 = Chunk {
            xxh3: Some(1),
            ..both.clone()
        };
        assert!(!passes(&data, &wrong_xxh3, Check::Fast).await);
        assert!(passes(&data, &wrong_xxh3, Check::Full).await);
    }

    #[tokio::test]
    async fn a_short_chunk_is_damage() {
        let data = vec![7u8; 4096];
        let (report, reports) = reporter();
        let result: Result<Vec<Bytes>, _> = verified(
            frames(&data[..4000], 1000),
            &chunk_of(&data),
            Check::Fast,
            report,
        )
        .try_collect()
        .await;
        assert!(result.is_err());
        assert_eq!(reports.lock().unwrap().len(), 1);
    }
}
