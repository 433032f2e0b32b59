//! The metadata database goes away under load and comes back (issue #25, point 2): a private
//! PostgreSQL cluster of the test's own (Debian's `initdb` and `pg_ctl`, its own port and
//! directory; the machine's server on 5432 is never touched) behind two replicas that share a
//! chunk directory and a signing key, stopped with `pg_ctl stop -m fast` for at least 6 s while
//! v2 and v1 clients save and restore through both, an operator asks for the status and a
//! load balancer asks `/readyz`, then started again. Links and reservations taken before the
//! outage are used during it, so every call that needs the database meets it away.
//!
//! Every answer comes within the acquire timeout plus 1 s, and is a success or a 503 with
//! `Retry-After` in its protocol's shape; `/readyz` says 503 within its 3 s during the outage
//! and 200 again by itself after; every save acknowledged to a client restores byte-identical,
//! and every restore a client was told of is counted in the database by the replicas' own
//! flushes after it. The answers clients saw, and the times to recover, are printed.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{TestServer, SERVICE, VERSION};
use serde_json::{json, Value};
use sqlx::Connection;

const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);
/// What the issue allows an answer: the acquire timeout plus 1 s.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);
/// `/readyz`'s own deadline.
const READY_WITHIN: Duration = Duration::from_secs(3);
/// The outage lasts at least this long, and until both replicas noticed it.
const OUTAGE: Duration = Duration::from_secs(6);
const SIGNING_KEY: &str = "database-outage-test-signing-key-0123456789";

/// A PostgreSQL cluster in a temporary directory, on a free port, stopped when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// Run its commands as the `postgres` user: `initdb` refuses root.
    as_postgres: bool,
}

impl Cluster {
    /// `None` (with a message) when the user asked to skip PostgreSQL tests.
    fn create() -> Option<Self> {
        if std::env::var("HOARD_TEST_SKIP_POSTGRES").is_ok_and(|v| v == "1" || v == "true") {
            eprintln!("skipped: HOARD_TEST_SKIP_POSTGRES is set");
            return None;
        }
        let bin = pg_bin().unwrap_or_else(|| {
            panic!("no PostgreSQL server programs under /usr/lib/postgresql/*/bin: install Debian's postgresql package (scripts/databases does), or set HOARD_TEST_SKIP_POSTGRES=1 to skip")
        });
        let dir = tempfile::tempdir().unwrap();
        let as_postgres = is_root();
        if as_postgres {
            let id = |flag| {
                let out = Command::new("id")
                    .args([flag, "postgres"])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "running as root, and there is no postgres user to run the cluster as"
                );
                String::from_utf8(out.stdout)
                    .unwrap()
                    .trim()
                    .parse::<u32>()
                    .unwrap()
            };
            std::os::unix::fs::chown(dir.path(), Some(id("-u")), Some(id("-g"))).unwrap();
        }
        // Outside the ephemeral range: the cluster is started again on it after thousands of
        // client connections (see `free_port`).
        let port = common::emulators::free_port();
        let cluster = Self {
            dir,
            bin,
            port,
            as_postgres,
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        let conf = format!(
            "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nfsync = off\nmax_connections = 60\n",
            cluster.dir.path().display()
        );
        let path = Path::new(&data).join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&conf);
        std::fs::write(&path, text).unwrap();
        cluster.start();
        Some(cluster)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").to_str().unwrap().to_owned()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs one of the cluster's programs and fails loudly if it fails.
    fn run(&self, program: &str, args: &[&str]) {
        let out = self.command(program, args).output().unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn command(&self, program: &str, args: &[&str]) -> Command {
        let program = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command.args(args);
        command
    }

    fn start(&self) {
        let log = self.dir.path().join("log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "30",
                "start",
            ],
        );
    }

    fn stop(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-w", "-m", "fast", "stop"]);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command(
                "pg_ctl",
                &["-D", &self.data(), "-w", "-m", "immediate", "stop"],
            )
            .output();
    }
}

