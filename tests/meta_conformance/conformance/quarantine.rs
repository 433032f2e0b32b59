//! Quarantine: an entry out of every lookup, kept whole (row, writer, chunks) until it is
//! released or its quarantine ends.

use super::*;

pub async fn run(store: &dyn MetaStore) {
    a_quarantined_entry_leaves_lookups_and_keeps_everything(store).await;
    a_release_puts_the_entry_back_unless_its_slot_is_taken(store).await;
    a_release_of_several_moves_all_or_none(store).await;
    the_end_of_a_quarantine_schedules_its_chunks(store).await;
}

fn quarantine(reason: &str) -> RemovalCause {
    RemovalCause::Quarantined(reason.into())
}

fn at(cause: &RemovalCause, now: i64) -> Removal<'_> {
    Removal {
        from: EntryState::Live,
        cause,
        now,
        delete_at: now + 1000,
    }
}

/// Ends the quarantine of `ids` (their chunks deleted at 5,000); the ids whose quarantine ended.
async fn end_quarantine(store: &dyn MetaStore, ids: &[EntryId]) -> Vec<EntryId> {
    let removal = Removal {
        from: EntryState::Quarantined,
        ..at(&RemovalCause::Expired, 4_000)
    };
    let ended = store
        .move_entries(ids, EntryMove::Remove(removal))
        .await
        .unwrap();
    ended.iter().map(|gone| gone.id).collect()
}

/// The entries of `repo` listed live, or in quarantine.
async fn listed(
    store: &dyn MetaStore,
    repo: &str,
    quarantined: bool,
) -> Vec<hoard::model::ListedEntry> {
    let filter = EntryFilter {
        repository: Some(repo.into()),
        quarantined,
        ..EntryFilter::default()
    };
    let page = EntryPage::by_creation(&filter, 100);
    let found = store.select_entries(&page).await.unwrap().entries;
    assert_eq!(
        count_of(store, &filter).await,
        found.len() as u64,
        "the count agrees with the listing (quarantined: {quarantined})"
    );
    found
}

