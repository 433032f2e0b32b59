//! Who wrote each entry: recorded at reservation, kept by the entry, and selectable by the
//! operator's filters (purge by writer).

use super::*;

pub async fn run(store: &dyn MetaStore) {
    an_entry_keeps_what_its_upload_recorded_of_its_writer(store).await;
    writers_run_subject_kind_and_time_select_entries(store).await;
    a_digest_selects_the_same_archive_under_every_key(store).await;
    restore_records_name_the_readers_and_outlive_the_entry(store).await;
    an_entry_keeps_its_most_recent_readers(store).await;
    an_entry_without_a_record_has_none(store).await;
    a_tools_object_and_a_read_through_keep_their_records_in_and_out_of_quarantine(store).await;
    an_entry_awaiting_its_digest_gets_it_once(store).await;
    restore_records_are_forgotten_with_their_entries_on_request(store).await;
    // Last: a bound over all repositories drops the other checks' records.
    restore_records_are_bounded_oldest_first(store).await;
}

/// Reserves as `by`, commits one chunk of `size` and finalizes with `digest` at `now`.
async fn save_by(
    store: &dyn MetaStore,
    slot: &Slot,
    by: Option<&Provenance>,
    digest: &str,
    now: i64,
) -> EntryId {
    save_chunks(store, slot, by, vec![chunk(3)], digest, now).await
}

/// The same with `chunks` as its parts.
async fn save_chunks(
    store: &dyn MetaStore,
    slot: &Slot,
    by: Option<&Provenance>,
    chunks: Vec<Chunk>,
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
    let parts: Vec<(BlockId, Chunk)> = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| (block(&format!("b{i}")), c.clone()))
        .collect();
    store
        .change_upload(&upload, UploadChange::Commit(&parts), now)
        .await
        .unwrap();
    let upload = upload_of(store, id).await.unwrap();
    store
        .finalize(
            Some(&upload),
            NewEntry {
                // `None` stands for an upload reserved before records were kept.
                record: EntryRecord {
                    written_by: by.and(upload.written_by.clone()),
                    digest: digest.to_owned(),
                    ..EntryRecord::default()
                },
                ..NewEntry::new(slot, &chunks, now)
            },
        )
        .await
        .unwrap()
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
    let found = listed_where(
        store,
        EntryFilter {
            id: Some(id),
            ..EntryFilter::default()
        },
    )
    .await;
    assert_eq!(found.len(), 1, "the id filter selects the entry");
    assert_eq!(
        found[0].record.written_by.as_ref(),
        Some(&by),
        "the entry keeps its writer"
    );
    assert_eq!(found[0].record.digest, digest, "the entry keeps its digest");

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
        ids(listed_where(store, by_run.clone()).await),
        [a1, a2],
        "run_id selects exactly that run's entries"
    );
    let by_subject = EntryFilter {
        repository_id: Some(repo.into()),
        subject: Some("repo:o/a:ref:refs/heads/main".into()),
        ..EntryFilter::default()
    };
    assert_eq!(
        ids(listed_where(store, by_subject).await),
        [b1],
        "subject selects"
    );
    let by_kind = EntryFilter {
        repository_id: Some(repo.into()),
        kind: Some(CallerKind::Github),
        ..EntryFilter::default()
    };
    assert_eq!(
        ids(listed_where(store, by_kind).await),
        [a1, a2],
        "kind selects"
    );
    let window = EntryFilter {
        repository_id: Some(repo.into()),
        written_after: Some(200),
        written_before: Some(300),
        ..EntryFilter::default()
    };
    assert_eq!(
        ids(listed_where(store, window).await),
        [a2],
        "written_after is inclusive and written_before exclusive"
    );
    let combined = EntryFilter {
        written_after: Some(150),
        scope: Some(Scope::new(MAIN)),
        ..by_run
    };
    assert_eq!(
        ids(listed_where(store, combined).await),
        [a2],
        "writer filters combine with the others"
    );
}

