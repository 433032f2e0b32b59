//! The metadata store contract as executable checks, one part per store trait, run against
//! every implementation (SQLite, PostgreSQL, MySQL/MariaDB): each backend's
//! test opens a fresh store and calls [`run_all`]. A check panics with a sentence naming the
//! broken promise. Each check uses its own repository, so the parts share one store.

mod admin;
mod lifecycle;
mod promotion;
mod provenance;
mod quarantine;
mod restore;
mod save;
mod stats;
mod webhooks;

pub use std::sync::Arc;

pub use hoard::meta::{
    EntryMove, EntryState, EntryWalk, LifecycleStore, MetaError, MetaStore, NewEntry, NewUpload,
    Removal, RestoreBound, RestoreDrop, SlotRead, UploadChange, UploadRead, UploadSweep,
    UploadView, UsageOf, Uses,
};
pub use hoard::model::{
    BlobName, BlockId, CacheKey, CallerKind, Chunk, EntryFilter, EntryId, EntryOrder, EntryPage,
    EntryRecord, Promotion, Provenance, QuotaUsage, RemovalCause, RepoId, RepositoryUsage, Scope,
    ScopeClass, Slot, Upload, UploadId, UploadState, Version,
};

pub const MAIN: &str = "refs/heads/main";

/// How many entries `filter` selects, as a listing counts them.
pub async fn count_of(store: &dyn MetaStore, filter: &EntryFilter) -> u64 {
    let page = EntryPage {
        count: true,
        ..EntryPage::by_creation(filter, 0)
    };
    let selected = store.select_entries(&page).await.unwrap();
    assert!(selected.entries.is_empty(), "a page of none lists none");
    selected.total.expect("a total when asked")
}

/// The entries `filter` selects, by creation (at most 100), after checking that the count
/// agrees with the listing.
pub async fn listed_where(
    store: &dyn MetaStore,
    filter: EntryFilter,
) -> Vec<hoard::model::ListedEntry> {
    let page = EntryPage::by_creation(&filter, 100);
    let found = store.select_entries(&page).await.unwrap().entries;
    assert_eq!(
        count_of(store, &filter).await,
        found.len() as u64,
        "the count agrees with the listing for {filter:?}"
    );
    found
}

/// Restores to record, and nothing else.
pub fn just_hits(hits: &[(EntryId, u64, i64)]) -> Uses {
    Uses {
        hits: hits.to_vec(),
        ..Uses::default()
    }
}

/// Lookups that found nothing, and nothing else.
pub fn just_misses(misses: &[(RepoId, String, u64)]) -> Uses {
    Uses {
        misses: misses.to_vec(),
        ..Uses::default()
    }
}

/// Restore records, and nothing else.
pub fn just_restores(restores: &[hoard::meta::NewRestore]) -> Uses {
    Uses {
        restores: restores.to_vec(),
        ..Uses::default()
    }
}

/// The upload `id`, in whatever state, without its blocks.
pub async fn upload_of(store: &dyn MetaStore, id: UploadId) -> Option<Upload> {
    store
        .upload(id, UploadRead::Blocks)
        .await
        .unwrap()
        .map(|view| view.upload)
}

/// Runs every part on `store`, which must be empty.
pub async fn run_all(store: Arc<dyn MetaStore>) {
    store.ping().await.unwrap();
    save::run(store.clone()).await;
    restore::run(store.as_ref()).await;
    lifecycle::run(store.clone()).await;
    admin::run(store.as_ref()).await;
    provenance::run(store.as_ref()).await;
    quarantine::run(store.as_ref()).await;
    promotion::run(store.as_ref()).await;
    stats::run(store.as_ref()).await;
    webhooks::run(store.as_ref()).await;
    store.checkpoint().await.unwrap();
}

/// A GitHub writer named `subject`, in run 1 job 2.
pub fn writer(subject: &str) -> Provenance {
    Provenance {
        kind: CallerKind::Github,
        issuer: "https://token.actions.githubusercontent.com".into(),
        subject: subject.into(),
        run_id: "1".into(),
        job_id: "2".into(),
        address: "192.0.2.1".into(),
    }
}

pub fn slot(repo: &str, key: &str) -> Slot {
    slot_in(repo, MAIN, key, "v1")
}

pub fn slot_in(repo: &str, scope: &str, key: &str, version: &str) -> Slot {
    Slot {
        repository: RepoId::new(repo),
        scope: Scope::new(scope),
        key: CacheKey::parse(key).unwrap(),
        version: Version::parse(version).unwrap(),
    }
}

pub fn chunk(size: u64) -> Chunk {
    let mut sha256 = [0xffu8; 32];
    sha256[..8].copy_from_slice(&size.to_le_bytes());
    Chunk {
        blob: BlobName::random(),
        size,
        // Not yet known for some (the digest pass records it later), never for none.
        sha256: (size != 2).then_some(sha256),
        // Checksums use all 64 bits (stored signed), and may be missing (older rows).
        xxh3: (size != 1).then(|| size.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
    }
}

pub fn block(id: &str) -> BlockId {
    BlockId::parse(id.as_bytes()).unwrap()
}

pub async fn reserve(store: &dyn MetaStore, slot: &Slot, now: i64) -> Upload {
    let id = store
        .create_upload(
            NewUpload {
                slot,
                written_by: &writer("conformance"),
                now,
            },
            None,
        )
        .await
        .unwrap();
    upload_of(store, id).await.unwrap()
}

/// Reserves, commits one chunk per size and finalizes at `now`; returns the entry id.
pub async fn save(store: &dyn MetaStore, slot: &Slot, sizes: &[u64], now: i64) -> EntryId {
    save_named(store, slot, sizes, now, "").await
}

/// [`save`] by a caller that names the repository `name`.
pub async fn save_named(
    store: &dyn MetaStore,
    slot: &Slot,
    sizes: &[u64],
    now: i64,
    name: &str,
) -> EntryId {
    let upload = reserve(store, slot, now).await;
    let parts: Vec<(BlockId, Chunk)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| (block(&format!("b{i}")), chunk(s)))
        .collect();
    store
        .change_upload(&upload, UploadChange::Commit(&parts), now)
        .await
        .unwrap();
    let upload = upload_of(store, upload.id).await.unwrap();
    let chunks: Vec<Chunk> = parts.into_iter().map(|(_, c)| c).collect();
    let entry = NewEntry {
        repository_name: name,
        record: EntryRecord {
            written_by: upload.written_by.clone(),
            ..EntryRecord::default()
        },
        ..NewEntry::new(slot, &chunks, now)
    };
    store.finalize(Some(&upload), entry).await.unwrap()
}

pub async fn lookup(store: &dyn MetaStore, repo: &str, keys: &[&str]) -> Vec<(String, EntryId)> {
    let folded: Vec<String> = keys.iter().map(|k| k.to_lowercase()).collect();
    let mut found: Vec<(String, EntryId)> = store
        .find_candidates(
            &RepoId::new(repo),
            &Version::parse("v1").unwrap(),
            &[Scope::new(MAIN)],
            &folded,
        )
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.key, c.id))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The ids of entries a walk or a move answered, in order.
pub fn ids(entries: &[hoard::model::EntryUse]) -> Vec<EntryId> {
    entries.iter().map(|e| e.id).collect()
}
