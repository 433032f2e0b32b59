//! The Twirp CacheService v2 as PROTOCOL.md §2 and §10 describe it, over real HTTP.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use common::process::Hoard;
use common::*;
use hoard::api::proto;
use prost::Message;
use serde_json::json;

#[tokio::test]
async fn a_miss_is_200_ok_false() {
    let srv = TestServer::start().await;
    let (status, body) = srv
        .lookup(&main_token(), "nothing", &["noth"], VERSION)
        .await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({ "ok": false }));
}

#[tokio::test]
async fn save_then_restore_returns_the_same_bytes() {
    let srv = TestServer::start().await;
    let t = main_token();
    let data = random_bytes(300_000, 1);
    let entry = srv.save(&t, "Linux-npm-abc", VERSION, &data).await;
    assert!(entry > 0);
    let (status, body) = srv.lookup(&t, "Linux-npm-abc", &[], VERSION).await;
    assert_eq!(status, 200);
    assert_eq!(body["matched_key"], "Linux-npm-abc");
    assert_eq!(
        srv.restore(&t, "Linux-npm-abc", VERSION).await.unwrap(),
        data
    );
}

#[tokio::test]
async fn signed_upload_links_have_three_segments_and_a_sig() {
    let srv = TestServer::start().await;
    let url = srv.reserve(&main_token(), "k", VERSION).await;
    let parsed = url::Url::parse(&url).unwrap();
    assert_eq!(parsed.host_str(), Some("127.0.0.1"));
    assert!(
        parsed
            .path_segments()
            .unwrap()
            .filter(|s| !s.is_empty())
            .count()
            >= 3,
        "{url}"
    );
    assert!(
        parsed
            .query_pairs()
            .any(|(k, v)| k == "sig" && !v.is_empty()),
        "{url}"
    );
}

#[tokio::test]
async fn links_follow_the_request_host_and_forwarded_proto_unless_a_public_url_is_set() {
    let srv = TestServer::start().await;
    let res = srv
        .http
        .post(srv.url(&format!("{SERVICE}CreateCacheEntry")))
        .bearer_auth(main_token())
        .header("host", "cache.internal:8080")
        .header("x-forwarded-proto", "https")
        .header("content-type", "application/json")
        .body(json!({ "key": "k", "version": VERSION }).to_string())
        .send()
        .await
        .unwrap();
    let (_, body) = json_of(res).await;
    let url = body["signed_upload_url"].as_str().unwrap();
    assert!(
        url.starts_with("https://cache.internal:8080/_blob/"),
        "{url}"
    );

    let srv = TestServer::start_with(&["--public-url", "https://hoard.example.com/"]).await;
    let url = srv.reserve(&main_token(), "k", VERSION).await;
    assert!(url.starts_with("https://hoard.example.com/_blob/"), "{url}");
}

#[tokio::test]
async fn an_existing_or_in_progress_entry_is_409_already_exists() {
    let srv = TestServer::start().await;
    let t = main_token();
    srv.reserve(&t, "k", VERSION).await;
    let (status, body) = srv
        .twirp(
            "CreateCacheEntry",
            &t,
            json!({ "key": "k", "version": VERSION }),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(body["code"], "already_exists");
    assert!(body["msg"].as_str().unwrap().contains("already exists"));

    srv.save(&t, "done", VERSION, b"abc").await;
    let (status, body) = srv
        .twirp(
            "CreateCacheEntry",
            &t,
            json!({ "key": "DONE", "version": VERSION }),
        )
        .await;
    assert_eq!(status, 409, "keys compare case-insensitively: {body}");
    // Another version of the same key is another cache.
    srv.reserve(&t, "done", "other-version").await;
}

#[tokio::test]
async fn a_token_without_a_writable_scope_gets_ok_false_with_write_denied() {
    let srv = TestServer::start().await;
    let read_only = token("1", &[(MAIN, 1)]);
    let (status, body) = srv
        .twirp(
            "CreateCacheEntry",
            &read_only,
            json!({ "key": "k", "version": VERSION }),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["ok"], false);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("cache write denied:"),
        "{body}"
    );
    let (status, body) = srv.finalize(&read_only, "k", VERSION, 3).await;
    assert_eq!(status, 200);
    assert_eq!(body["ok"], false);
}

