//! The domain's rules over a real SQLite database and a real local-disk chunk store, with
//! a clock the tests move: reservations, takeover, caps, staging, block lists, finalize.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};

use super::*;
use crate::auth::LinkTarget;
use crate::blob::FsStore;
use crate::meta::{
    EntryChunk, EntryState, EntryWalk, LifecycleStore, RestoreStore, SaveStore, SqliteStore,
    UploadChange, UploadRead, UsageOf,
};
use crate::model::{BlockId, BlockRef, ByteStream, Lookup, UploadId};
use crate::model::{BlockSource, Chunk, ManualClock, RepoId, Scope};

const MAIN: &str = "refs/heads/main";
const TTL: Duration = Duration::from_secs(24 * 3600);

struct World {
    cache: Cache,
    meta: Arc<SqliteStore>,
    blobs: Arc<FsStore>,
    clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

async fn world_with(max_open_uploads: u32, max_entry_size: u64) -> World {
    build_world(
        max_open_uploads,
        max_entry_size,
        lifecycle::Limits::default(),
    )
    .await
}

/// A world with lifecycle limits, its clock at the real time (chunk files carry real times).
async fn world_limited(limits: lifecycle::Limits) -> World {
    build_world(1000, 1 << 30, limits).await
}

async fn build_world(
    max_open_uploads: u32,
    max_entry_size: u64,
    limits: lifecycle::Limits,
) -> World {
    build_world_over(max_open_uploads, max_entry_size, limits, |blobs| blobs).await
}

/// A world whose cache sees the disk store through `store` (the test itself keeps the files).
async fn build_world_over(
    max_open_uploads: u32,
    max_entry_size: u64,
    limits: lifecycle::Limits,
    store: impl FnOnce(Arc<FsStore>) -> Arc<dyn BlobStore>,
) -> World {
    let dir = tempfile::tempdir().unwrap();
    let meta = Arc::new(
        SqliteStore::open(&dir.path().join("hoard.db"))
            .await
            .unwrap(),
    );
    let blobs = Arc::new(FsStore::open(dir.path()).unwrap());
    let clock = Arc::new(ManualClock::starting_at(crate::model::now_millis()));
    let cache = Cache::new(
        meta.clone(),
        store(blobs.clone()),
        Policy {
            reservation_ttl: TTL,
            sync_interval: Duration::from_secs(30),
            max_open_uploads,
            max_entry_size,
            lookup_cache_ttl: Duration::from_secs(1),
            lifecycle: limits,
            stats_max_families: 100,
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

async fn world() -> World {
    world_with(1000, 1 << 30).await
}

fn who(repo: &str) -> Identity {
    Identity {
        repository: RepoId::new(repo),
        repository_name: format!("octo/{repo}"),
        read_scopes: vec![Scope::new(MAIN)],
        write_scope: Some(Scope::new(MAIN)),
        kind: crate::model::CallerKind::Hs256,
        issuer: String::new(),
        subject: "test".into(),
        run_id: "1".into(),
        job_id: "2".into(),
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

/// What a Put Block of `block` decides on, from an upload loaded whole earlier (its revision
/// may since be stale: the domain then loads it again).
fn target_of(linked: &LinkedUpload, block: &BlockId) -> save::BlockTarget {
    save::BlockTarget {
        upload: linked.upload.clone(),
        state: crate::meta::BlockState::of(&linked.blocks, block),
    }
}

impl World {
    async fn upload(&self, id: UploadId) -> LinkedUpload {
        self.cache.upload(id).await.unwrap()
    }

    /// Stages a block through `linked`, as loaded earlier.
    async fn stage(
        &self,
        linked: &LinkedUpload,
        block: BlockId,
        data: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<(), CacheError> {
        let target = target_of(linked, &block);
        self.cache
            .stage_block(&target, block, data, declared_len)
            .await
    }

    /// Saves `data` under `key` in one Put Blob; returns the entry.
    async fn save(&self, who: &Identity, key: &str, data: &[u8]) -> EntryId {
        let link = self
            .cache
            .reserve(who, Some([192, 0, 2, 1].into()), key, "v")
            .await
            .unwrap();
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
        let hit = self.cache.lookup(who, None, &lookup).await.unwrap()?;
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
    let w = world().await;
    let me = who("1");
    w.save(&me, "Deps-1", b"hello").await;
    assert_eq!(
        w.restore(&me, "deps-1").await.as_deref(),
        Some(&b"hello"[..])
    );
    let err = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "DEPS-1", "v")
        .await
        .unwrap_err();
    assert!(matches!(err, CacheError::Conflict), "{err:?}");
    assert_eq!(
        w.restore(&who("2"), "deps-1").await,
        None,
        "other repositories see nothing"
    );
}

/// A signed link opens only the row it was signed for: one whose creation time differs (its id
/// reused by a later row) or whose row is gone is `NoSuchLink`, for uploads and for entries, and
/// nothing is stored through it.
#[tokio::test]
async fn a_link_opens_only_the_row_it_was_signed_for() {
    let w = world().await;
    let me = who("1");
    let link = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "k", "v")
        .await
        .unwrap();
    let later = LinkTarget {
        id: link.id,
        created_at: link.created_at + 1,
    };
    let refused = w.cache.put_blob(later, body(b"abc"), Some(3)).await;
    assert!(
        matches!(refused, Err(CacheError::NoSuchLink)),
        "{refused:?}"
    );
    let staged = w.upload(link.id).await.blocks;
    assert!(staged.staged.is_empty(), "nothing was stored");
    w.cache.put_blob(link, body(b"abc"), Some(3)).await.unwrap();
    w.cache.finalize(&me, "k", "v", 3).await.unwrap();

    let lookup = Lookup::parse("k", &[], "v").unwrap();
    let hit = w.cache.lookup(&me, None, &lookup).await.unwrap().unwrap();
    assert_eq!(w.cache.open_link(hit.entry).await.unwrap().entry.size, 3);
    let earlier = LinkTarget {
        id: hit.entry.id,
        created_at: hit.entry.created_at - 1,
    };
    let gone = LinkTarget {
        id: EntryId::new(hit.entry.id.get() + 1000),
        created_at: hit.entry.created_at,
    };
    for target in [earlier, gone] {
        let refused = w.cache.open_link(target).await;
        assert!(matches!(refused, Err(CacheError::NoSuchLink)), "{target:?}");
    }
}

#[tokio::test]
async fn a_live_reservation_blocks_the_key_until_it_is_abandoned() {
    let w = world().await;
    let me = who("1");
    let first = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "k", "v")
        .await
        .unwrap();
    let upload = w.upload(first.id).await;
    w.stage(&upload, block("a"), body(b"abc"), Some(3))
        .await
        .unwrap();
    let staged = w.upload(first.id).await.blocks;
    let old_blob = staged.staged[&block("a")].blob.clone();

    w.clock.advance(TTL - Duration::from_secs(1));
    assert!(matches!(
        w.cache
            .reserve(&me, Some([192, 0, 2, 1].into()), "k", "v")
            .await,
        Err(CacheError::Conflict)
    ));

    // Past the TTL the reservation is abandoned: a new job takes the key over, and the old
    // upload's blocks are deleted.
    w.clock.advance(Duration::from_secs(2));
    let second = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "k", "v")
        .await
        .unwrap();
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
        .stage(&upload, block("b"), body(b"x"), Some(1))
        .await
        .unwrap_err();
    assert!(matches!(err, CacheError::UploadClosed), "{err:?}");
}

#[tokio::test]
async fn a_repository_may_hold_only_so_many_live_reservations() {
    let w = world_with(2, 1 << 20).await;
    let me = who("1");
    w.cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "a", "v")
        .await
        .unwrap();
    w.cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "b", "v")
        .await
        .unwrap();
    let err = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "c", "v")
        .await
        .unwrap_err();
    assert!(matches!(err, CacheError::TooManyUploads), "{err:?}");
    // Other repositories have their own allowance.
    w.cache
        .reserve(&who("2"), Some([192, 0, 2, 1].into()), "c", "v")
        .await
        .unwrap();
    // Abandoned reservations stop counting.
    w.clock.advance(TTL + Duration::from_secs(1));
    w.cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "c", "v")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_retried_block_replaces_the_earlier_copy_and_frees_it() {
    let w = world().await;
    let me = who("1");
    let link = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "k", "v")
        .await
        .unwrap();
    let upload = w.upload(link.id).await;
    w.stage(&upload, block("b"), body(b"BBBB"), Some(4))
        .await
        .unwrap();
    w.stage(&upload, block("a"), body(b"old"), Some(3))
        .await
        .unwrap();
    let first_copy = w.upload(link.id).await.blocks.staged[&block("a")].clone();
    w.stage(&upload, block("a"), body(b"AAA"), Some(3))
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
    let w = world().await;
    let me = who("1");
    let link = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "k", "v")
        .await
        .unwrap();
    let upload = w.upload(link.id).await;
    // Every Put Block reads the upload, then writes at the revision it read: concurrent ones
    // are refused as stale and decided again, never lost.
    let puts = (0..8u8).map(|i| {
        let (cache, upload) = (w.cache.clone(), upload.clone());
        tokio::spawn(async move {
            let id = block(&format!("b{i}"));
            cache
                .stage_block(&target_of(&upload, &id), id, body(&[b'0' + i; 3]), Some(3))
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
    let w = world_with(10, 10).await;
    let me = who("1");
    let link = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "k", "v")
        .await
        .unwrap();
    let upload = w.upload(link.id).await;
    w.stage(&upload, block("a"), body(b"123456"), Some(6))
        .await
        .unwrap();
    let err = w
        .stage(&upload, block("b"), body(b"12345"), Some(5))
        .await
        .unwrap_err();
    assert!(matches!(err, CacheError::TooLarge(10)), "{err:?}");
    // Replacing a block counts only the new copy.
    w.stage(&upload, block("a"), body(b"1234567890"), Some(10))
        .await
        .unwrap();
    let blocks = w.upload(link.id).await.blocks;
    assert_eq!(blocks.staged.len(), 1, "the refused block was not recorded");
}

#[tokio::test]
async fn an_unknown_block_in_the_list_is_refused_and_changes_nothing() {
    let w = world().await;
    let me = who("1");
    let link = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "k", "v")
        .await
        .unwrap();
    let upload = w.upload(link.id).await;
    w.stage(&upload, block("a"), body(b"a"), Some(1))
        .await
        .unwrap();
    let err = w
        .cache
        .commit_block_list(&w.upload(link.id).await, &[latest("a"), latest("zz")])
        .await
        .unwrap_err();
    assert!(matches!(err, CacheError::UnknownBlock), "{err:?}");
    let blocks = w.upload(link.id).await.blocks;
    assert_eq!(blocks.staged.len(), 1);
    assert!(blocks.parts.is_empty());
}

#[tokio::test]
async fn finalize_checks_the_size_and_a_mismatch_frees_the_key() {
    let w = world().await;
    let me = who("1");
    let link = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "k", "v")
        .await
        .unwrap();
    let err = w.cache.finalize(&me, "k", "v", 3).await.unwrap_err();
    assert!(matches!(err, CacheError::NothingUploaded), "{err:?}");
    let upload = w.upload(link.id).await;
    w.cache
        .put_whole(&upload, body(b"abc"), Some(3))
        .await
        .unwrap();
    let blob = w.upload(link.id).await.blocks.parts[0].1.blob.clone();
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
    let w = world().await;
    let me = who("1");
    let entry = w.save(&me, "k", b"abc").await;
    assert_eq!(w.cache.finalize(&me, "k", "v", 3).await.unwrap(), entry);
    let err = w.cache.finalize(&me, "k", "v", 4).await.unwrap_err();
    assert!(matches!(err, CacheError::NoReservation), "{err:?}");
}

