//! `SaveStore`: reservations, staging, commits, aborts and finalize, under concurrency and at stale revisions.

use super::*;

pub async fn run(store: Arc<dyn MetaStore>) {
    reservations_of_one_slot_have_one_winner_under_concurrency(store.clone()).await;
    an_abandoned_upload_is_replaced_only_at_the_revision_loaded(store.as_ref()).await;
    blocks_stage_commit_and_finalize_into_an_entry(store.as_ref()).await;
    staged_totals_follow_every_change_to_the_blocks(store.as_ref()).await;
    changes_at_an_old_revision_or_to_a_closed_upload_change_nothing(store.as_ref()).await;
    a_second_entry_for_a_slot_is_refused_and_leaves_nothing_behind(store.as_ref()).await;
    longest_keys_and_versions_fit(store.as_ref()).await;
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
                            written_by: &writer("racer"),
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
                written_by: &writer("racer"),
                now: 2,
            },
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, MetaError::Conflict), "{err:?}");
    let state = store.slot_state(&s, reserving(0)).await.unwrap();
    assert!(state.open.is_some() && !state.entry_exists);
    assert_eq!(state.live_open_uploads, 1);
    assert_eq!(
        store
            .slot_state(&s, reserving(2))
            .await
            .unwrap()
            .live_open_uploads,
        0
    );
}

async fn an_abandoned_upload_is_replaced_only_at_the_revision_loaded(store: &dyn MetaStore) {
    let s = slot("takeover", "k");
    let old = reserve(store, &s, 10).await;
    store
        .change_upload(
            &old,
            UploadChange::Stage {
                block: &block("a"),
                chunk: &chunk(5),
            },
            11,
        )
        .await
        .unwrap();
    // `old` as loaded before the block was staged: its revision is out of date.
    let err = store
        .create_upload(
            NewUpload {
                slot: &s,
                written_by: &writer("b"),
                now: 20,
            },
            Some(&old),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, MetaError::Stale), "{err:?}");
    let current = upload_of(store, old.id).await.unwrap();
    assert!(current.is_open(), "a refused takeover changes nothing");
    assert!(
        current.revision > old.revision,
        "staging bumps the revision"
    );

    let new = store
        .create_upload(
            NewUpload {
                slot: &s,
                written_by: &writer("b"),
                now: 20,
            },
            Some(&current),
        )
        .await
        .unwrap();
    let aborted = upload_of(store, old.id).await.unwrap();
    assert_eq!(aborted.state, UploadState::Aborted);
    let UploadView { blocks, .. } = store
        .upload(old.id, UploadRead::Blocks)
        .await
        .unwrap()
        .unwrap();
    assert!(
        blocks.staged.is_empty(),
        "an aborted upload keeps no blocks"
    );
    let state = store.slot_state(&s, reserving(0)).await.unwrap();
    assert_eq!(state.open.map(|u| u.id), Some(new));
}

