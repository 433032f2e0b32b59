//! `/metrics`: after a known sequence of saves, lookups, a download, a refused caller and an
//! eviction, the scraped counters and histogram counts have exactly the expected values, and the
//! whole output parses as Prometheus text.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::collections::HashMap;

use common::process::Hoard;
use common::{main_token, TestServer, VERSION};

const CREATE: &str = "/twirp/github.actions.results.api.v1.CacheService/CreateCacheEntry";
const FINALIZE: &str = "/twirp/github.actions.results.api.v1.CacheService/FinalizeCacheEntryUpload";
const LOOKUP: &str = "/twirp/github.actions.results.api.v1.CacheService/GetCacheEntryDownloadURL";

/// Scrapes `/metrics` and parses every sample: `name{labels}` → value. Panics on any line that
/// is not a comment, a sample or the final `# EOF`.
async fn scrape(srv: &TestServer) -> HashMap<String, f64> {
    let res = srv.http.get(srv.url("/metrics")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let content_type = res.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = res.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let mut samples = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            assert!(
                line.starts_with("# HELP ")
                    || line.starts_with("# TYPE ")
                    || line.starts_with("# UNIT ")
                    || line == "# EOF",
                "{line}"
            );
            continue;
        }
        let (name, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
        let bare = name.split('{').next().unwrap();
        assert!(
            bare.starts_with("hoard_")
                && bare.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "{line}"
        );
        samples.insert(name.to_owned(), value);
    }
    samples
}

fn value(samples: &HashMap<String, f64>, name: &str) -> f64 {
    *samples.get(name).unwrap_or_else(|| {
        panic!(
            "no sample {name} in {:#?}",
            samples.keys().collect::<Vec<_>>()
        )
    })
}

