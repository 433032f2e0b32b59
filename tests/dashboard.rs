//! The dashboard in a real browser. The real `@actions/cache` client saves an entry, Debian's
//! chromium (driven by playwright-core, `tests/e2e/dashboard.mjs`) signs in, sees it on the
//! overview and in the entry browser, searches, deletes it with confirmation and sees it gone;
//! then the real client misses it. An hour later on the server's clock the client hits exactly,
//! hits by a restore key and misses in two repositories, and chromium (`tests/e2e/insight.mjs`)
//! reads the insight charts of the overview and of a repository page: their points and labels
//! are what that sequence makes and their numbers are the stats API's. Then an incident: a
//! poisoned run's entries, restored by a release job, are worked in chromium
//! (`tests/e2e/console.mjs`) from a link to the run's entries: a dry run that names the release
//! job, the entries' restore records, the blast radius, a deletion through a selection, then
//! quarantine, download, release and deletion for good. Screenshots are kept in `target/tmp/dashboard/` (overview.png, entries.png,
//! insight-overview.png, insight-repository.png, console-*.png).
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use common::{claims, manual_clock, node_result, sign_hs256, unix_now, TestServer, MAIN};
use hoard::model::Clock;

const ADMIN: &str = "dashboard-admin-token-0123456789";

fn e2e_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e")
}

fn shots_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard")
}

/// The real 6.3.0 client on cache service v2, run in `dir`.
fn client(server: &str, token: &str, dir: &Path, args: &[&str]) -> std::process::Output {
    assert!(
        e2e_dir().join("node_modules/@actions/cache").exists(),
        "the real client is not installed: run `npm ci --prefix tests/e2e` (scripts/test does)"
    );
    Command::new("node")
        .arg(e2e_dir().join("client.mjs"))
        .args(args)
        .current_dir(dir)
        .env("ACTIONS_RUNTIME_TOKEN", token)
        .env("RUNNER_TEMP", dir.join("runner-temp"))
        .env("GITHUB_WORKSPACE", dir)
        .env("ACTIONS_RESULTS_URL", format!("{server}/"))
        .env("ACTIONS_CACHE_SERVICE_V2", "true")
        .env_remove("ACTIONS_CACHE_URL")
        .env_remove("GITHUB_SERVER_URL")
        .env_remove("HOARD_E2E_CLIENT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}
/// One server and one sequence for every page: the entry browser's deletion is the eviction the
/// insight charts show, and the incident comes after what the charts count.
#[tokio::test(flavor = "multi_thread")]
async fn an_operator_deletes_an_entry_reads_the_insight_charts_and_works_an_incident() {
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "Debian's chromium is needed (apt-get install chromium; .ci/run installs it)"
    );
    let clock = manual_clock();
    let srv = TestServer::start_with_clock(&["--admin-token", ADMIN], clock.clone()).await;
    let first_hour = floor_hour(clock.now() / 1000);
    finds_and_deletes_an_entry(&srv).await;
    // The next hour on the server's clock: what follows falls in a bucket of its own.
    clock.advance(Duration::from_secs(3600));
    reads_the_insight_charts(&srv, first_hour).await;
    works_an_incident(&srv).await;
    srv.stop().await;
}

async fn finds_and_deletes_an_entry(srv: &TestServer) {
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("deps")).unwrap();
    std::fs::write(
        work.path().join("deps/lib.txt"),
        b"a dependency\n".repeat(1000),
    )
    .unwrap();
    let mut c = claims("4242", &[(MAIN, 3)]);
    c["repository"] = json!("octo/hello-world");
    c["scp"] = json!("Actions.Runner:7:8 Actions.Results:run-9911:job-12");
    let token = sign_hs256(&c);
    let key = "npm-linux-x64-5f2c9a";
    let base = srv.base.clone();

    let (saved, log) = {
        let (base, token, dir) = (base.clone(), token.clone(), work.path().to_owned());
        tokio::task::spawn_blocking(move || {
            node_result(client(&base, &token, &dir, &["save", key, "deps"]))
        })
        .await
        .unwrap()
    };
    assert!(saved.as_i64().unwrap() > 0, "{log}");

    let shots = shots_dir();
    let (seen, log) = {
        let (base, shots) = (base.clone(), shots.clone());
        tokio::task::spawn_blocking(move || {
            node_result(
                Command::new("node")
                    .arg(e2e_dir().join("dashboard.mjs"))
                    .env("HOARD_URL", &base)
                    .env("HOARD_ADMIN_TOKEN", ADMIN)
                    .env("EXPECT_KEY", key)
                    .env("SCREENSHOT_DIR", &shots)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .output()
                    .unwrap(),
            )
        })
        .await
        .unwrap()
    };
    assert_eq!(seen["signedIn"], true, "{log}");
    assert_eq!(seen["sawEntry"], true, "{log}");
    assert_eq!(
        seen["deletedId"], saved,
        "the entry the client saved: {log}"
    );
    let by = &seen["writtenBy"];
    assert_eq!(by["written-by"], "hs256", "{log}");
    assert_eq!(by["subject"], "repo:test/test:ref:refs/heads/main", "{log}");
    assert_eq!(
        (&by["run"], &by["job"]),
        (&json!("run-9911"), &json!("job-12")),
        "{log}"
    );
    assert_eq!(by["address"], "127.0.0.1", "{log}");
    assert!(
        by["digest"].as_str().unwrap().starts_with("sha256:"),
        "{log}"
    );
    assert_eq!(seen["rowsAfterDelete"], 0, "{log}");
    // The entry is the default branch's: its bytes are the branches', none are a PR's or tag's.
    let branches = seen["repoClasses"]["branches"].as_str().unwrap_or_default();
    assert!(
        branches.ends_with('B') && branches != "0 B",
        "branch bytes: {log}"
    );
    assert_eq!(seen["repoClasses"]["prsAndTags"], "0 B", "{log}");
    assert_eq!(seen["tokenInUrl"], false, "{log}");
    for shot in seen["screenshots"].as_array().unwrap() {
        let path = Path::new(shot.as_str().unwrap());
        assert!(
            std::fs::metadata(path).unwrap().len() > 10_000,
            "{}",
            path.display()
        );
        eprintln!("screenshot: {}", path.display());
    }

    // The deletion is a miss for the real client.
    let (restored, log) = {
        let (base, dir) = (base.clone(), work.path().to_owned());
        tokio::task::spawn_blocking(move || {
            std::fs::remove_dir_all(dir.join("deps")).unwrap();
            node_result(client(&base, &token, &dir, &["restore", key, "deps"]))
        })
        .await
        .unwrap()
    };
    assert_eq!(restored, serde_json::Value::Null, "{log}");
    assert!(!work.path().join("deps/lib.txt").exists());
}

