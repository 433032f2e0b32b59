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
//! (`syncfs`) every `--sync-interval` and at shutdown, and records the instant it started together with the kernel's
//! boot id. After a reboot, chunks put after the recorded instant may be lost, and
//! [`BlobStore::lost_since`] says so: the domain then forgets the entries finalized after it.
//!
//! File I/O runs in blocking tasks of one block each, one in flight per transfer while the next
//! block crosses the network: disk and network overlap, memory stays bounded whatever the chunk
//! size, and no thread is held while a slow client sends or reads. Each blocking task costs a
//! thread wake-up and a switch both ways, which on a virtual machine cost as much as copying
//! tens of KiB: the first [`WIDE_TRANSFERS`] large puts, and as many large reads, at a time
//! move [`WIDE_BLOCK`] per task instead of [`IO_BLOCK`], so that the memory they hold stays
//! bounded too.

use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{BlobError, BlobStore, ByteStream, Capacity, Digests, Listed, NameStream};
use crate::model::{now_millis, BlobName, Chunk, Millis};

const LAYOUT_VERSION: &str = "1";
/// Size of each disk read when streaming a chunk out, and of each batch of frames written, for
/// a transfer without a wide permit.
const IO_BLOCK: usize = 256 << 10;
/// What a transfer holding a wide permit writes or reads per blocking task. Measured on 2 cores
/// (8 uploads of 128 MiB at once): a fifth less CPU per GiB than batches of [`IO_BLOCK`], as
/// little as the disk floor's 4 MiB batches.
const WIDE_BLOCK: usize = 1 << 20;
/// Large puts, and large reads, moving [`WIDE_BLOCK`] at a time at once (each kind); the others
/// use [`IO_BLOCK`]. Each holds up to two blocks (one on the disk's side, one on the network's):
/// 16 MiB of each kind in all at most.
const WIDE_TRANSFERS: usize = 8;
/// Chunks up to this size are received whole and written, or read, in one blocking call:
/// one thread hop instead of a pipeline.
const SMALL: u64 = 1 << 20;
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
    /// Set by every put, cleared by a sync.
    unsynced: Arc<AtomicBool>,
    /// Permits to write, and to read, [`WIDE_BLOCK`] at a time.
    wide_writers: Arc<Semaphore>,
    wide_readers: Arc<Semaphore>,
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

/// The durability record: "every chunk put before `synced_through` was on disk, as of boot
/// `boot_id`". One line: `<boot id> <millis>`.
fn read_record(path: &Path) -> Option<(String, Millis)> {
    let text = fs::read_to_string(path).ok()?;
    let (boot, millis) = text.trim().split_once(' ')?;
    Some((boot.to_owned(), millis.parse().ok()?))
}

