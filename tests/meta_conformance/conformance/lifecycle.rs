//! `LifecycleStore`: usage, deferred deletions, LRU, expiry, racing removals, references, abandoned uploads and crash recovery.

use super::*;

pub async fn run(store: Arc<dyn MetaStore>) {
    usage_follows_finalize_and_removal(store.as_ref()).await;
    ids_of_removed_entries_are_never_given_again(store.as_ref()).await;
    removed_chunks_wait_for_their_deletion_time(store.as_ref()).await;
    least_recently_used_come_first(store.as_ref()).await;
    scope_classes_are_counted_and_listed_apart(store.as_ref()).await;
    expiry_finds_unused_and_old_entries(store.as_ref()).await;
    removals_race_and_count_once(store.clone()).await;
    references_cover_every_table(store.as_ref()).await;
    abandoned_uploads_are_found_and_closed_ones_pruned(store.as_ref()).await;
    forgetting_after_a_crash_drops_new_entries_and_open_uploads(store.as_ref()).await;
}

fn removal(cause: &RemovalCause, delete_at: i64) -> Removal<'_> {
    Removal {
        from: EntryState::Live,
        cause,
        now: delete_at - 100,
        delete_at,
    }
}

async fn usage_follows_finalize_and_removal(store: &dyn MetaStore) {
    let repo = RepoId::new("lc-usage");
    let total_before = store.usage(UsageOf::Everything).await.unwrap().bytes;
    assert_eq!(
        store.usage(UsageOf::Repository(&repo)).await.unwrap().bytes,
        0
    );
    let one = save(store, &slot("lc-usage", "one"), &[100], 1).await;
    save(store, &slot("lc-usage", "two"), &[50, 150], 2).await;
    save(store, &slot("lc-usage", "three"), &[300], 3).await;
    assert_eq!(
        store.usage(UsageOf::Repository(&repo)).await.unwrap().bytes,
        600
    );
    assert_eq!(
        store.usage(UsageOf::Everything).await.unwrap().bytes,
        total_before + 600
    );

    let evicted = RemovalCause::Evicted;
    let removed = store
        .move_entries(&[one], EntryMove::Remove(removal(&evicted, 5_000)))
        .await
        .unwrap();
    assert_eq!(removed.len(), 1);
    assert_eq!((removed[0].id, removed[0].size), (one, 100));
    assert_eq!(removed[0].repository, repo);
    assert!(
        store.entry(one, EntryState::Live).await.unwrap().is_none(),
        "removed at once"
    );
    assert!(lookup(store, "lc-usage", &["one"]).await.is_empty());
    assert_eq!(
        store.usage(UsageOf::Repository(&repo)).await.unwrap().bytes,
        500
    );
    assert_eq!(
        store.usage(UsageOf::Everything).await.unwrap().bytes,
        total_before + 500
    );
    let again = store
        .move_entries(&[one], EntryMove::Remove(removal(&evicted, 5_000)))
        .await
        .unwrap();
    assert!(
        again.is_empty(),
        "an entry already gone is not removed twice"
    );
    assert_eq!(
        store.usage(UsageOf::Repository(&repo)).await.unwrap().bytes,
        500
    );
}

/// An entry id names one entry for good: the newest entry removed, the next one saved still
/// gets a new id (audit lines and `caches show` never name two entries by one id).
async fn ids_of_removed_entries_are_never_given_again(store: &dyn MetaStore) {
    let first = save(store, &slot("lc-ids", "one"), &[1], 1).await;
    let newest = save(store, &slot("lc-ids", "two"), &[1], 2).await;
    let deleted = RemovalCause::Deleted;
    for id in [newest, first] {
        store
            .move_entries(&[id], EntryMove::Remove(removal(&deleted, 10)))
            .await
            .unwrap();
    }
    let next = save(store, &slot("lc-ids", "three"), &[1], 3).await;
    assert!(
        next > newest && next > first,
        "{next:?} is a new id, past the removed {first:?} and {newest:?}"
    );
}

