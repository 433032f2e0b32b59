//! The digest pass: records the SHA-256 of the chunks the local disk store wrote without one
//! (those of more than 64 KiB: hashing them inside the request was a third of an upload's CPU,
//! and a tenth of a 256 KiB save's),
//! then their entry's digest (see [`crate::model::entry_digest`]).
//!
//! It reads each such chunk back whole, usually from the page cache since it runs right after
//! the finalize, and checks its XXH3 as a download does: a chunk damaged before its pass is
//! quarantined, never given the digest of damaged bytes. The reading, the check and the SHA-256
//! run on a thread of its own in the kernel's idle class (`SCHED_IDLE`): it runs only on a core
//! nothing else wants, and a request's thread that wakes takes that core at once. While
//! requests keep every core busy, digests lag behind; an idle moment catches up. Only that
//! thread is lowered: the pass's database calls run at the requests' priority, so a starved
//! thread never holds a lock a request waits for.
//!
//! It also keeps out of the requests' way beyond the idle class: an entry waits until the cache
//! has been quiet for a moment, or until it has waited long enough (see [`super::pacing`]).
//!
//! The finalize that makes such an entry queues it. At start-up, and whenever the queue was
//! full, the pass also walks the entries still without a digest: those a crash or a stopped
//! replica left, and those saved before hoard recorded digests.

use std::collections::VecDeque;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;
use super::integrity::{Check, WholeChunk};
use super::pacing::Traffic;
use super::{Cache, CacheError};
use crate::blob::BlobError;
use crate::meta::{EntryState, EntryWalk};
use crate::model::{entry_digest, Chunk, EntryId, Millis};

/// Entries queued at most; past it, the next walk finds the rest.
pub(super) const QUEUE_CAPACITY: usize = 10_000;

/// Entries read per step of a walk.
const WALK_PAGE: usize = 100;

/// Frames in flight to the hashing thread: memory stays a few I/O blocks.
const FRAMES_IN_FLIGHT: usize = 4;

/// What the hashing thread reads of a chunk file at a time, into one buffer it keeps.
const READ_BLOCK: usize = 256 << 10;

/// The entries waiting for the pass.
#[derive(Debug)]
pub(super) struct DigestQueue {
    pending: Mutex<Pending>,
    wake: Notify,
    /// The cache's requests, which the pass keeps out of the way of.
    pub(super) traffic: Arc<Traffic>,
}

#[derive(Debug)]
struct Pending {
    /// Entries, and when they were queued (on the traffic's clock).
    ids: VecDeque<(EntryId, Millis)>,
    /// The entry being digested, if any: still pending.
    digesting: bool,
    /// Entries may be waiting that the queue does not hold: walk the database for them.
    walk: bool,
}

/// What the pass does next.
pub(super) enum Next {
    /// An entry, and when it was queued.
    Entry(EntryId, Millis),
    Walk,
    Wait,
}

impl Default for DigestQueue {
    fn default() -> Self {
        Self {
            // A new process walks first.
            pending: Mutex::new(Pending {
                ids: VecDeque::new(),
                digesting: false,
                walk: true,
            }),
            wake: Notify::new(),
            traffic: Arc::default(),
        }
    }
}

impl DigestQueue {
    /// A queue whose pass follows `traffic` (tests give it a clock they move).
    #[cfg(test)]
    pub(super) fn with_traffic(traffic: Arc<Traffic>) -> Self {
        Self {
            traffic,
            ..Self::default()
        }
    }

    /// Queues an entry that awaits its digest.
    pub(super) fn push(&self, id: EntryId) {
        {
            let mut pending = self.lock();
            if pending.ids.len() < QUEUE_CAPACITY {
                let queued = self.traffic.now();
                pending.ids.push_back((id, queued));
            } else {
                pending.walk = true;
            }
        }
        self.wake.notify_one();
    }

    /// How many entries await their digest: those queued and the one being digested.
    pub(super) fn len(&self) -> usize {
        let pending = self.lock();
        pending.ids.len() + usize::from(pending.digesting)
    }

    /// After a failure: walk again once the pass is back.
    fn walk_later(&self) {
        self.lock().walk = true;
    }

