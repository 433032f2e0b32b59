//! `hoard edge` (issue #59) in front of an origin on SQLite: one fetch per entry however many
//! ask at once, the disk bound, copies kept across a restart, and an origin that is away.
//! The real client through edges in front of replicas on PostgreSQL and S3 is in
//! `e2e_client.rs`.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::process::Hoard;
use common::{
    download_link_at, main_token, put_blob_at, random_bytes, save_through, twirp_at, TestServer,
    VERSION,
};
use serde_json::json;

const MIB: usize = 1 << 20;

/// An edge whose lookups wait for the origin as long as a loaded machine may need (tests of an
/// origin that is away or silent say so themselves).
fn start_edge(dir: &std::path::Path, origin: &str, max: &str) -> Hoard {
    let args = [
        "--origin",
        origin,
        "--max-bytes",
        max,
        "--lookup-timeout",
        "30s",
    ];
    Hoard::start_edge(dir, &args)
}

/// An edge's counter (summed over its labels).
async fn counter(edge: &Hoard, name: &str) -> f64 {
    common::metric(&reqwest::Client::new(), &edge.base, name).await
}

/// Saves `data` under `key` at the origin itself, and returns its download link as a lookup
/// through the edge at `edge` answers it: an entry the edge has no copy of.
async fn saved_at_origin(origin: &TestServer, edge: &str, key: &str, data: &[u8]) -> String {
    let t = main_token();
    let upload = origin.reserve(&t, key, VERSION).await;
    assert_eq!(origin.put_blob(&upload, data.to_vec()).await.status(), 201);
    let (_, done) = origin.finalize(&t, key, VERSION, data.len()).await;
    assert_eq!(done["ok"], true, "{done}");
    download_link_at(edge, key).await
}

