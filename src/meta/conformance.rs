//! The [`MetaStore`] contract as executable checks, run against every implementation (SQLite,
//! PostgreSQL, MySQL/MariaDB and the in-memory fake): each backend's test opens a fresh store and
//! calls [`run_all`]. A check panics with a sentence naming the broken promise.
#![allow(clippy::unwrap_used, clippy::panic)] // Test code: failing loudly is the point.

use std::sync::Arc;

use super::{
    EntryFilter, EntryOrder, EntryPage, MetaError, MetaStore, NewEntry, NewUpload, Removal,
    RepositoryUsage,
};
use crate::model::{
    BlobName, BlockId, CacheKey, Chunk, RemovalCause, RepoId, Scope, Slot, Upload, UploadState,
    Version,
};

const MAIN: &str = "refs/heads/main";

/// Runs every check on `store`, which must be empty. Each check uses its own repository.
pub async fn run_all(store: Arc<dyn MetaStore>) {
    store.ping().await.unwrap();
    reservations_of_one_slot_have_one_winner_under_concurrency(store.clone()).await;
    an_abandoned_upload_is_replaced_only_at_the_revision_loaded(store.as_ref()).await;
    blocks_stage_commit_and_finalize_into_an_entry(store.as_ref()).await;
    changes_at_an_old_revision_or_to_a_closed_upload_change_nothing(store.as_ref()).await;
    a_second_entry_for_a_slot_is_refused_and_leaves_nothing_behind(store.as_ref()).await;
    keys_match_case_insensitively_and_nothing_else_is_folded(store.as_ref()).await;
    prefix_matches_are_byte_wise_and_newest_first(store.as_ref()).await;
    repositories_scopes_and_versions_are_separate(store.as_ref()).await;
    listings_find_every_version_of_a_key_in_one_scope(store.as_ref()).await;
    longest_keys_and_versions_fit(store.as_ref()).await;
    restores_are_recorded(store.as_ref()).await;
    usage_follows_finalize_and_removal(store.as_ref()).await;
    totals_count_bytes_entries_and_open_uploads(store.as_ref()).await;
    removed_chunks_wait_for_their_deletion_time(store.as_ref()).await;
    least_recently_used_come_first(store.as_ref()).await;
    expiry_finds_unused_and_old_entries(store.as_ref()).await;
    removals_race_and_count_once(store.clone()).await;
    references_cover_every_table(store.as_ref()).await;
    abandoned_uploads_are_found_and_closed_ones_pruned(store.as_ref()).await;
    operators_filter_sort_and_page_entries(store.as_ref()).await;
    repositories_keep_names_usage_hits_and_misses(store.as_ref()).await;
    forgetting_after_a_crash_drops_new_entries_and_open_uploads(store.as_ref()).await;
    store.checkpoint().await.unwrap();
}

fn slot(repo: &str, key: &str) -> Slot {
    slot_in(repo, MAIN, key, "v1")
}

fn slot_in(repo: &str, scope: &str, key: &str, version: &str) -> Slot {
    Slot {
        repository: RepoId::new(repo),
        scope: Scope::new(scope),
        key: CacheKey::parse(key).unwrap(),
        version: Version::parse(version).unwrap(),
    }
}

fn chunk(size: u64) -> Chunk {
    let mut sha256 = [0u8; 32];
    sha256[..8].copy_from_slice(&size.to_le_bytes());
    Chunk {
        blob: BlobName::random(),
        size,
        sha256,
        // Checksums use all 64 bits (stored signed), and may be missing (older rows).
        xxh3: (size != 1).then(|| size.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
    }
}

fn block(id: &str) -> BlockId {
    BlockId::parse(id.as_bytes()).unwrap()
}

async fn reserve(store: &dyn MetaStore, slot: &Slot, now: i64) -> Upload {
    let id = store
        .create_upload(
            NewUpload {
                slot,
                created_by: "conformance",
                now,
            },
            None,
        )
        .await
        .unwrap();
    store.upload(id).await.unwrap().unwrap()
}

/// Reserves, commits one chunk per size and finalizes at `now`; returns the entry id.
async fn save(store: &dyn MetaStore, slot: &Slot, sizes: &[u64], now: i64) -> i64 {
    save_named(store, slot, sizes, now, "").await
}

/// [`save`] by a caller that names the repository `name`.
async fn save_named(
    store: &dyn MetaStore,
    slot: &Slot,
    sizes: &[u64],
    now: i64,
    name: &str,
) -> i64 {
    let upload = reserve(store, slot, now).await;
    let parts: Vec<(BlockId, Chunk)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| (block(&format!("b{i}")), chunk(s)))
        .collect();
    store.commit_parts(&upload, &parts, now).await.unwrap();
    let upload = store.upload(upload.id).await.unwrap().unwrap();
    let chunks: Vec<Chunk> = parts.into_iter().map(|(_, c)| c).collect();
    let entry = NewEntry {
        slot,
        key: slot.key.as_str(),
        repository_name: name,
        chunks: &chunks,
        now,
    };
    store.finalize(&upload, entry).await.unwrap()
}