const HELLO: &str = "octo/hello-world";
const NODE: &str = "node-cache-Linux-x64-npm-";
const CARGO: &str = "cargo-Linux-";
const PIP: &str = "pip-Linux-";
const PR_REF: &str = "refs/pull/7/merge";

fn floor_hour(unix: i64) -> i64 {
    unix - unix.rem_euclid(3600)
}

/// A bucket's start as the API writes it.
fn rfc3339(unix: i64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(unix as u64))
        .to_string()
}

/// A runtime token of `repository` (id, name) for `grants`, valid for hours: the server's clock
/// runs ahead of the machine's.
fn token_of(id: &str, name: &str, grants: &[(&str, u8)]) -> String {
    let mut c = claims(id, grants);
    c["repository"] = json!(name);
    c["exp"] = json!(unix_now() + 6 * 3600);
    sign_hs256(&c)
}

/// The real client in `dir` (created, with a file to save under `path`), off the async runtime.
async fn run_client(srv: &TestServer, token: &str, dir: &Path, args: &[&str]) -> (Value, String) {
    let (base, token, dir) = (srv.base.clone(), token.to_owned(), dir.to_owned());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        node_result(client(&base, &token, &dir, &args))
    })
    .await
    .unwrap()
}

async fn admin_get(srv: &TestServer, path: &str) -> Value {
    let res = srv
        .http
        .get(srv.url(&format!("/_hoard/api/v1/{path}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let status = res.status();
    let body: Value = res.json().await.unwrap();
    assert_eq!(status, 200, "{path}: {body}");
    body
}

fn num(v: &Value) -> f64 {
    match v {
        Value::String(s) => s.parse().unwrap_or_else(|_| panic!("not a number: {v}")),
        Value::Number(n) => n.as_f64().unwrap(),
        other => panic!("not a number: {other}"),
    }
}

fn points<'a>(view: &'a Value, chart: &str) -> &'a Vec<Value> {
    view["charts"][chart]["points"]
        .as_array()
        .unwrap_or_else(|| panic!("no chart {chart}"))
}

/// The time charts of `view` draw `stats`'s series point for point.
fn assert_time_charts_match(view: &Value, stats: &Value, what: &str) {
    let series = stats["series"].as_array().unwrap();
    for chart in ["chart-hit-ratio", "chart-lookups", "chart-evictions"] {
        let drawn = points(view, chart);
        assert_eq!(drawn.len(), series.len(), "{what}: {chart} points");
        for (p, s) in drawn.iter().zip(series) {
            assert_eq!(p["start"], s["start"], "{what}: {chart}");
        }
    }
    for (p, s) in points(view, "chart-lookups").iter().zip(series) {
        assert_eq!(num(&p["value"]), num(&s["lookups"]), "{what}: lookups {p}");
        assert_eq!(num(&p["exactHits"]), num(&s["exact_hits"]), "{what}: {p}");
        assert_eq!(
            num(&p["restoreKeyHits"]),
            num(&s["restore_key_hits"]),
            "{what}: {p}"
        );
        assert_eq!(num(&p["misses"]), num(&s["misses"]), "{what}: {p}");
    }
    for (p, s) in points(view, "chart-hit-ratio").iter().zip(series) {
        let lookups = num(&s["lookups"]);
        if lookups == 0.0 {
            assert_eq!(p["value"], "", "{what}: no ratio without lookups: {p}");
        } else {
            let hits = num(&s["exact_hits"]) + num(&s["restore_key_hits"]);
            assert!(
                (num(&p["value"]) - hits / lookups).abs() < 1e-9,
                "{what}: {p} {s}"
            );
        }
    }
    for (p, s) in points(view, "chart-evictions").iter().zip(series) {
        assert_eq!(num(&p["value"]), num(&s["evictions"]), "{what}: {p}");
        for cause in ["evicted", "expired", "quarantined", "deleted"] {
            assert_eq!(
                num(&p[cause]),
                num(&s["evictions_by_cause"][cause]),
                "{what}: {cause} {p}"
            );
        }
    }
}

/// The storage charts and the family table of `view` show `families`'s rows.
fn assert_family_charts_match(view: &Value, families: &Value, what: &str) {
    let rows = families["families"].as_array().unwrap();
    let mut by_class: BTreeMap<&str, f64> = BTreeMap::new();
    let mut by_family: BTreeMap<(String, String), f64> = BTreeMap::new();
    for r in rows {
        *by_class
            .entry(r["scope_class"].as_str().unwrap())
            .or_default() += num(&r["bytes_stored"]);
        let id = (
            r["repository"].to_string(),
            r["family"].as_str().unwrap().to_owned(),
        );
        *by_family.entry(id).or_default() += num(&r["bytes_stored"]);
    }
    let classes: Vec<(String, f64)> = points(view, "chart-stored-class")
        .iter()
        .map(|p| (p["label"].as_str().unwrap().to_owned(), num(&p["value"])))
        .collect();
    let want: Vec<(String, f64)> = ["default_branch", "other_branch", "pull_request", "tag"]
        .iter()
        .map(|c| (c.to_string(), by_class.get(c).copied().unwrap_or(0.0)))
        .collect();
    assert_eq!(classes, want, "{what}: stored by scope class");
    let mut drawn: Vec<(String, f64)> = points(view, "chart-stored-family")
        .iter()
        .map(|p| (p["label"].as_str().unwrap().to_owned(), num(&p["value"])))
        .collect();
    let mut want: Vec<(String, f64)> = by_family
        .into_iter()
        .filter(|(_, bytes)| *bytes > 0.0)
        .map(|((_, family), bytes)| (family, bytes))
        .collect();
    drawn.sort_by(|a, b| a.partial_cmp(b).unwrap());
    want.sort_by(|a, b| a.partial_cmp(b).unwrap());
    assert_eq!(drawn, want, "{what}: stored by family");

    let table = view["families"].as_array().unwrap();
    assert_eq!(table.len(), rows.len(), "{what}: family rows");
    for r in rows {
        let row = table
            .iter()
            .find(|t| {
                t["family"] == r["family"]
                    && t["scope_class"] == r["scope_class"]
                    && t["repository"]
                        == json!(r["repository"]
                            .as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| r["repository"].to_string()))
            })
            .unwrap_or_else(|| panic!("{what}: no row for {r} in {table:?}"));
        let v = &row["values"];
        for key in ["lookups", "misses", "bytes_stored", "entries"] {
            assert_eq!(num(&v[key]), num(&r[key]), "{what}: {key} of {r}");
        }
        let hits = num(&r["exact_hits"]) + num(&r["restore_key_hits"]);
        assert_eq!(num(&v["hits"]), hits, "{what}: hits of {r}");
        let trend: Vec<f64> = r["trend"]["lookups"]
            .as_array()
            .unwrap()
            .iter()
            .map(num)
            .collect();
        let spark: Vec<f64> = row["sparkline"]
            .as_array()
            .unwrap()
            .iter()
            .map(num)
            .collect();
        assert_eq!(spark, trend, "{what}: the sparkline of {r}");
    }
    // Most misses first, as the page opens.
    let misses: Vec<f64> = table.iter().map(|t| num(&t["values"]["misses"])).collect();
    assert!(
        misses.windows(2).all(|w| w[0] >= w[1]),
        "{what}: {misses:?}"
    );
}

