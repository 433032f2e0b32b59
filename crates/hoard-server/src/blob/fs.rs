//! Local-disk chunk store.
//!
//! Layout under the root: `chunks/<first two hex chars>/<name>` for published chunks, `tmp/` for
//! chunks being written, a `VERSION` file naming the layout, and `synced`, the durability record.
//! A large chunk is written to the process's own staging directory under `tmp/` and hashed while
//! it is written, then renamed into place; a small one (up to 1 MiB, received whole) is written
//! under its own name at once. A crash of the process leaves staging files, which the next start
//! sweeps, and at most the small chunks being written, which no metadata names yet: garbage
//! collection removes those once they are older than the deletion grace. Several
//! processes may share one root: each holds a lock on its staging directory for as long as it
//! runs, and a starting process sweeps only the directories nobody holds.
//!
//! Durability without an fsync per chunk: the page cache survives a process crash, so only a
//! machine crash can lose written chunks. [`FsStore::sync`] flushes the whole file system
//! (`syncfs`) every `--sync-interval` and at shutdown, and records an instant before it together
//! with the kernel's boot id. After a reboot, chunks put after the recorded instant may be lost,
//! and [`BlobStore::lost_since`] says so: the domain then forgets the entries finalized after it.
//! The record moves past every entry committed (even when no chunk was put since the last
//! flush), so an acknowledged save is safe after at most one interval, busy or idle. The files
//! start-up reads (`VERSION`, `synced`) are only ever replaced whole and durably; one that a
//! crash left empty or unreadable means nothing in the store can be trusted to be on disk.
//!
//! File I/O runs in blocking tasks of one block each, one in flight per transfer while the next
//! block crosses the network: disk and network overlap, and no thread is held while a slow
//! client sends or reads. Each blocking task costs a thread wake-up and a switch both ways, which
//! on a virtual machine cost as much as copying tens of KiB, so blocks are wide (1 MiB) while
//! the [transfer memory](super::transfer_memory) budget has room, and narrow (256 KiB) when it is
//! short: memory stays bounded by that budget whatever the number and size of transfers.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures_util::StreamExt;

use super::transfer_memory::{Block, TransferMemory};
use super::{BlobError, BlobStore, ByteStream, Capacity, Digests, Listed, NameStream};
use crate::model::{now_millis, BlobName, Chunk, Millis};

const LAYOUT_VERSION: &str = "1";
/// Chunks up to this size are received whole and written in one blocking call (when the budget
/// has room): one thread hop instead of a pipeline.
const SMALL: u64 = 1 << 20;
/// Chunks up to this size get their SHA-256 while they are written, where it costs less than
/// the rest of their request. A larger one's is left to the digest pass, off the request's path:
/// a 256 KiB save spent 9% of its server CPU on it, which a save's answer does not need.
const SHA256_WHILE_WRITING: u64 = 64 << 10;
/// A small chunk reaches the page cache this many bytes per `write` call. The file system may
/// give a write a page-cache folio as large as the write, and on the machine measured, copying a
/// 256 KiB chunk into the page cache cost more in one write than in eight of 32 KiB: a small
/// save+restore's server CPU went down 8% (docs/benchmarks-history.md). Large chunks, whose
/// uploads showed no such difference, are written a block per call.
const SMALL_WRITE_PIECE: usize = 32 << 10;
/// `--transfer-memory`'s default.
pub const DEFAULT_TRANSFER_MEMORY: u64 = 16 << 20;
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
const UNKNOWN_BOOT: &str = "unknown";

#[derive(Debug, Clone)]
pub struct FsStore {
    root: PathBuf,
    chunks: PathBuf,
    /// This process's staging directory under `tmp/`.
    tmp: PathBuf,
    /// Held open (and locked) while the store lives, so other processes leave `tmp` alone.
    _staging_lock: Arc<File>,
    /// What the next sync must cover.
    pending: Arc<Pending>,
    /// What blocks being read and received bytes waiting to be written may hold at once.
    memory: Arc<TransferMemory>,
    lost_since: Option<Millis>,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> BlobError {
    let what = what.into();
    move |source| BlobError::Io { what, source }
}

/// The kernel's boot id: changes exactly when the machine restarts.
/// Without one (no /proc), every restart counts as a possible reboot: safe, if forgetful.
fn boot_id() -> String {
    fs::read_to_string(BOOT_ID)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && !s.contains(' '))
        .unwrap_or_else(|| UNKNOWN_BOOT.to_owned())
}

/// What the durability record must cover: counted by puts and commits as they happen, read by
/// each sync. A put or commit that lands while a sync runs is seen by the next one, never lost
/// between the two.
#[derive(Debug)]
struct Pending {
    /// Puts completed since the store opened; a put counts itself once its bytes are written.
    puts_done: AtomicU64,
    /// When metadata naming chunks of this store was last committed ([`BlobStore::note_committed`]).
    last_commit: AtomicI64,
    /// What the last successful sync covered; held for the whole of a sync, so syncs take turns.
    synced: Mutex<Synced>,
}