/// Replaces the durability record, durably.
fn write_record(root: &Path, synced_through: Millis) -> io::Result<()> {
    let staging = root.join("synced.tmp");
    let mut file = File::create(&staging)?;
    writeln!(file, "{} {synced_through}", boot_id())?;
    file.sync_all()?;
    fs::rename(&staging, root.join("synced"))?;
    File::open(root)?.sync_all()
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
        let version_file = root.join("VERSION");
        match fs::read_to_string(&version_file) {
            Ok(v) if v.trim() == LAYOUT_VERSION => {}
            Ok(v) => {
                return Err(BlobError::Io {
                    what: version_file.display().to_string(),
                    source: io::Error::other(format!(
                        "data layout version {} is not supported (expected {LAYOUT_VERSION})",
                        v.trim()
                    )),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::write(&version_file, format!("{LAYOUT_VERSION}\n"))
                    .map_err(io_err(version_file.display().to_string()))?;
            }
            Err(e) => return Err(io_err(version_file.display().to_string())(e)),
        }
        sweep_staging(&tmp).map_err(io_err(tmp.display().to_string()))?;
        let (tmp, staging_lock) =
            own_staging_dir(&tmp).map_err(io_err(tmp.display().to_string()))?;
        let record = root.join("synced");
        let lost_since = match read_record(&record) {
            // Same boot: the page cache survived whatever stopped the last run, nothing is lost.
            Some((boot, _)) if boot != UNKNOWN_BOOT && boot == boot_id() => None,
            Some((_, synced_through)) => Some(synced_through),
            // No record yet: start one. Chunks from before it (a store written by an older
            // version) are flushed first, so the record tells the truth.
            None => {
                let has_chunks = fs::read_dir(&chunks)
                    .map(|mut d| d.next().is_some())
                    .unwrap_or(false);
                let started = now_millis();
                if has_chunks {
                    let dir = File::open(root).map_err(io_err(root.display().to_string()))?;
                    rustix::fs::syncfs(&dir).map_err(|e| io_err("sync")(e.into()))?;
                }
                write_record(root, started).map_err(io_err(record.display().to_string()))?;
                None
            }
        };
        Ok(Self {
            root: root.to_owned(),
            chunks,
            tmp,
            _staging_lock: Arc::new(staging_lock),
            unsynced: Arc::new(AtomicBool::new(lost_since.is_some())),
            wide_writers: Arc::new(Semaphore::new(WIDE_TRANSFERS)),
            wide_readers: Arc::new(Semaphore::new(WIDE_TRANSFERS)),
            lost_since,
        })
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

/// One blocking step of a put: opens the staging file if that has not happened yet (a small
/// chunk's, hashed with both digests), then hashes and writes a batch of frames.
fn write_batch(sink: Option<Sink>, staging: &Path, frames: &[Bytes]) -> io::Result<Sink> {
    let (mut file, mut digests) = match sink {
        Some(sink) => sink,
        None => create_staging(staging, Digests::with_sha256())?,
    };
    for frame in frames {
        digests.update(frame);
    }
    write_all_vectored(&mut file, frames)?;
    Ok((file, digests))
}

/// Writes every byte of `bufs` with as few system calls as the kernel allows.
fn write_all_vectored(out: &mut File, bufs: &[Bytes]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
    let mut slices = &mut slices[..];
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match out.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
        self.unsynced.store(true, Ordering::Release);
        let fail = || io_err(format!("chunk {name}"));
        let final_path = self.path_of(name);
        // A small chunk is received whole, then created under its own name, written and hashed
        // in one blocking call: no staging file and no rename (a rename across directories takes
        // the file system's rename lock, which every small save would queue on). Nothing reads a
        // chunk before its metadata exists, which is recorded only after this put returns; if the
        // process dies during the write, the file is an unreferenced young chunk, which garbage
        // collection removes after the deletion grace. A large one is staged under `tmp/` and
        // written batch by batch by blocking tasks, one in flight while the next batch crosses
        // the network: no thread ever waits on a slow client. Its file is created up front, so
        // that no task can create it after an early return.
        //
        // A small chunk's SHA-256 costs less than its request and is computed here; a large
        // one's (a third of the CPU an upload costs) is left to the digest pass, which reads
        // the chunk back from the page cache in the idle scheduling class (`cache::digest_pass`).
        let small = declared_len.is_some_and(|d| d <= SMALL);
        let mut staging = Staging {
            path: if small {
                final_path.clone()
            } else {
                self.tmp.join(format!("{}.part", BlobName::random()))
            },
            published: false,
        };
        // Held until the put returns; a small chunk is written in one batch.
        let block = (!small).then(|| Block::for_large_transfer(&self.wide_writers));
        let flush_at = block.as_ref().map_or(usize::MAX, |b| b.size);
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
        let mut received: u64 = 0;
        let mut batch: Vec<Bytes> = Vec::new();
        let mut batch_len = 0usize;
        while let Some(frame) = body.next().await {
            let bytes = frame.map_err(BlobError::Body)?;
            received += bytes.len() as u64;
            if let Some(declared) = declared_len.filter(|d| received > *d) {
                return Err(BlobError::LengthMismatch {
                    declared,
                    actual: received,
                });
            }
            batch_len += bytes.len();
            batch.push(bytes);
            if batch_len >= flush_at {
                let sink = disk.ready().await.map_err(fail())?;
                let (frames, path) = (std::mem::take(&mut batch), staging.path.clone());
                batch_len = 0;
                disk = Disk::Busy(tokio::task::spawn_blocking(move || {
                    write_batch(sink, &path, &frames)
                }));
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
        let (sha256, xxh3) =
            tokio::task::spawn_blocking(move || -> io::Result<(Option<[u8; 32]>, u64)> {
                let (file, digests) = write_batch(sink, &path, &batch)?;
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
        Ok(Chunk {
            blob: name.clone(),
            size: received,
            sha256,
            xxh3: Some(xxh3),
        })
    }

    async fn get(&self, name: &BlobName, offset: u64, len: u64) -> Result<ByteStream, BlobError> {
        // A small read is one block; a large one goes block by block, each read by a blocking
        // task started while the previous block is sent: no thread waits on a slow reader. The
        // stream holds the `Block` (and its wide permit, if any) until it ends or is dropped.
        let block = (len > SMALL).then(|| Block::for_large_transfer(&self.wide_readers));
        let step = block.as_ref().map_or(len, |b| b.size as u64);
        // The first block is read before returning, so a missing chunk is an error here.
        let path = self.path_of(name);
        let first =
            tokio::task::spawn_blocking(move || -> io::Result<(File, io::Result<Bytes>)> {
                let mut file = File::open(&path)?;
                file.seek(SeekFrom::Start(offset))?;
                Ok(read_block(file, step))
            })
            .await
            .map_err(|e| io_err(format!("chunk {name}"))(io::Error::other(e)))?
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => BlobError::NotFound(name.clone()),
                _ => io_err(format!("chunk {name}"))(e),
            })?;

        type Read = tokio::task::JoinHandle<(File, io::Result<Bytes>)>;
        enum Next {
            Ready((File, io::Result<Bytes>)),
            Reading(Read),
        }
        let state = (Some(Next::Ready(first)), len, block);
        Ok(Box::pin(futures_util::stream::unfold(
            state,
            move |(next, left, block)| async move {
                let (file, read) = match next? {
                    Next::Ready(done) => done,
                    Next::Reading(task) => match task.await {
                        Ok(done) => done,
                        Err(e) => return Some((Err(io::Error::other(e)), (None, 0, None))),
                    },
                };
                let bytes = match read {
                    Ok(bytes) => bytes,
                    Err(e) => return Some((Err(e), (None, 0, None))),
                };
                let left = left - bytes.len() as u64;
                let next = (left > 0).then(|| {
                    let want = left.min(step);
                    Next::Reading(tokio::task::spawn_blocking(move || read_block(file, want)))
                });
                Some((Ok(bytes), (next, left, block)))
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

    async fn sync(&self, force: bool) -> Result<(), BlobError> {
        if !self.unsynced.swap(false, Ordering::AcqRel) && !force {
            return Ok(());
        }
        let root = self.root.clone();
        let unsynced = self.unsynced.clone();
        let result = tokio::task::spawn_blocking(move || -> io::Result<()> {
            // Every put finished before this instant is covered by the syncfs below.
            let started = now_millis();
            rustix::fs::syncfs(&File::open(&root)?)?;
            write_record(&root, started)
        })
        .await
        .map_err(|e| io_err("sync")(io::Error::other(e)))?;
        if result.is_err() {
            unsynced.store(true, Ordering::Release);
        }
        result.map_err(io_err(format!("sync of {}", self.root.display())))
    }
}

/// What a large transfer moves per blocking task: [`WIDE_BLOCK`] while it holds one of the
/// wide permits (taken if one is free, given back when this is dropped), else [`IO_BLOCK`].
struct Block {
    size: usize,
    _wide: Option<OwnedSemaphorePermit>,
}

impl Block {
    fn for_large_transfer(wide_permits: &Arc<Semaphore>) -> Self {
        let wide = wide_permits.clone().try_acquire_owned().ok();
        let size = if wide.is_some() { WIDE_BLOCK } else { IO_BLOCK };
        Self { size, _wide: wide }
    }
}

/// Reads exactly `want` bytes at the file's position (a shorter chunk is an error).
fn read_block(file: File, want: u64) -> (File, io::Result<Bytes>) {
    // read_to_end fills spare capacity without zeroing it first.
    let mut buf = Vec::with_capacity(want as usize);
    let mut limited = file.take(want);
    let result = match limited.read_to_end(&mut buf) {
        Ok(n) if n as u64 == want => Ok(Bytes::from(buf)),
        Ok(n) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("chunk ended {} bytes early", want - n as u64),
        )),
        Err(e) => Err(e),
    };
    (limited.into_inner(), result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sync_records_the_boot_so_a_restart_without_reboot_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::open(dir.path()).unwrap();
        assert_eq!(store.lost_since(), None, "a new store has nothing to lose");
        store.sync(true).await.unwrap();
        let (boot, at) = read_record(&dir.path().join("synced")).unwrap();
        assert_eq!(boot, boot_id());
        assert!(at > 0);
        assert_eq!(FsStore::open(dir.path()).unwrap().lost_since(), None);
    }

    /// More large puts, then reads, at once than there are wide permits: every chunk is stored
    /// and read back whole, with or without a permit, and every permit is given back.
    #[tokio::test]
    async fn large_transfers_beyond_the_wide_permits_keep_their_bytes_and_give_the_permits_back() {
        use futures_util::TryStreamExt;
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::open(dir.path()).unwrap();
        let puts = WIDE_TRANSFERS + 4;
        let (started, mut all_started) = tokio::sync::mpsc::unbounded_channel::<()>();
        let go = Arc::new(tokio::sync::Notify::new());
        let data: Vec<Vec<u8>> = (0..puts)
            .map(|i| (0..3 * WIDE_BLOCK + i).map(|b| (b * 7 + i) as u8).collect())
            .collect();
        // Each body sends its first frame, then waits until every put has begun.
        let body = |bytes: &Vec<u8>| -> ByteStream {
            let frames: Vec<Bytes> = bytes.chunks(64 << 10).map(Bytes::copy_from_slice).collect();
            let (started, go) = (started.clone(), go.clone());
            Box::pin(
                futures_util::stream::iter(frames)
                    .enumerate()
                    .then(move |(n, frame)| {
                        let (started, go) = (started.clone(), go.clone());
                        async move {
                            if n == 1 {
                                let go = go.notified();
                                let _ = started.send(());
                                go.await;
                            }
                            Ok::<_, io::Error>(frame)
                        }
                    }),
            )
        };
        let names: Vec<BlobName> = (0..puts).map(|_| BlobName::random()).collect();
        let stored = futures_util::future::join_all(
            names
                .iter()
                .zip(&data)
                .map(|(name, bytes)| store.put(name, body(bytes), Some(bytes.len() as u64))),
        );
        let release = async {
            for _ in 0..puts {
                all_started.recv().await.unwrap();
            }
            assert_eq!(
                store.wide_writers.available_permits(),
                0,
                "the first puts hold every wide permit"
            );
            go.notify_waiters();
        };
        let (stored, ()) = tokio::join!(stored, release);
        let mut streams = Vec::new();
        for ((chunk, name), bytes) in stored.into_iter().zip(&names).zip(&data) {
            let chunk = chunk.unwrap();
            assert_eq!(chunk.size, bytes.len() as u64);
            assert_eq!(chunk.xxh3, Some(crate::blob::digests::xxh3_64(bytes)));
            streams.push(store.get(name, 0, chunk.size).await.unwrap());
        }
        assert_eq!(store.wide_writers.available_permits(), WIDE_TRANSFERS);
        assert_eq!(
            store.wide_readers.available_permits(),
            0,
            "the first reads hold every wide permit"
        );
        for ((stream, name), bytes) in streams.into_iter().zip(&names).zip(&data) {
            let read: Vec<Bytes> = stream.try_collect().await.unwrap();
            assert!(
                read.concat() == *bytes,
                "chunk {name} read back differs from its body"
            );
        }
        assert_eq!(store.wide_readers.available_permits(), WIDE_TRANSFERS);
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

    #[tokio::test]
    async fn after_a_reboot_chunks_newer_than_the_last_sync_may_be_lost() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("synced"), "some-other-boot 12345\n").unwrap();
        assert_eq!(FsStore::open(dir.path()).unwrap().lost_since(), Some(12345));
    }
}