    /// What the pass does next; an entry taken counts as pending until [`DigestQueue::done`].
    pub(super) fn next(&self) -> Next {
        let mut pending = self.lock();
        if let Some((id, queued)) = pending.ids.pop_front() {
            pending.digesting = true;
            Next::Entry(id, queued)
        } else if std::mem::take(&mut pending.walk) {
            Next::Walk
        } else {
            Next::Wait
        }
    }

    /// The entry [`DigestQueue::next`] gave is digested, or left to a later walk.
    fn done(&self) {
        self.lock().digesting = false;
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

/// The cache's traffic, and when the entry was queued (see [`Traffic::wait_for`]).
pub(super) type Pace = (Arc<Traffic>, Millis);

/// What the hashing thread is given.
enum Hash {
    /// A chunk file to read whole here, checked as a download checks it.
    File {
        path: PathBuf,
        chunk: Chunk,
        /// The traffic to wait for before each block, and when the entry was queued.
        pace: Option<Pace>,
        reply: oneshot::Sender<std::io::Result<Hashed>>,
    },
    /// Bytes of a chunk read elsewhere (a store without local files).
    Frame(Bytes),
    /// The SHA-256 of the frames since the last one; the thread starts over.
    Finish(oneshot::Sender<[u8; 32]>),
}

/// What hashing one chunk found.
#[derive(Debug)]
pub(super) enum Hashed {
    Intact([u8; 32]),
    /// Damaged or missing, and how.
    Damaged(String),
}

/// SHA-256 on a thread of its own in the idle class, given chunk files to read or frames
/// through a short channel.
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
                let mut buffer = vec![0; READ_BLOCK];
                while let Some(job) = jobs.blocking_recv() {
                    match job {
                        Hash::File {
                            path,
                            chunk,
                            pace,
                            reply,
                        } => {
                            let _ = reply.send(hash_file(&path, &chunk, pace, &mut buffer));
                        }
                        Hash::Frame(frame) => sha256.update(&frame),
                        Hash::Finish(reply) => {
                            let _ = reply.send(std::mem::take(&mut sha256).finalize().into());
                        }
                    }
                }
            })?;
        Ok(Self { frames })
    }

    /// Reads and hashes `chunk`'s file on the thread.
    pub(super) async fn file(
        &self,
        path: PathBuf,
        chunk: &Chunk,
        pace: Option<Pace>,
    ) -> Result<Hashed, CacheError> {
        let (reply, hashed) = oneshot::channel();
        let job = Hash::File {
            path,
            chunk: chunk.clone(),
            pace,
            reply,
        };
        self.frames.send(job).await.map_err(|_| thread_gone())?;
        hashed.await.map_err(|_| thread_gone())?.map_err(|source| {
            BlobError::Io {
                what: format!("chunk {}", chunk.blob),
                source,
            }
            .into()
        })
    }

    async fn update(&self, frame: Bytes) {
        // A send fails only once the thread is gone; `finish` then says so.
        let _ = self.frames.send(Hash::Frame(frame)).await;
    }

    async fn finish(&self) -> Result<[u8; 32], CacheError> {
        let (reply, digest) = oneshot::channel();
        self.frames
            .send(Hash::Finish(reply))
            .await
            .map_err(|_| thread_gone())?;
        digest.await.map_err(|_| thread_gone())
    }
}

fn thread_gone() -> CacheError {
    BlobError::Io {
        what: "the digest thread".into(),
        source: std::io::Error::other("it stopped"),
    }
    .into()
}

