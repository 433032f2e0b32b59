//! The real `@actions/cache` 6.3.0 client (npm) against the real `hoard` binary.
//!
//! Needs `npm ci --prefix tests/e2e` first (scripts/test does it), plus tar and zstd.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::databases::{Backend, Server};
use common::emulators;
use common::process::Hoard;
use common::{files_under, main_token, metric, random_bytes, token, MAIN, SERVICE};
use serde_json::Value;
use sha2::{Digest, Sha256};

const MIB: usize = 1 << 20;

/// Which real client speaks which protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// 6.3.0 with ACTIONS_CACHE_SERVICE_V2 on github.com.
    V2,
    /// 3.2.4, the last client before v2.
    V1With3,
    /// 6.3.0 forced onto v1 by a forge's GITHUB_SERVER_URL.
    V1With6,
}

/// One job's workspace: a directory with the files to cache and a RUNNER_TEMP.
struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("runner-temp")).unwrap();
        Self { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes `len` pseudo-random bytes to `rel` and returns their SHA-256.
    fn write_random(&self, rel: &str, len: usize, seed: u64) -> String {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let mut written = 0;
        let mut n = 0;
        while written < len {
            let piece = random_bytes((len - written).min(4 * MIB), seed * 1000 + n);
            file.write_all(&piece).unwrap();
            written += piece.len();
            n += 1;
        }
        file.flush().unwrap();
        drop(file);
        sha256_file(&path)
    }

    fn remove(&self, rel: &str) {
        let path = self.path(rel);
        if path.is_dir() {
            std::fs::remove_dir_all(path).unwrap();
        } else if path.exists() {
            std::fs::remove_file(path).unwrap();
        }
    }

    /// Spawns the real 6.3.0 client on v2: `node client.mjs ARGS…` with the job's environment.
    fn client(&self, server: &str, token: &str, args: &[&str]) -> Command {
        self.client_via(Via::V2, server, token, args)
    }

    /// Spawns a real client speaking `via`; for v1, `server` may end in a path prefix.
    fn client_via(&self, via: Via, server: &str, token: &str, args: &[&str]) -> Command {
        let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e");
        assert!(
            e2e.join("node_modules/@actions/cache").exists()
                && e2e.join("node_modules/actions-cache-3").exists(),
            "the real clients are not installed: run `npm ci --prefix tests/e2e` (scripts/test does)"
        );
        let mut cmd = Command::new("node");
        cmd.arg(e2e.join("client.mjs"))
            .args(args)
            .current_dir(self.dir.path())
            .env("ACTIONS_RUNTIME_TOKEN", token)
            .env("RUNNER_TEMP", self.path("runner-temp"))
            .env("GITHUB_WORKSPACE", self.dir.path())
            .env_remove("GITHUB_SERVER_URL")
            .env_remove("ACTIONS_CACHE_URL")
            .env_remove("ACTIONS_RESULTS_URL")
            .env_remove("ACTIONS_CACHE_SERVICE_V2")
            .env_remove("ACTIONS_CACHE_MODE")
            .env_remove("HOARD_E2E_CLIENT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match via {
            Via::V2 => {
                cmd.env("ACTIONS_RESULTS_URL", format!("{server}/"))
                    .env("ACTIONS_CACHE_SERVICE_V2", "true");
            }
            // 3.2.4 knows only v1.
            Via::V1With3 => {
                cmd.env("ACTIONS_CACHE_URL", format!("{server}/"))
                    .env("HOARD_E2E_CLIENT", "3");
            }
            // 6.3.0 on a forge or GHES: v1 whatever ACTIONS_CACHE_SERVICE_V2 says.
            Via::V1With6 => {
                cmd.env("ACTIONS_CACHE_URL", format!("{server}/"))
                    .env("ACTIONS_CACHE_SERVICE_V2", "true")
                    .env("GITHUB_SERVER_URL", "https://forge.example");
            }
        }
        cmd
    }

    fn run_via(&self, via: Via, server: &str, token: &str, args: &[&str]) -> (Value, String) {
        let out = self
            .client_via(via, server, token, args)
            .output()
            .expect("run node");
        common::node_result(out)
    }

    /// Runs the client to completion; returns its `RESULT` value and its whole output.
    fn run(&self, server: &str, token: &str, args: &[&str]) -> (Value, String) {
        let out = self.client(server, token, args).output().expect("run node");
        common::node_result(out)
    }

    fn save(&self, server: &str, token: &str, key: &str, paths: &[&str]) -> (Value, String) {
        let args: Vec<&str> = ["save", key].iter().chain(paths).copied().collect();
        self.run(server, token, &args)
    }

    fn restore(
        &self,
        server: &str,
        token: &str,
        key: &str,
        restore_keys: &[&str],
        paths: &[&str],
    ) -> (Value, String) {
        let joined = restore_keys.join(",");
        let mut args = vec!["restore", key];
        if !restore_keys.is_empty() {
            args.extend(["--restore-keys", joined.as_str()]);
        }
        args.extend(paths);
        self.run(server, token, &args)
    }
}

/// Polls `check` for up to 10 s (log lines arrive through a pipe, a moment after the response).
fn wait_until(check: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !check() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn sha256_file(path: &Path) -> String {
    let mut file = std::fs::File::open(path).unwrap();
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).unwrap();
    hex::encode(hasher.finalize())
}

/// The environment `hoard serve` gets for the test S3 server, as an operator would write it:
/// `AWS_ENDPOINT_URL`, and no `AWS_ALLOW_HTTP` (hoard allows the http:// endpoint it was given).
fn s3_env() -> Vec<(String, String)> {
    emulators::s3()
        .env()
        .into_iter()
        .filter(|(k, _)| k != "AWS_ALLOW_HTTP")
        .map(|(k, v)| match k.as_str() {
            "AWS_ENDPOINT" => ("AWS_ENDPOINT_URL".to_owned(), v),
            _ => (k, v),
        })
        .collect()
}

/// A fresh database on `server` and a fresh bucket on the test S3 server; `None` when the
/// user asked to skip that database server.
fn on_s3(server: Server) -> Option<Backend> {
    let bucket = emulators::s3().bucket();
    Backend::create(Some(server)).map(|b| b.with_storage(format!("s3://{bucket}/cache"), s3_env()))
}

fn saved_id(result: &Value, output: &str) -> i64 {
    let id = result.as_i64().unwrap_or(-1);
    assert!(id > 0, "save failed:\n{output}");
    id
}

fn small_entries_round_trip_and_follow_githubs_rules_with(server: Option<Server>) {
    if let Some(backend) = Backend::create(server) {
        small_entries_round_trip_and_follow_githubs_rules_on(backend);
    }
}

fn small_entries_round_trip_and_follow_githubs_rules_on(backend: Backend) {
    let data = tempfile::tempdir().unwrap();
    let hoard = Hoard::start_on(data.path(), &backend);
    let (srv, t) = (hoard.base.as_str(), main_token());
    let ws = Workspace::new();

    // 1 KiB and 1 MiB, in a directory.
    let small = ws.write_random("deps/small.bin", 1024, 1);
    let medium = ws.write_random("deps/medium.bin", MIB, 2);
    let (res, out) = ws.save(srv, &t, "deps-Linux-1", &["deps"]);
    saved_id(&res, &out);
    ws.remove("deps");
    let (res, out) = ws.restore(srv, &t, "deps-Linux-1", &[], &["deps"]);
    assert_eq!(res, "deps-Linux-1", "{out}");
    assert!(out.contains("Cache hit for: deps-Linux-1"), "{out}");
    assert_eq!(sha256_file(&ws.path("deps/small.bin")), small);
    assert_eq!(sha256_file(&ws.path("deps/medium.bin")), medium);

    // A second save of an existing key is refused and the content stays as it was.
    ws.write_random("deps/small.bin", 1024, 99);
    let (res, out) = ws.save(srv, &t, "deps-Linux-1", &["deps"]);
    assert_eq!(res, -1, "{out}");
    assert!(
        out.contains("Unable to reserve cache with key deps-Linux-1"),
        "{out}"
    );
    ws.remove("deps");
    ws.restore(srv, &t, "deps-Linux-1", &[], &["deps"]);
    assert_eq!(
        sha256_file(&ws.path("deps/small.bin")),
        small,
        "content unchanged"
    );

    // Restore keys pick the newest prefix match.
    let newer = ws.write_random("deps/small.bin", 2048, 3);
    let (res, out) = ws.save(srv, &t, "deps-Linux-2", &["deps"]);
    saved_id(&res, &out);
    ws.remove("deps");
    let (res, out) = ws.restore(
        srv,
        &t,
        "deps-Linux-3",
        &["deps-Linux-", "deps-"],
        &["deps"],
    );
    assert_eq!(res, "deps-Linux-2", "{out}");
    assert!(
        out.contains("Cache hit for restore-key: deps-Linux-2"),
        "{out}"
    );
    assert_eq!(sha256_file(&ws.path("deps/small.bin")), newer);

    // A different version (other paths) misses.
    let (res, out) = ws.restore(srv, &t, "deps-Linux-2", &["deps-"], &["other-path"]);
    assert_eq!(res, Value::Null, "{out}");

    // A miss comes back at once: one request, no retries, no warning.
    let (res, out) = ws.restore(srv, &t, "absent", &["absent-"], &["deps"]);
    assert_eq!(res, Value::Null, "{out}");
    assert_eq!(
        out.matches("[Request] GetCacheEntryDownloadURL").count(),
        1,
        "{out}"
    );
    assert!(
        !out.contains("Attempt ") && !out.contains("::warning::"),
        "{out}"
    );

    // A read-only token restores but cannot save.
    let read_only = token("1", &[(MAIN, 1)]);
    let (res, out) = ws.save(srv, &read_only, "deps-Linux-ro", &["deps"]);
    assert_eq!(res, -1, "{out}");
    assert!(out.contains("cache write denied"), "{out}");
}

fn large_entries_use_single_put_and_block_paths_in_bounded_memory_with(server: Option<Server>) {
    if let Some(backend) = Backend::create(server) {
        large_entries_use_single_put_and_block_paths_in_bounded_memory_on(backend);
    }
}

fn large_entries_use_single_put_and_block_paths_in_bounded_memory_on(backend: Backend) {
    let data = tempfile::tempdir().unwrap();
    let hoard = Hoard::start_on(data.path(), &backend);
    let (srv, t) = (hoard.base.as_str(), main_token());
    let ws = Workspace::new();

    // ~100 MiB archive: one Put Blob (the SDK sends up to 128 MiB in one request).
    let hundred = ws.write_random("hundred.bin", 100 * MIB, 4);
    let (res, out) = ws.save(srv, &t, "hundred", &["hundred.bin"]);
    saved_id(&res, &out);
    wait_until(|| hoard.upload_puts() >= 1);
    assert_eq!(
        hoard.upload_puts(),
        1,
        "one Put Blob expected for a 100 MiB archive"
    );
    ws.remove("hundred.bin");
    let (res, out) = ws.restore(srv, &t, "hundred", &[], &["hundred.bin"]);
    assert_eq!(res, "hundred", "{out}");
    assert_eq!(sha256_file(&ws.path("hundred.bin")), hundred);

    // ~300 MiB archive: 64 MiB blocks, 8 in flight, then Put Block List.
    let big = ws.write_random("big.bin", 300 * MIB, 5);
    let (res, out) = ws.save(srv, &t, "big", &["big.bin"]);
    saved_id(&res, &out);
    let peak_mib = hoard.peak_rss_kib() / 1024;
    assert!(
        peak_mib < 100,
        "peak RSS {peak_mib} MiB while receiving 300 MiB"
    );
    ws.remove("big.bin");
    let (res, out) = ws.restore(srv, &t, "big", &[], &["big.bin"]);
    assert_eq!(res, "big", "{out}");
    assert_eq!(sha256_file(&ws.path("big.bin")), big);
    wait_until(|| hoard.upload_puts() >= 7);
    let puts = hoard.upload_puts() - 1;
    assert!(
        puts >= 6,
        "5 Put Blocks and a Put Block List expected, saw {puts} PUTs"
    );
    let peak_mib = hoard.peak_rss_kib() / 1024;
    assert!(
        peak_mib < 100,
        "peak RSS {peak_mib} MiB after serving 300 MiB"
    );
    eprintln!("peak RSS {peak_mib} MiB");
}

fn four_concurrent_saves_of_one_key_have_one_winner_with(server: Option<Server>) {
    if let Some(backend) = Backend::create(server) {
        four_concurrent_saves_of_one_key_have_one_winner_on(backend);
    }
}

fn four_concurrent_saves_of_one_key_have_one_winner_on(backend: Backend) {
    let data = tempfile::tempdir().unwrap();
    let hoard = Hoard::start_on(data.path(), &backend);
    let (srv, t) = (hoard.base.as_str(), main_token());
    let jobs: Vec<(Workspace, String)> = (0..4)
        .map(|i| {
            let ws = Workspace::new();
            let sum = ws.write_random("out.bin", 8 * MIB, 10 + i);
            (ws, sum)
        })
        .collect();
    let children: Vec<Child> = jobs
        .iter()
        .map(|(ws, _)| {
            ws.client(srv, &t, &["save", "race", "out.bin"])
                .spawn()
                .unwrap()
        })
        .collect();
    let results: Vec<Value> = children
        .into_iter()
        .map(|c| common::node_result(c.wait_with_output().unwrap()).0)
        .collect();
    let winners: Vec<usize> = (0..4)
        .filter(|&i| results[i].as_i64().unwrap_or(-1) > 0)
        .collect();
    assert_eq!(winners.len(), 1, "results: {results:?}");
    let ws = Workspace::new();
    let (res, out) = ws.restore(srv, &t, "race", &[], &["out.bin"]);
    assert_eq!(res, "race", "{out}");
    assert_eq!(
        sha256_file(&ws.path("out.bin")),
        jobs[winners[0]].1,
        "the winner's bytes, intact"
    );
}