async fn a_digest_selects_the_same_archive_under_every_key(store: &dyn MetaStore) {
    let poisoned = format!("sha256:{}", "d1a6".repeat(16));
    let clean = format!("sha256:{}", "c1ea".repeat(16));
    let x = save_by(store, &slot("prov-digest-1", "x"), None, &poisoned, 10).await;
    let y = save_by(store, &slot("prov-digest-2", "y"), None, &poisoned, 11).await;
    save_by(store, &slot("prov-digest-1", "z"), None, &clean, 12).await;
    let by_digest = |digest: &str| EntryFilter {
        digest: Some(digest.to_owned()),
        ..EntryFilter::default()
    };
    let found = listed_where(store, by_digest(&poisoned)).await;
    let mut ids: Vec<EntryId> = found.iter().map(|l| l.entry.id).collect();
    ids.sort();
    assert_eq!(
        ids,
        [x, y],
        "digest selects every entry of those bytes, in any repository"
    );
    assert_eq!(
        count_of(store, &by_digest(&poisoned)).await,
        2,
        "and counts them"
    );
    let other = format!("sha256:{}", "0e7e".repeat(16));
    assert!(listed_where(store, by_digest(&other)).await.is_empty());
}

async fn an_entry_without_a_record_has_none(store: &dyn MetaStore) {
    let s = slot("prov-none", "old");
    let id = save_by(store, &s, None, "", 5).await;
    let found = listed_where(
        store,
        EntryFilter {
            repository_id: Some("prov-none".into()),
            ..EntryFilter::default()
        },
    )
    .await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].entry.id, id);
    assert_eq!(found[0].record.written_by, None, "no record, no writer");
    assert_eq!(found[0].record.digest, "", "no record, no digest");
    let any_kind = EntryFilter {
        repository_id: Some("prov-none".into()),
        kind: Some(CallerKind::Anonymous),
        ..EntryFilter::default()
    };
    assert!(
        listed_where(store, any_kind).await.is_empty(),
        "a kind filter never selects an entry without a record"
    );
}

async fn an_entry_awaiting_its_digest_gets_it_once(store: &dyn MetaStore) {
    // Its first chunk's SHA-256 is not known yet (a large chunk on local disk).
    let parts = vec![chunk(2), chunk(5)];
    assert_eq!(parts[0].sha256, None);
    let awaiting = save_chunks(store, &slot("prov-digest", "a"), None, parts, "", 7).await;
    let done = format!("sha256:{}", "bb".repeat(32));
    let digested = save_by(store, &slot("prov-digest", "b"), None, &done, 7).await;
    // The walk from just before an entry, one at a time: the other parts' entries, awaiting
    // a digest or not, never hide it (the store is shared).
    let walk_from = |id: EntryId| async move {
        let after = EntryId::new(id.get() - 1);
        ids(&store
            .walk_entries(EntryWalk::AwaitingDigest { after }, 1)
            .await
            .unwrap())
    };
    let walk = walk_from(awaiting).await;
    assert!(walk.contains(&awaiting), "{walk:?}");
    assert!(
        !walk_from(digested).await.contains(&digested),
        "an entry with a digest is not walked"
    );
    assert!(
        !ids(&store
            .walk_entries(EntryWalk::AwaitingDigest { after: awaiting }, 1000)
            .await
            .unwrap())
        .contains(&awaiting),
        "the walk goes on after `after`"
    );
    let (_, chunks) = store
        .entry(awaiting, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        chunks[0].chunk.sha256, None,
        "the store keeps an unknown SHA-256 unknown"
    );

    let sums = [[7u8; 32], [8u8; 32]];
    assert!(store
        .record_digest(awaiting, &sums, "sha256-chunks:77")
        .await
        .unwrap());
    let sha256_of = |chunks: Vec<hoard::meta::EntryChunk>| -> Vec<Option<[u8; 32]>> {
        chunks.into_iter().map(|c| c.chunk.sha256).collect()
    };
    let digest_of = |id: EntryId| async move {
        let all = listed_where(
            store,
            EntryFilter {
                repository_id: Some("prov-digest".into()),
                ..EntryFilter::default()
            },
        )
        .await;
        all.into_iter()
            .find(|e| e.entry.id == id)
            .unwrap()
            .record
            .digest
    };
    let (_, chunks) = store
        .entry(awaiting, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sha256_of(chunks), [Some(sums[0]), Some(sums[1])]);
    assert_eq!(digest_of(awaiting).await, "sha256-chunks:77");
    assert!(!walk_from(awaiting).await.contains(&awaiting));

    // A second record (another replica's pass) changes nothing; a removed entry is skipped.
    assert!(!store
        .record_digest(awaiting, &[[9; 32], [9; 32]], "sha256-chunks:99")
        .await
        .unwrap());
    let (_, chunks) = store
        .entry(awaiting, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sha256_of(chunks), [Some(sums[0]), Some(sums[1])]);
    assert_eq!(digest_of(awaiting).await, "sha256-chunks:77");
    assert!(!store
        .record_digest(EntryId::new(1 << 40), &sums, "sha256-chunks:77")
        .await
        .unwrap());
}

