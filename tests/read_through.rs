//! Read-through to an upstream cache (`--upstream-cache`, issue #59): a local miss asks the
//! upstream with the job's own token, stores a hit in the job's own scope and serves it; the
//! next restore is local. The upstream here is another hoard, which speaks GitHub's v2 protocol.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{json_of, main_token, random_bytes, token, TestServer, MAIN, VERSION};
use futures_util::StreamExt as _;
use serde_json::{json, Value};

const ADMIN: &str = "read-through-admin-token-0123456789";
/// The upstream's bound where the bound is not what is tested: what a loaded machine may need.
const PATIENT: &str = "60s";

async fn lookup(srv: &TestServer, token: &str, key: &str) -> Value {
    let body = json!({"key": key, "version": VERSION});
    let (status, found) = srv.twirp("GetCacheEntryDownloadURL", token, body).await;
    assert_eq!(status, 200, "{found}");
    found
}

async fn download(link: &str) -> Vec<u8> {
    let res = reqwest::get(link).await.unwrap();
    assert_eq!(res.status(), 200);
    res.bytes().await.unwrap().to_vec()
}

/// The entries of repository 1 at `srv`, by key, as the admin API lists them.
async fn listed(srv: &TestServer) -> Vec<Value> {
    let res = srv
        .http
        .get(srv.url("/_hoard/api/v1/caches?repository=1&per_page=100"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let (status, list) = json_of(res).await;
    assert_eq!(status, 200, "{list}");
    list["actions_caches"].as_array().unwrap().clone()
}

/// [`listed`] once it holds `n` entries (a read-through entry is stored as its download ends),
/// or as it is after 60 s.
async fn listed_when(srv: &TestServer, n: usize) -> Vec<Value> {
    common::poll(
        Duration::from_secs(60),
        async || listed(srv).await,
        |e| e.len() == n,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_miss_reads_through_the_upstream_into_the_jobs_own_scope() {
    let upstream = TestServer::start().await;
    let data = random_bytes(3 << 20, 1);
    upstream.save(&main_token(), "deps-1", VERSION, &data).await;
    upstream
        .save(&main_token(), "shared", VERSION, b"main's")
        .await;
    let local = TestServer::start_with(&[
        "--upstream-cache",
        &upstream.base,
        "--upstream-cache-timeout",
        PATIENT,
        "--admin-token",
        ADMIN,
    ])
    .await;

    // Main: missing here, found upstream, stored here, served from here.
    let found = lookup(&local, &main_token(), "deps-1").await;
    assert_eq!(
        (found["ok"].as_bool(), found["matched_key"].as_str()),
        (Some(true), Some("deps-1")),
        "{found}"
    );
    let link = found["signed_download_url"].as_str().unwrap().to_owned();
    assert!(link.starts_with(&local.base), "served by hoard: {link}");
    // Another job missing the same meanwhile reads the upstream's copy: one fetch each.
    let again = lookup(&local, &main_token(), "deps-1").await;
    let upstream_link = again["signed_download_url"].as_str().unwrap();
    assert!(upstream_link.starts_with(&upstream.base), "{again}");
    assert_eq!(download(upstream_link).await, data);
    // A HEAD or a range is sent upstream and leaves the link for the download.
    let http = reqwest::Client::new();
    let head = http.head(&link).send().await.unwrap();
    let length = head.headers()["content-length"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        (head.status().as_u16(), length),
        (200, data.len().to_string())
    );
    let range = http.get(&link).header("range", "bytes=5-9").send().await;
    assert_eq!(range.unwrap().bytes().await.unwrap(), &data[5..10]);
    // The first download streams the upstream's bytes and stores them as they pass.
    assert_eq!(download(&link).await, data);
    let entries = listed_when(&local, 1).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["ref"], MAIN, "the job's own scope");
    assert_eq!(
        entries[0]["read_through"], "127.0.0.1",
        "where it came from: {}",
        entries[0]
    );

    // A pull request: what it reads through lands in its own scope, never main's.
    let pull = token("1", &[("refs/pull/7/merge", 3), (MAIN, 1)]);
    let found = lookup(&local, &pull, "shared").await;
    assert_eq!(found["ok"], true, "{found}");
    let link = found["signed_download_url"].as_str().unwrap();
    assert!(link.starts_with(&local.base), "{found}");
    assert_eq!(download(link).await, b"main's");
    // A link opens one download.
    assert_eq!(reqwest::get(link).await.unwrap().status(), 404);
    // A read-only job stores nothing: it gets the upstream's own link.
    let reader = token("1", &[(MAIN, 1)]);
    let found = lookup(&local, &reader, "shared").await;
    assert_eq!(found["ok"], true, "{found}");
    let link = found["signed_download_url"].as_str().unwrap();
    assert!(
        link.starts_with(&upstream.base),
        "the upstream's link: {link}"
    );
    assert_eq!(download(link).await, b"main's");
    let entries = listed_when(&local, 2).await;
    let refs: Vec<String> = entries
        .iter()
        .map(|e| e["ref"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        refs.iter().filter(|r| *r == "refs/pull/7/merge").count(),
        1,
        "{refs:?}"
    );
    assert_eq!(refs.len(), 2, "{refs:?}");

    // The upstream gone: what was read through is local; main never sees the pull request's.
    upstream.stop().await;
    let found = lookup(&local, &main_token(), "deps-1").await;
    assert_eq!(
        download(found["signed_download_url"].as_str().unwrap()).await,
        data
    );
    let found = lookup(&local, &main_token(), "shared").await;
    assert_ne!(
        found["ok"], true,
        "main's tokens never read the pull request's copy: {found}"
    );
    let found = lookup(&local, &pull, "shared").await;
    assert_eq!(found["ok"], true, "{found}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_is_down_or_silent_is_a_miss_within_the_bound() {
    // Accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    // Refuses them.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    for upstream in [silent_url, closed] {
        let local = TestServer::start_with(&[
            "--upstream-cache",
            &upstream,
            "--upstream-cache-timeout",
            "500ms",
        ])
        .await;
        let started = Instant::now();
        let found = lookup(&local, &main_token(), "anything").await;
        assert_ne!(found["ok"], true, "{upstream}: a miss: {found}");
        assert!(
            // Far below the minute an unbounded wait on the silent one would take.
            started.elapsed() < Duration::from_secs(20),
            "{upstream}: {:?}",
            started.elapsed()
        );
        local.stop().await;
    }
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hoards_own_tokens_never_go_upstream() {
    // An upstream that records what it is asked.
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let app = {
        let asked = asked.clone();
        axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let asked = asked.clone();
            async move {
                let auth = headers
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_owned());
                asked.lock().unwrap().push(auth.unwrap_or_default());
                axum::Json(json!({"ok": false}))
            }
        })
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let local = TestServer::start_with(&[
        "--upstream-cache",
        &upstream,
        "--upstream-cache-timeout",
        PATIENT,
    ])
    .await;

    let runtime = main_token();
    lookup(&local, &runtime, "a").await;
    // A tool token, which hoard signs: it stays here.
    let (status, minted) = json_of(
        local
            .http
            .post(local.url("/_hoard/tools/token"))
            .bearer_auth(&runtime)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{minted}");
    let tool = minted["token"].as_str().unwrap();
    lookup(&local, tool, "b").await;
    let seen = asked.lock().unwrap().clone();
    assert_eq!(
        seen,
        [format!("Bearer {runtime}")],
        "only the runtime token went upstream"
    );
}

/// A read-through download cut short stores nothing: the next lookup reads through again, and
/// a whole download stores the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_through_cut_short_stores_nothing() {
    let upstream = TestServer::start().await;
    // Larger than what loopback's socket buffers hold, so the cut comes before the end.
    let data = random_bytes(64 << 20, 2);
    upstream.save(&main_token(), "big", VERSION, &data).await;
    let local = TestServer::start_with(&[
        "--upstream-cache",
        &upstream.base,
        "--upstream-cache-timeout",
        PATIENT,
        "--admin-token",
        ADMIN,
    ])
    .await;
    let found = lookup(&local, &main_token(), "big").await;
    let link = found["signed_download_url"].as_str().unwrap().to_owned();
    assert!(link.starts_with(&local.base), "{found}");
    {
        let mut res = reqwest::get(&link).await.unwrap();
        assert_eq!(res.status(), 200);
        res.chunk().await.unwrap().unwrap();
        // Dropped here, most of the entry unread.
    }
    let landed = common::poll(
        Duration::from_secs(60),
        async || lookup(&local, &main_token(), "big").await,
        |found| {
            found["signed_download_url"]
                .as_str()
                .is_some_and(|l| l.starts_with(&local.base))
        },
    )
    .await;
    assert!(
        listed(&local).await.is_empty(),
        "nothing of a cut download is stored"
    );
    let link = landed["signed_download_url"].as_str().unwrap();
    assert!(
        link.starts_with(&local.base),
        "read through again: {landed}"
    );
    assert_eq!(download(link).await, data);
    let entries = listed_when(&local, 1).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["size_in_bytes"], data.len() as u64);
}

/// The timeout bounds the upstream's answer, not its whole transfer: an entry that takes
/// longer than the timeout to arrive, while it keeps coming, is read through whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_slower_than_the_timeout_but_steady_is_read_through_whole() {
    use axum::routing::{get, post};
    let data = random_bytes(4 << 20, 3);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    let app = {
        let (data, upstream) = (data.clone(), upstream.clone());
        axum::Router::new()
            .route(
                "/twirp/github.actions.results.api.v1.CacheService/GetCacheEntryDownloadURL",
                post(move || {
                    let link = format!("{upstream}/slow/blob?sig=x");
                    async move {
                        axum::Json(
                            json!({"ok": true, "signed_download_url": link, "matched_key": "slow"}),
                        )
                    }
                }),
            )
            .route(
                "/slow/blob",
                get(move || {
                    let data = data.clone();
                    async move {
                        // 4 MiB in 16 pieces, 400 ms apart: 6.4 s in all, twice the 3 s bound.
                        let pieces = futures_util::stream::iter(
                            data.chunks(256 << 10)
                                .map(bytes::Bytes::copy_from_slice)
                                .collect::<Vec<_>>(),
                        )
                        .then(|piece| async move {
                            tokio::time::sleep(Duration::from_millis(400)).await;
                            Ok::<_, std::io::Error>(piece)
                        });
                        axum::response::Response::builder()
                            .header("content-length", data.len())
                            .body(axum::body::Body::from_stream(pieces))
                            .unwrap()
                    }
                }),
            )
    };
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let local = TestServer::start_with(&[
        "--upstream-cache",
        &upstream,
        "--upstream-cache-timeout",
        "3s",
        "--admin-token",
        ADMIN,
    ])
    .await;
    let found = lookup(&local, &main_token(), "slow").await;
    let link = found["signed_download_url"].as_str().unwrap();
    assert!(link.starts_with(&local.base), "{found}");
    assert_eq!(download(link).await, data);
    let entries = listed_when(&local, 1).await;
    assert_eq!(entries.len(), 1, "stored whole");
}