async fn blocks_stage_commit_and_finalize_into_an_entry(store: &dyn MetaStore) {
    let s = slot("life", "Life-Key");
    let upload = reserve(store, &s, 100).await;
    assert_eq!(upload.key, "Life-Key");
    assert_eq!(upload.state, UploadState::Open);
    let (a, b, a2) = (chunk(3), chunk(4), chunk(5));
    store
        .change_upload(
            &upload,
            UploadChange::Stage {
                block: &block("a"),
                chunk: &a,
            },
            101,
        )
        .await
        .unwrap();
    let upload = upload_of(store, upload.id).await.unwrap();
    store
        .change_upload(
            &upload,
            UploadChange::Stage {
                block: &block("b"),
                chunk: &b,
            },
            102,
        )
        .await
        .unwrap();
    let upload = upload_of(store, upload.id).await.unwrap();
    // A retried block id replaces the earlier copy.
    store
        .change_upload(
            &upload,
            UploadChange::Stage {
                block: &block("a"),
                chunk: &a2,
            },
            103,
        )
        .await
        .unwrap();
    let UploadView { upload, blocks, .. } = store
        .upload(upload.id, UploadRead::Blocks)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(blocks.staged.len(), 2);
    assert_eq!(blocks.staged[&block("a")], a2);
    assert!(blocks.parts.is_empty());

    let parts = vec![(block("b"), b.clone()), (block("a"), a2.clone())];
    store
        .change_upload(&upload, UploadChange::Commit(&parts), 104)
        .await
        .unwrap();
    let UploadView { upload, blocks, .. } = store
        .upload(upload.id, UploadRead::Blocks)
        .await
        .unwrap()
        .unwrap();
    assert!(blocks.staged.is_empty(), "a commit drops staged blocks");
    assert_eq!(blocks.parts, parts, "parts keep the committed order");

    let state = store.slot_state(&s, SlotRead::Finalize).await.unwrap();
    assert_eq!(state.open.as_ref(), Some(&upload));
    assert_eq!(state.blocks, blocks);
    assert_eq!(state.finalized, None);
    let chunks = vec![b.clone(), a2.clone()];
    let entry = store
        .finalize(
            Some(&upload),
            NewEntry {
                key: "Life-Key",
                record: EntryRecord {
                    written_by: upload.written_by.clone(),
                    ..EntryRecord::default()
                },
                ..NewEntry::new(&s, &chunks, 105)
            },
        )
        .await
        .unwrap();

    let (e, stored) = store.entry(entry, EntryState::Live).await.unwrap().unwrap();
    assert_eq!((e.key.as_str(), e.size, e.created_at), ("Life-Key", 9, 105));
    assert_eq!((e.repository.as_str(), e.scope.as_str()), ("life", MAIN));
    let layout: Vec<(u64, Chunk)> = stored.into_iter().map(|c| (c.start, c.chunk)).collect();
    assert_eq!(
        layout,
        [(0, b), (4, a2)],
        "chunks in order with their offsets"
    );
    let done = upload_of(store, upload.id).await.unwrap();
    assert_eq!(done.state, UploadState::Finalized);
    let state = store.slot_state(&s, SlotRead::Finalize).await.unwrap();
    assert_eq!(state.open, None);
    assert_eq!(
        state.finalized,
        Some((entry, 9)),
        "a retried finalize finds its entry"
    );
    let slot_state = store.slot_state(&s, reserving(0)).await.unwrap();
    assert!(slot_state.entry_exists && slot_state.open.is_none());
    assert_eq!(
        lookup(store, "life", &["life-key"]).await,
        [("Life-Key".into(), entry)]
    );
    assert!(store
        .entry(EntryId::new(entry.get() + 1_000_000), EntryState::Live)
        .await
        .unwrap()
        .is_none());
}

/// What a Put Block is decided on: the staged count and bytes, kept with the upload, and the
/// one block's copy.
async fn block_state(
    store: &dyn MetaStore,
    id: UploadId,
    b: &str,
) -> (u64, u64, Option<Chunk>, bool) {
    let UploadView { block: state, .. } = store
        .upload(id, UploadRead::Block(&block(b)))
        .await
        .unwrap()
        .unwrap();
    (
        state.staged_count,
        state.staged_bytes,
        state.copy,
        state.copy_committed,
    )
}

async fn staged_totals_follow_every_change_to_the_blocks(store: &dyn MetaStore) {
    let s = slot("totals", "k");
    let upload = reserve(store, &s, 1).await;
    assert_eq!(
        block_state(store, upload.id, "a").await,
        (0, 0, None, false)
    );
    let (a, b, a2) = (chunk(3), chunk(4), chunk(10));
    store
        .change_upload(
            &upload,
            UploadChange::Stage {
                block: &block("a"),
                chunk: &a,
            },
            2,
        )
        .await
        .unwrap();
    let upload = upload_of(store, upload.id).await.unwrap();
    store
        .change_upload(
            &upload,
            UploadChange::Stage {
                block: &block("b"),
                chunk: &b,
            },
            3,
        )
        .await
        .unwrap();
    let loaded = upload_of(store, upload.id).await.unwrap();
    assert_eq!(
        block_state(store, upload.id, "a").await,
        (2, 7, Some(a.clone()), false)
    );
    assert_eq!(
        block_state(store, upload.id, "c").await,
        (2, 7, None, false)
    );
    // A retry replaces the copy: one block still, of the new size.
    store
        .change_upload(
            &loaded,
            UploadChange::Stage {
                block: &block("a"),
                chunk: &a2,
            },
            4,
        )
        .await
        .unwrap();
    assert_eq!(
        block_state(store, upload.id, "a").await,
        (2, 14, Some(a2.clone()), false)
    );
    // A stale change counts nothing.
    let stale = store
        .change_upload(
            &loaded,
            UploadChange::Stage {
                block: &block("c"),
                chunk: &chunk(1),
            },
            5,
        )
        .await;
    assert!(matches!(stale, Err(MetaError::Stale)), "{stale:?}");
    assert_eq!(
        block_state(store, upload.id, "c").await,
        (2, 14, None, false)
    );

    // A commit drops the staged blocks and their totals; a block staged with a committed
    // part's chunk says so.
    let upload = upload_of(store, upload.id).await.unwrap();
    store
        .change_upload(&upload, UploadChange::Commit(&[(block("b"), b.clone())]), 6)
        .await
        .unwrap();
    assert_eq!(
        block_state(store, upload.id, "b").await,
        (0, 0, None, false)
    );
    let upload = upload_of(store, upload.id).await.unwrap();
    store
        .change_upload(
            &upload,
            UploadChange::Stage {
                block: &block("b"),
                chunk: &b,
            },
            7,
        )
        .await
        .unwrap();
    assert_eq!(
        block_state(store, upload.id, "b").await,
        (1, 4, Some(b), true)
    );

    let upload = upload_of(store, upload.id).await.unwrap();
    store
        .change_upload(&upload, UploadChange::Abort, 8)
        .await
        .unwrap();
    assert_eq!(
        block_state(store, upload.id, "b").await,
        (0, 0, None, false)
    );
    assert!(store
        .upload(
            UploadId::new(upload.id.get() + 1_000_000),
            UploadRead::Block(&block("b"))
        )
        .await
        .unwrap()
        .is_none());
}