#[tokio::test]
async fn a_known_sequence_gives_exact_counts() {
    let srv = TestServer::start().await;
    let t = main_token();
    srv.save(&t, "deps-a", VERSION, &[1u8; 1000]).await;
    srv.save(&t, "deps-b", VERSION, &[2u8; 2000]).await;

    let (_, exact) = srv.lookup(&t, "deps-a", &[], VERSION).await;
    assert_eq!(exact["ok"], true);
    let (_, prefix) = srv.lookup(&t, "deps-", &[], VERSION).await;
    assert_eq!(prefix["matched_key"], "deps-b");
    let (_, restored) = srv.lookup(&t, "other", &["deps-a"], VERSION).await;
    assert_eq!(restored["matched_key"], "deps-a");
    let (_, miss) = srv.lookup(&t, "nothing", &[], VERSION).await;
    assert_eq!(miss["ok"], false);
    let body = srv
        .http
        .get(exact["signed_download_url"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(body.len(), 1000);
    let (status, _) = srv.lookup("not-a-token", "deps-a", &[], VERSION).await;
    assert_eq!(status, 401);

    let m = scrape(&srv).await;
    for (outcome, expected) in [
        ("exact_hit", 1.0),
        ("prefix_hit", 1.0),
        ("restore_key_hit", 1.0),
        ("miss", 1.0),
    ] {
        assert_eq!(
            value(&m, &format!("hoard_lookups_total{{outcome=\"{outcome}\"}}")),
            expected,
            "{outcome}"
        );
    }
    assert_eq!(value(&m, "hoard_uploaded_bytes_total"), 3000.0);
    assert_eq!(value(&m, "hoard_downloaded_bytes_total"), 1000.0);
    assert_eq!(value(&m, "hoard_stored_bytes"), 3000.0);
    assert_eq!(value(&m, "hoard_stored_entries"), 2.0);
    assert_eq!(value(&m, "hoard_open_uploads"), 0.0);
    assert_eq!(
        value(&m, "hoard_digests_pending"),
        0.0,
        "small entries need no pass"
    );
    // Database and storage operations are timed by operation.
    let database = |op: &str| {
        value(
            &m,
            &format!("hoard_database_operation_duration_seconds_count{{operation=\"{op}\"}}"),
        )
    };
    assert_eq!(database("create_upload"), 2.0);
    assert_eq!(database("finalize"), 2.0);
    assert_eq!(
        database("find_candidates"),
        4.0,
        "four lookups of different keys"
    );
    let storage = |op: &str| {
        value(
            &m,
            &format!("hoard_storage_operation_duration_seconds_count{{operation=\"{op}\"}}"),
        )
    };
    assert_eq!(storage("put"), 2.0);
    assert_eq!(storage("get"), 1.0);
    // Two saves (reserve and finalize each) and four lookups with the token; one refused.
    assert_eq!(
        value(&m, "hoard_caller_checks_total{outcome=\"token\"}"),
        8.0
    );
    assert_eq!(
        value(&m, "hoard_caller_checks_total{outcome=\"refused\"}"),
        1.0
    );
    let requests = |route: &str, status: &str| {
        value(
            &m,
            &format!("hoard_http_requests_total{{route=\"{route}\",status=\"{status}\"}}"),
        )
    };
    assert_eq!(requests(CREATE, "2xx"), 2.0);
    assert_eq!(requests(FINALIZE, "2xx"), 2.0);
    assert_eq!(requests(LOOKUP, "2xx"), 4.0);
    assert_eq!(requests(LOOKUP, "4xx"), 1.0);
    assert_eq!(requests("/_blob/uploads/{id}", "2xx"), 2.0);
    assert_eq!(requests("/_blob/entries/{id}", "2xx"), 1.0);
    assert_eq!(
        value(
            &m,
            &format!("hoard_http_request_duration_seconds_count{{route=\"{LOOKUP}\"}}")
        ),
        5.0
    );
    // The first scrape was counted once it was answered.
    let again = scrape(&srv).await;
    assert_eq!(
        value(
            &again,
            "hoard_http_requests_total{route=\"/metrics\",status=\"2xx\"}"
        ),
        1.0
    );
}

#[tokio::test]
async fn evictions_are_counted_by_cause() {
    let srv = TestServer::start_with(&["--repo-quota", "2500"]).await;
    let t = main_token();
    srv.save(&t, "old", VERSION, &[1u8; 1000]).await;
    srv.save(&t, "new", VERSION, &[2u8; 2000]).await;
    srv.reserve(&t, "being-saved", VERSION).await;
    let m = scrape(&srv).await;
    assert_eq!(
        value(&m, "hoard_entries_removed_total{cause=\"evicted\"}"),
        1.0
    );
    assert_eq!(value(&m, "hoard_stored_bytes"), 2000.0);
    assert_eq!(value(&m, "hoard_stored_entries"), 1.0);
    assert_eq!(value(&m, "hoard_open_uploads"), 1.0);
    assert!(!m.keys().any(|k| k.contains("cause=\"expired\"")));
}

#[tokio::test]
async fn metrics_can_be_served_on_their_own_address_only() {
    let data = tempfile::tempdir().unwrap();
    let server = Hoard::start_with(data.path(), &["--metrics-listen", "127.0.0.1:0"]);
    // The metrics address is logged just after the main one.
    let logged = || server.log.lock().unwrap().join("\n");
    assert!(
        common::eventually(std::time::Duration::from_secs(10), || {
            logged().contains("metrics on ")
        })
        .await,
        "the metrics address is logged: {}",
        logged()
    );
    let log = logged();
    let metrics_url = log
        .split("metrics on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the metrics address is logged: {log}"))
        .to_owned();
    let http = reqwest::Client::new();
    let own = http.get(&metrics_url).send().await.unwrap();
    assert_eq!(own.status(), 200);
    let text = own.text().await.unwrap();
    assert!(text.contains("hoard_uploaded_bytes_total"), "{text}");
    let main = http
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(main.status(), 404, "runners cannot read the metrics");
    let other = http
        .get(metrics_url.replace("/metrics", "/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        other.status(),
        404,
        "the metrics address serves nothing else"
    );
}

#[tokio::test]
async fn per_repository_lookups_are_capped() {
    let srv = TestServer::start_with(&["--metrics-repositories", "1"]).await;
    let mut named = common::claims("5", &[(common::MAIN, 3)]);
    named["repository"] = serde_json::json!("octo/named");
    let first = common::sign_hs256(&named);
    let second = common::token("6", &[(common::MAIN, 3)]);
    srv.save(&first, "k", VERSION, b"data").await;
    srv.lookup(&first, "k", &[], VERSION).await;
    srv.lookup(&first, "absent", &[], VERSION).await;
    srv.lookup(&second, "k", &[], VERSION).await;
    srv.lookup(&second, "other-absent", &[], VERSION).await;
    let m = scrape(&srv).await;
    let lookups = |repository: &str, outcome: &str| {
        value(
            &m,
            &format!(
                "hoard_repository_lookups_total{{repository=\"{repository}\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!(
        lookups("octo/named", "hit"),
        1.0,
        "named by the token's repository claim"
    );
    assert_eq!(lookups("octo/named", "miss"), 1.0);
    assert_eq!(
        lookups("other", "miss"),
        2.0,
        "past the cap, repositories are `other`"
    );
    assert!(!m.keys().any(|k| k.contains("repository=\"6\"")));

    // Off by default, and so are the lookups per key family.
    let plain = TestServer::start().await;
    let t = main_token();
    plain
        .save(&t, "deps-Linux-0123abcd4567", VERSION, b"data")
        .await;
    plain
        .lookup(&t, "deps-Linux-89abcdef0123", &["deps-Linux-"], VERSION)
        .await;
    plain.lookup(&t, "absent-0123abcd4567", &[], VERSION).await;
    let m = scrape(&plain).await;
    assert_eq!(
        value(&m, "hoard_lookups_total{outcome=\"restore_key_hit\"}"),
        1.0,
        "the lookups were counted"
    );
    assert!(!m
        .keys()
        .any(|k| k.contains("repository_lookups") || k.contains("family_lookups")));
}
