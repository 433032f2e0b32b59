//! The legacy cache service (`_apis/artifactcache`, PROTOCOL.md §5) driven request by request:
//! ranges, commits, errors, and the identities of clients whose tokens hoard cannot verify
//! (Forgejo's proxy, namespaces, anonymous access, Gitea tokens). The real clients' round
//! trips are in `e2e_client.rs`.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use common::{claims, main_token, random_bytes, sign_hs256, token, TestServer, MAIN, VERSION};
use serde_json::{json, Value};

/// How a test request proves who it is.
#[derive(Clone)]
enum Auth {
    None,
    Bearer(String),
    /// Forgejo proxy headers: (name, value) pairs.
    Headers(Vec<(String, String)>),
}

/// A v1 client of the service at `base` (the origin, or the origin and a prefix).
struct V1 {
    http: reqwest::Client,
    base: String,
    auth: Auth,
}

impl V1 {
    fn new(srv: &TestServer, prefix: &str, auth: Auth) -> Self {
        Self {
            http: srv.http.clone(),
            base: format!("{}{prefix}/_apis/artifactcache/", srv.base),
            auth,
        }
    }

    fn request(&self, method: reqwest::Method, resource: &str) -> reqwest::RequestBuilder {
        let req = self
            .http
            .request(method, format!("{}{resource}", self.base))
            .header("accept", "application/json;api-version=6.0-preview.1");
        match &self.auth {
            Auth::None => req,
            Auth::Bearer(t) => req.bearer_auth(t),
            Auth::Headers(h) => h.iter().fold(req, |r, (k, v)| r.header(k, v)),
        }
    }

    /// The status and the JSON body (`Null` for an empty body; any body must be JSON).
    async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
        let res = req.send().await.unwrap();
        let status = res.status().as_u16();
        let ct = res
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        let text = res.text().await.unwrap();
        if text.is_empty() {
            return (status, Value::Null);
        }
        assert_eq!(ct.as_deref(), Some("application/json"), "{status} {text}");
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {text:?}"));
        (status, body)
    }

    async fn reserve(&self, key: &str, size: Option<u64>) -> (u16, Value) {
        let mut body = json!({ "key": key, "version": VERSION });
        if let Some(size) = size {
            body["cacheSize"] = size.into();
        }
        Self::send(
            self.request(reqwest::Method::POST, "caches")
                .header("content-type", "application/json")
                .body(serde_json::to_string_pretty(&body).unwrap()),
        )
        .await
    }

    /// Reserves `key` and returns the cache id.
    async fn reserved(&self, key: &str) -> i64 {
        let (status, body) = self.reserve(key, None).await;
        assert_eq!(status, 201, "{body}");
        let id = body["cacheId"].as_i64().unwrap();
        assert!(id > 0);
        id
    }

    async fn patch(&self, id: i64, start: u64, data: &[u8]) -> (u16, Value) {
        let end = start + data.len() as u64 - 1;
        // Chunked, without Content-Length, as the client sends it.
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            data.chunks(7000).map(|c| Ok(c.to_vec())).collect();
        let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
        Self::send(
            self.request(reqwest::Method::PATCH, &format!("caches/{id}"))
                .header("content-type", "application/octet-stream")
                .header("content-range", format!("bytes {start}-{end}/*"))
                .body(body),
        )
        .await
    }

    async fn commit(&self, id: i64, size: u64) -> (u16, Value) {
        Self::send(
            self.request(reqwest::Method::POST, &format!("caches/{id}"))
                .header("content-type", "application/json")
                .body(json!({ "size": size }).to_string()),
        )
        .await
    }

    /// A whole save in ranges of `range` bytes; returns the cache id.
    async fn save(&self, key: &str, data: &[u8], range: usize) -> i64 {
        let id = self.reserved(key).await;
        for (i, piece) in data.chunks(range).enumerate() {
            let (status, body) = self.patch(id, (i * range) as u64, piece).await;
            assert_eq!(status, 204, "{body}");
        }
        let (status, body) = self.commit(id, data.len() as u64).await;
        assert_eq!(status, 204, "{body}");
        id
    }

    async fn lookup(&self, keys: &str) -> (u16, Value) {
        let keys = common::percent_encode(keys);
        Self::send(self.request(
            reqwest::Method::GET,
            &format!("cache?keys={keys}&version={VERSION}"),
        ))
        .await
    }

    /// Looks `keys` up and downloads the hit (without credentials unless `proxied`).
    async fn restore(&self, keys: &str) -> Option<(Value, Vec<u8>)> {
        let (status, hit) = self.lookup(keys).await;
        if status == 204 {
            return None;
        }
        assert_eq!(status, 200, "{hit}");
        let url = hit["archiveLocation"].as_str().unwrap();
        let res = self.http.get(url).send().await.unwrap();
        assert_eq!(res.status(), 200, "{url}");
        Some((hit.clone(), res.bytes().await.unwrap().to_vec()))
    }
}

