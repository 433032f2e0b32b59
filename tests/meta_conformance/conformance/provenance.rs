//! Who wrote each entry: recorded at reservation, kept by the entry, and selectable by the
//! operator's filters (purge by writer).

use super::*;

pub async fn run(store: &dyn MetaStore) {
    an_entry_keeps_what_its_upload_recorded_of_its_writer(store).await;
    writers_run_subject_kind_and_time_select_entries(store).await;
    an_entry_without_a_record_has_none(store).await;
}

/// Reserves as `by`, commits one chunk of `size` and finalizes with `digest` at `now`.
async fn save_by(
    store: &dyn MetaStore,
    slot: &Slot,
    by: Option<&Provenance>,
    digest: &str,
    now: i64,
) -> EntryId {
    let anonymous = Provenance::anonymous();
    let id = store
        .create_upload(
            NewUpload {
                slot,
                written_by: by.unwrap_or(&anonymous),
                now,
            },
            None,
        )
        .await
        .unwrap();
    let upload = upload_of(store, id).await.unwrap();
    let parts = vec![(block("b"), chunk(3))];
    store.commit_parts(&upload, &parts, now).await.unwrap();
    let upload = upload_of(store, id).await.unwrap();
    let chunks = vec![parts[0].1.clone()];
    store
        .finalize(
            &upload,
            NewEntry {
                slot,
                key: slot.key.as_str(),
                repository_name: "",
                chunks: &chunks,
                // `None` stands for an upload reserved before records were kept.
                written_by: by.and(upload.written_by.as_ref()),
                digest,
                scope_class: ScopeClass::of(&slot.scope),
                family: "",
                ref_class: hoard::model::RefClass::DefaultBranch,
                now,
            },
        )
        .await
        .unwrap()
}

async fn listed(store: &dyn MetaStore, filter: EntryFilter) -> Vec<hoard::model::ListedEntry> {
    let page = EntryPage {
        filter: &filter,
        order: EntryOrder::Created,
        descending: false,
        after: None,
        limit: 100,
    };
    let found = store.list_entries(&page).await.unwrap();
    assert_eq!(
        store.count_entries(&filter).await.unwrap(),
        found.len() as u64,
        "the count agrees with the listing for {filter:?}"
    );
    found
}

async fn an_entry_keeps_what_its_upload_recorded_of_its_writer(store: &dyn MetaStore) {
    let by = Provenance {
        kind: CallerKind::Ghes,
        issuer: "https://ghes.example/_services/token".into(),
        // The longest a record keeps, in characters of several bytes.
        subject: Provenance::clip(&"repo:ünïcode/ç:ref:refs/heads/main".repeat(10)),
        run_id: "9001".into(),
        job_id: "a1b2c3d4-0000-4000-8000-000000000000".into(),
        address: "2001:db8::7".into(),
    };
    assert!(by.subject.len() > 250, "the subject is near the limit");
    let s = slot("prov-keep", "k");
    let digest = format!("sha256:{}", "ab".repeat(32));
    let id = save_by(store, &s, Some(&by), &digest, 10).await;
    let found = listed(
        store,
        EntryFilter {
            id: Some(id),
            ..EntryFilter::default()
        },
    )
    .await;
    assert_eq!(found.len(), 1, "the id filter selects the entry");
    assert_eq!(
        found[0].written_by.as_ref(),
        Some(&by),
        "the entry keeps its writer"
    );
    assert_eq!(found[0].digest, digest, "the entry keeps its digest");

    // The upload showed the same record while it was open.
    let open = reserve(store, &slot("prov-keep", "open"), 11).await;
    assert_eq!(open.written_by, Some(writer("conformance")));
}

async fn writers_run_subject_kind_and_time_select_entries(store: &dyn MetaStore) {
    let repo = "prov-filter";
    let run_a = Provenance {
        run_id: "prov-run-a".into(),
        ..writer("repo:o/a:pull_request")
    };
    let run_b = Provenance {
        run_id: "prov-run-b".into(),
        kind: CallerKind::Hs256,
        ..writer("repo:o/a:ref:refs/heads/main")
    };
    let a1 = save_by(store, &slot(repo, "a1"), Some(&run_a), "", 100).await;
    let a2 = save_by(store, &slot(repo, "a2"), Some(&run_a), "", 200).await;
    let b1 = save_by(store, &slot(repo, "b1"), Some(&run_b), "", 300).await;
    let ids = |found: Vec<hoard::model::ListedEntry>| -> Vec<EntryId> {
        found.iter().map(|l| l.entry.id).collect()
    };
    let by_run = EntryFilter {
        run_id: Some("prov-run-a".into()),
        ..EntryFilter::default()
    };
    assert_eq!(
        ids(listed(store, by_run.clone()).await),
        [a1, a2],
        "run_id selects exactly that run's entries"
    );
    let by_subject = EntryFilter {
        repository_id: Some(repo.into()),
        subject: Some("repo:o/a:ref:refs/heads/main".into()),
        ..EntryFilter::default()
    };
    assert_eq!(
        ids(listed(store, by_subject).await),
        [b1],
        "subject selects"
    );
    let by_kind = EntryFilter {
        repository_id: Some(repo.into()),
        kind: Some(CallerKind::Github),
        ..EntryFilter::default()
    };
    assert_eq!(ids(listed(store, by_kind).await), [a1, a2], "kind selects");
    let window = EntryFilter {
        repository_id: Some(repo.into()),
        written_after: Some(200),
        written_before: Some(300),
        ..EntryFilter::default()
    };
    assert_eq!(
        ids(listed(store, window).await),
        [a2],
        "written_after is inclusive and written_before exclusive"
    );
    let combined = EntryFilter {
        written_after: Some(150),
        scope: Some(Scope::new(MAIN)),
        ..by_run
    };
    assert_eq!(
        ids(listed(store, combined).await),
        [a2],
        "writer filters combine with the others"
    );
}

async fn an_entry_without_a_record_has_none(store: &dyn MetaStore) {
    let s = slot("prov-none", "old");
    let id = save_by(store, &s, None, "", 5).await;
    let found = listed(
        store,
        EntryFilter {
            repository_id: Some("prov-none".into()),
            ..EntryFilter::default()
        },
    )
    .await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].entry.id, id);
    assert_eq!(found[0].written_by, None, "no record, no writer");
    assert_eq!(found[0].digest, "", "no record, no digest");
    let any_kind = EntryFilter {
        repository_id: Some("prov-none".into()),
        kind: Some(CallerKind::Anonymous),
        ..EntryFilter::default()
    };
    assert!(
        listed(store, any_kind).await.is_empty(),
        "a kind filter never selects an entry without a record"
    );
}