#[tokio::test]
async fn a_token_without_a_readable_scope_is_403_read_denied() {
    let srv = TestServer::start().await;
    let write_only = token("1", &[(MAIN, 2)]);
    let (status, body) = srv.lookup(&write_only, "k", &[], VERSION).await;
    assert_eq!(status, 403);
    assert_eq!(body["code"], "permission_denied");
    assert!(
        body["msg"]
            .as_str()
            .unwrap()
            .starts_with("cache read denied:"),
        "{body}"
    );
}

#[tokio::test]
async fn missing_or_malformed_tokens_are_401_json() {
    let srv = TestServer::start().await;
    let res = srv
        .http
        .post(srv.url(&format!("{SERVICE}GetCacheEntryDownloadURL")))
        .body(json!({ "key": "k", "version": VERSION }).to_string())
        .send()
        .await
        .unwrap();
    let (status, body) = json_of(res).await;
    assert_eq!(status, 401);
    assert_eq!(body["code"], "unauthenticated");
    let (status, _) = srv.lookup("not-a-jwt", "k", &[], VERSION).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn every_error_is_twirp_json() {
    let srv = TestServer::start().await;
    let t = main_token();
    let (status, body) = srv.twirp("NoSuchMethod", &t, json!({})).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("bad_route")));

    let res = srv
        .http
        .post(srv.url("/twirp/other.Service/Call"))
        .send()
        .await
        .unwrap();
    let (status, body) = json_of(res).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("bad_route")));

    let res = srv
        .http
        .get(srv.url(&format!("{SERVICE}CreateCacheEntry")))
        .send()
        .await
        .unwrap();
    let (status, body) = json_of(res).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("bad_route")));

    let res = srv
        .http
        .post(srv.url(&format!("{SERVICE}CreateCacheEntry")))
        .bearer_auth(&t)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let (status, body) = json_of(res).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("malformed")));

    let res = srv
        .http
        .post(srv.url(&format!("{SERVICE}CreateCacheEntry")))
        .bearer_auth(&t)
        .header("content-type", "application/json")
        .body(vec![b' '; 1 << 20])
        .send()
        .await
        .unwrap();
    let (status, body) = json_of(res).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("malformed")));

    let (status, body) = srv
        .twirp(
            "CreateCacheEntry",
            &t,
            json!({ "key": "a,b", "version": VERSION }),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let (status, _) = srv
        .twirp(
            "CreateCacheEntry",
            &t,
            json!({ "key": "x".repeat(513), "version": VERSION }),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = srv
        .twirp("CreateCacheEntry", &t, json!({ "key": "k" }))
        .await;
    assert_eq!(status, 400, "a missing version is invalid");
    let keys: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
    let (status, _) = srv
        .twirp(
            "GetCacheEntryDownloadURL",
            &t,
            json!({ "key": "k", "restore_keys": keys, "version": VERSION }),
        )
        .await;
    assert_eq!(status, 400, "11 keys are too many");
}

#[tokio::test]
async fn requests_are_read_leniently() {
    let srv = TestServer::start().await;
    let t = main_token();
    let (status, body) = srv
        .twirp("CreateCacheEntry", &t, json!({ "key": "camel", "version": VERSION, "metadata": { "repositoryId": "9", "scope": [] }, "future_field": 1 }))
        .await;
    assert_eq!((status, body["ok"].as_bool()), (200, Some(true)), "{body}");
    let url = body["signed_upload_url"].as_str().unwrap();
    assert_eq!(srv.put_blob(url, b"hello".to_vec()).await.status(), 201);
    // go-actions-cache sends sizeBytes as a number.
    let (status, body) = srv
        .twirp(
            "FinalizeCacheEntryUpload",
            &t,
            json!({ "key": "camel", "version": VERSION, "sizeBytes": 5 }),
        )
        .await;
    assert_eq!((status, body["ok"].as_bool()), (200, Some(true)), "{body}");
    assert!(body["entry_id"].as_str().unwrap().parse::<i64>().unwrap() > 0);
    // ... and repeats the primary key among restore keys.
    let (_, body) = srv
        .twirp(
            "GetCacheEntryDownloadURL",
            &t,
            json!({ "key": "camel", "restoreKeys": ["camel"], "version": VERSION }),
        )
        .await;
    assert_eq!(body["matched_key"], "camel");
}

#[tokio::test]
async fn finalize_checks_the_size_and_is_idempotent() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "k", VERSION).await;
    assert_eq!(srv.put_blob(&url, vec![7; 1000]).await.status(), 201);
    let (_, first) = srv.finalize(&t, "k", VERSION, 1000).await;
    assert_eq!(first["ok"], true);
    let (status, retry) = srv.finalize(&t, "k", VERSION, 1000).await;
    assert_eq!(status, 200);
    assert_eq!(retry, first, "a retried finalize sees the same entry");

    let url = srv.reserve(&t, "short", VERSION).await;
    assert_eq!(srv.put_blob(&url, vec![7; 999]).await.status(), 201);
    let (status, body) = srv.finalize(&t, "short", VERSION, 1000).await;
    assert_eq!(status, 200);
    assert_eq!(body["ok"], false);
    assert!(body["message"].as_str().unwrap().contains("999"), "{body}");
    assert!(
        srv.restore(&t, "short", VERSION).await.is_none(),
        "a size mismatch never becomes visible"
    );

    let (_, body) = srv.finalize(&t, "never-reserved", VERSION, 10).await;
    assert_eq!(body["ok"], false);
    srv.reserve(&t, "empty", VERSION).await;
    let (_, body) = srv.finalize(&t, "empty", VERSION, 0).await;
    assert_eq!(body["ok"], false, "nothing uploaded: {body}");
}