#[tokio::test]
async fn ranges_out_of_order_and_retried_make_one_entry() {
    let srv = TestServer::start().await;
    let v1 = V1::new(&srv, "", Auth::Bearer(main_token()));
    let data = random_bytes(25_000, 1);
    let id = v1.reserved("deps-Linux-1").await;
    // Out of order, and the middle range twice: the retry's bytes replace the first copy.
    for (start, piece) in [
        (20_000, &data[20_000..]),
        (10_000, &random_bytes(10_000, 99)[..]),
        (0, &data[..10_000]),
        (10_000, &data[10_000..20_000]),
    ] {
        let (status, body) = v1.patch(id, start, piece).await;
        assert_eq!(status, 204, "{body}");
    }
    let (status, body) = v1.commit(id, data.len() as u64).await;
    assert_eq!(status, 204, "{body}");

    let (hit, bytes) = v1.restore("deps-Linux-2,deps-Linux-").await.unwrap();
    assert_eq!(hit["cacheKey"], "deps-Linux-1");
    assert_eq!(hit["scope"], MAIN);
    assert_eq!(hit["cacheVersion"], VERSION);
    assert!(
        hit["creationTime"].as_str().unwrap().ends_with('Z'),
        "{hit}"
    );
    assert!(bytes == data, "the entry is the ranges in offset order");

    // Committed: no more ranges; a retried commit answers the same.
    let (status, body) = v1.patch(id, 0, b"late").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("already"),
        "{body}"
    );
    let (status, _) = v1.commit(id, data.len() as u64).await;
    assert_eq!(status, 204);
    assert_eq!(v1.restore("deps-Linux-1").await.unwrap().1, data);

    // A second save of the key is refused the way GitHub did.
    let (status, body) = v1.reserve("deps-Linux-1", Some(5)).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        body["message"],
        format!("Cache already exists. Scope: {MAIN}, Key: deps-Linux-1, Version: {VERSION}")
    );
    assert_eq!(body["typeKey"], "ArtifactCacheAlreadyExistsException");
    // So is a reservation while another job is still uploading.
    v1.reserved("in-progress").await;
    let (status, _) = v1.reserve("in-progress", None).await;
    assert_eq!(status, 409);
}

/// A range to upload: its start and its bytes.
type Range<'a> = (u64, &'a [u8]);

#[tokio::test]
async fn gaps_overlaps_and_wrong_sizes_are_refused_and_leave_nothing() {
    let srv = TestServer::start().await;
    let v1 = V1::new(&srv, "", Auth::Bearer(main_token()));
    let data = random_bytes(30, 2);
    let cases: [(&str, &[Range], u64, &str); 3] = [
        (
            "gap",
            &[(0, &data[..10]), (20, &data[20..])],
            30,
            "gap at byte 10",
        ),
        (
            "overlap",
            &[(0, &data[..10]), (5, &data[5..15]), (15, &data[15..])],
            30,
            "overlap at byte 5",
        ),
        (
            "size",
            &[(0, &data[..10]), (10, &data[10..20])],
            30,
            "uploaded 20 bytes",
        ),
    ];
    for (key, ranges, size, why) in cases {
        let id = v1.reserved(key).await;
        for (start, piece) in ranges {
            assert_eq!(v1.patch(id, *start, piece).await.0, 204);
        }
        let (status, body) = v1.commit(id, size).await;
        assert_eq!(status, 400, "{key}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains(why),
            "{key}: {body}"
        );
        assert_eq!(v1.lookup(key).await.0, 204, "{key}: nothing is visible");
        // The upload was aborted: the key is free for the next save at once.
        let again = v1.save(key, &data, 16).await;
        assert_ne!(again, id);
        assert_eq!(v1.restore(key).await.unwrap().1, data, "{key}");
    }
    // Only the three good entries' chunks are left (two ranges each).
    assert!(
        common::eventually(std::time::Duration::from_secs(5), || srv
            .chunk_files()
            .len()
            == 6)
        .await,
        "{:?}",
        srv.chunk_files()
    );
}