/// The newest PostgreSQL's server programs that Debian installed.
fn pg_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}
/// One HTTP answer a client saw.
#[derive(Debug, Clone)]
struct Answer {
    replica: usize,
    /// The call: a twirp method, an Azure blob call, a v1 call, an admin call or `/readyz`.
    what: &'static str,
    status: u16,
    retry_after: bool,
    /// The error's shape in its protocol: the Azure error code, twirp's `code`, or `message`
    /// for a v1 or admin `{"message"}` body.
    shape: String,
    took: Duration,
    at: Instant,
}

impl Answer {
    /// The protocol of the call, for the summary.
    fn protocol(&self) -> &'static str {
        match self.what {
            "CreateCacheEntry" | "FinalizeCacheEntryUpload" | "GetCacheEntryDownloadURL" => "twirp",
            "Put Blob" | "Put Block" | "Put Block List" | "download" => "azure",
            "v1 reserve" | "v1 patch" | "v1 commit" | "v1 lookup" => "v1",
            "admin status" => "admin",
            _ => "readyz",
        }
    }

    /// The shape a 503 of this call must have.
    fn expected_shape(&self) -> &'static str {
        match self.protocol() {
            "twirp" => "unavailable",
            "azure" => "ServerBusy",
            _ => "message",
        }
    }
}

/// A save a client was told succeeded: its key and its bytes.
type Saved = (String, Vec<u8>);

/// Clients saving and restoring through the replicas, recording every answer.
#[derive(Clone)]
struct Load {
    http: reqwest::Client,
    bases: Arc<Vec<String>>,
    token: String,
    answers: Arc<Mutex<Vec<Answer>>>,
    /// Saves acknowledged to a client (finalize 200, commit 204).
    acknowledged: Arc<Mutex<Vec<Saved>>>,
    /// Lookups that found their key, by key: the hits the database must count in the end.
    hits: Arc<Mutex<HashMap<String, u64>>>,
    stop: Arc<AtomicBool>,
    next_key: Arc<AtomicUsize>,
}

impl Load {
    /// Sends `request` to replica `replica` and records the answer; its status and body.
    async fn send(
        &self,
        replica: usize,
        what: &'static str,
        request: reqwest::RequestBuilder,
    ) -> (u16, Vec<u8>) {
        let at = Instant::now();
        let (status, retry_after, shape, body) = match request.send().await {
            Ok(res) => {
                let status = res.status().as_u16();
                let retry_after = res.headers().contains_key("retry-after");
                let azure = res
                    .headers()
                    .get("x-ms-error-code")
                    .map(|v| v.to_str().unwrap().to_owned());
                let body = res.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
                let shape = azure.unwrap_or_else(|| {
                    let json = serde_json::from_slice::<Value>(&body).unwrap_or_default();
                    match (&json["code"], &json["message"]) {
                        (Value::String(code), _) => code.clone(),
                        (_, Value::String(_)) => "message".to_owned(),
                        _ => String::new(),
                    }
                });
                (status, retry_after, shape, body)
            }
            Err(e) => (0, false, e.to_string(), Vec::new()),
        };
        self.answers.lock().unwrap().push(Answer {
            replica,
            what,
            status,
            retry_after,
            shape,
            took: at.elapsed(),
            at,
        });
        (status, body)
    }

    fn seen_hit(&self, key: &str) {
        *self.hits.lock().unwrap().entry(key.to_owned()).or_default() += 1;
    }

    /// A key saved before, and its bytes.
    fn pick(&self, pick: usize) -> Option<Saved> {
        let acknowledged = self.acknowledged.lock().unwrap();
        (!acknowledged.is_empty()).then(|| acknowledged[pick % acknowledged.len()].clone())
    }

    /// Fresh data under a fresh key.
    fn fresh(&self, prefix: &str) -> Saved {
        let n = self.next_key.fetch_add(1, Ordering::Relaxed);
        (
            format!("{prefix}-{n}"),
            common::random_bytes(32 * 1024 + n, n as u64),
        )
    }

