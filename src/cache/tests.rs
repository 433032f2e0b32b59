//! The domain's rules over the in-memory metadata fake and a real local-disk chunk store, with
//! a clock the tests move: reservations, takeover, caps, staging, block lists, finalize.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;

use super::*;
use crate::blob::FsStore;
use crate::meta::MemoryStore;
use crate::model::{BlockSource, Chunk, ManualClock, RepoId, Scope};

const MAIN: &str = "refs/heads/main";
const TTL: Duration = Duration::from_secs(24 * 3600);

struct World {
    cache: Cache,
    meta: Arc<MemoryStore>,
    blobs: Arc<FsStore>,
    clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

fn world_with(max_open_uploads: u32, max_entry_size: u64) -> World {
    let dir = tempfile::tempdir().unwrap();
    let meta = Arc::new(MemoryStore::new());
    let blobs = Arc::new(FsStore::open(dir.path()).unwrap());
    let clock = Arc::new(ManualClock::starting_at(1_700_000_000_000));
    let cache = Cache::new(
        meta.clone(),
        blobs.clone(),
        Policy {
            reservation_ttl: TTL,
            sync_interval: Duration::from_secs(30),
            max_open_uploads,
            max_entry_size,
            lookup_cache_ttl: Duration::from_secs(1),
            lifecycle: lifecycle::Limits::default(),
        },
        clock.clone(),
    );
    World {
        cache,
        meta,
        blobs,
        clock,
        _dir: dir,
    }
}

fn world() -> World {
    world_with(1000, 1 << 30)
}

fn who(repo: &str) -> Identity {
    Identity {
        repository: RepoId::new(repo),
        read_scopes: vec![Scope::new(MAIN)],
        write_scope: Some(Scope::new(MAIN)),
        subject: "test".into(),
        run: "1:2".into(),
    }
}

fn body(data: &[u8]) -> ByteStream {
    let frame: Result<Bytes, std::io::Error> = Ok(Bytes::copy_from_slice(data));
    Box::pin(futures_util::stream::iter(vec![frame]))
}

fn block(id: &str) -> BlockId {
    BlockId::parse(id.as_bytes()).unwrap()
}

fn latest(id: &str) -> BlockRef {
    BlockRef {
        id: block(id),
        source: BlockSource::Latest,
    }
}

impl World {
    async fn upload(&self, id: UploadId) -> LinkedUpload {
        self.cache.upload(id).await.unwrap()
    }

    /// Saves `data` under `key` in one Put Blob; returns the entry.
    async fn save(&self, who: &Identity, key: &str, data: &[u8]) -> EntryId {
        let link = self.cache.reserve(who, key, "v").await.unwrap();
        let upload = self.upload(link.id).await;
        self.cache
            .put_whole(&upload, body(data), Some(data.len() as u64))
            .await
            .unwrap();
        self.cache
            .finalize(who, key, "v", data.len() as u64)
            .await
            .unwrap()
    }

    async fn restore(&self, who: &Identity, key: &str) -> Option<Vec<u8>> {
        let lookup = Lookup::parse(key, &[], "v").unwrap();
        let hit = self.cache.lookup(who, &lookup).await.unwrap()?;
        let open = self.cache.open_entry(hit.entry.id).await.unwrap();
        let size = open.entry.size;
        let frames: Vec<Bytes> = self
            .cache
            .read(&open, 0, size)
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        Some(frames.concat())
    }