#[tokio::test]
async fn uploads_and_entries_belong_to_their_caller() {
    let srv = TestServer::start().await;
    let owner = V1::new(&srv, "", Auth::Bearer(main_token()));
    let other_repo = V1::new(&srv, "", Auth::Bearer(token("2", &[(MAIN, 3)])));
    let other_branch = V1::new(&srv, "", Auth::Bearer(token("1", &[("refs/heads/dev", 3)])));
    let id = owner.reserved("k").await;
    for intruder in [&other_repo, &other_branch] {
        let (status, body) = intruder.patch(id, 0, b"evil").await;
        assert_eq!(status, 404, "{body}");
        let (status, _) = intruder.commit(id, 4).await;
        assert_eq!(status, 404);
    }
    assert_eq!(owner.patch(id, 0, b"good").await.0, 204);
    assert_eq!(owner.commit(id, 4).await.0, 204);
    assert_eq!(owner.restore("k").await.unwrap().1, b"good");
    assert_eq!(other_repo.lookup("k").await.0, 204);
    assert_eq!(other_branch.lookup("k").await.0, 204);

    let read_only = V1::new(&srv, "", Auth::Bearer(token("1", &[(MAIN, 1)])));
    let (status, body) = read_only.reserve("ro", None).await;
    assert_eq!(status, 403, "{body}");
    assert!(body["message"]
        .as_str()
        .unwrap()
        .starts_with("cache write denied:"));
    assert_eq!(read_only.restore("k").await.unwrap().1, b"good");
    let write_only = V1::new(&srv, "", Auth::Bearer(token("1", &[(MAIN, 2)])));
    let (status, body) = write_only.lookup("k").await;
    assert_eq!(status, 403, "{body}");
    assert!(body["message"]
        .as_str()
        .unwrap()
        .starts_with("cache read denied:"));
}