/// Reads the first `chunk.size` bytes of `path` (all a download reads), checks them as a
/// download does and gives their SHA-256; with `pace`, each block first waits for the traffic.
fn hash_file(
    path: &Path,
    chunk: &Chunk,
    pace: Option<Pace>,
    buffer: &mut [u8],
) -> std::io::Result<Hashed> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Hashed::Damaged(super::integrity::missing(chunk)))
        }
        Err(e) => return Err(e),
    };
    let mut file = file.take(chunk.size);
    let mut check = WholeChunk::new(chunk, Check::Fast);
    let mut sha256 = Sha256::new();
    loop {
        if let Some((traffic, queued)) = &pace {
            traffic.block_until_ready(*queued);
        }
        let n = match file.read(buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        check.update(&buffer[..n]);
        sha256.update(&buffer[..n]);
    }
    Ok(match check.damage(chunk) {
        None => Hashed::Intact(sha256.finalize().into()),
        Some(how) => Hashed::Damaged(how),
    })
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
                Next::Entry(id, queued) => {
                    let done = tokio::select! {
                        _ = stop.cancelled() => return,
                        done = self.digest_entry(hasher, id, Some(queued)) => done.map(drop),
                    };
                    self.digests.done();
                    done
                }
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
        let started = self.digests.traffic.now();
        let mut after = EntryId::new(0);
        loop {
            let walk = EntryWalk::AwaitingDigest { after };
            let entries = self.meta.walk_entries(walk, WALK_PAGE).await?;
            let Some(last) = entries.last() else {
                return Ok(());
            };
            after = last.id;
            for id in entries.iter().map(|e| e.id) {
                self.digest_entry(hasher, id, Some(started)).await?;
            }
        }
    }

    /// Records the SHA-256 of each chunk of `id` that lacks one, and the entry's digest. With
    /// `queued` (when the entry was queued), the reads wait for the cache's traffic to let them
    /// run (see [`super::pacing`]); without, they run at once.
    pub(super) async fn digest_entry(
        &self,
        hasher: &LowPriorityHasher,
        id: EntryId,
        queued: Option<Millis>,
    ) -> Result<Digested, CacheError> {
        let Some((_, chunks)) = self.meta.entry(id, EntryState::Live).await? else {
            return Ok(Digested::Gone);
        };
        let pace = queued.map(|queued| (self.digests.traffic.clone(), queued));
        let mut hashed: Vec<Chunk> = Vec::with_capacity(chunks.len());
        for placed in chunks {
            let mut chunk = placed.chunk;
            if chunk.sha256.is_none() {
                match self.chunk_sha256(hasher, &chunk, pace.clone()).await? {
                    Hashed::Intact(sha256) => chunk.sha256 = Some(sha256),
                    Hashed::Damaged(how) => {
                        self.quarantine(id, how.clone()).await?;
                        return Ok(Digested::Quarantined(how));
                    }
                }
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

    /// Reads `chunk` whole and gives its SHA-256, or how it is damaged. A local file is read on
    /// the hashing thread, which waits for the traffic before each block; any other store's
    /// bytes come through [`Cache::read_checked`], once the traffic lets the whole chunk run.
    async fn chunk_sha256(
        &self,
        hasher: &LowPriorityHasher,
        chunk: &Chunk,
        pace: Option<Pace>,
    ) -> Result<Hashed, CacheError> {
        if let Some(path) = self.blobs.local_path(&chunk.blob) {
            return hasher.file(path, chunk, pace).await;
        }
        if let Some((traffic, queued)) = &pace {
            traffic.until_ready(*queued).await;
        }
        let read = self
            .read_checked(chunk, Check::Fast, |frame| hasher.update(frame))
            .await;
        // Whatever the read gave (damage, an error half-way): the thread starts over, so the
        // next chunk's SHA-256 is of its bytes only.
        let sha256 = hasher.finish().await?;
        Ok(match read? {
            None => Hashed::Intact(sha256),
            Some(how) => Hashed::Damaged(how),
        })
    }
}

/// Puts the calling thread in the kernel's idle scheduling class, at nice 19 as well where
/// that class is refused. Linux gives a thread its own class and nice value. In the idle class
/// a woken request's thread preempts this one at once, and the kernel places wakeups on a core
/// running only it as on an idle core; at nice 19 alone, this thread kept a core for its time
/// slice (a few milliseconds) before a woken request ran. Without either the pass still works,
/// only at the requests' priority.
fn lowest_priority() {
    use thread_priority::unix::{
        set_thread_priority_and_policy, thread_native_id, NormalThreadSchedulePolicy,
        ThreadSchedulePolicy,
    };
    let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
    if let Err(e) = set_thread_priority_and_policy(
        thread_native_id(),
        thread_priority::ThreadPriority::Min,
        idle,
    ) {
        tracing::debug!(error = ?e, "the digest pass is not in the idle class");
    }
    let thread = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(thread), 19) {
        tracing::debug!(error = %e, "the digest pass is not at nice 19");
    }
}