/// A family row of the API, by family name and scope class.
fn family<'a>(families: &'a Value, name: &str, class: &str) -> &'a Value {
    families["families"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["family"] == name && f["scope_class"] == class)
        .unwrap_or_else(|| panic!("no family {name} ({class}) in {families}"))
}

fn counts(v: &Value) -> [u64; 6] {
    [
        "lookups",
        "exact_hits",
        "restore_key_hits",
        "misses",
        "saves",
        "evictions",
    ]
    .map(|k| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}")))
}

async fn reads_the_insight_charts(srv: &TestServer, first_hour: i64) {
    // A key's changing part, as a lockfile's digest would be.
    let hash = |n: u8| {
        let x = (u128::from(n) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834);
        format!("{x:032x}{:032x}", x.rotate_left(17))
    };
    let (node_a, node_b, cargo) = (
        format!("{NODE}{}", hash(1)),
        format!("{NODE}{}", hash(2)),
        format!("{CARGO}{}", hash(3)),
    );
    let (pip_a, pip_b) = (format!("{PIP}{}", hash(4)), format!("{PIP}{}", hash(5)));

    // octo/hello-world on its default branch: a save, an exact hit, a restore-key hit, a miss.
    let hello = token_of("4242", HELLO, &[(MAIN, 3)]);
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("hello");
    std::fs::create_dir_all(dir.join("node_modules")).unwrap();
    std::fs::write(
        dir.join("node_modules/a.js"),
        b"module.exports = 1;\n".repeat(500),
    )
    .unwrap();
    let (id, log) = run_client(srv, &hello, &dir, &["save", &node_a, "node_modules"]).await;
    assert!(id.as_i64().unwrap() > 0, "{log}");
    let (hit, log) = run_client(srv, &hello, &dir, &["restore", &node_a, "node_modules"]).await;
    assert_eq!(hit, json!(node_a), "exact hit: {log}");
    let restore_keys = ["--restore-keys", NODE];
    let args = [
        &["restore", node_b.as_str()][..],
        &restore_keys,
        &["node_modules"],
    ]
    .concat();
    let (hit, log) = run_client(srv, &hello, &dir, &args).await;
    assert_eq!(hit, json!(node_a), "restore-key hit: {log}");
    let (miss, log) = run_client(srv, &hello, &dir, &["restore", &cargo, "target"]).await;
    assert_eq!(miss, Value::Null, "miss: {log}");

    // octo/forked from a pull request: a save and a restore-key hit in its own scope.
    let fork = token_of("4343", "octo/forked", &[(PR_REF, 3), (MAIN, 1)]);
    let dir = work.path().join("fork");
    std::fs::create_dir_all(dir.join("venv")).unwrap();
    std::fs::write(dir.join("venv/site.py"), b"import os\n".repeat(300)).unwrap();
    let (id, log) = run_client(srv, &fork, &dir, &["save", &pip_a, "venv"]).await;
    assert!(id.as_i64().unwrap() > 0, "{log}");
    let args = ["restore", pip_b.as_str(), "--restore-keys", PIP, "venv"];
    let (hit, log) = run_client(srv, &fork, &dir, &args).await;
    assert_eq!(hit, json!(pip_a), "restore-key hit: {log}");

    // What the API says, and what the sequence makes of it. The first hour: the entry browser's
    // save, its deletion and the client's miss; this hour: the rest.
    let server = admin_get(srv, "stats?bucket=hour&since=24h").await;
    assert_eq!(counts(&server["totals"]), [5, 1, 2, 2, 3, 1], "{server}");
    assert_eq!(
        server["totals"]["evictions_by_cause"]["deleted"], 1,
        "{server}"
    );
    let series = server["series"].as_array().unwrap();
    assert_eq!(series.len(), 24, "{server}");
    assert_eq!(series[22]["start"], rfc3339(first_hour), "{server}");
    assert_eq!(
        counts(&series[22]),
        [1, 0, 0, 1, 1, 1],
        "the first hour: {server}"
    );
    assert_eq!(
        counts(&series[23]),
        [4, 1, 2, 1, 2, 0],
        "this hour: {server}"
    );
    let server_families = admin_get(srv, "stats/families?since=24h&sort=misses&limit=1000").await;
    let hello_stats = admin_get(
        srv,
        "stats?bucket=hour&since=24h&repository=octo/hello-world",
    )
    .await;
    assert_eq!(
        counts(&hello_stats["totals"]),
        [4, 1, 1, 2, 2, 1],
        "{hello_stats}"
    );
    let hello_families = admin_get(
        srv,
        "stats/families?since=24h&sort=misses&limit=1000&repository=octo/hello-world",
    )
    .await;
    let node = family(&hello_families, NODE, "default_branch");
    assert_eq!(counts(node), [2, 1, 1, 0, 1, 0], "{node}");
    assert!(node["bytes_stored"].as_u64().unwrap() > 0, "{node}");
    assert_eq!(node["entries"], 1, "{node}");
    assert_eq!(
        counts(family(&hello_families, CARGO, "default_branch")),
        [1, 0, 0, 1, 0, 0]
    );
    let pip = family(&server_families, PIP, "pull_request");
    assert_eq!(counts(pip), [1, 0, 1, 0, 1, 0], "{pip}");
    assert_eq!(pip["repository_name"], "octo/forked", "{pip}");
    assert!(
        hello_families["families"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["repository_name"] == HELLO),
        "{hello_families}"
    );

    // What chromium sees.
    let (seen, log) = {
        let (base, shots) = (srv.base.clone(), shots_dir());
        tokio::task::spawn_blocking(move || {
            node_result(
                Command::new("node")
                    .arg(e2e_dir().join("insight.mjs"))
                    .env("HOARD_URL", &base)
                    .env("HOARD_ADMIN_TOKEN", ADMIN)
                    .env("REPOSITORY", HELLO)
                    .env("SCREENSHOT_DIR", &shots)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .output()
                    .unwrap(),
            )
        })
        .await
        .unwrap()
    };
    let overview = &seen["overview"];
    assert_time_charts_match(overview, &server, "overview");
    assert_family_charts_match(overview, &server_families, "overview");
    // The points and labels of the sequence, as drawn: 24 hours, eight hour labels ending with
    // this hour, the four scope classes, the families that stored bytes.
    let lookups = points(overview, "chart-lookups");
    assert_eq!(
        (num(&lookups[22]["value"]), num(&lookups[23]["value"])),
        (1.0, 4.0),
        "{log}"
    );
    assert_eq!(
        num(&points(overview, "chart-evictions")[22]["deleted"]),
        1.0,
        "{log}"
    );
    let hour_labels = overview["charts"]["chart-lookups"]["labels"]
        .as_array()
        .unwrap();
    assert_eq!(hour_labels.len(), 8, "{hour_labels:?}");
    let this_hour = (first_hour + 3600) % 86_400 / 3600;
    assert_eq!(
        hour_labels[7],
        format!("{this_hour:02}:00"),
        "{hour_labels:?}"
    );
    assert_eq!(
        overview["charts"]["chart-stored-class"]["labels"],
        json!(["Default branch", "Other branches", "Pull requests", "Tags"])
    );
    let family_labels = overview["charts"]["chart-stored-family"]["labels"].to_string();
    for label in [format!("{NODE} · {HELLO}"), format!("{PIP} · octo/forked")] {
        assert!(family_labels.contains(&label), "{label} in {family_labels}");
    }
    let legend = overview["charts"]["chart-lookups"]["legend"].to_string();
    for text in ["Exact hits1", "Restore-key hits2", "Misses2"] {
        assert!(legend.contains(text), "{text} in {legend}");
    }
    assert!(
        overview["summary"]
            .as_str()
            .unwrap()
            .contains("5 lookups, 3 hits (60.0%), 2 misses"),
        "{}",
        overview["summary"]
    );
    // Every point's numbers are also text, in the chart's table.
    assert_eq!(
        overview["charts"]["chart-lookups"]["numberRows"]
            .as_array()
            .unwrap()
            .len(),
        24
    );

    // The family table sorts by its header buttons, from the mouse and the keyboard.
    let by_misses = &seen["missesAscending"];
    assert_eq!(by_misses["sort"]["Misses"], "ascending", "{log}");
    let misses: Vec<f64> = by_misses["families"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| num(&f["values"]["misses"]))
        .collect();
    assert!(misses.windows(2).all(|w| w[0] <= w[1]), "{misses:?}");
    let by_lookups = &seen["lookupsDescending"];
    assert_eq!(by_lookups["sort"]["Lookups"], "descending", "{log}");
    assert_eq!(by_lookups["sort"]["Misses"], "none", "{log}");
    let lookups: Vec<f64> = by_lookups["families"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| num(&f["values"]["lookups"]))
        .collect();
    assert!(lookups.windows(2).all(|w| w[0] >= w[1]), "{lookups:?}");
    assert_eq!(
        seen["focusedAfterSort"], "sort-lookups",
        "focus stays on the header"
    );

    // 7 and 30 days: daily points, the same totals.
    for (view, days) in [(&seen["week"], 7), (&seen["month"], 30)] {
        let stats = admin_get(srv, &format!("stats?bucket=day&since={days}d")).await;
        assert_time_charts_match(view, &stats, &format!("{days} days"));
        assert_eq!(points(view, "chart-lookups").len(), days, "{log}");
        let sum: f64 = points(view, "chart-lookups")
            .iter()
            .map(|p| num(&p["value"]))
            .sum();
        assert_eq!(sum, 5.0, "{days} days: {log}");
        let families = admin_get(
            srv,
            &format!("stats/families?since={days}d&sort=misses&limit=1000"),
        )
        .await;
        assert_family_charts_match(view, &families, &format!("{days} days"));
    }

    // The repository page: only octo/hello-world, and a way to its entries.
    let repository = &seen["repository"];
    assert_eq!(seen["repositoryName"], HELLO, "{log}");
    assert_time_charts_match(repository, &hello_stats, "repository");
    assert_family_charts_match(repository, &hello_families, "repository");
    assert_eq!(
        num(&points(repository, "chart-lookups")[23]["value"]),
        3.0,
        "{log}"
    );
    let family_labels = repository["charts"]["chart-stored-family"]["labels"].to_string();
    assert!(
        family_labels.contains(NODE) && !family_labels.contains(PIP),
        "{family_labels}"
    );
    assert_eq!(seen["numbersVisible"], true, "{log}");
    assert_eq!(seen["entriesFilter"], HELLO, "{log}");
    let queries = seen["statsQueries"].to_string();
    for q in [
        "stats?bucket=hour&since=24h",
        "stats?bucket=day&since=7d",
        "stats?bucket=day&since=30d",
        "stats?bucket=hour&since=24h&repository=octo%2Fhello-world",
    ] {
        assert!(queries.contains(q), "{q} in {queries}");
    }
    for shot in seen["screenshots"].as_array().unwrap() {
        let path = Path::new(shot.as_str().unwrap());
        assert!(
            std::fs::metadata(path).unwrap().len() > 10_000,
            "{}",
            path.display()
        );
        eprintln!("screenshot: {}", path.display());
    }
}