fn reader(run: &str, job: &str) -> Provenance {
    Provenance {
        run_id: run.into(),
        job_id: job.into(),
        address: "10.0.0.9".into(),
        ..writer("repo:o/r:ref:refs/heads/release")
    }
}

fn restore(entry: EntryId, reader: &Provenance, at: i64) -> hoard::meta::NewRestore {
    hoard::meta::NewRestore {
        entry,
        reader: reader.clone(),
        count: 1,
        first_at: at,
        last_at: at,
    }
}

fn restores_of(entries: Vec<EntryId>) -> hoard::meta::RestoreQuery {
    hoard::meta::RestoreQuery {
        entries,
        limit: 100,
        ..Default::default()
    }
}

async fn restore_records_name_the_readers_and_outlive_the_entry(store: &dyn MetaStore) {
    let repo = "prov-restores";
    let poisoner = Provenance {
        run_id: "poison-run".into(),
        ..writer("repo:o/r:pull_request")
    };
    let clean = Provenance {
        run_id: "clean-run".into(),
        ..writer("repo:o/r:ref:refs/heads/main")
    };
    let bad = save_by(store, &slot(repo, "bad"), Some(&poisoner), "", 100).await;
    let good = save_by(store, &slot(repo, "good"), Some(&clean), "", 110).await;
    let (release, nightly) = (
        reader("release-run", "build"),
        reader("nightly-run", "test"),
    );
    store
        .record_uses(&just_restores(&[
            restore(bad, &release, 200),
            restore(bad, &nightly, 210),
            restore(good, &nightly, 220),
            restore(EntryId::new(i64::MAX - 1), &release, 230),
        ]))
        .await
        .unwrap();
    // Restored again later: added to the reader's record, not a second one.
    store
        .record_uses(&just_restores(&[restore(bad, &release, 300)]))
        .await
        .unwrap();

    let records = store.restores(&restores_of(vec![bad])).await.unwrap();
    let readers: Vec<(&str, u64, i64, i64)> = records
        .iter()
        .map(|r| (r.reader.run_id.as_str(), r.count, r.first_at, r.last_at))
        .collect();
    assert_eq!(
        readers,
        [("release-run", 2, 200, 300), ("nightly-run", 1, 210, 210)],
        "one record per reader, most recent first, counted"
    );
    assert_eq!(records[0].reader, release, "the reader is kept whole");
    assert_eq!(records[0].written_by.as_ref(), Some(&poisoner));
    assert_eq!(
        (records[0].key.as_str(), records[0].written_at),
        ("bad", 100)
    );

    let blast = hoard::meta::RestoreQuery {
        written_under: EntryFilter {
            run_id: Some("poison-run".into()),
            ..EntryFilter::default()
        },
        limit: 100,
        ..Default::default()
    };
    let found = store.restores(&blast).await.unwrap();
    let mut runs: Vec<&str> = found.iter().map(|r| r.reader.run_id.as_str()).collect();
    runs.sort();
    assert_eq!(
        runs,
        ["nightly-run", "release-run"],
        "the blast radius of a writer's run"
    );
    assert!(found.iter().all(|r| r.entry_id == bad));

    let deleted = RemovalCause::Deleted;
    let removal = Removal {
        from: EntryState::Live,
        cause: &deleted,
        now: 400,
        delete_at: 500,
    };
    store
        .move_entries(&[bad], EntryMove::Remove(removal))
        .await
        .unwrap();
    assert_eq!(
        store.restores(&blast).await.unwrap().len(),
        2,
        "records outlive the entry"
    );
    store
        .record_uses(&just_restores(&[restore(bad, &release, 450)]))
        .await
        .unwrap();
    assert_eq!(
        store.restores(&restores_of(vec![bad])).await.unwrap()[0].count,
        2,
        "an entry that is gone records nothing more"
    );

    assert!(
        store
            .drop_restores(RestoreDrop::LastRestoredBefore(215))
            .await
            .unwrap()
            >= 1
    );
    let left = store.restores(&restores_of(vec![bad, good])).await.unwrap();
    let left: Vec<(EntryId, &str)> = left
        .iter()
        .map(|r| (r.entry_id, r.reader.run_id.as_str()))
        .collect();
    assert_eq!(
        left,
        [(bad, "release-run"), (good, "nightly-run")],
        "retention forgets the records last restored before it"
    );
}