#[tokio::test]
async fn put_blob_replaces_staged_blocks_and_frees_them() {
    let w = world().await;
    let me = who("1");
    let link = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "k", "v")
        .await
        .unwrap();
    let upload = w.upload(link.id).await;
    w.stage(&upload, block("a"), body(b"stale"), Some(5))
        .await
        .unwrap();
    let staged = w.upload(link.id).await.blocks.staged[&block("a")]
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
    let w = world().await;
    let me = who("1");
    let entry = w.save(&me, "k", b"abc").await;
    w.clock.advance(Duration::from_secs(60));
    w.restore(&me, "k").await.unwrap();
    w.restore(&me, "k").await.unwrap();
    w.cache.usage.flush(w.meta.as_ref()).await.unwrap();
    let (stored, _) = w
        .meta
        .entry(entry, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.hits, 2);
    assert_eq!(stored.last_used_at, w.clock.now());
}

#[tokio::test]
async fn writes_need_a_writable_scope() {
    let w = world().await;
    let mut reader = who("1");
    reader.write_scope = None;
    assert!(matches!(
        w.cache
            .reserve(&reader, Some([192, 0, 2, 1].into()), "k", "v")
            .await,
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
                    sha256: Some([1; 32]),
                    xxh3: None,
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
    let w = world().await;
    let me = who("1");
    // A second process on the same metadata and chunks, with the same clock.
    let other = Cache::new(
        w.meta.clone(),
        w.blobs.clone(),
        w.cache.policy.clone(),
        w.clock.clone(),
    );
    let lookup = Lookup::parse("k", &[], "v").unwrap();
    assert!(w.cache.lookup(&me, None, &lookup).await.unwrap().is_none());
    assert!(other.lookup(&me, None, &lookup).await.unwrap().is_none());

    w.save(&me, "k", b"abc").await;
    // The process that saved sees the entry at once, although it had just answered a miss.
    assert!(w.cache.lookup(&me, None, &lookup).await.unwrap().is_some());
    // The other one reuses its recent miss until the TTL has passed, then finds the entry.
    assert!(other.lookup(&me, None, &lookup).await.unwrap().is_none());
    w.clock.advance(Duration::from_secs(1));
    assert!(other.lookup(&me, None, &lookup).await.unwrap().is_some());
}

// ---- lifecycle ----

const GRACE: Duration = Duration::from_secs(2 * 3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

impl World {
    /// Runs a maintenance pass; returns its report and what it did.
    async fn pass(&self, dry_run: bool) -> (lifecycle::PassReport, Vec<lifecycle::Action>) {
        let mut actions = Vec::new();
        let report = self
            .cache
            .maintenance_pass(dry_run, &mut |a| actions.push(a))
            .await
            .unwrap();
        (report, actions)
    }

    /// The chunks of an entry.
    async fn blobs_of(&self, entry: EntryId) -> Vec<BlobName> {
        let (_, chunks) = self
            .meta
            .entry(entry, EntryState::Live)
            .await
            .unwrap()
            .unwrap();
        chunks.into_iter().map(|c| c.chunk.blob).collect()
    }

    /// Saves `blocks` as Put Block calls and one block list.
    async fn save_blocks(&self, who: &Identity, key: &str, blocks: &[Vec<u8>]) -> EntryId {
        let link = self
            .cache
            .reserve(who, Some([192, 0, 2, 1].into()), key, "v")
            .await
            .unwrap();
        let upload = self.upload(link.id).await;
        let mut list = Vec::new();
        for (i, data) in blocks.iter().enumerate() {
            let id = format!("block-{i}");
            self.stage(&upload, block(&id), body(data), Some(data.len() as u64))
                .await
                .unwrap();
            list.push(latest(&id));
        }
        // As the block-list request would load it: after its blocks.
        let upload = self.upload(link.id).await;
        self.cache.commit_block_list(&upload, &list).await.unwrap();
        let size = blocks.iter().map(|b| b.len() as u64).sum();
        self.cache.finalize(who, key, "v", size).await.unwrap()
    }

    /// Reads a whole entry: its bytes, or the error the stream ended with.
    async fn read_whole(&self, entry: EntryId) -> Result<Vec<Bytes>, std::io::Error> {
        let open = self.cache.open_entry(entry).await.unwrap();
        let stream = self.cache.read(&open, 0, open.entry.size).await.unwrap();
        stream.try_collect().await
    }

    /// Flips one bit of byte `at` of the entry's first chunk, on disk.
    async fn flip_byte(&self, entry: EntryId, at: usize) {
        let path = self.chunk_path(&self.blobs_of(entry).await[0]);
        let mut stored = std::fs::read(&path).unwrap();
        stored[at] ^= 0x01;
        std::fs::write(&path, stored).unwrap();
    }

    fn chunk_path(&self, name: &BlobName) -> std::path::PathBuf {
        let name = name.as_str();
        self._dir.path().join("chunks").join(&name[..2]).join(name)
    }

    /// Restores, recording the hit in the metadata at once.
    async fn use_entry(&self, who: &Identity, key: &str) {
        self.restore(who, key).await.unwrap();
        self.cache.usage.flush(self.meta.as_ref()).await.unwrap();
    }
}

fn limits() -> lifecycle::Limits {
    lifecycle::Limits {
        deletion_grace: GRACE,
        ..lifecycle::Limits::default()
    }
}

/// A caller of repository `repo` that writes to `scope` and reads it and the default branch.
fn who_in(repo: &str, scope: &str) -> Identity {
    Identity {
        read_scopes: vec![Scope::new(scope), Scope::new(MAIN)],
        write_scope: Some(Scope::new(scope)),
        ..who(repo)
    }
}

#[tokio::test]
async fn pull_requests_and_tags_keep_within_their_share_and_never_evict_a_branch() {
    let w = world_limited(lifecycle::Limits {
        repo_quota: Some(100),
        pr_scope_share: crate::model::Share::parse("50%").unwrap(),
        ..limits()
    })
    .await;
    let main = who("1");
    let pr = who_in("1", "refs/pull/1/merge");
    let tag = who_in("1", "refs/tags/v1");
    let tick = || w.clock.advance(Duration::from_secs(1));
    let usage = || async {
        let u = w
            .meta
            .usage(UsageOf::Repository(&RepoId::new("1")))
            .await
            .unwrap();
        (u.bytes, u.pr_bytes)
    };
    w.save(&main, "m1", &[1; 40]).await;
    tick();
    w.save(&pr, "p1", &[2; 20]).await;
    tick();
    w.save(&tag, "t1", &[3; 20]).await;
    tick();
    w.save(&pr, "p2", &[4; 20]).await;
    tick();
    assert_eq!(
        w.restore(&pr, "p1").await,
        None,
        "the share's least recently used went"
    );
    assert_eq!(w.restore(&tag, "t1").await.unwrap(), [3; 20]);
    assert_eq!(w.restore(&pr, "p2").await.unwrap(), [4; 20]);
    assert_eq!(usage().await, (80, 40));

    // A branch's save over the quota: pull requests and tags go first.
    w.save(&main, "m2", &[5; 40]).await;
    tick();
    assert_eq!(
        w.restore(&tag, "t1").await,
        None,
        "the least recently used PR or tag entry"
    );
    assert_eq!(w.restore(&pr, "p2").await.unwrap(), [4; 20]);
    assert_eq!(usage().await, (100, 20));

    // A pull request's save over the quota takes from pull requests only: the branch entries
    // stay, and so does the entry just saved (until the next save), though it only fits by
    // evicting one of theirs.
    w.save(&pr, "p3", &[6; 20]).await;
    tick();
    assert_eq!(w.restore(&pr, "p2").await, None);
    assert_eq!(w.restore(&pr, "p3").await.unwrap(), [6; 20]);
    w.save(&pr, "p4", &[7; 30]).await;
    tick();
    assert_eq!(w.restore(&pr, "p3").await, None);
    assert_eq!(w.restore(&pr, "p4").await.unwrap(), [7; 30]);
    assert_eq!(w.restore(&main, "m1").await.unwrap(), [1; 40]);
    assert_eq!(w.restore(&main, "m2").await.unwrap(), [5; 40]);
    assert_eq!(usage().await, (110, 30));

    // The next save takes it first; an entry larger than the share alone is kept until then.
    w.save(&tag, "t2", &[8; 51]).await;
    tick();
    assert_eq!(w.restore(&pr, "p4").await, None);
    assert_eq!(w.restore(&tag, "t2").await.unwrap(), [8; 51]);
    assert_eq!(usage().await, (131, 51));

    // A branch's save: the pull requests and tags go, then the least recently used branch
    // entry, never the one just saved.
    w.restore(&main, "m1").await.unwrap();
    tick();
    w.save(&main, "m3", &[9; 40]).await;
    assert_eq!(w.restore(&tag, "t2").await, None);
    assert_eq!(w.restore(&main, "m2").await, None);
    assert_eq!(w.restore(&main, "m1").await.unwrap(), [1; 40]);
    assert_eq!(w.restore(&main, "m3").await.unwrap(), [9; 40]);
    assert_eq!(usage().await, (80, 0));
}

#[tokio::test]
async fn a_burst_of_branch_and_pull_request_saves_never_evicts_a_branch_for_the_pull_request() {
    // Saved within a large quota; then one eviction round checks a pull request's and a
    // branch's finalize together (as when their finalizes overlap), against a quota of 100.
    let w = world_limited(lifecycle::Limits {
        repo_quota: Some(1000),
        pr_scope_share: crate::model::Share::parse("50%").unwrap(),
        ..limits()
    })
    .await;
    let (main, pr) = (who("1"), who_in("1", "refs/pull/1/merge"));
    w.save(&main, "m1", &[1; 40]).await;
    w.clock.advance(Duration::from_secs(1));
    w.save(&main, "m2", &[2; 40]).await;
    w.clock.advance(Duration::from_secs(1));
    let p1 = w.save(&pr, "p1", &[3; 30]).await;
    let m3 = w.save(&main, "m3", &[4; 10]).await;
    let written = [
        lifecycle::Written {
            id: p1,
            class: crate::model::ScopeClass::PullRequestOrTag,
            size: 30,
        },
        lifecycle::Written {
            id: m3,
            class: crate::model::ScopeClass::Branch,
            size: 10,
        },
    ];
    w.cache
        .evict_over_quota(&RepoId::new("1"), 100, &written)
        .await
        .unwrap();
    // 120 bytes against 100: the 20 over are the pull request's, which its next save evicts;
    // no branch entry goes to make room for it.
    for (key, data) in [
        ("m1", [1; 40].as_slice()),
        ("m2", &[2; 40]),
        ("m3", &[4; 10]),
    ] {
        assert_eq!(w.restore(&main, key).await.unwrap(), data, "{key}");
    }
    assert_eq!(w.restore(&pr, "p1").await.unwrap(), [3; 30]);
}

#[tokio::test]
async fn the_whole_quota_as_share_is_plain_lru_over_the_repository() {
    let w = world_limited(lifecycle::Limits {
        repo_quota: Some(100),
        pr_scope_share: crate::model::Share::WHOLE,
        ..limits()
    })
    .await;
    let (main, pr) = (who("1"), who_in("1", "refs/pull/1/merge"));
    w.save(&main, "m1", &[1; 40]).await;
    w.clock.advance(Duration::from_secs(1));
    w.save(&pr, "p1", &[2; 40]).await;
    w.clock.advance(Duration::from_secs(1));
    w.save(&pr, "p2", &[3; 40]).await;
    assert_eq!(
        w.restore(&main, "m1").await,
        None,
        "the least recently used entry went, though a branch's"
    );
    assert_eq!(w.restore(&pr, "p1").await.unwrap(), [2; 40]);
    assert_eq!(w.restore(&pr, "p2").await.unwrap(), [3; 40]);
}

#[tokio::test]
async fn a_repository_over_its_quota_loses_its_least_recently_used_entries() {
    let w = world_limited(lifecycle::Limits {
        repo_quota: Some(25),
        ..limits()
    })
    .await;
    let (me, other) = (who("1"), who("2"));
    let a = w.save(&me, "a", &[1; 10]).await;
    w.clock.advance(Duration::from_secs(1));
    let b = w.save(&me, "b", &[2; 10]).await;
    w.save(&other, "x", &[9; 20]).await;
    w.clock.advance(Duration::from_secs(1));
    // a is now more recent than b (the restore is not yet written: eviction writes it first)
    w.restore(&me, "a").await.unwrap();
    w.clock.advance(Duration::from_secs(1));
    let b_blobs = w.blobs_of(b).await;
    let c = w.save(&me, "c", &[3; 10]).await;

    assert_eq!(
        w.restore(&me, "b").await,
        None,
        "the least recently used went"
    );
    assert_eq!(w.restore(&me, "a").await.unwrap(), [1; 10]);
    assert_eq!(w.restore(&me, "c").await.unwrap(), [3; 10]);
    assert_eq!(
        w.restore(&other, "x").await.unwrap(),
        [9; 20],
        "other repositories keep theirs"
    );
    assert_eq!(
        w.meta
            .usage(UsageOf::Repository(&RepoId::new("1")))
            .await
            .unwrap()
            .bytes,
        20
    );
    assert!(
        w.meta.entry(a, EntryState::Live).await.unwrap().is_some()
            && w.meta.entry(c, EntryState::Live).await.unwrap().is_some()
    );

    // The evicted entry's bytes stay for the grace period, then a pass deletes them.
    assert!(w.stored(&b_blobs[0]).await);
    let (report, _) = w.pass(false).await;
    assert_eq!(report.deleted_chunks, 0);
    assert!(
        w.stored(&b_blobs[0]).await,
        "readers may still be streaming it"
    );
    w.clock.advance(GRACE + Duration::from_secs(1));
    let (_, actions) = w.pass(false).await;
    let deleted: Vec<lifecycle::Action> = b_blobs
        .iter()
        .cloned()
        .map(lifecycle::Action::DeleteChunk)
        .collect();
    assert_eq!(actions, deleted);
    assert!(!w.stored(&b_blobs[0]).await);
}

#[tokio::test]
async fn an_entry_larger_than_the_quota_is_kept_until_the_next_save() {
    let w = world_limited(lifecycle::Limits {
        repo_quota: Some(5),
        ..limits()
    })
    .await;
    let me = who("1");
    w.save(&me, "big", &[1; 10]).await;
    assert!(
        w.restore(&me, "big").await.is_some(),
        "the entry just saved is never evicted"
    );
    w.clock.advance(Duration::from_secs(1));
    w.save(&me, "next", &[2; 3]).await;
    assert_eq!(w.restore(&me, "big").await, None);
    assert!(w.restore(&me, "next").await.is_some());
}

#[tokio::test]
async fn the_global_limit_evicts_across_repositories() {
    let w = world_limited(lifecycle::Limits {
        max_storage: Some(25),
        ..limits()
    })
    .await;
    w.save(&who("1"), "a", &[1; 10]).await;
    w.clock.advance(Duration::from_secs(1));
    w.save(&who("2"), "b", &[2; 10]).await;
    w.clock.advance(Duration::from_secs(1));
    w.save(&who("1"), "c", &[3; 10]).await;
    // 30 bytes stored: the next reservation makes room by evicting the oldest, of any repository.
    w.cache
        .reserve(&who("3"), Some([192, 0, 2, 1].into()), "d", "v")
        .await
        .unwrap();
    assert_eq!(w.restore(&who("1"), "a").await, None);
    assert!(w.restore(&who("2"), "b").await.is_some());
    assert!(w.restore(&who("1"), "c").await.is_some());
    assert_eq!(w.meta.usage(UsageOf::Everything).await.unwrap().bytes, 20);
}

#[tokio::test]
async fn when_nothing_can_be_evicted_a_reservation_is_refused() {
    // More free space than any file system has: evicting everything cannot reach it.
    let w = world_limited(lifecycle::Limits {
        min_free_space: Some(lifecycle::FreeSpace::Percent(99.999)),
        ..limits()
    })
    .await;
    let err = w
        .cache
        .reserve(&who("1"), Some([192, 0, 2, 1].into()), "a", "v")
        .await
        .unwrap_err();
    assert!(matches!(err, CacheError::StorageFull), "{err:?}");
    let w = world_limited(lifecycle::Limits {
        min_free_space: Some(lifecycle::FreeSpace::Bytes(1)),
        ..limits()
    })
    .await;
    w.cache
        .reserve(&who("1"), Some([192, 0, 2, 1].into()), "a", "v")
        .await
        .unwrap();
}

#[tokio::test]
async fn unused_entries_expire_and_old_ones_too_with_a_maximum_age() {
    let w = world_limited(lifecycle::Limits {
        unused_ttl: Some(7 * DAY),
        max_age: Some(10 * DAY),
        ..limits()
    })
    .await;
    let me = who("1");
    w.save(&me, "used", b"u").await;
    w.save(&me, "unused", b"n").await;
    w.clock.advance(6 * DAY);
    w.use_entry(&me, "used").await;
    w.clock.advance(2 * DAY);
    let (report, _) = w.pass(false).await;
    assert_eq!(report.expired, 1);
    assert_eq!(w.restore(&me, "unused").await, None, "unused for 8 days");
    assert!(w.restore(&me, "used").await.is_some(), "used 2 days ago");
    w.cache.usage.flush(w.meta.as_ref()).await.unwrap();
    w.clock.advance(3 * DAY);
    w.pass(false).await;
    assert_eq!(
        w.restore(&me, "used").await,
        None,
        "11 days old, used or not"
    );
}

#[tokio::test]
async fn abandoned_uploads_are_swept_and_their_bytes_deleted() {
    let w = world_limited(limits()).await;
    let me = who("1");
    let link = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "k", "v")
        .await
        .unwrap();
    let upload = w.upload(link.id).await;
    w.stage(&upload, block("a"), body(b"staged"), Some(6))
        .await
        .unwrap();
    let staged = w.upload(link.id).await.blocks;
    let blob = staged.staged[&block("a")].blob.clone();

    w.clock.advance(TTL - Duration::from_secs(1));
    let (report, _) = w.pass(false).await;
    assert!(report.aborted_uploads == 0, "a live upload is left alone");
    assert!(w.stored(&blob).await);

    w.clock.advance(Duration::from_secs(2));
    let (_, dry) = w.pass(true).await;
    assert_eq!(dry, [lifecycle::Action::AbortUpload(link.id)]);
    assert!(w.stored(&blob).await, "a dry run changes nothing");
    let (report, actions) = w.pass(false).await;
    assert_eq!(actions, [lifecycle::Action::AbortUpload(link.id)]);
    assert!(!w.stored(&blob).await, "the staged bytes are gone");
    // Its record goes too: closed, and as old as the reservation TTL.
    assert_eq!(report.pruned_uploads, 1);
    assert!(w
        .meta
        .upload(link.id, UploadRead::Blocks)
        .await
        .unwrap()
        .is_none());
    let err = w
        .stage(&upload, block("b"), body(b"late"), Some(4))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CacheError::UploadClosed | CacheError::UploadNotFound),
        "{err:?}"
    );
}