async fn lookup(store: &dyn MetaStore, repo: &str, keys: &[&str]) -> Vec<(String, i64)> {
    let folded: Vec<String> = keys.iter().map(|k| k.to_lowercase()).collect();
    let mut found: Vec<(String, i64)> = store
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

/// The best match for one folded key, as the domain would pick it: exact, else newest prefix.
async fn best(store: &dyn MetaStore, repo: &str, key: &str) -> Option<String> {
    let candidates = store
        .find_candidates(
            &RepoId::new(repo),
            &Version::parse("v1").unwrap(),
            &[Scope::new(MAIN)],
            &[key.to_lowercase()],
        )
        .await
        .unwrap();
    // The domain's choice for one key in one scope (restated here: meta must not import cache).
    let folded = key.to_lowercase();
    candidates
        .iter()
        .find(|c| c.key_folded == folded)
        .or_else(|| {
            candidates
                .iter()
                .filter(|c| c.key_folded.starts_with(&folded))
                .max_by_key(|c| (c.created_at, c.id))
        })
        .map(|c| c.key.clone())
}

async fn reservations_of_one_slot_have_one_winner_under_concurrency(store: Arc<dyn MetaStore>) {
    let s = slot("race", "race-key");
    let attempts: Vec<_> = (0..16)
        .map(|_| {
            let (store, s) = (store.clone(), s.clone());
            tokio::spawn(async move {
                store
                    .create_upload(
                        NewUpload {
                            slot: &s,
                            created_by: "racer",
                            now: 1,
                        },
                        None,
                    )
                    .await
            })
        })
        .collect();
    let mut won = 0;
    for attempt in attempts {
        match attempt.await.unwrap() {
            Ok(_) => won += 1,
            Err(MetaError::Conflict) => {}
            Err(e) => panic!("a losing reservation must be a Conflict, not {e:?}"),
        }
    }
    assert_eq!(won, 1, "exactly one concurrent reservation of a slot wins");
    // Case folding is part of the slot.
    let other_case = slot("race", "RACE-KEY");
    let err = store
        .create_upload(
            NewUpload {
                slot: &other_case,
                created_by: "racer",
                now: 2,
            },
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, MetaError::Conflict), "{err:?}");
    let state = store.slot_state(&s, 0).await.unwrap();
    assert!(state.open.is_some() && !state.entry_exists);
    assert_eq!(state.live_open_uploads, 1);
    assert_eq!(store.slot_state(&s, 2).await.unwrap().live_open_uploads, 0);
}

async fn an_abandoned_upload_is_replaced_only_at_the_revision_loaded(store: &dyn MetaStore) {
    let s = slot("takeover", "k");
    let old = reserve(store, &s, 10).await;
    store
        .stage_block(&old, &block("a"), &chunk(5), 11)
        .await
        .unwrap();
    // `old` as loaded before the block was staged: its revision is out of date.
    let err = store
        .create_upload(
            NewUpload {
                slot: &s,
                created_by: "b",
                now: 20,
            },
            Some(&old),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, MetaError::Stale), "{err:?}");
    let current = store.upload(old.id).await.unwrap().unwrap();
    assert!(current.is_open(), "a refused takeover changes nothing");
    assert!(
        current.revision > old.revision,
        "staging bumps the revision"
    );

    let new = store
        .create_upload(
            NewUpload {
                slot: &s,
                created_by: "b",
                now: 20,
            },
            Some(&current),
        )
        .await
        .unwrap();
    let aborted = store.upload(old.id).await.unwrap().unwrap();
    assert_eq!(aborted.state, UploadState::Aborted);
    let (_, blocks) = store.upload_with_blocks(old.id).await.unwrap().unwrap();
    assert!(
        blocks.staged.is_empty(),
        "an aborted upload keeps no blocks"
    );
    let state = store.slot_state(&s, 0).await.unwrap();
    assert_eq!(state.open.map(|u| u.id), Some(new));
}

