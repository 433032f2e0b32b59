//! Shared test harness: a real hoard server on port 0 with a temporary data directory, and
//! small helpers to speak its protocols.
#![allow(dead_code)] // Each test binary uses a different part of this module.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub mod clients;
pub mod databases;
pub mod emulators;
pub mod issuer;
pub mod power_disk;
pub mod process;
pub mod results;

pub const SERVICE: &str = "/twirp/github.actions.results.api.v1.CacheService/";
pub const VERSION: &str = "3ad75f27293d65a135214b8c82b296080f911dc107e52f1e7ec871a2eda46e69";
pub const MAIN: &str = "refs/heads/main";

/// The HS256 secret test servers trust (`--token-hs256-secret-file`).
pub const TEST_SECRET: &str = "hoard-test-secret-hoard-test-secret-0123456789";

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A clock for [`TestServer::start_with_clock`], starting at the machine's time so that tokens
/// made with [`unix_now`] are valid on it.
pub fn manual_clock() -> Arc<hoard::model::ManualClock> {
    Arc::new(hoard::model::ManualClock::starting_at(
        hoard::model::now_millis(),
    ))
}

/// Rows of `table` in the SQLite database of the data directory `data`, read without a lock on
/// the server: what a request stored, or did not.
pub fn table_rows(data: &Path, table: &str) -> usize {
    let conn = rusqlite::Connection::open_with_flags(
        data.join("hoard.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let n: i64 = conn
        .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
        .unwrap();
    n as usize
}

/// Hoard's `/metrics` at `base`, as text.
pub async fn metrics_text(http: &reqwest::Client, base: &str) -> String {
    http.get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Samples of hoard's `/metrics` at `base` whose line starts with `prefix`, summed.
pub async fn metric(http: &reqwest::Client, base: &str, prefix: &str) -> f64 {
    let text = metrics_text(http, base).await;
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Calls of the metadata store operation `operation` so far (one timing sample per call).
pub async fn database_calls(http: &reqwest::Client, base: &str, operation: &str) -> f64 {
    let name =
        format!("hoard_database_operation_duration_seconds_count{{operation=\"{operation}\"}} ");
    metric(http, base, &name).await
}

/// The claims of a runtime token with the given grants (`(scope, permission bits)`).
pub fn claims(repository: &str, grants: &[(&str, u8)]) -> Value {
    let ac: Vec<Value> = grants
        .iter()
        .map(|(scope, perm)| serde_json::json!({ "Scope": scope, "Permission": perm }))
        .collect();
    serde_json::json!({
        "ac": serde_json::to_string(&ac).unwrap(),
        "repository_id": repository,
        "sub": "repo:test/test:ref:refs/heads/main",
        "scp": "Actions.Results:1:2",
        "exp": unix_now() + 3600,
        "nbf": unix_now() - 10,
    })
}

/// An HS256 runtime token signed with [`TEST_SECRET`].
pub fn token(repository: &str, grants: &[(&str, u8)]) -> String {
    sign_hs256(&claims(repository, grants))
}

pub fn sign_hs256(claims: &Value) -> String {
    let key = jsonwebtoken::EncodingKey::from_secret(TEST_SECRET.as_bytes());
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &key,
    )
    .unwrap()
}

/// Writes [`TEST_SECRET`] into `dir` and returns the file's path.
pub fn secret_file(dir: &Path) -> PathBuf {
    let path = dir.join("test-token-secret");
    std::fs::write(&path, TEST_SECRET).unwrap();
    path
}

/// A token that reads and writes `refs/heads/main` of repository 1.
pub fn main_token() -> String {
    token("1", &[(MAIN, 3)])
}

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    serve: hoard::config::ServeArgs,
}

/// An in-process server on 127.0.0.1:0.
pub struct TestServer {
    pub addr: SocketAddr,
    pub base: String,
    pub data: tempfile::TempDir,
    pub http: reqwest::Client,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    pub async fn start_with(extra: &[&str]) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), extra, true).await
    }

    /// Without the HS256 test secret: only what `extra` configures verifies tokens.
    pub async fn start_without_test_secret(extra: &[&str]) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), extra, false).await
    }

    /// On `clock` instead of the machine's: the test moves time (link and token expiry, key
    /// refreshes, entry ages) instead of sleeping. See [`manual_clock`].
    pub async fn start_with_clock(extra: &[&str], clock: Arc<hoard::model::ManualClock>) -> Self {
        Self::start_on_clock(tempfile::tempdir().unwrap(), extra, true, Some(clock)).await
    }

    /// Stops the server and starts a new one on the same data directory.
    pub async fn restart(self) -> Self {
        Self::start_on(self.shut_down().await).await
    }

    /// Stops the server (cleanly) and hands back its data directory.
    pub async fn shut_down(self) -> tempfile::TempDir {
        self.stop.cancel();
        let _ = self.task.await;
        self.data
    }

    /// Starts a server on an existing data directory.
    pub async fn start_on(data: tempfile::TempDir) -> Self {
        Self::start_in(data, &[], true).await
    }

    /// Starts a server with `extra` options on an existing data directory.
    pub async fn start_on_with(data: tempfile::TempDir, extra: &[&str]) -> Self {
        Self::start_in(data, extra, true).await
    }

    async fn start_in(data: tempfile::TempDir, extra: &[&str], test_secret: bool) -> Self {
        Self::start_on_clock(data, extra, test_secret, None).await
    }

    async fn start_on_clock(
        data: tempfile::TempDir,
        extra: &[&str],
        test_secret: bool,
        clock: Option<Arc<hoard::model::ManualClock>>,
    ) -> Self {
        let dir = data.path().to_str().unwrap().to_owned();
        let secret = secret_file(data.path()).to_str().unwrap().to_owned();
        let mut argv = vec!["hoard", "--data-dir", &dir, "--listen", "127.0.0.1:0"];
        if test_secret {
            argv.extend(["--token-hs256-secret-file", secret.as_str()]);
        }
        // The machine's own free space is not the test's: a full disk elsewhere must not make
        // saves 429. Tests of the free-space rule set it again in `extra`.
        argv.extend(["--min-free-space", "0"]);
        argv.extend_from_slice(extra);
        let mut config = Cli::try_parse_from(argv).unwrap().serve.validate().unwrap();
        if let Some(clock) = clock {
            config.clock = clock;
        }
        let stop = CancellationToken::new();
        let state = hoard::build_state(&config, stop.clone()).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move { hoard::serve(&config, state, listener, stop).await.unwrap() })
        };
        Self {
            addr,
            base: format!("http://{addr}"),
            data,
            http: reqwest::Client::new(),
            stop,
            task,
        }
    }

    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A twirp JSON call; returns the status and the parsed JSON body (every answer must be JSON).
    pub async fn twirp(&self, method: &str, token: &str, body: Value) -> (u16, Value) {
        twirp_at(&self.http, &self.base, token, method, body).await
    }

    /// CreateCacheEntry for `key`; returns the signed upload URL.
    pub async fn reserve(&self, token: &str, key: &str, version: &str) -> String {
        let (status, body) = self
            .twirp(
                "CreateCacheEntry",
                token,
                serde_json::json!({ "key": key, "version": version }),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["ok"], true, "{body}");
        body["signed_upload_url"].as_str().unwrap().to_owned()
    }

    pub async fn finalize(
        &self,
        token: &str,
        key: &str,
        version: &str,
        size: usize,
    ) -> (u16, Value) {
        self.twirp(
            "FinalizeCacheEntryUpload",
            token,
            serde_json::json!({ "key": key, "version": version, "size_bytes": size.to_string() }),
        )
        .await
    }

    /// Reserve, Put Blob and finalize: a complete save of `data`.
    pub async fn save(&self, token: &str, key: &str, version: &str, data: &[u8]) -> i64 {
        let url = self.reserve(token, key, version).await;
        let res = self.put_blob(&url, data.to_vec()).await;
        assert_eq!(res.status(), 201);
        let (status, body) = self.finalize(token, key, version, data.len()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["ok"], true, "{body}");
        body["entry_id"].as_str().unwrap().parse().unwrap()
    }

    /// GetCacheEntryDownloadURL; returns the whole JSON answer.
    pub async fn lookup(
        &self,
        token: &str,
        key: &str,
        restore: &[&str],
        version: &str,
    ) -> (u16, Value) {
        let mut req = serde_json::json!({ "key": key, "version": version });
        if !restore.is_empty() {
            req["restore_keys"] = serde_json::json!(restore);
        }
        self.twirp("GetCacheEntryDownloadURL", token, req).await
    }

    pub async fn put_blob(&self, url: &str, data: Vec<u8>) -> reqwest::Response {
        put_blob_at(&self.http, url, data).await
    }

    pub async fn put_block(&self, url: &str, block_id: &str, data: Vec<u8>) -> reqwest::Response {
        let id = percent_encode(block_id);
        self.http
            .put(format!("{url}&comp=block&blockid={id}"))
            .body(data)
            .send()
            .await
            .unwrap()
    }

    pub async fn put_block_list(&self, url: &str, xml: String) -> reqwest::Response {
        self.http
            .put(format!("{url}&comp=blocklist"))
            .header("content-type", "application/xml")
            .body(xml)
            .send()
            .await
            .unwrap()
    }

    /// Looks `key` up and downloads the hit in full.
    pub async fn restore(&self, token: &str, key: &str, version: &str) -> Option<Vec<u8>> {
        let (status, body) = self.lookup(token, key, &[], version).await;
        assert_eq!(status, 200, "{body}");
        if body["ok"] != true {
            return None;
        }
        let res = self
            .http
            .get(body["signed_download_url"].as_str().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        Some(res.bytes().await.unwrap().to_vec())
    }

    /// Every chunk file in the store.
    pub fn chunk_files(&self) -> Vec<PathBuf> {
        files_under(&self.data.path().join("chunks"))
    }

    /// The digest of entry `id` once recorded, read from the SQLite database: an entry whose
    /// chunks are larger than 64 KiB gets it from the digest pass, after its save.
    pub async fn until_digested(&self, id: i64) -> String {
        let db = self.data.path().join("hoard.db");
        let read = async || {
            let db = db.clone();
            tokio::task::spawn_blocking(move || {
                let conn = rusqlite::Connection::open(db).unwrap();
                // The server writes meanwhile: wait out a lock rather than fail on it.
                conn.busy_timeout(Duration::from_secs(10)).unwrap();
                conn.query_row("SELECT digest FROM entries WHERE id = ?", [id], |r| {
                    r.get::<_, String>(0)
                })
                .unwrap()
            })
            .await
            .unwrap()
        };
        let digest = poll(Duration::from_secs(30), read, |d: &String| !d.is_empty()).await;
        assert!(!digest.is_empty(), "entry {id} got no digest");
        digest
    }
}

pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// A twirp JSON call to the server at `base`; the status and the JSON body.
pub async fn twirp_at(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    method: &str,
    body: Value,
) -> (u16, Value) {
    let res = http
        .post(format!("{base}{SERVICE}{method}"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    json_of(res).await
}

pub async fn json_of(res: reqwest::Response) -> (u16, Value) {
    let status = res.status().as_u16();
    let ct = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = res.text().await.unwrap();
    let json: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("status {status}: body is not JSON ({e}): {text:?}"));
    assert_eq!(ct.as_deref(), Some("application/json"), "{text}");
    (status, json)
}

pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// What a real client script (`tests/e2e/*.mjs`) returned: the JSON after its last line's
/// `RESULT `, and its whole output. Fails loudly if it failed.
pub fn node_result(out: std::process::Output) -> (Value, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let all = format!("{stdout}\n{stderr}");
    assert!(out.status.success(), "client failed:\n{all}");
    let result = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line:\n{all}"));
    (serde_json::from_str(result).unwrap(), all)
}

/// What `probe` answers once `done` holds of it, asking again every 50 ms; its last answer once
/// `timeout` has passed (the caller's assertion then shows it). What is asserted is that the
/// state comes, not how fast: the timeouts are generous for a loaded machine.
pub async fn poll<T>(
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let answer = probe().await;
        if done(&answer) || tokio::time::Instant::now() >= deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `check` until it returns true or `timeout` passes.
#[must_use = "assert the result: a check that times out is a failure"]
pub async fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    poll(timeout, async || check(), |held| *held).await
}

/// A whole upload in one request (Azure's Put Blob) of `data` to the link `url`.
pub async fn put_blob_at(http: &reqwest::Client, url: &str, data: Vec<u8>) -> reqwest::Response {
    http.put(url)
        .header("x-ms-blob-type", "BlockBlob")
        .body(data)
        .send()
        .await
        .unwrap()
}

/// The download link a lookup of `key` (main's token) through `base` answers; it points at
/// `base` (an edge hands out its own links).
pub async fn download_link_at(base: &str, key: &str) -> String {
    let http = reqwest::Client::new();
    let body = serde_json::json!({"key": key, "version": VERSION});
    let (_, found) = twirp_at(&http, base, &main_token(), "GetCacheEntryDownloadURL", body).await;
    let link = found["signed_download_url"].as_str().unwrap().to_owned();
    assert!(
        link.starts_with(base),
        "downloads pass through {base}: {found}"
    );
    link
}

/// Saves `data` under `key` through `base` (an edge) and returns its download link as a
/// lookup through `base` answers it.
pub async fn save_through(base: &str, key: &str, data: &[u8]) -> String {
    let http = reqwest::Client::new();
    let t = main_token();
    let (_, reserved) = twirp_at(
        &http,
        base,
        &t,
        "CreateCacheEntry",
        serde_json::json!({"key": key, "version": VERSION}),
    )
    .await;
    let upload = reserved["signed_upload_url"].as_str().unwrap();
    assert!(
        upload.starts_with(base),
        "uploads pass through the edge: {reserved}"
    );
    let put = put_blob_at(&http, upload, data.to_vec()).await;
    assert_eq!(put.status(), 201);
    let body =
        serde_json::json!({"key": key, "version": VERSION, "size_bytes": data.len().to_string()});
    let (_, done) = twirp_at(&http, base, &t, "FinalizeCacheEntryUpload", body).await;
    assert_eq!(done["ok"], true, "{done}");
    download_link_at(base, key).await
}