#[tokio::test]
async fn orphaned_chunks_are_collected_after_the_grace_period() {
    let w = world_limited(limits()).await;
    let me = who("1");
    let kept = w.save(&me, "k", b"kept").await;
    let kept_blob = w.blobs_of(kept).await.remove(0);
    let orphan = BlobName::random();
    w.blobs
        .put(&orphan, body(b"crash leftover"), None)
        .await
        .unwrap();

    let (report, _) = w.pass(false).await;
    assert!(report.orphans == 0, "a young chunk may be mid-publish");
    assert!(w.stored(&orphan).await);

    w.clock.advance(GRACE + Duration::from_secs(1));
    let (_, dry) = w.pass(true).await;
    assert_eq!(dry, [lifecycle::Action::DeleteOrphan(orphan.clone())]);
    assert!(w.stored(&orphan).await, "a dry run changes nothing");
    let (report, actions) = w.pass(false).await;
    assert_eq!(report.orphans, 1);
    assert_eq!(actions, [lifecycle::Action::DeleteOrphan(orphan.clone())]);
    assert!(!w.stored(&orphan).await);
    assert!(w.stored(&kept_blob).await, "referenced chunks stay");
    assert_eq!(w.restore(&me, "k").await.unwrap(), b"kept");
}

#[tokio::test]
async fn a_download_in_flight_survives_the_eviction_of_its_entry() {
    let w = world_limited(lifecycle::Limits {
        repo_quota: Some(4 << 20),
        ..limits()
    })
    .await;
    let me = who("1");
    let blocks: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 1 << 20]).collect();
    let first = w.save_blocks(&me, "first", &blocks).await;
    let open = w.cache.open_entry(first).await.unwrap();
    let mut reading = w.cache.read(&open, 0, open.entry.size).await.unwrap();
    let mut received = reading.next().await.unwrap().unwrap().to_vec();

    // A second save pushes the repository over its quota: the entry being read is evicted.
    w.clock.advance(Duration::from_secs(1));
    w.save_blocks(&me, "second", &blocks[..2]).await;
    assert_eq!(w.restore(&me, "first").await, None, "evicted");
    w.pass(false).await;

    while let Some(frame) = reading.next().await {
        received.extend_from_slice(&frame.unwrap());
    }
    assert_eq!(
        received,
        blocks.concat(),
        "the reader got every byte, intact"
    );
}