async fn removed_chunks_wait_for_their_deletion_time(store: &dyn MetaStore) {
    let id = save(store, &slot("lc-delete", "k"), &[10, 20], 1).await;
    let (_, chunks) = store.entry(id, EntryState::Live).await.unwrap().unwrap();
    let names: Vec<BlobName> = chunks.iter().map(|c| c.chunk.blob.clone()).collect();
    let pending_before = store.usage(UsageOf::PendingDeletions).await.unwrap().bytes;
    let cause = RemovalCause::Deleted;
    store
        .move_entries(&[id], EntryMove::Remove(removal(&cause, 7_000_000)))
        .await
        .unwrap();
    assert_eq!(
        store.usage(UsageOf::PendingDeletions).await.unwrap().bytes,
        pending_before + 30
    );
    let early = store.take_deletions(&[], 6_999_999, 100_000).await.unwrap();
    assert!(
        names.iter().all(|n| !early.contains(n)),
        "not due before its time"
    );
    let due = store.take_deletions(&[], 7_000_000, 100_000).await.unwrap();
    assert!(names.iter().all(|n| due.contains(n)), "due at its time");
    assert_eq!(
        store.referenced(&names).await.unwrap().len(),
        2,
        "a pending deletion still refers to its chunks"
    );
    // Acknowledged and the next taken in one call: what was done is not taken again.
    let next = store
        .take_deletions(&names, 7_000_000, 100_000)
        .await
        .unwrap();
    assert!(names.iter().all(|n| !next.contains(n)), "done is forgotten");
    assert!(store.referenced(&names).await.unwrap().is_empty());
    assert_eq!(
        store.usage(UsageOf::PendingDeletions).await.unwrap().bytes,
        pending_before
    );
}

async fn least_recently_used_come_first(store: &dyn MetaStore) {
    let repo = RepoId::new("lc-lru");
    let a = save(store, &slot("lc-lru", "a"), &[1], 10).await;
    let b = save(store, &slot("lc-lru", "b"), &[1], 20).await;
    let c = save(store, &slot("lc-lru", "c"), &[1], 30).await;
    store.record_uses(&just_hits(&[(a, 1, 40)])).await.unwrap();
    let ids =
        |found: Vec<hoard::model::EntryUse>| found.into_iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store
            .walk_entries(EntryWalk::LeastRecentlyUsed(Some(&repo)), 10)
            .await
            .unwrap()),
        [b, c, a],
        "a restore makes an entry recent"
    );
    assert_eq!(
        ids(store
            .walk_entries(EntryWalk::LeastRecentlyUsed(Some(&repo)), 2)
            .await
            .unwrap()),
        [b, c]
    );
    let all = store
        .walk_entries(EntryWalk::LeastRecentlyUsed(None), 100_000)
        .await
        .unwrap();
    assert!(
        all.windows(2)
            .all(|w| (w[0].last_used_at, w[0].id) <= (w[1].last_used_at, w[1].id)),
        "across repositories, in order of last use"
    );
    let mine: Vec<EntryId> = all
        .iter()
        .filter(|e| e.repository == repo)
        .map(|e| e.id)
        .collect();
    assert_eq!(mine, [b, c, a]);
}

async fn expiry_finds_unused_and_old_entries(store: &dyn MetaStore) {
    let unused = save(store, &slot("lc-exp", "unused"), &[1], 5).await;
    let used = save(store, &slot("lc-exp", "used"), &[1], 6).await;
    store
        .record_uses(&just_hits(&[(used, 1, 9_000_000)]))
        .await
        .unwrap();
    let ids =
        |found: Vec<hoard::model::EntryUse>| found.into_iter().map(|e| e.id).collect::<Vec<_>>();
    let found = ids(store
        .walk_entries(
            EntryWalk::Expired {
                unused_before: 7,
                created_before: None,
            },
            100_000,
        )
        .await
        .unwrap());
    assert!(found.contains(&unused));
    assert!(!found.contains(&used), "a recent restore keeps an entry");
    let found = ids(store
        .walk_entries(
            EntryWalk::Expired {
                unused_before: i64::MIN,
                created_before: Some(7),
            },
            100_000,
        )
        .await
        .unwrap());
    assert!(found.contains(&used), "too old expires, used or not");
    assert!(found.contains(&unused));
    assert!(!ids(store
        .walk_entries(
            EntryWalk::Expired {
                unused_before: i64::MIN,
                created_before: Some(5)
            },
            100_000
        )
        .await
        .unwrap())
    .contains(&unused));
    assert_eq!(
        store
            .walk_entries(
                EntryWalk::Expired {
                    unused_before: 7,
                    created_before: Some(7)
                },
                1
            )
            .await
            .unwrap()
            .len(),
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
                .move_entries(&ids, EntryMove::Remove(removal(&cause, 1_000)))
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
            .usage(UsageOf::Repository(&RepoId::new("lc-race")))
            .await
            .unwrap()
            .bytes,
        0
    );
}