#[tokio::test]
async fn an_entry_is_invisible_until_finalized() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "k", VERSION).await;
    assert_eq!(srv.put_blob(&url, b"data".to_vec()).await.status(), 201);
    assert!(srv.restore(&t, "k", VERSION).await.is_none());
    srv.finalize(&t, "k", VERSION, 4).await;
    assert_eq!(srv.restore(&t, "k", VERSION).await.unwrap(), b"data");
}

#[tokio::test]
async fn matching_follows_githubs_order() {
    let srv = TestServer::start().await;
    let t = main_token();
    srv.save(&t, "npm-Linux-1", VERSION, b"one").await;
    srv.save(&t, "npm-Linux-2", VERSION, b"two").await;
    srv.save(&t, "npm-Linux-2-extra", "other-version", b"other")
        .await;

    let (_, body) = srv
        .lookup(&t, "npm-Linux-3", &["npm-linux-"], VERSION)
        .await;
    assert_eq!(
        body["matched_key"], "npm-Linux-2",
        "newest prefix match, case-insensitive: {body}"
    );
    let (_, body) = srv.lookup(&t, "npm-linux-1", &["npm-"], VERSION).await;
    assert_eq!(
        body["matched_key"], "npm-Linux-1",
        "exact match first, stored key returned: {body}"
    );
    let (_, body) = srv.lookup(&t, "npm-Linux-2-extra", &[], VERSION).await;
    assert_eq!(
        body,
        json!({ "ok": false }),
        "a different version never matches"
    );
    let (_, body) = srv
        .lookup(&t, "npm-Linux-2-extra", &[], "other-version")
        .await;
    assert_eq!(body["matched_key"], "npm-Linux-2-extra");
}

#[tokio::test]
async fn branches_and_repositories_are_isolated() {
    let srv = TestServer::start().await;
    srv.save(&token("1", &[(MAIN, 3)]), "k", VERSION, b"main")
        .await;
    srv.save(
        &token("1", &[("refs/heads/sibling", 3)]),
        "k",
        VERSION,
        b"sibling",
    )
    .await;

    let feature = token("1", &[("refs/heads/feature", 3), (MAIN, 1)]);
    assert_eq!(
        srv.restore(&feature, "k", VERSION).await.unwrap(),
        b"main",
        "falls back to the default branch"
    );
    srv.save(&feature, "k", VERSION, b"feature").await;
    assert_eq!(
        srv.restore(&feature, "k", VERSION).await.unwrap(),
        b"feature",
        "current branch first"
    );
    assert_eq!(
        srv.restore(&token("1", &[(MAIN, 3)]), "k", VERSION)
            .await
            .unwrap(),
        b"main"
    );
    assert!(
        srv.restore(&token("2", &[(MAIN, 3)]), "k", VERSION)
            .await
            .is_none(),
        "another repository sees nothing"
    );
}