async fn a_quarantined_entry_leaves_lookups_and_keeps_everything(store: &dyn MetaStore) {
    let repo = "q-keep";
    let id = save(store, &slot(repo, "poisoned"), &[10, 20], 1).await;
    let clean = save(store, &slot(repo, "clean"), &[5], 2).await;
    let (entry, chunks) = store.entry(id, EntryState::Live).await.unwrap().unwrap();
    let names: Vec<BlobName> = chunks.iter().map(|c| c.chunk.blob.clone()).collect();
    let usage = store
        .usage(UsageOf::Repository(&RepoId::new(repo)))
        .await
        .unwrap();
    let pending = store.usage(UsageOf::PendingDeletions).await.unwrap().bytes;
    let cause = quarantine("quarantined by admin");
    let removed = store
        .move_entries(&[id], EntryMove::Remove(at(&cause, 50)))
        .await
        .unwrap();
    assert_eq!(removed.len(), 1, "a quarantine removes the entry once");

    assert!(
        store.entry(id, EntryState::Live).await.unwrap().is_none(),
        "out of lookups"
    );
    assert_eq!(
        lookup(store, repo, &["poisoned"]).await,
        [],
        "no lookup finds it"
    );
    assert_eq!(
        store
            .usage(UsageOf::Repository(&RepoId::new(repo)))
            .await
            .unwrap()
            .bytes,
        usage.bytes - 30,
        "its bytes leave the repository's usage, as a deletion's do"
    );
    assert_eq!(
        store.usage(UsageOf::PendingDeletions).await.unwrap().bytes,
        pending,
        "its chunks are not scheduled for deletion"
    );
    assert_eq!(
        store.referenced(&names).await.unwrap().len(),
        2,
        "its chunks stay referenced (no orphan collection)"
    );
    let (kept, kept_chunks) = store
        .entry(id, EntryState::Quarantined)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept, entry, "the entry is kept as it was");
    let parts = |chunks: &[hoard::meta::EntryChunk]| {
        chunks
            .iter()
            .map(|c| (c.start, c.chunk.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        parts(&kept_chunks),
        parts(&chunks),
        "with its chunks in order"
    );

    let live: Vec<EntryId> = listed(store, repo, false)
        .await
        .iter()
        .map(|l| l.entry.id)
        .collect();
    assert_eq!(live, [clean], "the live listing leaves it out");
    let quarantined = listed(store, repo, true).await;
    assert_eq!(quarantined.len(), 1, "the quarantined listing has it");
    let q = &quarantined[0];
    assert_eq!(q.entry, entry);
    assert_eq!(
        q.record.written_by.as_ref().map(|w| w.subject.as_str()),
        Some("conformance"),
        "with its writer"
    );
    let why = q.quarantine.as_ref().expect("marked as quarantined");
    assert_eq!(
        (why.reason.as_str(), why.at),
        ("quarantined by admin", 50),
        "with why and when"
    );
    assert!(
        listed(store, repo, false)
            .await
            .iter()
            .all(|l| l.quarantine.is_none()),
        "live entries are not marked"
    );
    let again = store
        .move_entries(&[id], EntryMove::Remove(at(&cause, 60)))
        .await
        .unwrap();
    assert!(again.is_empty(), "a quarantined entry is not removed twice");
}

async fn a_release_puts_the_entry_back_unless_its_slot_is_taken(store: &dyn MetaStore) {
    let repo = "q-release";
    let s = slot(repo, "k");
    let id = save(store, &s, &[7], 1).await;
    let before = store
        .usage(UsageOf::Repository(&RepoId::new(repo)))
        .await
        .unwrap();
    let cause = quarantine("a flipped byte");
    store
        .move_entries(&[id], EntryMove::Remove(at(&cause, 10)))
        .await
        .unwrap();

    // The slot is free at once: a new save takes it, and the release must wait.
    let newer = save(store, &s, &[3], 20).await;
    assert_ne!(newer, id, "the new entry has its own id");
    match store.move_entries(&[id], EntryMove::Release).await {
        Err(MetaError::Conflict) => {}
        other => panic!("a release into a taken slot conflicts, not {other:?}"),
    }
    assert!(
        store
            .entry(id, EntryState::Quarantined)
            .await
            .unwrap()
            .is_some(),
        "a refused release leaves the entry in quarantine"
    );
    let deleted = RemovalCause::Deleted;
    store
        .move_entries(&[newer], EntryMove::Remove(at(&deleted, 30)))
        .await
        .unwrap();

    let released = store.move_entries(&[id], EntryMove::Release).await.unwrap();
    assert_eq!(ids(&released), [id], "released with its id");
    assert_eq!(
        lookup(store, repo, &["k"]).await,
        [("k".to_owned(), id)],
        "lookups find it again"
    );
    assert!(store
        .entry(id, EntryState::Quarantined)
        .await
        .unwrap()
        .is_none());
    assert!(listed(store, repo, true).await.is_empty());
    let (_, chunks) = store.entry(id, EntryState::Live).await.unwrap().unwrap();
    assert_eq!(chunks.len(), 1, "with its chunks");
    let after = store
        .usage(UsageOf::Repository(&RepoId::new(repo)))
        .await
        .unwrap();
    assert_eq!(after, before, "and counted in its repository again");
    assert_eq!(
        store.move_entries(&[id], EntryMove::Release).await.unwrap(),
        [],
        "a live entry is not released"
    );
    assert_eq!(
        store
            .move_entries(&[EntryId::new(i64::MAX)], EntryMove::Release)
            .await
            .unwrap(),
        [],
        "nor an unknown one"
    );
}

async fn a_release_of_several_moves_all_or_none(store: &dyn MetaStore) {
    let repo = "q-release-many";
    let (a, b) = (slot(repo, "a"), slot(repo, "b"));
    let ids = [
        save(store, &a, &[1], 1).await,
        save(store, &b, &[2], 2).await,
    ];
    let cause = quarantine("suspect");
    store
        .move_entries(&ids, EntryMove::Remove(at(&cause, 10)))
        .await
        .unwrap();
    // A new save takes the second slot: releasing both conflicts, and neither moves.
    let newer = save(store, &b, &[3], 20).await;
    match store.move_entries(&ids, EntryMove::Release).await {
        Err(MetaError::Conflict) => {}
        other => panic!("a release into a taken slot conflicts, not {other:?}"),
    }
    assert_eq!(
        listed(store, repo, true).await.len(),
        2,
        "both stay in quarantine"
    );
    let deleted = RemovalCause::Deleted;
    store
        .move_entries(&[newer], EntryMove::Remove(at(&deleted, 30)))
        .await
        .unwrap();
    let released = store.move_entries(&ids, EntryMove::Release).await.unwrap();
    assert_eq!(super::ids(&released), ids, "both released, in order");
    assert!(listed(store, repo, true).await.is_empty());
}

async fn the_end_of_a_quarantine_schedules_its_chunks(store: &dyn MetaStore) {
    let repo = "q-end";
    let old = save(store, &slot(repo, "old"), &[4, 6], 1).await;
    let young = save(store, &slot(repo, "young"), &[8], 2).await;
    let (_, chunks) = store.entry(old, EntryState::Live).await.unwrap().unwrap();
    let names: Vec<BlobName> = chunks.iter().map(|c| c.chunk.blob.clone()).collect();
    let cause = quarantine("quarantined by admin");
    store
        .move_entries(&[old], EntryMove::Remove(at(&cause, 100)))
        .await
        .unwrap();
    store
        .move_entries(&[young], EntryMove::Remove(at(&cause, 200)))
        .await
        .unwrap();

    let walk = EntryWalk::QuarantinedBefore {
        before: 150,
        after: EntryId::new(0),
    };
    let due = ids(&store.walk_entries(walk, 10).await.unwrap());
    assert!(due.contains(&old) && !due.contains(&young), "{due:?}");
    let pending = store.usage(UsageOf::PendingDeletions).await.unwrap().bytes;
    let dropped = end_quarantine(store, &[old]).await;
    assert_eq!(dropped, [old], "the quarantine of the old entry ends");
    assert!(store
        .entry(old, EntryState::Quarantined)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        store.usage(UsageOf::PendingDeletions).await.unwrap().bytes,
        pending + 10,
        "its chunks are scheduled for deletion"
    );
    let scheduled = store.take_deletions(&[], 5_000, 100_000).await.unwrap();
    assert!(
        names.iter().all(|n| scheduled.contains(n)),
        "at the time given"
    );
    assert!(end_quarantine(store, &[old]).await.is_empty(), "once");
    assert!(
        end_quarantine(store, &[EntryId::new(i64::MAX)])
            .await
            .is_empty(),
        "an entry not in quarantine is left alone"
    );
    assert_eq!(
        listed(store, repo, true)
            .await
            .iter()
            .map(|l| l.entry.id)
            .collect::<Vec<_>>(),
        [young]
    );
    store.take_deletions(&names, 0, 0).await.unwrap();
}