/// GitHub's `cache-mode` (`write`, `read`, `write-only`, `none`), enforced by its cache service
/// through the token's permission bits (Read 1, Write 2): hoard gives each mode GitHub's answers,
/// over v2 and v1, whatever the client does with `ACTIONS_CACHE_MODE` (older clients, sccache
/// and BuildKit ignore it). The messages are the ones `@actions/cache` recognises by prefix: a
/// refused save is a warning and the job goes on, a refused restore is a miss.
#[tokio::test]
async fn each_cache_mode_gets_githubs_answers_over_v2_and_v1() {
    const WRITE_DENIED: &str = "cache write denied: token has no writable scopes";
    const READ_DENIED: &str = "cache read denied: token has no readable scopes";
    let srv = TestServer::start().await;
    let writer = main_token();
    srv.save(&writer, "seed", VERSION, b"saved by a write token")
        .await;
    /// A mode, the token's `ac` grants, whether it can read, whether it can write.
    type Mode<'a> = (&'a str, &'a [(&'a str, u8)], bool, bool);
    let modes: [Mode; 5] = [
        ("write", &[(MAIN, 3)], true, true),
        ("read", &[(MAIN, 1)], true, false),
        ("write-only", &[(MAIN, 2)], false, true),
        ("none", &[], false, false),
        ("none (a scope without bits)", &[(MAIN, 0)], false, false),
    ];
    for (i, (mode, grants, reads, writes)) in modes.into_iter().enumerate() {
        let t = token("1", grants);
        let v1 = V1::new(&srv, "", Auth::Bearer(t.clone()));

        // Restores, v2 then v1.
        let (status, body) = srv.lookup(&t, "seed", &[], VERSION).await;
        if reads {
            assert_eq!((status, &body["ok"]), (200, &json!(true)), "{mode}: {body}");
        } else {
            assert_eq!(status, 403, "{mode}: {body}");
            assert_eq!(body["code"], "permission_denied", "{mode}");
            assert_eq!(body["msg"], READ_DENIED, "{mode}");
        }
        let (status, body) = v1.lookup("seed").await;
        if reads {
            assert_eq!(status, 200, "{mode}: {body}");
        } else {
            assert_eq!(
                (status, &body["message"]),
                (403, &json!(READ_DENIED)),
                "{mode}"
            );
        }

        // Saves, v2 then v1.
        let (key_v2, key_v1) = (format!("mode-{i}-v2"), format!("mode-{i}-v1"));
        let (status, body) = srv
            .twirp(
                "CreateCacheEntry",
                &t,
                json!({ "key": key_v2, "version": VERSION }),
            )
            .await;
        assert_eq!(status, 200, "{mode}: {body}");
        if writes {
            assert_eq!(body["ok"], true, "{mode}: {body}");
            let url = body["signed_upload_url"].as_str().unwrap();
            assert_eq!(srv.put_blob(url, b"v2".to_vec()).await.status(), 201);
            let (status, body) = srv.finalize(&t, &key_v2, VERSION, 2).await;
            assert_eq!((status, &body["ok"]), (200, &json!(true)), "{mode}: {body}");
        } else {
            assert_eq!(body["ok"], false, "{mode}: {body}");
            assert_eq!(body["message"], WRITE_DENIED, "{mode}");
        }
        if writes {
            v1.save(&key_v1, b"v1", 1024).await;
        } else {
            let (status, body) = v1.reserve(&key_v1, None).await;
            assert_eq!(
                (status, &body["message"]),
                (403, &json!(WRITE_DENIED)),
                "{mode}"
            );
        }
        // What a mode saved is really there (a write token restores it); what it was refused
        // is not.
        let saved_v2 = srv.restore(&writer, &key_v2, VERSION).await;
        assert_eq!(saved_v2.is_some(), writes, "{mode}");
        let owner = V1::new(&srv, "", Auth::Bearer(writer.clone()));
        assert_eq!(owner.restore(&key_v1).await.is_some(), writes, "{mode}");
    }
}