/// After a crash and restart, `key` is either a miss or a complete, intact hit.
fn assert_miss_or_intact(srv: &str, key: &str, rel: &str, expected_sha: &str) {
    let ws = Workspace::new();
    let (res, out) = ws.restore(srv, &main_token(), key, &[], &[rel]);
    if res != Value::Null {
        assert_eq!(res, key, "{out}");
        assert_eq!(
            sha256_file(&ws.path(rel)),
            expected_sha,
            "a restored entry must be intact"
        );
    }
    assert!(!out.contains("::warning::"), "{out}");
}

#[test]
fn a_crash_during_a_block_upload_never_yields_a_corrupt_hit() {
    let data = tempfile::tempdir().unwrap();
    let hoard = Hoard::start(data.path());
    let ws = Workspace::new();
    let sha = ws.write_random("big.bin", 200 * MIB, 6);
    let mut client = ws
        .client(&hoard.base, &main_token(), &["save", "crash", "big.bin"])
        .spawn()
        .unwrap();
    // Kill once some block is stored and another is still being written.
    let chunks = data.path().join("chunks");
    let tmp = data.path().join("tmp");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !(!files_under(&chunks).is_empty() && !files_under(&tmp).is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the upload never got going"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let dir = hoard.kill_9();
    let _ = client.kill();
    let _ = client.wait();

    let hoard = Hoard::start(&dir);
    assert!(
        files_under(&tmp).is_empty(),
        "staging files are swept at start-up"
    );
    assert_miss_or_intact(&hoard.base, "crash", "big.bin", &sha);
}

async fn twirp(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    method: &str,
    body: Value,
) -> Value {
    common::twirp_at(http, base, token, method, body).await.1
}

#[tokio::test]
async fn a_crash_during_finalize_never_yields_a_corrupt_hit() {
    let data = tempfile::tempdir().unwrap();
    let mut hoard = Hoard::start(data.path());
    let http = reqwest::Client::new();
    let t = main_token();
    let parts: Vec<Vec<u8>> = (0..4)
        .map(|i| random_bytes(2 * MIB + i, 40 + i as u64))
        .collect();
    let whole = parts.concat();
    let ws = Workspace::new();
    let rel = "payload.bin";
    std::fs::write(ws.path(rel), &whole).unwrap();
    let expected = sha256_file(&ws.path(rel));

    for round in 0..6u64 {
        let key = format!("finalize-crash-{round}");
        let version = "v-crash";
        let created = twirp(
            &http,
            &hoard.base,
            &t,
            "CreateCacheEntry",
            serde_json::json!({ "key": key, "version": version }),
        )
        .await;
        let url = created["signed_upload_url"].as_str().unwrap().to_owned();
        let mut list = String::from("<BlockList>");
        for (i, part) in parts.iter().enumerate() {
            let id = format!("block-{i:04}");
            let res = http
                .put(format!("{url}&comp=block&blockid={id}"))
                .body(part.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 201);
            list.push_str(&format!("<Latest>{id}</Latest>"));
        }
        list.push_str("</BlockList>");
        assert_eq!(
            http.put(format!("{url}&comp=blocklist"))
                .body(list)
                .send()
                .await
                .unwrap()
                .status(),
            201
        );

        // Kill the server while the finalize is in flight, at a different moment each round.
        let finalize = http
            .post(format!("{}{SERVICE}FinalizeCacheEntryUpload", hoard.base))
            .bearer_auth(&t)
            .header("content-type", "application/json")
            .body(serde_json::json!({ "key": key, "version": version, "size_bytes": whole.len().to_string() }).to_string())
            .send();
        let inflight = tokio::spawn(finalize);
        tokio::time::sleep(Duration::from_micros(round * 300)).await;
        let dir = hoard.kill_9();
        let _ = inflight.await;
        hoard = Hoard::start(&dir);

        // Check through the protocol: a miss, or exactly the uploaded bytes.
        let found = twirp(
            &http,
            &hoard.base,
            &t,
            "GetCacheEntryDownloadURL",
            serde_json::json!({ "key": key, "version": version }),
        )
        .await;
        if found["ok"] == true {
            let bytes = http
                .get(found["signed_download_url"].as_str().unwrap())
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            assert_eq!(
                hex::encode(Sha256::digest(&bytes)),
                expected,
                "round {round}: corrupt hit"
            );
        }
    }
}

#[tokio::test]
async fn sigterm_lets_in_flight_downloads_finish_then_exits() {
    let data = tempfile::tempdir().unwrap();
    let hoard = Hoard::start(data.path());
    let http = reqwest::Client::new();
    let t = main_token();
    let payload = random_bytes(64 * MIB, 77);
    let created = twirp(
        &http,
        &hoard.base,
        &t,
        "CreateCacheEntry",
        serde_json::json!({ "key": "drain", "version": "v" }),
    )
    .await;
    let url = created["signed_upload_url"].as_str().unwrap();
    assert_eq!(
        http.put(url)
            .body(payload.clone())
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    twirp(
        &http,
        &hoard.base,
        &t,
        "FinalizeCacheEntryUpload",
        serde_json::json!({ "key": "drain", "version": "v", "size_bytes": payload.len() }),
    )
    .await;
    let found = twirp(
        &http,
        &hoard.base,
        &t,
        "GetCacheEntryDownloadURL",
        serde_json::json!({ "key": "drain", "version": "v" }),
    )
    .await;

    // Start a download and read only its first bytes before asking the server to stop.
    let mut res = http
        .get(found["signed_download_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let mut received = res.chunk().await.unwrap().unwrap().to_vec();
    let status = Command::new("kill")
        .args(["-TERM", &hoard.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());

    // New work is refused while the download drains.
    let base = hoard.base.clone();
    assert!(
        wait_for_refusal(&base).await,
        "the server kept accepting new connections after SIGTERM"
    );
    while let Some(chunk) = res.chunk().await.unwrap() {
        received.extend_from_slice(&chunk);
    }
    assert_eq!(received.len(), payload.len());
    assert!(
        received == payload,
        "the in-flight download completed intact"
    );

    let exit = hoard.wait();
    assert!(exit.success(), "exit status {exit:?}");
}

/// True once new connections to `base` are refused (or readiness fails).
async fn wait_for_refusal(base: &str) -> bool {
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for _ in 0..500 {
        match fresh.get(format!("{base}/readyz")).send().await {
            Err(_) => return true,
            Ok(res) if res.status() == 503 => return true,
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    false
}

/// Every isolation rule of issue #4 point 2, through the real client with RS256 tokens of a test
/// issuer (verified against its JWKS file) scoped as GitHub scopes them (PROTOCOL.md §8–§9).
fn branches_pull_requests_and_repositories_are_isolated_for_the_real_client_with(
    server: Option<Server>,
) {
    let Some(backend) = Backend::create(server) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let issuer = common::issuer::Issuer::new("https://token.issuer.test");
    let jwks = issuer.write_jwks(data.path());
    let mut args = vec![
        "--token-issuer",
        "https://token.issuer.test",
        "--jwks-file",
        jwks.to_str().unwrap(),
    ];
    args.extend(backend.args());
    let hoard = Hoard::start_with(data.path(), &args);
    let srv = hoard.base.as_str();
    const FEATURE: &str = "refs/heads/feature";
    let main = issuer.token("1", &[(MAIN, 3)]);
    let feature = issuer.token("1", &[(FEATURE, 3), (MAIN, 1)]);
    let sibling = issuer.token("1", &[("refs/heads/sibling", 3), (MAIN, 1)]);
    let pull = issuer.token("1", &[("refs/pull/7/merge", 3), (FEATURE, 1), (MAIN, 1)]);
    let read_only = issuer.token("1", &[(MAIN, 1)]);
    let other_repo = issuer.token("2", &[(MAIN, 3)]);
    let ws = Workspace::new();
    let restore_sha = |token: &str, key: &str| -> Option<String> {
        let ws = Workspace::new();
        let (res, out) = ws.restore(srv, token, key, &[], &["data.bin"]);
        (res != Value::Null).then(|| {
            assert_eq!(res, key, "{out}");
            sha256_file(&ws.path("data.bin"))
        })
    };

    // A push to main saves; main reads it back.
    let on_main = ws.write_random("data.bin", 4096, 1);
    saved_id(&ws.save(srv, &main, "deps", &["data.bin"]).0, "main save");
    assert_eq!(
        restore_sha(&main, "deps").as_deref(),
        Some(on_main.as_str())
    );

    // A feature branch reads the default branch, and writes only to its own scope.
    assert_eq!(
        restore_sha(&feature, "deps").as_deref(),
        Some(on_main.as_str())
    );
    let on_feature = ws.write_random("data.bin", 4096, 2);
    saved_id(
        &ws.save(srv, &feature, "deps", &["data.bin"]).0,
        "feature save",
    );
    assert_eq!(
        restore_sha(&feature, "deps").as_deref(),
        Some(on_feature.as_str()),
        "current branch first"
    );
    assert_eq!(
        restore_sha(&main, "deps").as_deref(),
        Some(on_main.as_str()),
        "main never sees the feature's entry"
    );

    // A sibling branch cannot read the feature branch.
    assert_eq!(
        restore_sha(&sibling, "deps").as_deref(),
        Some(on_main.as_str())
    );
    let feature_only = ws.write_random("data.bin", 4096, 3);
    saved_id(
        &ws.save(srv, &feature, "feature-only", &["data.bin"]).0,
        "feature-only save",
    );
    assert_eq!(restore_sha(&sibling, "feature-only"), None);
    assert_eq!(
        restore_sha(&feature, "feature-only").as_deref(),
        Some(feature_only.as_str())
    );

    // A pull request reads its base branch, writes to refs/pull/N/merge, which nobody else reads.
    assert_eq!(
        restore_sha(&pull, "deps").as_deref(),
        Some(on_feature.as_str()),
        "base branch before default"
    );
    let on_pull = ws.write_random("data.bin", 4096, 4);
    saved_id(
        &ws.save(srv, &pull, "pr-only", &["data.bin"]).0,
        "pull request save",
    );
    assert_eq!(
        restore_sha(&pull, "pr-only").as_deref(),
        Some(on_pull.as_str())
    );
    assert_eq!(restore_sha(&feature, "pr-only"), None);
    assert_eq!(restore_sha(&main, "pr-only"), None);

    // A read-only token restores but cannot save.
    assert_eq!(
        restore_sha(&read_only, "deps").as_deref(),
        Some(on_main.as_str())
    );
    ws.write_random("data.bin", 4096, 5);
    let (res, out) = ws.save(srv, &read_only, "ro", &["data.bin"]);
    assert_eq!(res, -1, "{out}");
    assert!(out.contains("cache write denied"), "{out}");
    assert_eq!(restore_sha(&main, "ro"), None);

    // Another repository sees nothing of repository 1, and its writes stay its own.
    assert_eq!(restore_sha(&other_repo, "deps"), None);
    let theirs = ws.write_random("data.bin", 4096, 6);
    saved_id(
        &ws.save(srv, &other_repo, "deps", &["data.bin"]).0,
        "other repository save",
    );
    assert_eq!(
        restore_sha(&other_repo, "deps").as_deref(),
        Some(theirs.as_str())
    );
    assert_eq!(
        restore_sha(&main, "deps").as_deref(),
        Some(on_main.as_str())
    );

    // A token signed by anyone else is refused: the client treats it as a miss.
    let forger = common::issuer::Issuer::new("https://token.issuer.test");
    assert_eq!(restore_sha(&forger.token("1", &[(MAIN, 3)]), "deps"), None);
}

#[test]
fn small_entries_round_trip_and_follow_githubs_rules() {
    small_entries_round_trip_and_follow_githubs_rules_with(None);
}

#[test]
fn small_entries_round_trip_and_follow_githubs_rules_on_postgres() {
    small_entries_round_trip_and_follow_githubs_rules_with(Some(Server::Postgres));
}

#[test]
fn small_entries_round_trip_and_follow_githubs_rules_on_mariadb() {
    small_entries_round_trip_and_follow_githubs_rules_with(Some(Server::MySql));
}

#[test]
fn small_entries_round_trip_and_follow_githubs_rules_on_postgres_and_s3() {
    if let Some(backend) = on_s3(Server::Postgres) {
        small_entries_round_trip_and_follow_githubs_rules_on(backend);
    }
}

#[test]
fn large_entries_use_single_put_and_block_paths_in_bounded_memory() {
    large_entries_use_single_put_and_block_paths_in_bounded_memory_with(None);
}

#[test]
fn large_entries_use_single_put_and_block_paths_in_bounded_memory_on_postgres() {
    large_entries_use_single_put_and_block_paths_in_bounded_memory_with(Some(Server::Postgres));
}

#[test]
fn large_entries_use_single_put_and_block_paths_in_bounded_memory_on_mariadb() {
    large_entries_use_single_put_and_block_paths_in_bounded_memory_with(Some(Server::MySql));
}

#[test]
fn large_entries_use_single_put_and_block_paths_in_bounded_memory_on_postgres_and_s3() {
    if let Some(backend) = on_s3(Server::Postgres) {
        large_entries_use_single_put_and_block_paths_in_bounded_memory_on(backend);
    }
}

#[test]
fn four_concurrent_saves_of_one_key_have_one_winner() {
    four_concurrent_saves_of_one_key_have_one_winner_with(None);
}

#[test]
fn four_concurrent_saves_of_one_key_have_one_winner_on_postgres() {
    four_concurrent_saves_of_one_key_have_one_winner_with(Some(Server::Postgres));
}

#[test]
fn four_concurrent_saves_of_one_key_have_one_winner_on_mariadb() {
    four_concurrent_saves_of_one_key_have_one_winner_with(Some(Server::MySql));
}

#[test]
fn four_concurrent_saves_of_one_key_have_one_winner_on_postgres_and_s3() {
    if let Some(backend) = on_s3(Server::Postgres) {
        four_concurrent_saves_of_one_key_have_one_winner_on(backend);
    }
}

#[test]
fn branches_pull_requests_and_repositories_are_isolated_for_the_real_client() {
    branches_pull_requests_and_repositories_are_isolated_for_the_real_client_with(None);
}

#[test]
fn branches_pull_requests_and_repositories_are_isolated_for_the_real_client_on_postgres() {
    branches_pull_requests_and_repositories_are_isolated_for_the_real_client_with(Some(
        Server::Postgres,
    ));
}

#[test]
fn branches_pull_requests_and_repositories_are_isolated_for_the_real_client_on_mariadb() {
    branches_pull_requests_and_repositories_are_isolated_for_the_real_client_with(Some(
        Server::MySql,
    ));
}

/// Sends `n` concurrent reservations of `key`, the i-th to `bases[i % bases.len()]`; returns
/// the base and signed upload link of each that won.
async fn reservation_winners(
    http: &reqwest::Client,
    bases: &[String],
    t: &str,
    key: &str,
    n: usize,
) -> Vec<(String, String)> {
    let attempts: Vec<_> = (0..n)
        .map(|i| {
            let (http, t, base) = (http.clone(), t.to_owned(), bases[i % bases.len()].clone());
            let body = serde_json::json!({"key": key, "version": common::VERSION});
            tokio::spawn(async move {
                (
                    twirp(&http, &base, &t, "CreateCacheEntry", body).await,
                    base,
                )
            })
        })
        .collect();
    let mut winners = Vec::new();
    for attempt in attempts {
        let (res, base) = attempt.await.unwrap();
        if res["ok"] == true {
            winners.push((base, res["signed_upload_url"].as_str().unwrap().to_owned()));
        }
    }
    winners
}

/// Two `hoard serve` processes on one database, one data directory and one signing key
/// (issue #7, point 5): a reservation race across them has one winner, an entry saved through
/// one restores through the other with the real client, and a link signed by one is honoured
/// by the other.
fn two_processes_share_one_database(server: Server) {
    let Some(backend) = Backend::create(Some(server)) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let a = Hoard::start_on(data.path(), &backend);
    let b = Hoard::start_on(data.path(), &backend);
    let t = main_token();

    // The real client saves through one and restores through the other, both ways.
    let ws = Workspace::new();
    let sum = ws.write_random("deps/out.bin", 3 * MIB, 40);
    saved_id(
        &ws.save(&a.base, &t, "shared-1", &["deps"]).0,
        "save through a",
    );
    ws.remove("deps");
    let (res, out) = ws.restore(&b.base, &t, "shared-1", &[], &["deps"]);
    assert_eq!(res, "shared-1", "{out}");
    assert_eq!(sha256_file(&ws.path("deps/out.bin")), sum);
    let sum = ws.write_random("deps/out.bin", MIB, 41);
    saved_id(
        &ws.save(&b.base, &t, "shared-2", &["deps"]).0,
        "save through b",
    );
    ws.remove("deps");
    let (res, out) = ws.restore(&a.base, &t, "shared-", &[], &["deps"]);
    assert_eq!(
        res, "shared-2",
        "the newest prefix match, whichever process saved it: {out}"
    );
    assert_eq!(sha256_file(&ws.path("deps/out.bin")), sum);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        // Eight concurrent reservations of one key, alternating between the processes.
        let bases = [a.base.clone(), b.base.clone()];
        let winners = reservation_winners(&http, &bases, &t, "raced", 8).await;
        assert_eq!(winners.len(), 1, "one winner across both processes");

        // The winner's link, signed by whichever process answered, is taken by the other one;
        // then finalize through b and restore through a.
        let (signer, link) = &winners[0];
        let other = if *signer == a.base { &b.base } else { &a.base };
        let link = link.replace(signer.as_str(), other);
        let payload = random_bytes(70_000, 42);
        let put = http
            .put(&link)
            .header("x-ms-blob-type", "BlockBlob")
            .body(payload.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), 201, "{}", put.text().await.unwrap());
        let body = serde_json::json!({"key": "raced", "version": common::VERSION, "size_bytes": payload.len()});
        let fin = twirp(&http, &b.base, &t, "FinalizeCacheEntryUpload", body).await;
        assert_eq!(fin["ok"], true, "{fin}");
        let body = serde_json::json!({"key": "raced", "version": common::VERSION});
        let hit = twirp(&http, &a.base, &t, "GetCacheEntryDownloadURL", body).await;
        assert_eq!(hit["ok"], true, "{hit}");
        let url = hit["signed_download_url"].as_str().unwrap().replace(&a.base, &b.base);
        let got = http.get(url).send().await.unwrap().bytes().await.unwrap();
        assert_eq!(got.as_ref(), payload.as_slice(), "a link a signed opens on b");
    });
}

#[test]
fn two_processes_share_one_database_on_postgres() {
    two_processes_share_one_database(Server::Postgres);
}

#[test]
fn two_processes_share_one_database_on_mariadb() {
    two_processes_share_one_database(Server::MySql);
}

/// A repository over its quota loses its least recently used entries; its recent ones still
/// restore, and other repositories keep theirs.
#[test]
fn a_repository_over_its_quota_loses_its_least_recently_used_entries() {
    let data = tempfile::tempdir().unwrap();
    let secret = common::secret_file(data.path());
    let hoard = Hoard::start_with(
        data.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--repo-quota",
            "2600KiB",
        ],
    );
    let (srv, t) = (hoard.base.as_str(), main_token());
    let other = token("2", &[(MAIN, 3)]);
    let ws = Workspace::new();
    // Random bytes do not compress: each entry is a little over 1 MiB.
    let mut sums = Vec::new();
    for (i, key) in ["quota-1", "quota-2"].iter().enumerate() {
        sums.push(ws.write_random("q/data.bin", MIB, 40 + i as u64));
        let (res, out) = ws.save(srv, &t, key, &["q"]);
        saved_id(&res, &out);
    }
    let (res, out) = ws.save(srv, &other, "quota-other", &["q"]);
    saved_id(&res, &out);
    // Restoring quota-1 makes quota-2 the least recently used.
    let (res, out) = ws.restore(srv, &t, "quota-1", &[], &["q"]);
    assert_eq!(res, "quota-1", "{out}");
    sums.push(ws.write_random("q/data.bin", MIB, 42));
    let (res, out) = ws.save(srv, &t, "quota-3", &["q"]);
    saved_id(&res, &out);

    let (res, out) = ws.restore(srv, &t, "quota-2", &[], &["q"]);
    assert_eq!(res, Value::Null, "evicted:\n{out}");
    for (key, sum) in [("quota-1", &sums[0]), ("quota-3", &sums[2])] {
        ws.remove("q");
        let (res, out) = ws.restore(srv, &t, key, &[], &["q"]);
        assert_eq!(res, key, "{out}");
        assert_eq!(&sha256_file(&ws.path("q/data.bin")), sum);
    }
    let (res, out) = ws.restore(srv, &other, "quota-other", &[], &["q"]);
    assert_eq!(res, "quota-other", "other repositories keep theirs:\n{out}");
}

/// Sends SIGHUP to `hoard` and waits for its policy reload line (reloaded or not); returns it.
fn hangup_for_policy(hoard: &Hoard) -> String {
    let lines = || -> Vec<String> {
        let log = hoard.log.lock().unwrap();
        log.iter()
            .filter(|l| l.contains("SIGHUP: policy"))
            .cloned()
            .collect()
    };
    let before = lines().len();
    let hup = Command::new("kill")
        .args(["-HUP", &hoard.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    wait_until(|| lines().len() > before);
    lines()
        .get(before)
        .cloned()
        .unwrap_or_else(|| panic!("no reload line: {:?}", hoard.log.lock().unwrap()))
}

/// A freeze of `refs/heads/main` in `--policy-file` (issue #23 part 3): the real client's save
/// warns with the write-denied message and the step does not fail, on v2 and on v1; restores
/// still hit; a bad file on SIGHUP keeps the freeze; the file edited and SIGHUP, saves work.
#[test]
fn a_frozen_main_branch_warns_the_real_client_and_lifts_on_sighup() {
    let data = tempfile::tempdir().unwrap();
    let secret = common::secret_file(data.path());
    let policy = data.path().join("policy.toml");
    std::fs::write(&policy, "# nothing frozen yet\n").unwrap();
    let hoard = Hoard::start_with(
        data.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--policy-file",
            policy.to_str().unwrap(),
        ],
    );
    let srv = hoard.base.as_str();
    let mut claims = common::claims("1", &[(MAIN, 3)]);
    claims["repository"] = serde_json::json!("octo/app");
    let t = common::sign_hs256(&claims);
    let ws = Workspace::new();
    let before = ws.write_random("f/data.bin", 64 * 1024, 7);
    let (res, out) = ws.save(srv, &t, "frozen-1", &["f"]);
    saved_id(&res, &out);

    const FREEZE: &str = "[[rule]]\nrepository = \"octo/app\"\nscope = \"refs/heads/main\"\naccess = \"read-only\"\n";
    std::fs::write(&policy, FREEZE).unwrap();
    let line = hangup_for_policy(&hoard);
    assert!(
        line.contains("policy reloaded") && line.contains("1 rules"),
        "{line}"
    );

    let denied = "cache write denied: refs/heads/main of octo/app is read-only by policy rule 1";
    ws.write_random("f/data.bin", 64 * 1024, 8);
    // node_result checks the client exited 0: the job's save step goes on.
    let (res, out) = ws.save(srv, &t, "frozen-2", &["f"]);
    assert_eq!(res, -1, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("::warning::") && l.contains(denied)),
        "a warning:\n{out}"
    );
    assert!(!out.contains("another job may be creating"), "{out}");
    let (res, out) = ws.run_via(Via::V1With6, srv, &t, &["save", "frozen-v1", "f"]);
    assert_eq!(res, -1, "{out}");
    assert!(out.contains(denied), "{out}");
    // Restores still hit.
    ws.remove("f");
    let (res, out) = ws.restore(srv, &t, "frozen-1", &[], &["f"]);
    assert_eq!(res, "frozen-1", "{out}");
    assert_eq!(sha256_file(&ws.path("f/data.bin")), before);
    let (res, out) = ws.restore(srv, &t, "frozen-2", &[], &["f"]);
    assert_eq!(res, Value::Null, "nothing was saved while frozen:\n{out}");

    // A bad file on SIGHUP keeps the freeze.
    std::fs::write(&policy, FREEZE.replace("read-only", "frozen")).unwrap();
    let line = hangup_for_policy(&hoard);
    assert!(line.contains("policy not reloaded"), "{line}");
    ws.write_random("f/data.bin", 64 * 1024, 9);
    let (res, out) = ws.save(srv, &t, "frozen-3", &["f"]);
    assert_eq!(res, -1, "{out}");
    assert!(out.contains(denied), "{out}");

    // The freeze lifted in the file and SIGHUP: saves work again.
    std::fs::write(&policy, FREEZE.replace("read-only", "read-write")).unwrap();
    let line = hangup_for_policy(&hoard);
    assert!(line.contains("policy reloaded"), "{line}");
    let after = ws.write_random("f/data.bin", 64 * 1024, 10);
    let (res, out) = ws.save(srv, &t, "frozen-3", &["f"]);
    saved_id(&res, &out);
    ws.remove("f");
    let (res, out) = ws.restore(srv, &t, "frozen-3", &[], &["f"]);
    assert_eq!(res, "frozen-3", "{out}");
    assert_eq!(sha256_file(&ws.path("f/data.bin")), after);
}

/// Pull-request entries keep within their share of the quota (`--pr-scope-share`, 50% by
/// default): a pull request saving past it loses its own oldest entries, never the default
/// branch's, which the real client still restores byte for byte.
#[test]
fn pull_request_entries_past_their_share_leave_the_default_branchs_entry() {
    let data = tempfile::tempdir().unwrap();
    let secret = common::secret_file(data.path());
    let hoard = Hoard::start_with(
        data.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--repo-quota",
            "6MiB",
        ],
    );
    let (srv, t) = (hoard.base.as_str(), main_token());
    let pr = token("1", &[("refs/pull/7/merge", 3), (MAIN, 1)]);
    let ws = Workspace::new();
    // Random bytes do not compress: each entry is a little over 1 MiB, the share 3 MiB.
    let main_sum = ws.write_random("q/data.bin", MIB, 60);
    let (res, out) = ws.save(srv, &t, "share-main", &["q"]);
    saved_id(&res, &out);
    let mut pr_sums = Vec::new();
    for i in 1..=4u64 {
        pr_sums.push(ws.write_random("q/data.bin", MIB, 60 + i));
        let (res, out) = ws.save(srv, &pr, &format!("share-pr-{i}"), &["q"]);
        saved_id(&res, &out);
    }
    for gone in ["share-pr-1", "share-pr-2"] {
        let (res, out) = ws.restore(srv, &pr, gone, &[], &["q"]);
        assert_eq!(res, Value::Null, "{gone}: the share's oldest went:\n{out}");
    }
    for (key, sum) in [("share-pr-3", &pr_sums[2]), ("share-pr-4", &pr_sums[3])] {
        ws.remove("q");
        let (res, out) = ws.restore(srv, &pr, key, &[], &["q"]);
        assert_eq!(res, key, "{out}");
        assert_eq!(&sha256_file(&ws.path("q/data.bin")), sum);
    }
    ws.remove("q");
    let (res, out) = ws.restore(srv, &t, "share-main", &[], &["q"]);
    assert_eq!(
        res, "share-main",
        "the default branch's entry survives:\n{out}"
    );
    assert_eq!(sha256_file(&ws.path("q/data.bin")), main_sum);
}

/// Successful v1 range uploads so far, from the request log.
fn v1_patches(hoard: &Hoard) -> usize {
    let log = hoard.log.lock().unwrap();
    log.iter()
        .filter(|l| l.contains("method=PATCH") && l.contains("status=204"))
        .count()
}

/// The legacy protocol with the real clients: 3.2.4 (v1 only) under a path prefix and at the
/// root, 6.3.0 forced onto v1 by a forge's GITHUB_SERVER_URL, a ~150 MiB entry over several
/// concurrent ranges, and entries crossing protocols with the same version.
#[test]
fn legacy_clients_save_and_restore_under_a_prefix_and_at_the_root() {
    let data = tempfile::tempdir().unwrap();
    let hoard = Hoard::start(data.path());
    let t = main_token();
    let root = hoard.base.clone();
    let prefixed = format!("{}/runner-7/job", hoard.base);
    let ws = Workspace::new();

    let places = [
        (Via::V1With3, &prefixed),
        (Via::V1With3, &root),
        (Via::V1With6, &prefixed),
        (Via::V1With6, &root),
    ];
    for (n, (via, server)) in places.into_iter().enumerate() {
        let seed = 60 + n as u64 * 10;
        let key = |suffix: &str| format!("v1-{via:?}-{n}-{suffix}");
        let sum = ws.write_random("v1/small.bin", MIB, seed);
        let (res, out) = ws.run_via(via, server, &t, &["save", &key("1"), "v1"]);
        saved_id(&res, &out);
        assert!(out.contains("Cache saved successfully"), "{out}");
        assert!(
            out.contains(&format!("{server}/_apis/artifactcache/caches")),
            "{via:?} spoke v1 to {server}:\n{out}"
        );
        ws.remove("v1");
        let restore_keys = key("");
        let (res, out) = ws.run_via(
            via,
            server,
            &t,
            &["restore", &key("2"), "--restore-keys", &restore_keys, "v1"],
        );
        assert_eq!(res, key("1").as_str(), "{out}");
        assert_eq!(sha256_file(&ws.path("v1/small.bin")), sum, "{via:?}");

        let (res, out) = ws.run_via(via, server, &t, &["restore", "absent", "v1"]);
        assert_eq!(res, Value::Null, "{out}");
        assert!(!out.contains("::warning::"), "a miss is quiet:\n{out}");

        ws.write_random("v1/small.bin", MIB, seed + 1);
        let (res, out) = ws.run_via(via, server, &t, &["save", &key("1"), "v1"]);
        assert_eq!(res, -1, "{out}");
        assert!(out.contains("Cache already exists."), "{out}");
        ws.remove("v1");
        ws.run_via(via, server, &t, &["restore", &key("1"), "v1"]);
        assert_eq!(
            sha256_file(&ws.path("v1/small.bin")),
            sum,
            "the first save stays"
        );
    }

    // ~150 MiB: five 32 MiB ranges, four at a time and out of order, saved by each client and
    // restored by the other, at the root and under a prefix (any prefix reaches the same
    // service for a token that verifies).
    for (n, (save_via, save_at, restore_via, restore_at)) in [
        (Via::V1With3, &root, Via::V1With6, &prefixed),
        (Via::V1With6, &prefixed, Via::V1With3, &root),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("v1-big-{n}");
        let patches_before = v1_patches(&hoard);
        let big = ws.write_random("big/data.bin", 150 * MIB, 90 + n as u64);
        let (res, out) = ws.run_via(save_via, save_at, &t, &["save", &key, "big"]);
        saved_id(&res, &out);
        wait_until(|| v1_patches(&hoard) >= patches_before + 5);
        assert_eq!(v1_patches(&hoard), patches_before + 5, "{out}");
        ws.remove("big");
        let (res, out) = ws.run_via(restore_via, restore_at, &t, &["restore", &key, "big"]);
        assert_eq!(res, key.as_str(), "{out}");
        assert_eq!(sha256_file(&ws.path("big/data.bin")), big);
        ws.remove("big");
    }
    // Four concurrent 32 MiB ranges stream to disk: memory does not grow with them.
    let peak_mib = hoard.peak_rss_kib() / 1024;
    assert!(
        peak_mib < 100,
        "peak RSS {peak_mib} MiB after 300 MiB of v1 ranges"
    );

    // One store, two protocols.
    let sum = ws.write_random("x/data.bin", MIB, 95);
    let (res, out) = ws.run_via(Via::V1With3, &root, &t, &["save", "cross-v1", "x"]);
    saved_id(&res, &out);
    ws.remove("x");
    let (res, out) = ws.run_via(Via::V2, &root, &t, &["restore", "cross-v1", "x"]);
    assert_eq!(res, "cross-v1", "saved by v1, restored by v2:\n{out}");
    assert_eq!(sha256_file(&ws.path("x/data.bin")), sum);

    let sum = ws.write_random("x/data.bin", MIB, 96);
    let (res, out) = ws.run_via(Via::V2, &root, &t, &["save", "cross-v2", "x"]);
    saved_id(&res, &out);
    ws.remove("x");
    let (res, out) = ws.run_via(Via::V1With3, &prefixed, &t, &["restore", "cross-v2", "x"]);
    assert_eq!(res, "cross-v2", "saved by v2, restored by v1:\n{out}");
    assert_eq!(sha256_file(&ws.path("x/data.bin")), sum);
}

/// A load balancer in front of replicas for the replica test: each request goes to the replica
/// `pick` names, with the Host header kept, so links point back at the balancer.
struct Balancer {
    base: String,
    /// (method, path, replica index) of every request, in arrival order.
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, String, usize)>>>,
}

type Pick = fn(&str, &str, usize) -> usize;

struct Lb {
    replicas: Vec<String>,
    pick: Pick,
    http: reqwest::Client,
    puts: std::sync::atomic::AtomicUsize,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, String, usize)>>>,
}

