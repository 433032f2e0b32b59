//! Local-disk chunk store.
//!
//! Layout under the root: `chunks/<first two hex chars>/<name>` for published chunks, `tmp/` for
//! chunks being written, and a `VERSION` file naming the layout. A chunk is written to `tmp/`,
//! hashed while it is written, fsynced, then renamed into place: a crash leaves only staging
//! files, which are swept at the next start.
//!
//! File I/O runs on blocking threads fed through small bounded channels, so network reads,
//! hashing and disk writes overlap and memory stays bounded whatever the chunk size.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use super::{BlobError, BlobStore, ByteStream};
use crate::cache::model::{BlobName, Chunk};

const LAYOUT_VERSION: &str = "1";
/// Size of each disk read when streaming a chunk out, and of the write buffer.
const IO_BLOCK: usize = 1 << 20;
/// Frames or read blocks that may wait between the network and the disk thread.
const PIPE_DEPTH: usize = 8;

#[derive(Debug, Clone)]
pub struct FsStore {
    chunks: PathBuf,
    tmp: PathBuf,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> BlobError {
    let what = what.into();
    move |source| BlobError::Io { what, source }
}

impl FsStore {
    /// Opens the store at `root`, creating its layout, and removes staging files left by a
    /// crash.
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
        for stale in fs::read_dir(&tmp).map_err(io_err(tmp.display().to_string()))? {
            let stale = stale.map_err(io_err(tmp.display().to_string()))?;
            let _ = fs::remove_file(stale.path());
        }
        Ok(Self { chunks, tmp })
    }

    fn path_of(&self, name: &BlobName) -> PathBuf {
        let name = name.as_str();
        self.chunks.join(&name[..2]).join(name)
    }
}

/// What the network side tells the disk thread.
enum WriteMsg {
    Data(Bytes),
    /// The body is complete: flush, fsync, publish, and report the digest.
    Finish(oneshot::Sender<io::Result<[u8; 32]>>),
}

/// Receives a chunk's bytes on a blocking thread: writes, hashes, and publishes on `Finish`.
/// If the sender goes away first (error or dropped request) the staging file is removed.
fn write_chunk(tmp_path: PathBuf, final_path: PathBuf, mut rx: mpsc::Receiver<WriteMsg>) {
    let staged = (|| -> io::Result<Option<(oneshot::Sender<_>, [u8; 32])>> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp_path)?;
        let mut out = BufWriter::with_capacity(IO_BLOCK, file);
        let mut hasher = Sha256::new();
        while let Some(msg) = rx.blocking_recv() {
            match msg {
                WriteMsg::Data(bytes) => {
                    hasher.update(&bytes);
                    out.write_all(&bytes)?;
                }
                WriteMsg::Finish(reply) => {
                    let file = out.into_inner().map_err(|e| e.into_error())?;
                    file.sync_data()?;
                    return Ok(Some((reply, hasher.finalize().into())));
                }
            }
        }
        Ok(None)
    })();
    match staged {
        Ok(Some((reply, digest))) => {
            let published = publish(&tmp_path, &final_path);
            if published.is_err() {
                let _ = fs::remove_file(&tmp_path);
            }
            let _ = reply.send(published.map(|()| digest));
        }
        Ok(None) => {
            let _ = fs::remove_file(&tmp_path);
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp_path);
            // Report the failure to a waiting Finish, if the sender is still there.
            while let Some(msg) = rx.blocking_recv() {
                if let WriteMsg::Finish(reply) = msg {
                    let _ = reply.send(Err(e));
                    break;
                }
            }
        }
    }
}

/// Renames a fully written staging file into place and makes the rename durable.
fn publish(tmp_path: &Path, final_path: &Path) -> io::Result<()> {
    let dir = final_path
        .parent()
        .expect("chunk paths have a parent directory");
    fs::create_dir_all(dir)?;
    fs::rename(tmp_path, final_path)?;
    File::open(dir)?.sync_all()
}

#[async_trait]
impl BlobStore for FsStore {
    async fn put(
        &self,
        name: &BlobName,
        mut body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<Chunk, BlobError> {
        let tmp_path = self.tmp.join(format!("{}.part", BlobName::random()));
        let final_path = self.path_of(name);
        let (tx, rx) = mpsc::channel(PIPE_DEPTH);
        let writer = tokio::task::spawn_blocking(move || write_chunk(tmp_path, final_path, rx));

        let mut received: u64 = 0;
        while let Some(frame) = body.next().await {
            let bytes = frame.map_err(BlobError::Body)?;
            received += bytes.len() as u64;
            if declared_len.is_some_and(|d| received > d) {
                return Err(BlobError::LengthMismatch {
                    declared: declared_len.unwrap_or(0),
                    actual: received,
                });
            }
            if tx.send(WriteMsg::Data(bytes)).await.is_err() {
                break; // The writer failed; Finish below collects its error.
            }
        }
        if let Some(declared) = declared_len.filter(|d| *d != received) {
            return Err(BlobError::LengthMismatch {
                declared,
                actual: received,
            });
        }
        let (reply_tx, reply_rx) = oneshot::channel();
        let finished = tx.send(WriteMsg::Finish(reply_tx)).await;
        drop(tx);
        let result = match finished {
            Ok(()) => reply_rx
                .await
                .unwrap_or_else(|_| Err(io::Error::other("chunk writer stopped"))),
            Err(_) => Err(io::Error::other("chunk writer stopped")),
        };
        let _ = writer.await;
        let sha256 = result.map_err(io_err(format!("chunk {name}")))?;
        Ok(Chunk {
            blob: name.clone(),
            size: received,
            sha256,
        })
    }

    async fn get(&self, name: &BlobName, offset: u64, len: u64) -> Result<ByteStream, BlobError> {
        let path = self.path_of(name);
        let owned = name.clone();
        let file = tokio::task::spawn_blocking(move || -> io::Result<File> {
            let mut file = File::open(&path)?;
            file.seek(SeekFrom::Start(offset))?;
            Ok(file)
        })
        .await
        .map_err(|e| io_err(format!("chunk {name}"))(io::Error::other(e)))?
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => BlobError::NotFound(owned),
            _ => io_err(format!("chunk {name}"))(e),
        })?;

        let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(PIPE_DEPTH / 2);
        tokio::task::spawn_blocking(move || read_chunk(file, len, tx));
        Ok(Box::pin(futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|item| (item, rx)) },
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
}

/// Streams `len` bytes from `file` in large reads until done or the receiver hangs up.
fn read_chunk(mut file: File, mut len: u64, tx: mpsc::Sender<io::Result<Bytes>>) {
    while len > 0 {
        let want = len.min(IO_BLOCK as u64) as usize;
        let mut buf = BytesMut::zeroed(want);
        let item = match file.read_exact(&mut buf) {
            Ok(()) => {
                len -= want as u64;
                Ok(buf.freeze())
            }
            Err(e) => {
                len = 0;
                Err(e)
            }
        };
        if tx.blocking_send(item).is_err() {
            return;
        }
    }
}