impl Default for Pending {
    fn default() -> Self {
        Self {
            puts_done: AtomicU64::new(0),
            last_commit: AtomicI64::new(0),
            // Nothing is known to be on disk yet: a process that ran on this store before (and
            // crashed) may have left chunks in the page cache, so the first sync flushes
            // whatever this process puts.
            synced: Mutex::new(Synced {
                puts: u64::MAX,
                recorded: 0,
            }),
        }
    }
}

#[derive(Debug)]
struct Synced {
    /// `puts_done` as read before the last `syncfs`: those puts are on disk.
    puts: u64,
    /// The instant the record names.
    recorded: Millis,
}

/// What start-up finds in the durability record.
#[derive(Debug, PartialEq, Eq)]
enum Record {
    /// "Every chunk put up to `synced_through` was on disk, as of boot `boot`."
    Written {
        boot: String,
        synced_through: Millis,
    },
    /// No record: a new store, unless its `VERSION` was there before.
    Missing,
    /// A record a crash left empty or torn (one written by an older version without an fsync).
    Unreadable,
}

/// The durability record: one line, `<boot id> <millis>`.
fn read_record(path: &Path) -> Record {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Record::Missing,
        Err(_) => return Record::Unreadable,
    };
    let parsed = text.trim().split_once(' ').and_then(|(boot, millis)| {
        let synced_through = millis.parse().ok()?;
        let boot = boot.to_owned();
        Some(Record::Written {
            boot,
            synced_through,
        })
    });
    parsed.unwrap_or(Record::Unreadable)
}

/// The durability record's line for this boot.
fn record_line(synced_through: Millis) -> String {
    format!("{} {synced_through}\n", boot_id())
}

/// Replaces `root/name` with `contents`, durably and whole: written under a temporary name,
/// fsynced, renamed over the old one, and the directory fsynced. A crash at any point leaves the
/// old file or the new one, never an empty or partial one.
fn replace_durably(root: &Path, name: &str, contents: &str) -> io::Result<()> {
    use rustix::fs::{flock, FlockOperation};
    // Processes sharing the store (`hoard gc` beside the server) take turns, or one could
    // rename the temporary file just after the other truncated it. The lock goes with the
    // directory's handle, also when a process dies holding it.
    let dir = File::open(root)?;
    flock(&dir, FlockOperation::LockExclusive)?;
    let staging = root.join(format!("{name}.tmp"));
    let mut file = File::create(&staging)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    fs::rename(&staging, root.join(name))?;
    dir.sync_all()
}

/// Replaces the durability record, durably.
fn write_record(root: &Path, synced_through: Millis) -> io::Result<()> {
    replace_durably(root, "synced", &record_line(synced_through))
}

