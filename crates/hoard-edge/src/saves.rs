//! Copies kept from saves. A single-shot upload (Put Blob: what `@actions/cache` sends for an
//! archive of up to 128 MiB) through the edge is written to a copy as it streams to the
//! origin. The reservation that handed out its link and the finalize that made it an entry say
//! which entry it became (the same caller, key and version), and the first download of that
//! entry takes the copy, so that a restore after a save through the same edge reads nothing
//! from the origin. Uploads in blocks stream through without a copy.
//!
//! The copy is taken only for the entry id the origin's finalize named, of the size the origin
//! confirms for the download, created (as the origin says) within [`ADOPT_WITHIN`] of that
//! finalize: an id is never reused by one database, and a copy cannot outlive a reset of it by
//! being kept in memory only.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::store::{BlockSums, Reservation, Store};

/// How long a kept upload waits for its finalize, and a finalized one for its first download.
const KEPT_FOR: Duration = Duration::from_secs(3600);
/// How far the entry's creation (the origin's `Last-Modified`) may be from its finalize.
const ADOPT_WITHIN: Duration = Duration::from_secs(600);
/// The most uploads tracked at each stage; past it, new ones are not kept.
const MOST: usize = 4096;

/// Who saves: the caller's credentials, hashed, so that one job's finalize never names
/// another's upload.
pub fn caller_of(authorization: Option<&[u8]>) -> u64 {
    twox_hash::XxHash3_64::oneshot(authorization.unwrap_or_default())
}

/// A copy written from an upload, and the room it holds.
struct Kept {
    path: PathBuf,
    size: u64,
    reservation: Reservation,
    at: SystemTime,
}

/// (caller, key, version).
type Saving = (u64, String, String);

#[derive(Default)]
struct Stages {
    /// The upload link each reservation handed out.
    reserved: HashMap<Saving, (String, SystemTime)>,
    /// Whole uploads by their link, awaiting their finalize.
    uploaded: HashMap<String, Kept>,
    /// Finalized uploads by entry id, awaiting the first download.
    finalized: HashMap<i64, Kept>,
}

impl Stages {
    /// Forgets what waited too long (its copy's file removed).
    fn expire(&mut self, now: SystemTime) {
        let old = |at: SystemTime| now.duration_since(at).unwrap_or_default() > KEPT_FOR;
        self.reserved.retain(|_, (_, at)| !old(*at));
        for kept in self
            .uploaded
            .extract_if(|_, k| old(k.at))
            .map(|(_, k)| k)
            .chain(self.finalized.extract_if(|_, k| old(k.at)).map(|(_, k)| k))
        {
            let _ = std::fs::remove_file(&kept.path);
        }
    }
}

/// The saves the edge keeps copies of.
#[derive(Default)]
pub struct Saves {
    stages: Mutex<Stages>,
}

impl Saves {
    fn stages(&self) -> std::sync::MutexGuard<'_, Stages> {
        // Nothing panics while holding it.
        self.stages.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reservation of `key` and `version` by `caller` handed out the upload link `upload`.
    pub fn reserved(&self, caller: u64, key: &str, version: &str, upload: &str) {
        let now = SystemTime::now();
        let mut stages = self.stages();
        stages.expire(now);
        if stages.reserved.len() < MOST {
            let saving = (caller, key.to_owned(), version.to_owned());
            stages.reserved.insert(saving, (upload.to_owned(), now));
        }
    }

    /// Whether an upload to `upload` is worth keeping: its reservation went through the edge.
    pub fn wanted(&self, upload: &str) -> bool {
        let stages = self.stages();
        stages.uploaded.len() < MOST && stages.reserved.values().any(|(u, _)| u == upload)
    }

    /// The upload to `upload` is whole in the copy at `path`.
    fn uploaded(&self, upload: &str, kept: Kept) {
        let replaced = self.stages().uploaded.insert(upload.to_owned(), kept);
        if let Some(old) = replaced {
            let _ = std::fs::remove_file(old.path);
        }
    }

    /// The finalize of `key` and `version` by `caller` made entry `id`.
    pub fn finalized(&self, caller: u64, key: &str, version: &str, id: i64) {
        let mut stages = self.stages();
        let saving = (caller, key.to_owned(), version.to_owned());
        let Some((upload, _)) = stages.reserved.remove(&saving) else {
            return;
        };
        if let Some(mut kept) = stages.uploaded.remove(&upload) {
            kept.at = SystemTime::now();
            if let Some(old) = stages.finalized.insert(id, kept) {
                let _ = std::fs::remove_file(old.path);
            }
        }
    }