async fn changes_at_an_old_revision_or_to_a_closed_upload_change_nothing(store: &dyn MetaStore) {
    let s = slot("stale", "k");
    let loaded = reserve(store, &s, 1).await;
    store
        .change_upload(
            &loaded,
            UploadChange::Stage {
                block: &block("a"),
                chunk: &chunk(1),
            },
            2,
        )
        .await
        .unwrap();
    for result in [
        store
            .change_upload(
                &loaded,
                UploadChange::Stage {
                    block: &block("b"),
                    chunk: &chunk(1),
                },
                3,
            )
            .await,
        store
            .change_upload(&loaded, UploadChange::Commit(&[(block("a"), chunk(1))]), 3)
            .await,
        store.change_upload(&loaded, UploadChange::Abort, 3).await,
    ] {
        assert!(matches!(result, Err(MetaError::Stale)), "{result:?}");
    }
    let stale_finalize = store
        .finalize(
            Some(&loaded),
            NewEntry {
                key: "k",
                record: EntryRecord {
                    written_by: loaded.written_by.clone(),
                    ..EntryRecord::default()
                },
                ..NewEntry::new(&s, &[chunk(1)], 3)
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
    let UploadView {
        upload: current,
        blocks,
        ..
    } = store
        .upload(loaded.id, UploadRead::Blocks)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(blocks.staged.keys().collect::<Vec<_>>(), [&block("a")]);
    assert!(blocks.parts.is_empty());

    store
        .change_upload(&current, UploadChange::Abort, 4)
        .await
        .unwrap();
    let closed = upload_of(store, current.id).await.unwrap();
    assert_eq!(closed.state, UploadState::Aborted);
    let late = store
        .change_upload(
            &closed,
            UploadChange::Stage {
                block: &block("c"),
                chunk: &chunk(1),
            },
            5,
        )
        .await;
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
        .change_upload(&second, UploadChange::Commit(&[(block("x"), chunk(10))]), 3)
        .await
        .unwrap();
    let second = upload_of(store, second.id).await.unwrap();
    let err = store
        .finalize(
            Some(&second),
            NewEntry {
                key: "k",
                record: EntryRecord {
                    written_by: second.written_by.clone(),
                    ..EntryRecord::default()
                },
                ..NewEntry::new(&s, &[chunk(10)], 4)
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, MetaError::Conflict), "{err:?}");
    let after = upload_of(store, second.id).await.unwrap();
    assert_eq!(after, second, "a refused finalize changes nothing");
    assert_eq!(lookup(store, "twice", &["k"]).await, [("k".into(), first)]);
    let (e, chunks) = store.entry(first, EntryState::Live).await.unwrap().unwrap();
    assert_eq!((e.size, chunks.len()), (10, 1));
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
        assert_eq!(
            store
                .entry(id, EntryState::Live)
                .await
                .unwrap()
                .unwrap()
                .0
                .key,
            *key
        );
    }
}

/// What a reservation reads, counting uploads open since `live_since`.
fn reserving(live_since: i64) -> SlotRead {
    SlotRead::Reserve { live_since }
}
