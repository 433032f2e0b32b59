//! `RestoreStore`: lookups (case folding, byte-wise prefixes, isolation), the v1 listing, and recorded hits.

use super::*;

pub async fn run(store: &dyn MetaStore) {
    keys_match_case_insensitively_and_nothing_else_is_folded(store).await;
    prefix_matches_are_byte_wise_and_newest_first(store).await;
    repositories_scopes_and_versions_are_separate(store).await;
    listings_find_every_version_of_a_key_in_one_scope(store).await;
    restores_are_recorded(store).await;
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
    let found = with_key(store, &repo, &main, "deps", 10).await;
    let ids: Vec<EntryId> = found.iter().map(|e| e.id).collect();
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
    let two = with_key(store, &repo, &main, "deps", 2).await;
    assert_eq!(two.len(), 2, "at most the limit");
    assert!(
        with_key(store, &repo, &main, "dep", 10).await.is_empty(),
        "no prefix matching"
    );
}

async fn restores_are_recorded(store: &dyn MetaStore) {
    let id = save(store, &slot("hits", "k"), &[1], 100).await;
    store
        .record_uses(&just_hits(&[
            (id, 2, 150),
            (id, 1, 120),
            (EntryId::new(id.get() + 1_000_000), 5, 1),
        ]))
        .await
        .unwrap();
    let (entry, _) = store.entry(id, EntryState::Live).await.unwrap().unwrap();
    assert_eq!((entry.hits, entry.last_used_at), (3, 150));
}

/// The newest entries of `repo` in `scope` whose folded key is exactly `key`, as the v1
/// listing selects them.
async fn with_key(
    store: &dyn MetaStore,
    repo: &RepoId,
    scope: &Scope,
    key: &str,
    limit: usize,
) -> Vec<hoard::model::Entry> {
    let filter = EntryFilter {
        repository_id: Some(repo.as_str().to_owned()),
        scope: Some(scope.clone()),
        folded_key: Some(key.to_owned()),
        ..EntryFilter::default()
    };
    let page = EntryPage {
        descending: true,
        ..EntryPage::by_creation(&filter, limit)
    };
    let found = store.select_entries(&page).await.unwrap().entries;
    found.into_iter().map(|listed| listed.entry).collect()
}