async fn blocks_stage_commit_and_finalize_into_an_entry(store: &dyn MetaStore) {
    let s = slot("life", "Life-Key");
    let upload = reserve(store, &s, 100).await;
    assert_eq!(upload.key, "Life-Key");
    assert_eq!(upload.state, UploadState::Open);
    let (a, b, a2) = (chunk(3), chunk(4), chunk(5));
    store
        .stage_block(&upload, &block("a"), &a, 101)
        .await
        .unwrap();
    let upload = store.upload(upload.id).await.unwrap().unwrap();
    store
        .stage_block(&upload, &block("b"), &b, 102)
        .await
        .unwrap();
    let upload = store.upload(upload.id).await.unwrap().unwrap();
    // A retried block id replaces the earlier copy.
    store
        .stage_block(&upload, &block("a"), &a2, 103)
        .await
        .unwrap();
    let (upload, blocks) = store.upload_with_blocks(upload.id).await.unwrap().unwrap();
    assert_eq!(blocks.staged.len(), 2);
    assert_eq!(blocks.staged[&block("a")], a2);
    assert!(blocks.parts.is_empty());

    let parts = vec![(block("b"), b.clone()), (block("a"), a2.clone())];
    store.commit_parts(&upload, &parts, 104).await.unwrap();
    let (upload, blocks) = store.upload_with_blocks(upload.id).await.unwrap().unwrap();
    assert!(blocks.staged.is_empty(), "a commit drops staged blocks");
    assert_eq!(blocks.parts, parts, "parts keep the committed order");

    let state = store.finalize_state(&s).await.unwrap();
    assert_eq!(state.open, Some((upload.clone(), blocks)));
    assert_eq!(state.finalized, None);
    let chunks = vec![b.clone(), a2.clone()];
    let entry = store
        .finalize(
            &upload,
            NewEntry {
                repository_name: "",
                slot: &s,
                key: "Life-Key",
                chunks: &chunks,
                now: 105,
            },
        )
        .await
        .unwrap();

    let (e, stored) = store.entry(entry).await.unwrap().unwrap();
    assert_eq!((e.key.as_str(), e.size, e.created_at), ("Life-Key", 9, 105));
    assert_eq!((e.repository.as_str(), e.scope.as_str()), ("life", MAIN));
    let layout: Vec<(u64, Chunk)> = stored.into_iter().map(|c| (c.start, c.chunk)).collect();
    assert_eq!(
        layout,
        [(0, b), (4, a2)],
        "chunks in order with their offsets"
    );
    let done = store.upload(upload.id).await.unwrap().unwrap();
    assert_eq!(done.state, UploadState::Finalized);
    let state = store.finalize_state(&s).await.unwrap();
    assert_eq!(state.open, None);
    assert_eq!(
        state.finalized,
        Some((entry, 9)),
        "a retried finalize finds its entry"
    );
    let slot_state = store.slot_state(&s, 0).await.unwrap();
    assert!(slot_state.entry_exists && slot_state.open.is_none());
    assert_eq!(
        lookup(store, "life", &["life-key"]).await,
        [("Life-Key".into(), entry)]
    );
    assert!(store.entry(entry + 1_000_000).await.unwrap().is_none());
}

async fn changes_at_an_old_revision_or_to_a_closed_upload_change_nothing(store: &dyn MetaStore) {
    let s = slot("stale", "k");
    let loaded = reserve(store, &s, 1).await;
    store
        .stage_block(&loaded, &block("a"), &chunk(1), 2)
        .await
        .unwrap();
    for result in [
        store.stage_block(&loaded, &block("b"), &chunk(1), 3).await,
        store
            .commit_parts(&loaded, &[(block("a"), chunk(1))], 3)
            .await,
        store.abort_upload(&loaded, 3).await,
    ] {
        assert!(matches!(result, Err(MetaError::Stale)), "{result:?}");
    }
    let stale_finalize = store
        .finalize(
            &loaded,
            NewEntry {
                repository_name: "",
                slot: &s,
                key: "k",
                chunks: &[chunk(1)],
                now: 3,
            },
        )
        .await;
    assert!(
        matches!(stale_finalize, Err(MetaError::Stale)),
        "{stale_finalize:?}"
    );
    assert!(
        lookup(store, "stale", &["k"]).await.is_empty(),
        "no entry from a stale finalize"
    );
    let (current, blocks) = store.upload_with_blocks(loaded.id).await.unwrap().unwrap();
    assert_eq!(blocks.staged.keys().collect::<Vec<_>>(), [&block("a")]);
    assert!(blocks.parts.is_empty());

    store.abort_upload(&current, 4).await.unwrap();
    let closed = store.upload(current.id).await.unwrap().unwrap();
    assert_eq!(closed.state, UploadState::Aborted);
    let late = store.stage_block(&closed, &block("c"), &chunk(1), 5).await;
    assert!(
        matches!(late, Err(MetaError::Stale)),
        "a closed upload takes no blocks: {late:?}"
    );
}

async fn a_second_entry_for_a_slot_is_refused_and_leaves_nothing_behind(store: &dyn MetaStore) {
    let s = slot("twice", "k");
    let first = save(store, &s, &[10], 1).await;
    // The store enforces one open upload per slot; refusing a reservation because an entry
    // exists is the domain's rule, so a second upload can be opened and must fail at finalize.
    let second = reserve(store, &s, 2).await;
    store
        .commit_parts(&second, &[(block("x"), chunk(10))], 3)
        .await
        .unwrap();
    let second = store.upload(second.id).await.unwrap().unwrap();
    let err = store
        .finalize(
            &second,
            NewEntry {
                repository_name: "",
                slot: &s,
                key: "k",
                chunks: &[chunk(10)],
                now: 4,
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, MetaError::Conflict), "{err:?}");
    let after = store.upload(second.id).await.unwrap().unwrap();
    assert_eq!(after, second, "a refused finalize changes nothing");
    assert_eq!(lookup(store, "twice", &["k"]).await, [("k".into(), first)]);
    let (e, chunks) = store.entry(first).await.unwrap().unwrap();
    assert_eq!((e.size, chunks.len()), (10, 1));
}