/// Checks the layout version, writing it if the store is new. Whether the store existed before:
/// an empty `VERSION` is a new store's first write that a machine crash cut short, so the store
/// existed (and may hold chunks that were never flushed).
fn check_layout(root: &Path) -> Result<bool, BlobError> {
    let version_file = root.join("VERSION");
    let fail = io_err(version_file.display().to_string());
    let existed = match fs::read_to_string(&version_file) {
        Ok(v) if v.trim() == LAYOUT_VERSION => return Ok(true),
        Ok(v) if v.trim().is_empty() => true,
        Ok(v) => {
            return Err(fail(io::Error::other(format!(
                "data layout version {} is not supported (expected {LAYOUT_VERSION})",
                v.trim()
            ))))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(fail(e)),
    };
    replace_durably(root, "VERSION", &format!("{LAYOUT_VERSION}\n")).map_err(fail)?;
    Ok(existed)
}

/// Whether any chunk shard exists.
fn has_chunks(chunks: &Path) -> bool {
    fs::read_dir(chunks).is_ok_and(|mut d| d.next().is_some())
}

/// Removes staging left by processes that are gone: loose files (older layouts), and staging
/// directories whose lock no process holds. Directories still being set up (`*.new`) are left.
fn sweep_staging(tmp: &Path) -> io::Result<()> {
    use rustix::fs::{flock, FlockOperation};
    for item in fs::read_dir(tmp)? {
        let path = item?.path();
        if !path.is_dir() {
            let _ = fs::remove_file(&path);
            continue;
        }
        if path.extension().is_some_and(|e| e == "new") {
            continue;
        }
        let Ok(dir) = File::open(&path) else { continue };
        if flock(&dir, FlockOperation::NonBlockingLockExclusive).is_ok() {
            let _ = fs::remove_dir_all(&path);
        }
    }
    Ok(())
}

/// Creates this process's staging directory and locks it for the life of the returned handle.
/// It is locked under a name the sweep skips, then renamed: no sweep sees it unlocked.
fn own_staging_dir(tmp: &Path) -> io::Result<(PathBuf, File)> {
    use rustix::fs::{flock, FlockOperation};
    let name = BlobName::random();
    let building = tmp.join(format!("{name}.new"));
    fs::create_dir(&building)?;
    let dir = File::open(&building)?;
    flock(&dir, FlockOperation::NonBlockingLockExclusive)?;
    let path = tmp.join(name.as_str());
    fs::rename(&building, &path)?;
    Ok((path, dir))
}

impl FsStore {
    /// Opens the store at `root`, creating its layout, sweeps staging files left by a crash, and
    /// works out whether a machine crash may have lost recent chunks.
    pub fn open(root: &Path) -> Result<Self, BlobError> {
        let chunks = root.join("chunks");
        let tmp = root.join("tmp");
        for dir in [root, &chunks, &tmp] {
            fs::create_dir_all(dir).map_err(io_err(dir.display().to_string()))?;
        }
        // A store with chunks but no `VERSION` had its first writes cut short by a crash too.
        let existed = check_layout(root)? || has_chunks(&chunks);
        sweep_staging(&tmp).map_err(io_err(tmp.display().to_string()))?;
        let (tmp, staging_lock) =
            own_staging_dir(&tmp).map_err(io_err(tmp.display().to_string()))?;
        let record = root.join("synced");
        let lost_since = match read_record(&record) {
            // Same boot: the page cache survived whatever stopped the last run, nothing is lost.
            Record::Written { boot, .. } if boot != UNKNOWN_BOOT && boot == boot_id() => None,
            Record::Written { synced_through, .. } => Some(synced_through),
            // A new store: its record is on disk before its first chunk, so from here on a
            // machine crash always finds one.
            Record::Missing if !existed => {
                write_record(root, now_millis()).map_err(io_err(record.display().to_string()))?;
                None
            }
            // A store whose record a crash left empty or torn, or never wrote: nothing in it is
            // known to be on disk, so every entry it holds may have lost bytes.
            Record::Missing | Record::Unreadable => Some(0),
        };
        Ok(Self {
            root: root.to_owned(),
            chunks,
            tmp,
            _staging_lock: Arc::new(staging_lock),
            pending: Arc::default(),
            memory: TransferMemory::new(DEFAULT_TRANSFER_MEMORY),
            lost_since,
        })
    }

    /// The same store with a transfer memory budget of `bytes` (`--transfer-memory`).
    pub fn with_transfer_memory(mut self, bytes: u64) -> Self {
        self.memory = TransferMemory::new(bytes);
        self
    }

    fn path_of(&self, name: &BlobName) -> PathBuf {
        let name = name.as_str();
        self.chunks.join(&name[..2]).join(name)
    }
}

/// A staging file that is removed unless it was published: whatever ends a put early (an
/// error, a client hanging up, a dropped future) leaves nothing behind.
struct Staging {
    path: PathBuf,
    published: bool,
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// The file being written and the digests so far, passed to each blocking write and back.
type Sink = (File, Digests);

/// The sink of a put: free (not opened yet for a small chunk), or being written to by a
/// blocking task.
enum Disk {
    Idle(Option<Sink>),
    Busy(tokio::task::JoinHandle<io::Result<Sink>>),
}

impl Disk {
    /// The sink, once any write in flight has finished.
    async fn ready(self) -> io::Result<Option<Sink>> {
        match self {
            Self::Idle(sink) => Ok(sink),
            Self::Busy(task) => Ok(Some(task.await.map_err(io::Error::other)??)),
        }
    }
}

/// How a put's blocks are written.
#[derive(Debug, Clone, Copy)]
struct Writing {
    /// Whether to compute the SHA-256 too (see [`SHA256_WHILE_WRITING`]).
    sha256: bool,
    /// The most bytes one `write` call hands the file system (see [`SMALL_WRITE_PIECE`]).
    piece: usize,
}

/// Hands `block` (received bytes) to a blocking write once the one in flight has finished; the
/// block goes back to the budget once written.
async fn write_later(
    block: Block,
    memory: &Arc<TransferMemory>,
    disk: Disk,
    staging: &Path,
    writing: Writing,
) -> io::Result<Disk> {
    let sink = disk.ready().await?;
    let (memory, path) = (memory.clone(), staging.to_owned());
    Ok(Disk::Busy(tokio::task::spawn_blocking(move || {
        write_block(sink, &path, writing, block, &memory)
    })))
}

/// Creates the file a put writes: a staging file, or a small chunk's own (whose shard directory
/// is made the first time it is needed).
fn create_staging(path: &Path, digests: Digests) -> io::Result<Sink> {
    let file = in_its_directory(path, || {
        OpenOptions::new().write(true).create_new(true).open(path)
    })?;
    Ok((file, digests))
}

/// Runs `op` on `path`, and once more after making `path`'s directory if it was missing: a shard
/// directory is made the first time a chunk goes into it.
fn in_its_directory<T>(path: &Path, op: impl Fn() -> io::Result<T>) -> io::Result<T> {
    match op() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            op()
        }
        other => other,
    }
}