async fn forward(
    axum::extract::State(lb): axum::extract::State<std::sync::Arc<Lb>>,
    req: axum::extract::Request,
) -> axum::response::Response {
    let (parts, body) = req.into_parts();
    let (method, path) = (
        parts.method.as_str().to_owned(),
        parts.uri.path().to_owned(),
    );
    let n = if method == "PUT" {
        lb.puts.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    } else {
        0
    };
    let i = (lb.pick)(&method, &path, n);
    lb.seen.lock().unwrap().push((method, path, i));
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = lb
        .http
        .request(parts.method.clone(), format!("{}{pq}", lb.replicas[i]))
        .body(reqwest::Body::wrap_stream(body.into_data_stream()));
    for (name, value) in &parts.headers {
        out = out.header(name, value);
    }
    let answer = out.send().await.unwrap();
    let mut response = axum::response::Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        response = response.header(name, value);
    }
    response
        .body(axum::body::Body::from_stream(answer.bytes_stream()))
        .unwrap()
}

impl Balancer {
    /// Starts on its own runtime thread, for synchronous tests.
    fn start(replicas: Vec<String>, pick: Pick) -> Self {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let lb = std::sync::Arc::new(Lb {
            replicas,
            pick,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            puts: Default::default(),
            seen: seen.clone(),
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                let app = axum::Router::new().fallback(forward).with_state(lb);
                axum::serve(listener, app).await.unwrap();
            });
        });
        let addr = rx.recv().unwrap();
        Self {
            base: format!("http://{addr}"),
            seen,
        }
    }

    /// Which replicas received requests whose path contains `part` and whose method is `method`.
    fn replicas_for(&self, method: &str, part: &str) -> Vec<usize> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(m, p, _)| m == method && p.contains(part))
            .map(|(_, _, i)| *i)
            .collect()
    }
}

