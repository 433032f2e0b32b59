//! Statistics by key family through the admin API (`GET stats`, `GET stats/families`): a known
//! sequence of lookups and saves by the real `@actions/cache` client, an operator's deletion and
//! an expiry by the maintenance pass gives exactly the expected counts per family, class of refs
//! and hour, on SQLite, PostgreSQL and MariaDB; folding hours into days keeps the totals; the
//! per-repository cap on families holds against a client sending 10,000 of them;
//! `--metrics-families` caps its series.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use common::databases::{Server, TestDatabase};
use common::{json_of, node_result, poll, sign_hs256, TestServer, MAIN, VERSION};
use hoard::model::ManualClock;

const ADMIN: &str = "stats-admin-token-0123456789abcdef";
const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
const REPO: &str = "7001";
const PR: &str = "refs/pull/5/merge";

/// A runtime token of repository [`REPO`] with `grants`, valid whatever the test clock says.
fn token(grants: &[(&str, u8)], at: i64) -> String {
    let ac: Vec<Value> = grants
        .iter()
        .map(|(scope, perm)| json!({ "Scope": scope, "Permission": perm }))
        .collect();
    sign_hs256(&json!({
        "ac": serde_json::to_string(&ac).unwrap(),
        "repository_id": REPO,
        "repository": "octo/stats",
        "sub": "repo:octo/stats:ref:refs/heads/main",
        "scp": "Actions.Results:1:2",
        "nbf": at / 1000 - 3600,
        "exp": at / 1000 + 100 * 86_400,
    }))
}

fn e2e_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e")
}

/// The real 6.3.0 client on cache service v2, in `dir`: `save KEY PATH` or `restore KEY
/// [--restore-keys K] PATH`; returns what the call returned.
async fn client(srv: &TestServer, token: &str, dir: &Path, args: &[&str]) -> Value {
    assert!(
        e2e_dir().join("node_modules/@actions/cache").exists(),
        "the real client is not installed: run `npm ci --prefix tests/e2e` (scripts/test does)"
    );
    let mut command = std::process::Command::new("node");
    command
        .arg(e2e_dir().join("client.mjs"))
        .args(args)
        .current_dir(dir)
        .env("ACTIONS_RUNTIME_TOKEN", token)
        .env("RUNNER_TEMP", dir.join("runner-temp"))
        .env("GITHUB_WORKSPACE", dir)
        .env("ACTIONS_RESULTS_URL", format!("{}/", srv.base))
        .env("ACTIONS_CACHE_SERVICE_V2", "true")
        .env_remove("ACTIONS_CACHE_URL")
        .env_remove("GITHUB_SERVER_URL")
        .env_remove("HOARD_E2E_CLIENT");
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    node_result(output).0
}