#[tokio::test]
async fn bad_requests_get_json_messages() {
    let srv = TestServer::start_with(&["--max-entry-size", "1MiB"]).await;
    let v1 = V1::new(&srv, "", Auth::Bearer(main_token()));
    let anonymous = V1::new(&srv, "", Auth::None);
    let (status, body) = anonymous.lookup("k").await;
    assert_eq!(status, 401, "{body}");
    let (status, _) = V1::new(&srv, "", Auth::Bearer("not-a-jwt".into()))
        .reserve("k", None)
        .await;
    assert_eq!(status, 401);

    let (status, body) = v1.reserve("big", Some(2 << 20)).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("limit"),
        "{body}"
    );
    let (status, _) = v1.reserve("a,b", None).await;
    assert_eq!(status, 400);

    let id = v1.reserved("k").await;
    for range in ["bytes 5-1/*", "bytes 0-3", "0-3/*", "bytes 0-3/3"] {
        let (status, body) = V1::send(
            v1.request(reqwest::Method::PATCH, &format!("caches/{id}"))
                .header("content-range", range)
                .body("abcd"),
        )
        .await;
        assert_eq!(status, 400, "{range}: {body}");
        assert!(body["message"].as_str().unwrap().contains("Content-Range"));
    }
    // The body must be exactly the range.
    let (status, body) = V1::send(
        v1.request(reqwest::Method::PATCH, &format!("caches/{id}"))
            .header("content-range", "bytes 0-9/*")
            .body("abcd"),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // Ranges past the entry size limit are refused before any byte is read.
    let (status, _) = v1.patch(id, 1 << 20, b"x").await;
    assert_eq!(status, 400);
    let (status, _) = V1::send(
        v1.request(reqwest::Method::POST, &format!("caches/{id}"))
            .body("{\"size\": -1}"),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = v1.commit(id + 1000, 1).await;
    assert_eq!(status, 404);

    for (method, resource, expected) in [
        (reqwest::Method::GET, "nope", 404),
        (reqwest::Method::GET, "caches/0", 404),
        (reqwest::Method::DELETE, "caches", 405),
        (reqwest::Method::GET, "cache?version=x", 400),
    ] {
        let (status, body) = V1::send(v1.request(method, resource)).await;
        assert_eq!(status, expected, "{resource}: {body}");
        assert!(body["message"].is_string(), "{body}");
    }
}

#[tokio::test]
async fn one_store_serves_both_protocols() {
    let srv = TestServer::start().await;
    let t = main_token();
    let v1 = V1::new(&srv, "/any/prefix", Auth::Bearer(t.clone()));
    let from_v2 = random_bytes(5000, 3);
    srv.save(&t, "saved-by-v2", VERSION, &from_v2).await;
    let (hit, bytes) = v1.restore("saved-by-v2").await.unwrap();
    assert_eq!(hit["cacheKey"], "saved-by-v2");
    assert_eq!(bytes, from_v2);

    let from_v1 = random_bytes(5000, 4);
    v1.save("saved-by-v1", &from_v1, 2048).await;
    assert_eq!(
        srv.restore(&t, "saved-by-v1", VERSION).await.unwrap(),
        from_v1
    );
    // Immutability holds across protocols.
    let (status, body) = srv
        .twirp(
            "CreateCacheEntry",
            &t,
            json!({ "key": "saved-by-v1", "version": VERSION }),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(v1.reserve("saved-by-v2", None).await.0, 409);
}

/// Forgejo's proxy headers for `repo`, signed with `secret` at `timestamp`.
fn forgejo(secret: &str, repo: &str, timestamp: u64, isolation: &str) -> Auth {
    let ts = timestamp.to_string();
    let mac = hoard::auth::forgejo::compute_mac(secret.as_bytes(), repo, "5", &ts, isolation);
    let mut h = vec![
        ("Forgejo-Cache-Repo".to_owned(), repo.to_owned()),
        ("Forgejo-Cache-RunNumber".to_owned(), "5".to_owned()),
        ("Forgejo-Cache-RunId".to_owned(), "run42".to_owned()),
        ("Forgejo-Cache-Timestamp".to_owned(), ts),
        ("Forgejo-Cache-MAC".to_owned(), mac),
        (
            "Forgejo-Cache-Host".to_owned(),
            "http://proxy.example:4567".to_owned(),
        ),
    ];
    if !isolation.is_empty() {
        h.push((
            "Forgejo-Cache-WriteIsolationKey".to_owned(),
            isolation.to_owned(),
        ));
    }
    Auth::Headers(h)
}

const FORGEJO_SECRET: &str = "forgejo-cache-server-secret";

async fn forgejo_server() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("forgejo-secret");
    std::fs::write(&file, format!("{FORGEJO_SECRET}\n")).unwrap();
    TestServer::start_on_with(
        dir,
        &["--forgejo-cache-secret-file", file.to_str().unwrap()],
    )
    .await
}

/// Downloads `id` the way Forgejo's proxy forwards the archiveLocation of a hit.
async fn proxied_download(srv: &TestServer, auth: &Auth, id: &str) -> (u16, Vec<u8>) {
    let v1 = V1::new(srv, "", auth.clone());
    let res = v1
        .request(reqwest::Method::GET, &format!("artifacts/{id}"))
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.bytes().await.unwrap().to_vec())
}

