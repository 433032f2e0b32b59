//! The SQLite store's plans and bounds: every statement of the hot paths uses an index at a
//! hundred thousand entries, and the write-ahead log stays bounded under a long reader.

use std::collections::HashMap;

use super::wal::WAL_HARD_LIMIT;
use super::*;
use crate::meta::{Removal, RestoreBound};
use crate::model::{CacheKey, EntryFilter};

/// Statements run by this test process's stores, with their parameters, while recording.
static STATEMENTS: Mutex<Option<Vec<String>>> = Mutex::new(None);

/// While counting the statements run on one thread (a current-thread test's, where the store
/// runs its statements in place; tests may run side by side in one process): the
/// virtual-machine steps of those that finished, and each running statement's step count
/// (cumulative over its runs, as SQLite keeps it) when it started.
static VM_STEPS: Mutex<Option<StepCount>> = Mutex::new(None);

struct StepCount {
    thread: std::thread::ThreadId,
    total: u64,
    started: HashMap<String, i32>,
}

pub(super) fn record_statement(event: rusqlite::trace::TraceEvent<'_>) {
    use rusqlite::trace::TraceEvent;
    use rusqlite::StatementStatus::VmStep;
    let on_this_thread = |c: &&mut StepCount| c.thread == std::thread::current().id();
    match event {
        TraceEvent::Stmt(stmt, sql) => {
            let mut recorded = STATEMENTS.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(list) = recorded.as_mut() {
                list.push(stmt.expanded_sql().unwrap_or_else(|| sql.to_owned()));
            }
            let mut steps = VM_STEPS.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(count) = steps.as_mut().filter(on_this_thread) {
                count
                    .started
                    .insert(sql.to_owned(), stmt.get_status(VmStep));
            }
        }
        TraceEvent::Profile(stmt, _) => {
            let mut steps = VM_STEPS.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(count) = steps.as_mut().filter(on_this_thread) {
                if let Some(before) = count.started.remove(stmt.sql().as_ref()) {
                    count.total += (stmt.get_status(VmStep) - before).max(0) as u64;
                }
            }
        }
        _ => {}
    }
}

/// The virtual-machine steps SQLite ran on this thread for `work`: its measure of the work a
/// statement does (rows visited, compared, written), the same on a loaded machine as on an
/// idle one.
pub(crate) async fn vm_steps<T>(work: impl std::future::Future<Output = T>) -> (u64, T) {
    *VM_STEPS.lock().unwrap() = Some(StepCount {
        thread: std::thread::current().id(),
        total: 0,
        started: HashMap::new(),
    });
    let out = work.await;
    let count = VM_STEPS.lock().unwrap().take().unwrap();
    (count.total, out)
}

fn slot(repo: &str, key: &str) -> Slot {
    Slot {
        repository: RepoId::new(repo),
        scope: Scope::new("refs/heads/main"),
        key: CacheKey::parse(key).unwrap(),
        version: Version::parse("v").unwrap(),
    }
}

fn chunk(size: u64) -> Chunk {
    Chunk {
        blob: BlobName::random(),
        size,
        sha256: Some([1; 32]),
        xxh3: Some(size),
    }
}