/// One blocking step of a put: opens the staging file if that has not happened yet (hashed with
/// SHA-256 too if `writing` says so), then hashes and writes a block of received bytes (if any),
/// `writing.piece` bytes per call, and the block goes back to the budget.
///
/// Frames are copied into blocks as they arrive and let go at once, rather than kept until
/// written: a frame is a view into the connection's read buffer, and one kept alive makes hyper
/// allocate a new buffer for its next read. Copied, each connection reads into the same buffer
/// for its whole life, and every byte an upload holds is counted by the budget.
fn write_block(
    sink: Option<Sink>,
    staging: &Path,
    writing: Writing,
    block: impl Into<Option<Block>>,
    memory: &TransferMemory,
) -> io::Result<Sink> {
    let (mut file, mut digests) = match sink {
        Some(sink) => sink,
        None if writing.sha256 => create_staging(staging, Digests::with_sha256())?,
        None => create_staging(staging, Digests::xxh3_only())?,
    };
    if let Some(block) = block.into() {
        digests.update(block.bytes());
        let written = block
            .bytes()
            .chunks(writing.piece)
            .try_for_each(|piece| file.write_all(piece));
        memory.keep(block);
        written?;
    }
    Ok((file, digests))
}

/// Moves a fully written staging file into place.
fn publish(tmp_path: &Path, final_path: &Path) -> io::Result<()> {
    in_its_directory(final_path, || fs::rename(tmp_path, final_path))
}

#[async_trait]
impl BlobStore for FsStore {
    async fn put(
        &self,
        name: &BlobName,
        mut body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<Chunk, BlobError> {
        let fail = || io_err(format!("chunk {name}"));
        let final_path = self.path_of(name);
        // A small chunk is received whole, then created under its own name, written and hashed
        // in one blocking call: no staging file and no rename (a rename across directories takes
        // the file system's rename lock, which every small save would queue on). Nothing reads a
        // chunk before its metadata exists, which is recorded only after this put returns; if the
        // process dies during the write, the file is an unreferenced young chunk, which garbage
        // collection removes after the deletion grace. A large one is staged under `tmp/` and
        // written block by block by blocking tasks, one in flight while the next block crosses
        // the network: no thread ever waits on a slow client. Its file is created up front, so
        // that no task can create it after an early return.
        //
        // A tiny chunk's SHA-256 costs less than its request and is computed here; a larger
        // one's (a third of the CPU an upload costs) is left to the digest pass, which reads
        // the chunk back from the page cache in the idle scheduling class (`cache::digest_pass`).
        let small = declared_len.is_some_and(|d| d <= SMALL);
        let writing = Writing {
            sha256: declared_len.is_some_and(|d| d <= SHA256_WHILE_WRITING),
            piece: if small { SMALL_WRITE_PIECE } else { usize::MAX },
        };
        let mut staging = Staging {
            path: if small {
                final_path.clone()
            } else {
                self.tmp.join(format!("{}.part", BlobName::random()))
            },
            published: false,
        };
        let mut disk = Disk::Idle(None);
        if !small {
            let path = staging.path.clone();
            let sink =
                tokio::task::spawn_blocking(move || create_staging(&path, Digests::xxh3_only()))
                    .await
                    .map_err(|e| fail()(io::Error::other(e)))?
                    .map_err(fail())?;
            disk = Disk::Idle(Some(sink));
        }
        // A small chunk fits one block and is written once whole, unless the budget runs short.
        let mut received: u64 = 0;
        let mut block: Option<Block> = None;
        while let Some(frame) = body.next().await {
            let mut frame = frame.map_err(BlobError::Body)?;
            received += frame.len() as u64;
            if let Some(declared) = declared_len.filter(|d| received > *d) {
                return Err(BlobError::LengthMismatch {
                    declared,
                    actual: received,
                });
            }
            while !frame.is_empty() {
                let mut filling = match block.take() {
                    Some(filling) => filling,
                    // Waits, if it must, holding nothing but the write in flight, which ends on
                    // its own.
                    None => {
                        let left =
                            declared_len.map_or(u64::MAX, |d| d - (received - frame.len() as u64));
                        self.memory.block(left).await
                    }
                };
                filling.fill(&mut frame);
                let more_to_come = declared_len.is_none_or(|d| received < d) || !frame.is_empty();
                if filling.is_full() && more_to_come {
                    disk = write_later(filling, &self.memory, disk, &staging.path, writing)
                        .await
                        .map_err(fail())?;
                } else {
                    block = Some(filling);
                }
            }
        }
        if let Some(declared) = declared_len.filter(|d| *d != received) {
            return Err(BlobError::LengthMismatch {
                declared,
                actual: received,
            });
        }
        // The last step writes what is left and publishes.
        let sink = disk.ready().await.map_err(fail())?;
        let path = staging.path.clone();
        let memory = self.memory.clone();
        let (sha256, xxh3) =
            tokio::task::spawn_blocking(move || -> io::Result<(Option<[u8; 32]>, u64)> {
                let (file, digests) = write_block(sink, &path, writing, block, &memory)?;
                drop(file);
                if !small {
                    publish(&path, &final_path)?;
                }
                Ok(digests.finish())
            })
            .await
            .map_err(|e| fail()(io::Error::other(e)))?
            .map_err(fail())?;
        staging.published = true;
        // Counted once written, so that the next sync cannot miss it (see `sync`).
        self.pending.puts_done.fetch_add(1, Ordering::SeqCst);
        Ok(Chunk {
            blob: name.clone(),
            size: received,
            sha256,
            xxh3: Some(xxh3),
        })
    }

    async fn get(&self, name: &BlobName, offset: u64, len: u64) -> Result<ByteStream, BlobError> {
        // Block by block, each read by a blocking task: no thread waits on a slow reader. The
        // next block is read while the previous one is sent when the budget has room at once;
        // otherwise the stream waits for room only once it has handed over every block it read,
        // so that it never waits holding a share that only its own progress gives back.
        let memory = self.memory.clone();
        let block = memory.block(len).await;
        // The first block is read before returning, so a missing chunk is an error here.
        let path = self.path_of(name);
        let first =
            tokio::task::spawn_blocking(move || -> io::Result<(File, io::Result<Block>)> {
                let mut file = File::open(&path)?;
                file.seek(SeekFrom::Start(offset))?;
                Ok(read_block(file, block, len))
            })
            .await
            .map_err(|e| io_err(format!("chunk {name}"))(io::Error::other(e)))?
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => BlobError::NotFound(name.clone()),
                _ => io_err(format!("chunk {name}"))(e),
            })?;

