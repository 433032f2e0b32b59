//! Copies being fetched from the origin: one fetch per entry however many clients ask for it at
//! once. The fetch runs in a task of its own, writing the copy's file as the bytes arrive; every
//! client that wants the entry meanwhile (the first one too) reads that file as it grows, so a
//! client that goes away stops nothing, and the others are served at the origin's pace.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use hoard_server::blob::transfer_memory::{Block, TransferMemory};
use hoard_server::model::ByteStream;
use tokio::sync::watch;

use crate::metrics::Counters;
use crate::origin::Origin;
use crate::store::{BlockSums, Store};

/// How far a fetch has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// This many bytes are in the file.
    Writing(u64),
    /// The copy is whole (and published).
    Done,
    /// The fetch stopped; the bytes written so far are still sound.
    Failed(u64),
}

/// What a request for an entry the edge had no copy of joins.
pub enum Joined {
    /// The fetch of it, started now or earlier.
    Fill(Arc<Fill>),
    /// Its copy, published since the request looked.
    Kept,
    /// Nothing: no copy can be written (the origin streams it).
    Unkept,
}

/// One entry being fetched.
pub struct Fill {
    file: Arc<File>,
    size: u64,
    progress: watch::Receiver<Progress>,
}

/// The fetches under way, by copy.
#[derive(Default)]
pub struct Fills {
    running: Mutex<HashMap<String, Arc<Fill>>>,
}

/// What a fetch needs.
pub struct Source {
    pub origin: Arc<Origin>,
    pub store: Arc<Store>,
    pub memory: Arc<TransferMemory>,
    pub counters: Arc<Counters>,
    /// How long the origin may take to start sending.
    pub start_within: Duration,
    /// Silence from the origin for this long ends the fetch.
    pub idle: Duration,
}

impl Fills {
    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Fill>>> {
        // Nothing panics while holding it.
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fetch of `key` (`size` bytes, at the download link `path_and_query`) under way, or
    /// a new one: one per entry, however many ask at once. `None` if the copy's file cannot be
    /// created. A fetch that cannot keep a copy (no room left, the origin refusing) stops at
    /// once, and those following it take the entry from the origin by range.
    pub fn join_or_start(
        self: &Arc<Self>,
        key: &str,
        size: u64,
        path_and_query: &str,
        source: Source,
    ) -> Joined {
        let mut running = self.running();
        if let Some(fill) = running.get(key) {
            return Joined::Fill(fill.clone());
        }
        // A fetch that ended since the caller looked for the copy published it before leaving
        // the map: no second fetch for it.
        if source.store.holds(key) {
            return Joined::Kept;
        }
        let (tmp, file) = match source.store.create_tmp(key) {
            Ok(created) => created,
            Err(e) => {
                tracing::warn!(copy = key, error = %e, "cannot create an edge copy; streaming from the origin");
                return Joined::Unkept;
            }
        };
        let file = Arc::new(file);
        let (tx, progress) = watch::channel(Progress::Writing(0));
        let fill = Arc::new(Fill {
            file: file.clone(),
            size,
            progress,
        });
        // In the map before anything is asked of the origin: a request meanwhile joins it.
        running.insert(key.to_owned(), fill.clone());
        drop(running);
        let fills = self.clone();
        let key = key.to_owned();
        let path_and_query = path_and_query.to_owned();
        tokio::spawn(async move {
            let published = fill_copy(&file, &tmp, &key, size, &path_and_query, &source, &tx).await;
            // Removed before the end is told, so a request that sees the end finds the copy.
            fills.running().remove(&key);
            match published {
                Ok(()) => {
                    let _ = tx.send(Progress::Done);
                }
                Err(e) => {
                    tracing::warn!(copy = %key, error = %e, "no copy of an entry was kept");
                    let _ = std::fs::remove_file(&tmp);
                    tx.send_modify(|p| {
                        if let Progress::Writing(n) = *p {
                            *p = Progress::Failed(n);
                        }
                    });
                }
            }
        });
        Joined::Fill(fill)
    }
}

/// Makes room for the copy, fetches the entry into `file` and publishes it.
async fn fill_copy(
    file: &Arc<File>,
    tmp: &std::path::Path,
    key: &str,
    size: u64,
    path_and_query: &str,
    source: &Source,
    tx: &watch::Sender<Progress>,
) -> io::Result<()> {
    // Making room removes files: off the async threads.
    let reservation = {
        let store = source.store.clone();
        tokio::task::spawn_blocking(move || store.reserve(size))
            .await
            .map_err(io::Error::other)?
            .ok_or_else(|| io::Error::other("no room for the copy: copies being written hold it"))?
    };
    let answer = source
        .origin
        .fetch(path_and_query, None, source.start_within)
        .await
        .map_err(io::Error::other)?;
    if answer.status() != reqwest::StatusCode::OK
        || answer.content_length().is_some_and(|n| n != size)
    {
        return Err(io::Error::other(format!(
            "the origin answered {} ({:?} bytes) to a fetch of an entry of {size} bytes it had just confirmed",
            answer.status(),
            answer.content_length()
        )));
    }
    let sums = fetch(file, size, answer, source, tx).await?;
    let (file, store, key, tmp) = (
        file.clone(),
        source.store.clone(),
        key.to_owned(),
        tmp.to_owned(),
    );
    tokio::task::spawn_blocking(move || {
        file.write_all_at(&sums, size)?;
        store.publish(reservation, &tmp, &key)
    })
    .await
    .map_err(io::Error::other)?
}

/// Writes the answer's bytes into `file` block by block, telling each block; the checks of
/// the copy once it is whole.
async fn fetch(
    file: &Arc<File>,
    size: u64,
    answer: reqwest::Response,
    source: &Source,
    tx: &watch::Sender<Progress>,
) -> io::Result<Vec<u8>> {
    let mut body = answer.bytes_stream();
    let mut copy = Copy {
        file,
        sums: BlockSums::default(),
        written: 0,
    };
    let mut received = 0u64;
    let mut block: Option<Block> = None;
    loop {
        let frame = match tokio::time::timeout(source.idle, body.next()).await {
            Ok(Some(frame)) => frame.map_err(io::Error::other)?,
            Ok(None) => break,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the origin sent nothing for too long",
                ))
            }
        };
        source
            .counters
            .bytes_from_origin
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        received += frame.len() as u64;
        if received > size {
            return Err(io::Error::other(format!(
                "the origin sent more than the entry's {size} bytes"
            )));
        }
        let mut frame = frame;
        while !frame.is_empty() {
            let mut current = match block.take() {
                Some(b) => b,
                None => {
                    source
                        .memory
                        .block(size.saturating_sub(copy.written).max(1))
                        .await
                }
            };
            current.fill(&mut frame);
            if current.is_full() {
                copy.append(current, source, tx).await?;
            } else {
                block = Some(current);
            }
        }
    }
    if let Some(last) = block.take() {
        copy.append(last, source, tx).await?;
    }
    if copy.written != size {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "the origin sent {} bytes of an entry of {size}",
                copy.written
            ),
        ));
    }
    Ok(copy.sums.finish(size))
}