/// Every statement of the hot paths and the lifecycle, run against 100,000 entries in 1,000
/// repositories, searches an index: none scans a large table (a scan in index order that
/// stops at a LIMIT is allowed).
#[tokio::test]
async fn every_statement_uses_an_index_at_a_hundred_thousand_entries() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("hoard.db"))
        .await
        .unwrap();
    for batch in 0..10 {
        let entries = (0..10_000)
            .map(|i| {
                let n = batch * 10_000 + i;
                let s = slot(&format!("repo-{}", n % 1000), &format!("key-{n}"));
                (s, vec![chunk(1000)], n as i64)
            })
            .collect();
        store.import(entries).await.unwrap();
    }
    *STATEMENTS.lock().unwrap() = Some(Vec::new());

    // A save, restores and the lifecycle's queries, as the domain makes them.
    let s = slot("repo-7", "key-new");
    let reserve = SlotRead::Reserve { live_since: 0 };
    let state = store.slot_state(&s, reserve).await.unwrap();
    assert!(!state.entry_exists);
    let new = NewUpload {
        slot: &s,
        written_by: &crate::model::Provenance::anonymous(),
        now: 200_000,
    };
    let id = store.create_upload(new, None).await.unwrap();
    let upload = upload_of(&store, id).await;
    let c = chunk(10);
    store
        .stage_block(&upload, &BlockId::parse(b"b").unwrap(), &c, 200_001)
        .await
        .unwrap();
    let state = store
        .upload(id, UploadRead::Block(&BlockId::parse(b"b").unwrap()))
        .await
        .unwrap()
        .unwrap()
        .block;
    assert_eq!((state.staged_count, state.copy), (1, Some(c.clone())));
    let UploadView { upload, blocks, .. } =
        store.upload(id, UploadRead::Blocks).await.unwrap().unwrap();
    let parts: Vec<(BlockId, Chunk)> = blocks.staged.into_iter().collect();
    store.commit_parts(&upload, &parts, 200_002).await.unwrap();
    let fin = store.slot_state(&s, SlotRead::Finalize).await.unwrap();
    let upload = fin.open.unwrap();
    let chunks = vec![c.clone()];
    let entry = NewEntry {
        key: "key-new",
        record: crate::model::EntryRecord {
            written_by: upload.written_by.clone(),
            ..Default::default()
        },
        ..NewEntry::new(&s, &chunks, 200_003)
    };
    let new_id = store.finalize(Some(&upload), entry).await.unwrap();
    let repo = RepoId::new("repo-7");
    let version = Version::parse("v").unwrap();
    let scopes = [
        Scope::new("refs/heads/main"),
        Scope::new("refs/heads/other"),
    ];
    let found = store
        .find_candidates(&repo, &version, &scopes, &["key-new".into(), "key-".into()])
        .await
        .unwrap();
    assert!(found.iter().any(|c| c.id == new_id));
    let filter = EntryFilter {
        repository_id: Some(repo.as_str().to_owned()),
        scope: Some(scopes[0].clone()),
        folded_key: Some("key-new".into()),
        ..EntryFilter::default()
    };
    let with_key = EntryPage {
        descending: true,
        ..EntryPage::by_creation(&filter, 50)
    };
    let listed = store.select_entries(&with_key).await.unwrap().entries;
    assert!(listed.iter().any(|e| e.entry.id == new_id));
    store
        .entry(new_id, EntryState::Live)
        .await
        .unwrap()
        .unwrap();
    let hits = Uses {
        hits: vec![(new_id, 1, 200_004)],
        ..Uses::default()
    };
    store.record_uses(&hits).await.unwrap();
    assert!(store.usage(UsageOf::Repository(&repo)).await.unwrap().bytes > 0);
    let lru = store
        .walk_entries(EntryWalk::LeastRecentlyUsed(Some(&repo)), 8)
        .await
        .unwrap();
    store
        .walk_entries(EntryWalk::LeastRecentlyUsed(None), 8)
        .await
        .unwrap();
    for class in [ScopeClass::Branch, ScopeClass::PullRequestOrTag] {
        store
            .walk_entries(EntryWalk::LeastRecentlyUsedOfClass(&repo, class), 8)
            .await
            .unwrap();
    }
    store
        .walk_entries(
            EntryWalk::Expired {
                unused_before: 50,
                created_before: Some(50),
            },
            10,
        )
        .await
        .unwrap();
    let cause = RemovalCause::Evicted;
    let removal = Removal {
        from: EntryState::Live,
        cause: &cause,
        now: 200_005,
        delete_at: 300_000,
    };
    store
        .move_entries(&[lru[0].id], EntryMove::Remove(removal))
        .await
        .unwrap();
    let due = store.take_deletions(&[], 300_000, 10).await.unwrap();
    store.referenced(&due).await.unwrap();
    store.take_deletions(&due, 300_000, 10).await.unwrap();
    let sweep = UploadSweep {
        open_before: 10,
        limit: 10,
        prune_before: Some(10),
    };
    store.sweep_uploads(sweep).await.unwrap();
    let after = EntryId::new(50_000);
    store
        .walk_entries(EntryWalk::All { after }, 10)
        .await
        .unwrap();
    // The preloaded entries have their digests; the one finalized above does not.
    let after = EntryId::new(0);
    let awaiting = store
        .walk_entries(EntryWalk::AwaitingDigest { after }, 10)
        .await
        .unwrap();
    assert!(awaiting.iter().any(|e| e.id == new_id), "{awaiting:?}");
    store
        .record_digest(new_id, &[[3; 32]], "sha256:03")
        .await
        .unwrap();

    let statements = STATEMENTS.lock().unwrap().take().unwrap();
    let reader = Connection::open(dir.path().join("hoard.db")).unwrap();
    const LARGE: [&str; 6] = [
        "entries",
        "entry_chunks",
        "uploads",
        "upload_parts",
        "staged_blocks",
        "pending_deletions",
    ];
    let mut checked = 0;
    for sql in statements.iter().filter(|s| {
        let head = s.trim_start().to_ascii_uppercase();
        ["SELECT", "INSERT", "UPDATE", "DELETE", "WITH"]
            .iter()
            .any(|k| head.starts_with(k))
    }) {
        let mut plan = reader
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap();
        let lines: Vec<String> = plan
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for line in &lines {
            let scanned = line
                .strip_prefix("SCAN ")
                .and_then(|rest| rest.split_whitespace().next());
            if let Some(table) = scanned.filter(|t| LARGE.contains(t)) {
                let bounded = line.contains("INDEX") && sql.contains("LIMIT");
                assert!(bounded, "{table} is scanned by:\n{sql}\nplan: {lines:?}");
            }
        }
        checked += 1;
    }
    assert!(checked > 25, "only {checked} statements were checked");
}

