//! The dashboard in a real browser: the real `@actions/cache` client saves an entry, Debian's
//! chromium (driven by playwright-core, `tests/e2e/dashboard.mjs`) signs in, sees it on the
//! overview and in the entry browser, searches, deletes it with confirmation and sees it gone;
//! then the real client misses it. Screenshots of the overview and the entry browser are kept in
//! `target/tmp/dashboard/`.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::json;

use common::{claims, node_result, sign_hs256, TestServer, MAIN};

const ADMIN: &str = "dashboard-admin-token-0123456789";

fn e2e_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e")
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

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_finds_and_deletes_an_entry_in_the_dashboard() {
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "Debian's chromium is needed (apt-get install chromium; .ci/run installs it)"
    );
    let srv = TestServer::start_with(&["--admin-token", ADMIN]).await;
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

    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
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
    srv.stop().await;
}