const INCIDENT: &str = "octo/incident";
const INCIDENT_ID: &str = "4545";
const POISON_RUN: &str = "run-poison";
const RELEASE_RUN: &str = "run-release";
const RELEASE_SUBJECT: &str = "repo:octo/incident:ref:refs/tags/v1";
/// A key is the client's text: the dashboard must show it, never run it.
const POISON_C: &str = "incident-poison-c<b id=\"xss\">";

/// A job's runtime token in octo/incident: its subject, `Actions.Results:<run>:<job>`, grants.
fn job_token(subject: &str, run: &str, job: &str, grants: &[(&str, u8)]) -> String {
    let mut c = claims(INCIDENT_ID, grants);
    c["repository"] = json!(INCIDENT);
    c["sub"] = json!(subject);
    c["scp"] = json!(format!("Actions.Runner:1:2 Actions.Results:{run}:{job}"));
    c["exp"] = json!(unix_now() + 6 * 3600);
    sign_hs256(&c)
}

/// The status and answer of an admin API GET.
async fn admin_try(srv: &TestServer, path: &str) -> (u16, Value) {
    let res = srv
        .http
        .get(srv.url(&format!("/_hoard/api/v1/{path}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

fn ids_of(list: &Value) -> Vec<i64> {
    list["actions_caches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect()
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|id| id.as_i64().unwrap())
        .collect()
}

/// A pull request's workflow that writes to the default branch (`pull_request_target`) saves
/// three entries; a clean run saves one; the release job restores one of the poisoned and the
/// clean one. The operator then works the incident in the dashboard.
async fn works_an_incident(srv: &TestServer) {
    let poisoner = job_token(
        "repo:octo/incident:pull_request",
        POISON_RUN,
        "build",
        &[(MAIN, 3)],
    );
    let clean = job_token(
        "repo:octo/incident:ref:refs/heads/main",
        "run-clean",
        "build",
        &[(MAIN, 3)],
    );
    let release = job_token(
        RELEASE_SUBJECT,
        RELEASE_RUN,
        "publish",
        &[("refs/tags/v1", 3), (MAIN, 1)],
    );
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("incident");
    std::fs::create_dir_all(dir.join("dist")).unwrap();
    let mut poisoned = Vec::new();
    for (token, key) in [
        (&poisoner, "incident-poison-a"),
        (&poisoner, "incident-poison-b"),
        (&poisoner, POISON_C),
        (&clean, "incident-clean"),
    ] {
        std::fs::write(dir.join("dist/out.js"), format!("// {key}\n").repeat(200)).unwrap();
        let (id, log) = run_client(srv, token, &dir, &["save", key, "dist"]).await;
        assert!(id.as_i64().unwrap_or(0) > 0, "{key}: {log}");
        poisoned.push(id.as_i64().unwrap());
    }
    let clean_id = poisoned.pop().unwrap();
    for key in ["incident-poison-a", "incident-clean"] {
        let (hit, log) = run_client(srv, &release, &dir, &["restore", key, "dist"]).await;
        assert_eq!(hit, json!(key), "{log}");
    }
    // Restores are written by the once-a-second bookkeeping: ask until they are.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let radius = loop {
        let radius = admin_get(srv, &format!("restores?run_id={POISON_RUN}")).await;
        if radius["jobs"].as_array().is_some_and(|j| !j.is_empty()) {
            break radius;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the release job's restore was never recorded: {radius}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let listed = admin_get(
        srv,
        &format!("caches?run_id={POISON_RUN}&sort=created_at&direction=asc"),
    )
    .await;
    assert_eq!(ids_of(&listed), poisoned, "{listed}");
    let poison_bytes: u64 = listed["actions_caches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["size_in_bytes"].as_u64().unwrap())
        .sum();
    let (a, b, c) = (poisoned[0], poisoned[1], poisoned[2]);
    let digest_a = listed["actions_caches"][0]["digest"]
        .as_str()
        .unwrap()
        .to_owned();

    let (status, answer) = admin_try(srv, "caches?state=quarantined").await;
    assert_eq!(status, 200, "GET caches?state=quarantined: {answer}");

    let (seen, log) = {
        let (base, shots) = (srv.base.clone(), shots_dir());
        let poison_ids = json!(poisoned).to_string();
        tokio::task::spawn_blocking(move || {
            node_result(
                Command::new("node")
                    .arg(e2e_dir().join("console.mjs"))
                    .env("HOARD_URL", &base)
                    .env("HOARD_ADMIN_TOKEN", ADMIN)
                    .env("POISON_RUN", POISON_RUN)
                    .env("POISON_IDS", poison_ids)
                    .env("DELETE_ID", b.to_string())
                    .env("RELEASE_ID", a.to_string())
                    .env("QUARANTINE", "1")
                    .env("SCREENSHOT_DIR", &shots)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .output()
                    .unwrap(),
            )
        })
        .await
        .unwrap()
    };

    // A link lists exactly the run's entries, in the order it names, and a reload keeps them.
    for view in [&seen["linked"], &seen["reloaded"]] {
        assert_eq!(ids(&view["ids"]), poisoned, "{log}");
        assert_eq!(view["total"], "3 entries", "{log}");
        let url = view["url"].as_str().unwrap();
        assert!(
            url.ends_with(&format!(
                "/_hoard/#entries?run_id={POISON_RUN}&sort=created_at&direction=asc"
            )),
            "{url}"
        );
    }
    assert_eq!(
        seen["keys"],
        json!(["incident-poison-a", "incident-poison-b", POISON_C]),
        "{log}"
    );
    assert_eq!(seen["markupRendered"], false, "{log}");
    let misspelt = &seen["misspelt"];
    assert_eq!(misspelt["rows"], 0, "{misspelt}");
    assert!(
        misspelt["error"].as_str().unwrap().contains("runid"),
        "{misspelt}"
    );
    assert_eq!(ids(&seen["alias"]["ids"]), poisoned, "#/caches?…: {log}");
    assert_eq!(
        seen["form"],
        json!({"run": POISON_RUN, "sort": "created_at", "direction": "asc", "state": "live"}),
        "{log}"
    );

    // The dry run of the whole filter: its count, bytes and the release job, before acting.
    let dry = &seen["filterDryRun"];
    assert!(
        dry["question"].as_str().unwrap().contains(POISON_RUN),
        "{dry}"
    );
    assert_eq!(
        (dry["count"].as_u64(), dry["bytes"].as_u64()),
        (Some(3), Some(poison_bytes)),
        "{dry}"
    );
    assert_eq!(dry["countText"], "3 entries", "{dry}");
    assert!(dry["sizeText"].as_str().unwrap().ends_with('B'), "{dry}");
    let jobs = dry["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "only the release job restored them: {dry}");
    assert_eq!(
        (&jobs[0]["run"], &jobs[0]["job"]),
        (&json!(RELEASE_RUN), &json!("publish")),
        "{dry}"
    );
    assert_eq!(
        jobs[0]["cells"],
        json!([
            "hs256",
            RELEASE_SUBJECT,
            RELEASE_RUN,
            "publish",
            "1",
            "1",
            jobs[0]["cells"][6]
        ]),
        "{dry}"
    );
    assert_eq!(dry["quarantineShown"], true, "{dry}");
    assert_eq!(
        ids(&seen["afterCancel"]),
        poisoned,
        "cancel removes nothing"
    );

    // The restored entry's details: who wrote it, and who restored it.
    let restored = &seen["restored"];
    assert_eq!(restored["facts"]["run"], POISON_RUN, "{restored}");
    assert_eq!(
        restored["facts"]["repository-id"], INCIDENT_ID,
        "{restored}"
    );
    assert_eq!(restored["facts"]["digest"], json!(digest_a), "{restored}");
    let records = restored["records"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{restored}");
    assert_eq!(
        (&records[0]["run"], &records[0]["job"]),
        (&json!(RELEASE_RUN), &json!("publish")),
        "{restored}"
    );
    let cells = &records[0]["cells"];
    assert_eq!(
        (&cells[0], &cells[1], &cells[4], &cells[5]),
        (
            &json!("hs256"),
            &json!(RELEASE_SUBJECT),
            &json!("127.0.0.1"),
            &json!("1")
        ),
        "{restored}"
    );

    // The blast radius: the API's jobs, complete.
    let blast = &seen["blastRadius"];
    assert_eq!(blast["truncated"], "false", "{blast}");
    assert_eq!(blast["truncatedShown"], false, "{blast}");
    assert!(
        blast["scope"].as_str().unwrap().contains(POISON_RUN),
        "{blast}"
    );
    let shown: Vec<(&str, &str)> = blast["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["run"].as_str().unwrap(), j["job"].as_str().unwrap()))
        .collect();
    let api_jobs: Vec<(&str, &str)> = radius["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["run_id"].as_str().unwrap(), j["job_id"].as_str().unwrap()))
        .collect();
    assert_eq!(shown, api_jobs, "{blast}");
    assert_eq!(shown, [(RELEASE_RUN, "publish")], "{blast}");
    assert_eq!(
        blast["records"].as_u64(),
        Some(radius["restores"].as_array().unwrap().len() as u64)
    );

    // One entry deleted through a selection: its own dry run, then gone from the page and the API.
    assert_eq!(seen["selectedCount"], "1 selected", "{log}");
    let one = &seen["selectionDryRun"];
    assert_eq!(
        (one["count"].as_u64(), &one["countText"]),
        (Some(1), &json!("1 entry")),
        "{one}"
    );
    assert_eq!(one["jobs"], json!([]), "nobody restored it: {one}");
    assert!(
        seen["deletedStatus"]
            .as_str()
            .unwrap()
            .starts_with("Deleted 1 entry ("),
        "{log}"
    );
    assert_eq!(ids(&seen["afterDelete"]["ids"]), [a, c], "{log}");
    assert_eq!(seen["afterDelete"]["total"], "2 entries", "{log}");
    let (status, gone) = admin_try(srv, &format!("caches/{b}")).await;
    assert_eq!(status, 404, "{gone}");

    let q = &seen["quarantined"];
    assert_eq!(q["dryRun"]["count"], 2, "{q}");
    assert!(
        q["quarantineStatus"]
            .as_str()
            .unwrap()
            .starts_with("Quarantined 2 entries"),
        "{q}"
    );
    assert_eq!(q["liveAfter"]["ids"], json!([]), "{q}");
    assert_eq!(q["liveAfter"]["total"], "0 entries", "{q}");
    assert_eq!(ids(&q["listed"]["ids"]), [a, c], "{q}");
    assert_eq!(q["listed"]["total"], "2 quarantined entries", "{q}");
    assert!(
        q["listed"]["url"]
            .as_str()
            .unwrap()
            .contains("state=quarantined"),
        "{q}"
    );
    let facts = &q["facts"]["facts"];
    assert_eq!(facts["state"], "quarantined", "{q}");
    for field in ["quarantined-at", "quarantine-reason", "quarantine-expires"] {
        let value = facts[field].as_str().unwrap_or("—");
        assert!(!value.is_empty() && value != "—", "{field}: {q}");
    }
    assert_eq!(
        q["facts"]["records"].as_array().map(Vec::len),
        Some(1),
        "the restore records stay with a quarantined entry: {q}"
    );
    assert_eq!(q["downloaded"]["sha256"], json!(digest_a), "{q}");
    assert!(
        q["releaseQuestion"]
            .as_str()
            .unwrap()
            .contains("incident-poison-a"),
        "{q}"
    );
    assert!(
        q["releaseStatus"].as_str().unwrap().starts_with("Released"),
        "{q}"
    );
    assert_eq!(ids(&q["afterRelease"]["ids"]), [c], "{q}");
    assert_eq!(q["forGood"]["deleteLabel"], "Delete for good", "{q}");
    assert_eq!(q["forGood"]["quarantineShown"], false, "{q}");
    assert!(
        q["forGoodStatus"]
            .as_str()
            .unwrap()
            .starts_with("Deleted 1 entry"),
        "{q}"
    );
    assert_eq!(q["afterForGood"]["ids"], json!([]), "{q}");
    assert_eq!(ids(&q["liveAgain"]["ids"]), [a], "{q}");
    // What the API says after it: a is live again, c is gone for good.
    let live = admin_get(srv, &format!("caches?run_id={POISON_RUN}")).await;
    assert_eq!(ids_of(&live), [a], "{live}");
    let (status, gone) = admin_try(srv, &format!("caches/{c}")).await;
    assert_eq!(status, 404, "{gone}");

    // The clean run's entry was never touched.
    let (status, kept) = admin_try(srv, &format!("caches/{clean_id}")).await;
    assert_eq!(status, 200, "{kept}");
    for shot in seen["screenshots"].as_array().unwrap() {
        let path = Path::new(shot.as_str().unwrap());
        assert!(
            std::fs::metadata(path).unwrap().len() > 10_000,
            "{}",
            path.display()
        );
        eprintln!("screenshot: {}", path.display());
    }
}