#[tokio::test]
async fn forgejo_proxies_are_verified_and_pull_requests_are_isolated() {
    let srv = forgejo_server().await;
    let now = common::unix_now();
    let main = forgejo(FORGEJO_SECRET, "owner/app", now - 30, "");
    let pr = forgejo(FORGEJO_SECRET, "owner/app", now, "refs/pull/3/head");
    let other_repo = forgejo(FORGEJO_SECRET, "owner/other", now, "");
    let shared = random_bytes(3000, 5);
    V1::new(&srv, "", main.clone())
        .save("deps-1", &shared, 1000)
        .await;

    // A hit points back at the job's proxy, which forwards the download with its headers.
    let (status, hit) = V1::new(&srv, "", main.clone()).lookup("deps-").await;
    assert_eq!(status, 200, "{hit}");
    let location = hit["archiveLocation"].as_str().unwrap();
    let id = location
        .strip_prefix("http://proxy.example:4567/run42/_apis/artifactcache/artifacts/")
        .unwrap_or_else(|| panic!("{location}"));
    assert_eq!(
        proxied_download(&srv, &main, id).await,
        (200, shared.clone())
    );
    assert_eq!(proxied_download(&srv, &other_repo, id).await.0, 404);
    assert_eq!(V1::new(&srv, "", other_repo).lookup("deps-1").await.0, 204);

    // A pull request reads the shared namespace but writes its own.
    let pr_v1 = V1::new(&srv, "", pr.clone());
    let (status, hit) = pr_v1.lookup("deps-1").await;
    assert_eq!(status, 200, "{hit}");
    assert_eq!(proxied_download(&srv, &pr, id).await, (200, shared.clone()));
    let from_pr = random_bytes(100, 6);
    pr_v1.save("deps-2", &from_pr, 64).await;
    let (status, hit) = pr_v1.lookup("deps-2").await;
    assert_eq!(status, 200, "{hit}");
    let pr_id = hit["archiveLocation"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(proxied_download(&srv, &pr, &pr_id).await, (200, from_pr));
    let main_v1 = V1::new(&srv, "", main.clone());
    assert_eq!(main_v1.lookup("deps-2").await.0, 204, "invisible to main");
    assert_eq!(proxied_download(&srv, &main, &pr_id).await.0, 404);
    // The same key saved on the default branch is its own entry.
    main_v1.save("deps-2", b"main's", 64).await;

    // Forged, tampered or stale headers are refused.
    for (why, auth) in [
        ("wrong secret", forgejo("guess", "owner/app", now, "")),
        (
            "stale",
            forgejo(FORGEJO_SECRET, "owner/app", now - 25 * 3600, ""),
        ),
        (
            "future",
            forgejo(FORGEJO_SECRET, "owner/app", now + 3600, ""),
        ),
    ] {
        let (status, body) = V1::new(&srv, "", auth).lookup("deps-1").await;
        assert_eq!(status, 403, "{why}: {body}");
    }
    let Auth::Headers(mut tampered) = pr.clone() else {
        unreachable!()
    };
    tampered.retain(|(k, _)| k != "Forgejo-Cache-WriteIsolationKey");
    let (status, _) = V1::new(&srv, "", Auth::Headers(tampered))
        .reserve("sneak", None)
        .await;
    assert_eq!(status, 403, "dropping the isolation key breaks the MAC");

    // A server without the secret refuses Forgejo headers rather than ignoring them.
    let plain = TestServer::start().await;
    let (status, body) = V1::new(&plain, "", main).lookup("deps-1").await;
    assert_eq!(status, 403, "{body}");
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains("--forgejo-cache-secret-file"));
}

const SECRET_A: &str = "aaaaaaaaaaaaaaaa-act-builds";
const SECRET_B: &str = "bbbbbbbbbbbbbbbb-gitea-ci";

async fn namespaced_server(extra: &[&str]) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("namespaces");
    std::fs::write(
        &file,
        format!("# act and gitea\nact {SECRET_A} read-write\ngitea {SECRET_B} read-only\n"),
    )
    .unwrap();
    let mut args = vec!["--namespaces-file", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    TestServer::start_on_with(dir, &args).await
}

#[tokio::test]
async fn namespaces_by_secret_prefix_are_isolated() {
    let srv = namespaced_server(&[]).await;
    // act sends a token only it can check: the prefix alone decides.
    let act_token = sign_hs256(&claims("", &[("", 2)])).replace('.', ".x");
    let a = V1::new(&srv, &format!("/{SECRET_A}"), Auth::Bearer(act_token));
    let a_plain = V1::new(&srv, &format!("/{SECRET_A}"), Auth::None);
    let b = V1::new(&srv, &format!("/{SECRET_B}"), Auth::None);
    let data = random_bytes(2000, 7);
    a.save("tools-1", &data, 700).await;
    assert_eq!(a_plain.restore("tools-").await.unwrap().1, data);
    assert_eq!(b.lookup("tools-1").await.0, 204, "namespaces are isolated");
    let (status, body) = b.reserve("tools-1", None).await;
    assert_eq!(status, 403, "read-only namespace: {body}");

    // An unknown prefix learns nothing: the same 404 as a path that names nothing at all.
    let (status, unknown) = V1::new(&srv, "/cccccccccccccccc-guess", Auth::None)
        .lookup("tools-1")
        .await;
    assert_eq!(status, 404);
    let (status, nothing) = V1::new(&srv, &format!("/{SECRET_A}x"), Auth::None)
        .lookup("tools-1")
        .await;
    assert_eq!((status, &nothing), (404, &unknown));
    // A token that verifies keeps its own identity under any prefix.
    let github = V1::new(&srv, "/cccccccccccccccc-guess", Auth::Bearer(main_token()));
    assert_eq!(github.lookup("tools-1").await.0, 204);
    github.save("own", b"mine", 4).await;
    assert_eq!(
        V1::new(&srv, "", Auth::Bearer(main_token()))
            .restore("own")
            .await
            .unwrap()
            .1,
        b"mine"
    );
    // Clients that keep the prefix of ACTIONS_RESULTS_URL (sccache, buildx) reach the
    // namespace through v2 as well.
    let res = srv
        .http
        .post(srv.url(&format!(
            "/{SECRET_A}{}GetCacheEntryDownloadURL",
            common::SERVICE
        )))
        .header("content-type", "application/json")
        .body(json!({ "key": "tools-1", "version": VERSION }).to_string())
        .send()
        .await
        .unwrap();
    let (status, body) = common::json_of(res).await;
    assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
}

