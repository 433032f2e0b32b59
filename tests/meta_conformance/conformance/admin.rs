//! `AdminStore`: totals, operators' filtered and paged listings, and repositories' usage.

use super::*;

pub async fn run(store: &dyn MetaStore) {
    totals_count_bytes_entries_and_open_uploads(store).await;
    operators_filter_sort_and_page_entries(store).await;
    repositories_keep_names_usage_hits_and_misses(store).await;
}

/// The ids a listing returns, page by page until it runs out, `limit` at a time.
async fn list_ids(
    store: &dyn MetaStore,
    filter: &EntryFilter,
    order: EntryOrder,
    descending: bool,
    limit: usize,
) -> Vec<Vec<EntryId>> {
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = EntryPage {
            filter,
            order,
            descending,
            after,
            limit,
            count: true,
        };
        let selected = store.select_entries(&page).await.unwrap();
        let listed = selected.entries;
        let everything: usize = pages.iter().map(Vec::len).sum::<usize>() + listed.len();
        let total = selected.total.expect("a total when asked") as usize;
        assert!(
            total >= everything,
            "the total counts every entry, not a page: {total} < {everything}"
        );
        let Some(last) = listed.last() else {
            assert_eq!(total, everything, "the total is what the pages listed");
            return pages;
        };
        after = Some((order.value_of(&last.entry), last.entry.id));
        pages.push(listed.iter().map(|l| l.entry.id).collect());
        assert!(pages.len() < 100, "paging does not end");
    }
}

async fn totals_count_bytes_entries_and_open_uploads(store: &dyn MetaStore) {
    let before = store.repositories(None, 0).await.unwrap().totals;
    save(store, &slot("lc-totals", "a"), &[3, 4], 1).await;
    let open = reserve(store, &slot("lc-totals", "b"), 2).await;
    let after = store.repositories(None, 0).await.unwrap().totals;
    assert_eq!(after.bytes, before.bytes + 7, "bytes of the new entry");
    assert_eq!(after.entries, before.entries + 1, "one entry more");
    assert_eq!(
        after.open_uploads,
        before.open_uploads + 1,
        "one open upload more"
    );
    store
        .change_upload(&open, UploadChange::Abort, 3)
        .await
        .unwrap();
    let closed = store.repositories(None, 0).await.unwrap().totals;
    assert_eq!(
        closed.open_uploads, before.open_uploads,
        "an aborted upload is not open"
    );
    assert_eq!(
        closed.bytes,
        store.usage(UsageOf::Everything).await.unwrap().bytes
    );
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
    store
        .record_uses(&just_hits(&[(a, 1, 1000)]))
        .await
        .unwrap();

    let repo = EntryFilter {
        repository: Some("adm".into()),
        ..EntryFilter::default()
    };
    let by_name = EntryFilter {
        repository: Some("octo/adm".into()),
        ..EntryFilter::default()
    };
    assert_eq!(count_of(store, &repo).await, 4, "count by repository id");
    assert_eq!(
        count_of(store, &by_name).await,
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
        count_of(store, &by_name_as_id).await,
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
    assert_eq!(count_of(store, &versioned).await, 1);

    let page = EntryPage::by_creation(&repo, 1);
    let listed = store.select_entries(&page).await.unwrap().entries;
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
    // Hits and misses of one flush, for the same repository and another, together.
    let flush = Uses {
        hits: vec![(a, 3, 20)],
        misses: vec![
            (RepoId::new("rep-a"), String::new(), 2),
            (RepoId::new("rep-b"), "octo/b".into(), 4),
        ],
        ..Uses::default()
    };
    store.record_uses(&flush).await.unwrap();
    store
        .record_uses(&just_misses(&[(RepoId::new("rep-b"), String::new(), 1)]))
        .await
        .unwrap();
    let usage = |repository: &str, name: &str, counts: [u64; 4]| RepositoryUsage {
        repository: RepoId::new(repository),
        name: name.into(),
        bytes: counts[0],
        entries: counts[1],
        hits: counts[2],
        misses: counts[3],
        pr_bytes: 0,
        pr_entries: 0,
    };
    assert_eq!(
        store.repositories(Some("octo/a"), 10).await.unwrap().listed,
        vec![usage("rep-a", "octo/a", [150, 2, 3, 2])],
        "a repository's bytes, entries, hits and misses, found by name"
    );
    assert_eq!(
        store.repositories(Some("rep-b"), 10).await.unwrap().listed,
        vec![usage("rep-b", "octo/b", [0, 0, 0, 5])],
        "a repository that only missed is listed, by id"
    );
    let all = store.repositories(None, 10_000).await.unwrap().listed;
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
    let totals_only = store.repositories(None, 0).await.unwrap();
    assert!(totals_only.listed.is_empty(), "no page without a limit");
    assert_eq!(totals_only.totals.repositories, all.len() as u64);
    assert_eq!(
        store.repositories(None, 1).await.unwrap().listed.len(),
        1,
        "the limit holds"
    );
}