/// Starts `n` replicas on one database and one bucket, each with its own data directory and
/// the same signing key.
fn replicas(backend: &Backend, n: usize) -> Vec<(Hoard, tempfile::TempDir)> {
    (0..n)
        .map(|_| {
            let data = tempfile::tempdir().unwrap();
            let secret = common::secret_file(data.path());
            let mut args = vec![
                "--token-hs256-secret-file",
                secret.to_str().unwrap(),
                "--signing-key",
                "replicas-share-this-signing-key-0123456789",
            ];
            args.extend(backend.args());
            (
                Hoard::start_with_env(data.path(), &args, backend.env()),
                data,
            )
        })
        .collect()
}

/// Three replicas on PostgreSQL + S3 are one cache (issue #8): the real client saves through
/// A with its blocks spread over A and B and finalizes through B, then restores through C; a
/// reservation race across the three has one winner; a replica killed with SIGKILL in the
/// middle of an upload leaves no entry, and the others keep serving.
#[test]
fn three_replicas_on_postgres_and_s3_are_one_cache() {
    let Some(backend) = on_s3(Server::Postgres) else {
        return;
    };
    let mut nodes = replicas(&backend, 3);
    let bases: Vec<String> = nodes.iter().map(|(h, _)| h.base.clone()).collect();
    let t = main_token();

    // Reserve at A, blocks alternately to A and B, finalize at B, anything else at C.
    let lb = Balancer::start(bases.clone(), |method, path, puts| {
        if path.ends_with("/CreateCacheEntry") {
            0
        } else if path.ends_with("/FinalizeCacheEntryUpload") {
            1
        } else if method == "PUT" {
            puts % 2
        } else {
            2
        }
    });
    let ws = Workspace::new();
    // Over the client's 128 MiB single-put limit: 64 MiB blocks, then Put Block List.
    let sum = ws.write_random("big/data.bin", 150 * MIB, 80);
    let (res, out) = ws.save(&lb.base, &t, "replicated", &["big"]);
    saved_id(&res, &out);
    let blob_puts = lb.replicas_for("PUT", "/_blob/uploads/");
    assert!(
        blob_puts.len() >= 4 && blob_puts.contains(&0) && blob_puts.contains(&1),
        "blocks and block list spread over A and B: {blob_puts:?}"
    );
    assert_eq!(lb.replicas_for("POST", "/CreateCacheEntry"), [0]);
    assert_eq!(lb.replicas_for("POST", "/FinalizeCacheEntryUpload"), [1]);
    ws.remove("big");
    let (res, out) = ws.restore(&bases[2], &t, "replicated", &[], &["big"]);
    assert_eq!(res, "replicated", "restored through C: {out}");
    assert_eq!(sha256_file(&ws.path("big/data.bin")), sum);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        // Nine concurrent reservations of one key, three at each replica: one winner.
        let winners = reservation_winners(&http, &bases, &t, "raced", 9).await;
        assert_eq!(winners.len(), 1, "one winner across three replicas");

        // An upload to A that A never finishes: 4 MiB arrive, then A is killed.
        let link = reserve_at(&http, &bases[0], &t, "cut-short").await;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
        tx.send(Ok(bytes::Bytes::from(random_bytes(4 * MIB, 81))))
            .await
            .unwrap();
        let stalled = tokio::spawn({
            let http = http.clone();
            async move {
                http.put(format!("{link}&comp=block&blockid=QUFBQQ=="))
                    .header("content-length", (8 * MIB).to_string())
                    .body(reqwest::Body::wrap_stream(
                        tokio_stream_from(rx),
                    ))
                    .send()
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(800)).await;
        let (a, _a_data) = nodes.remove(0);
        a.kill_9();
        drop(tx);
        assert!(stalled.await.unwrap().is_err(), "A died mid-upload");
        let body = serde_json::json!({"key": "cut-short", "version": common::VERSION, "size_bytes": 8 * MIB});
        let fin = twirp(&http, &bases[1], &t, "FinalizeCacheEntryUpload", body).await;
        assert_ne!(fin["ok"], true, "nothing was committed: {fin}");
        for base in &bases[1..] {
            let body = serde_json::json!({"key": "cut-short", "version": common::VERSION});
            let hit = twirp(&http, base, &t, "GetCacheEntryDownloadURL", body).await;
            assert_ne!(hit["ok"], true, "no entry from a killed upload: {hit}");
        }
    });

    // B and C keep serving, for the real client too.
    let ws = Workspace::new();
    let sum = ws.write_random("after/data.bin", MIB, 82);
    saved_id(
        &ws.save(&bases[1], &t, "after-kill", &["after"]).0,
        "save through B",
    );
    ws.remove("after");
    let (res, out) = ws.restore(&bases[2], &t, "after-kill", &[], &["after"]);
    assert_eq!(res, "after-kill", "{out}");
    assert_eq!(sha256_file(&ws.path("after/data.bin")), sum);
    let (res, _) = ws.restore(&bases[1], &t, "replicated", &[], &["big"]);
    assert_eq!(res, "replicated");
}