    async fn twirp(&self, replica: usize, method: &'static str, body: Value) -> Option<Value> {
        let request = self
            .http
            .post(format!("{}{SERVICE}{method}", self.bases[replica]))
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body.to_string());
        let (status, body) = self.send(replica, method, request).await;
        (status == 200).then(|| serde_json::from_slice(&body).unwrap())
    }

    /// A v2 save of fresh data through `replica`, in one Put Blob or in two Put Blocks and a
    /// block list, in turn; remembered if finalize answered 200.
    async fn save_v2(&self, replica: usize, in_blocks: bool) {
        let (key, data) = self.fresh("outage-v2");
        let request = json!({ "key": key, "version": VERSION });
        let Some(created) = self.twirp(replica, "CreateCacheEntry", request).await else {
            return;
        };
        assert_eq!(created["ok"], true, "{created}");
        let url = created["signed_upload_url"].as_str().unwrap();
        if in_blocks {
            let half = data.len() / 2;
            let mut ids = String::new();
            for (i, part) in [&data[..half], &data[half..]].into_iter().enumerate() {
                let id = format!("YmxvY2st{i}A==");
                let put = self
                    .http
                    .put(format!(
                        "{url}&comp=block&blockid={}",
                        common::percent_encode(&id)
                    ))
                    .body(part.to_vec());
                if self.send(replica, "Put Block", put).await.0 != 201 {
                    return;
                }
                ids.push_str(&format!("<Latest>{id}</Latest>"));
            }
            let list =
                format!("<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>{ids}</BlockList>");
            let put = self.http.put(format!("{url}&comp=blocklist")).body(list);
            if self.send(replica, "Put Block List", put).await.0 != 201 {
                return;
            }
        } else {
            let put = self
                .http
                .put(url)
                .header("x-ms-blob-type", "BlockBlob")
                .body(data.clone());
            if self.send(replica, "Put Blob", put).await.0 != 201 {
                return;
            }
        }
        let request =
            json!({ "key": key, "version": VERSION, "size_bytes": data.len().to_string() });
        let Some(done) = self
            .twirp(replica, "FinalizeCacheEntryUpload", request)
            .await
        else {
            return;
        };
        assert_eq!(done["ok"], true, "{done}");
        self.acknowledged.lock().unwrap().push((key, data));
    }

    /// Looks up an acknowledged save through `replica` (v2) and downloads it; a hit must be
    /// the bytes saved.
    async fn restore_v2(&self, replica: usize, pick: usize) {
        let Some((key, data)) = self.pick(pick) else {
            return;
        };
        let request = json!({ "key": key, "version": VERSION });
        let Some(found) = self
            .twirp(replica, "GetCacheEntryDownloadURL", request)
            .await
        else {
            return;
        };
        assert_eq!(found["ok"], true, "an acknowledged save is found: {found}");
        self.seen_hit(&key);
        let url = found["signed_download_url"].as_str().unwrap();
        let (status, body) = self.send(replica, "download", self.http.get(url)).await;
        if status == 200 {
            assert!(body == data, "{key}: the download is not the bytes saved");
        }
    }

    fn v1(
        &self,
        replica: usize,
        method: reqwest::Method,
        resource: &str,
    ) -> reqwest::RequestBuilder {
        self.http
            .request(
                method,
                format!("{}/_apis/artifactcache/{resource}", self.bases[replica]),
            )
            .bearer_auth(&self.token)
            .header("accept", "application/json;api-version=6.0-preview.1")
    }

    /// A v1 save of fresh data through `replica`: reserve, one range, commit; remembered if
    /// the commit answered 204.
    async fn save_v1(&self, replica: usize) {
        let (key, data) = self.fresh("outage-v1");
        let reserve = self
            .v1(replica, reqwest::Method::POST, "caches")
            .header("content-type", "application/json")
            .body(json!({ "key": key, "version": VERSION, "cacheSize": data.len() }).to_string());
        let (status, body) = self.send(replica, "v1 reserve", reserve).await;
        if status != 201 {
            return;
        }
        let id = serde_json::from_slice::<Value>(&body).unwrap()["cacheId"]
            .as_i64()
            .unwrap();
        let patch = self
            .v1(replica, reqwest::Method::PATCH, &format!("caches/{id}"))
            .header("content-type", "application/octet-stream")
            .header("content-range", format!("bytes 0-{}/*", data.len() - 1))
            .body(data.clone());
        if self.send(replica, "v1 patch", patch).await.0 != 204 {
            return;
        }
        let commit = self
            .v1(replica, reqwest::Method::POST, &format!("caches/{id}"))
            .header("content-type", "application/json")
            .body(json!({ "size": data.len() }).to_string());
        if self.send(replica, "v1 commit", commit).await.0 == 204 {
            self.acknowledged.lock().unwrap().push((key, data));
        }
    }

    /// Looks up an acknowledged save through `replica` (v1) and downloads it.
    async fn restore_v1(&self, replica: usize, pick: usize) {
        let Some((key, data)) = self.pick(pick) else {
            return;
        };
        let resource = format!(
            "cache?keys={}&version={VERSION}",
            common::percent_encode(&key)
        );
        let lookup = self.v1(replica, reqwest::Method::GET, &resource);
        let (status, body) = self.send(replica, "v1 lookup", lookup).await;
        assert_ne!(status, 204, "{key}: an acknowledged save is found");
        if status != 200 {
            return;
        }
        self.seen_hit(&key);
        let hit: Value = serde_json::from_slice(&body).unwrap();
        let url = hit["archiveLocation"].as_str().unwrap();
        let (status, body) = self.send(replica, "download", self.http.get(url)).await;
        if status == 200 {
            assert!(body == data, "{key}: the download is not the bytes saved");
        }
    }

    /// A client of `protocol` going back and forth between saves and restores until stopped.
    async fn client(self, replica: usize, v1: bool) {
        let mut round = 0;
        while !self.stop.load(Ordering::Relaxed) {
            let pick = round * 7 + replica;
            match (v1, round % 2) {
                (false, 0) => self.save_v2(replica, round % 4 == 2).await,
                (false, _) => self.restore_v2(replica, pick).await,
                (true, 0) => self.save_v1(replica).await,
                (true, _) => self.restore_v1(replica, pick).await,
            }
            round += 1;
        }
    }

    /// Links and reservations taken through `replica` while the database answers, to be used
    /// while it is away.
    async fn links(&self, replica: usize) -> Links {
        let (key, data) = self.fresh("outage-links");
        let created = self
            .twirp(
                replica,
                "CreateCacheEntry",
                json!({ "key": key, "version": VERSION }),
            )
            .await
            .unwrap();
        let upload = created["signed_upload_url"].as_str().unwrap().to_owned();
        let (saved, saved_data) = self.pick(replica).unwrap();
        let found = self
            .twirp(
                replica,
                "GetCacheEntryDownloadURL",
                json!({ "key": saved, "version": VERSION }),
            )
            .await
            .unwrap();
        self.seen_hit(&saved);
        let download = found["signed_download_url"].as_str().unwrap().to_owned();
        let reserve = self
            .v1(replica, reqwest::Method::POST, "caches")
            .header("content-type", "application/json")
            .body(json!({ "key": format!("{key}-v1"), "version": VERSION }).to_string());
        let (status, body) = self.send(replica, "v1 reserve", reserve).await;
        assert_eq!(status, 201);
        let v1_id = serde_json::from_slice::<Value>(&body).unwrap()["cacheId"]
            .as_i64()
            .unwrap();
        Links {
            replica,
            key,
            data,
            upload,
            download: (download, saved_data),
            v1_id,
        }
    }

    /// Every call that needs the database, with links taken before it went away: the blob
    /// endpoints, finalize, and v1's ranges and commit. Each answers 503, but a download of
    /// an entry the replica read recently, which it may serve from memory.
    async fn use_links(&self, links: &Links) {
        let Links {
            replica,
            key,
            data,
            upload,
            download,
            v1_id,
        } = links;
        let replica = *replica;
        let calls: Vec<(&'static str, reqwest::RequestBuilder)> = vec![
            (
                "Put Blob",
                self.http
                    .put(upload)
                    .header("x-ms-blob-type", "BlockBlob")
                    .body(data.clone()),
            ),
            (
                "Put Block",
                self.http
                    .put(format!("{upload}&comp=block&blockid=YmxvY2s%3D"))
                    .body(data.clone()),
            ),
            (
                "Put Block List",
                self.http.put(format!("{upload}&comp=blocklist")).body(
                    "<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList><Latest>YmxvY2s=</Latest></BlockList>",
                ),
            ),
            ("download", self.http.get(&download.0)),
            (
                "v1 patch",
                self.v1(replica, reqwest::Method::PATCH, &format!("caches/{v1_id}"))
                    .header("content-type", "application/octet-stream")
                    .header("content-range", format!("bytes 0-{}/*", data.len() - 1))
                    .body(data.clone()),
            ),
            (
                "v1 commit",
                self.v1(replica, reqwest::Method::POST, &format!("caches/{v1_id}"))
                    .header("content-type", "application/json")
                    .body(json!({ "size": data.len() }).to_string()),
            ),
        ];
        let finalize =
            json!({ "key": key, "version": VERSION, "size_bytes": data.len().to_string() });
        let (statuses, done) = tokio::join!(
            futures_util::future::join_all(calls.into_iter().map(|(what, request)| async move {
                (what, self.send(replica, what, request).await)
            })),
            self.twirp(replica, "FinalizeCacheEntryUpload", finalize)
        );
        for (what, (status, body)) in statuses {
            if what == "download" && status == 200 {
                assert!(
                    body == download.1,
                    "a download served from memory is the bytes saved"
                );
                continue;
            }
            assert_eq!(
                status, 503,
                "{what} through replica {replica} while the database is away"
            );
        }
        assert_eq!(done, None, "finalize while the database is away");
    }

    /// An operator asking `replica` for its status every half second until stopped.
    async fn operator(self, replica: usize) {
        while !self.stop.load(Ordering::Relaxed) {
            let request = self
                .http
                .get(format!("{}/_hoard/api/v1/status", self.bases[replica]))
                .bearer_auth(ADMIN_TOKEN);
            self.send(replica, "admin status", request).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A load balancer asking `replica`'s `/readyz` every 100 ms until stopped, with a longer
    /// timeout than the answer may take.
    async fn probe(self, replica: usize) {
        while !self.stop.load(Ordering::Relaxed) {
            let request = self
                .http
                .get(format!("{}/readyz", self.bases[replica]))
                .timeout(Duration::from_secs(10));
            let (status, body) = self.send(replica, "/readyz", request).await;
            if status == 503 {
                let body: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(
                    body["error"], "the metadata database does not answer within 2.5 s",
                    "{body}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn answers(&self) -> Vec<Answer> {
        self.answers.lock().unwrap().clone()
    }

    /// Polls until `check` holds for the answers so far, or `limit` passes.
    async fn until(&self, limit: Duration, check: impl Fn(&[Answer]) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if check(&self.answers()) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        check(&self.answers())
    }
}

/// What [`Load::links`] took.
struct Links {
    replica: usize,
    /// The v2 reservation's key and the data meant for it.
    key: String,
    data: Vec<u8>,
    upload: String,
    /// A download link of a saved entry, and its bytes.
    download: (String, Vec<u8>),
    v1_id: i64,
}

const ADMIN_TOKEN: &str = "database-outage-admin-token-0123456789";

/// Whether both replicas' latest `/readyz` answer after `since` is `status`.
fn both_ready_say(answers: &[Answer], since: Instant, status: u16) -> bool {
    (0..2).all(|replica| {
        answers
            .iter()
            .rev()
            .find(|a| a.replica == replica && a.what == "/readyz" && a.at >= since)
            .is_some_and(|a| a.status == status)
    })
}

/// Whether each replica acknowledged a save, in each protocol, answered after `since`.
fn both_acknowledge_saves(answers: &[Answer], since: Instant) -> bool {
    (0..2).all(|r| {
        [("FinalizeCacheEntryUpload", 200), ("v1 commit", 204)]
            .iter()
            .all(|&(what, status)| {
                answers.iter().any(|a| {
                    a.replica == r && a.at >= since && a.what == what && a.status == status
                })
            })
    })
}

/// The hits the database counts per key.
async fn stored_hits(url: &str) -> HashMap<String, u64> {
    let mut db = sqlx::PgConnection::connect(url).await.unwrap();
    let rows: Vec<(String, i64)> = sqlx::query_as("SELECT key, hits FROM entries")
        .fetch_all(&mut db)
        .await
        .unwrap();
    rows.into_iter().map(|(k, n)| (k, n as u64)).collect()
}

/// What clients of each call saw among `answers`: the statuses, how many, and the slowest.
fn summary(answers: &[&Answer]) -> String {
    let mut by: BTreeMap<(&str, &str, u16), (usize, Duration)> = BTreeMap::new();
    for a in answers {
        let slot = by.entry((a.protocol(), a.what, a.status)).or_default();
        slot.0 += 1;
        slot.1 = slot.1.max(a.took);
    }
    by.iter()
        .map(|((protocol, what, status), (n, slowest))| {
            format!(
                "  {protocol:6} {what:26} {status} ×{n:<4} slowest {:.2} s\n",
                slowest.as_secs_f64()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_outage_answers_fast_and_recovers_by_itself() {
    let Some(cluster) = Cluster::create() else {
        return;
    };
    let shared = tempfile::tempdir().unwrap();
    let url = cluster.url();
    let storage = format!("file://{}", shared.path().display());
    let timeout = format!("{}s", ACQUIRE_TIMEOUT.as_secs());
    let args = [
        "--database-url",
        url.as_str(),
        "--storage-url",
        storage.as_str(),
        "--signing-key",
        SIGNING_KEY,
        "--admin-token",
        ADMIN_TOKEN,
        "--database-acquire-timeout",
        timeout.as_str(),
        "--database-pool-size",
        "8",
    ];
    let replicas = [
        TestServer::start_with(&args).await,
        TestServer::start_with(&args).await,
    ];
    let load = Load {
        // A new connection per request: an answer given before its request's body was read
        // (a 503 to a Put Blob) ends its connection, and a pooled client can race that close
        // with its next request; the real clients retry such a send, and this test judges
        // answers, not that race.
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap(),
        bases: Arc::new(replicas.iter().map(|r| r.base.clone()).collect()),
        token: common::main_token(),
        answers: Arc::default(),
        acknowledged: Arc::default(),
        hits: Arc::default(),
        stop: Arc::default(),
        next_key: Arc::default(),
    };
    let mut tasks = Vec::new();
    for replica in 0..2 {
        tasks.push(tokio::spawn(load.clone().client(replica, false)));
        tasks.push(tokio::spawn(load.clone().client(replica, true)));
        tasks.push(tokio::spawn(load.clone().operator(replica)));
        tasks.push(tokio::spawn(load.clone().probe(replica)));
    }

    // Before: saves are acknowledged through both replicas in both protocols, both are ready.
    let started = Instant::now();
    assert!(
        load.until(Duration::from_secs(30), |a| {
            both_ready_say(a, started, 200) && both_acknowledge_saves(a, started)
        })
        .await,
        "the load did not get going: {:?}",
        load.answers()
            .iter()
            .filter(|a| !matches!(a.status, 200 | 201 | 204))
            .collect::<Vec<_>>()
    );

    // The outage: at least `OUTAGE`, and until both replicas said 503 on /readyz and each
    // refused requests; links taken before it are used during it.
    let links = [load.links(0).await, load.links(1).await];
    let stopping = Instant::now();
    cluster.stop();
    let stopped = Instant::now();
    tokio::join!(load.use_links(&links[0]), load.use_links(&links[1]));
    let seen = load
        .until(Duration::from_secs(20), |a| {
            stopped.elapsed() >= OUTAGE
                && both_ready_say(a, stopped, 503)
                && (0..2).all(|r| {
                    a.iter()
                        .filter(|a| a.replica == r && a.at >= stopped && a.status == 503)
                        .filter(|a| a.what != "/readyz")
                        .count()
                        >= 3
                })
        })
        .await;
    assert!(seen, "the replicas did not notice the outage");
    let restarting = Instant::now();
    cluster.start();
    let restarted = Instant::now();

    // After: both ready again by themselves, and saves are acknowledged through both again.
    let recovered = load
        .until(Duration::from_secs(20), |a| {
            both_ready_say(a, restarted, 200)
        })
        .await;
    let ready_again = Instant::now();
    assert!(
        recovered,
        "/readyz did not turn 200 again within 20 s of the restart"
    );
    let saving = load
        .until(Duration::from_secs(20), |a| {
            both_acknowledge_saves(a, restarted)
        })
        .await;
    let saving_again = Instant::now();
    assert!(
        saving,
        "saves were not acknowledged again within 20 s of the restart"
    );
    load.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }

    // Every answer: in time, and a success or a 503 that says when to retry, in its shape.
    let answers = load.answers();
    for a in &answers {
        let within = if a.what == "/readyz" {
            READY_WITHIN
        } else {
            ANSWER_WITHIN
        };
        assert!(a.took <= within, "too slow: {a:?}");
        match a.status {
            200 | 201 | 204 => {}
            // A probe reads only the status; a client is told when to retry.
            503 if a.what == "/readyz" => {}
            503 => {
                assert!(a.retry_after, "a 503 without Retry-After: {a:?}");
                assert_eq!(a.shape, a.expected_shape(), "{a:?}");
            }
            _ => panic!("neither a success nor a 503: {a:?}"),
        }
    }

    // The restores clients were told of are all counted, by the replicas' own flushes: what
    // they could not write while the database was away was kept, not lost.
    let seen_hits = load.hits.lock().unwrap().clone();
    let deadline = Instant::now() + Duration::from_secs(40);
    let counted = loop {
        let stored = stored_hits(&url).await;
        let short: Vec<_> = seen_hits
            .iter()
            .filter(|(key, n)| stored.get(*key).copied().unwrap_or(0) < **n)
            .collect();
        if short.is_empty() {
            break stored;
        }
        assert!(
            Instant::now() < deadline,
            "restores not counted 40 s after the outage (key, restores seen): {short:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let counted_after = restarting.elapsed();
    let seen_total: u64 = seen_hits.values().sum();
    let stored_total: u64 = seen_hits.keys().map(|k| counted[k]).sum();

    // Every acknowledged save restores byte-identical, through either replica.
    let acknowledged = load.acknowledged.lock().unwrap().clone();
    for (i, (key, data)) in acknowledged.iter().enumerate() {
        let got = replicas[i % 2]
            .restore(&common::main_token(), key, VERSION)
            .await;
        assert!(
            got.as_deref() == Some(&data[..]),
            "{key} does not restore as saved"
        );
    }

    // For the report: what clients saw, by when the answer came.
    let ended = |a: &&Answer| a.at + a.took;
    let pick = |from: Instant, to: Instant| -> Vec<&Answer> {
        answers
            .iter()
            .filter(|a| a.at >= from && ended(a) < to)
            .collect()
    };
    let during = pick(stopped, restarting);
    let bridging: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.at < restarting && ended(a) >= restarting)
        .collect();
    let after = pick(restarting, Instant::now());
    eprintln!(
        "{} answers. pg_ctl stop took {:.2} s; the outage, from then to pg_ctl start, {:.1} s. \
         Answered while PostgreSQL was down:\n{}\
         Asked while it was down, answered after pg_ctl start:\n{}\
         pg_ctl start took {:.2} s; from its start both replicas were ready after {:.2} s, and \
         both acknowledged saves in both protocols after {:.2} s; answered after pg_ctl start:\n{}\
         {seen_total} restores seen, {stored_total} counted, all {:.1} s after pg_ctl start; \
         {} acknowledged saves restored",
        answers.len(),
        (stopped - stopping).as_secs_f64(),
        (restarting - stopped).as_secs_f64(),
        summary(&during),
        summary(&bridging),
        (restarted - restarting).as_secs_f64(),
        (ready_again - restarting).as_secs_f64(),
        (saving_again - restarting).as_secs_f64(),
        summary(&after),
        counted_after.as_secs_f64(),
        acknowledged.len()
    );
    for replica in replicas {
        replica.stop().await;
    }
}