async fn references_cover_every_table(store: &dyn MetaStore) {
    let staged = chunk(1);
    let committed = chunk(2);
    let upload = reserve(store, &slot("lc-refs", "open"), 1).await;
    store
        .change_upload(
            &upload,
            UploadChange::Stage {
                block: &block("s"),
                chunk: &staged,
            },
            1,
        )
        .await
        .unwrap();
    let upload = upload_of(store, upload.id).await.unwrap();
    let other = reserve(store, &slot("lc-refs", "other"), 1).await;
    store
        .change_upload(
            &other,
            UploadChange::Commit(&[(block("c"), committed.clone())]),
            1,
        )
        .await
        .unwrap();
    let entry = save(store, &slot("lc-refs", "entry"), &[3], 1).await;
    let (_, chunks) = store.entry(entry, EntryState::Live).await.unwrap().unwrap();
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
    store
        .change_upload(&upload, UploadChange::Abort, 2)
        .await
        .unwrap();
    assert!(!store
        .referenced(std::slice::from_ref(&staged.blob))
        .await
        .unwrap()
        .contains(&staged.blob));
    assert_eq!(
        ids(&store
            .walk_entries(
                EntryWalk::All {
                    after: EntryId::new(entry.get() - 1)
                },
                1
            )
            .await
            .unwrap()),
        [entry],
        "entries are walked in id order"
    );
}

async fn abandoned_uploads_are_found_and_closed_ones_pruned(store: &dyn MetaStore) {
    let open = reserve(store, &slot("lc-stale", "open"), 2).await;
    let fresh = reserve(store, &slot("lc-stale", "fresh"), 9_000_000).await;
    let done = reserve(store, &slot("lc-stale", "done"), 2).await;
    store
        .change_upload(&done, UploadChange::Abort, 3)
        .await
        .unwrap();
    let listing = UploadSweep {
        open_before: 4,
        limit: 100_000,
        prune_before: None,
    };
    let stale = store.sweep_uploads(listing).await.unwrap();
    assert!(stale.open.contains(&open.id));
    assert!(
        !stale.open.contains(&done.id),
        "closed uploads are not stale"
    );
    assert!(!stale.open.contains(&fresh.id));
    assert_eq!(
        stale.pruned, 0,
        "a sweep that prunes nothing deletes nothing"
    );
    assert!(upload_of(store, done.id).await.is_some());
    let sweep = UploadSweep {
        prune_before: Some(4),
        ..listing
    };
    let swept = store.sweep_uploads(sweep).await.unwrap();
    assert!(swept.pruned >= 1);
    assert!(
        swept.open.contains(&open.id),
        "open uploads are listed, not pruned"
    );
    assert!(upload_of(store, done.id).await.is_none(), "pruned");
    assert!(
        upload_of(store, open.id).await.is_some(),
        "open uploads stay"
    );
}

async fn forgetting_after_a_crash_drops_new_entries_and_open_uploads(store: &dyn MetaStore) {
    let old = save(store, &slot("forget", "old"), &[1], 1_000).await;
    let new = save(store, &slot("forget", "new"), &[1], 3_000).await;
    let pr = |key| slot_in("forget", "refs/pull/9/merge", key, "v1");
    save(store, &pr("old-pr"), &[2], 1_000).await;
    save(store, &pr("new-pr"), &[4], 3_000).await;
    let (_, new_chunks) = store.entry(new, EntryState::Live).await.unwrap().unwrap();
    let open = reserve(store, &slot("forget", "open"), 3_000).await;
    let staged = chunk(7);
    store
        .change_upload(
            &open,
            UploadChange::Stage {
                block: &block("a"),
                chunk: &staged,
            },
            3_001,
        )
        .await
        .unwrap();

    let (forgotten, garbage) = store.forget_after(2_000, 4_000).await.unwrap();
    assert!(forgotten >= 1);
    assert!(store.entry(old, EntryState::Live).await.unwrap().is_some());
    assert!(store.entry(new, EntryState::Live).await.unwrap().is_none());
    assert!(garbage.contains(&new_chunks[0].chunk.blob));
    assert!(garbage.contains(&staged.blob));
    let open = upload_of(store, open.id).await.unwrap();
    assert_eq!(open.state, UploadState::Aborted);
    assert_eq!(
        store
            .usage(UsageOf::Repository(&RepoId::new("forget")))
            .await
            .unwrap(),
        QuotaUsage {
            bytes: 3,
            pr_bytes: 2
        },
        "usage, and that of pull requests and tags, is recounted after forgetting"
    );
}

