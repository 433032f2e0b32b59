//! The metadata store contract (`hoard::meta::conformance`) on every backend: the in-memory
//! fake, SQLite, PostgreSQL and MySQL/MariaDB. Migrations are idempotent: opening a store twice
//! on one database keeps its data.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::databases::{Server, TestDatabase};
use hoard::meta::{self, conformance, DatabaseUrl, MemoryStore, MetaStore};

#[tokio::test]
async fn the_in_memory_fake_conforms() {
    conformance::run_all(Arc::new(MemoryStore::new())).await;
}

/// Runs the suite on a fresh store, then opens the same database again (migrations run a
/// second time) and checks that what was stored is still there.
async fn conforms(url: DatabaseUrl) {
    let store = meta::open(&url, 4).await.unwrap();
    conformance::run_all(store.clone()).await;
    let probe = probe_entry(store.as_ref()).await;
    drop(store);
    let reopened = meta::open(&url, 4).await.unwrap();
    assert!(
        reopened.entry(probe).await.unwrap().is_some(),
        "reopening (migrations again) keeps the data"
    );
}

/// An entry the suite stored: the one keyed "k" in repository "iso-a".
async fn probe_entry(store: &dyn MetaStore) -> i64 {
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

#[tokio::test]
async fn sqlite_conforms() {
    let dir = tempfile::tempdir().unwrap();
    conforms(DatabaseUrl::Sqlite(dir.path().join("hoard.db"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_conforms() {
    let Some(db) = TestDatabase::create(Server::Postgres).await else {
        return;
    };
    conforms(DatabaseUrl::parse(&db.url).unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
async fn postgres_migrations_are_safe_to_start_concurrently() {
    concurrent_starts_migrate_once(Server::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_migrations_are_safe_to_start_concurrently() {
    concurrent_starts_migrate_once(Server::MySql).await;
}

/// A database that cannot be reached fails at once, naming the cause.
#[tokio::test]
async fn an_unreachable_database_fails_with_its_cause() {
    for url in [
        "postgres://hoard@127.0.0.1:1/hoard",
        "mysql://hoard@127.0.0.1:1/hoard",
    ] {
        let err = meta::open(&DatabaseUrl::parse(url).unwrap(), 2)
            .await
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(err, hoard::meta::MetaError::Unavailable(ref m) if m.contains("refused")),
            "{url}: {err}"
        );
    }
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