#[tokio::test]
async fn anonymous_access_is_off_unless_turned_on() {
    let srv = TestServer::start().await;
    assert_eq!(V1::new(&srv, "", Auth::None).lookup("k").await.0, 401);

    let open = TestServer::start_with(&["--anonymous-access", "read-write"]).await;
    let anonymous = V1::new(&open, "", Auth::None);
    anonymous.save("k", b"anyone", 3).await;
    assert_eq!(anonymous.restore("k").await.unwrap().1, b"anyone");
    let ready: Value = open
        .http
        .get(open.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        ready["warnings"].to_string().contains("--anonymous-access"),
        "{ready}"
    );
    // Tokens still get their own repository, not the anonymous one.
    assert_eq!(
        V1::new(&open, "", Auth::Bearer(main_token()))
            .lookup("k")
            .await
            .0,
        204
    );

    let read_only = TestServer::start_with(&["--anonymous-access", "read-only"]).await;
    let (status, _) = V1::new(&read_only, "", Auth::None).reserve("k", None).await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn gitea_tokens_restore_what_they_saved() {
    // Gitea grants write on the empty scope and nothing else; with its secret configured
    // (--token-hs256-secret-file), its jobs read back what they wrote.
    let srv = TestServer::start().await;
    let mut gitea = claims("", &[("", 2)]);
    gitea.as_object_mut().unwrap().remove("repository_id");
    let v1 = V1::new(&srv, "", Auth::Bearer(sign_hs256(&gitea)));
    v1.save("gitea-1", b"from gitea", 4).await;
    assert_eq!(v1.restore("gitea-").await.unwrap().1, b"from gitea");
}

#[tokio::test]
async fn listings_name_every_readable_version_of_a_key() {
    let srv = TestServer::start().await;
    let t = token("1", &[("refs/pull/9/merge", 3), (MAIN, 1)]);
    let main = main_token();
    srv.save(&main, "Tools", VERSION, b"main").await;
    srv.save(&main, "tools", "other-version", b"other").await;
    srv.save(&t, "TOOLS", VERSION, b"pr").await;
    srv.save(&main, "tools-longer", VERSION, b"not this key")
        .await;
    srv.save(
        &token("2", &[(MAIN, 3)]),
        "tools",
        VERSION,
        b"other repository",
    )
    .await;
    let pr = V1::new(&srv, "", Auth::Bearer(t));
    let (status, body) = V1::send(pr.request(reqwest::Method::GET, "caches?key=tools")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["totalCount"], 3, "{body}");
    let listed: Vec<(&str, &str, &str)> = body["artifactCaches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["scope"].as_str().unwrap(),
                e["cacheKey"].as_str().unwrap(),
                e["cacheVersion"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("refs/pull/9/merge", "TOOLS", VERSION),
            (MAIN, "tools", "other-version"),
            (MAIN, "Tools", VERSION),
        ],
        "the pull request's scope first, then the base branch's, newest first"
    );
    let (status, body) = V1::send(pr.request(reqwest::Method::GET, "caches")).await;
    assert_eq!(status, 400, "{body}");
}