/// A copy being written: how far, and the checks of what is written.
struct Copy<'a> {
    file: &'a Arc<File>,
    sums: BlockSums,
    written: u64,
}

impl Copy<'_> {
    /// Writes `block` at the end of the copy, keeps its buffer, and tells who follows.
    async fn append(
        &mut self,
        block: Block,
        source: &Source,
        tx: &watch::Sender<Progress>,
    ) -> io::Result<()> {
        let sums = std::mem::take(&mut self.sums);
        let (block, sums) = write(self.file.clone(), block, self.written, sums).await?;
        self.sums = sums;
        self.written += block.bytes().len() as u64;
        source.memory.keep(block);
        let _ = tx.send(Progress::Writing(self.written));
        Ok(())
    }
}

async fn write(
    file: Arc<File>,
    block: Block,
    at: u64,
    mut sums: BlockSums,
) -> io::Result<(Block, BlockSums)> {
    tokio::task::spawn_blocking(move || {
        file.write_all_at(block.bytes(), at)?;
        sums.update(block.bytes());
        Ok((block, sums))
    })
    .await
    .map_err(io::Error::other)?
}

impl Fill {
    /// Bytes `start..start + len` of the copy as the fetch writes them; an error if the fetch
    /// stops before it wrote them.
    pub fn follow(
        self: Arc<Self>,
        memory: Arc<TransferMemory>,
        start: u64,
        len: u64,
    ) -> ByteStream {
        let end = (start + len).min(self.size);
        let progress = self.progress.clone();
        Box::pin(futures_util::stream::unfold(
            (Some((self, progress)), start),
            move |(state, pos)| {
                let memory = memory.clone();
                async move {
                    let (fill, mut progress) = state?;
                    if pos >= end {
                        return None;
                    }
                    loop {
                        let written = match *progress.borrow_and_update() {
                            Progress::Writing(n) => n,
                            Progress::Done => fill.size,
                            Progress::Failed(n) if pos < n => n,
                            Progress::Failed(_) => {
                                let e = io::Error::other("the fetch from the origin stopped");
                                return Some((Err(e), (None, pos)));
                            }
                        };
                        if pos < written {
                            let upto = written.min(end);
                            let block = memory.block(upto - pos).await;
                            let file = fill.file.clone();
                            let read = tokio::task::spawn_blocking(move || {
                                read_at(&file, block, pos, upto)
                            })
                            .await
                            .map_err(io::Error::other)
                            .and_then(|r| r);
                            return match read {
                                Ok(block) => {
                                    let bytes = memory.filled(block);
                                    let next = pos + bytes.len() as u64;
                                    Some((Ok(bytes), (Some((fill, progress)), next)))
                                }
                                Err(e) => Some((Err(e), (None, pos))),
                            };
                        }
                        if progress.changed().await.is_err() {
                            // The fetch's task is gone without a word: treated as stopped.
                            let e = io::Error::other("the fetch from the origin stopped");
                            return Some((Err(e), (None, pos)));
                        }
                    }
                }
            },
        ))
    }
}

/// Reads `pos..upto` of `file`, as much as `block` holds.
fn read_at(file: &File, mut block: Block, pos: u64, upto: u64) -> io::Result<Block> {
    let want = (upto - pos).min(block.capacity() as u64);
    let mut reader = PositionedReader { file, at: pos };
    let n = block.read_to_end(&mut io::Read::take(&mut reader, want))? as u64;
    if n != want {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the copy being written is shorter than told",
        ));
    }
    Ok(block)
}

/// A reader at a position of a file shared with a writer (no shared cursor).
struct PositionedReader<'a> {
    file: &'a File,
    at: u64,
}

impl io::Read for PositionedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}