        type Read = tokio::task::JoinHandle<(File, io::Result<Block>)>;
        enum Next {
            Ready((File, io::Result<Block>)),
            Reading(Read),
            /// Not started: the budget had no room.
            Waiting(File),
        }
        let spawn_read = |file: File, block: Block, left: u64| -> Read {
            tokio::task::spawn_blocking(move || read_block(file, block, left))
        };
        let state = (Some(Next::Ready(first)), len);
        Ok(Box::pin(futures_util::stream::unfold(
            state,
            move |(next, left)| {
                let memory = memory.clone();
                async move {
                    let done = match next? {
                        Next::Ready(done) => Ok(done),
                        Next::Reading(task) => task.await,
                        Next::Waiting(file) => {
                            spawn_read(file, memory.block(left).await, left).await
                        }
                    };
                    let (file, read) = match done {
                        Ok(done) => done,
                        Err(e) => return Some((Err(io::Error::other(e)), (None, 0))),
                    };
                    let bytes = match read {
                        Ok(block) => memory.filled(block),
                        Err(e) => return Some((Err(e), (None, 0))),
                    };
                    let left = left - bytes.len() as u64;
                    let next = (left > 0).then(|| match memory.try_block(left) {
                        Some(block) => Next::Reading(spawn_read(file, block, left)),
                        None => Next::Waiting(file),
                    });
                    Some((Ok(bytes), (next, left)))
                }
            },
        )))
    }

    async fn delete(&self, name: &BlobName) -> Result<(), BlobError> {
        let path = self.path_of(name);
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(format!("chunk {name}"))(e)),
        }
    }

    async fn list(&self) -> Result<NameStream, BlobError> {
        // A blocking walk feeds a small channel: the consumer's pace bounds memory.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Listed, BlobError>>(256);
        let chunks = self.chunks.clone();
        tokio::task::spawn_blocking(move || {
            let walk = || -> io::Result<()> {
                for shard in fs::read_dir(&chunks)? {
                    let shard = shard?;
                    if !shard.file_type()?.is_dir() {
                        continue;
                    }
                    for file in fs::read_dir(shard.path())? {
                        let file = file?;
                        let name = file.file_name();
                        // Names the store did not make are not chunks.
                        let Some(name) = name.to_str().and_then(BlobName::parse) else {
                            continue;
                        };
                        // A chunk deleted since the directory was read is not listed.
                        let Ok(modified) = file.metadata().and_then(|m| m.modified()) else {
                            continue;
                        };
                        let modified = modified
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as Millis);
                        if tx.blocking_send(Ok(Listed { name, modified })).is_err() {
                            return Ok(()); // the consumer stopped listening
                        }
                    }
                }
                Ok(())
            };
            if let Err(e) = walk() {
                let _ = tx.blocking_send(Err(io_err("listing chunks")(e)));
            }
        });
        Ok(Box::pin(futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|item| (item, rx)) },
        )))
    }

    async fn capacity(&self) -> Result<Option<Capacity>, BlobError> {
        // In place: on a local file system statvfs answers from memory in about a microsecond,
        // less than a hop to a blocking thread; reservations ask it every time.
        let stat = rustix::fs::statvfs(&self.root)
            .map_err(|e| io_err(format!("statvfs of {}", self.root.display()))(e.into()))?;
        Ok(Some(Capacity {
            total: stat.f_blocks.saturating_mul(stat.f_frsize),
            available: stat.f_bavail.saturating_mul(stat.f_frsize),
        }))
    }

    async fn ping(&self) -> Result<(), BlobError> {
        let probe = self.tmp.join(format!("{}.ping", BlobName::random()));
        tokio::task::spawn_blocking(move || {
            fs::write(&probe, b"ok")?;
            fs::remove_file(&probe)
        })
        .await
        .map_err(|e| io_err("storage probe")(io::Error::other(e)))?
        .map_err(io_err("storage probe"))
    }

    fn lost_since(&self) -> Option<Millis> {
        self.lost_since
    }

    async fn presigned_get(
        &self,
        _name: &BlobName,
        _ttl: std::time::Duration,
    ) -> Result<Option<url::Url>, BlobError> {
        Ok(None)
    }

    fn local_path(&self, name: &BlobName) -> Option<PathBuf> {
        Some(self.path_of(name))
    }

    fn kind(&self) -> &'static str {
        "file"
    }

    fn note_committed(&self) {
        self.pending
            .last_commit
            .fetch_max(now_millis(), Ordering::SeqCst);
    }

    async fn sync(&self, force: bool) -> Result<(), BlobError> {
        let root = self.root.clone();
        let pending = self.pending.clone();
        tokio::task::spawn_blocking(move || -> io::Result<()> {
            let mut synced = pending.synced.lock().unwrap_or_else(|e| e.into_inner());
            // Read before the counters: a put completed before this instant has counted itself
            // below, or was covered by an earlier flush. One millisecond earlier, so that an
            // entry finalized in the same millisecond but after this read (its puts possibly
            // not counted) is on the forgotten side of the record.
            let through = now_millis().saturating_sub(1);
            let puts = pending.puts_done.load(Ordering::SeqCst);
            let last_commit = pending.last_commit.load(Ordering::SeqCst);
            let flush = force || puts != synced.puts;
            // With nothing put since the last flush, the record still moves past an entry
            // committed since (its chunks were flushed), or that entry stays forgettable.
            if !flush && last_commit < synced.recorded {
                return Ok(());
            }
            if flush {
                rustix::fs::syncfs(&File::open(&root)?)?;
            }
            write_record(&root, through)?;
            *synced = Synced {
                puts: if flush { puts } else { synced.puts },
                recorded: through,
            };
            Ok(())
        })
        .await
        .map_err(|e| io_err("sync")(io::Error::other(e)))?
        .map_err(io_err(format!("sync of {}", self.root.display())))
    }
}

