//! The edge's copies of entries on its own disk: a file per entry, named by what never changes
//! for an entry (its id and its row's creation time, as the origin's download link names
//! them), all of them bounded by `--max-bytes`, the least recently used removed first.
//!
//! A copy is the entry's bytes, then an XXH3 of each [`BLOCK`], then a trailer (the size and a
//! magic number). Every block is checked before any byte of it is served, so a copy damaged on
//! disk (a bad sector, a write torn by a power cut) is never served: the reader stops before
//! the damaged block and the copy is dropped. Nothing is synced: a copy that a crash damaged
//! fails its checks like any other. Copies are written under `tmp/` and renamed into `copies/`
//! once whole; what `tmp/` holds at start was left by a process that stopped, and is removed.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hoard_server::blob::transfer_memory::{Block, TransferMemory};
use hoard_server::model::ByteStream;

/// The unit of the checks: the narrow transfer block, so that every block read (wide or narrow)
/// covers whole checked blocks.
pub const BLOCK: u64 = hoard_server::blob::transfer_memory::NARROW_BLOCK as u64;
const MAGIC: &[u8; 8] = b"hoardcp1";
const TRAILER: u64 = 16;

/// Bytes on disk of a copy of `size` bytes: the bytes, a check per block, the trailer.
pub fn disk_size(size: u64) -> u64 {
    size + size.div_ceil(BLOCK) * 8 + TRAILER
}

/// A copy's name: `<id>.<created>`, digits only (the download link's last segment).
pub fn is_key(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit());
    name.split_once('.')
        .is_some_and(|(id, created)| digits(id) && digits(created))
}

struct Held {
    bytes: u64,
    used: u64,
}

#[derive(Default)]
struct Index {
    copies: HashMap<String, Held>,
    /// Copies by last use, oldest first.
    by_use: BTreeMap<u64, String>,
    clock: u64,
    /// Bytes of the copies on disk.
    stored: u64,
    /// Bytes promised to copies being written.
    reserved: u64,
}

impl Index {
    fn insert(&mut self, key: String, bytes: u64) {
        self.remove(&key);
        self.clock += 1;
        self.by_use.insert(self.clock, key.clone());
        self.copies.insert(
            key,
            Held {
                bytes,
                used: self.clock,
            },
        );
        self.stored += bytes;
    }

    fn remove(&mut self, key: &str) -> bool {
        match self.copies.remove(key) {
            Some(held) => {
                self.by_use.remove(&held.used);
                self.stored -= held.bytes;
                true
            }
            None => false,
        }
    }

    fn touch(&mut self, key: &str) -> bool {
        let Some(held) = self.copies.get_mut(key) else {
            return false;
        };
        self.by_use.remove(&held.used);
        self.clock += 1;
        held.used = self.clock;
        self.by_use.insert(self.clock, key.to_owned());
        true
    }
}

/// What the store did, for `/metrics`.
#[derive(Debug, Default)]
pub struct StoreCounters {
    pub evictions: AtomicU64,
    pub damaged: AtomicU64,
}

/// The copies on disk.
pub struct Store {
    copies: PathBuf,
    tmp: PathBuf,
    max_bytes: u64,
    index: Mutex<Index>,
    next_tmp: AtomicU64,
    pub counters: StoreCounters,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("copies", &self.copies)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// Room promised to a copy being written; given back when dropped unless the copy is published.
pub struct Reservation {
    store: Arc<Store>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.store.index().reserved -= self.bytes;
    }
}

