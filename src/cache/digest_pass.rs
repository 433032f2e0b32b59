//! The digest pass: records the SHA-256 of the chunks the local disk store wrote without one
//! (those of more than 1 MiB: hashing them inside the request was a third of an upload's CPU),
//! then their entry's digest (see [`crate::model::entry_digest`]).
//!
//! It reads each such chunk back whole, usually from the page cache since it runs right after
//! the finalize, and checks its XXH3 as a download does: a chunk damaged before its pass is
//! quarantined, never given the digest of damaged bytes. The SHA-256 itself is computed on a
//! thread of its own at the lowest CPU priority (nice 19): while requests keep every core busy
//! it waits and digests lag behind; an idle moment catches up. Only that thread is lowered:
//! the pass's database calls run at the requests' priority, so a starved thread never holds a
//! lock a request waits for.
//!
//! The finalize that makes such an entry queues it. At start-up, and whenever the queue was
//! full, the pass also walks the entries still without a digest: those a crash or a stopped
//! replica left, and those saved before hoard recorded digests.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;
use super::integrity::Check;
use super::{Cache, CacheError};
use crate::model::{entry_digest, Chunk, EntryId};

/// Entries queued at most; past it, the next walk finds the rest.
pub(super) const QUEUE_CAPACITY: usize = 10_000;

/// Entries read per step of a walk.
const WALK_PAGE: usize = 100;

/// Frames in flight to the hashing thread: memory stays a few I/O blocks.
const FRAMES_IN_FLIGHT: usize = 4;

/// The entries waiting for the pass.
#[derive(Debug)]
pub(super) struct DigestQueue {
    pending: Mutex<Pending>,
    wake: Notify,
}

#[derive(Debug)]
struct Pending {
    ids: VecDeque<EntryId>,
    /// Entries may be waiting that the queue does not hold: walk the database for them.
    walk: bool,
}

/// What the pass does next.
pub(super) enum Next {
    Entry(EntryId),
    Walk,
    Wait,
}

impl Default for DigestQueue {
    fn default() -> Self {
        Self {
            // A new process walks first.
            pending: Mutex::new(Pending {
                ids: VecDeque::new(),
                walk: true,
            }),
            wake: Notify::new(),
        }
    }
}

impl DigestQueue {
    /// Queues an entry that awaits its digest.
    pub(super) fn push(&self, id: EntryId) {
        {
            let mut pending = self.lock();
            if pending.ids.len() < QUEUE_CAPACITY {
                pending.ids.push_back(id);
            } else {
                pending.walk = true;
            }
        }
        self.wake.notify_one();
    }

    /// How many entries are queued.
    pub(super) fn len(&self) -> usize {
        self.lock().ids.len()
    }

    /// After a failure: walk again once the pass is back.
    fn walk_later(&self) {
        self.lock().walk = true;
    }