async fn an_entry_keeps_its_most_recent_readers(store: &dyn MetaStore) {
    let entry = save_by(store, &slot("prov-readers", "k"), None, "", 1).await;
    let many = hoard::meta::MAX_READERS_PER_ENTRY + 5;
    let batch: Vec<_> = (0..many)
        .map(|i| restore(entry, &reader(&format!("run-{i}"), "j"), 1000 + i as i64))
        .collect();
    store.record_uses(&just_restores(&batch)).await.unwrap();
    let kept = store.restores(&restores_of(vec![entry])).await.unwrap();
    assert_eq!(kept.len(), hoard::meta::MAX_READERS_PER_ENTRY);
    assert_eq!(
        kept[0].reader.run_id,
        format!("run-{}", many - 1),
        "the newest first"
    );
    assert!(
        kept.iter().all(|r| r.reader.run_id != "run-0"),
        "the oldest readers are dropped"
    );
}

/// The (entry, reader run) of `entries`' records, most recent first.
async fn records_of(store: &dyn MetaStore, entries: &[EntryId]) -> Vec<(EntryId, String)> {
    store
        .restores(&restores_of(entries.to_vec()))
        .await
        .unwrap()
        .iter()
        .map(|r| (r.entry_id, r.reader.run_id.clone()))
        .collect()
}