async fn admin(srv: &TestServer, method: reqwest::Method, path: &str) -> Value {
    let res = srv
        .http
        .request(method, srv.url(&format!("/_hoard/api/v1/{path}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let (status, body) = json_of(res).await;
    assert_eq!(status, 200, "{path}: {body}");
    body
}

async fn get(srv: &TestServer, path: &str) -> Value {
    admin(srv, reqwest::Method::GET, path).await
}

/// `GET path` once `done` holds of its answer, or its last answer after 20 s: the maintenance
/// pass runs every second (`--gc-interval 1s`), so what it does shows within a few.
async fn after_a_pass(srv: &TestServer, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    poll(Duration::from_secs(20), async || get(srv, path).await, done).await
}

/// RFC 3339 (seconds) of `millis`, as the API spells bucket starts.
fn at(millis: i64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(millis as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The counters of a series point or family row, as `(lookups, exact, restore-key, misses,
/// bytes restored, saves, bytes saved, evictions)`.
fn counts(v: &Value) -> [u64; 8] {
    [
        "lookups",
        "exact_hits",
        "restore_key_hits",
        "misses",
        "bytes_restored",
        "saves",
        "bytes_saved",
        "evictions",
    ]
    .map(|name| v[name].as_u64().unwrap_or_else(|| panic!("{name} in {v}")))
}

/// The hourly points of one family and class from `since` for two hours.
async fn two_hours(srv: &TestServer, family: &str, class: &str, since: i64) -> Vec<[u64; 8]> {
    let stats = get(
        srv,
        &format!(
            "stats?repository=octo/stats&family={family}&scope_class={class}&bucket=hour&since={}&until={}",
            at(since),
            at(since + 2 * HOUR)
        ),
    )
    .await;
    let series = stats["series"].as_array().unwrap();
    assert_eq!(series.len(), 2, "one point per hour: {stats}");
    assert_eq!(series[0]["start"], at(since));
    assert_eq!(series[1]["start"], at(since + HOUR));
    series.iter().map(counts).collect()
}

/// The sequence: on the default branch a miss, its save, an exact hit; from a pull request a
/// restore-key hit of that entry and a save of its own; an hour later a miss of another family
/// and an operator deleting the pull request's entry; a month later the maintenance pass
/// expires the default branch's entry (unused for 7 days).
async fn known_sequence_gives_exact_counts(database: Option<&str>) {
    // 10:00 two days ago: the sequence's two hours fall in one day whenever the test runs, so
    // the day they are folded into holds them both.
    let start = hoard::model::Bucket::Day.floor(hoard::model::now_millis()) - 2 * DAY + 10 * HOUR;
    let h0 = start;
    let clock = Arc::new(ManualClock::starting_at(start + 30 * 60_000));
    let mut args = vec![
        "--admin-token",
        ADMIN,
        "--unused-ttl",
        "7d",
        "--gc-interval",
        "1s",
    ];
    if let Some(url) = database {
        args.extend(["--database-url", url]);
    }
    let srv = TestServer::start_with_clock(&args, clock.clone()).await;
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("deps")).unwrap();
    std::fs::write(
        work.path().join("deps/lib.txt"),
        b"dependency\n".repeat(5000),
    )
    .unwrap();
    let now = start + 30 * 60_000;
    let main = token(&[(MAIN, 3)], now);
    let pr = token(&[(PR, 3), (MAIN, 1)], now);
    let (k1, k2, k3) = (
        "deps-Linux-3f2a9c4be1d07f6a",
        "deps-Linux-9b8c7d6e5f4a3b2c",
        "tool-cache-0123456789abcdef",
    );
    let dir = work.path();
    let restore = |key: &'static str| ["restore", key, "--restore-keys", "deps-Linux-", "deps"];

    assert_eq!(
        client(&srv, &main, dir, &restore(k1)).await,
        Value::Null,
        "a miss"
    );
    assert!(
        client(&srv, &main, dir, &["save", k1, "deps"])
            .await
            .as_i64()
            .unwrap()
            > 0
    );
    assert_eq!(
        client(&srv, &main, dir, &restore(k1)).await,
        json!(k1),
        "an exact hit"
    );
    assert_eq!(
        client(&srv, &pr, dir, &restore(k2)).await,
        json!(k1),
        "a restore-key hit"
    );
    assert!(
        client(&srv, &pr, dir, &["save", k2, "deps"])
            .await
            .as_i64()
            .unwrap()
            > 0
    );

    clock.advance(Duration::from_millis(HOUR as u64));
    let main = token(&[(MAIN, 3)], now + HOUR);
    assert_eq!(
        client(&srv, &main, dir, &["restore", k3, "deps"]).await,
        Value::Null
    );
    let listing = get(&srv, "caches?repository=octo/stats").await;
    let size_of = |key: &str| {
        listing["actions_caches"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == key)
            .map(|e| {
                (
                    e["id"].as_i64().unwrap(),
                    e["size_in_bytes"].as_u64().unwrap(),
                )
            })
            .unwrap()
    };
    let ((_, s1), (pr_entry, s2)) = (size_of(k1), size_of(k2));
    admin(&srv, reqwest::Method::DELETE, &format!("caches/{pr_entry}")).await;

    assert_eq!(
        two_hours(&srv, "deps-Linux-", "default_branch", h0).await,
        [[2, 1, 0, 1, s1, 1, s1, 0], [0; 8]],
        "the default branch: a miss and an exact hit, one save"
    );
    assert_eq!(
        two_hours(&srv, "deps-Linux-", "pull_request", h0).await,
        [[1, 0, 1, 0, s1, 1, s2, 0], [0, 0, 0, 0, 0, 0, 0, 1]],
        "the pull request: a restore-key hit and a save, then its entry deleted"
    );
    assert_eq!(
        two_hours(&srv, "tool-cache-", "default_branch", h0).await,
        [[0; 8], [1, 0, 0, 1, 0, 0, 0, 0]],
        "another family, an hour later"
    );
    let deleted = get(
        &srv,
        &format!(
            "stats?repository={REPO}&scope_class=pull_request&since={}&until={}",
            at(h0),
            at(h0 + 2 * HOUR)
        ),
    )
    .await;
    assert_eq!(
        deleted["series"][1]["evictions_by_cause"]["deleted"], 1,
        "{deleted}"
    );
    assert_eq!(
        deleted["repository"], REPO,
        "named by owner/name or id alike"
    );

    // The whole server, per day: every count above.
    let day0 = h0 - h0 % DAY;
    let server = get(
        &srv,
        &format!(
            "stats?bucket=day&since={}&until={}",
            at(day0),
            at(day0 + 2 * DAY)
        ),
    )
    .await;
    assert_eq!(server["repository"], Value::Null);
    assert_eq!(
        counts(&server["totals"]),
        [4, 1, 1, 2, 2 * s1, 2, s1 + s2, 1],
        "{server}"
    );

    // The families, ranked by misses (then lookups).
    let families = get(
        &srv,
        &format!(
            "stats/families?repository=octo/stats&since={}&until={}",
            at(h0),
            at(h0 + 2 * HOUR)
        ),
    )
    .await;
    assert_eq!(families["bucket"], "hour");
    let rows: Vec<(&str, &str, u64, u64, u64)> = families["families"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["family"].as_str().unwrap(),
                f["scope_class"].as_str().unwrap(),
                f["misses"].as_u64().unwrap(),
                f["bytes_stored"].as_u64().unwrap(),
                f["entries"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("deps-Linux-", "default_branch", 1, s1, 1),
            ("tool-cache-", "default_branch", 1, 0, 0),
            ("deps-Linux-", "pull_request", 0, 0, 0),
        ],
        "{families}"
    );
    let first = &families["families"][0];
    assert_eq!(first["repository_name"], "octo/stats");
    assert_eq!(first["hit_ratio"], 0.5);
    assert_eq!(first["trend"]["lookups"], json!([2, 0]));
    assert_eq!(first["trend"]["misses"], json!([1, 0]));
    assert_eq!(families["stored_bytes"], s1);

    // A month later the maintenance pass folds those hours into their day; totals stay.
    clock.advance(Duration::from_millis((31 * DAY) as u64));
    let hourly = format!(
        "stats?repository={REPO}&bucket=hour&since={}&until={}",
        at(day0),
        at(day0 + 2 * DAY)
    );
    let seen = after_a_pass(&srv, &hourly, |s| s["series"][0]["lookups"] == 4).await;
    assert_eq!(
        seen["series"][0]["lookups"], 4,
        "the hours were folded into their day's first bucket: {seen}"
    );
    let after = get(
        &srv,
        &format!(
            "stats?bucket=day&since={}&until={}",
            at(day0),
            at(day0 + 2 * DAY)
        ),
    )
    .await;
    assert_eq!(
        after["totals"], server["totals"],
        "folding keeps every total"
    );

    // The same pass expired the default branch's entry, unused for a month: an eviction in
    // the hour it happened, in the entry's family and class.
    let month_later = hoard::model::Bucket::Hour.floor(hoard::model::Clock::now(&*clock));
    let expired_path = format!(
        "stats?repository={REPO}&family=deps-Linux-&scope_class=default_branch&bucket=hour&since={}&until={}",
        at(month_later),
        at(month_later + HOUR)
    );
    let expired = after_a_pass(&srv, &expired_path, |s| s["series"][0]["evictions"] != 0).await;
    assert_eq!(
        counts(&expired["series"][0]),
        [0, 0, 0, 0, 0, 0, 0, 1],
        "{expired}"
    );
    assert_eq!(
        expired["series"][0]["evictions_by_cause"]["expired"], 1,
        "{expired}"
    );
    assert_eq!(
        get(&srv, "caches?repository=octo/stats").await["total_count"],
        0,
        "both entries are gone"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/cache client (and PostgreSQL, MariaDB)"
)]
async fn a_known_sequence_counts_exactly_on_sqlite() {
    known_sequence_gives_exact_counts(None).await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/cache client (and PostgreSQL, MariaDB)"
)]
async fn a_known_sequence_counts_exactly_on_postgres() {
    let Some(db) = TestDatabase::create(Server::Postgres).await else {
        return;
    };
    known_sequence_gives_exact_counts(Some(&db.url)).await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/cache client (and PostgreSQL, MariaDB)"
)]
async fn a_known_sequence_counts_exactly_on_mariadb() {
    let Some(db) = TestDatabase::create(Server::MySql).await else {
        return;
    };
    known_sequence_gives_exact_counts(Some(&db.url)).await;
}

/// 10,000 lookups, each of its own family: at most `--stats-max-families` are kept, the rest
/// count as `other`, nothing is lost; `--metrics-families` caps the series the same way.
#[tokio::test(flavor = "multi_thread")]
async fn the_family_cap_holds_against_ten_thousand_families() {
    let srv = TestServer::start_with(&[
        "--admin-token",
        ADMIN,
        "--stats-max-families",
        "50",
        "--metrics-families",
        "3",
    ])
    .await;
    let tok = token(&[(MAIN, 3)], hoard::model::now_millis());
    let srv = &srv;
    futures_util::stream::iter(0..10_000)
        .map(|i| {
            let tok = tok.clone();
            async move {
                let (status, _) = srv
                    .lookup(
                        &tok,
                        &format!("family{i:05}-0123abcd4567ef89"),
                        &[],
                        VERSION,
                    )
                    .await;
                assert_eq!(status, 200);
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let families = get(srv, &format!("stats/families?repository={REPO}&limit=1000")).await;
    let rows = families["families"].as_array().unwrap();
    assert_eq!(rows.len(), 51, "50 families and `other`: {families}");
    let other = rows.iter().find(|f| f["family"] == "other").unwrap();
    assert_eq!(other["lookups"], 10_000 - 50);
    let total: u64 = rows.iter().map(|f| f["lookups"].as_u64().unwrap()).sum();
    assert_eq!(total, 10_000, "every lookup is counted");
    assert_eq!(
        common::table_rows(srv.data.path(), "stats_families"),
        50,
        "the store keeps exactly the cap"
    );

    let metrics = common::metrics_text(&srv.http, &srv.base).await;
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("hoard_family_lookups_total{"))
        .collect();
    assert_eq!(series.len(), 4, "three families and `other`: {series:?}");
    let sum: f64 = series
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(sum, 10_000.0);
    assert!(series.iter().any(|l| l.contains("family=\"other\"")));
}

/// Bad parameters are refused with a sentence; an unknown repository is a 404.
#[tokio::test]
async fn bad_statistics_queries_are_refused_clearly() {
    let srv = TestServer::start_with(&["--admin-token", ADMIN]).await;
    for id in ["8001", "8002"] {
        let mut claims = common::claims(id, &[("refs/heads/main", 3)]);
        claims["repository"] = json!("octo/twin");
        srv.save(&sign_hs256(&claims), "k", VERSION, b"twin").await;
    }
    for (query, status, says) in [
        ("stats?bucket=week", 400, "bucket must be hour or day"),
        (
            "stats?scope_class=feature",
            400,
            "scope_class must be one of",
        ),
        (
            "stats?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z",
            400,
            "since must be earlier",
        ),
        ("stats?since=3000d", 400, "at most 10000 points"),
        (
            "stats?since=yesterday",
            400,
            "since must be an RFC 3339 time",
        ),
        (
            "stats/families?sort=size",
            400,
            "sort must be misses, bytes or lookups",
        ),
        (
            "stats/families?limit=0",
            400,
            "limit must be from 1 to 1000",
        ),
        (
            "stats?repository=octo/none",
            404,
            "no repository \"octo/none\"",
        ),
        ("stats/families?repository=404", 404, "no repository"),
        // Two repositories share the name octo/twin (below): never a guess.
        (
            "stats?repository=octo/twin",
            409,
            "2 repositories are named \"octo/twin\"",
        ),
        (
            "stats/families?repository=octo/twin",
            409,
            "name one by its repository id",
        ),
    ] {
        let res = srv
            .http
            .get(srv.url(&format!("/_hoard/api/v1/{query}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let (got, body) = json_of(res).await;
        assert_eq!(got, status, "{query}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(says), "{query}: {message}");
    }
    // Defaults: 24 hourly points ending with the current hour, or 30 days.
    let res = srv
        .http
        .get(srv.url("/_hoard/api/v1/stats"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let (_, hourly) = json_of(res).await;
    assert_eq!(hourly["series"].as_array().unwrap().len(), 24, "{hourly}");
    let res = srv
        .http
        .get(srv.url("/_hoard/api/v1/stats?bucket=day"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let (_, daily) = json_of(res).await;
    assert_eq!(daily["series"].as_array().unwrap().len(), 30);
    srv.stop().await;
}

/// One statistics answer costs what it returns (issue #43): with 1,000 repositories × 3
/// families over 10,000 hours, answers within the ceiling of trend points come back whole and
/// the server's memory grows by less than 64 MiB; answers beyond it, and times near the
/// 64-bit limits, are refused with a sentence.
#[test]
fn family_answers_are_bounded_by_what_they_return() {
    use hoard::model::{Counters, RefClass, RepoId, StatsKey};

    let data = tempfile::tempdir().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let this_hour = now - now % HOUR;
    let rt = tokio::runtime::Runtime::new().unwrap();
    // 60,000 rows: 1,000 repositories × 3 families, each active in 20 hours spread over 10,000.
    rt.block_on(async {
        let url = hoard::meta::DatabaseUrl::Sqlite(data.path().join("hoard.db"));
        let store = hoard::meta::open(&url, 1).await.unwrap();
        for step in 0..20i64 {
            let hour = this_hour - (step * 499 + 1) * HOUR;
            let mut batch = Vec::new();
            for repo in 0..1000u64 {
                for (f, family) in ["npm-", "cargo-", "pip-"].into_iter().enumerate() {
                    let misses = repo % 97 + f as u64;
                    batch.push((
                        StatsKey {
                            repository: RepoId::new(format!("{}", 100_000 + repo)),
                            family: family.to_owned(),
                            class: RefClass::DefaultBranch,
                            hour,
                        },
                        Counters {
                            lookups: misses + 3,
                            exact_hits: 3,
                            misses,
                            ..Counters::default()
                        },
                    ));
                }
            }
            batch.sort_by(|a, b| (a.0.hour, &a.0.repository).cmp(&(b.0.hour, &b.0.repository)));
            store.record_stats(&batch).await.unwrap();
        }
    });

    let secret = common::secret_file(data.path());
    let hoard = common::process::Hoard::start_with(
        data.path(),
        &[
            "--admin-token",
            ADMIN,
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
        ],
    );
    let rss_before = hoard.peak_rss_kib();
    let get = |query: &str| {
        let url = format!("{}/_hoard/api/v1/stats/families?{query}", hoard.base);
        rt.block_on(async {
            let res = reqwest::Client::new()
                .get(url)
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap();
            json_of(res).await
        })
    };

    // Within the ceiling: 10 lines × 10,000 hours, the most misses first, each line whole.
    let (status, body) = get("bucket=hour&since=10000h&limit=10");
    assert_eq!(status, 200, "{body}");
    let families = body["families"].as_array().unwrap();
    assert_eq!(families.len(), 10);
    for line in families {
        assert_eq!(line["trend"]["misses"].as_array().unwrap().len(), 10_000);
        let summed: u64 = line["trend"]["misses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(summed, line["misses"].as_u64().unwrap(), "{line}");
    }
    // The most misses: repository 96 (and every 97th) of family pip- (96 + 2) × 20 hours.
    assert_eq!(families[0]["misses"], 98 * 20, "{}", families[0]);
    assert_eq!(families[0]["family"], "pip-");
    let (status, body) = get("bucket=day&since=3650d&limit=27");
    assert_eq!(status, 200, "{body}");
    let (status, body) = get("since=30d&limit=1000");
    assert_eq!(status, 200, "the dashboard's widest question: {body}");
    assert_eq!(body["families"].as_array().unwrap().len(), 1000);

    // Beyond it, or out of range: 400 with a sentence saying how to narrow it.
    for query in [
        "bucket=hour&since=10000h&limit=11",
        "bucket=hour&since=10000h&limit=1000",
        "bucket=day&since=3650d",
        "since=9223372036854775807&until=9223372036854775807",
        "until=-1",
        "since=0&until=9223372036854775",
        "since=99999999999h",
        "limit=0",
        "limit=1001",
    ] {
        let (status, body) = get(query);
        assert_eq!(status, 400, "{query}: {body}");
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{query}: {body}"
        );
    }
    let (_, body) = get("bucket=hour&since=10000h&limit=11");
    assert!(
        body["message"].as_str().unwrap().contains("fewer families"),
        "{body}"
    );

    let grown_mib = (hoard.peak_rss_kib() - rss_before) / 1024;
    assert!(
        grown_mib < 64,
        "the answers grew the server by {grown_mib} MiB"
    );
}