    pub(super) fn next(&self) -> Next {
        let mut pending = self.lock();
        if let Some(id) = pending.ids.pop_front() {
            Next::Entry(id)
        } else if std::mem::take(&mut pending.walk) {
            Next::Walk
        } else {
            Next::Wait
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the pass did with one entry.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Digested {
    /// Its digest is recorded (or was already).
    Recorded(String),
    /// A chunk was damaged or missing: the entry is quarantined.
    Quarantined(String),
    /// The entry is gone.
    Gone,
}

/// What the hashing thread is given.
enum Hash {
    Frame(Bytes),
    /// The SHA-256 of the frames since the last one; the thread starts over.
    Finish(oneshot::Sender<[u8; 32]>),
}

/// SHA-256 on a thread of its own at nice 19, fed frames through a short channel.
pub(super) struct LowPriorityHasher {
    frames: mpsc::Sender<Hash>,
}

impl LowPriorityHasher {
    /// Starts the thread; it ends when the value is dropped.
    pub(super) fn spawn() -> std::io::Result<Self> {
        let (frames, mut jobs) = mpsc::channel::<Hash>(FRAMES_IN_FLIGHT);
        std::thread::Builder::new()
            .name("hoard-digest".into())
            .spawn(move || {
                lowest_priority();
                let mut sha256 = Sha256::new();
                while let Some(job) = jobs.blocking_recv() {
                    match job {
                        Hash::Frame(frame) => sha256.update(&frame),
                        Hash::Finish(reply) => {
                            let _ = reply.send(std::mem::take(&mut sha256).finalize().into());
                        }
                    }
                }
            })?;
        Ok(Self { frames })
    }

    async fn update(&self, frame: Bytes) {
        // A send fails only once the thread is gone; `finish` then says so.
        let _ = self.frames.send(Hash::Frame(frame)).await;
    }

    async fn finish(&self) -> Result<[u8; 32], CacheError> {
        let (reply, digest) = oneshot::channel();
        let gone = || {
            CacheError::Storage(crate::blob::BlobError::Io {
                what: "the digest thread".into(),
                source: std::io::Error::other("it stopped"),
            })
        };
        self.frames
            .send(Hash::Finish(reply))
            .await
            .map_err(|_| gone())?;
        digest.await.map_err(|_| gone())
    }
}

impl Cache {
    /// Starts the pass; the task ends once it has stopped after `stop`.
    pub(super) fn spawn_digest_pass(&self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let cache = self.clone();
        tokio::spawn(async move {
            match LowPriorityHasher::spawn() {
                Ok(hasher) => cache.run_digest_pass(&hasher, stop).await,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the digest pass: large entries get no digest until a restart")
                }
            }
        })
    }

    async fn run_digest_pass(&self, hasher: &LowPriorityHasher, stop: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        loop {
            // Stopping drops an entry half hashed: nothing of it is recorded before its end,
            // and the next start walks it again.
            let round = match self.digests.next() {
                Next::Entry(id) => tokio::select! {
                    _ = stop.cancelled() => return,
                    done = self.digest_entry(hasher, id) => done.map(drop),
                },
                Next::Walk => tokio::select! {
                    _ = stop.cancelled() => return,
                    done = self.walk_for_digests(hasher) => done,
                },
                Next::Wait => {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = self.digests.wake.notified() => continue,
                    }
                }
            };
            match round {
                Ok(()) => {
                    if let Some(failed) = backoff.succeeded() {
                        tracing::info!(rounds = failed, "the digest pass works again");
                    }
                }
                Err(e) => {
                    // What failed is found again by the walk once the database or the store
                    // is back.
                    self.digests.walk_later();
                    if backoff.failed() {
                        tracing::warn!(error = %e, "the digest pass failed; it retries with growing waits");
                    }
                    let wait = backoff.retry_in().unwrap_or(Duration::from_secs(1));
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
            if stop.is_cancelled() {
                return;
            }
        }
    }

    /// Digests every entry the database holds without a digest, in id order.
    async fn walk_for_digests(&self, hasher: &LowPriorityHasher) -> Result<(), CacheError> {
        let mut after = EntryId::new(0);
        loop {
            let ids = self.meta.entries_awaiting_digest(after, WALK_PAGE).await?;
            let Some(last) = ids.last() else {
                return Ok(());
            };
            after = *last;
            for id in ids {
                self.digest_entry(hasher, id).await?;
            }
        }
    }

    /// Records the SHA-256 of each chunk of `id` that lacks one, and the entry's digest.
    pub(super) async fn digest_entry(
        &self,
        hasher: &LowPriorityHasher,
        id: EntryId,
    ) -> Result<Digested, CacheError> {
        let Some((_, chunks)) = self.meta.entry(id).await? else {
            return Ok(Digested::Gone);
        };
        let mut hashed: Vec<Chunk> = Vec::with_capacity(chunks.len());
        for placed in chunks {
            let mut chunk = placed.chunk;
            if chunk.sha256.is_none() {
                let read = self
                    .read_checked(&chunk, Check::Fast, |frame| hasher.update(frame))
                    .await;
                // Whatever the read gave (damage, an error half-way): the thread starts over,
                // so the next chunk's SHA-256 is of its bytes only.
                let sha256 = hasher.finish().await?;
                let damage = read?;
                if let Some(how) = damage {
                    self.quarantine(id, how.clone()).await?;
                    return Ok(Digested::Quarantined(how));
                }
                chunk.sha256 = Some(sha256);
            }
            hashed.push(chunk);
        }
        let digest = entry_digest(&hashed).expect("every chunk was just given its SHA-256");
        let sums: Vec<[u8; 32]> = hashed.iter().filter_map(|c| c.sha256).collect();
        // A walk and the queue may both bring an entry; only the pass that recorded it says so.
        if self.meta.record_digest(id, &sums, &digest).await? {
            tracing::info!(target: "hoard::audit", action = "digest", id = id.get(), %digest);
        }
        Ok(Digested::Recorded(digest))
    }
}

/// Puts the calling thread at nice 19 (Linux: a thread's nice value is its own). Without it
/// the pass still works, only at the requests' priority.
fn lowest_priority() {
    let thread = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(thread), 19) {
        tracing::debug!(error = %e, "the digest pass hashes at normal priority");
    }
}