async fn get(link: &str) -> Vec<u8> {
    let res = reqwest::get(link).await.unwrap();
    assert_eq!(res.status(), 200);
    res.bytes().await.unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_fetch_an_entry_once_and_the_copies_stay_within_max_bytes() {
    let origin = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let edge = start_edge(dir.path(), &origin.base, "8MiB");

    let data = random_bytes(3 * MIB + 5, 1);
    let link = saved_at_origin(&origin, &edge.base, "one", &data).await;
    // Eight clients at once, none of which the edge has served before: one fetch.
    let all = futures_util::future::join_all((0..8).map(|_| get(&link))).await;
    assert!(
        all.iter().all(|got| got == &data),
        "every client gets the entry whole"
    );
    assert_eq!(
        counter(&edge, "hoard_edge_bytes_from_origin_total").await,
        data.len() as f64
    );
    assert_eq!(
        counter(&edge, "hoard_edge_bytes_served_total").await,
        8.0 * data.len() as f64
    );
    // None of them streamed from the origin on its own: each followed the one fetch.
    assert_eq!(counter(&edge, "hoard_edge_passed_total").await, 0.0);
    let downloads = counter(&edge, "hoard_edge_hits_total").await
        + counter(&edge, "hoard_edge_misses_total").await;
    assert_eq!(downloads, 8.0);
    // A range of the copy.
    let res = reqwest::Client::new()
        .get(&link)
        .header("range", "bytes=1000000-2999999")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 206);
    assert_eq!(
        res.bytes().await.unwrap().as_ref(),
        &data[1_000_000..3_000_000]
    );

    // Four more entries of 3 MiB through an 8 MiB disk: the least recently used copies go.
    let mut last = String::new();
    for i in 0..4 {
        let data = random_bytes(3 * MIB, 10 + i);
        last = saved_at_origin(&origin, &edge.base, &format!("more-{i}"), &data).await;
        assert_eq!(get(&last).await, data);
    }
    // The last copy is published once its checks are written, just after its last byte went.
    let copies = common::poll(
        Duration::from_secs(10),
        async || counter(&edge, "hoard_edge_copies").await,
        |n| *n == 2.0,
    )
    .await;
    assert_eq!(copies, 2.0);
    let on_disk: u64 = common::files_under(&dir.path().join("copies"))
        .iter()
        .map(|f| f.metadata().unwrap().len())
        .sum();
    assert!(on_disk <= 8 * MIB as u64, "{on_disk} bytes of copies");
    assert_eq!(
        counter(&edge, "hoard_edge_stored_bytes").await,
        on_disk as f64
    );
    assert!(counter(&edge, "hoard_edge_evictions_total").await >= 3.0);
    // The newest copy stayed: served again without the origin.
    let from_origin = counter(&edge, "hoard_edge_bytes_from_origin_total").await;
    let hits = counter(&edge, "hoard_edge_hits_total").await;
    get(&last).await;
    assert_eq!(
        counter(&edge, "hoard_edge_bytes_from_origin_total").await,
        from_origin
    );
    assert_eq!(counter(&edge, "hoard_edge_hits_total").await, hits + 1.0);
    // The oldest went: fetched again, whole.
    assert_eq!(get(&link).await, data);
    assert!(counter(&edge, "hoard_edge_bytes_from_origin_total").await > from_origin);

    // An entry larger than the whole disk is streamed, not kept.
    let big = random_bytes(9 * MIB, 2);
    let big_link = save_through(&edge.base, "too-big", &big).await;
    assert_eq!(get(&big_link).await, big);
    assert_eq!(counter(&edge, "hoard_edge_passed_total").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_edge_keeps_its_copies_and_drops_what_was_left_half_written() {
    let origin = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let edge = start_edge(dir.path(), &origin.base, "64MiB");
    let data = random_bytes(2 * MIB, 3);
    let link = save_through(&edge.base, "kept", &data).await;
    assert_eq!(get(&link).await, data);
    edge.kill_9();
    // What a process killed in the middle of a fetch leaves.
    std::fs::write(dir.path().join("tmp/9.9.1.0"), b"half a copy").unwrap();

    let edge = start_edge(dir.path(), &origin.base, "64MiB");
    assert!(common::files_under(&dir.path().join("tmp")).is_empty());
    assert_eq!(counter(&edge, "hoard_edge_copies").await, 1.0);
    let link = link.replace(&link[..link.find("/_blob/").unwrap()], &edge.base);
    assert_eq!(get(&link).await, data);
    assert_eq!(
        counter(&edge, "hoard_edge_bytes_from_origin_total").await,
        0.0
    );
    assert_eq!(counter(&edge, "hoard_edge_hits_total").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_origin_away_lookups_miss_at_once_and_saves_are_refused() {
    let origin = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    // The default --lookup-timeout (1 s), the bound this test holds the edge to.
    let edge = Hoard::start_edge(
        dir.path(),
        &["--origin", &origin.base, "--max-bytes", "64MiB"],
    );
    let data = random_bytes(MIB, 4);
    let link = save_through(&edge.base, "before", &data).await;
    assert_eq!(get(&link).await, data);
    origin.stop().await;

    let http = reqwest::Client::new();
    let t = main_token();
    for _ in 0..3 {
        let started = Instant::now();
        let (status, looked) = twirp_at(
            &http,
            &edge.base,
            &t,
            "GetCacheEntryDownloadURL",
            json!({"key": "before", "version": VERSION}),
        )
        .await;
        assert_eq!((status, &looked), (200, &json!({"ok": false})));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
    let (status, reserved) = twirp_at(
        &http,
        &edge.base,
        &t,
        "CreateCacheEntry",
        json!({"key": "later", "version": VERSION}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(reserved["ok"], false, "{reserved}");
    assert!(
        reserved["message"]
            .as_str()
            .unwrap()
            .starts_with("cache write denied:"),
        "{reserved}"
    );
    // v1 as well: a miss is 204, a reservation refused without a retry.
    let v1 = http
        .get(format!(
            "{}/_apis/artifactcache/cache?keys=before&version={VERSION}",
            edge.base
        ))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(v1.status(), 204);
    let v1 = http
        .post(format!("{}/_apis/artifactcache/caches", edge.base))
        .bearer_auth(&t)
        .json(&json!({"key": "later", "version": VERSION}))
        .send()
        .await
        .unwrap();
    assert_eq!(v1.status(), 403);
    // A link: the origin cannot say it still opens an entry, so nothing is served.
    let res = reqwest::get(&link).await.unwrap();
    assert_eq!(res.status(), 502);
    assert!(res.text().await.unwrap().contains("<Error><Code>"));
    // Not ready, so that a set-up runner uses GitHub's cache meanwhile; alive all the same.
    assert_eq!(
        reqwest::get(format!("{}/readyz", edge.base))
            .await
            .unwrap()
            .status(),
        503
    );
    assert_eq!(
        reqwest::get(format!("{}/healthz", edge.base))
            .await
            .unwrap()
            .status(),
        200
    );
    assert!(counter(&edge, "hoard_edge_lookups_total{outcome=\"unanswered\"}").await >= 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_the_origin_did_not_sign_open_nothing_on_the_edge() {
    let origin = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let edge = start_edge(dir.path(), &origin.base, "64MiB");
    let data = random_bytes(MIB, 5);
    let link = saved_at_origin(&origin, &edge.base, "signed", &data).await;
    assert_eq!(get(&link).await, data);
    let (path, query) = link.split_once('?').unwrap();
    let forged = format!("{path}?{}", query.replace("sig=", "sig=A"));
    for bad in [
        forged,
        format!("{path}?se=2099-01-01T00%3A00%3A00Z"),
        format!("{}/_blob/entries/..%2F..%2Fcopies?sig=x", edge.base),
        format!("{}/_blob/entries/1.2/3?sig=x", edge.base),
    ] {
        let res = reqwest::get(&bad).await.unwrap();
        let status = res.status().as_u16();
        let body = res.text().await.unwrap();
        assert!(matches!(status, 400 | 403 | 404), "{bad}: {status} {body}");
        assert!(
            !body
                .as_bytes()
                .windows(64)
                .any(|w| data.windows(64).next() == Some(w)),
            "{bad}"
        );
    }
    // Only what the edge was asked with a good link was fetched: the one entry, once.
    assert_eq!(
        counter(&edge, "hoard_edge_bytes_from_origin_total").await,
        data.len() as f64
    );
}

#[test]
fn an_edge_without_a_usable_origin_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["ftp://origin.example", "not a url"] {
        let out = common::process::hoard_command()
            .args([
                "edge",
                "--listen",
                "127.0.0.1:0",
                "--origin",
                bad,
                "--data-dir",
            ])
            .arg(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("--origin"), "{bad}: {said}");
    }
}

/// Twirp's binary encoding through the edge: the lookup's link is pointed at the edge too, and
/// with the origin away the miss is an empty message, as the client can read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_lookups_are_answered_in_protobuf() {
    use hoard::api::proto::{GetCacheEntryDownloadUrlRequest, GetCacheEntryDownloadUrlResponse};
    use prost::Message as _;
    let origin = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let edge = start_edge(dir.path(), &origin.base, "64MiB");
    let data = random_bytes(1000, 6);
    save_through(&edge.base, "binary", &data).await;
    let ask = || async {
        let request = GetCacheEntryDownloadUrlRequest {
            key: "binary".into(),
            version: VERSION.into(),
            ..Default::default()
        };
        let res = reqwest::Client::new()
            .post(format!(
                "{}{}GetCacheEntryDownloadURL",
                edge.base,
                common::SERVICE
            ))
            .bearer_auth(main_token())
            .header("content-type", "application/protobuf")
            .body(request.encode_to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["content-type"], "application/protobuf");
        GetCacheEntryDownloadUrlResponse::decode(res.bytes().await.unwrap()).unwrap()
    };
    let found = ask().await;
    assert!(found.ok);
    assert!(
        found.signed_download_url.starts_with(&edge.base),
        "{found:?}"
    );
    assert_eq!(get(&found.signed_download_url).await, data);
    origin.stop().await;
    let missed = ask().await;
    assert!(
        !missed.ok && missed.signed_download_url.is_empty(),
        "{missed:?}"
    );
}

/// A save through the edge leaves its copy there: the restore after it reads nothing from the
/// origin. An upload in blocks, or one whose reservation did not go through the edge, streams
/// through without a copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_through_the_edge_leaves_its_copy_there() {
    let origin = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let edge = start_edge(dir.path(), &origin.base, "64MiB");
    let data = random_bytes(2 * MIB + 3, 7);
    let link = save_through(&edge.base, "kept-from-save", &data).await;
    assert_eq!(get(&link).await, data);
    assert_eq!(
        counter(&edge, "hoard_edge_bytes_from_origin_total").await,
        0.0
    );
    assert_eq!(counter(&edge, "hoard_edge_hits_total").await, 1.0);
    assert_eq!(counter(&edge, "hoard_edge_copies").await, 1.0);

    // In blocks: through, without a copy.
    let http = reqwest::Client::new();
    let t = main_token();
    let body = json!({"key": "in-blocks", "version": VERSION});
    let (_, reserved) = twirp_at(&http, &edge.base, &t, "CreateCacheEntry", body).await;
    let upload = reserved["signed_upload_url"].as_str().unwrap();
    let put = http
        .put(format!("{upload}&comp=block&blockid=QUFBQQ%3D%3D"))
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    let list = "<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList><Latest>QUFBQQ==</Latest></BlockList>";
    let put = http
        .put(format!("{upload}&comp=blocklist"))
        .body(list)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    let body =
        json!({"key": "in-blocks", "version": VERSION, "size_bytes": data.len().to_string()});
    let (_, done) = twirp_at(&http, &edge.base, &t, "FinalizeCacheEntryUpload", body).await;
    assert_eq!(done["ok"], true, "{done}");
    assert_eq!(
        get(&download_link_at(&edge.base, "in-blocks").await).await,
        data
    );
    assert_eq!(
        counter(&edge, "hoard_edge_bytes_from_origin_total").await,
        data.len() as f64
    );

    // Reserved at the origin, uploaded through the edge: not kept.
    let upload = origin.reserve(&t, "elsewhere", VERSION).await;
    let through_edge = upload.replace(&origin.base, &edge.base);
    let put = put_blob_at(&http, &through_edge, data.clone()).await;
    assert_eq!(put.status(), 201);
    assert_eq!(
        origin
            .finalize(&t, "elsewhere", VERSION, data.len())
            .await
            .1["ok"],
        true
    );
    assert_eq!(
        get(&download_link_at(&edge.base, "elsewhere").await).await,
        data
    );
    assert_eq!(
        counter(&edge, "hoard_edge_bytes_from_origin_total").await,
        2.0 * data.len() as f64
    );
}