async fn restore_records_are_forgotten_with_their_entries_on_request(store: &dyn MetaStore) {
    let repo = "prov-forget";
    let purged = save_by(store, &slot(repo, "purged"), None, "", 1).await;
    let gone = save_by(store, &slot(repo, "gone"), None, "", 2).await;
    let kept = save_by(store, &slot(repo, "kept"), None, "", 3).await;
    let batch: Vec<_> = [purged, gone, kept]
        .iter()
        .flat_map(|entry| {
            (0..3).map(move |i| restore(*entry, &reader(&format!("f-{i}"), "j"), 10 + i))
        })
        .collect();
    store.record_uses(&just_restores(&batch)).await.unwrap();
    // A removed entry's records are still its own to forget.
    let deleted = RemovalCause::Deleted;
    let removal = Removal {
        from: EntryState::Live,
        cause: &deleted,
        now: 20,
        delete_at: 30,
    };
    store
        .move_entries(&[gone], EntryMove::Remove(removal))
        .await
        .unwrap();

    assert_eq!(
        store
            .drop_restores(RestoreDrop::OfEntries(&[purged, gone]))
            .await
            .unwrap(),
        6,
        "every record of the entries named, live or gone, and how many"
    );
    assert!(records_of(store, &[purged, gone]).await.is_empty());
    assert_eq!(
        records_of(store, &[kept]).await.len(),
        3,
        "another entry's records stay"
    );
    assert_eq!(
        store
            .drop_restores(RestoreDrop::OfEntries(&[purged]))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .drop_restores(RestoreDrop::OfEntries(&[]))
            .await
            .unwrap(),
        0
    );
}