/// Reads the next block at the file's position into `block` (an empty one): as much of the
/// `left` bytes as fits. A chunk shorter than `left` is an error.
fn read_block(file: File, mut block: Block, left: u64) -> (File, io::Result<Block>) {
    let want = left.min(block.capacity() as u64);
    let mut limited = file.take(want);
    let result = match block.read_to_end(&mut limited) {
        Ok(n) if n as u64 == want => Ok(block),
        Ok(n) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("chunk ended {} bytes early", left - n as u64),
        )),
        Err(e) => Err(e),
    };
    (limited.into_inner(), result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::transfer_memory::WIDE_BLOCK;
    use bytes::Bytes;

    #[tokio::test]
    async fn a_sync_records_the_boot_so_a_restart_without_reboot_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::open(dir.path()).unwrap();
        assert_eq!(store.lost_since(), None, "a new store has nothing to lose");
        store.sync(true).await.unwrap();
        let Record::Written {
            boot,
            synced_through,
        } = read_record(&dir.path().join("synced"))
        else {
            panic!("no record after a sync");
        };
        assert_eq!(boot, boot_id());
        assert!(synced_through > 0);
        assert_eq!(FsStore::open(dir.path()).unwrap().lost_since(), None);
    }

    /// A frame that counts itself among the live ones until the store drops it.
    struct Counted {
        frame: Vec<u8>,
        live: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl AsRef<[u8]> for Counted {
        fn as_ref(&self) -> &[u8] {
            &self.frame
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.live.fetch_sub(self.frame.len(), Ordering::Relaxed);
        }
    }

    /// Many more large puts, then reads, at once than the transfer memory budget has room for:
    /// the bytes they hold never exceed it (the blocks received frames are copied into and the
    /// blocks read, as the budget counts them), no put keeps a frame once copied (counted as
    /// the test hands them over), and every chunk keeps its bytes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_large_transfers_at_once_hold_no_more_than_the_memory_budget() {
        use futures_util::TryStreamExt;
        use std::sync::atomic::AtomicUsize;
        const BUDGET: u64 = 4 << 20;
        const FRAME: usize = 64 << 10;
        let dir = tempfile::tempdir().unwrap();
        let mut store = FsStore::open(dir.path()).unwrap();
        // No overdraft however slow the machine: the budget alone is what is tested.
        store.memory = TransferMemory::overdrawn_after(BUDGET, std::time::Duration::from_secs(600));
        let transfers = 24;
        let data: Vec<Vec<u8>> = (0..transfers)
            .map(|i| {
                (0..3 * WIDE_BLOCK + 1000 * i)
                    .map(|b| (b * 7 + i) as u8)
                    .collect()
            })
            .collect();
        let (live, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let body = |bytes: &Vec<u8>| -> ByteStream {
            let (live, peak) = (live.clone(), peak.clone());
            let frames: Vec<Vec<u8>> = bytes.chunks(FRAME).map(<[u8]>::to_vec).collect();
            Box::pin(futures_util::stream::iter(frames).then(move |frame| {
                let (live, peak) = (live.clone(), peak.clone());
                async move {
                    // Every put gets its next frame only after the others had their turn.
                    tokio::task::yield_now().await;
                    let now = live.fetch_add(frame.len(), Ordering::Relaxed) + frame.len();
                    peak.fetch_max(now, Ordering::Relaxed);
                    Ok::<_, io::Error>(Bytes::from_owner(Counted { frame, live }))
                }
            }))
        };
        let names: Vec<BlobName> = (0..transfers).map(|_| BlobName::random()).collect();
        let stored = futures_util::future::join_all(
            names
                .iter()
                .zip(&data)
                .map(|(name, bytes)| store.put(name, body(bytes), Some(bytes.len() as u64))),
        )
        .await;
        // A put holds at most the one frame it is copying (or waiting for a block to copy into).
        let bound = transfers * FRAME;
        let frames_peak = peak.load(Ordering::Relaxed);
        assert!(
            frames_peak <= bound,
            "puts held {frames_peak} bytes of frames at once, more than {bound}"
        );
        assert_eq!(live.load(Ordering::Relaxed), 0, "every frame was let go");
        let memory = &store.memory;
        assert!(
            memory.peak() > 2 * WIDE_BLOCK && memory.peak() <= memory.budget(),
            "the puts ran at once within the budget: {} bytes held at most, budget {}",
            memory.peak(),
            memory.budget()
        );
        for (chunk, bytes) in stored.iter().zip(&data) {
            let chunk = chunk.as_ref().unwrap();
            assert_eq!(chunk.xxh3, Some(crate::blob::digests::xxh3_64(bytes)));
        }

        // Every read at once, each taking its next block only after the others had their turn.
        let reads = names.iter().zip(&data).map(|(name, bytes)| {
            let store = &store;
            async move {
                let mut stream = store.get(name, 0, bytes.len() as u64).await.unwrap();
                let mut read = Vec::new();
                while let Some(block) = stream.try_next().await.unwrap() {
                    read.extend_from_slice(&block);
                    tokio::task::yield_now().await;
                }
                read == *bytes
            }
        });
        let intact = futures_util::future::join_all(reads).await;
        assert!(intact.iter().all(|ok| *ok), "a chunk read back differs");
        assert_eq!(memory.overdrafts(), 0);
        assert!(
            memory.peak() <= memory.budget(),
            "{} bytes held at once, budget {}",
            memory.peak(),
            memory.budget()
        );
        assert!(
            memory.held() <= memory.budget() / 4,
            "once done, only the kept buffers are held: {}",
            memory.held()
        );
    }

    #[tokio::test]
    async fn the_local_disk_store_conforms() {
        let dir = tempfile::tempdir().unwrap();
        crate::blob::conformance::run_all(&FsStore::open(dir.path()).unwrap()).await;
    }

    #[tokio::test]
    async fn processes_sharing_a_root_keep_their_staging_apart() {
        let dir = tempfile::tempdir().unwrap();
        let first = FsStore::open(dir.path()).unwrap();
        let leftover = dir.path().join("tmp").join("crashed");
        fs::create_dir_all(&leftover).unwrap();
        fs::write(leftover.join("x.part"), b"partial").unwrap();
        fs::write(first.tmp.join("in-flight.part"), b"being written").unwrap();
        // A second process starts on the same root: it sweeps what no process holds.
        let second = FsStore::open(dir.path()).unwrap();
        assert!(
            !leftover.exists(),
            "staging of a process that is gone is swept"
        );
        assert!(
            first.tmp.join("in-flight.part").exists(),
            "a live process's staging is kept"
        );
        assert_ne!(first.tmp, second.tmp);
        let first_tmp = first.tmp.clone();
        drop(first);
        let _third = FsStore::open(dir.path()).unwrap();
        assert!(
            !first_tmp.exists(),
            "once its process is gone, its staging is swept"
        );
        assert!(second.tmp.exists());
    }

    /// The instant the store's record names.
    fn recorded(root: &Path) -> Millis {
        match read_record(&root.join("synced")) {
            Record::Written { synced_through, .. } => synced_through,
            other => panic!("no record: {other:?}"),
        }
    }

    /// Spins until the wall clock has passed `instant`: a record made after this is later.
    fn clock_past(instant: Millis) {
        while now_millis() <= instant {
            std::hint::spin_loop();
        }
    }

    #[tokio::test]
    async fn a_new_store_writes_its_version_and_record_before_its_first_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::open(dir.path()).unwrap();
        assert_eq!(store.lost_since(), None);
        assert_eq!(
            fs::read_to_string(dir.path().join("VERSION")).unwrap(),
            "1\n"
        );
        assert!(
            recorded(dir.path()) > 0,
            "the record is there from the start"
        );
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["VERSION", "chunks", "synced", "tmp"],
            "no staging file left"
        );
    }

    /// `hoard gc` and the server may rewrite the record at once. Through one shared temporary
    /// name, one could rename the file the other had just truncated: the record read as torn,
    /// and the next start forgot every entry.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_processes_rewriting_the_record_never_leave_it_torn() {
        let dir = tempfile::tempdir().unwrap();
        let server = FsStore::open(dir.path()).unwrap();
        let gc = FsStore::open(dir.path()).unwrap();
        let rewrite = |store: FsStore| {
            tokio::spawn(async move {
                for _ in 0..300 {
                    store.note_committed();
                    store.sync(false).await.unwrap();
                }
            })
        };
        let (a, b) = (rewrite(server), rewrite(gc));
        let root = dir.path().to_owned();
        let reader = tokio::task::spawn_blocking(move || {
            for _ in 0..3000 {
                let record = read_record(&root.join("synced"));
                assert!(matches!(record, Record::Written { .. }), "{record:?}");
            }
        });
        a.await.unwrap();
        b.await.unwrap();
        reader.await.unwrap();
        assert_eq!(FsStore::open(dir.path()).unwrap().lost_since(), None);
    }

    /// Defect 1 of the power-loss report: a crash in a new store's first seconds left `VERSION`
    /// empty, and every later start failed on it.
    #[tokio::test]
    async fn a_store_whose_first_writes_a_crash_cut_short_starts_and_trusts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("VERSION"), "").unwrap();
        fs::write(dir.path().join("synced"), "").unwrap();
        let store = FsStore::open(dir.path()).unwrap();
        assert_eq!(
            store.lost_since(),
            Some(0),
            "every entry may have lost bytes"
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("VERSION")).unwrap(),
            "1\n"
        );
        // Recovery records a fresh flush: the next start trusts the store again.
        store.sync(true).await.unwrap();
        assert_eq!(FsStore::open(dir.path()).unwrap().lost_since(), None);
    }

    /// Defect 2: an empty or torn record was taken for "no record yet", so entries whose chunks
    /// were lost stayed and were served.
    #[tokio::test]
    async fn an_empty_torn_or_missing_record_of_an_existing_store_means_all_may_be_lost() {
        for record in [Some(""), Some("\0\0\0\0"), Some("3f2a-boot"), None] {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join("VERSION"), "1\n").unwrap();
            if let Some(record) = record {
                fs::write(dir.path().join("synced"), record).unwrap();
            }
            assert_eq!(
                FsStore::open(dir.path()).unwrap().lost_since(),
                Some(0),
                "record {record:?}"
            );
        }
        // Chunks without a VERSION: a store an older version made, whose VERSION a crash lost.
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("chunks/3f")).unwrap();
        assert_eq!(FsStore::open(dir.path()).unwrap().lost_since(), Some(0));
    }

    fn body_of(frames: Vec<&'static [u8]>) -> ByteStream {
        Box::pin(futures_util::stream::iter(
            frames.into_iter().map(|f| Ok(Bytes::from_static(f))),
        ))
    }

    /// Defect 3: a put still writing when a flush began left nothing for the next tick to
    /// flush, and its entry stayed forgettable while the server was idle.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_put_that_ends_during_a_flush_is_flushed_by_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::open(dir.path()).unwrap());
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
        let body: ByteStream = Box::pin(futures_util::stream::unfold(
            (Some(started_tx), Some(finish_rx)),
            |(started, finish)| async move {
                if let Some(started) = started {
                    let _ = started.send(());
                    return Some((Ok(Bytes::from_static(b"first half ")), (None, finish)));
                }
                let _ = finish?.await;
                Some((Ok(Bytes::from_static(b"second half")), (None, None)))
            },
        ));
        let name = BlobName::random();
        let put = {
            let (store, name) = (store.clone(), name.clone());
            tokio::spawn(async move { store.put(&name, body, Some(22)).await })
        };
        started_rx.await.unwrap();
        store.sync(false).await.unwrap();
        let during = recorded(dir.path());
        finish_tx.send(()).unwrap();
        put.await.unwrap().unwrap();
        clock_past(during + 1);
        store.sync(false).await.unwrap();
        assert!(
            recorded(dir.path()) > during,
            "the put that ended after the flush began is covered by the next flush"
        );
    }

    /// Defect 3, the other half: an entry committed after the flush of its chunks, with nothing
    /// put since, must still be covered by a record within a tick.
    #[tokio::test]
    async fn an_entry_committed_after_its_chunks_were_flushed_is_covered_by_the_next_tick() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::open(dir.path()).unwrap();
        store
            .put(&BlobName::random(), body_of(vec![b"bytes"]), Some(5))
            .await
            .unwrap();
        store.sync(false).await.unwrap();
        let flushed = recorded(dir.path());
        clock_past(flushed + 1);
        let finalized_at = now_millis();
        store.note_committed();
        clock_past(finalized_at);
        store.sync(false).await.unwrap();
        let after = recorded(dir.path());
        assert!(
            after >= finalized_at,
            "record {after} does not cover the entry finalized at {finalized_at}"
        );
        // Then idle ticks leave the record alone (no write every interval): after at most one
        // more, which a commit in the record's own millisecond asks for.
        clock_past(after + 2);
        store.sync(false).await.unwrap();
        let settled = recorded(dir.path());
        clock_past(settled + 2);
        store.sync(false).await.unwrap();
        assert_eq!(recorded(dir.path()), settled);
    }

    #[tokio::test]
    async fn after_a_reboot_chunks_newer_than_the_last_sync_may_be_lost() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("VERSION"), "1\n").unwrap();
        fs::write(dir.path().join("synced"), "some-other-boot 12345\n").unwrap();
        assert_eq!(FsStore::open(dir.path()).unwrap().lost_since(), Some(12345));
    }
}