#[tokio::test]
async fn prefixed_service_paths_are_served() {
    let srv = TestServer::start().await;
    let res = srv
        .http
        .post(srv.url(&format!("/some/prefix{SERVICE}GetCacheEntryDownloadURL")))
        .bearer_auth(main_token())
        .header("content-type", "application/json")
        .body(json!({ "key": "k", "version": VERSION }).to_string())
        .send()
        .await
        .unwrap();
    let (status, body) = json_of(res).await;
    assert_eq!((status, body), (200, json!({ "ok": false })));
}

async fn proto_call<T: Message + Default>(
    srv: &TestServer,
    method: &str,
    req: impl Message,
) -> (u16, Option<T>) {
    let res = srv
        .http
        .post(srv.url(&format!("{SERVICE}{method}")))
        .bearer_auth(main_token())
        .header("content-type", "application/protobuf")
        .body(req.encode_to_vec())
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let ct = res.headers()["content-type"].to_str().unwrap().to_owned();
    let bytes = res.bytes().await.unwrap();
    if status == 200 {
        assert_eq!(ct, "application/protobuf");
        (status, Some(T::decode(bytes.as_ref()).unwrap()))
    } else {
        assert_eq!(
            ct, "application/json",
            "twirp errors are JSON whatever the request encoding"
        );
        (status, None)
    }
}

#[tokio::test]
async fn binary_protobuf_clients_save_and_restore() {
    let srv = TestServer::start().await;
    let create = proto::CreateCacheEntryRequest {
        metadata: None,
        key: "sccache".into(),
        version: VERSION.into(),
    };
    let (status, created) =
        proto_call::<proto::CreateCacheEntryResponse>(&srv, "CreateCacheEntry", create.clone())
            .await;
    assert_eq!(status, 200);
    let created = created.unwrap();
    assert!(created.ok);
    assert_eq!(
        srv.put_blob(&created.signed_upload_url, b"compiled".to_vec())
            .await
            .status(),
        201
    );
    let (status, _) =
        proto_call::<proto::CreateCacheEntryResponse>(&srv, "CreateCacheEntry", create).await;
    assert_eq!(status, 409, "sccache needs a 409 for an existing key");
    let finalize = proto::FinalizeCacheEntryUploadRequest {
        metadata: None,
        key: "sccache".into(),
        size_bytes: 8,
        version: VERSION.into(),
    };
    let (_, done) = proto_call::<proto::FinalizeCacheEntryUploadResponse>(
        &srv,
        "FinalizeCacheEntryUpload",
        finalize,
    )
    .await;
    assert!(done.unwrap().entry_id > 0);
    let lookup = proto::GetCacheEntryDownloadUrlRequest {
        metadata: None,
        key: "sccache".into(),
        restore_keys: vec![],
        version: VERSION.into(),
    };
    let (_, hit) = proto_call::<proto::GetCacheEntryDownloadUrlResponse>(
        &srv,
        "GetCacheEntryDownloadURL",
        lookup,
    )
    .await;
    let hit = hit.unwrap();
    assert_eq!(hit.matched_key, "sccache");
    let bytes = srv
        .http
        .get(&hit.signed_download_url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(bytes.as_ref(), b"compiled");

    let res = srv
        .http
        .post(srv.url(&format!("{SERVICE}CreateCacheEntry")))
        .bearer_auth(main_token())
        .header("content-type", "application/protobuf")
        .body(vec![0xff, 0xff, 0xff])
        .send()
        .await
        .unwrap();
    let (status, body) = json_of(res).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("malformed")));
}