async fn restore_records_are_bounded_oldest_first(store: &dyn MetaStore) {
    // Later than every other check's records, so that the bound over all keeps these.
    const T: i64 = 1 << 40;
    let (busy, quiet) = (
        RepoId::new("prov-bound-busy"),
        RepoId::new("prov-bound-quiet"),
    );
    let a = save_by(store, &slot(busy.as_str(), "a"), None, "", T).await;
    let b = save_by(store, &slot(busy.as_str(), "b"), None, "", T).await;
    let q = save_by(store, &slot(quiet.as_str(), "q"), None, "", T).await;
    // busy: six records, b-0 and a-1 restored at the same time (the older id goes first).
    store
        .record_uses(&just_restores(&[
            restore(a, &reader("a-0", "j"), T + 1),
            restore(a, &reader("a-1", "j"), T + 3),
            restore(b, &reader("b-0", "j"), T + 3),
            restore(a, &reader("a-2", "j"), T + 5),
            restore(b, &reader("b-1", "j"), T + 6),
            restore(b, &reader("b-2", "j"), T + 8),
        ]))
        .await
        .unwrap();
    store
        .record_uses(&just_restores(&[
            restore(q, &reader("q-0", "j"), T + 2),
            restore(q, &reader("q-1", "j"), T + 7),
        ]))
        .await
        .unwrap();
    // Restored again: its latest restore is what ages it.
    store
        .record_uses(&just_restores(&[restore(a, &reader("a-0", "j"), T + 9)]))
        .await
        .unwrap();

    let runs = |records: Vec<(EntryId, String)>| -> Vec<String> {
        records.into_iter().map(|(_, run)| run).collect()
    };
    // A bound on each repository: six records are not over 6, so nothing of busy goes.
    store
        .drop_restores(RestoreDrop::Oldest {
            of: RestoreBound::EachRepository,
            keep: 6,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(
        records_of(store, &[a, b]).await.len(),
        6,
        "six records: not over 6"
    );
    // Four of busy's six, one at a time: the oldest first, the older id first on a tie.
    assert_eq!(
        store
            .drop_restores(RestoreDrop::Oldest {
                of: RestoreBound::Repository(&busy),
                keep: 4,
                limit: 1
            })
            .await
            .unwrap(),
        1,
        "at most `limit` at a time"
    );
    assert_eq!(
        store
            .drop_restores(RestoreDrop::Oldest {
                of: RestoreBound::Repository(&busy),
                keep: 4,
                limit: 10
            })
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .drop_restores(RestoreDrop::Oldest {
                of: RestoreBound::Repository(&busy),
                keep: 4,
                limit: 10
            })
            .await
            .unwrap(),
        0,
        "nothing past the bound"
    );
    assert_eq!(
        runs(records_of(store, &[a, b]).await),
        ["a-0", "b-2", "b-1", "a-2"],
        "a-1 and b-0 last restored at T+3: a-1 (the older record) went first, then b-0"
    );
    assert_eq!(
        runs(records_of(store, &[q]).await),
        ["q-1", "q-0"],
        "another repository's records stay"
    );

    // Over all repositories: the three most recent of every record stay.
    assert!(
        store
            .drop_restores(RestoreDrop::Oldest {
                of: RestoreBound::All,
                keep: 3,
                limit: 1000
            })
            .await
            .unwrap()
            >= 3
    );
    assert_eq!(runs(records_of(store, &[a, b]).await), ["a-0", "b-2"]);
    assert_eq!(runs(records_of(store, &[q]).await), ["q-1"]);
    // Each repository down to one: busy's older record goes, quiet's only one stays.
    assert_eq!(
        store
            .drop_restores(RestoreDrop::Oldest {
                of: RestoreBound::EachRepository,
                keep: 1,
                limit: 10,
            })
            .await
            .unwrap(),
        1,
        "only busy is over 1"
    );
    assert_eq!(runs(records_of(store, &[a, b]).await), ["a-0"]);
    assert_eq!(runs(records_of(store, &[q]).await), ["q-1"]);
}

async fn a_tools_object_and_a_read_through_keep_their_records_in_and_out_of_quarantine(
    store: &dyn MetaStore,
) {
    use hoard::model::{RemovalCause, Tool, ToolObject};
    let object = ToolObject::new(
        Tool::Turbo,
        [
            ("x-artifact-duration", "1234"),
            ("x-artifact-tag", "c2ln: bmF0dXJl"),
        ],
    )
    .unwrap();
    let s = slot("prov-tool", "turbo/team/0123456789abcdef");
    let chunks = [chunk(5)];
    // Both at once, which no save makes, so that each is seen to be kept on its own column.
    let from = Some("results-receiver.actions.githubusercontent.com".to_owned());
    let new = NewEntry {
        record: EntryRecord {
            tool: Some(object.clone()),
            read_through: from.clone(),
            ..EntryRecord::default()
        },
        ..NewEntry::new(&s, &chunks, 40)
    };
    let id = store.finalize(None, new).await.unwrap();
    let listed = |quarantined| EntryFilter {
        id: Some(id),
        quarantined,
        ..EntryFilter::default()
    };
    let found = listed_where(store, listed(false)).await;
    assert_eq!(
        found[0].record.tool.as_ref(),
        Some(&object),
        "listed with its tool"
    );
    let headers: Vec<_> = found[0].record.tool.as_ref().unwrap().headers().collect();
    assert_eq!(
        headers,
        [
            ("x-artifact-duration", "1234"),
            ("x-artifact-tag", "c2ln: bmF0dXJl")
        ],
        "the headers read back as they were sent, in order"
    );

    let cause = RemovalCause::Quarantined("conformance".into());
    let removal = Removal {
        from: EntryState::Live,
        cause: &cause,
        now: 41,
        delete_at: 1041,
    };
    store
        .move_entries(&[id], EntryMove::Remove(removal))
        .await
        .unwrap();
    assert_eq!(found[0].record.read_through, from, "listed with its origin");
    let found = listed_where(store, listed(true)).await;
    assert_eq!(
        found[0].record.tool.as_ref(),
        Some(&object),
        "quarantine keeps it"
    );
    assert_eq!(found[0].record.read_through, from, "quarantine keeps it");
    store.move_entries(&[id], EntryMove::Release).await.unwrap();
    let found = listed_where(store, listed(false)).await;
    assert_eq!(
        found[0].record.tool.as_ref(),
        Some(&object),
        "and so does a release"
    );
    assert_eq!(found[0].record.read_through, from, "and so does a release");

    // An Actions entry has none.
    let plain = save_by(store, &slot("prov-tool", "plain"), None, "", 42).await;
    let found = listed_where(
        store,
        EntryFilter {
            id: Some(plain),
            ..EntryFilter::default()
        },
    )
    .await;
    assert_eq!(found[0].record.tool, None);
    assert_eq!(found[0].record.read_through, None);
}