/// The receiving end of `rx` as a body stream.
fn tokio_stream_from(
    rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

/// Reserves `key` (the test version) and returns the upload link.
async fn reserve_at(http: &reqwest::Client, base: &str, t: &str, key: &str) -> String {
    let body = serde_json::json!({"key": key, "version": common::VERSION});
    let reserved = twirp(http, base, t, "CreateCacheEntry", body).await;
    reserved["signed_upload_url"].as_str().unwrap().to_owned()
}

/// Finalizes `key` at `size` bytes, then looks it up and returns its download link.
async fn finalize_and_find(
    http: &reqwest::Client,
    base: &str,
    t: &str,
    key: &str,
    size: usize,
) -> String {
    let body = serde_json::json!({"key": key, "version": common::VERSION, "size_bytes": size});
    assert_eq!(
        twirp(http, base, t, "FinalizeCacheEntryUpload", body).await["ok"],
        true
    );
    let body = serde_json::json!({"key": key, "version": common::VERSION});
    let hit = twirp(http, base, t, "GetCacheEntryDownloadURL", body).await;
    hit["signed_download_url"].as_str().unwrap().to_owned()
}

/// `--direct-downloads` (issue #8): the real client restores an entry through a redirect to
/// the S3 server, and hoard sends none of its bytes; entries of several chunks, Azure ranges
/// and HEAD still stream through hoard.
#[test]
fn direct_downloads_send_the_real_client_to_the_object_store() {
    let bucket = emulators::s3().bucket();
    let backend = Backend::sqlite().with_storage(format!("s3://{bucket}"), s3_env());
    let data = tempfile::tempdir().unwrap();
    let secret = common::secret_file(data.path());
    let mut args = vec![
        "--token-hs256-secret-file",
        secret.to_str().unwrap(),
        "--direct-downloads",
    ];
    args.extend(backend.args());
    let hoard = Hoard::start_with_env(data.path(), &args, backend.env());
    let (srv, t) = (hoard.base.as_str(), main_token());
    let ws = Workspace::new();
    let sum = ws.write_random("deps/data.bin", MIB, 90);
    saved_id(&ws.save(srv, &t, "direct", &["deps"]).0, "save");
    ws.remove("deps");
    let (res, out) = ws.restore(srv, &t, "direct", &[], &["deps"]);
    assert_eq!(res, "direct", "{out}");
    assert_eq!(sha256_file(&ws.path("deps/data.bin")), sum);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let entries = "hoard_http_requests_total{route=\"/_blob/entries/{id}\"";
        assert_eq!(
            metric(&http, srv, &format!("{entries},status=\"3xx\"}}")).await,
            1.0
        );
        assert_eq!(
            metric(&http, srv, &format!("{entries},status=\"2xx\"}}")).await,
            0.0
        );
        assert_eq!(
            metric(&http, srv, "hoard_downloaded_bytes_total").await,
            0.0
        );

        // An entry of two blocks: streamed, whole and by range.
        let link = reserve_at(&http, srv, &t, "two-blocks").await;
        let payload = random_bytes(300_000, 91);
        for (id, part) in [
            ("QUFBQQ==", &payload[..100_000]),
            ("QkJCQg==", &payload[100_000..]),
        ] {
            let put = http
                .put(format!(
                    "{link}&comp=block&blockid={}",
                    common::percent_encode(id)
                ))
                .body(part.to_vec())
                .send()
                .await
                .unwrap();
            assert_eq!(put.status(), 201);
        }
        let list = "<BlockList><Latest>QUFBQQ==</Latest><Latest>QkJCQg==</Latest></BlockList>";
        let put = http
            .put(format!("{link}&comp=blocklist"))
            .body(list)
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), 201);
        let url = finalize_and_find(&http, srv, &t, "two-blocks", payload.len()).await;
        let whole = http.get(&url).send().await.unwrap();
        assert_eq!(whole.status(), 200, "two chunks stream through hoard");
        assert_eq!(whole.bytes().await.unwrap(), payload);

        // The one-chunk entry: Range is redirected (the store serves ranges itself); x-ms-range
        // and HEAD are answered here.
        let link = reserve_at(&http, srv, &t, "one-chunk").await;
        let put = http
            .put(&link)
            .header("x-ms-blob-type", "BlockBlob")
            .body(payload.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), 201);
        let url = finalize_and_find(&http, srv, &t, "one-chunk", payload.len()).await;
        let ranged = http
            .get(&url)
            .header("range", "bytes=0-9")
            .send()
            .await
            .unwrap();
        assert_eq!(ranged.status(), 307);
        let store_url = ranged.headers()["location"].to_str().unwrap().to_owned();
        assert!(
            store_url.starts_with(&emulators::s3().endpoint),
            "{store_url}"
        );
        let from_store = http
            .get(&store_url)
            .header("range", "bytes=0-9")
            .send()
            .await
            .unwrap();
        assert_eq!(from_store.status(), 206);
        let azure = http
            .get(&url)
            .header("x-ms-range", "bytes=0-9")
            .send()
            .await
            .unwrap();
        assert_eq!(azure.status(), 206);
        let from_store = from_store.bytes().await.unwrap();
        assert_eq!(from_store, payload[..10]);
        assert_eq!(azure.bytes().await.unwrap(), from_store);
        let head = http.head(&url).send().await.unwrap();
        assert_eq!(head.status(), 200);
    });
}

/// Cache service v1 on object storage: the real 3.2.4 client and 6.3.0 forced onto v1 send
/// 32 MiB chunked PATCHes of unknown length, which take the buffered multipart path to S3.
#[test]
fn v1_clients_save_and_restore_large_entries_on_s3() {
    let bucket = emulators::s3().bucket();
    let backend = Backend::sqlite().with_storage(format!("s3://{bucket}/v1"), s3_env());
    let data = tempfile::tempdir().unwrap();
    let hoard = Hoard::start_on(data.path(), &backend);
    let t = main_token();
    let ws = Workspace::new();
    for (n, via) in [Via::V1With3, Via::V1With6].into_iter().enumerate() {
        let key = format!("v1-large-{n}");
        let sum = ws.write_random("v1/large.bin", 40 * MIB, 95 + n as u64);
        let (res, out) = ws.run_via(via, &hoard.base, &t, &["save", &key, "v1"]);
        saved_id(&res, &out);
        ws.remove("v1");
        let (res, out) = ws.run_via(via, &hoard.base, &t, &["restore", &key, "v1"]);
        assert_eq!(res, key.as_str(), "{via:?}: {out}");
        assert_eq!(sha256_file(&ws.path("v1/large.bin")), sum, "{via:?}");
    }
    wait_until(|| v1_patches(&hoard) >= 4);
    assert!(v1_patches(&hoard) >= 4, "two PATCHes per save at least");
}

/// The admin token of the provenance tests.
const ADMIN: &str = "provenance-admin-token-0123456789";

/// An admin API call: its status and JSON answer.
fn admin(method: reqwest::Method, base: &str, path: &str) -> (u16, Value) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(admin_call(method, base, path))
}

/// [`admin`] on the caller's runtime.
async fn admin_call(method: reqwest::Method, base: &str, path: &str) -> (u16, Value) {
    let res = reqwest::Client::new()
        .request(method, format!("{base}/_hoard/api/v1/{path}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    common::json_of(res).await
}

/// The listed entries of repository `repo`, by key.
fn entries_by_key(base: &str, repo: &str) -> std::collections::BTreeMap<String, Value> {
    let (status, list) = admin(
        reqwest::Method::GET,
        base,
        &format!("caches?repository={repo}&per_page=100"),
    );
    assert_eq!(status, 200, "{list}");
    list["actions_caches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["key"].as_str().unwrap().to_owned(), e.clone()))
        .collect()
}

/// A token of repository 7001 (octo/app) for `grants`, issued to `run` and `job` with `sub`.
fn run_token(grants: &[(&str, u8)], sub: &str, run: &str, job: &str) -> String {
    let mut c = common::claims("7001", grants);
    c["repository"] = "octo/app".into();
    c["sub"] = sub.into();
    c["scp"] = format!("Actions.Runner:1:2 Actions.Results:{run}:{job}").into();
    common::sign_hs256(&c)
}

/// Issue #23, points 1 and 2, with the real client: a push to main and a pull request's run
/// save; every entry shows who wrote it (through another replica on a shared database, and
/// after a restart on SQLite); a dry run of a purge by run deletes nothing and names what the
/// purge then deletes; the purged run's entries miss and everything else restores
/// byte-identical.
fn provenance_and_purge_by_run_for_the_real_client_with(server: Option<Server>) {
    let Some(backend) = Backend::create(server) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let start = || {
        let secret = common::secret_file(data.path());
        let mut args = vec![
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--admin-token",
            ADMIN,
            "--signing-key",
            "provenance-shares-this-signing-key-0123456",
        ];
        args.extend(backend.args());
        Hoard::start_with_env(data.path(), &args, backend.env())
    };
    let writer = start();
    // With a shared database, a second replica shows what the first recorded; on SQLite the
    // same process shows it (and again after a restart, below).
    let reader = server.map(|_| start());
    let shown_by = reader.as_ref().unwrap_or(&writer).base.clone();

    const PR: &str = "refs/pull/55/merge";
    let main_sub = "repo:octo/app:ref:refs/heads/main";
    let pr_sub = "repo:octo/app:pull_request";
    let main = run_token(&[(MAIN, 3)], main_sub, "run-main-1", "job-11");
    let pull = run_token(&[(PR, 3), (MAIN, 1)], pr_sub, "run-pr-55", "job-99");
    let ws = Workspace::new();
    let main_sum = ws.write_random("main/deps.bin", 70_000, 230);
    saved_id(
        &ws.save(&writer.base, &main, "deps-main", &["main"]).0,
        "main saves",
    );
    ws.write_random("pr/deps.bin", 50_000, 231);
    saved_id(
        &ws.save(&writer.base, &pull, "deps-pr-1", &["pr"]).0,
        "PR saves",
    );
    ws.write_random("pr/deps.bin", 40_000, 232);
    saved_id(
        &ws.save(&writer.base, &pull, "deps-pr-2", &["pr"]).0,
        "PR saves again",
    );

    let entries = entries_by_key(&shown_by, "octo/app");
    assert_eq!(entries.len(), 3, "{entries:?}");
    for (key, sub, run, job, scope) in [
        ("deps-main", main_sub, "run-main-1", "job-11", MAIN),
        ("deps-pr-1", pr_sub, "run-pr-55", "job-99", PR),
        ("deps-pr-2", pr_sub, "run-pr-55", "job-99", PR),
    ] {
        let e = &entries[key];
        assert_eq!(e["ref"], scope, "{e}");
        let by = &e["written_by"];
        assert_eq!(by["kind"], "hs256", "{e}");
        assert_eq!(by["subject"], sub, "{e}");
        assert_eq!(
            (&by["run_id"], &by["job_id"]),
            (&run.into(), &job.into()),
            "{e}"
        );
        assert_eq!(by["address"], "127.0.0.1", "{e}");
        assert_eq!(by["issuer"], "", "an HS256 token without iss: {e}");
        // Each save is one Put Blob here, so the digest is its bytes' SHA-256.
        assert!(e["digest"].as_str().unwrap().starts_with("sha256:"), "{e}");
    }
    let id = |key: &str| entries[key]["id"].as_i64().unwrap();
    let pr_ids = {
        let mut ids = vec![id("deps-pr-1"), id("deps-pr-2")];
        ids.sort();
        ids
    };

    // The dry run deletes nothing and names what the purge then deletes.
    let (status, dry) = admin(
        reqwest::Method::DELETE,
        &shown_by,
        "caches?run_id=run-pr-55&dry_run=true",
    );
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert_eq!(dry["deleted"], 2, "{dry}");
    assert_eq!(dry["ids"], serde_json::json!(pr_ids), "{dry}");
    assert_eq!(
        entries_by_key(&shown_by, "octo/app").len(),
        3,
        "a dry run deletes nothing"
    );
    let (status, purged) = admin(
        reqwest::Method::DELETE,
        &shown_by,
        "caches?run_id=run-pr-55",
    );
    assert_eq!(status, 200, "{purged}");
    assert_eq!(purged["dry_run"], false, "{purged}");
    assert_eq!(
        purged["ids"], dry["ids"],
        "the purge deletes what the dry run named"
    );
    let left = entries_by_key(&shown_by, "octo/app");
    assert_eq!(left.keys().collect::<Vec<_>>(), ["deps-main"], "{left:?}");

    // The purged run's entries miss for the real client, through either replica; the rest
    // restores byte-identical, for main and for the pull request (which reads main).
    let mut bases = vec![writer.base.clone(), shown_by.clone()];
    bases.dedup();
    for base in &bases {
        for key in ["deps-pr-1", "deps-pr-2"] {
            let ws = Workspace::new();
            let (res, out) = ws.restore(base, &pull, key, &[], &["pr"]);
            assert_eq!(res, Value::Null, "{key} was purged: {out}");
        }
        for token in [&main, &pull] {
            let ws = Workspace::new();
            let (res, out) = ws.restore(base, token, "deps-main", &[], &["main"]);
            assert_eq!(res, "deps-main", "{out}");
            assert_eq!(sha256_file(&ws.path("main/deps.bin")), main_sum);
        }
    }

    // The record survives a restart.
    drop(reader);
    drop(writer);
    let restarted = start();
    let kept = entries_by_key(&restarted.base, "octo/app");
    assert_eq!(
        kept["deps-main"]["written_by"]["run_id"], "run-main-1",
        "{kept:?}"
    );
}

#[test]
fn provenance_and_purge_by_run_for_the_real_client() {
    provenance_and_purge_by_run_for_the_real_client_with(None);
}

#[test]
fn provenance_and_purge_by_run_for_the_real_client_across_replicas_on_postgres() {
    provenance_and_purge_by_run_for_the_real_client_with(Some(Server::Postgres));
}

#[test]
fn provenance_and_purge_by_run_for_the_real_client_across_replicas_on_mariadb() {
    provenance_and_purge_by_run_for_the_real_client_with(Some(Server::MySql));
}

/// GitHub's own example deliveries (`@octokit/webhooks-examples`, pinned in
/// tests/e2e/package.json): the first of `event` whose action is `action` (`None`: any).
fn github_example(event: &str, action: Option<&str>) -> Value {
    static ALL: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    let all = ALL.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/e2e/node_modules/@octokit/webhooks-examples/api.github.com/index.json");
        let text =
            std::fs::read(&path).expect("the webhook examples: run `npm ci --prefix tests/e2e`");
        serde_json::from_slice(&text).unwrap()
    });
    all.as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == event)
        .and_then(|e| {
            e["examples"].as_array().unwrap().iter().find(|x| {
                action.is_none_or(|a| x["action"] == a)
                    && (event != "push" || x["deleted"] == false)
            })
        })
        .unwrap_or_else(|| panic!("no {event} {action:?} example"))
        .clone()
}