#[tokio::test]
async fn health_and_readiness() {
    let srv = TestServer::start().await;
    let res = srv.http.get(srv.url("/healthz")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let (status, body) = json_of(srv.http.get(srv.url("/readyz")).send().await.unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "ready");
    assert_eq!(
        body["warnings"],
        json!([]),
        "token checks are on: nothing to warn about"
    );
    let (status, _) = json_of(srv.http.get(srv.url("/nope")).send().await.unwrap()).await;
    assert_eq!(status, 404);

    let insecure = TestServer::start_with(&["--insecure-skip-token-validation"]).await;
    let (_, body) = json_of(
        insecure
            .http
            .get(insecure.url("/readyz"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(
        body["warnings"][0]
            .as_str()
            .unwrap()
            .contains("--insecure-skip-token-validation"),
        "{body}"
    );
}

#[tokio::test]
async fn a_restore_counts_as_a_use_of_the_entry() {
    let clock = common::manual_clock();
    let srv = TestServer::start_with_clock(&[], clock.clone()).await;
    let t = main_token();
    srv.save(&t, "used", VERSION, b"abc").await;
    let db = srv.data.path().join("hoard.db");
    let read = || async {
        let conn =
            rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap();
        let row: (i64, i64, i64) = conn
            .query_row(
                "SELECT hits, last_used_at, created_at FROM entries WHERE key = 'used'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        row
    };
    let (hits, last_used, created) = read().await;
    assert_eq!((hits, last_used), (0, created));
    clock.advance(std::time::Duration::from_secs(1));
    srv.lookup(&t, "used", &[], VERSION).await;
    srv.lookup(&t, "use", &["us"], VERSION).await;
    // Hits are written in batches, within a second or so.
    let ten_seconds = std::time::Duration::from_secs(10);
    let (hits, last_used, created) = poll(ten_seconds, read, |row| row.0 == 2).await;
    assert_eq!(hits, 2);
    assert!(last_used > created);
}

#[tokio::test]
async fn after_a_machine_crash_entries_newer_than_the_last_sync_are_forgotten() {
    let srv = TestServer::start().await;
    let t = main_token();
    srv.save(&t, "old", VERSION, b"synced before the crash")
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let synced_through = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    srv.save(&t, "new", VERSION, b"maybe torn").await;
    srv.reserve(&t, "open", VERSION).await;

    // A record from another boot: the machine restarted after a sync at `synced_through`.
    let record = srv.data.path().join("synced");
    let srv = srv.restart().await; // A clean restart on the same boot changes nothing.
    assert!(srv.restore(&t, "new", VERSION).await.is_some());
    let data = srv.shut_down().await;
    std::fs::write(&record, format!("boot-before-the-crash {synced_through}\n")).unwrap();
    let srv = TestServer::start_on(data).await;
    assert_eq!(
        srv.restore(&t, "old", VERSION).await.unwrap(),
        b"synced before the crash"
    );
    assert!(
        srv.restore(&t, "new", VERSION).await.is_none(),
        "entries after the last sync are forgotten"
    );
    // Open uploads were aborted: the key can be saved again at once.
    srv.save(&t, "open", VERSION, b"again").await;
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(
        !text.starts_with("boot-before-the-crash"),
        "a fresh record is written: {text}"
    );
}

#[tokio::test]
async fn http2_clients_get_links_to_the_authority_they_used() {
    let srv = TestServer::start().await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let res = h2
        .post(srv.url(&format!("{SERVICE}CreateCacheEntry")))
        .bearer_auth(main_token())
        .header("content-type", "application/json")
        .body(json!({ "key": "h2", "version": VERSION }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.version(), reqwest::Version::HTTP_2);
    let (status, body) = json_of(res).await;
    assert_eq!(status, 200, "{body}");
    let url = body["signed_upload_url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("http://{}/_blob/uploads/", srv.addr)),
        "{url}"
    );
}

/// Waits for the server's log to hold `n` lines with `needle` (log lines come through a pipe,
/// a moment after the answer), then returns the whole log.
async fn log_once(hoard: &Hoard, needle: &str, n: usize) -> Vec<String> {
    let found = eventually(std::time::Duration::from_secs(10), || {
        let log = hoard.log.lock().unwrap();
        log.iter().filter(|l| l.contains(needle)).count() >= n
    })
    .await;
    let log = hoard.log.lock().unwrap().clone();
    assert!(found, "fewer than {n} lines with {needle:?}: {log:#?}");
    log
}

/// A lookup's work grows with scopes × keys, so hoard searches at most 16 readable scopes. Up to
/// that, a lookup of ten keys of the longest kind costs one database statement, as with one
/// scope. Past it (17 or 26 scopes, ten keys), the answer is a clear 400 `invalid_argument`
/// with no database work: no 500, nothing stored, and nothing long logged (no SQL text, none of
/// the keys).
#[tokio::test(flavor = "multi_thread")]
async fn lookups_search_at_most_sixteen_scopes() {
    let data = tempfile::tempdir().unwrap();
    let hoard = Hoard::start(data.path());
    let (http, base) = (reqwest::Client::new(), hoard.base.clone());
    let t = main_token();
    let (status, body) = twirp_at(
        &http,
        &base,
        &t,
        "CreateCacheEntry",
        json!({ "key": "deep-key", "version": VERSION }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let res = http
        .put(body["signed_upload_url"].as_str().unwrap())
        .header("x-ms-blob-type", "BlockBlob")
        .body("found")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let (_, body) = twirp_at(
        &http,
        &base,
        &t,
        "FinalizeCacheEntryUpload",
        json!({ "key": "deep-key", "version": VERSION, "size_bytes": "5" }),
    )
    .await;
    assert_eq!(body["ok"], true, "{body}");

    // Ten keys, nine of the longest kind (512 characters of four bytes); the last restore key
    // finds the entry, in the last scope.
    let long = |i: usize| format!("{i}{}", "\u{1F600}".repeat(511));
    let restore: Vec<String> = (1..9).map(long).chain(["deep-".to_owned()]).collect();
    let lookup = json!({ "key": long(0), "restore_keys": restore, "version": VERSION });
    let token_with = |n: usize| {
        let mut grants: Vec<(String, u8)> = (0..n - 1)
            .map(|i| (format!("refs/heads/branch-{i}"), 1))
            .collect();
        grants.push((MAIN.to_owned(), 1));
        let grants: Vec<(&str, u8)> = grants.iter().map(|(s, p)| (s.as_str(), *p)).collect();
        token("1", &grants)
    };

    // One lookup with `n` readable scopes: its answer and the database lookups it cost.
    let ask = |n: usize| {
        let (http, base, lookup, token) = (&http, &base, lookup.clone(), token_with(n));
        async move {
            let before = database_calls(http, base, "find_candidates").await;
            let (status, body) =
                twirp_at(http, base, &token, "GetCacheEntryDownloadURL", lookup).await;
            let calls = database_calls(http, base, "find_candidates").await - before;
            (status, body, calls)
        }
    };
    for n in [1, 16] {
        let (status, body, calls) = ask(n).await;
        assert_eq!(status, 200, "{n} scopes: {body}");
        assert_eq!(body["matched_key"], "deep-key", "{n} scopes: {body}");
        assert_eq!(calls, 1.0, "{n} scopes × 10 keys: one statement");
    }
    for n in [17, 26] {
        let (status, body, calls) = ask(n).await;
        assert_eq!(status, 400, "{n} scopes: {body}");
        assert_eq!(body["code"], "invalid_argument", "{body}");
        assert_eq!(
            body["msg"],
            format!("the token grants {n} readable scopes; lookups search at most 16")
        );
        assert_eq!(calls, 0.0, "{n} scopes: refused before any database work");
    }
    assert_eq!(
        (
            table_rows(data.path(), "entries"),
            table_rows(data.path(), "uploads")
        ),
        (1, 1),
        "lookups store nothing"
    );

    let log = log_once(&hoard, "status=400", 2).await;
    for line in &log {
        assert!(line.len() <= 1024, "a {}-byte log line: {line}", line.len());
        assert!(
            !line.contains("SELECT") && !line.contains('\u{1F600}'),
            "SQL text or a key in the log: {line}"
        );
        assert!(
            !line.contains("ERROR") && !line.contains("WARN"),
            "nothing failed: {line}"
        );
    }
}

/// A failing readiness check names the part that failed and nothing of its internals (paths,
/// OS or driver messages); those go to the log.
#[tokio::test(flavor = "multi_thread")]
async fn readiness_failures_do_not_echo_internal_errors() {
    let data = tempfile::tempdir().unwrap();
    let hoard = Hoard::start(data.path());
    let http = reqwest::Client::new();
    let (status, _) = json_of(
        http.get(format!("{}/readyz", hoard.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    std::fs::remove_dir_all(data.path().join("tmp")).unwrap();
    let (status, body) = json_of(
        http.get(format!("{}/readyz", hoard.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body,
        json!({ "status": "unavailable", "error": "the chunk store does not answer", "warnings": [] })
    );
    let log = log_once(&hoard, "readiness check failed", 1).await;
    let line = log
        .iter()
        .find(|l| l.contains("readiness check failed"))
        .unwrap();
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("os error 2"), "the cause is logged: {line}");
}
