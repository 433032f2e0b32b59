//! Promotion: an entry made of chunks stored already (another entry's), with where it came
//! from; the chunks it shares go only when no entry names them any more.

use super::*;

pub async fn run(store: &dyn MetaStore) {
    a_promoted_entry_shares_the_chunks_and_records_its_origin(store).await;
    a_shared_chunk_is_deleted_only_when_no_entry_names_it(store).await;
}

const QUEUE: &str = "refs/heads/gh-readonly-queue/main/pr-7-abc";

fn origin(by: &str) -> Promotion {
    Promotion {
        from_scope: Scope::new(QUEUE),
        by: by.into(),
        cause: format!("merge_group:{QUEUE}"),
    }
}

/// Promotes entry `id` of `from` into `to` at `now` as `by`, as the domain does.
async fn promote(
    store: &dyn MetaStore,
    id: EntryId,
    to: &Slot,
    by: &Promotion,
    now: i64,
) -> Result<EntryId, MetaError> {
    let (entry, chunks) = store.entry(id, EntryState::Live).await.unwrap().unwrap();
    let chunks: Vec<Chunk> = chunks.into_iter().map(|c| c.chunk).collect();
    let new = NewEntry {
        key: &entry.key,
        record: EntryRecord {
            promotion: Some(by.clone()),
            ..EntryRecord::default()
        },
        ..NewEntry::new(to, &chunks, now)
    };
    store.finalize(None, new).await
}

async fn listed_promotion(
    store: &dyn MetaStore,
    id: EntryId,
    quarantined: bool,
) -> Option<Promotion> {
    let filter = EntryFilter {
        id: Some(id),
        quarantined,
        ..EntryFilter::default()
    };
    let page = EntryPage::by_creation(&filter, 1);
    let found = store.select_entries(&page).await.unwrap().entries;
    found.into_iter().next().expect("listed").record.promotion
}

async fn a_promoted_entry_shares_the_chunks_and_records_its_origin(store: &dyn MetaStore) {
    let repo = "promo-origin";
    let source = save(
        store,
        &slot_in(repo, QUEUE, "Linux-npm-1", "v1"),
        &[5, 7],
        10,
    )
    .await;
    let before = store
        .usage(UsageOf::Repository(&RepoId::new(repo)))
        .await
        .unwrap();
    let by = origin("delivery-1");
    let target = slot(repo, "Linux-npm-1");
    let promoted = promote(store, source, &target, &by, 20).await.unwrap();
    assert_ne!(promoted, source, "an entry of its own");

    assert_eq!(
        lookup(store, repo, &["linux-npm-1"]).await,
        [("Linux-npm-1".to_owned(), promoted)],
        "the base branch finds it by its key"
    );
    let (_, source_chunks) = store
        .entry(source, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    let (entry, chunks) = store
        .entry(promoted, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((entry.scope.as_str(), entry.size), (MAIN, 12));
    let names = |c: &[hoard::meta::EntryChunk]| -> Vec<(u64, BlobName)> {
        c.iter().map(|c| (c.start, c.chunk.blob.clone())).collect()
    };
    assert_eq!(
        names(&chunks),
        names(&source_chunks),
        "the same chunks, no byte copied"
    );
    assert_eq!(
        listed_promotion(store, promoted, false).await,
        Some(by.clone())
    );
    assert_eq!(
        listed_promotion(store, source, false).await,
        None,
        "the source is not promoted"
    );
    let after = store
        .usage(UsageOf::Repository(&RepoId::new(repo)))
        .await
        .unwrap();
    assert_eq!(
        after.bytes,
        before.bytes + 12,
        "it counts against the quota"
    );

    // Only what one promotion made: the filter by `promoted_by`.
    let of_delivery = EntryFilter {
        promoted_by: Some("delivery-1".into()),
        ..EntryFilter::default()
    };
    let found = listed_where(store, of_delivery).await;
    assert_eq!(
        found.iter().map(|l| l.entry.id).collect::<Vec<_>>(),
        [promoted]
    );

    // The entries made of one chunk: the source and its copy.
    let blob = chunks[0].chunk.blob.as_str().to_owned();
    let sharing = EntryFilter {
        chunk: Some(blob),
        ..EntryFilter::default()
    };
    let mut found: Vec<EntryId> = listed_where(store, sharing)
        .await
        .iter()
        .map(|l| l.entry.id)
        .collect();
    found.sort();
    assert_eq!(found, [source, promoted]);

    // An entry the target holds already stays: a second promotion conflicts.
    match promote(store, source, &target, &origin("delivery-2"), 30).await {
        Err(MetaError::Conflict) => {}
        other => panic!("a taken slot conflicts, not {other:?}"),
    }

    // Quarantine keeps the origin, and a release brings it back.
    let cause = RemovalCause::Quarantined("suspect".into());
    let removal = Removal {
        from: EntryState::Live,
        cause: &cause,
        now: 40,
        delete_at: 1_040,
    };
    store
        .move_entries(&[promoted], EntryMove::Remove(removal))
        .await
        .unwrap();
    assert_eq!(
        listed_promotion(store, promoted, true).await,
        Some(by.clone())
    );
    store
        .move_entries(&[promoted], EntryMove::Release)
        .await
        .unwrap();
    assert_eq!(listed_promotion(store, promoted, false).await, Some(by));
}

async fn a_shared_chunk_is_deleted_only_when_no_entry_names_it(store: &dyn MetaStore) {
    let repo = "promo-shared";
    let source = save(store, &slot_in(repo, QUEUE, "k", "v1"), &[9], 10).await;
    let promoted = promote(store, source, &slot(repo, "k"), &origin("delivery-3"), 20)
        .await
        .unwrap();
    let (_, chunks) = store
        .entry(source, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    let blob = chunks[0].chunk.blob.clone();
    let deleted = RemovalCause::Deleted;
    let removal = |now| Removal {
        from: EntryState::Live,
        cause: &deleted,
        now,
        delete_at: now + 100,
    };

    // The queue's entry goes (a destroyed group): the promoted one still names the chunk.
    store
        .move_entries(&[source], EntryMove::Remove(removal(30)))
        .await
        .unwrap();
    let due = store.take_deletions(&[], 9_000, 100_000).await.unwrap();
    assert!(
        !due.contains(&blob),
        "a chunk an entry still names is never due"
    );
    let (_, kept) = store
        .entry(promoted, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept[0].chunk.blob, blob);

    // Then the promoted one goes: nothing names the chunk, and it is due.
    store
        .move_entries(&[promoted], EntryMove::Remove(removal(50)))
        .await
        .unwrap();
    let due = store.take_deletions(&[], 9_000, 100_000).await.unwrap();
    assert!(due.contains(&blob), "due once no entry names it");
    store
        .take_deletions(std::slice::from_ref(&blob), 9_000, 0)
        .await
        .unwrap();
    assert!(
        store
            .referenced(std::slice::from_ref(&blob))
            .await
            .unwrap()
            .is_empty(),
        "deleted for good"
    );
}