const WEBHOOK_SECRET: &str = "webhook-secret-for-tests";

/// Delivers `body` as GitHub does: signed with `secret` (`None`: no signature), under `id`.
async fn deliver(
    http: &reqwest::Client,
    server: &str,
    event: &str,
    id: &str,
    body: &Value,
    secret: Option<&str>,
) -> (u16, Value) {
    use hmac::Mac;
    let body = serde_json::to_vec(body).unwrap();
    let mut req = http
        .post(format!("{server}/_hoard/webhooks/github"))
        .header("x-github-event", event)
        .header("x-github-delivery", id)
        .header("content-type", "application/json");
    if let Some(secret) = secret {
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(&body);
        let signature = hex::encode(mac.finalize().into_bytes());
        req = req.header("x-hub-signature-256", format!("sha256={signature}"));
    }
    let res = req.body(body).send().await.unwrap();
    let status = res.status().as_u16();
    let text = res.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn merge_group(action: &str, repo: u64, head_sha: &str, head_ref: &str) -> Value {
    let mut e = github_example("merge_group", Some("checks_requested"));
    e["action"] = action.into();
    e["repository"]["id"] = repo.into();
    e["merge_group"]["head_sha"] = head_sha.into();
    e["merge_group"]["head_ref"] = head_ref.into();
    e["merge_group"]["base_ref"] = MAIN.into();
    e
}

fn push(repo: u64, git_ref: &str, after: &str) -> Value {
    let mut e = github_example("push", None);
    e["repository"]["id"] = repo.into();
    e["ref"] = git_ref.into();
    e["after"] = after.into();
    e
}

fn pull_request(action: &str, repo: u64, number: u64, head_sha: &str, fork: bool) -> Value {
    let mut e = github_example("pull_request", Some(action));
    e["action"] = action.into();
    e["number"] = number.into();
    e["repository"]["id"] = repo.into();
    let pr = &mut e["pull_request"];
    pr["merged"] = (action == "closed").into();
    pr["head"]["sha"] = head_sha.into();
    pr["head"]["repo"]["id"] = (if fork { repo + 1000 } else { repo }).into();
    pr["head"]["repo"]["fork"] = fork.into();
    pr["base"]["ref"] = "main".into();
    e
}

/// Issue #58 through the real client and GitHub's example deliveries: a merge queue's caches
/// become main's when the push that merges the group arrives (in either order), a destroyed
/// group's go, a merged pull request's are promoted only where the policy opts in and never
/// from a fork, a frozen main receives nothing, and bad signatures, replays, strangers and a
/// burst change nothing wrongly.
#[tokio::test(flavor = "multi_thread")]
async fn merge_queue_and_pull_request_caches_survive_the_merge_for_the_real_client() {
    const QUEUE: &str =
        "refs/heads/gh-readonly-queue/main/pr-104-929f8209d40f77f4abc622a499c93a83babdbe64";
    const QUEUE_2: &str =
        "refs/heads/gh-readonly-queue/main/pr-105-1111111111111111111111111111111111111111";
    const DROPPED: &str =
        "refs/heads/gh-readonly-queue/main/pr-106-2222222222222222222222222222222222222222";
    let data = tempfile::tempdir().unwrap();
    let secret_file = data.path().join("webhook-secret");
    std::fs::write(&secret_file, format!("{WEBHOOK_SECRET}\n")).unwrap();
    let policy = data.path().join("policy.toml");
    std::fs::write(
        &policy,
        "[[rule]]\nrepository = \"3\"\nscope = \"refs/heads/main\"\naccess = \"read-only\"\n\n\
         [[promotion]]\nrepository = \"1\"\nmerged_pull_requests = true\n",
    )
    .unwrap();
    let hs256 = common::secret_file(data.path());
    let hoard = Hoard::start_with(
        data.path(),
        &[
            "--token-hs256-secret-file",
            hs256.to_str().unwrap(),
            "--github-webhook-secret-file",
            secret_file.to_str().unwrap(),
            "--policy-file",
            policy.to_str().unwrap(),
        ],
    );
    let srv = hoard.base.as_str();
    let http = reqwest::Client::new();
    let send = |event: &'static str, id: &'static str, body: Value| {
        let http = http.clone();
        let srv = srv.to_owned();
        async move { deliver(&http, &srv, event, id, &body, Some(WEBHOOK_SECRET)).await }
    };
    let main = token("1", &[(MAIN, 3)]);
    let queue = token("1", &[(QUEUE, 3), (MAIN, 1)]);
    let restore_sha = |token: &str, key: &str, restore_keys: &[&str]| -> Option<(String, String)> {
        let ws = Workspace::new();
        let (res, _) = ws.restore(srv, token, key, restore_keys, &["data.bin"]);
        res.as_str()
            .map(|matched| (matched.to_owned(), sha256_file(&ws.path("data.bin"))))
    };

    // The merge queue's run saves three entries in the group's branch.
    let ws = Workspace::new();
    let mut saved = Vec::new();
    for (i, key) in ["deps-linux-a", "deps-linux-b", "tools-c"]
        .iter()
        .enumerate()
    {
        let sha = ws.write_random("data.bin", 64 * 1024 + i, 60 + i as u64);
        saved_id(&ws.save(srv, &queue, key, &["data.bin"]).0, key);
        saved.push((*key, sha));
    }
    assert_eq!(
        restore_sha(&main, "deps-linux-a", &[]),
        None,
        "main cannot read the queue's"
    );

    // The group, then the push that lands its commit on main.
    let head = "2ffea6db159f6b6c47a24e778fb9ef40cf6b1c7d";
    let (status, body) = send(
        "merge_group",
        "d-1",
        merge_group("checks_requested", 1, head, QUEUE),
    )
    .await;
    assert_eq!(
        (status, body["promoted"].as_u64()),
        (200, Some(0)),
        "{body}"
    );
    assert_eq!(
        restore_sha(&main, "deps-linux-a", &[]),
        None,
        "not before the merge lands"
    );
    let (status, body) = send("push", "d-2", push(1, MAIN, head)).await;
    assert_eq!(
        (status, body["promoted"].as_u64()),
        (200, Some(3)),
        "{body}"
    );
    for (key, sha) in &saved {
        assert_eq!(
            restore_sha(&main, key, &[]),
            Some((key.to_string(), sha.clone())),
            "the next run on main restores {key}, byte for byte"
        );
    }
    let by_prefix = restore_sha(&main, "deps-linux-z", &["deps-linux-"]).unwrap();
    assert!(
        by_prefix.0.starts_with("deps-linux-"),
        "by restore key: {by_prefix:?}"
    );
    // A redelivery is answered and not applied again.
    let (status, body) = send("push", "d-2", push(1, MAIN, head)).await;
    assert_eq!(
        (status, body["seen"].as_bool()),
        (200, Some(true)),
        "{body}"
    );

    // Out of order: the push first, then the group it lands.
    let queue_2 = token("1", &[(QUEUE_2, 3), (MAIN, 1)]);
    let late_sha = ws.write_random("data.bin", 5000, 70);
    saved_id(&ws.save(srv, &queue_2, "late", &["data.bin"]).0, "late");
    let head_2 = "3333333333333333333333333333333333333333";
    let (_, body) = send("push", "d-3", push(1, MAIN, head_2)).await;
    assert_eq!(body["promoted"], 0, "{body}");
    let (_, body) = send(
        "merge_group",
        "d-4",
        merge_group("checks_requested", 1, head_2, QUEUE_2),
    )
    .await;
    assert_eq!(body["promoted"], 1, "{body}");
    assert_eq!(
        restore_sha(&main, "late", &[]),
        Some(("late".into(), late_sha))
    );

    // A push whose commit is no group's promotes nothing.
    let (_, body) = send(
        "push",
        "d-5",
        push(1, MAIN, "4444444444444444444444444444444444444444"),
    )
    .await;
    assert_eq!(body["promoted"], 0, "{body}");

    // A group dequeued without merging: its entries go at once.
    let dropped = token("1", &[(DROPPED, 3), (MAIN, 1)]);
    ws.write_random("data.bin", 3000, 71);
    saved_id(
        &ws.save(srv, &dropped, "never-merged", &["data.bin"]).0,
        "never-merged",
    );
    let mut destroyed = merge_group(
        "destroyed",
        1,
        "5555555555555555555555555555555555555555",
        DROPPED,
    );
    destroyed["reason"] = "dequeued".into();
    let (status, body) = send("merge_group", "d-6", destroyed).await;
    assert_eq!((status, body["expired"].as_u64()), (200, Some(1)), "{body}");
    assert_eq!(restore_sha(&dropped, "never-merged", &[]), None);

    // A merged pull request of the repository itself (opted in by the policy file): what its
    // final head's runs saved is promoted, not what an earlier head's did.
    let pull = token("1", &[("refs/pull/7/merge", 3), (MAIN, 1)]);
    let (first_head, pr_head) = (
        "6565656565656565656565656565656565656565",
        "6666666666666666666666666666666666666666",
    );
    let (status, _) = send(
        "pull_request",
        "d-7",
        pull_request("opened", 1, 7, first_head, false),
    )
    .await;
    assert_eq!(status, 200);
    ws.write_random("data.bin", 4000, 75);
    saved_id(
        &ws.save(srv, &pull, "pr-stale", &["data.bin"]).0,
        "pr-stale",
    );
    let (status, _) = send(
        "pull_request",
        "d-7b",
        pull_request("synchronize", 1, 7, pr_head, false),
    )
    .await;
    assert_eq!(status, 200);
    let pr_sha = ws.write_random("data.bin", 4000, 72);
    saved_id(&ws.save(srv, &pull, "pr-deps", &["data.bin"]).0, "pr-deps");
    let (status, body) = send(
        "pull_request",
        "d-8",
        pull_request("closed", 1, 7, pr_head, false),
    )
    .await;
    assert_eq!(
        (status, body["promoted"].as_u64()),
        (200, Some(1)),
        "{body}"
    );
    assert_eq!(
        restore_sha(&main, "pr-stale", &[]),
        None,
        "an earlier head's"
    );
    assert_eq!(
        restore_sha(&main, "pr-deps", &[]),
        Some(("pr-deps".into(), pr_sha))
    );

    // ... but never a fork's.
    let forked = token("1", &[("refs/pull/8/merge", 3), (MAIN, 1)]);
    ws.write_random("data.bin", 4000, 73);
    saved_id(
        &ws.save(srv, &forked, "fork-deps", &["data.bin"]).0,
        "fork-deps",
    );
    let (_, body) = send(
        "pull_request",
        "d-9",
        pull_request(
            "closed",
            1,
            8,
            "7777777777777777777777777777777777777777",
            true,
        ),
    )
    .await;
    assert_eq!(body["promoted"], 0, "{body}");
    assert_eq!(restore_sha(&main, "fork-deps", &[]), None);

    // A frozen main receives nothing.
    let frozen_queue = token("3", &[(QUEUE, 3), (MAIN, 1)]);
    ws.write_random("data.bin", 2000, 74);
    saved_id(
        &ws.save(srv, &frozen_queue, "frozen", &["data.bin"]).0,
        "frozen",
    );
    let frozen_head = "8888888888888888888888888888888888888888";
    send(
        "merge_group",
        "d-10",
        merge_group("checks_requested", 3, frozen_head, QUEUE),
    )
    .await;
    let (_, body) = send("push", "d-11", push(3, MAIN, frozen_head)).await;
    assert_eq!(body["promoted"], 0, "{body}");
    assert_eq!(restore_sha(&token("3", &[(MAIN, 3)]), "frozen", &[]), None);

    // Bad signatures change nothing; unknown events are accepted and ignored.
    let group = merge_group(
        "checks_requested",
        1,
        "9999999999999999999999999999999999999999",
        QUEUE,
    );
    for secret in [None, Some("another-secret")] {
        let (status, body) = deliver(&http, srv, "merge_group", "d-12", &group, secret).await;
        assert_eq!(status, 401, "{body}");
        assert!(body["message"].is_string(), "{body}");
    }
    let (status, body) = send("merge_group", "d-12", group.clone()).await;
    assert_eq!(
        (status, body["seen"].as_bool()),
        (200, None),
        "refused deliveries were not recorded: {body}"
    );
    // A relay replaying a signed body under another id: the same delivery.
    let (status, body) = send("merge_group", "d-12-replayed", group).await;
    assert_eq!(
        (status, body["seen"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    let (status, _) = send("issues", "d-13", github_example("issues", None)).await;
    assert_eq!(status, 202);
    let (status, body) = send("push", "d-14", serde_json::json!({"ref": 5})).await;
    assert_eq!(status, 400, "{body}");

    // A burst: two thousand pushes of unknown commits, 64 at a time, none failing.
    use futures_util::StreamExt;
    let answers: Vec<(u16, Value)> = futures_util::stream::iter(0..2000)
        .map(|i| {
            let http = http.clone();
            async move {
                let id = format!("burst-{i}");
                let after = format!("{i:040x}");
                deliver(
                    &http,
                    srv,
                    "push",
                    &id,
                    &push(1, MAIN, &after),
                    Some(WEBHOOK_SECRET),
                )
                .await
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    for (status, body) in answers {
        assert_eq!(
            (status, body["promoted"].as_u64()),
            (200, Some(0)),
            "{body}"
        );
    }
}

/// A small npm monorepo of two packages whose `build` writes `dist/out.txt` with the time it
/// ran (so a replayed output is told from a rebuilt one), set up for turbo and for nx, and
/// committed to git as both expect.
struct Monorepo {
    dir: tempfile::TempDir,
}

impl Monorepo {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let write = |rel: &str, text: &str| {
            let path = root.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "package.json",
            r#"{"name":"mono","private":true,"packageManager":"npm@10.8.2","workspaces":["packages/*"]}"#,
        );
        write(
            "turbo.json",
            r#"{"tasks":{"build":{"outputs":["dist/**"]}}}"#,
        );
        write("nx.json", r#"{"targetDefaults":{"build":{"cache":true}}}"#);
        // nx runs from the workspace's own modules: those installed in tests/e2e.
        std::os::unix::fs::symlink(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/node_modules"),
            root.join("node_modules"),
        )
        .unwrap();
        write(".gitignore", "dist\n.turbo\n.nx\nnode_modules\n");
        for name in ["app", "lib"] {
            write(
                &format!("packages/{name}/package.json"),
                &format!(
                    r#"{{"name":"{name}","version":"1.0.0","scripts":{{"build":"node -e \"require('fs').mkdirSync('dist',{{recursive:true}});require('fs').writeFileSync('dist/out.txt','{name} '+process.hrtime.bigint())\""}},"nx":{{"targets":{{"build":{{"cache":true,"outputs":["{{projectRoot}}/dist"]}}}}}}}}"#
                ),
            );
        }
        for args in [
            &["init", "-q", "."][..],
            &["add", "-A"],
            &[
                "-c",
                "user.email=ci@example.com",
                "-c",
                "user.name=ci",
                "commit",
                "-qm",
                "init",
            ],
        ] {
            let status = Command::new("git")
                .args(args)
                .current_dir(root)
                .status()
                .unwrap();
            assert!(status.success(), "git {args:?}");
        }
        Self { dir }
    }

    /// Removes the outputs and both tools' local caches.
    fn clean(&self) {
        for dir in ["packages/app/dist", "packages/lib/dist", ".turbo", ".nx"] {
            let _ = std::fs::remove_dir_all(self.dir.path().join(dir));
        }
    }

    /// The outputs of both packages.
    fn outputs(&self) -> Vec<String> {
        ["app", "lib"]
            .iter()
            .map(|p| {
                let out = self.dir.path().join(format!("packages/{p}/dist/out.txt"));
                std::fs::read_to_string(out).unwrap()
            })
            .collect()
    }

    /// A tool installed in tests/e2e.
    fn tool(name: &str) -> PathBuf {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/e2e/node_modules/.bin")
            .join(name);
        assert!(
            path.exists(),
            "{name} is not installed: run `npm ci --prefix tests/e2e` (scripts/test does)"
        );
        path
    }

    /// `nx run-many -t build` from clean local state with hoard as its self-hosted remote
    /// cache and `token` as its access token: how many of the 2 tasks were remote cache hits,
    /// and the outputs.
    fn nx(&self, server: &str, token: &str) -> (usize, Vec<String>) {
        self.clean();
        let out = Command::new(Self::tool("nx"))
            .args(["run-many", "-t", "build"])
            .current_dir(self.dir.path())
            .env("NX_SELF_HOSTED_REMOTE_CACHE_SERVER", server)
            .env("NX_SELF_HOSTED_REMOTE_CACHE_ACCESS_TOKEN", token)
            // Its local cache would otherwise outlive `clean` (in ~/.nx).
            .env("NX_CACHE_DIRECTORY", self.dir.path().join(".nx/cache"))
            .env(
                "NX_WORKSPACE_DATA_DIRECTORY",
                self.dir.path().join(".nx/data"),
            )
            .env("NX_DAEMON", "false")
            .env("NX_NO_CLOUD", "true")
            .env("NX_TUI", "false")
            .env("NO_COLOR", "1")
            .env_remove("CI")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "nx failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // "✔  nx run app:build  [remote cache]"
        let hits = stdout.matches("[remote cache]").count();
        assert!(stdout.contains("Cache:"), "no summary in\n{stdout}");
        (hits, self.outputs())
    }

    /// `turbo run build` from clean local state (no outputs, no local cache) against hoard's
    /// remote cache only, as `team` with `token`: how many of the 2 tasks were cache hits, and
    /// the outputs.
    fn build(&self, server: &str, token: &str, team: &str) -> (usize, Vec<String>) {
        self.clean();
        let root = self.dir.path();
        let out = Command::new(Self::tool("turbo"))
            .args(["run", "build", "--cache=remote:rw"])
            .arg(format!("--api={server}"))
            .arg(format!("--token={token}"))
            .arg(format!("--team={team}"))
            .current_dir(root)
            .env("TURBO_TELEMETRY_DISABLED", "1")
            .env("DO_NOT_TRACK", "1")
            .env("NO_COLOR", "1")
            .env_remove("TURBO_API")
            .env_remove("TURBO_TOKEN")
            .env_remove("TURBO_TEAM")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "turbo failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cached = stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("Cached:"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no Cached: line in\n{stdout}"));
        (cached, self.outputs())
    }
}

/// Issue #60, Turborepo: the real `turbo` 2.x with `--api` at hoard and the job's runtime token
/// as `--token`. A second build from clean local state replays every task from hoard with the
/// first build's outputs; a pull request's artifacts are invisible to main while the pull
/// request reads main's; a read-only token writes nothing; the artifacts are entries of their
/// own kind in the admin listing, counted as hits, and go by the usual purge filters.
#[test]
fn turbo_caches_its_tasks_in_hoard_under_githubs_scopes() {
    const PR: &str = "refs/pull/8/merge";
    let data = tempfile::tempdir().unwrap();
    let secret = common::secret_file(data.path());
    let hoard = Hoard::start_with(
        data.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--admin-token",
            ADMIN,
        ],
    );
    let srv = hoard.base.as_str();
    let main = token("1", &[(MAIN, 3)]);
    let pull = token("1", &[(PR, 3), (MAIN, 1)]);
    let read_only = token("1", &[(MAIN, 1)]);
    let repo = Monorepo::new();

    let (cached, first) = repo.build(srv, &main, "web");
    assert_eq!(cached, 0, "a cold cache");
    // The second build as a workflow runs it: with the tool token its job exchanged its
    // runtime token for (docs/build-tools/).
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (status, minted) = rt.block_on(async {
        let res = reqwest::Client::new()
            .post(format!("{srv}/_hoard/tools/token"))
            .bearer_auth(&main)
            .send()
            .await
            .unwrap();
        common::json_of(res).await
    });
    assert_eq!(status, 200, "{minted}");
    let tool_token = minted["token"].as_str().unwrap();
    let (cached, second) = repo.build(srv, tool_token, "web");
    assert_eq!(cached, 2, "every task a remote hit");
    assert_eq!(second, first, "the outputs replayed, not rebuilt");

    // A pull request reads main's artifacts; what it writes stays in its own scope.
    assert_eq!(
        repo.build(srv, &pull, "web").0,
        2,
        "main's artifacts serve the PR"
    );
    assert_eq!(repo.build(srv, &pull, "pr-team").0, 0);
    assert_eq!(
        repo.build(srv, &pull, "pr-team").0,
        2,
        "the PR reads its own"
    );
    assert_eq!(
        repo.build(srv, &main, "pr-team").0,
        0,
        "main never reads a pull request's artifacts"
    );
    // A read-only token reads and writes nothing (turbo goes on, building).
    assert_eq!(repo.build(srv, &read_only, "ro-team").0, 0);
    assert_eq!(
        repo.build(srv, &read_only, "ro-team").0,
        0,
        "nothing was written"
    );
    let (status, error) = rt.block_on(async {
        let res = reqwest::Client::new()
            .put(format!("{srv}/v8/artifacts/0123456789abcdef?slug=ro-team"))
            .bearer_auth(&read_only)
            .body("x")
            .send()
            .await
            .unwrap();
        common::json_of(res).await
    });
    assert_eq!(status, 403, "{error}");
    assert!(error["error"]["message"].is_string(), "{error}");

    // Entries of their own kind: listed with their tool, their hits counted (written within a
    // second of the reads).
    let admin = |method: reqwest::Method, path: &str| -> Value {
        let (status, answer) = rt.block_on(admin_call(method, srv, path));
        assert_eq!(status, 200, "{path}: {answer}");
        answer
    };
    let web_hits = |listed: &Value| -> Vec<u64> {
        listed["actions_caches"]
            .as_array()
            .map_or(Vec::new(), |all| {
                all.iter()
                    .filter(|e| e["key"].as_str().unwrap().starts_with("turbo/web/"))
                    .map(|e| e["hits"].as_u64().unwrap())
                    .collect()
            })
    };
    let listed = rt.block_on(common::poll(
        Duration::from_secs(20),
        async || {
            admin_call(
                reqwest::Method::GET,
                srv,
                "caches?repository=1&per_page=100",
            )
            .await
            .1
        },
        |listed| web_hits(listed) == [2, 2],
    ));
    let entries = listed["actions_caches"].as_array().unwrap();
    let web: Vec<&Value> = entries
        .iter()
        .filter(|e| e["key"].as_str().unwrap().starts_with("turbo/web/"))
        .collect();
    assert_eq!(web.len(), 2, "{listed}");
    for e in &web {
        assert_eq!(e["tool"], "turbo");
        assert_eq!(e["ref"], MAIN);
        assert_eq!(e["hits"], 2, "read by the second build and the PR's: {e}");
    }
    // The pull request's two, and main's own two written after its misses.
    let in_ref = |team: &str, scope: &str| {
        entries
            .iter()
            .filter(|e| {
                e["key"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("turbo/{team}/"))
            })
            .filter(|e| e["ref"] == scope)
            .count()
    };
    assert_eq!((in_ref("pr-team", PR), in_ref("pr-team", MAIN)), (2, 2));
    assert!(
        !entries
            .iter()
            .any(|e| e["key"].as_str().unwrap().starts_with("turbo/ro-team/")),
        "{listed}"
    );

    // Counted per tool in the statistics: the artifacts' family is the tool's and team's (a row
    // per class of ref: main's builds and the pull request's).
    let web = |families: &Value, field: &str| -> u64 {
        families["families"].as_array().map_or(0, |all| {
            all.iter()
                .filter(|f| f["family"] == "turbo/web/")
                .map(|f| f[field].as_u64().unwrap())
                .sum()
        })
    };
    let families = rt.block_on(common::poll(
        Duration::from_secs(20),
        async || {
            let path = "stats/families?repository=1&since=24h";
            admin_call(reqwest::Method::GET, srv, path).await.1
        },
        |families| web(families, "exact_hits") == 4,
    ));
    assert_eq!(
        (
            web(&families, "exact_hits"),
            web(&families, "misses"),
            web(&families, "saves")
        ),
        (4, 2, 2),
        "{families}"
    );

    // The usual purge filters: main's artifacts go, and the next build rebuilds.
    let deleted = admin(
        reqwest::Method::DELETE,
        "caches?repository=1&key=turbo/web/",
    );
    assert_eq!(deleted["deleted"], 2, "{deleted}");
    let (cached, rebuilt) = repo.build(srv, &main, "web");
    assert_eq!(cached, 0, "purged artifacts are gone");
    assert_ne!(rebuilt, first);
}

/// Issue #60, Nx: the real `nx` with hoard as its self-hosted remote cache
/// (`NX_SELF_HOSTED_REMOTE_CACHE_SERVER`) and the job's runtime token as its access token. A
/// second run from clean local state replays both tasks from hoard; a pull request reads main's
/// and its own writes never reach main; the records are listed as nx's.
#[test]
fn nx_caches_its_tasks_in_hoard_under_githubs_scopes() {
    let data = tempfile::tempdir().unwrap();
    let secret = common::secret_file(data.path());
    let hoard = Hoard::start_with(
        data.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--admin-token",
            ADMIN,
        ],
    );
    let srv = hoard.base.as_str();
    let repo = Monorepo::new();
    let (hits, first) = repo.nx(srv, &token("1", &[(MAIN, 3)]));
    assert_eq!(hits, 0, "a cold cache");
    let (hits, second) = repo.nx(srv, &token("1", &[(MAIN, 3)]));
    assert_eq!(hits, 2, "every task a remote hit");
    assert_eq!(second, first, "the outputs replayed, not rebuilt");
    // In another repository: a pull request writes its own; main never reads them.
    let pull = token("2", &[("refs/pull/3/merge", 3), (MAIN, 1)]);
    let main_2 = token("2", &[(MAIN, 3)]);
    assert_eq!(
        repo.nx(srv, &pull).0,
        0,
        "another repository's records are not read"
    );
    assert_eq!(repo.nx(srv, &pull).0, 2, "the pull request reads its own");
    assert_eq!(
        repo.nx(srv, &main_2).0,
        0,
        "main never reads a pull request's records"
    );
    assert_eq!(
        repo.nx(srv, &pull).0,
        2,
        "and the pull request reads main's too"
    );

    let (status, listed) = admin(reqwest::Method::GET, srv, "caches?repository=1");
    assert_eq!(status, 200, "{listed}");
    let entries = listed["actions_caches"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{listed}");
    assert!(entries
        .iter()
        .all(|e| e["tool"] == "nx" && e["key"].as_str().unwrap().starts_with("nx/")));
}

/// The signing key an origin's replicas share in the edge test.
const EDGE_ORIGIN_KEY: &str = "edge-origin-replicas-share-this-key-0123456789";

/// One replica of the edge test's origin, on a fixed port so that it can be stopped and
/// started again where the edges look for it.
fn origin_replica(backend: &Backend, data: &Path, port: u16) -> Hoard {
    let secret = common::secret_file(data);
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "--listen",
        listen.as_str(),
        "--token-hs256-secret-file",
        secret.to_str().unwrap(),
        "--signing-key",
        EDGE_ORIGIN_KEY,
        "--admin-token",
        ADMIN,
    ];
    args.extend(backend.args());
    Hoard::start_with_env(data, &args, backend.env())
}

/// A sample of an edge's `/metrics`.
fn edge_metric(edge: &Hoard, name: &str) -> f64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(metric(&reqwest::Client::new(), &edge.base, name))
}

/// Issue #59: three edges in front of an origin of two replicas on PostgreSQL and S3, the real
/// client through each. An entry saved through edge A restores byte for byte through B and C,
/// and a second restore on an edge reads nothing from the origin; a copy damaged on an edge's
/// disk is never served and is fetched again; what the origin purges or quarantines no edge
/// serves afterwards, though it holds the bytes; with the origin stopped, jobs go on (misses,
/// saves refused) and once it is back the edges serve again.
#[test]
fn edges_serve_what_the_origin_decides_fetching_each_entry_once() {
    let Some(backend) = on_s3(Server::Postgres) else {
        return;
    };
    let ports = [emulators::free_port(), emulators::free_port()];
    let origin_dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut replicas: Vec<Hoard> = (0..2)
        .map(|i| origin_replica(&backend, origin_dirs[i].path(), ports[i]))
        .collect();
    let origins = format!(
        "http://127.0.0.1:{},http://127.0.0.1:{}",
        ports[0], ports[1]
    );
    let edge_dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let edges: Vec<Hoard> = edge_dirs
        .iter()
        .map(|dir| {
            // Lookups wait for the origin as long as a loaded machine may need; a stopped
            // origin refuses connections, a miss at once all the same.
            let args = [
                "--origin",
                &origins,
                "--max-bytes",
                "1GiB",
                "--lookup-timeout",
                "30s",
            ];
            Hoard::start_edge(dir.path(), &args)
        })
        .collect();
    let (a, b, c) = (&edges[0], &edges[1], &edges[2]);
    let t = main_token();

    // Saved through A, restored through B and C, byte for byte.
    let ws = Workspace::new();
    let sum = ws.write_random("edge/data.bin", 24 * MIB, 90);
    saved_id(
        &ws.save(&a.base, &t, "edge-big", &["edge"]).0,
        "save through edge A",
    );
    for edge in [b, c] {
        ws.remove("edge");
        let (res, out) = ws.restore(&edge.base, &t, "edge-big", &[], &["edge"]);
        assert_eq!(res, "edge-big", "{out}");
        assert_eq!(sha256_file(&ws.path("edge/data.bin")), sum);
    }
    // The second restore on B reads nothing from the origin.
    let from_origin = edge_metric(b, "hoard_edge_bytes_from_origin_total");
    assert!(
        from_origin >= (24 * MIB) as f64 * 0.9,
        "B fetched the entry once: {from_origin}"
    );
    let hits = edge_metric(b, "hoard_edge_hits_total");
    ws.remove("edge");
    let (res, out) = ws.restore(&b.base, &t, "edge-big", &[], &["edge"]);
    assert_eq!(res, "edge-big", "{out}");
    assert_eq!(sha256_file(&ws.path("edge/data.bin")), sum);
    assert_eq!(
        edge_metric(b, "hoard_edge_bytes_from_origin_total"),
        from_origin
    );
    assert_eq!(edge_metric(b, "hoard_edge_hits_total"), hits + 1.0);

    // A copy damaged on B's disk is never served: the restore is still right, the copy is
    // dropped, and the next restore fetches it again.
    let copies = files_under(&edge_dirs[1].path().join("copies"));
    assert_eq!(copies.len(), 1, "{copies:?}");
    {
        use std::io::{Seek, SeekFrom};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&copies[0])
            .unwrap();
        file.seek(SeekFrom::Start(5 * MIB as u64 + 123)).unwrap();
        file.write_all(b"not what was saved").unwrap();
    }
    for _ in 0..2 {
        ws.remove("edge");
        let (res, out) = ws.restore(&b.base, &t, "edge-big", &[], &["edge"]);
        assert_eq!(res, "edge-big", "{out}");
        assert_eq!(sha256_file(&ws.path("edge/data.bin")), sum);
    }
    assert_eq!(edge_metric(b, "hoard_edge_damaged_copies_total"), 1.0);
    assert!(edge_metric(b, "hoard_edge_bytes_from_origin_total") > from_origin);

    // A purge and a quarantine at the origin take effect on every edge at once, though the
    // edges hold the bytes: the lookup misses and a link handed out before opens nothing.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    for (key, quarantine) in [("edge-purged", false), ("edge-quarantined", true)] {
        let data = random_bytes(3 * MIB, 91);
        let link = rt.block_on(common::save_through(&a.base, key, &data));
        let got =
            rt.block_on(async { http.get(&link).send().await.unwrap().bytes().await.unwrap() });
        assert_eq!(got.as_ref(), &data[..], "served through A");
        let query = format!(
            "caches?repository=1&key={key}{}",
            if quarantine { "&quarantine=true" } else { "" }
        );
        let (status, answer) = admin(reqwest::Method::DELETE, &replicas[0].base, &query);
        assert_eq!(
            (status, answer["deleted"].as_u64()),
            (200, Some(1)),
            "{answer}"
        );
        // Replicas see each other's changes within their lookup cache's TTL (1 s): asked
        // through each edge until they do (a loaded machine's answers may come late).
        for edge in &edges {
            let (looked, old) = rt.block_on(common::poll(
                Duration::from_secs(30),
                async || {
                    let body = serde_json::json!({"key": key, "version": common::VERSION});
                    let looked =
                        twirp(&http, &edge.base, &t, "GetCacheEntryDownloadURL", body).await;
                    let old = http
                        .get(link.replace(&a.base, &edge.base))
                        .send()
                        .await
                        .unwrap();
                    (looked, old.status().as_u16())
                },
                |(looked, old)| looked["ok"] != true && matches!(old, 403 | 404),
            ));
            assert_ne!(looked["ok"], true, "{key}: no edge finds it: {looked}");
            // The origin tells a link to nothing from a forged one no better (403).
            assert!(
                matches!(old, 403 | 404),
                "{key}: a link handed out before opens nothing on any edge: {old}"
            );
        }
    }

    // The origin stopped: lookups are misses and saves are refused, within the bound, and the
    // jobs succeed; started again, the edges serve as before.
    let before_stop = edge_metric(a, "hoard_edge_lookups_total{outcome=\"unanswered\"}");
    for replica in &mut replicas {
        replica.kill_in_place();
    }
    let started = std::time::Instant::now();
    ws.remove("edge");
    let (res, out) = ws.restore(&a.base, &t, "edge-big", &[], &["edge"]);
    assert_eq!(res, Value::Null, "a miss while the origin is down: {out}");
    ws.write_random("small/data.bin", 1000, 92);
    let (res, out) = ws.save(&a.base, &t, "edge-while-down", &["small"]);
    assert_eq!(res, -1, "the save is refused, the job goes on: {out}");
    assert!(out.contains("cache write denied"), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "no retries: {:?}",
        started.elapsed()
    );
    assert!(edge_metric(a, "hoard_edge_lookups_total{outcome=\"unanswered\"}") > before_stop);
    let replicas: Vec<Hoard> = (0..2)
        .map(|i| origin_replica(&backend, origin_dirs[i].path(), ports[i]))
        .collect();
    let ready = rt.block_on(common::poll(
        Duration::from_secs(30),
        async || {
            let asked = http.get(format!("{}/readyz", a.base)).send().await;
            asked.map(|r| r.status().as_u16()).unwrap_or(0)
        },
        |status| *status == 200,
    ));
    assert_eq!(ready, 200, "the edge sees the origin again");
    ws.remove("edge");
    let (res, out) = ws.restore(&a.base, &t, "edge-big", &[], &["edge"]);
    assert_eq!(res, "edge-big", "{out}");
    assert_eq!(sha256_file(&ws.path("edge/data.bin")), sum);
    drop(replicas);
}