async fn keys_match_case_insensitively_and_nothing_else_is_folded(store: &dyn MetaStore) {
    let repo = "fold";
    let upper = save(store, &slot(repo, "Node-LINUX"), &[1], 1).await;
    // Distinct from every folded collation's point of view: trailing space, accents, width.
    let spaced = save(store, &slot(repo, "k "), &[1], 2).await;
    let plain = save(store, &slot(repo, "k"), &[1], 3).await;
    let accented = save(store, &slot(repo, "café"), &[1], 4).await;
    let unaccented = save(store, &slot(repo, "cafe"), &[1], 5).await;
    let sharp = save(store, &slot(repo, "straße"), &[1], 6).await;
    let german = save(store, &slot(repo, "strasse"), &[1], 7).await;

    assert_eq!(
        best(store, repo, "node-linux").await.as_deref(),
        Some("Node-LINUX")
    );
    assert_eq!(
        best(store, repo, "NODE-linux").await.as_deref(),
        Some("Node-LINUX")
    );
    let exact = |key: &str| {
        let key = key.to_lowercase();
        async move {
            store
                .find_candidates(
                    &RepoId::new(repo),
                    &Version::parse("v1").unwrap(),
                    &[Scope::new(MAIN)],
                    std::slice::from_ref(&key),
                )
                .await
                .unwrap()
                .into_iter()
                .filter(|c| c.key_folded == key)
                .map(|c| c.id)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(exact("Node-Linux").await, [upper]);
    assert_eq!(exact("k").await, [plain], "a trailing space is significant");
    assert_eq!(exact("k ").await, [spaced]);
    assert_eq!(exact("café").await, [accented], "accents are significant");
    assert_eq!(exact("cafe").await, [unaccented]);
    assert_eq!(exact("straße").await, [sharp], "ß is not ss");
    assert_eq!(exact("strasse").await, [german]);
}

async fn prefix_matches_are_byte_wise_and_newest_first(store: &dyn MetaStore) {
    let repo = "prefix";
    save(store, &slot(repo, "npm-1"), &[1], 10).await;
    save(store, &slot(repo, "npm-3"), &[1], 30).await;
    save(store, &slot(repo, "npm-2"), &[1], 20).await;
    save(store, &slot(repo, "npm"), &[1], 40).await;
    save(store, &slot(repo, "npn-9"), &[1], 50).await;
    save(store, &slot(repo, "npm-\u{1F600}"), &[1], 25).await;
    save(store, &slot(repo, "npm-é"), &[1], 26).await;
    save(store, &slot(repo, "npm-%_"), &[1], 27).await;
    // Same millisecond: the later entry (larger id) wins.
    save(store, &slot(repo, "tie-a"), &[1], 60).await;
    save(store, &slot(repo, "tie-b"), &[1], 60).await;

    assert_eq!(best(store, repo, "npm-").await.as_deref(), Some("npm-3"));
    assert_eq!(
        best(store, repo, "npm").await.as_deref(),
        Some("npm"),
        "exact beats newer"
    );
    assert_eq!(best(store, repo, "np").await.as_deref(), Some("npn-9"));
    assert_eq!(best(store, repo, "npm-\u{1F6}").await, None);
    assert_eq!(
        best(store, repo, "npm-\u{1F600}").await.as_deref(),
        Some("npm-\u{1F600}")
    );
    assert_eq!(best(store, repo, "NPM-É").await.as_deref(), Some("npm-é"));
    // LIKE wildcards in a key are plain characters.
    assert_eq!(best(store, repo, "npm-%").await.as_deref(), Some("npm-%_"));
    assert_eq!(best(store, repo, "npm-_").await, None);
    assert_eq!(best(store, repo, "tie-").await.as_deref(), Some("tie-b"));
    assert_eq!(best(store, repo, "zzz").await, None);
}

async fn repositories_scopes_and_versions_are_separate(store: &dyn MetaStore) {
    save(store, &slot_in("iso-a", MAIN, "k", "v1"), &[1], 1).await;
    save(
        store,
        &slot_in("iso-b", "refs/heads/other", "k", "v1"),
        &[1],
        1,
    )
    .await;
    save(store, &slot_in("iso-c", MAIN, "k", "v2"), &[1], 1).await;
    assert_eq!(lookup(store, "iso-a", &["k"]).await.len(), 1);
    assert!(
        lookup(store, "iso-b", &["k"]).await.is_empty(),
        "other scope"
    );
    assert!(
        lookup(store, "iso-c", &["k"]).await.is_empty(),
        "other version"
    );
    assert!(
        lookup(store, "iso-d", &["k"]).await.is_empty(),
        "other repository"
    );
    // The same key may be saved once per scope and version.
    save(
        store,
        &slot_in("iso-a", "refs/heads/other", "k", "v1"),
        &[1],
        2,
    )
    .await;
    save(store, &slot_in("iso-a", MAIN, "k", "v2"), &[1], 2).await;
}

async fn listings_find_every_version_of_a_key_in_one_scope(store: &dyn MetaStore) {
    let v1 = save(store, &slot_in("list", MAIN, "Deps", "v1"), &[3], 10).await;
    let v2 = save(store, &slot_in("list", MAIN, "deps", "v2"), &[4], 20).await;
    let v3 = save(store, &slot_in("list", MAIN, "DEPS", "v3"), &[5], 30).await;
    save(store, &slot_in("list", MAIN, "deps-longer", "v1"), &[1], 40).await;
    save(
        store,
        &slot_in("list", "refs/heads/dev", "deps", "v1"),
        &[1],
        50,
    )
    .await;
    save(store, &slot_in("list-other", MAIN, "deps", "v1"), &[1], 60).await;
    let (repo, main) = (RepoId::new("list"), Scope::new(MAIN));
    let found = store
        .entries_with_key(&repo, &main, "deps", 10)
        .await
        .unwrap();
    let ids: Vec<i64> = found.iter().map(|e| e.id).collect();
    assert_eq!(
        ids,
        [v3, v2, v1],
        "newest first, exact key, one scope, one repository"
    );
    assert_eq!(
        (
            found[0].key.as_str(),
            found[0].version.as_str(),
            found[0].size
        ),
        ("DEPS", "v3", 5),
        "entries come back as stored"
    );
    let two = store
        .entries_with_key(&repo, &main, "deps", 2)
        .await
        .unwrap();
    assert_eq!(two.len(), 2, "at most the limit");
    assert!(
        store
            .entries_with_key(&repo, &main, "dep", 10)
            .await
            .unwrap()
            .is_empty(),
        "no prefix matching"
    );
}

async fn longest_keys_and_versions_fit(store: &dyn MetaStore) {
    let repo = "long";
    // 512 characters of 3 and 4 UTF-8 bytes, a 512-byte version and a long ref.
    let wide = "€".repeat(511) + "x";
    let widest = "\u{1F600}".repeat(512);
    let version = "f".repeat(512);
    let scope = format!("refs/heads/{}", "b".repeat(240));
    for key in [&wide, &widest] {
        let s = slot_in(repo, &scope, key, &version);
        let id = save(store, &s, &[1], 1).await;
        let found = store
            .find_candidates(
                &RepoId::new(repo),
                &s.version,
                std::slice::from_ref(&s.scope),
                &[key[..key.len() - 4].to_lowercase()],
            )
            .await
            .unwrap();
        assert!(
            found.iter().any(|c| c.id == id && &c.key == key),
            "a long key is found by prefix"
        );
        assert_eq!(store.entry(id).await.unwrap().unwrap().0.key, *key);
    }
}

async fn restores_are_recorded(store: &dyn MetaStore) {
    let id = save(store, &slot("hits", "k"), &[1], 100).await;
    store
        .record_hits(&[(id, 2, 150), (id, 1, 120), (id + 1_000_000, 5, 1)])
        .await
        .unwrap();
    let (entry, _) = store.entry(id).await.unwrap().unwrap();
    assert_eq!((entry.hits, entry.last_used_at), (3, 150));
}

async fn forgetting_after_a_crash_drops_new_entries_and_open_uploads(store: &dyn MetaStore) {
    let old = save(store, &slot("forget", "old"), &[1], 1_000).await;
    let new = save(store, &slot("forget", "new"), &[1], 3_000).await;
    let (_, new_chunks) = store.entry(new).await.unwrap().unwrap();
    let open = reserve(store, &slot("forget", "open"), 3_000).await;
    let staged = chunk(7);
    store
        .stage_block(&open, &block("a"), &staged, 3_001)
        .await
        .unwrap();

    let (forgotten, garbage) = store.forget_after(2_000, 4_000).await.unwrap();
    assert!(forgotten >= 1);
    assert!(store.entry(old).await.unwrap().is_some());
    assert!(store.entry(new).await.unwrap().is_none());
    assert!(garbage.contains(&new_chunks[0].chunk.blob));
    assert!(garbage.contains(&staged.blob));
    let open = store.upload(open.id).await.unwrap().unwrap();
    assert_eq!(open.state, UploadState::Aborted);
    assert_eq!(
        store
            .repository_usage(&RepoId::new("forget"))
            .await
            .unwrap(),
        1,
        "usage is recounted after forgetting"
    );
}

fn removal(cause: &RemovalCause, delete_at: i64) -> Removal<'_> {
    Removal {
        cause,
        now: delete_at - 100,
        delete_at,
    }
}

async fn totals_count_bytes_entries_and_open_uploads(store: &dyn MetaStore) {
    let before = store.totals().await.unwrap();
    save(store, &slot("lc-totals", "a"), &[3, 4], 1).await;
    let open = reserve(store, &slot("lc-totals", "b"), 2).await;
    let after = store.totals().await.unwrap();
    assert_eq!(after.bytes, before.bytes + 7, "bytes of the new entry");
    assert_eq!(after.entries, before.entries + 1, "one entry more");
    assert_eq!(
        after.open_uploads,
        before.open_uploads + 1,
        "one open upload more"
    );
    store.abort_upload(&open, 3).await.unwrap();
    let closed = store.totals().await.unwrap();
    assert_eq!(
        closed.open_uploads, before.open_uploads,
        "an aborted upload is not open"
    );
    assert_eq!(closed.bytes, store.total_usage().await.unwrap());
}

async fn usage_follows_finalize_and_removal(store: &dyn MetaStore) {
    let repo = RepoId::new("lc-usage");
    let total_before = store.total_usage().await.unwrap();
    assert_eq!(store.repository_usage(&repo).await.unwrap(), 0);
    let one = save(store, &slot("lc-usage", "one"), &[100], 1).await;
    save(store, &slot("lc-usage", "two"), &[50, 150], 2).await;
    save(store, &slot("lc-usage", "three"), &[300], 3).await;
    assert_eq!(store.repository_usage(&repo).await.unwrap(), 600);
    assert_eq!(store.total_usage().await.unwrap(), total_before + 600);

    let evicted = RemovalCause::Evicted;
    let removed = store
        .remove_entries(&[one], removal(&evicted, 5_000))
        .await
        .unwrap();
    assert_eq!(removed.len(), 1);
    assert_eq!((removed[0].id, removed[0].size), (one, 100));
    assert_eq!(removed[0].repository, repo);
    assert!(store.entry(one).await.unwrap().is_none(), "removed at once");
    assert!(lookup(store, "lc-usage", &["one"]).await.is_empty());
    assert_eq!(store.repository_usage(&repo).await.unwrap(), 500);
    assert_eq!(store.total_usage().await.unwrap(), total_before + 500);
    let again = store
        .remove_entries(&[one], removal(&evicted, 5_000))
        .await
        .unwrap();
    assert!(
        again.is_empty(),
        "an entry already gone is not removed twice"
    );
    assert_eq!(store.repository_usage(&repo).await.unwrap(), 500);
}

async fn removed_chunks_wait_for_their_deletion_time(store: &dyn MetaStore) {
    let id = save(store, &slot("lc-delete", "k"), &[10, 20], 1).await;
    let (_, chunks) = store.entry(id).await.unwrap().unwrap();
    let names: Vec<BlobName> = chunks.iter().map(|c| c.chunk.blob.clone()).collect();
    let pending_before = store.pending_deletions().await.unwrap();
    let cause = RemovalCause::Quarantined("a flipped byte".into());
    store
        .remove_entries(&[id], removal(&cause, 7_000_000))
        .await
        .unwrap();
    assert_eq!(
        store.pending_deletions().await.unwrap(),
        pending_before + 30
    );
    let early = store.due_deletions(6_999_999, 100_000).await.unwrap();
    assert!(
        names.iter().all(|n| !early.contains(n)),
        "not due before its time"
    );
    let due = store.due_deletions(7_000_000, 100_000).await.unwrap();
    assert!(names.iter().all(|n| due.contains(n)), "due at its time");
    assert_eq!(
        store.referenced(&names).await.unwrap().len(),
        2,
        "a pending deletion still refers to its chunks"
    );
    store.deletions_done(&names).await.unwrap();
    assert!(store.referenced(&names).await.unwrap().is_empty());
    let due = store.due_deletions(7_000_000, 100_000).await.unwrap();
    assert!(names.iter().all(|n| !due.contains(n)), "done is forgotten");
    assert_eq!(store.pending_deletions().await.unwrap(), pending_before);
}

async fn least_recently_used_come_first(store: &dyn MetaStore) {
    let repo = RepoId::new("lc-lru");
    let a = save(store, &slot("lc-lru", "a"), &[1], 10).await;
    let b = save(store, &slot("lc-lru", "b"), &[1], 20).await;
    let c = save(store, &slot("lc-lru", "c"), &[1], 30).await;
    store.record_hits(&[(a, 1, 40)]).await.unwrap();
    let ids =
        |found: Vec<crate::model::EntryUse>| found.into_iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.least_recently_used(Some(&repo), 10).await.unwrap()),
        [b, c, a],
        "a restore makes an entry recent"
    );
    assert_eq!(
        ids(store.least_recently_used(Some(&repo), 2).await.unwrap()),
        [b, c]
    );
    let all = store.least_recently_used(None, 100_000).await.unwrap();
    assert!(
        all.windows(2)
            .all(|w| (w[0].last_used_at, w[0].id) <= (w[1].last_used_at, w[1].id)),
        "across repositories, in order of last use"
    );
    let mine: Vec<i64> = all
        .iter()
        .filter(|e| e.repository == repo)
        .map(|e| e.id)
        .collect();
    assert_eq!(mine, [b, c, a]);
}

