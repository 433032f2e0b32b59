//! The metadata store contract (`conformance/`, a part per store trait) on every backend: SQLite,
//! PostgreSQL and MySQL/MariaDB. Migrations are idempotent: opening a store twice
//! on one database keeps its data.
#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
mod conformance;

use std::sync::Arc;

use common::databases::{Server, TestDatabase};
use hoard::meta::{self, DatabaseUrl, EntryMove, EntryState, MetaStore, UploadChange};
use hoard::model::EntryId;

/// Runs the suite on a fresh store, then opens the same database again (migrations run a
/// second time) and checks that what was stored is still there.
async fn conforms(url: DatabaseUrl) {
    let store = meta::open(&url, 4).await.unwrap();
    let wrong = meta::schema_disagreements(&url).await.unwrap();
    assert!(
        wrong.is_empty(),
        "the migrations and the declared tables disagree: {wrong:#?}"
    );
    conformance::run_all(store.clone()).await;
    let probe = probe_entry(store.as_ref()).await;
    // The newest entry removed before a restart: its id is not given again after it.
    let newest =
        conformance::save(store.as_ref(), &conformance::slot("restart", "a"), &[1], 1).await;
    let deleted = hoard::model::RemovalCause::Deleted;
    let removal = meta::Removal {
        from: EntryState::Live,
        cause: &deleted,
        now: 1,
        delete_at: 2,
    };
    store
        .move_entries(&[newest], EntryMove::Remove(removal))
        .await
        .unwrap();
    drop(store);
    let reopened = meta::open(&url, 4).await.unwrap();
    assert!(
        reopened
            .entry(probe, EntryState::Live)
            .await
            .unwrap()
            .is_some(),
        "reopening (migrations again) keeps the data"
    );
    let next = conformance::save(
        reopened.as_ref(),
        &conformance::slot("restart", "b"),
        &[1],
        2,
    )
    .await;
    assert!(
        next > newest,
        "after a restart {next:?} is past the removed {newest:?}"
    );
}

/// An entry the suite stored: the one keyed "k" in repository "iso-a".
async fn probe_entry(store: &dyn MetaStore) -> EntryId {
    let found = store
        .find_candidates(
            &hoard::model::RepoId::new("iso-a"),
            &hoard::model::Version::parse("v1").unwrap(),
            &[hoard::model::Scope::new("refs/heads/main")],
            &["k".to_owned()],
        )
        .await
        .unwrap();
    found.first().expect("the suite stored iso-a/k").id
}

/// The check of declared tables against the migrations sees a column the migrations lack and
/// one of another kind, and lets pass the columns every declared INSERT may leave out.
#[tokio::test]
async fn a_schema_that_differs_from_the_declared_tables_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hoard.db");
    let url = DatabaseUrl::Sqlite(path.clone());
    drop(meta::open(&url, 1).await.unwrap());
    assert_eq!(
        meta::schema_disagreements(&url).await.unwrap(),
        Vec::<String>::new()
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "ALTER TABLE entries DROP COLUMN family;
         ALTER TABLE entries RENAME COLUMN digest TO old_digest;
         ALTER TABLE entries ADD COLUMN digest BLOB NOT NULL DEFAULT x'';
         ALTER TABLE pending_deletions ADD COLUMN owner TEXT NOT NULL DEFAULT '';",
    )
    .unwrap();
    conn.execute_batch(
        "ALTER TABLE stats_families ADD COLUMN note TEXT;
         CREATE TABLE leftovers (id INTEGER PRIMARY KEY);",
    )
    .unwrap();
    drop(conn);
    let wrong = meta::schema_disagreements(&url).await.unwrap();
    assert!(
        wrong.contains(&"entries.family is declared but missing".to_owned()),
        "{wrong:#?}"
    );
    assert!(
        wrong.contains(&"entries.digest is declared Text but is blob".to_owned()),
        "{wrong:#?}"
    );
    // Both ways: what the database holds and no declaration names is reported too, whether
    // or not an INSERT would trip on it.
    for undeclared in [
        "entries.old_digest is in the database but no row declares it",
        "pending_deletions.owner is in the database but no row declares it",
        "stats_families.note is in the database but no row declares it",
        "table leftovers is in the database but not declared",
    ] {
        assert!(wrong.contains(&undeclared.to_owned()), "{wrong:#?}");
    }
    assert_eq!(wrong.len(), 6, "{wrong:#?}");
}

#[tokio::test]
async fn sqlite_conforms() {
    let dir = tempfile::tempdir().unwrap();
    conforms(DatabaseUrl::Sqlite(dir.path().join("hoard.db"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs PostgreSQL or MariaDB"
)]
async fn postgres_conforms() {
    let Some(db) = TestDatabase::create(Server::Postgres).await else {
        return;
    };
    conforms(DatabaseUrl::parse(&db.url).unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs PostgreSQL or MariaDB"
)]
async fn mysql_conforms() {
    let Some(db) = TestDatabase::create(Server::MySql).await else {
        return;
    };
    conforms(DatabaseUrl::parse(&db.url).unwrap()).await;
}

/// Several processes starting at once on a new database each run the migrations; the lock
/// makes exactly one apply them and the others find them applied.
async fn concurrent_starts_migrate_once(server: Server) {
    let Some(db) = TestDatabase::create(server).await else {
        return;
    };
    let url = DatabaseUrl::parse(&db.url).unwrap();
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { meta::open(&url, 2).await.map(|_| ()) })
        })
        .collect();
    for open in opens {
        open.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs PostgreSQL or MariaDB"
)]
async fn postgres_migrations_are_safe_to_start_concurrently() {
    concurrent_starts_migrate_once(Server::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs PostgreSQL or MariaDB"
)]
async fn mysql_migrations_are_safe_to_start_concurrently() {
    concurrent_starts_migrate_once(Server::MySql).await;
}