/// Issue #59, read-through: the real client restores through a hoard with `--upstream-cache`
/// naming another hoard that stands in for GitHub's cache (v2, its download links redirected to
/// Azure Blob on Azurite by `--direct-downloads`). The first restore misses here, hits upstream
/// and is byte for byte the saved archive; the second is local (the upstream is gone); a pull
/// request's read-through copy is never seen by main's token; with the upstream silent, the
/// restore is a miss within the bound.
#[test]
fn the_real_client_restores_through_hoard_from_the_upstream_cache() {
    let azurite = emulators::azurite();
    let storage = format!("az://{}", azurite.container());
    let upstream_dir = tempfile::tempdir().unwrap();
    let secret = common::secret_file(upstream_dir.path());
    let upstream = Hoard::start_with_env(
        upstream_dir.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--storage-url",
            &storage,
            "--direct-downloads",
        ],
        &azurite.env(),
    );
    let t = main_token();
    let pull = token("1", &[("refs/pull/9/merge", 3), (MAIN, 1)]);
    let ws = Workspace::new();
    let sum = ws.write_random("deps/data.bin", 6 * MIB, 95);
    saved_id(
        &ws.save(&upstream.base, &t, "upstream-deps", &["deps"]).0,
        "save upstream",
    );
    let other = ws.write_random("pr/data.bin", MIB, 96);
    saved_id(
        &ws.save(&upstream.base, &t, "upstream-pr", &["pr"]).0,
        "save upstream",
    );

    let local_dir = tempfile::tempdir().unwrap();
    let secret = common::secret_file(local_dir.path());
    let local = Hoard::start_with(
        local_dir.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--upstream-cache",
            &upstream.base,
            // The bound is tested below, with a silent upstream; here Azurite may be slow.
            "--upstream-cache-timeout",
            "60s",
        ],
    );
    ws.remove("deps");
    let (res, out) = ws.restore(&local.base, &t, "upstream-deps", &[], &["deps"]);
    assert_eq!(res, "upstream-deps", "{out}");
    assert_eq!(sha256_file(&ws.path("deps/data.bin")), sum);
    ws.remove("pr");
    let (res, out) = ws.restore(&local.base, &pull, "upstream-pr", &[], &["pr"]);
    assert_eq!(res, "upstream-pr", "{out}");
    assert_eq!(sha256_file(&ws.path("pr/data.bin")), other);

    // The upstream gone: main's entry is here (stored as the first restore read it, committed
    // once its last byte passed); the pull request's copy is not main's.
    drop(upstream);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let lookup_only = ["restore", "upstream-deps", "--lookup-only", "deps"];
    let stored = rt.block_on(common::eventually(Duration::from_secs(60), || {
        ws.run(&local.base, &t, &lookup_only).0 == "upstream-deps"
    }));
    assert!(stored, "the read-through copy is stored");
    let pr_only = ["restore", "upstream-pr", "--lookup-only", "pr"];
    let stored = rt.block_on(common::eventually(Duration::from_secs(60), || {
        ws.run(&local.base, &pull, &pr_only).0 == "upstream-pr"
    }));
    assert!(
        stored,
        "the pull request's read-through copy is stored, in its own scope"
    );
    ws.remove("deps");
    let (res, out) = ws.restore(&local.base, &t, "upstream-deps", &[], &["deps"]);
    assert_eq!(res, "upstream-deps", "local now: {out}");
    assert_eq!(sha256_file(&ws.path("deps/data.bin")), sum);
    let (res, out) = ws.restore(&local.base, &t, "upstream-pr", &[], &["pr"]);
    assert_eq!(
        res,
        Value::Null,
        "main never reads the pull request's copy: {out}"
    );

    // A silent upstream: a miss within the bound, the job goes on.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let quiet_dir = tempfile::tempdir().unwrap();
    let secret = common::secret_file(quiet_dir.path());
    let quiet = Hoard::start_with(
        quiet_dir.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--upstream-cache",
            &silent_url,
            "--upstream-cache-timeout",
            "1s",
        ],
    );
    let started = std::time::Instant::now();
    let (res, out) = ws.restore(&quiet.base, &t, "upstream-deps", &[], &["deps"]);
    assert_eq!(res, Value::Null, "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}