    /// Makes the copy kept for entry `id` the copy `key`, if it is of `size` bytes and the
    /// entry was created (`created`, as the origin says) close to its finalize (blocking).
    pub fn adopt(&self, store: &Store, id: i64, key: &str, size: u64, created: SystemTime) -> bool {
        let Some(kept) = self.stages().finalized.remove(&id) else {
            return false;
        };
        let near = |a: SystemTime, b: SystemTime| {
            a.duration_since(b)
                .or_else(|_| b.duration_since(a))
                .is_ok_and(|d| d <= ADOPT_WITHIN)
        };
        if kept.size != size || !near(kept.at, created) {
            let _ = std::fs::remove_file(&kept.path);
            return false;
        }
        match store.publish(kept.reservation, &kept.path, key) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(copy = key, error = %e, "cannot keep the copy of a save");
                let _ = std::fs::remove_file(&kept.path);
                false
            }
        }
    }
}

/// Writes what passes through to a copy, checks and all: the receiving end of an upload's tee.
pub struct Writer {
    file: Arc<File>,
    path: PathBuf,
    size: u64,
    reservation: Reservation,
    written: u64,
    sums: BlockSums,
}

impl Writer {
    /// A copy of an upload of `size` bytes, if there is room for it.
    pub fn start(store: &Arc<Store>, upload: &str, size: u64) -> Option<Self> {
        let reservation = store.reserve(size)?;
        let (path, file) = store.create_tmp(&format!("upload-{upload}")).ok()?;
        Some(Self {
            file: Arc::new(file),
            path,
            size,
            reservation,
            written: 0,
            sums: BlockSums::default(),
        })
    }

    fn write(&mut self, piece: &[u8]) -> io::Result<()> {
        if self.written + piece.len() as u64 > self.size {
            return Err(io::Error::other("the upload is longer than it said"));
        }
        self.file.write_all_at(piece, self.written)?;
        self.sums.update(piece);
        self.written += piece.len() as u64;
        Ok(())
    }

    /// Writes what arrives on `pieces` (blocking); the copy once whole, nothing otherwise.
    pub fn run(mut self, mut pieces: tokio::sync::mpsc::Receiver<Bytes>) -> Option<Finished> {
        while let Some(piece) = pieces.blocking_recv() {
            if let Err(e) = self.write(&piece) {
                tracing::debug!(error = %e, "an upload's copy was dropped");
                let _ = std::fs::remove_file(&self.path);
                return None;
            }
        }
        let whole = self.written == self.size
            && self
                .file
                .write_all_at(&self.sums.finish(self.size), self.size)
                .is_ok();
        if !whole {
            let _ = std::fs::remove_file(&self.path);
            return None;
        }
        Some(Finished(Kept {
            path: self.path,
            size: self.size,
            reservation: self.reservation,
            at: SystemTime::now(),
        }))
    }
}

/// A whole copy of an upload, to be kept once the origin took the upload.
pub struct Finished(Kept);

impl Finished {
    /// The origin took the upload to `upload`.
    pub fn keep(self, saves: &Saves, upload: &str) {
        saves.uploaded(upload, self.0);
    }

    /// The origin refused it.
    pub fn drop_copy(self) {
        let _ = std::fs::remove_file(&self.0.path);
    }
}

/// `body` with each piece also sent to `copy` (a [`Writer`] on a blocking thread) before it
/// goes on: the upload goes at the pace of the slower of the origin and this disk. The writer
/// learns the end as its channel closes; after a failure of the body, or of the writer, the
/// copy is not fed any more (and is dropped).
pub fn teed<S>(
    body: S,
    copy: tokio::sync::mpsc::Sender<Bytes>,
) -> impl futures_util::Stream<Item = S::Item> + Send + 'static
where
    S: futures_util::Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
{
    use futures_util::StreamExt as _;
    futures_util::stream::unfold(
        (Box::pin(body), Some(copy)),
        |(mut body, copy)| async move {
            let item = body.next().await?;
            let copy = match (&item, copy) {
                (Ok(bytes), Some(tx)) => tx.send(bytes.clone()).await.ok().map(|()| tx),
                _ => None,
            };
            Some((item, (body, copy)))
        },
    )
}