/// Waits for the spawned quarantine of a damaged entry to land.
async fn until_quarantined(w: &World, entry: EntryId) {
    for _ in 0..1000 {
        if w.meta
            .entry(entry, EntryState::Live)
            .await
            .unwrap()
            .is_none()
        {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("entry {entry} was not quarantined");
}

#[tokio::test]
async fn a_flipped_byte_fails_the_download_and_quarantines_the_entry() {
    let w = world_limited(limits()).await;
    let me = who("1");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let entry = w.save(&me, "k", &data).await;
    let blob = w.blobs_of(entry).await.remove(0);
    let path = w.chunk_path(&blob);
    let mut stored = std::fs::read(&path).unwrap();
    stored[123_456] ^= 0x20;
    std::fs::write(&path, stored).unwrap();

    // A chunk this small is read and checked before the download is answered: an error the
    // protocols answer with a status, naming the damage.
    let open = w.cache.open_entry(entry).await.unwrap();
    let err = w.cache.read(&open, 0, open.entry.size).await.err();
    assert!(
        matches!(&err, Some(CacheError::Damaged(how)) if how.contains("does not match its recorded checksum")),
        "the reader sees a failed download: {err:?}"
    );
    until_quarantined(&w, entry).await;
    assert_eq!(w.restore(&me, "k").await, None, "the next lookup misses");
    assert_eq!(w.cache.quarantined_count(), 1);
    // The key may be saved again.
    w.save(&me, "k", &data).await;
    assert_eq!(w.restore(&me, "k").await.unwrap(), data);
}

/// The entry `id` as an operator lists it, live or in quarantine.
async fn listed(w: &World, id: EntryId) -> crate::model::ListedEntry {
    w.cache.listed_entry(id).await.unwrap().expect("listed")
}

#[tokio::test]
async fn a_quarantined_entry_misses_downloads_whole_is_released_and_ends_with_its_retention() {
    let w = world_limited(lifecycle::Limits {
        quarantine_retention: 30 * DAY,
        ..limits()
    })
    .await;
    let me = who("1");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 249) as u8).collect();
    let kept = w.save(&me, "poisoned", &data).await;
    let ended = w.save(&me, "other", b"other bytes").await;
    let chunk = w.blobs_of(kept).await.remove(0);
    let both = [listed(&w, kept).await, listed(&w, ended).await];
    let purge = w
        .cache
        .delete_entries(&both, "test", admin::Disposal::Quarantine)
        .await
        .unwrap();
    assert_eq!(purge.count, 2);
    assert_eq!(
        w.restore(&me, "poisoned").await,
        None,
        "out of lookups at once"
    );
    let why = listed(&w, kept).await.quarantine.expect("in quarantine");
    assert_eq!(why.reason, "quarantined by test");
    let again = w
        .cache
        .delete_entries(
            &[listed(&w, kept).await],
            "test",
            admin::Disposal::Quarantine,
        )
        .await
        .unwrap();
    assert_eq!(again.count, 0, "an entry is quarantined once");

    // Its archive downloads whole, checked, as saved.
    let open = w.cache.archive(kept).await.unwrap();
    let body: Vec<Bytes> = w
        .cache
        .read(&open, 0, open.entry.size)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(body.concat(), data);

    // Released: lookups find it again, bytes intact; its chunk was never scheduled.
    w.cache.release(kept, "test").await.unwrap();
    assert_eq!(w.restore(&me, "poisoned").await.unwrap(), data);
    assert!(matches!(
        w.cache.release(kept, "test").await,
        Err(CacheError::EntryNotFound)
    ));
    w.pass(false).await;
    assert!(w.chunk_path(&chunk).exists());

    // The other one's quarantine ends with its retention, then its chunk goes after the grace.
    let other_chunk = {
        let (_, chunks) = w
            .meta
            .entry(ended, EntryState::Quarantined)
            .await
            .unwrap()
            .unwrap();
        chunks[0].chunk.blob.clone()
    };
    w.clock.advance(30 * DAY - Duration::from_secs(1));
    w.pass(false).await;
    assert!(
        w.cache.listed_entry(ended).await.unwrap().is_some(),
        "kept until its time"
    );
    w.clock.advance(Duration::from_secs(2));
    w.pass(false).await;
    assert!(
        w.cache.listed_entry(ended).await.unwrap().is_none(),
        "gone at its time"
    );
    assert!(w.chunk_path(&other_chunk).exists(), "readers get the grace");
    w.clock.advance(GRACE + Duration::from_secs(1));
    w.pass(false).await;
    assert!(!w.chunk_path(&other_chunk).exists());
}