/// A database that cannot be reached fails at once, naming the cause and not the password.
#[tokio::test]
async fn an_unreachable_database_fails_with_its_cause() {
    for url in [
        "postgres://hoard:db-password-value@127.0.0.1:1/hoard",
        "mysql://hoard:db-password-value@127.0.0.1:1/hoard",
    ] {
        let url = DatabaseUrl::parse(url).unwrap();
        let err = meta::open(&url, 2).await.map(|_| ()).unwrap_err();
        assert!(
            matches!(err, hoard::meta::MetaError::Unavailable(ref m) if m.contains("refused")),
            "{url:?}: {err}"
        );
        let shown = format!("{err} {err:?} {url:?} {}", url.redacted());
        assert!(!shown.contains("db-password-value"), "{shown}");
    }
}

/// The widest lookup hoard makes, 16 readable scopes (`MAX_READ_SCOPES`) × 10 keys
/// (`MAX_LOOKUP_KEYS`) of the longest kind, is answered by every backend (no statement limit
/// is met) and finds the entries it should: the exact key in the last scope and the newest
/// prefix match.
async fn the_widest_lookup_is_answered(store: Arc<dyn MetaStore>) {
    use hoard::meta::{NewEntry, NewUpload};
    use hoard::model::{
        BlobName, BlockId, CacheKey, Chunk, EntryRecord, RepoId, Scope, Slot, Version,
        MAX_KEY_CHARS, MAX_LOOKUP_KEYS, MAX_READ_SCOPES,
    };
    let version = Version::parse(&"v".repeat(512)).unwrap();
    let scopes: Vec<Scope> = (0..MAX_READ_SCOPES)
        .map(|i| Scope::new(format!("refs/heads/{i:02}-{}", "b".repeat(240))))
        .collect();
    // Keys of 512 characters of four UTF-8 bytes, told apart by their first character.
    let keys: Vec<String> = (0..MAX_LOOKUP_KEYS)
        .map(|i| format!("{i}{}", "\u{1F600}".repeat(MAX_KEY_CHARS - 1)))
        .collect();
    let save = |scope: usize, key: String, now: i64| {
        let (store, scope, version) = (store.clone(), scopes[scope].clone(), version.clone());
        async move {
            let slot = Slot {
                repository: RepoId::new("wide"),
                scope,
                key: CacheKey::parse(&key).unwrap(),
                version,
            };
            let new = NewUpload {
                slot: &slot,
                written_by: &conformance::writer("wide"),
                now,
            };
            let id = store.create_upload(new, None).await.unwrap();
            let upload = conformance::upload_of(store.as_ref(), id).await.unwrap();
            let chunk = Chunk {
                blob: BlobName::random(),
                size: 1,
                sha256: Some([1; 32]),
                xxh3: None,
            };
            let parts = [(BlockId::parse(b"b").unwrap(), chunk.clone())];
            store
                .change_upload(&upload, UploadChange::Commit(&parts), now)
                .await
                .unwrap();
            let upload = conformance::upload_of(store.as_ref(), id).await.unwrap();
            let chunks = [chunk];
            let entry = NewEntry {
                key: &key,
                record: EntryRecord {
                    written_by: upload.written_by.clone(),
                    ..EntryRecord::default()
                },
                ..NewEntry::new(&slot, &chunks, now)
            };
            store.finalize(Some(&upload), entry).await.unwrap()
        }
    };
    let exact = save(MAX_READ_SCOPES - 1, keys[0].clone(), 1).await;
    // The last key asked is a prefix of two entries' keys: the newer is the one found.
    let prefix: String = keys[MAX_LOOKUP_KEYS - 1]
        .chars()
        .take(MAX_KEY_CHARS - 6)
        .collect();
    let older = save(3, format!("{prefix}-older"), 2).await;
    let newer = save(3, format!("{prefix}-newer"), 3).await;
    let mut asked: Vec<String> = keys.iter().map(|k| k.to_lowercase()).collect();
    asked[MAX_LOOKUP_KEYS - 1] = prefix.to_lowercase();
    let found = store
        .find_candidates(&RepoId::new("wide"), &version, &scopes, &asked)
        .await
        .unwrap();
    let ids: std::collections::BTreeSet<EntryId> = found.iter().map(|c| c.id).collect();
    assert!(ids.contains(&exact), "the exact key in the last scope");
    assert!(ids.contains(&newer), "the newest prefix match");
    assert!(!ids.contains(&older), "only the newest prefix match");
}

#[tokio::test]
async fn the_widest_lookup_is_answered_by_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::Sqlite(dir.path().join("hoard.db"));
    the_widest_lookup_is_answered(meta::open(&url, 4).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs PostgreSQL or MariaDB"
)]
async fn the_widest_lookup_is_answered_by_postgres() {
    let Some(db) = TestDatabase::create(Server::Postgres).await else {
        return;
    };
    let url = DatabaseUrl::parse(&db.url).unwrap();
    the_widest_lookup_is_answered(meta::open(&url, 4).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs PostgreSQL or MariaDB"
)]
async fn the_widest_lookup_is_answered_by_mysql() {
    let Some(db) = TestDatabase::create(Server::MySql).await else {
        return;
    };
    let url = DatabaseUrl::parse(&db.url).unwrap();
    the_widest_lookup_is_answered(meta::open(&url, 4).await.unwrap()).await;
}

#[tokio::test]
async fn sqlite_creates_the_directory_of_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not").join("yet").join("hoard.db");
    let store = meta::open(&DatabaseUrl::Sqlite(path.clone()), 1)
        .await
        .unwrap();
    store.ping().await.unwrap();
    assert!(path.exists());
}