const MARGIN: u64 = 32 << 20; // writes in flight between two looks at the log's size

fn wal_size(store: &SqliteStore) -> u64 {
    store.wal.size()
}

/// A block list of 2,000 ids of 1,000 bytes: each commit rewrites a few MiB of rows.
fn big_block_list() -> Vec<(BlockId, Chunk)> {
    (0..2000)
        .map(|i| {
            let id = BlockId::parse(format!("{i:0>1000}").as_bytes()).unwrap();
            let chunk = Chunk {
                blob: BlobName::random(),
                size: 1,
                sha256: Some([7; 32]),
                xxh3: None,
            };
            (id, chunk)
        })
        .collect()
}

/// Upload `id`, as a change to it is made at its revision.
async fn upload_of(store: &SqliteStore, id: UploadId) -> crate::model::Upload {
    store
        .upload(id, UploadRead::Blocks)
        .await
        .unwrap()
        .unwrap()
        .upload
}

async fn commit(
    store: &SqliteStore,
    id: UploadId,
    parts: &[(BlockId, Chunk)],
) -> Result<(), MetaError> {
    let upload = upload_of(store, id).await;
    store.commit_parts(&upload, parts, 1).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_ahead_log_stays_bounded_even_under_a_long_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hoard.db");
    let store = SqliteStore::open(&path).await.unwrap();
    // The durability loop's part: checkpoint when the store asks.
    let asked = store.clone();
    let checkpointer = tokio::spawn(async move {
        loop {
            asked.wants_checkpoint().await;
            asked.checkpoint().await.unwrap();
        }
    });
    let slot = Slot {
        repository: RepoId::new("1"),
        scope: Scope::new("refs/heads/main"),
        key: CacheKey::parse("k").unwrap(),
        version: Version::parse("v").unwrap(),
    };
    let new = NewUpload {
        slot: &slot,
        written_by: &crate::model::Provenance::anonymous(),
        now: 1,
    };
    let id = store.create_upload(new, None).await.unwrap();
    let parts = big_block_list();

    // Several times the soft limit written: checkpoints keep the log near it.
    let (mut peak, mut resets, mut last) = (0, 0, 0);
    for _ in 0..160 {
        commit(&store, id, &parts).await.unwrap();
        let size = wal_size(&store);
        if size < last {
            resets += 1;
        }
        (peak, last) = (peak.max(size), size);
    }
    // About seven times the soft limit was written; how often the log started over depends
    // on how fast this machine checkpoints, but it did, and it never passed the bound.
    assert!(resets >= 1, "the log never started over");
    assert!(peak <= WAL_HARD_LIMIT + MARGIN, "peak {peak}");

    // A reader holding a snapshot: writes go on until the hard bound, then are refused.
    let reader = Connection::open(&path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT COUNT(*) FROM upload_parts", [], |r| r.get(0))
        .unwrap();
    let mut refused = false;
    for _ in 0..200 {
        match commit(&store, id, &parts).await {
            Ok(()) => assert!(wal_size(&store) <= WAL_HARD_LIMIT + MARGIN),
            Err(MetaError::Unavailable(_)) => {
                refused = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        refused,
        "writes are refused at the bound while the reader holds the log"
    );
    assert!(wal_size(&store) <= WAL_HARD_LIMIT + MARGIN);

    // The reader leaves: writes resume (clients retry a refused write) and the log starts
    // over.
    reader.execute_batch("COMMIT").unwrap();
    let mut resumed = false;
    for _ in 0..100 {
        if commit(&store, id, &parts).await.is_ok() {
            resumed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(resumed, "writes resume once the reader is gone");
    store.checkpoint().await.unwrap();
    assert!(wal_size(&store) <= WAL_SOFT_LIMIT, "{}", wal_size(&store));

    // A restart after a crash finds a large log and empties it.
    commit(&store, id, &parts).await.unwrap();
    checkpointer.abort();
    let _ = checkpointer.await;
    let before = wal_size(&store);
    assert!(before > 0);
    std::mem::forget(store); // as after kill -9: no clean close
    let reopened = SqliteStore::open(&path).await.unwrap();
    assert!(
        wal_size(&reopened) < before.min(WAL_SOFT_LIMIT),
        "{} after a restart, {before} before",
        wal_size(&reopened)
    );
}

/// The maintenance pass's statements over the restore records (the bounds, the retention, a
/// purge's reclaiming) go by an index and sort nothing: the table holds up to
/// `--max-restore-records` rows, and more between two passes.
#[tokio::test]
async fn restore_records_are_trimmed_and_forgotten_by_index() {
    use crate::meta::sql::{drop_restores_sql, RESTORE_HEAVY_REPOSITORIES};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hoard.db");
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .write(|tx| {
            let mut insert = tx.prepare(
                "INSERT INTO restores (entry_id, repository, scope, key, written_at, writer_kind,
                     writer_issuer, writer_subject, writer_run_id, writer_job_id, writer_address,
                     reader_hash, reader_kind, reader_issuer, reader_subject, reader_run_id,
                     reader_job_id, reader_address, first_at, last_at, count)
                 VALUES (?, ?, 's', 'k', 0, '', '', '', '', '', '', ?, '', '', '', '', '', '', ?, ?, 1)",
            )?;
            for i in 0..20_000i64 {
                let hash = i.to_le_bytes().to_vec();
                insert.execute(params![i / 50, format!("repo-{}", i % 100), hash, i, i])?;
            }
            Ok(())
        })
        .await
        .unwrap();
    let reader = Connection::open(&path).unwrap();
    reader.execute_batch("ANALYZE").unwrap();
    let repository = RepoId::new("repo-1");
    let drops = [
        RestoreDrop::Oldest {
            of: RestoreBound::Repository(&repository),
            keep: 1,
            limit: 1,
        },
        RestoreDrop::Oldest {
            of: RestoreBound::All,
            keep: 1,
            limit: 1,
        },
        RestoreDrop::LastRestoredBefore(0),
        RestoreDrop::OfEntries(&[EntryId::new(1)]),
    ];
    let mut statements = vec![RESTORE_HEAVY_REPOSITORIES.on(Backend::Sqlite).to_owned()];
    for drop in &drops {
        for (sql, _) in drop_restores_sql(drop, &[]).into_iter().flatten() {
            statements.push(sql.on(Backend::Sqlite).to_owned());
        }
    }
    assert_eq!(
        statements.len(),
        5,
        "every statement over the restore records"
    );
    for sql in statements {
        let mut plan = reader
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap();
        let unbound = vec![rusqlite::types::Null; plan.parameter_count()];
        let lines: Vec<String> = plan
            .query_map(rusqlite::params_from_iter(unbound), |r| {
                r.get::<_, String>(3)
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for line in &lines {
            let unindexed = line.starts_with("SCAN restores") && !line.contains("INDEX");
            assert!(
                !unindexed && !line.contains("TEMP B-TREE"),
                "{sql}\nplan: {lines:?}"
            );
        }
    }
}