#[tokio::test]
async fn a_damaged_entry_is_kept_in_quarantine_with_the_damage_as_its_reason() {
    let w = world_limited(limits()).await;
    let me = who("1");
    let entry = w.save(&me, "k", b"bytes to damage").await;
    w.flip_byte(entry, 0).await;
    w.cache.verify_all(|_| {}).await.unwrap();
    assert_eq!(w.restore(&me, "k").await, None);
    let why = listed(&w, entry).await.quarantine.expect("in quarantine");
    assert!(
        why.reason.contains("does not match its recorded checksum"),
        "{}",
        why.reason
    );
    assert!(w
        .meta
        .entry(entry, EntryState::Quarantined)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn a_missing_chunk_is_a_miss_never_a_short_hit() {
    let w = world_limited(limits()).await;
    let me = who("1");
    let blocks: Vec<Vec<u8>> = (0..2u8).map(|i| vec![i; 1000]).collect();
    let entry = w.save_blocks(&me, "k", &blocks).await;
    let names = w.blobs_of(entry).await;
    std::fs::remove_file(w.chunk_path(&names[1])).unwrap();
    let result = w.read_whole(entry).await;
    assert!(
        result.is_err(),
        "the stream fails where the chunk is missing"
    );
    until_quarantined(&w, entry).await;
    assert_eq!(w.restore(&me, "k").await, None);

    // A missing first chunk fails before the response starts.
    let entry = w.save_blocks(&me, "j", &blocks).await;
    let names = w.blobs_of(entry).await;
    std::fs::remove_file(w.chunk_path(&names[0])).unwrap();
    let open = w.cache.open_entry(entry).await.unwrap();
    let err = w.cache.read(&open, 0, open.entry.size).await.err().unwrap();
    assert!(matches!(err, CacheError::EntryNotFound), "{err:?}");
    assert_eq!(w.restore(&me, "j").await, None);
}

#[tokio::test]
async fn verify_finds_and_quarantines_every_damaged_entry() {
    let w = world_limited(limits()).await;
    let me = who("1");
    let good = w.save(&me, "good", b"intact bytes").await;
    let bad = w.save(&me, "bad", b"to be damaged").await;
    let gone = w.save(&me, "gone", b"to be lost").await;
    let path = w.chunk_path(&w.blobs_of(bad).await[0]);
    let mut stored = std::fs::read(&path).unwrap();
    stored[0] ^= 1;
    std::fs::write(&path, stored).unwrap();
    std::fs::remove_file(w.chunk_path(&w.blobs_of(gone).await[0])).unwrap();

    let report = w.cache.verify_all(|_| {}).await.unwrap();
    assert_eq!(report.entries, 3);
    let mut damaged: Vec<EntryId> = report.damaged.iter().map(|(id, _)| *id).collect();
    damaged.sort();
    assert_eq!(damaged, [bad, gone]);
    assert!(w
        .meta
        .entry(good, EntryState::Live)
        .await
        .unwrap()
        .is_some());
    assert_eq!(w.restore(&me, "bad").await, None);
    assert_eq!(w.restore(&me, "gone").await, None);
    assert_eq!(w.restore(&me, "good").await.unwrap(), b"intact bytes");
    let again = w.cache.verify_all(|_| {}).await.unwrap();
    assert!(again.damaged.is_empty() && again.entries == 1);
}

#[tokio::test]
async fn concurrent_saves_leave_the_repository_within_its_quota() {
    let w = Arc::new(
        world_limited(lifecycle::Limits {
            repo_quota: Some(30),
            ..limits()
        })
        .await,
    );
    let mut saves = Vec::new();
    for i in 0..16u8 {
        let w = w.clone();
        saves.push(tokio::spawn(async move {
            w.save(&who("1"), &format!("k{i}"), &[i; 10]).await
        }));
    }
    let mut ids = Vec::new();
    for save in saves {
        ids.push(save.await.unwrap());
    }
    let used = w
        .meta
        .usage(UsageOf::Repository(&RepoId::new("1")))
        .await
        .unwrap()
        .bytes;
    assert!(used <= 30, "{used} bytes kept against a quota of 30");
    assert!(used >= 10, "the latest saves are kept");
}

fn write_policy(rules: &[(&str, &str, policy::Access)]) -> policy::Policy {
    policy::Policy {
        source: None,
        stamp: None,
        promotions: Vec::new(),
        rules: rules
            .iter()
            .map(|(repository, scope, access)| policy::Rule {
                line: 1,
                repository: (*repository).into(),
                scope: (*scope).into(),
                access: *access,
                callers: None,
            })
            .collect(),
    }
}

#[tokio::test]
async fn a_frozen_scope_refuses_writes_and_still_serves_reads() {
    let w = world().await;
    let me = who("1");
    w.save(&me, "k", b"abc").await;
    w.cache
        .set_write_policy(write_policy(&[("octo/1", MAIN, policy::Access::ReadOnly)]));
    let refused = w
        .cache
        .reserve(&me, Some([192, 0, 2, 1].into()), "k2", "v")
        .await;
    let Err(e @ CacheError::WriteDeniedByPolicy(_)) = refused else {
        panic!("{refused:?}");
    };
    assert_eq!(
        e.to_string(),
        "cache write denied: refs/heads/main of octo/1 is read-only by policy rule 1"
    );
    assert!(matches!(
        w.cache.finalize(&me, "k2", "v", 3).await,
        Err(CacheError::WriteDeniedByPolicy(_))
    ));
    assert_eq!(w.restore(&me, "k").await.unwrap(), b"abc");
    // Another repository is not frozen.
    w.save(&who("2"), "k", b"def").await;
    // Lifting the freeze lets the save through.
    w.cache.set_write_policy(policy::Policy::default());
    w.save(&me, "k2", b"ghi").await;
    assert!(w.cache.write_policy().unwrap().policy.rules.is_empty());
}

#[tokio::test]
async fn a_denied_scope_is_invisible_and_all_denied_is_read_denied() {
    let w = world().await;
    let me = who("1");
    w.save(&me, "k", b"main").await;
    let mut pull = who("1");
    pull.write_scope = Some(Scope::new("refs/pull/7/merge"));
    pull.read_scopes = vec![Scope::new("refs/pull/7/merge"), Scope::new(MAIN)];
    w.save(&pull, "k", b"pull").await;
    assert_eq!(w.restore(&pull, "k").await.unwrap(), b"pull");
    w.cache
        .set_write_policy(write_policy(&[("*", "refs/pull/*", policy::Access::Deny)]));
    // The pull request's own scope is left out: main still serves it.
    assert_eq!(w.restore(&pull, "k").await.unwrap(), b"main");
    assert!(matches!(
        w.cache
            .reserve(&pull, Some([192, 0, 2, 1].into()), "k3", "v")
            .await,
        Err(CacheError::WriteDeniedByPolicy(_))
    ));
    // Denying main too leaves nothing to read.
    w.cache.set_write_policy(write_policy(&[
        ("*", "refs/pull/*", policy::Access::Deny),
        ("1", MAIN, policy::Access::Deny),
    ]));
    let lookup = Lookup::parse("k", &[], "v").unwrap();
    let refused = w.cache.lookup(&pull, None, &lookup).await;
    let Err(e @ CacheError::ReadDeniedByPolicy(_)) = refused else {
        panic!("{refused:?}");
    };
    assert!(
        e.to_string()
            .starts_with("cache read denied: refs/pull/7/merge of octo/1"),
        "{e}"
    );
    assert!(matches!(
        w.cache.list_key(&me, "k").await,
        Err(CacheError::ReadDeniedByPolicy(_))
    ));
}

/// A Put Block costs the same at the upload's ten-thousandth block as at its tenth: the
/// statements one Put Block runs through the domain (a new block id, and a retried one) do no
/// more work at 10,000 staged blocks than at 10, counted in SQLite's virtual-machine steps
/// rather than timed, so the bound (2×) holds on a loaded machine.
#[tokio::test]
async fn a_put_block_costs_the_same_at_ten_thousand_staged_blocks_as_at_ten() {
    use crate::auth::Identity;
    use crate::meta::{count_vm_steps as vm_steps, SqliteStore};

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hoard.db");
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let chunk = |size| Chunk {
        blob: crate::model::BlobName::random(),
        size,
        sha256: Some([1; 32]),
        xxh3: Some(size),
    };
    let blobs = Arc::new(crate::blob::FsStore::open(&dir.path().join("blobs")).unwrap());
    let policy = Policy {
        reservation_ttl: Duration::from_secs(24 * 3600),
        sync_interval: Duration::from_secs(30),
        max_open_uploads: 10,
        max_entry_size: 1 << 40,
        lookup_cache_ttl: Duration::from_secs(1),
        lifecycle: super::lifecycle::Limits::default(),
        stats_max_families: 100,
    };
    let clock = Arc::new(crate::model::SystemClock);
    let cache = Cache::new(store.clone(), blobs, policy, clock);
    let who = Identity {
        repository: RepoId::new("1"),
        repository_name: "octo/1".into(),
        read_scopes: vec![Scope::new("refs/heads/main")],
        write_scope: Some(Scope::new("refs/heads/main")),
        kind: crate::model::CallerKind::Hs256,
        issuer: String::new(),
        subject: "test".into(),
        run_id: "1".into(),
        job_id: "2".into(),
    };
    let link = cache.reserve(&who, None, "k", "v").await.unwrap();
    let mut upload = store
        .upload(link.id, UploadRead::Blocks)
        .await
        .unwrap()
        .unwrap()
        .upload;
    let block = |i: usize| BlockId::parse(format!("block-{i:06}").as_bytes()).unwrap();
    let body = || -> crate::model::ByteStream {
        Box::pin(futures_util::stream::iter([Ok(bytes::Bytes::from_static(
            b"x",
        ))]))
    };
    // Blocks staged straight through the store (one row each), so that the upload grows fast
    // whatever a Put Block costs.
    let mut staged = 0;
    let mut costs = Vec::new();
    for size in [10, 10_000] {
        while staged < size {
            store
                .change_upload(
                    &upload,
                    UploadChange::Stage {
                        block: &block(staged),
                        chunk: &chunk(1),
                    },
                    1,
                )
                .await
                .unwrap();
            upload.revision += 1;
            staged += 1;
        }
        let (new, put) = vm_steps(cache.put_block(link, block(staged), body(), Some(1))).await;
        put.unwrap();
        let (retried, put) = vm_steps(cache.put_block(link, block(3), body(), Some(1))).await;
        put.unwrap();
        upload.revision += 2;
        staged += 1;
        costs.push((new, retried));
    }
    let [(new_at_10, retried_at_10), (new_at_10k, retried_at_10k)] = costs[..] else {
        unreachable!()
    };
    assert!(new_at_10 > 0, "the steps are counted");
    assert!(
        new_at_10k <= 2 * new_at_10 && retried_at_10k <= 2 * retried_at_10,
        "a Put Block at 10,000 staged blocks took {new_at_10k} steps (retried: {retried_at_10k}), \
         at 10 it took {new_at_10} (retried: {retried_at_10})"
    );
}

/// A payload of more than the 64 KiB the disk store hashes with SHA-256 while writing.
fn large_payload() -> Vec<u8> {
    (0..(3u32 << 19))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

fn hasher() -> digest_pass::LowPriorityHasher {
    digest_pass::LowPriorityHasher::spawn().unwrap()
}

fn sha256_of(data: &[u8]) -> [u8; 32] {
    <sha2::Sha256 as sha2::Digest>::digest(data).into()
}

#[tokio::test]
async fn a_large_entry_gets_its_sha256_and_digest_from_the_digest_pass() {
    let w = world().await;
    let me = who("1");
    let small = w.save(&me, "small", b"hashed while written").await;
    let data = large_payload();
    let large = w.save(&me, "large", &data).await;

    // The small one has its digest at once; the large one is queued for the pass.
    let (_, chunks) = w
        .meta
        .entry(small, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        chunks[0].chunk.sha256,
        Some(sha256_of(b"hashed while written"))
    );
    let (_, chunks) = w
        .meta
        .entry(large, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(chunks[0].chunk.sha256, None, "no SHA-256 in the request");
    assert!(chunks[0].chunk.xxh3.is_some(), "but its checksum");
    let awaiting = w.meta.walk_entries(awaiting_digest(), 10).await.unwrap();
    assert_eq!(awaiting.iter().map(|e| e.id).collect::<Vec<_>>(), [large]);
    assert!(matches!(w.cache.digests.next(), digest_pass::Next::Entry(id, _) if id == large));

    // Before the pass: downloads and verify check the XXH3.
    assert_eq!(w.restore(&me, "large").await.unwrap(), data);
    let report = w.cache.verify_all(|_| {}).await.unwrap();
    assert!(report.damaged.is_empty(), "{:?}", report.damaged);

    let expected = format!("sha256:{}", hex::encode(sha256_of(&data)));
    assert_eq!(
        w.cache.digest_entry(&hasher(), large, None).await.unwrap(),
        digest_pass::Digested::Recorded(expected.clone())
    );
    let (_, chunks) = w
        .meta
        .entry(large, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(chunks[0].chunk.sha256, Some(sha256_of(&data)));
    assert!(w
        .meta
        .walk_entries(awaiting_digest(), 10)
        .await
        .unwrap()
        .is_empty());
    // Once more (a walk after a restart) changes nothing.
    assert_eq!(
        w.cache.digest_entry(&hasher(), large, None).await.unwrap(),
        digest_pass::Digested::Recorded(expected)
    );
    // After it, verify checks the SHA-256, and the entry still downloads.
    let report = w.cache.verify_all(|_| {}).await.unwrap();
    assert!(report.damaged.is_empty() && report.entries == 2);
    assert_eq!(w.restore(&me, "large").await.unwrap(), data);
}

#[tokio::test]
async fn a_block_entry_is_known_by_its_chunks_digests_once_each_is_hashed() {
    let w = world().await;
    let me = who("1");
    let blocks = vec![large_payload(), vec![5u8; 1000]];
    let entry = w.save_blocks(&me, "blocks", &blocks).await;
    let mut list = sha2::Sha256::default();
    for b in &blocks {
        sha2::Digest::update(&mut list, sha256_of(b));
    }
    let expected = format!(
        "sha256-chunks:{}",
        hex::encode(sha2::Digest::finalize(list))
    );
    assert_eq!(
        w.cache.digest_entry(&hasher(), entry, None).await.unwrap(),
        digest_pass::Digested::Recorded(expected)
    );
}

#[tokio::test]
async fn a_chunk_damaged_before_its_digest_pass_is_quarantined_never_digested() {
    let w = world_limited(limits()).await;
    let me = who("1");
    let data = large_payload();
    let entry = w.save(&me, "k", &data).await;
    w.flip_byte(entry, 1_000_000).await;

    let outcome = w.cache.digest_entry(&hasher(), entry, None).await.unwrap();
    assert!(
        matches!(outcome, digest_pass::Digested::Quarantined(_)),
        "{outcome:?}"
    );
    assert!(w
        .meta
        .entry(entry, EntryState::Live)
        .await
        .unwrap()
        .is_none());
    assert_eq!(w.restore(&me, "k").await, None, "the next lookup misses");
    assert_eq!(w.cache.quarantined_count(), 1);
    assert_eq!(
        w.cache.digest_entry(&hasher(), entry, None).await.unwrap(),
        digest_pass::Digested::Gone
    );

    // A missing chunk likewise.
    let entry = w.save(&me, "j", &data).await;
    std::fs::remove_file(w.chunk_path(&w.blobs_of(entry).await[0])).unwrap();
    let outcome = w.cache.digest_entry(&hasher(), entry, None).await.unwrap();
    assert!(
        matches!(outcome, digest_pass::Digested::Quarantined(_)),
        "{outcome:?}"
    );
}

/// The disk store seen as a store without local files (as object storage is): every call
/// passes through, and [`BlobStore::local_path`] says `None`.
#[derive(Debug)]
struct NotLocal(Arc<FsStore>);

#[async_trait::async_trait]
impl BlobStore for NotLocal {
    async fn put(
        &self,
        name: &BlobName,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<Chunk, crate::blob::BlobError> {
        self.0.put(name, body, declared_len).await
    }
    async fn get(
        &self,
        name: &BlobName,
        offset: u64,
        len: u64,
    ) -> Result<ByteStream, crate::blob::BlobError> {
        self.0.get(name, offset, len).await
    }
    async fn delete(&self, name: &BlobName) -> Result<(), crate::blob::BlobError> {
        self.0.delete(name).await
    }
    async fn list(&self) -> Result<crate::blob::NameStream, crate::blob::BlobError> {
        self.0.list().await
    }
    async fn capacity(&self) -> Result<Option<crate::blob::Capacity>, crate::blob::BlobError> {
        self.0.capacity().await
    }
    async fn ping(&self) -> Result<(), crate::blob::BlobError> {
        self.0.ping().await
    }
    async fn sync(&self, force: bool) -> Result<(), crate::blob::BlobError> {
        self.0.sync(force).await
    }
    fn note_committed(&self) {
        self.0.note_committed();
    }
    fn lost_since(&self) -> Option<crate::model::Millis> {
        self.0.lost_since()
    }
    async fn presigned_get(
        &self,
        name: &BlobName,
        ttl: Duration,
    ) -> Result<Option<url::Url>, crate::blob::BlobError> {
        self.0.presigned_get(name, ttl).await
    }
    fn kind(&self) -> &'static str {
        "not-local"
    }
}

#[tokio::test]
async fn the_digest_pass_reads_a_store_without_local_files_through_the_store() {
    let w = build_world_over(1000, 1 << 30, limits(), |blobs| Arc::new(NotLocal(blobs))).await;
    let me = who("1");
    let data = large_payload();
    let entry = w.save(&me, "k", &data).await;
    let expected = format!("sha256:{}", hex::encode(sha256_of(&data)));
    let hasher = hasher();
    assert_eq!(
        w.cache.digest_entry(&hasher, entry, None).await.unwrap(),
        digest_pass::Digested::Recorded(expected)
    );

    // A flipped byte before the pass is found there too, and the same thread then hashes the
    // next chunk from its first byte.
    let damaged = w.save(&me, "j", &data).await;
    w.flip_byte(damaged, 1_000_000).await;
    let outcome = w.cache.digest_entry(&hasher, damaged, None).await.unwrap();
    assert!(
        matches!(outcome, digest_pass::Digested::Quarantined(_)),
        "{outcome:?}"
    );
    let other: Vec<u8> = data.iter().rev().copied().collect();
    let entry = w.save(&me, "i", &other).await;
    assert_eq!(
        w.cache.digest_entry(&hasher, entry, None).await.unwrap(),
        digest_pass::Digested::Recorded(format!("sha256:{}", hex::encode(sha256_of(&other))))
    );
}

#[tokio::test]
async fn a_chunk_file_longer_than_recorded_is_digested_as_a_download_reads_it() {
    // A download reads the recorded length only; the pass reads no more of the file either.
    let w = world().await;
    let me = who("1");
    let data = large_payload();
    let entry = w.save(&me, "k", &data).await;
    let path = w.chunk_path(&w.blobs_of(entry).await[0]);
    let mut longer = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut longer, b"trailing").unwrap();
    assert_eq!(
        w.cache.digest_entry(&hasher(), entry, None).await.unwrap(),
        digest_pass::Digested::Recorded(format!("sha256:{}", hex::encode(sha256_of(&data))))
    );
}

#[tokio::test]
async fn verify_finds_a_flipped_byte_in_a_chunk_the_digest_pass_has_not_hashed() {
    let w = world_limited(limits()).await;
    let me = who("1");
    let data = large_payload();
    let entry = w.save(&me, "k", &data).await;
    w.flip_byte(entry, data.len() - 1).await;
    let report = w.cache.verify_all(|_| {}).await.unwrap();
    assert_eq!(
        report.damaged.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [entry]
    );
}

#[tokio::test]
async fn the_digest_queue_walks_at_start_and_after_an_overflow() {
    let queue = digest_pass::DigestQueue::default();
    assert!(
        matches!(queue.next(), digest_pass::Next::Walk),
        "a new process walks"
    );
    assert!(matches!(queue.next(), digest_pass::Next::Wait));
    for i in 0..digest_pass::QUEUE_CAPACITY as i64 + 1 {
        queue.push(EntryId::new(i + 1));
    }
    for i in 0..digest_pass::QUEUE_CAPACITY as i64 {
        assert!(
            matches!(queue.next(), digest_pass::Next::Entry(id, _) if id == EntryId::new(i + 1))
        );
    }
    assert!(
        matches!(queue.next(), digest_pass::Next::Walk),
        "what did not fit is found by a walk"
    );
    assert!(matches!(queue.next(), digest_pass::Next::Wait));
}

async fn has_sha256(meta: &SqliteStore, id: EntryId) -> bool {
    let (_, chunks) = meta.entry(id, EntryState::Live).await.unwrap().unwrap();
    chunks.iter().all(|c| c.chunk.sha256.is_some())
}

/// Polls (for up to 20 s, a busy machine's worst) until `id` has its SHA-256, marking a request
/// before each look when `traffic` is given.
async fn until_sha256(meta: &SqliteStore, id: EntryId, traffic: Option<&pacing::Traffic>) -> bool {
    for _ in 0..2000 {
        if let Some(traffic) = traffic {
            traffic.request_ended();
        }
        if has_sha256(meta, id).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn the_digest_pass_waits_for_a_quiet_moment_or_until_an_entry_has_waited_its_longest() {
    let mut w = world().await;
    let clock = Arc::new(ManualClock::starting_at(0));
    let traffic = Arc::new(pacing::Traffic::new(clock.clone()));
    w.cache.digests = Arc::new(digest_pass::DigestQueue::with_traffic(traffic.clone()));
    let me = who("1");
    let data = large_payload();
    traffic.request_ended();
    let first = w.save(&me, "first", &data).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let pass = w.cache.spawn_digest_pass(stop.clone());

    // Requests keep coming: the entry waits (a pass that did not would hash it in milliseconds).
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        clock.advance(Duration::from_millis(100));
        traffic.request_ended();
        assert!(!has_sha256(&w.meta, first).await, "hashed amid requests");
    }
    assert_eq!(w.cache.digests.len(), 1, "still pending");
    // Quiet for long enough: it runs.
    clock.advance(pacing::QUIET);
    assert!(
        until_sha256(&w.meta, first, None).await,
        "hashed once quiet"
    );

    // Under unbroken requests, an entry runs once it has waited its longest.
    traffic.request_ended();
    let second = w.save(&me, "second", &data).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    traffic.request_ended();
    assert!(!has_sha256(&w.meta, second).await, "hashed amid requests");
    clock.advance(pacing::MAX_DEFERRAL);
    assert!(
        until_sha256(&w.meta, second, Some(&traffic)).await,
        "hashed once overdue, requests or not"
    );
    // The pass counts the entry as pending until just after it records the digest.
    for _ in 0..2000 {
        if w.cache.digests.len() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(w.cache.digests.len(), 0);
    stop.cancel();
    pass.await.unwrap();
}

#[tokio::test]
async fn the_hashing_thread_waits_before_each_block_while_a_request_is_in_flight() {
    let w = world().await;
    let me = who("1");
    let data = large_payload();
    let entry = w.save(&me, "large", &data).await;
    let (_, chunks) = w
        .meta
        .entry(entry, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    let chunk = chunks[0].chunk.clone();
    let path = w.blobs.local_path(&chunk.blob).unwrap();
    let clock = Arc::new(ManualClock::starting_at(0));
    let traffic = Arc::new(pacing::Traffic::new(clock.clone()));
    let queued = traffic.now();
    let download = traffic.begin();

    let hasher = hasher();
    let hashing = hasher.file(path, &chunk, Some((traffic.clone(), queued)));
    tokio::pin!(hashing);
    let early = tokio::time::timeout(Duration::from_millis(300), &mut hashing).await;
    assert!(early.is_err(), "hashed while a request was in flight");
    drop(download);
    clock.advance(pacing::QUIET);
    match hashing.await.unwrap() {
        digest_pass::Hashed::Intact(sha256) => assert_eq!(sha256, sha256_of(&data)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_hashing_thread_runs_in_the_idle_class() {
    const SCHED_IDLE: &str = "5";
    let _hasher = hasher();
    // The thread sets its class as it starts; look for it for up to 20 s on a busy machine.
    let policy = (0..2000).find_map(|_| {
        let found = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(Result::ok)
            .find(|task| {
                std::fs::read_to_string(task.path().join("comm"))
                    .is_ok_and(|comm| comm.trim() == "hoard-digest")
            })
            .and_then(|task| std::fs::read_to_string(task.path().join("stat")).ok())
            .and_then(|stat| {
                // Field 41 is the policy; the fields after the name start at field 3.
                let after_name = stat.rsplit_once(") ")?.1.to_owned();
                after_name.split(' ').nth(41 - 3).map(str::to_owned)
            })
            .filter(|policy| policy == SCHED_IDLE);
        if found.is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        found
    });
    assert_eq!(policy.as_deref(), Some(SCHED_IDLE));
}

/// The digest pass's walk from the start.
fn awaiting_digest() -> EntryWalk<'static> {
    EntryWalk::AwaitingDigest {
        after: EntryId::new(0),
    }
}

/// A damaged chunk is never served through an entry that shares it: quarantining the entry it
/// was found in quarantines its promoted copy too, and the other way round.
#[tokio::test]
async fn a_damaged_entry_takes_the_entries_sharing_its_chunks_into_quarantine() {
    const QUEUE: &str = "refs/heads/gh-readonly-queue/main/pr-3-abc";
    let w = world().await;
    let queue = who_in("7", QUEUE);
    let main = who("7");
    let source = w.save(&queue, "deps", b"queue bytes").await;
    let (from, to) = (Scope::new(QUEUE), Scope::new(MAIN));
    let report = w
        .cache
        .promote(&promotion::PromotionRequest {
            repository: &RepoId::new("7"),
            from_scope: &from,
            to_scope: &to,
            written_after: None,
            by: "test-delivery",
            cause: "",
            dry_run: false,
        })
        .await
        .unwrap();
    let copy = report.promoted[0].id.unwrap();
    assert_eq!(
        w.restore(&main, "deps").await.as_deref(),
        Some(&b"queue bytes"[..])
    );

    assert!(w
        .cache
        .quarantine(source, "a flipped byte".into())
        .await
        .unwrap());
    for id in [source, copy] {
        assert!(
            w.meta.entry(id, EntryState::Live).await.unwrap().is_none(),
            "{id:?} left"
        );
        assert!(w
            .meta
            .entry(id, EntryState::Quarantined)
            .await
            .unwrap()
            .is_some());
    }
    assert_eq!(
        w.restore(&main, "deps").await,
        None,
        "the copy is not served"
    );
    assert_eq!(w.restore(&queue, "deps").await, None);
}