async fn expiry_finds_unused_and_old_entries(store: &dyn MetaStore) {
    let unused = save(store, &slot("lc-exp", "unused"), &[1], 5).await;
    let used = save(store, &slot("lc-exp", "used"), &[1], 6).await;
    store.record_hits(&[(used, 1, 9_000_000)]).await.unwrap();
    let ids =
        |found: Vec<crate::model::EntryUse>| found.into_iter().map(|e| e.id).collect::<Vec<_>>();
    let found = ids(store.expired(7, None, 100_000).await.unwrap());
    assert!(found.contains(&unused));
    assert!(!found.contains(&used), "a recent restore keeps an entry");
    let found = ids(store.expired(i64::MIN, Some(7), 100_000).await.unwrap());
    assert!(found.contains(&used), "too old expires, used or not");
    assert!(found.contains(&unused));
    assert!(!ids(store.expired(i64::MIN, Some(5), 100_000).await.unwrap()).contains(&unused));
    assert_eq!(
        store.expired(7, Some(7), 1).await.unwrap().len(),
        1,
        "limited"
    );
}

async fn removals_race_and_count_once(store: Arc<dyn MetaStore>) {
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(save(store.as_ref(), &slot("lc-race", &format!("k{i}")), &[10], i).await);
    }
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (store, ids) = (store.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            let cause = RemovalCause::Expired;
            store
                .remove_entries(&ids, removal(&cause, 1_000))
                .await
                .unwrap()
        }));
    }
    let mut removed = 0;
    for task in tasks {
        removed += task.await.unwrap().len();
    }
    assert_eq!(removed, 8, "every entry is removed exactly once");
    assert_eq!(
        store
            .repository_usage(&RepoId::new("lc-race"))
            .await
            .unwrap(),
        0
    );
}