impl Store {
    /// Opens (or creates) the copies under `root`, keeping at most `max_bytes` of them.
    pub fn open(root: &Path, max_bytes: u64) -> io::Result<Arc<Self>> {
        let copies = root.join("copies");
        let tmp = root.join("tmp");
        std::fs::create_dir_all(&copies)?;
        std::fs::create_dir_all(&tmp)?;
        for left in std::fs::read_dir(&tmp)? {
            let _ = std::fs::remove_file(left?.path());
        }
        let mut found = Vec::new();
        for item in std::fs::read_dir(&copies)? {
            let item = item?;
            let name = item.file_name().to_string_lossy().into_owned();
            let meta = item.metadata()?;
            if !is_key(&name) || !meta.is_file() {
                continue;
            }
            found.push((meta.modified().ok(), name, meta.len()));
        }
        // Written last, used last: the best order a restart knows.
        found.sort();
        let store = Arc::new(Self {
            copies,
            tmp,
            max_bytes,
            index: Mutex::new(Index::default()),
            next_tmp: AtomicU64::new(0),
            counters: StoreCounters::default(),
        });
        {
            let mut index = store.index();
            for (_, name, bytes) in found {
                index.insert(name, bytes);
            }
        }
        store.make_room(0);
        Ok(store)
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        // Nothing panics while holding it.
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Bytes of the copies on disk, and how many there are.
    pub fn usage(&self) -> (u64, usize) {
        let index = self.index();
        (index.stored, index.copies.len())
    }

    fn path_of(&self, key: &str) -> PathBuf {
        self.copies.join(key)
    }

    /// Removes the least recently used copies until `more` bytes fit beside what is stored and
    /// promised. False if they cannot.
    fn make_room(&self, more: u64) -> bool {
        let mut doomed = Vec::new();
        let fits = {
            let mut index = self.index();
            while index.stored + index.reserved + more > self.max_bytes {
                let Some((_, key)) = index.by_use.pop_first() else {
                    break;
                };
                if let Some(held) = index.copies.remove(&key) {
                    index.stored -= held.bytes;
                }
                doomed.push(key);
            }
            index.stored + index.reserved + more <= self.max_bytes
        };
        for key in doomed {
            // A reader that has it open keeps reading it: the name goes, the file stays until
            // closed.
            let _ = std::fs::remove_file(self.path_of(&key));
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        }
        fits
    }

    /// Whether a copy of `size` bytes could be kept at all (it fits in `--max-bytes`).
    pub fn could_keep(&self, size: u64) -> bool {
        disk_size(size) <= self.max_bytes
    }

    /// Room for a copy of `size` bytes, making it by removing the least recently used copies;
    /// `None` if a copy that large cannot be kept at all.
    pub fn reserve(self: &Arc<Self>, size: u64) -> Option<Reservation> {
        let bytes = disk_size(size);
        if bytes > self.max_bytes {
            return None;
        }
        // Promised under the lock that checked it, so concurrent writers cannot overcommit.
        loop {
            if !self.make_room(bytes) {
                return None;
            }
            let mut index = self.index();
            if index.stored + index.reserved + bytes <= self.max_bytes {
                index.reserved += bytes;
                return Some(Reservation {
                    store: self.clone(),
                    bytes,
                });
            }
        }
    }

    /// A new file under `tmp/` for a copy of `key`.
    pub fn create_tmp(&self, key: &str) -> io::Result<(PathBuf, File)> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let path = self.tmp.join(format!("{key}.{}.{n}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok((path, file))
    }

    /// Makes a whole copy written at `tmp` the copy of `key` (blocking).
    pub fn publish(&self, reservation: Reservation, tmp: &Path, key: &str) -> io::Result<()> {
        let bytes = reservation.bytes;
        std::fs::rename(tmp, self.path_of(key))?;
        let mut index = self.index();
        index.insert(key.to_owned(), bytes);
        // The reservation is given back as the copy is counted, under one lock.
        index.reserved -= bytes;
        std::mem::forget(reservation);
        Ok(())
    }

    /// Whether a copy of `key` is kept (not whether it is sound: [`Store::open_copy`] says).
    pub fn holds(&self, key: &str) -> bool {
        self.index().copies.contains_key(key)
    }

    /// The copy of `key` if there is a sound one of `size` bytes (blocking: reads its checks).
    /// A copy whose trailer or size is wrong is dropped.
    pub fn open_copy(&self, key: &str, size: u64) -> Option<Copy> {
        if !self.index().touch(key) {
            return None;
        }
        match Copy::open(&self.path_of(key), size) {
            Ok(copy) => Some(copy),
            Err(e) => {
                tracing::warn!(copy = key, error = %e, "an edge copy cannot be read; dropping it");
                self.drop_damaged(key);
                None
            }
        }
    }

    /// Removes the copy of `key`, found damaged.
    pub fn drop_damaged(&self, key: &str) {
        if self.index().remove(key) {
            let _ = std::fs::remove_file(self.path_of(key));
            self.counters.damaged.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The XXH3 of each block of a copy being written, in order.
#[derive(Default)]
pub struct BlockSums {
    sums: Vec<u64>,
    hasher: twox_hash::XxHash3_64,
    in_block: u64,
}

impl BlockSums {
    /// Takes the next bytes of the copy.
    pub fn update(&mut self, mut data: &[u8]) {
        use std::hash::Hasher as _;
        while !data.is_empty() {
            let n = (BLOCK - self.in_block).min(data.len() as u64) as usize;
            self.hasher.write(&data[..n]);
            self.in_block += n as u64;
            data = &data[n..];
            if self.in_block == BLOCK {
                self.sums.push(self.hasher.finish());
                self.hasher = twox_hash::XxHash3_64::default();
                self.in_block = 0;
            }
        }
    }

    /// The checks and trailer that follow `size` bytes of data.
    pub fn finish(mut self, size: u64) -> Vec<u8> {
        use std::hash::Hasher as _;
        if self.in_block > 0 {
            self.sums.push(self.hasher.finish());
        }
        let mut out = Vec::with_capacity(self.sums.len() * 8 + TRAILER as usize);
        for sum in &self.sums {
            out.extend_from_slice(&sum.to_le_bytes());
        }
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(MAGIC);
        out
    }
}

fn check_of(block: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(block)
}

/// A sound-looking copy, open for reading: its checks are in memory (8 bytes per 256 KiB).
pub struct Copy {
    file: File,
    size: u64,
    sums: Vec<u64>,
}

fn damaged(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl Copy {
    fn open(path: &Path, size: u64) -> io::Result<Self> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        if len != disk_size(size) {
            return Err(damaged(format!(
                "{len} bytes on disk, {} expected for an entry of {size}",
                disk_size(size)
            )));
        }
        let blocks = size.div_ceil(BLOCK) as usize;
        file.seek(SeekFrom::Start(size))?;
        let mut tail = vec![0u8; blocks * 8 + TRAILER as usize];
        file.read_exact(&mut tail)?;
        let (sums, trailer) = tail.split_at(blocks * 8);
        if &trailer[8..] != MAGIC || trailer[..8] != size.to_le_bytes() {
            return Err(damaged("its trailer is not a copy's"));
        }
        let sums = sums
            .chunks_exact(8)
            .map(|s| u64::from_le_bytes(s.try_into().unwrap_or_default()))
            .collect();
        Ok(Self { file, size, sums })
    }

    /// Bytes `start..start + len`, each block checked before it is handed over; a damaged block
    /// ends the stream with an error of kind `InvalidData`.
    pub fn read(self, memory: Arc<TransferMemory>, start: u64, len: u64) -> ByteStream {
        let end = (start + len).min(self.size);
        let state = (Some(self), start);
        Box::pin(futures_util::stream::unfold(state, move |(copy, pos)| {
            let memory = memory.clone();
            async move {
                let copy = copy?;
                if pos >= end {
                    return None;
                }
                let block = memory.block(end - pos).await;
                let read = tokio::task::spawn_blocking(move || copy.read_block(block, pos, end))
                    .await
                    .map_err(io::Error::other);
                match read {
                    Ok((copy, Ok((block, skip)))) => {
                        let bytes = memory.filled(block).slice(skip..);
                        let next = pos + bytes.len() as u64;
                        Some((Ok(bytes), (Some(copy), next)))
                    }
                    Ok((_, Err(e))) | Err(e) => Some((Err(e), (None, pos))),
                }
            }
        }))
    }

    /// Reads the checked blocks from the one holding `pos` as far as `block` holds and `end`
    /// allows, checks each, and says how many leading bytes are before `pos`.
    fn read_block(
        mut self,
        mut block: Block,
        pos: u64,
        end: u64,
    ) -> (Self, io::Result<(Block, usize)>) {
        let result = (|| {
            let first = pos / BLOCK;
            let aligned = first * BLOCK;
            // Whole checked blocks, up to the entry's end (the last may be short).
            let room = block.capacity() as u64;
            let want = room
                .min((end - aligned).div_ceil(BLOCK) * BLOCK)
                .min(self.size - aligned);
            self.file.seek(SeekFrom::Start(aligned))?;
            let n = block.read_to_end(&mut (&mut self.file).take(want))? as u64;
            if n != want {
                return Err(damaged(format!("the copy ends {} bytes early", want - n)));
            }
            for (i, piece) in block.bytes().chunks(BLOCK as usize).enumerate() {
                let at = first as usize + i;
                if self.sums.get(at) != Some(&check_of(piece)) {
                    return Err(damaged(format!("block {at} fails its check")));
                }
            }
            // Only what was asked for: the last block's bytes past `end` are checked, not sent.
            block.truncate((end - aligned).min(n) as usize);
            Ok((block, (pos - aligned) as usize))
        })();
        (self, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    /// Writes a whole copy of `data` as a fetch does.
    fn put(store: &Arc<Store>, key: &str, data: &[u8]) {
        let reservation = store.reserve(data.len() as u64).unwrap();
        let (tmp, file) = store.create_tmp(key).unwrap();
        let mut sums = BlockSums::default();
        sums.update(data);
        use std::io::Write as _;
        let mut file = file;
        file.write_all(data).unwrap();
        file.write_all(&sums.finish(data.len() as u64)).unwrap();
        store.publish(reservation, &tmp, key).unwrap();
    }

    async fn read_all(
        store: &Arc<Store>,
        key: &str,
        size: u64,
        start: u64,
        len: u64,
    ) -> std::io::Result<Vec<u8>> {
        let copy = store
            .open_copy(key, size)
            .ok_or_else(|| damaged("no copy"))?;
        let mut out = Vec::new();
        let mut stream = copy.read(TransferMemory::new(4 << 20), start, len);
        while let Some(bytes) = stream.next().await {
            out.extend_from_slice(&bytes?);
        }
        Ok(out)
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[tokio::test]
    async fn any_range_of_a_copy_reads_back_and_a_damaged_block_is_never_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 64 << 20).unwrap();
        let bytes = data(3 * BLOCK as usize + 1000);
        let size = bytes.len() as u64;
        put(&store, "1.2", &bytes);
        for (start, len) in [
            (0, size),
            (1, 10),
            (BLOCK - 1, 2),
            (BLOCK * 3, 1000),
            (5, BLOCK * 2 + 7),
        ] {
            let got = read_all(&store, "1.2", size, start, len).await.unwrap();
            assert_eq!(
                got,
                &bytes[start as usize..(start + len) as usize],
                "{start}+{len}"
            );
        }
        // One byte of the third block changed on disk: the first two are served, then an error.
        {
            use std::os::unix::fs::FileExt;
            let file = File::options()
                .write(true)
                .open(dir.path().join("copies/1.2"))
                .unwrap();
            file.write_all_at(b"!", 2 * BLOCK + 17).unwrap();
        }
        let copy = store.open_copy("1.2", size).unwrap();
        let mut stream = copy.read(TransferMemory::new(2 << 20), 0, size);
        let mut good = 0;
        let failure = loop {
            match stream.next().await.unwrap() {
                Ok(bytes) => good += bytes.len() as u64,
                Err(e) => break e,
            }
        };
        assert_eq!(failure.kind(), io::ErrorKind::InvalidData);
        assert!(good <= 2 * BLOCK, "nothing of the damaged block: {good}");
        // A copy of another size (a trailer that does not match) is dropped on opening.
        assert!(store.open_copy("1.2", size + 1).is_none());
        assert_eq!(store.usage(), (0, 0));
        assert!(!dir.path().join("copies/1.2").exists());
    }

    #[test]
    fn room_is_made_by_the_least_recently_used_and_a_copy_too_large_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let each = disk_size(1000);
        let store = Store::open(dir.path(), 3 * each).unwrap();
        for key in ["1.1", "2.2", "3.3"] {
            put(&store, key, &data(1000));
        }
        // 1.1 used again: 2.2 is now the least recently used.
        assert!(store.open_copy("1.1", 1000).is_some());
        put(&store, "4.4", &data(1000));
        assert!(store.open_copy("2.2", 1000).is_none());
        assert!(store.open_copy("1.1", 1000).is_some());
        assert_eq!(store.usage(), (3 * each, 3));
        assert!(
            store.reserve(3 * each).is_none(),
            "larger than the whole disk"
        );
        // Reopened: the same copies, within the bound.
        drop(store);
        let store = Store::open(dir.path(), 2 * each).unwrap();
        assert_eq!(store.usage(), (2 * each, 2));
    }

    #[test]
    fn names_are_ids_and_creation_times_only() {
        for good in ["1.2", "12345.1700000000000"] {
            assert!(is_key(good), "{good}");
        }
        for bad in [
            "", "1", "1.", ".2", "1.2.3", "../1.2", "1.2/x", "a.2", "1.2 ",
        ] {
            assert!(!is_key(bad), "{bad}");
        }
    }
}