    /// Whether the chunk store still holds `name`.
    async fn stored(&self, name: &BlobName) -> bool {
        self.blobs.get(name, 0, 0).await.is_ok()
    }
}

#[tokio::test]
async fn a_saved_entry_restores_and_a_second_save_conflicts() {
    let w = world();
    let me = who("1");
    w.save(&me, "Deps-1", b"hello").await;
    assert_eq!(
        w.restore(&me, "deps-1").await.as_deref(),
        Some(&b"hello"[..])
    );
    let err = w.cache.reserve(&me, "DEPS-1", "v").await.unwrap_err();
    assert!(matches!(err, CacheError::Conflict), "{err:?}");
    assert_eq!(
        w.restore(&who("2"), "deps-1").await,
        None,
        "other repositories see nothing"
    );
}

#[tokio::test]
async fn a_live_reservation_blocks_the_key_until_it_is_abandoned() {
    let w = world();
    let me = who("1");
    let first = w.cache.reserve(&me, "k", "v").await.unwrap();
    let upload = w.upload(first.id).await;
    w.cache
        .stage_block(&upload, block("a"), body(b"abc"), Some(3))
        .await
        .unwrap();
    let staged = w
        .meta
        .upload_with_blocks(first.id)
        .await
        .unwrap()
        .unwrap()
        .1;
    let old_blob = staged.staged[&block("a")].blob.clone();

    w.clock.advance(TTL - Duration::from_secs(1));
    assert!(matches!(
        w.cache.reserve(&me, "k", "v").await,
        Err(CacheError::Conflict)
    ));

    // Past the TTL the reservation is abandoned: a new job takes the key over, and the old
    // upload's blocks are deleted.
    w.clock.advance(Duration::from_secs(2));
    let second = w.cache.reserve(&me, "k", "v").await.unwrap();
    assert_ne!(second.id, first.id);
    assert_eq!(
        w.upload(first.id).await.upload.state,
        crate::model::UploadState::Aborted
    );
    assert!(
        !w.stored(&old_blob).await,
        "the abandoned upload's chunk is deleted"
    );
    // The old link's upload no longer takes data.
    let err = w
        .cache
        .stage_block(&upload, block("b"), body(b"x"), Some(1))
        .await
        .unwrap_err();
    assert!(matches!(err, CacheError::UploadClosed), "{err:?}");
}

#[tokio::test]
async fn a_repository_may_hold_only_so_many_live_reservations() {
    let w = world_with(2, 1 << 20);
    let me = who("1");
    w.cache.reserve(&me, "a", "v").await.unwrap();
    w.cache.reserve(&me, "b", "v").await.unwrap();
    let err = w.cache.reserve(&me, "c", "v").await.unwrap_err();
    assert!(matches!(err, CacheError::TooManyUploads), "{err:?}");
    // Other repositories have their own allowance.
    w.cache.reserve(&who("2"), "c", "v").await.unwrap();
    // Abandoned reservations stop counting.
    w.clock.advance(TTL + Duration::from_secs(1));
    w.cache.reserve(&me, "c", "v").await.unwrap();
}

#[tokio::test]
async fn a_retried_block_replaces_the_earlier_copy_and_frees_it() {
    let w = world();
    let me = who("1");
    let link = w.cache.reserve(&me, "k", "v").await.unwrap();
    let upload = w.upload(link.id).await;
    w.cache
        .stage_block(&upload, block("b"), body(b"BBBB"), Some(4))
        .await
        .unwrap();
    w.cache
        .stage_block(&upload, block("a"), body(b"old"), Some(3))
        .await
        .unwrap();
    let first_copy = w
        .meta
        .upload_with_blocks(link.id)
        .await
        .unwrap()
        .unwrap()
        .1
        .staged[&block("a")]
        .clone();
    w.cache
        .stage_block(&upload, block("a"), body(b"AAA"), Some(3))
        .await
        .unwrap();
    assert!(
        !w.stored(&first_copy.blob).await,
        "the replaced copy is deleted"
    );

    w.cache
        .commit_block_list(&w.upload(link.id).await, &[latest("a"), latest("b")])
        .await
        .unwrap();
    w.cache.finalize(&me, "k", "v", 7).await.unwrap();
    assert_eq!(w.restore(&me, "k").await.as_deref(), Some(&b"AAABBBB"[..]));
}

#[tokio::test]
async fn concurrent_blocks_of_one_upload_are_all_recorded() {
    let w = world();
    let me = who("1");
    let link = w.cache.reserve(&me, "k", "v").await.unwrap();
    let upload = w.upload(link.id).await;
    // Every Put Block reads the upload, then writes at the revision it read: concurrent ones
    // are refused as stale and decided again, never lost.
    let puts = (0..8u8).map(|i| {
        let (cache, upload) = (w.cache.clone(), upload.clone());
        tokio::spawn(async move {
            let id = block(&format!("b{i}"));
            cache
                .stage_block(&upload, id, body(&[b'0' + i; 3]), Some(3))
                .await
        })
    });
    for put in puts.collect::<Vec<_>>() {
        put.await.unwrap().unwrap();
    }
    let list: Vec<BlockRef> = (0..8).map(|i| latest(&format!("b{i}"))).collect();
    w.cache
        .commit_block_list(&w.upload(link.id).await, &list)
        .await
        .unwrap();
    w.cache.finalize(&me, "k", "v", 24).await.unwrap();
    assert_eq!(
        w.restore(&me, "k").await.unwrap(),
        b"000111222333444555666777"
    );
}

#[tokio::test]
async fn staged_blocks_may_not_outgrow_an_entry() {
    let w = world_with(10, 10);
    let me = who("1");
    let link = w.cache.reserve(&me, "k", "v").await.unwrap();
    let upload = w.upload(link.id).await;
    w.cache
        .stage_block(&upload, block("a"), body(b"123456"), Some(6))
        .await
        .unwrap();
    let err = w
        .cache
        .stage_block(&upload, block("b"), body(b"12345"), Some(5))
        .await
        .unwrap_err();
    assert!(matches!(err, CacheError::TooLarge(10)), "{err:?}");
    // Replacing a block counts only the new copy.
    w.cache
        .stage_block(&upload, block("a"), body(b"1234567890"), Some(10))
        .await
        .unwrap();
    let blocks = w.meta.upload_with_blocks(link.id).await.unwrap().unwrap().1;
    assert_eq!(blocks.staged.len(), 1, "the refused block was not recorded");
}

#[tokio::test]
async fn an_unknown_block_in_the_list_is_refused_and_changes_nothing() {
    let w = world();
    let me = who("1");
    let link = w.cache.reserve(&me, "k", "v").await.unwrap();
    let upload = w.upload(link.id).await;
    w.cache
        .stage_block(&upload, block("a"), body(b"a"), Some(1))
        .await
        .unwrap();
    let err = w
        .cache
        .commit_block_list(&w.upload(link.id).await, &[latest("a"), latest("zz")])
        .await
        .unwrap_err();
    assert!(matches!(err, CacheError::UnknownBlock), "{err:?}");
    let blocks = w.meta.upload_with_blocks(link.id).await.unwrap().unwrap().1;
    assert_eq!(blocks.staged.len(), 1);
    assert!(blocks.parts.is_empty());
}

#[tokio::test]
async fn finalize_checks_the_size_and_a_mismatch_frees_the_key() {
    let w = world();
    let me = who("1");
    let link = w.cache.reserve(&me, "k", "v").await.unwrap();
    let err = w.cache.finalize(&me, "k", "v", 3).await.unwrap_err();
    assert!(matches!(err, CacheError::NothingUploaded), "{err:?}");
    let upload = w.upload(link.id).await;
    w.cache
        .put_whole(&upload, body(b"abc"), Some(3))
        .await
        .unwrap();
    let blob = w
        .meta
        .upload_with_blocks(link.id)
        .await
        .unwrap()
        .unwrap()
        .1
        .parts[0]
        .1
        .blob
        .clone();
    let err = w.cache.finalize(&me, "k", "v", 4).await.unwrap_err();
    assert!(
        matches!(
            err,
            CacheError::SizeMismatch {
                stored: 3,
                declared: 4
            }
        ),
        "{err:?}"
    );
    assert!(
        !w.stored(&blob).await,
        "an aborted upload's chunks are deleted"
    );
    assert_eq!(w.restore(&me, "k").await, None);
    // The key is free again.
    w.save(&me, "k", b"abcd").await;
    assert_eq!(w.restore(&me, "k").await.as_deref(), Some(&b"abcd"[..]));
}

#[tokio::test]
async fn a_retried_finalize_returns_the_same_entry() {
    let w = world();
    let me = who("1");
    let entry = w.save(&me, "k", b"abc").await;
    assert_eq!(w.cache.finalize(&me, "k", "v", 3).await.unwrap(), entry);
    let err = w.cache.finalize(&me, "k", "v", 4).await.unwrap_err();
    assert!(matches!(err, CacheError::NoReservation), "{err:?}");
}

#[tokio::test]
async fn put_blob_replaces_staged_blocks_and_frees_them() {
    let w = world();
    let me = who("1");
    let link = w.cache.reserve(&me, "k", "v").await.unwrap();
    let upload = w.upload(link.id).await;
    w.cache
        .stage_block(&upload, block("a"), body(b"stale"), Some(5))
        .await
        .unwrap();
    let staged = w
        .meta
        .upload_with_blocks(link.id)
        .await
        .unwrap()
        .unwrap()
        .1
        .staged[&block("a")]
        .blob
        .clone();
    w.cache
        .put_whole(&upload, body(b"whole"), Some(5))
        .await
        .unwrap();
    assert!(!w.stored(&staged).await);
    w.cache.finalize(&me, "k", "v", 5).await.unwrap();
    assert_eq!(w.restore(&me, "k").await.as_deref(), Some(&b"whole"[..]));
}

#[tokio::test]
async fn restores_are_recorded_with_the_clock_time() {
    let w = world();
    let me = who("1");
    let entry = w.save(&me, "k", b"abc").await;
    w.clock.advance(Duration::from_secs(60));
    w.restore(&me, "k").await.unwrap();
    w.restore(&me, "k").await.unwrap();
    w.cache.usage.flush(w.meta.as_ref()).await;
    let (stored, _) = w.meta.entry(entry).await.unwrap().unwrap();
    assert_eq!(stored.hits, 2);
    assert_eq!(stored.last_used_at, w.clock.now());
}

#[tokio::test]
async fn writes_need_a_writable_scope() {
    let w = world();
    let mut reader = who("1");
    reader.write_scope = None;
    assert!(matches!(
        w.cache.reserve(&reader, "k", "v").await,
        Err(CacheError::WriteDenied)
    ));
    assert!(matches!(
        w.cache.finalize(&reader, "k", "v", 1).await,
        Err(CacheError::WriteDenied)
    ));
}

fn chunks(sizes: &[u64]) -> Vec<EntryChunk> {
    let mut start = 0;
    sizes
        .iter()
        .map(|&size| {
            let c = EntryChunk {
                start,
                chunk: Chunk {
                    blob: BlobName::random(),
                    size,
                    sha256: [0; 32],
                },
            };
            start += size;
            c
        })
        .collect()
}

#[test]
fn a_range_maps_onto_the_chunks_it_touches() {
    let c = chunks(&[10, 10, 5]);
    assert_eq!(slices(&c, 0, 25), [(0, 0, 10), (1, 0, 10), (2, 0, 5)]);
    assert_eq!(slices(&c, 5, 10), [(0, 5, 5), (1, 0, 5)]);
    assert_eq!(slices(&c, 20, 5), [(2, 0, 5)]);
    assert_eq!(slices(&c, 0, 1), [(0, 0, 1)]);
    assert_eq!(slices(&c, 24, 100), [(2, 4, 1)]);
    assert!(slices(&c, 25, 1).is_empty());
}

#[test]
fn empty_chunks_are_skipped() {
    let c = chunks(&[0, 4]);
    assert_eq!(slices(&c, 0, 4), [(1, 0, 4)]);
}

#[tokio::test]
async fn lookups_are_exact_within_a_process_and_bounded_by_the_ttl_across_processes() {
    let w = world();
    let me = who("1");
    // A second process on the same metadata and chunks, with the same clock.
    let other = Cache::new(
        w.meta.clone(),
        w.blobs.clone(),
        w.cache.policy.clone(),
        w.clock.clone(),
    );
    let lookup = Lookup::parse("k", &[], "v").unwrap();
    assert!(w.cache.lookup(&me, &lookup).await.unwrap().is_none());
    assert!(other.lookup(&me, &lookup).await.unwrap().is_none());

    w.save(&me, "k", b"abc").await;
    // The process that saved sees the entry at once, although it had just answered a miss.
    assert!(w.cache.lookup(&me, &lookup).await.unwrap().is_some());
    // The other one reuses its recent miss until the TTL has passed, then finds the entry.
    assert!(other.lookup(&me, &lookup).await.unwrap().is_none());
    w.clock.advance(Duration::from_secs(1));
    assert!(other.lookup(&me, &lookup).await.unwrap().is_some());
}