async fn references_cover_every_table(store: &dyn MetaStore) {
    let staged = chunk(1);
    let committed = chunk(2);
    let upload = reserve(store, &slot("lc-refs", "open"), 1).await;
    store
        .stage_block(&upload, &block("s"), &staged, 1)
        .await
        .unwrap();
    let upload = store.upload(upload.id).await.unwrap().unwrap();
    let other = reserve(store, &slot("lc-refs", "other"), 1).await;
    store
        .commit_parts(&other, &[(block("c"), committed.clone())], 1)
        .await
        .unwrap();
    let entry = save(store, &slot("lc-refs", "entry"), &[3], 1).await;
    let (_, chunks) = store.entry(entry).await.unwrap().unwrap();
    let stray = BlobName::random();
    let names = vec![
        staged.blob.clone(),
        committed.blob.clone(),
        chunks[0].chunk.blob.clone(),
        stray.clone(),
    ];
    let mut found = store.referenced(&names).await.unwrap();
    found.sort();
    let mut expected = names[..3].to_vec();
    expected.sort();
    assert_eq!(found, expected, "only the stray chunk is unreferenced");
    store.abort_upload(&upload, 2).await.unwrap();
    assert!(!store
        .referenced(std::slice::from_ref(&staged.blob))
        .await
        .unwrap()
        .contains(&staged.blob));
    assert_eq!(
        store.entry_ids(entry - 1, 1).await.unwrap(),
        [entry],
        "entries are walked in id order"
    );
}