/// Entries of pull requests and tags are counted apart in their repository's usage (as their
/// finalize classed them), and listed least recently used first within their class.
async fn scope_classes_are_counted_and_listed_apart(store: &dyn MetaStore) {
    let repo = RepoId::new("lc-class");
    let pr = ScopeClass::PullRequestOrTag;
    let main = save(store, &slot("lc-class", "main"), &[100], 10).await;
    let pull = save(
        store,
        &slot_in("lc-class", "refs/pull/1/merge", "pull", "v1"),
        &[30],
        20,
    )
    .await;
    let tag = save(
        store,
        &slot_in("lc-class", "refs/tags/v1.0", "tag", "v1"),
        &[15, 5],
        30,
    )
    .await;
    let other = save(
        store,
        &slot_in("lc-class", "refs/pull/2/merge", "other", "v1"),
        &[10],
        40,
    )
    .await;
    let feature = save(
        store,
        &slot_in("lc-class", "refs/heads/feature", "feature", "v1"),
        &[1],
        50,
    )
    .await;
    assert_eq!(
        store.usage(UsageOf::Repository(&repo)).await.unwrap(),
        QuotaUsage {
            bytes: 161,
            pr_bytes: 60
        }
    );
    store
        .record_uses(&just_hits(&[(pull, 1, 60)]))
        .await
        .unwrap();
    let ids =
        |found: Vec<hoard::model::EntryUse>| found.into_iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store
            .walk_entries(EntryWalk::LeastRecentlyUsedOfClass(&repo, pr), 10)
            .await
            .unwrap()),
        [tag, other, pull],
        "pull requests and tags only, least recently used first"
    );
    assert_eq!(
        ids(store
            .walk_entries(EntryWalk::LeastRecentlyUsedOfClass(&repo, pr), 1)
            .await
            .unwrap()),
        [tag]
    );
    assert_eq!(
        ids(store
            .walk_entries(
                EntryWalk::LeastRecentlyUsedOfClass(&repo, ScopeClass::Branch),
                10
            )
            .await
            .unwrap()),
        [main, feature],
        "branches only"
    );
    assert!(store
        .walk_entries(
            EntryWalk::LeastRecentlyUsedOfClass(&RepoId::new("lc-class-none"), pr),
            10
        )
        .await
        .unwrap()
        .is_empty());
    let listed = store
        .repositories(Some("lc-class"), 10)
        .await
        .unwrap()
        .listed;
    assert_eq!(
        (
            listed[0].bytes,
            listed[0].entries,
            listed[0].pr_bytes,
            listed[0].pr_entries
        ),
        (161, 5, 60, 3)
    );

    let evicted = RemovalCause::Evicted;
    store
        .move_entries(&[tag, main], EntryMove::Remove(removal(&evicted, 5_000)))
        .await
        .unwrap();
    assert_eq!(
        store.usage(UsageOf::Repository(&repo)).await.unwrap(),
        QuotaUsage {
            bytes: 41,
            pr_bytes: 40
        },
        "a removal takes its bytes from its class"
    );
    let listed = store
        .repositories(Some("lc-class"), 10)
        .await
        .unwrap()
        .listed;
    assert_eq!(
        (
            listed[0].bytes,
            listed[0].entries,
            listed[0].pr_bytes,
            listed[0].pr_entries
        ),
        (41, 3, 40, 2)
    );
    assert_eq!(
        store
            .usage(UsageOf::Repository(&RepoId::new("lc-class-none")))
            .await
            .unwrap(),
        QuotaUsage::default()
    );
}
