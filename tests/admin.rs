//! The admin API (`/_hoard/api/v1/`): off without an admin token, refused without the right
//! one, and every endpoint with its filters, sorting, paging and errors; a deletion makes the
//! entry a miss for the cache protocol.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use serde_json::{json, Value};

use common::{claims, json_of, sign_hs256, TestServer, MAIN, VERSION};

const ADMIN: &str = "admin-token-for-tests-0123456789";
const DEV: &str = "refs/heads/dev";

async fn start() -> TestServer {
    TestServer::start_with(&["--admin-token", ADMIN]).await
}

/// A runtime token of `repository` (id) that names it `name`, reading and writing `scope`.
fn token_of(repository: &str, name: &str, scope: &str) -> String {
    let mut c = claims(repository, &[(scope, 3)]);
    c["repository"] = json!(name);
    sign_hs256(&c)
}

async fn admin(srv: &TestServer, method: reqwest::Method, path: &str) -> (u16, Value) {
    let res = srv
        .http
        .request(method, srv.url(&format!("/_hoard/api/v1/{path}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.headers()["cache-control"],
        "no-store",
        "admin answers are never cached"
    );
    json_of(res).await
}

async fn get(srv: &TestServer, path: &str) -> (u16, Value) {
    admin(srv, reqwest::Method::GET, path).await
}

async fn delete(srv: &TestServer, path: &str) -> (u16, Value) {
    admin(srv, reqwest::Method::DELETE, path).await
}

fn keys(listing: &Value) -> Vec<&str> {
    listing["actions_caches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn without_an_admin_token_the_api_and_dashboard_are_off() {
    let srv = TestServer::start().await;
    for path in [
        "/_hoard/",
        "/_hoard/api/v1/status",
        "/_hoard/api/v1/openapi.json",
    ] {
        let res = srv
            .http
            .get(srv.url(path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let (status, body) = json_of(res).await;
        assert_eq!(status, 404, "{path}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("--admin-token-file"),
            "says how to turn it on: {body}"
        );
    }
}

#[tokio::test]
async fn calls_need_the_admin_token() {
    let srv = start().await;
    let url = srv.url("/_hoard/api/v1/caches");
    let missing = srv.http.get(&url).send().await.unwrap();
    assert_eq!(
        missing.headers()["www-authenticate"],
        "Bearer realm=\"hoard admin\""
    );
    let (status, body) = json_of(missing).await;
    assert_eq!(status, 401);
    assert!(
        body["message"].as_str().unwrap().contains("Bearer"),
        "{body}"
    );
    for wrong in [&format!("{ADMIN}x"), "admin", &ADMIN[..ADMIN.len() - 1]] {
        let res = srv
            .http
            .delete(&url)
            .bearer_auth(wrong)
            .send()
            .await
            .unwrap();
        let (status, body) = json_of(res).await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(body["message"], "the admin token was refused");
    }
    // A runtime token is not an admin token.
    let runtime = token_of("1", "octo/one", MAIN);
    let res = srv
        .http
        .get(&url)
        .bearer_auth(runtime)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    let (status, _) = get(&srv, "caches").await;
    assert_eq!(status, 200);
    // The description of the API is public.
    let res = srv
        .http
        .get(srv.url("/_hoard/api/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    let (status, doc) = json_of(res).await;
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    for path in ["/status", "/usage", "/caches", "/caches/{id}"] {
        assert!(doc["paths"][path].is_object(), "{path} is described");
    }
}

#[tokio::test]
async fn entries_are_listed_filtered_sorted_and_paged() {
    let clock = common::manual_clock();
    let srv = TestServer::start_with_clock(&["--admin-token", ADMIN], clock.clone()).await;
    let (a, b) = (
        token_of("10", "octo/alpha", MAIN),
        token_of("20", "octo/beta", MAIN),
    );
    let a_dev = token_of("10", "octo/alpha", DEV);
    srv.save(&a, "Linux-npm-1", VERSION, &[1u8; 100]).await;
    srv.save(&a, "linux-npm-2", VERSION, &[2u8; 300]).await;
    srv.save(&a_dev, "linux-cargo", VERSION, &[3u8; 200]).await;
    srv.save(&a, "other-version", "v2", &[4u8; 50]).await;
    srv.save(&b, "linux-npm-1", VERSION, &[5u8; 400]).await;
    // A restore makes an entry the most recently used and counts a hit; it comes after the
    // last save on the server's clock.
    clock.advance(std::time::Duration::from_secs(1));
    assert!(srv.restore(&a, "linux-npm-1", VERSION).await.is_some());

    let (status, all) = get(&srv, "caches").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["total_count"], 5);
    assert_eq!(all["next_cursor"], Value::Null);
    assert_eq!(keys(&all)[0], "Linux-npm-1", "last used first: {all}");
    let first = &all["actions_caches"][0];
    assert_eq!(first["repository_id"], "10");
    assert_eq!(first["repository"], "octo/alpha");
    assert_eq!(first["ref"], MAIN);
    assert_eq!(first["version"], VERSION);
    assert_eq!(first["size_in_bytes"], 100);
    assert_eq!(first["hits"], 1, "the restore is counted at once");
    for field in ["created_at", "last_accessed_at"] {
        let at = first[field].as_str().unwrap();
        assert!(
            at.ends_with('Z') && at.len() == 24,
            "RFC 3339 with milliseconds: {at}"
        );
    }

    // Sorting by size, both ways.
    let (_, by_size) = get(&srv, "caches?sort=size_in_bytes&direction=asc").await;
    assert_eq!(
        keys(&by_size),
        [
            "other-version",
            "Linux-npm-1",
            "linux-cargo",
            "linux-npm-2",
            "linux-npm-1"
        ]
    );
    let (_, newest) = get(&srv, "caches?sort=created_at").await;
    assert_eq!(keys(&newest)[0], "linux-npm-1");
    assert_eq!(newest["actions_caches"][0]["repository"], "octo/beta");

    // Paging: two at a time, every entry once, in order.
    let mut seen = Vec::new();
    let mut path = "caches?sort=size_in_bytes&direction=asc&per_page=2".to_owned();
    loop {
        let (status, page) = get(&srv, &path).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["total_count"], 5, "every page tells the total");
        seen.extend(keys(&page).into_iter().map(str::to_owned));
        match page["next_cursor"].as_str() {
            Some(cursor) => {
                path = format!(
                    "caches?sort=size_in_bytes&direction=asc&per_page=2&cursor={}",
                    common::percent_encode(cursor)
                )
            }
            None => break,
        }
    }
    assert_eq!(seen, keys(&by_size));

    // Filters: a key prefix (case-insensitive), a ref, a repository by id or name, a version.
    let (_, npm) = get(&srv, "caches?key=LINUX-NPM&sort=created_at&direction=asc").await;
    assert_eq!(keys(&npm), ["Linux-npm-1", "linux-npm-2", "linux-npm-1"]);
    let (_, dev) = get(&srv, &format!("caches?ref={}", common::percent_encode(DEV))).await;
    assert_eq!(keys(&dev), ["linux-cargo"]);
    let (_, beta) = get(&srv, "caches?repository=octo%2Fbeta").await;
    assert_eq!(keys(&beta), ["linux-npm-1"]);
    let (_, by_id) = get(&srv, "caches?repository=20").await;
    assert_eq!(keys(&by_id), ["linux-npm-1"]);
    let (_, v2) = get(&srv, "caches?version=v2").await;
    assert_eq!(
        (v2["total_count"].as_u64(), keys(&v2)),
        (Some(1), vec!["other-version"])
    );
    let (_, both) = get(&srv, "caches?repository=10&key=linux-npm&per_page=1").await;
    assert_eq!(both["total_count"], 2);
    assert_eq!(keys(&both).len(), 1);
    assert!(both["next_cursor"].is_string());

    // Bad parameters are refused with a sentence.
    for bad in [
        "caches?sort=key",
        "caches?direction=up",
        "caches?per_page=0",
        "caches?per_page=1001",
        "caches?cursor=nonsense",
        "caches?sort=created_at&cursor=size_in_bytes.desc.1.1",
        "caches?key=a%2Cb",
        "usage?limit=x",
    ] {
        let (status, body) = get(&srv, bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(!body["message"].as_str().unwrap().is_empty(), "{bad}");
    }
}

#[tokio::test]
async fn one_entry_is_shown_and_deleted_and_then_misses() {
    let srv = start().await;
    let t = token_of("7", "octo/seven", MAIN);
    let id = srv.save(&t, "deps-linux", VERSION, b"hello").await;
    let keep = srv.save(&t, "deps-windows", VERSION, b"world").await;

    let (status, shown) = get(&srv, &format!("caches/{id}")).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["id"], id);
    assert_eq!(shown["key"], "deps-linux");
    assert_eq!(shown["repository"], "octo/seven");
    assert_eq!(shown["size_in_bytes"], 5);

    // A dry run of one entry deletes nothing.
    let (status, dry) = delete(&srv, &format!("caches/{id}?dry_run=true")).await;
    assert_eq!(
        (status, &dry["dry_run"], &dry["ids"]),
        (200, &json!(true), &json!([id])),
        "{dry}"
    );
    assert!(srv.restore(&t, "deps-linux", VERSION).await.is_some());
    let (status, deleted) = delete(&srv, &format!("caches/{id}")).await;
    assert_eq!(
        (status, deleted),
        (
            200,
            json!({ "deleted": 1, "dry_run": false, "ids": [id], "ids_truncated": false, "size_in_bytes": 5 })
        )
    );
    let (_, lookup) = srv.lookup(&t, "deps-linux", &[], VERSION).await;
    assert_eq!(lookup["ok"], false, "a deleted entry is a miss: {lookup}");
    // A prefix lookup no longer finds it either, but finds the other entry.
    let (_, prefix) = srv.lookup(&t, "deps-", &[], VERSION).await;
    assert_eq!(prefix["matched_key"], "deps-windows");

    for path in [
        format!("caches/{id}"),
        "caches/abc".into(),
        "caches/-1".into(),
    ] {
        let (status, body) = get(&srv, &path).await;
        assert_eq!(status, 404, "{path}: {body}");
        let (status, body) = delete(&srv, &path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(body["message"], "no such cache entry");
    }
    let (status, _) = get(&srv, &format!("caches/{keep}")).await;
    assert_eq!(status, 200, "the other entry stays");
    let (status, _) = admin(&srv, reqwest::Method::PUT, &format!("caches/{keep}")).await;
    assert_eq!(status, 405);
    let (status, _) = get(&srv, "nothing-here").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn entries_are_deleted_by_key_prefix_or_repository() {
    let srv = start().await;
    let (a, b) = (token_of("1", "octo/a", MAIN), token_of("2", "octo/b", MAIN));
    for key in ["npm-1", "npm-2", "cargo-1"] {
        srv.save(&a, key, VERSION, key.as_bytes()).await;
        srv.save(&b, key, VERSION, key.as_bytes()).await;
    }
    let (status, body) = delete(&srv, "caches").await;
    assert_eq!(status, 400, "deleting everything must be asked for: {body}");
    let (_, all) = get(&srv, "caches").await;
    assert_eq!(all["total_count"], 6, "nothing was deleted");

    let (status, body) = delete(&srv, "caches?key=NPM-&repository=octo%2Fa").await;
    assert_eq!((status, &body["deleted"]), (200, &json!(2)), "{body}");
    assert_eq!(body["dry_run"], false);
    let (_, left) = get(&srv, "caches?repository=1").await;
    assert_eq!(keys(&left), ["cargo-1"]);
    assert!(srv.restore(&a, "npm-1", VERSION).await.is_none());
    assert_eq!(srv.restore(&b, "npm-1", VERSION).await.unwrap(), b"npm-1");

    // Names are not unique (a forge's octo/b and GitHub's, say): a deletion by a name that
    // several repositories carry is refused rather than guessed.
    let twin = token_of("3", "octo/b", MAIN);
    srv.save(&twin, "npm-1", VERSION, b"twin").await;
    let (status, body) = delete(&srv, "caches?repository=octo%2Fb").await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("name one by its repository id"),
        "{body}"
    );
    let (_, body) = delete(&srv, "caches?repository=3").await;
    assert_eq!(body["deleted"], 1, "{body}");
    let (_, body) = delete(&srv, "caches?repository=2").await;
    assert_eq!(body["deleted"], 3, "{body}");
    let (_, body) = delete(&srv, "caches?all=true").await;
    assert_eq!(body["deleted"], 1, "{body}");
    let (_, none) = get(&srv, "caches").await;
    assert_eq!(none["total_count"], 0);
}

#[tokio::test]
async fn usage_and_status_report_repositories_and_the_server() {
    let srv = TestServer::start_with(&[
        "--admin-token",
        ADMIN,
        "--max-storage",
        "1MiB",
        "--repo-quota",
        "512KiB",
    ])
    .await;
    let (a, b) = (token_of("1", "octo/a", MAIN), token_of("2", "", MAIN));
    srv.save(&a, "big", VERSION, &[1u8; 3000]).await;
    srv.save(&a, "small", VERSION, &[1u8; 1000]).await;
    srv.save(&b, "only", VERSION, &[1u8; 2000]).await;
    assert!(srv.restore(&a, "big", VERSION).await.is_some());
    assert!(srv.restore(&a, "small", VERSION).await.is_some());
    assert!(srv.restore(&a, "nothing", VERSION).await.is_none());
    assert!(srv.restore(&b, "nothing", VERSION).await.is_none());
    // Restores and misses are written within a second, and at once when an operator asks.
    let (status, usage) = get(&srv, "usage").await;
    assert_eq!(status, 200, "{usage}");
    assert_eq!(
        usage["total"],
        json!({ "size_in_bytes": 6000, "entries": 3, "open_uploads": 0 })
    );
    assert_eq!(usage["repository_count"], 2);
    assert_eq!(
        usage["repositories"],
        json!([
            { "repository_id": "1", "full_name": "octo/a", "active_caches_size_in_bytes": 4000,
              "active_caches_count": 2, "branch_caches_size_in_bytes": 4000, "branch_caches_count": 2,
              "pr_and_tag_caches_size_in_bytes": 0, "pr_and_tag_caches_count": 0,
              "hits": 2, "misses": 1, "hit_ratio": 0.667 },
            { "repository_id": "2", "full_name": "", "active_caches_size_in_bytes": 2000,
              "active_caches_count": 1, "branch_caches_size_in_bytes": 2000, "branch_caches_count": 1,
              "pr_and_tag_caches_size_in_bytes": 0, "pr_and_tag_caches_count": 0,
              "hits": 0, "misses": 1, "hit_ratio": 0.0 },
        ])
    );
    let (_, one) = get(&srv, "usage?repository=octo%2Fa").await;
    assert_eq!(one["repositories"].as_array().unwrap().len(), 1);
    let (_, top) = get(&srv, "usage?limit=1").await;
    assert_eq!(top["repositories"][0]["full_name"], "octo/a");

    let (status, status_body) = get(&srv, "status").await;
    assert_eq!(status, 200, "{status_body}");
    assert_eq!(status_body["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(status_body["database"], "sqlite");
    assert_eq!(status_body["storage"], "file");
    assert_eq!(status_body["usage"]["entries"], 3);
    assert_eq!(status_body["limits"]["max_storage"], 1 << 20);
    assert_eq!(status_body["limits"]["repository_quota"], 512 << 10);
    assert_eq!(status_body["limits"]["max_age_seconds"], Value::Null);
    assert_eq!(
        status_body["lookups"],
        json!({ "hits": 2, "misses": 2, "hit_ratio": 0.5 })
    );
    assert!(status_body["uptime_seconds"].is_u64());
    assert!(
        status_body["warnings"].as_array().unwrap().is_empty(),
        "{status_body}"
    );
}

#[tokio::test]
async fn the_dashboard_is_served_from_the_binary_with_a_strict_policy() {
    let srv = start().await;
    let res = srv.http.get(srv.url("/_hoard/")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let csp = res.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"));
    let html = res.text().await.unwrap();
    assert!(html.contains("/_hoard/app.js") && html.contains("/_hoard/style.css"));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no outside assets"
    );
    for (path, kind) in [
        ("/_hoard/app.js", "text/javascript"),
        ("/_hoard/style.css", "text/css"),
    ] {
        let res = srv.http.get(srv.url(path)).send().await.unwrap();
        assert_eq!(res.status(), 200, "{path}");
        assert!(res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with(kind));
    }
    let res = srv
        .http
        .get(srv.url("/_hoard/missing.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    let no_slash = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(srv.url("/_hoard"))
        .send()
        .await
        .unwrap();
    assert_eq!(no_slash.status(), 308);
    assert_eq!(no_slash.headers()["location"], "/_hoard/");
}

/// Saves `key` with `token`, reserving with `forwarded_for` as `X-Forwarded-For` if given.
async fn save_from(srv: &TestServer, token: &str, key: &str, forwarded_for: Option<&str>) -> i64 {
    let mut req = srv
        .http
        .post(srv.url(&format!("{}CreateCacheEntry", common::SERVICE)))
        .bearer_auth(token)
        .json(&json!({"key": key, "version": VERSION}));
    if let Some(xff) = forwarded_for {
        req = req.header("x-forwarded-for", xff);
    }
    let (status, body) = json_of(req.send().await.unwrap()).await;
    assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
    let url = body["signed_upload_url"].as_str().unwrap();
    assert_eq!(srv.put_blob(url, b"payload".to_vec()).await.status(), 201);
    let (status, body) = srv.finalize(token, key, VERSION, 7).await;
    assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
    body["entry_id"].as_str().unwrap().parse().unwrap()
}

/// The token of a run: `sub` and `scp` as GitHub sets them.
fn run_token(repository: &str, sub: &str, run: &str, job: &str) -> String {
    let mut c = claims(repository, &[(MAIN, 3)]);
    c["sub"] = json!(sub);
    c["scp"] = json!(format!("Actions.Results:{run}:{job}"));
    sign_hs256(&c)
}

#[tokio::test]
async fn entries_show_who_wrote_them_and_a_forged_forwarded_for_is_ignored() {
    let srv = start().await;
    let t = run_token("8101", "repo:o/r:ref:refs/heads/main", "7345", "12");
    // The peer is no trusted proxy (none is configured): its header is the client's to forge.
    let id = save_from(&srv, &t, "forged", Some("203.0.113.66")).await;
    let (status, e) = get(&srv, &format!("caches/{id}")).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(
        e["written_by"],
        json!({"kind": "hs256", "issuer": "", "subject": "repo:o/r:ref:refs/heads/main",
               "run_id": "7345", "job_id": "12", "address": "127.0.0.1"})
    );
    // One Put Blob: the digest is the SHA-256 of the bytes.
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"payload"));
    assert_eq!(e["digest"], format!("sha256:{sha}"));

    // A caller's text is kept clipped, whatever it sends.
    let long = "x".repeat(5000);
    let t = run_token("8101", &long, &long, "1");
    let id = save_from(&srv, &t, "long", None).await;
    let (_, e) = get(&srv, &format!("caches/{id}")).await;
    assert_eq!(e["written_by"]["subject"].as_str().unwrap().len(), 255);
    assert_eq!(e["written_by"]["run_id"].as_str().unwrap().len(), 255);
    srv.stop().await;
}

#[tokio::test]
async fn a_trusted_proxys_forwarded_for_names_the_client() {
    let srv = TestServer::start_with(&[
        "--admin-token",
        ADMIN,
        "--trusted-proxies",
        "127.0.0.0/8,10.0.0.0/8",
    ])
    .await;
    let t = run_token("8102", "s", "1", "2");
    // The client forged the first hop; the trusted proxies appended the rest.
    let id = save_from(&srv, &t, "proxied", Some("6.6.6.6, 198.51.100.4, 10.0.0.9")).await;
    let (_, e) = get(&srv, &format!("caches/{id}")).await;
    assert_eq!(e["written_by"]["address"], "198.51.100.4", "{e}");
    srv.stop().await;
}

#[tokio::test]
async fn bad_trusted_proxies_refuse_start_up_with_a_sentence() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hoard"))
        .args(["serve", "--trusted-proxies", "10.0.0.0/8,proxy.local"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"proxy.local\" is neither an IP address nor a network"),
        "{err}"
    );
}

#[tokio::test]
async fn purges_select_by_writer_and_a_dry_run_deletes_nothing() {
    let srv = start().await;
    let (run_a, run_b) = (
        run_token("8103", "repo:o/r:pull_request", "run-a", "1"),
        run_token("8103", "repo:o/r:ref:refs/heads/main", "run-b", "1"),
    );
    let a1 = save_from(&srv, &run_a, "a1", None).await;
    let a2 = save_from(&srv, &run_a, "a2", None).await;
    let b1 = save_from(&srv, &run_b, "b1", None).await;

    // Filters list what a purge would select.
    let (_, by_subject) = get(&srv, "caches?subject=repo:o/r:pull_request").await;
    assert_eq!(by_subject["total_count"], 2, "{by_subject}");
    let (_, by_kind) = get(&srv, "caches?repository=8103&kind=hs256").await;
    assert_eq!(by_kind["total_count"], 3, "{by_kind}");
    let (_, future) = get(
        &srv,
        "caches?repository=8103&written_after=2999-01-01T00:00:00Z",
    )
    .await;
    assert_eq!(future["total_count"], 0, "{future}");
    let (_, scoped) = get(
        &srv,
        &format!("caches?repository=8103&scope={MAIN}&run_id=run-b"),
    )
    .await;
    assert_eq!(keys(&scoped), ["b1"]);

    let (status, dry) = delete(&srv, "caches?run_id=run-a&dry_run=true").await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(
        dry,
        json!({"deleted": 2, "dry_run": true, "ids": [a1, a2], "ids_truncated": false, "size_in_bytes": 14})
    );
    for key in ["a1", "a2", "b1"] {
        assert!(
            srv.restore(&run_a, key, VERSION).await.is_some(),
            "{key} after a dry run"
        );
    }
    let (_, purged) = delete(&srv, "caches?run_id=run-a").await;
    assert_eq!(
        purged,
        json!({"deleted": 2, "dry_run": false, "ids": [a1, a2], "ids_truncated": false, "size_in_bytes": 14})
    );
    assert!(srv.restore(&run_a, "a1", VERSION).await.is_none());
    assert!(srv.restore(&run_a, "a2", VERSION).await.is_none());
    assert_eq!(
        srv.restore(&run_b, "b1", VERSION).await.unwrap(),
        b"payload"
    );
    let (_, left) = get(&srv, "caches?repository=8103").await;
    assert_eq!(left["actions_caches"][0]["id"], b1);

    // Bad writer filters are refused with a sentence, and nothing is deleted.
    for (query, says) in [
        ("kind=token", "is no caller kind"),
        ("written_after=yesterday", "RFC 3339"),
        (
            "written_after=2026-01-02T00:00:00Z&written_before=2026-01-01T00:00:00Z",
            "earlier than",
        ),
        (
            "run_id=run-b&dry_run=perhaps",
            "dry_run must be true or false",
        ),
    ] {
        let (status, body) = delete(&srv, &format!("caches?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains(says),
            "{query}: {body}"
        );
    }
    assert!(srv.restore(&run_b, "b1", VERSION).await.is_some());
    srv.stop().await;
}

/// A misspelt parameter beside a real filter is refused (400, naming it) on every endpoint,
/// and so is a parameter given twice; a purge with one deletes nothing (issue #43).
#[tokio::test]
async fn unknown_or_repeated_query_parameters_are_refused_on_every_endpoint() {
    let srv = start().await;
    let run_a = run_token("8104", "repo:o/r:ref:refs/heads/main", "run-a", "1");
    let run_b = run_token("8104", "repo:o/r:ref:refs/heads/main", "run-b", "1");
    let a = save_from(&srv, &run_a, "a", None).await;
    save_from(&srv, &run_b, "b", None).await;

    let endpoints = [
        (reqwest::Method::GET, "status?verbose=1".to_owned()),
        (reqwest::Method::GET, "policy?verbose=1".to_owned()),
        (
            reqwest::Method::GET,
            "usage?repository=8104&limits=5".to_owned(),
        ),
        (
            reqwest::Method::GET,
            "stats?since=24h&familly=npm".to_owned(),
        ),
        (
            reqwest::Method::GET,
            "stats/families?since=24h&limt=5".to_owned(),
        ),
        (
            reqwest::Method::GET,
            "caches?repository=8104&runid=run-a".to_owned(),
        ),
        (reqwest::Method::GET, format!("caches/{a}?fields=all")),
        (
            reqwest::Method::DELETE,
            "caches?repository=8104&runid=run-a&dry_run=true".to_owned(),
        ),
        (
            reqwest::Method::DELETE,
            "caches?repository=8104&run-id=run-a".to_owned(),
        ),
        (
            reqwest::Method::DELETE,
            "caches?repository=8104&runId=run-a".to_owned(),
        ),
        (
            reqwest::Method::DELETE,
            "caches?repository=8104&keys=a".to_owned(),
        ),
        (reqwest::Method::DELETE, format!("caches/{a}?dryrun=true")),
    ];
    for (method, path) in endpoints {
        let (status, body) = admin(&srv, method.clone(), &path).await;
        assert_eq!(status, 400, "{method} {path}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains("unknown query parameter"),
            "{path}: {message}"
        );
    }
    for path in [
        "caches?run_id=run-a&run_id=run-b",
        "caches?repository=8104&dry_run=true&dry_run=false",
    ] {
        let (status, body) = delete(&srv, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains("more than once"),
            "{body}"
        );
    }
    // Nothing was deleted by any of them; the well-formed purge still works.
    let (_, left) = get(&srv, "caches?repository=8104").await;
    assert_eq!(left["total_count"], 2, "{left}");
    let (status, purged) = delete(&srv, "caches?repository=8104&run_id=run-a").await;
    assert_eq!(
        (status, purged["deleted"].as_u64()),
        (200, Some(1)),
        "{purged}"
    );
    srv.stop().await;
}

/// A purge by writer also ends that writer's uploads still open, and its dry run counts them:
/// what the purged run staged cannot become an entry after the purge (issue #43).
#[tokio::test]
async fn a_purge_by_writer_ends_its_open_uploads_and_the_dry_run_counts_them() {
    let srv = start().await;
    let run_a = run_token("8105", "repo:o/r:ref:refs/heads/main", "run-a", "1");
    let run_b = run_token("8105", "repo:o/r:ref:refs/heads/main", "run-b", "1");
    save_from(&srv, &run_a, "saved", None).await;
    // Run a has one upload staged and not finalized; run b another.
    let mut urls = Vec::new();
    for (token, key) in [(&run_a, "staged-a"), (&run_b, "staged-b")] {
        let (status, body) = srv
            .twirp(
                "CreateCacheEntry",
                token,
                json!({"key": key, "version": VERSION}),
            )
            .await;
        assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
        let url = body["signed_upload_url"].as_str().unwrap().to_owned();
        assert_eq!(srv.put_blob(&url, b"payload".to_vec()).await.status(), 201);
        urls.push(url);
    }

    let (status, dry) = delete(&srv, "caches?repository=8105&run_id=run-a&dry_run=true").await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(
        (dry["deleted"].as_u64(), dry["uploads_aborted"].as_u64()),
        (Some(1), Some(1)),
        "{dry}"
    );
    // The dry run ended nothing: run a could still finalize here.
    let (status, purged) = delete(&srv, "caches?repository=8105&run_id=run-a").await;
    assert_eq!(status, 200, "{purged}");
    assert_eq!(
        (
            purged["deleted"].as_u64(),
            purged["uploads_aborted"].as_u64()
        ),
        (Some(1), Some(1)),
        "{purged}"
    );

    // Run a's staged upload is gone; run b's finalizes as ever.
    let (status, body) = srv.finalize(&run_a, "staged-a", VERSION, 7).await;
    assert!(
        status != 200 || body["ok"] != json!(true),
        "{status} {body}"
    );
    assert!(srv.restore(&run_a, "staged-a", VERSION).await.is_none());
    let (status, body) = srv.finalize(&run_b, "staged-b", VERSION, 7).await;
    assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
    // A purge that selects no open upload answers as before, without the field.
    let (_, none) = delete(&srv, "caches?repository=8105&run_id=run-b&dry_run=true").await;
    assert!(none.get("uploads_aborted").is_none(), "{none}");
    srv.stop().await;
}

/// The first hour of an incident: which jobs restored what a run wrote (also after the purge),
/// the entry's readers, a dry run that names them, and the same archive found by its digest.
#[tokio::test]
async fn the_blast_radius_names_the_jobs_that_restored_a_writers_entries() {
    let srv = start().await;
    let poisoner = run_token("8110", "repo:o/r:pull_request", "poison", "1");
    let clean = run_token("8110", "repo:o/r:ref:refs/heads/main", "clean", "1");
    let release = run_token("8110", "repo:o/r:ref:refs/tags/v1", "rel", "publish");
    let nightly = run_token("8110", "repo:o/r:ref:refs/heads/main", "nightly", "test");
    let p1 = save_from(&srv, &poisoner, "p1", None).await;
    let p2 = save_from(&srv, &poisoner, "p2", None).await;
    save_from(&srv, &clean, "c1", None).await;
    for (token, key) in [
        (&release, "p1"),
        (&release, "p1"),
        (&release, "c1"),
        (&nightly, "p2"),
    ] {
        assert!(srv.restore(token, key, VERSION).await.is_some(), "{key}");
    }

    let (status, radius) = get(&srv, "restores?run_id=poison").await;
    assert_eq!(status, 200, "{radius}");
    let jobs: Vec<(&str, &str, u64, u64)> = radius["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["run_id"].as_str().unwrap(),
                j["job_id"].as_str().unwrap(),
                j["entries"].as_u64().unwrap(),
                j["restores"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        jobs,
        [("nightly", "test", 1, 1), ("rel", "publish", 1, 2)],
        "exactly the runs that restored the poisoned entries, latest first: {radius}"
    );
    assert_eq!(radius["truncated"], false);
    let record = &radius["restores"][1];
    assert_eq!(
        (
            record["entry_id"].as_i64(),
            record["key"].as_str(),
            record["count"].as_u64()
        ),
        (Some(p1), Some("p1"), Some(2)),
        "{radius}"
    );
    assert_eq!(record["written_by"]["run_id"], "poison");
    assert_eq!(record["reader"]["subject"], "repo:o/r:ref:refs/tags/v1");
    assert_eq!(record["reader"]["address"], "127.0.0.1");

    let (_, entry) = get(&srv, &format!("caches/{p1}")).await;
    let readers = entry["restored_by"].as_array().unwrap();
    assert_eq!(readers.len(), 1, "{entry}");
    assert_eq!(
        (
            readers[0]["reader"]["run_id"].as_str(),
            readers[0]["count"].as_u64()
        ),
        (Some("rel"), Some(2))
    );
    assert_eq!(entry["hits"], 2);

    let (_, dry) = delete(&srv, "caches?run_id=poison&dry_run=true").await;
    assert_eq!(dry["ids"], json!([p1, p2]));
    let dry_runs: Vec<&str> = dry["restored_by"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        dry_runs,
        ["nightly", "rel"],
        "a dry run names who restored them: {dry}"
    );

    // The same bytes, found by their digest under every key that holds them (all three
    // entries hold "payload"); other bytes are not.
    let digest = entry["digest"].as_str().unwrap().to_owned();
    let (_, same) = get(
        &srv,
        &format!("caches?digest={digest}&sort=created_at&direction=asc"),
    )
    .await;
    assert_eq!(keys(&same), ["p1", "p2", "c1"], "{same}");
    let other = format!("sha256:{}", "0".repeat(64));
    let (_, none) = get(&srv, &format!("caches?digest={other}")).await;
    assert_eq!(none["total_count"], 0, "{none}");

    let (_, purged) = delete(&srv, "caches?run_id=poison").await;
    assert_eq!(purged["deleted"], 2);
    assert!(
        purged.get("restored_by").is_none(),
        "only a dry run names them: {purged}"
    );
    let (_, after) = get(&srv, "restores?run_id=poison").await;
    assert_eq!(after["jobs"], radius["jobs"], "records outlive the purge");

    for bad in [
        "restores?key=p",
        "restores?digest=sha256:00",
        "restores?per_page=0",
    ] {
        let (status, e) = get(&srv, bad).await;
        assert_eq!(status, 400, "{bad}: {e}");
    }
}

#[tokio::test]
async fn a_promotion_makes_a_queues_entries_readable_in_main_without_a_byte_copied() {
    const QUEUE: &str = "refs/heads/gh-readonly-queue/main/pr-104-abc";
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    // octo/frozen's main is read-only: nothing is promoted into it.
    std::fs::write(
        &policy,
        "[[rule]]\nrepository = \"octo/frozen\"\nscope = \"refs/heads/main\"\naccess = \"read-only\"\n",
    )
    .unwrap();
    let srv = TestServer::start_with(&[
        "--admin-token",
        ADMIN,
        "--policy-file",
        policy.to_str().unwrap(),
        "--metrics-families",
        "10",
    ])
    .await;
    let queue = token_of("77", "octo/q", QUEUE);
    let main = token_of("77", "octo/q", MAIN);
    let saved = [
        ("npm-linux-1", b"npm bytes".to_vec()),
        ("npm-linux-2", b"newer npm bytes".to_vec()),
        ("go-build-1", vec![7u8; 300_000]),
    ];
    for (key, data) in &saved {
        srv.save(&queue, key, VERSION, data).await;
    }
    assert_eq!(srv.restore(&main, "npm-linux-1", VERSION).await, None);
    let files = srv.chunk_files().len();

    let promote = |query: String| {
        let srv = &srv;
        async move { admin(srv, reqwest::Method::POST, &format!("promotions?{query}")).await }
    };
    let from_queue = format!("repository=octo/q&from_ref={QUEUE}&to_ref={MAIN}");
    let (status, dry) = promote(format!("{from_queue}&dry_run=true")).await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["promoted"].as_array().unwrap().len(), 3, "{dry}");
    assert!(dry["promoted"][0]["id"].is_null(), "{dry}");
    assert_eq!(
        srv.restore(&main, "npm-linux-1", VERSION).await,
        None,
        "a dry run changes nothing"
    );

    let (status, done) = promote(from_queue.clone()).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["promoted"].as_array().unwrap().len(), 3, "{done}");
    assert_eq!(
        (done["present"].as_u64(), done["refused"].as_u64()),
        (Some(0), Some(0))
    );
    let by = done["promoted_by"].as_str().unwrap().to_owned();
    assert!(by.starts_with("admin:"), "{by}");
    for (key, data) in &saved {
        assert_eq!(
            srv.restore(&main, key, VERSION).await.as_deref(),
            Some(&data[..]),
            "{key}: main restores the queue's bytes"
        );
    }
    let (status, hit) = srv
        .lookup(&main, "npm-linux-9", &["npm-linux-"], VERSION)
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        hit["matched_key"], "npm-linux-2",
        "the newest by restore key: {hit}"
    );
    assert_eq!(srv.chunk_files().len(), files, "no byte copied");
    // What promotion saved: the hits its entries served (three exact, one by a restore key),
    // in the statistics and in /metrics.
    let (_, stats) = get(&srv, "stats?repository=octo/q").await;
    assert_eq!(stats["totals"]["promoted_hits"], 4, "{stats}");
    assert_eq!(stats["totals"]["exact_hits"], 3, "{stats}");
    let metrics = common::metrics_text(&srv.http, &srv.base).await;
    assert!(metrics.contains("hoard_promoted_hits_total 4"), "{metrics}");
    // And per key family: every promoted hit in its family's series, by outcome.
    let per_family: Vec<(&str, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with("hoard_family_promoted_hits_total{"))
        .map(|l| {
            let (labels, value) = l.rsplit_once(' ').unwrap();
            (labels, value.parse::<f64>().unwrap())
        })
        .collect();
    assert_eq!(
        per_family.iter().map(|(_, n)| n).sum::<f64>(),
        4.0,
        "{per_family:?}"
    );
    assert!(
        per_family
            .iter()
            .all(|(labels, _)| labels.contains("repository=\"octo/q\"")),
        "{per_family:?}"
    );
    assert!(
        per_family
            .iter()
            .any(|(labels, n)| labels.contains("outcome=\"restore_key_hit\"") && *n == 1.0),
        "{per_family:?}"
    );

    // Listed with where they came from; one promotion by its id.
    let (_, listed) = get(&srv, &format!("caches?promoted_by={by}&sort=created_at")).await;
    assert_eq!(listed["total_count"], 3, "{listed}");
    let first = &listed["actions_caches"][0];
    assert_eq!(first["ref"], MAIN);
    assert_eq!(first["promoted"]["from_ref"], QUEUE, "{first}");
    assert_eq!(first["promoted"]["by"], by.as_str());
    assert_eq!(
        first["written_by"]["subject"]
            .as_str()
            .map(|s| !s.is_empty()),
        Some(true),
        "the writer stays the writer: {first}"
    );

    // Entries are immutable: promoting again finds them present.
    let (_, again) = promote(from_queue.clone()).await;
    assert_eq!(again["present"], 3, "{again}");
    assert_eq!(again["promoted"].as_array().unwrap().len(), 0);

    // Undone by its id: main misses again, the queue's entries and bytes stay.
    let (status, undone) = delete(&srv, &format!("caches?promoted_by={by}")).await;
    assert_eq!(
        (status, undone["deleted"].as_u64()),
        (200, Some(3)),
        "{undone}"
    );
    assert_eq!(srv.restore(&main, "npm-linux-1", VERSION).await, None);
    for (key, data) in &saved {
        assert_eq!(
            srv.restore(&queue, key, VERSION).await.as_deref(),
            Some(&data[..])
        );
    }

    // A frozen main promotes nothing; bad requests are refused in words.
    let frozen_queue = token_of("78", "octo/frozen", QUEUE);
    srv.save(&frozen_queue, "k", VERSION, b"x").await;
    let (status, refused) = promote(format!(
        "repository=octo/frozen&from_ref={QUEUE}&to_ref={MAIN}"
    ))
    .await;
    assert_eq!(status, 200, "{refused}");
    assert_eq!(
        (
            refused["refused"].as_u64(),
            refused["promoted"].as_array().map(Vec::len)
        ),
        (Some(1), Some(0)),
        "{refused}"
    );
    for (bad, expected) in [
        (
            format!("repository=octo/q&from_ref={MAIN}&to_ref={MAIN}"),
            400,
        ),
        (format!("repository=octo/q&to_ref={MAIN}"), 400),
        (
            format!("repository=octo/none&from_ref={QUEUE}&to_ref={MAIN}"),
            404,
        ),
        (format!("{from_queue}&force=yes"), 400),
    ] {
        let (status, e) = promote(bad.clone()).await;
        assert_eq!(status, expected, "{bad}: {e}");
        assert!(e["message"].is_string(), "{e}");
    }
}

/// A build-tool object request (Nx's API) with `token`: its status and body.
async fn object(
    srv: &TestServer,
    method: reqwest::Method,
    hash: &str,
    token: &str,
    body: Option<&[u8]>,
) -> (u16, Vec<u8>) {
    let mut request = srv
        .http
        .request(method, srv.url(&format!("/v1/cache/{hash}")))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.body(body.to_vec());
    }
    let res = request.send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_for_developers_read_one_ref_of_one_repository_and_write_only_when_asked() {
    use reqwest::Method;
    let clock = common::manual_clock();
    let srv = TestServer::start_with_clock(&["--admin-token", ADMIN], clock.clone()).await;
    let main = token_of("10", "octo/alpha", MAIN);
    let pull = token_of("10", "octo/alpha", "refs/pull/3/merge");
    let other = token_of("20", "octo/beta", MAIN);
    for (token, hash, body) in [
        (&main, "aa01", b"main's".as_slice()),
        (&pull, "bb02", b"the pull request's"),
        (&other, "cc03", b"another repository's"),
    ] {
        assert_eq!(
            object(&srv, Method::PUT, hash, token, Some(body)).await.0,
            200
        );
    }

    // Read-only unless asked, main unless another ref is named.
    let (status, issued) = admin(
        &srv,
        Method::POST,
        "tokens?repository=octo%2Falpha&subject=alice",
    )
    .await;
    assert_eq!(status, 200, "{issued}");
    assert_eq!(issued["repository_id"], "10");
    assert_eq!(issued["repository"], "octo/alpha");
    assert_eq!(issued["read_refs"], json!([MAIN]));
    assert_eq!(issued["write_ref"], Value::Null);
    assert_eq!(issued["subject"], "developer:alice");
    let read = issued["token"].as_str().unwrap().to_owned();
    assert_eq!(
        object(&srv, Method::GET, "aa01", &read, None).await,
        (200, b"main's".to_vec())
    );
    // Not a pull request's objects, not another repository's; no writes.
    assert_eq!(object(&srv, Method::GET, "bb02", &read, None).await.0, 404);
    assert_eq!(object(&srv, Method::GET, "cc03", &read, None).await.0, 404);
    assert_eq!(
        object(&srv, Method::PUT, "dd04", &read, Some(b"x")).await.0,
        403
    );

    // With write=true it writes its ref, recorded as the developer's; for an hour if asked.
    let (status, issued) = admin(
        &srv,
        Method::POST,
        "tokens?repository=10&ref=refs%2Fheads%2Fmain&write=true&ttl=1h&subject=alice",
    )
    .await;
    assert_eq!(status, 200, "{issued}");
    assert_eq!(issued["write_ref"], MAIN);
    let write = issued["token"].as_str().unwrap().to_owned();
    assert_eq!(
        object(&srv, Method::PUT, "dd04", &write, Some(b"built here"))
            .await
            .0,
        200
    );
    assert_eq!(
        object(&srv, Method::GET, "dd04", &main, None).await,
        (200, b"built here".to_vec())
    );
    let (_, listing) = get(&srv, "caches?key=nx%2Fdd04").await;
    let entry = &listing["actions_caches"][0];
    assert_eq!(entry["written_by"]["kind"], "developer", "{listing}");
    assert_eq!(entry["written_by"]["subject"], "developer:alice");
    let (_, listing) = get(&srv, "caches?kind=developer").await;
    assert_eq!(keys(&listing), ["nx/dd04"]);

    // It expires; the 30-day one does not yet.
    clock.advance(std::time::Duration::from_secs(2 * 3600));
    assert_eq!(object(&srv, Method::GET, "dd04", &write, None).await.0, 401);
    assert_eq!(object(&srv, Method::GET, "dd04", &read, None).await.0, 200);
    clock.advance(std::time::Duration::from_secs(31 * 24 * 3600));
    assert_eq!(object(&srv, Method::GET, "aa01", &read, None).await.0, 401);

    // What cannot be issued is refused with a reason.
    for (path, status) in [
        ("tokens", 400),
        ("tokens?repository=octo%2Fnobody", 404),
        ("tokens?repository=10&ttl=400d", 400),
        ("tokens?repository=10&ttl=soon", 400),
        ("tokens?repository=10&ttl=500ms", 400),
        ("tokens?repository=10&ref=main", 400),
        ("tokens?repository=10&ref=refs%2Fheads%2Fa%0Ab", 400),
        ("tokens?repository=10&write=maybe", 400),
        ("tokens?repository=10&scope=refs%2Fheads%2Fmain", 400),
    ] {
        let (got, body) = admin(&srv, Method::POST, path).await;
        assert_eq!(got, status, "{path}: {body}");
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let (got, _) = get(&srv, "tokens").await;
    assert_eq!(got, 405);
}