async fn abandoned_uploads_are_found_and_closed_ones_pruned(store: &dyn MetaStore) {
    let open = reserve(store, &slot("lc-stale", "open"), 2).await;
    let fresh = reserve(store, &slot("lc-stale", "fresh"), 9_000_000).await;
    let done = reserve(store, &slot("lc-stale", "done"), 2).await;
    store.abort_upload(&done, 3).await.unwrap();
    let stale = store.stale_uploads(4, 100_000).await.unwrap();
    assert!(stale.contains(&open.id));
    assert!(!stale.contains(&done.id), "closed uploads are not stale");
    assert!(!stale.contains(&fresh.id));
    assert!(store.prune_uploads(4).await.unwrap() >= 1);
    assert!(store.upload(done.id).await.unwrap().is_none(), "pruned");
    assert!(
        store.upload(open.id).await.unwrap().is_some(),
        "open uploads stay"
    );
}

/// The ids a listing returns, page by page until it runs out, `limit` at a time.
async fn list_ids(
    store: &dyn MetaStore,
    filter: &EntryFilter,
    order: EntryOrder,
    descending: bool,
    limit: usize,
) -> Vec<Vec<i64>> {
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = EntryPage {
            filter,
            order,
            descending,
            after,
            limit,
        };
        let listed = store.list_entries(&page).await.unwrap();
        let Some(last) = listed.last() else {
            return pages;
        };
        after = Some((order.value_of(&last.entry), last.entry.id));
        pages.push(listed.iter().map(|l| l.entry.id).collect());
        assert!(pages.len() < 100, "paging does not end");
    }
}

async fn operators_filter_sort_and_page_entries(store: &dyn MetaStore) {
    let dev = "refs/heads/dev";
    let a = save_named(
        store,
        &slot_in("adm", MAIN, "Linux-npm-1", "v1"),
        &[10],
        100,
        "octo/adm",
    )
    .await;
    let b = save(
        store,
        &slot_in("adm", MAIN, "linux-npm-2", "v2"),
        &[30],
        200,
    )
    .await;
    let c = save(store, &slot_in("adm", dev, "linux-cargo", "v1"), &[20], 300).await;
    let d = save(
        store,
        &slot_in("adm", MAIN, "windows-npm", "v1"),
        &[20],
        400,
    )
    .await;
    save(store, &slot("adm-other", "linux-npm-9"), &[5], 500).await;
    store.record_hits(&[(a, 1, 1000)]).await.unwrap();

    let repo = EntryFilter {
        repository: Some("adm".into()),
        ..EntryFilter::default()
    };
    let by_name = EntryFilter {
        repository: Some("octo/adm".into()),
        ..EntryFilter::default()
    };
    assert_eq!(
        store.count_entries(&repo).await.unwrap(),
        4,
        "count by repository id"
    );
    assert_eq!(
        store.count_entries(&by_name).await.unwrap(),
        4,
        "a repository is found by the name its first caller gave, which later callers without one keep"
    );
    assert_eq!(
        list_ids(store, &repo, EntryOrder::LastUsed, true, 10).await,
        vec![vec![a, d, c, b]],
        "most recently used first (a restore counts)"
    );
    assert_eq!(
        list_ids(store, &repo, EntryOrder::LastUsed, true, 3).await,
        vec![vec![a, d, c], vec![b]],
        "pages continue where the last one ended"
    );
    assert_eq!(
        list_ids(store, &repo, EntryOrder::Size, false, 2).await,
        vec![vec![a, c], vec![d, b]],
        "ties in the sort value are ordered by id, also across a page boundary"
    );
    assert_eq!(
        list_ids(store, &repo, EntryOrder::Size, true, 2).await,
        vec![vec![b, d], vec![c, a]],
        "descending ties go by id descending"
    );
    assert_eq!(
        list_ids(store, &repo, EntryOrder::Created, false, 10).await,
        vec![vec![a, b, c, d]]
    );
    let prefix = EntryFilter {
        folded_key_prefix: Some("linux-npm".into()),
        ..repo.clone()
    };
    assert_eq!(
        list_ids(store, &prefix, EntryOrder::Created, false, 10).await,
        vec![vec![a, b]],
        "a key prefix matches folded keys, within the repository"
    );
    let scoped = EntryFilter {
        scope: Some(Scope::new(dev)),
        ..repo.clone()
    };
    assert_eq!(
        list_ids(store, &scoped, EntryOrder::Created, false, 10).await,
        vec![vec![c]]
    );
    let exact = EntryFilter {
        repository_id: Some("adm".into()),
        folded_key_prefix: Some("linux-npm".into()),
        ..EntryFilter::default()
    };
    assert_eq!(
        list_ids(store, &exact, EntryOrder::Created, false, 10).await,
        vec![vec![a, b]],
        "an exact repository id"
    );
    let by_name_as_id = EntryFilter {
        repository_id: Some("octo/adm".into()),
        ..EntryFilter::default()
    };
    assert_eq!(
        store.count_entries(&by_name_as_id).await.unwrap(),
        0,
        "ids are not names"
    );
    let versioned = EntryFilter {
        version: Some("v2".into()),
        ..repo.clone()
    };
    assert_eq!(
        list_ids(store, &versioned, EntryOrder::Created, false, 10).await,
        vec![vec![b]]
    );
    assert_eq!(store.count_entries(&versioned).await.unwrap(), 1);

    let page = EntryPage {
        filter: &repo,
        order: EntryOrder::Created,
        descending: false,
        after: None,
        limit: 1,
    };
    let listed = store.list_entries(&page).await.unwrap();
    assert_eq!(
        listed[0].repository_name, "octo/adm",
        "listings carry the repository's name"
    );
    assert_eq!(
        listed[0].entry.key, "Linux-npm-1",
        "keys are listed as the client spelled them"
    );
    assert_eq!((listed[0].entry.size, listed[0].entry.hits), (10, 1));
}

async fn repositories_keep_names_usage_hits_and_misses(store: &dyn MetaStore) {
    let a = save_named(store, &slot("rep-a", "k"), &[100], 10, "octo/a").await;
    save(store, &slot("rep-a", "k2"), &[50], 11).await;
    store.record_hits(&[(a, 3, 20)]).await.unwrap();
    store
        .record_misses(&[
            (RepoId::new("rep-a"), String::new(), 2),
            (RepoId::new("rep-b"), "octo/b".into(), 4),
        ])
        .await
        .unwrap();
    store
        .record_misses(&[(RepoId::new("rep-b"), String::new(), 1)])
        .await
        .unwrap();
    let usage = |repository: &str, name: &str, counts: [u64; 4]| RepositoryUsage {
        repository: RepoId::new(repository),
        name: name.into(),
        bytes: counts[0],
        entries: counts[1],
        hits: counts[2],
        misses: counts[3],
    };
    assert_eq!(
        store.repositories(Some("octo/a"), 10).await.unwrap(),
        vec![usage("rep-a", "octo/a", [150, 2, 3, 2])],
        "a repository's bytes, entries, hits and misses, found by name"
    );
    assert_eq!(
        store.repositories(Some("rep-b"), 10).await.unwrap(),
        vec![usage("rep-b", "octo/b", [0, 0, 0, 5])],
        "a repository that only missed is listed, by id"
    );
    let all = store.repositories(None, 10_000).await.unwrap();
    assert!(
        all.windows(2).all(|w| w[0].bytes >= w[1].bytes),
        "most bytes first"
    );
    let position = |id: &str| {
        all.iter()
            .position(|r| r.repository.as_str() == id)
            .unwrap()
    };
    assert!(position("rep-a") < position("rep-b"));
    assert_eq!(store.count_repositories().await.unwrap(), all.len() as u64);
    assert_eq!(
        store.repositories(None, 1).await.unwrap().len(),
        1,
        "the limit holds"
    );
}
