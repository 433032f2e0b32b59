//! The S3 store failing under a running hoard (its own process, SQLite metadata), each fault on
//! a private moto that the test kills, pauses or empties, never the shared one; hoard is driven
//! with the requests the real clients send: the v2 client's Twirp calls, Azure Put Blob and Put
//! Block on its upload link and the plain GET of its download link, v1's reserve, PATCH, commit,
//! lookup and download, and a load balancer's `/readyz`.
//!
//! - While the store refuses connections or says nothing, every answer is a success or a 503
//!   that the clients retry, with `Retry-After` (Azure `ServerBusy`, Twirp `unavailable`, v1
//!   `{"message"}`), never a 500, each within [`ANSWER_BOUND`]; once the store is back, hoard is
//!   ready and serves again by itself.
//! - When the bucket is emptied and made anew, `/readyz` is 200 again by itself, an entry whose
//!   chunks went is a miss (never a 500 or a corrupt hit), and new saves restore.
//! - A download whose store goes away mid-stream ends with an error the client sees, never a
//!   body cut short that looks complete, and one log line names the entry and the cause.
//!
//! Each test prints what the clients saw, per fault: statuses and times to answer, and the time
//! to recover once the store is back (`cargo nextest run --test store_faults --no-capture`).
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::emulators::PrivateS3;
use common::process::Hoard;
use common::{main_token, random_bytes, SERVICE, VERSION};
use serde_json::{json, Value};

/// The longest any answer may take while the store fails: above hoard's own bound on the
/// store's silence (10 s), below the Azure SDK's 30 s per-try timeout, so that what a client
/// meets is an answer it retries and not a hang of its own.
const ANSWER_BOUND: Duration = Duration::from_secs(15);
/// How long hoard may take to serve again by itself once the store is back.
const RECOVERY_BOUND: Duration = Duration::from_secs(30);
/// The bucket on the private server (nothing else uses that server).
const BUCKET: &str = "hoard-faults";
/// A save's body: small, one chunk.
const SMALL: usize = 256 << 10;
/// A staged block larger than the socket buffers of a paused store take in.
const LARGE_BLOCK: usize = 12 << 20;

/// Which protocol an answer speaks, so its error shape can be checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaks {
    Twirp,
    /// Upload links and download links: Azure Blob XML errors.
    Azure,
    V1,
    Readyz,
}

/// One answer a client got.
#[derive(Debug)]
struct Answer {
    what: &'static str,
    speaks: Speaks,
    /// 0 when there was no answer (the connection failed).
    status: u16,
    retry_after: Option<String>,
    body: Vec<u8>,
    took: Duration,
}

impl Answer {
    fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{}: {} is not JSON ({e}): {}",
                self.what,
                self.status,
                self.text()
            )
        })
    }

    /// A success, or the 503 of its protocol that the clients retry, within [`ANSWER_BOUND`].
    fn assert_success_or_retry(&self) {
        assert!(
            self.took <= ANSWER_BOUND,
            "{}: answered {} after {:?}",
            self.what,
            self.status,
            self.took
        );
        if self.ok() {
            return;
        }
        assert_eq!(self.status, 503, "{}: {}", self.what, self.text());
        if self.speaks == Speaks::Readyz {
            assert_eq!(self.json()["status"], "unavailable", "{}", self.text());
            return;
        }
        assert_eq!(
            self.retry_after.as_deref(),
            Some("1"),
            "{}: a 503 without Retry-After",
            self.what
        );
        match self.speaks {
            Speaks::Twirp => assert_eq!(self.json()["code"], "unavailable", "{}", self.text()),
            Speaks::Azure => {
                assert!(
                    self.text().contains("<Code>ServerBusy</Code>"),
                    "{}",
                    self.text()
                )
            }
            Speaks::V1 => assert!(self.json()["message"].is_string(), "{}", self.text()),
            Speaks::Readyz => unreachable!(),
        }
    }
}

/// A private S3 server, and hoard on it.
struct Rig {
    s3: PrivateS3,
    hoard: Hoard,
    _data: tempfile::TempDir,
    http: reqwest::Client,
    token: String,
}

impl Rig {
    fn start() -> Self {
        let s3 = PrivateS3::start();
        s3.make_bucket(BUCKET);
        let data = tempfile::tempdir().unwrap();
        let secret = common::secret_file(data.path());
        let hoard = Hoard::start_with_env(
            data.path(),
            &[
                "--token-hs256-secret-file",
                secret.to_str().unwrap(),
                "--storage-url",
                &format!("s3://{BUCKET}/cache"),
            ],
            &s3.server.env(),
        );
        Self {
            s3,
            hoard,
            _data: data,
            // No request of a test may hang it: a hang fails as a missing answer.
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            token: main_token(),
        }
    }

    async fn send(
        &self,
        what: &'static str,
        speaks: Speaks,
        req: reqwest::RequestBuilder,
    ) -> Answer {
        let started = Instant::now();
        let (status, retry_after, body) = match req.send().await {
            Ok(res) => {
                let status = res.status().as_u16();
                let retry_after = res
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_owned());
                match res.bytes().await {
                    Ok(body) => (status, retry_after, body.to_vec()),
                    Err(e) => (0, None, format!("body: {e}").into_bytes()),
                }
            }
            Err(e) => (0, None, format!("{e}").into_bytes()),
        };
        Answer {
            what,
            speaks,
            status,
            retry_after,
            body,
            took: started.elapsed(),
        }
    }

    async fn twirp(&self, what: &'static str, method: &str, body: Value) -> Answer {
        let req = self
            .http
            .post(format!("{}{SERVICE}{method}", self.hoard.base))
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body.to_string());
        self.send(what, Speaks::Twirp, req).await
    }

    fn v1(&self, method: reqwest::Method, resource: &str) -> reqwest::RequestBuilder {
        self.http
            .request(
                method,
                format!("{}/_apis/artifactcache/{resource}", self.hoard.base),
            )
            .header("accept", "application/json;api-version=6.0-preview.1")
            .bearer_auth(&self.token)
    }

    async fn readyz(&self) -> Answer {
        let req = self.http.get(format!("{}/readyz", self.hoard.base));
        self.send("GET /readyz", Speaks::Readyz, req).await
    }

    /// CreateCacheEntry for `key`, its answer kept in `answers`; the upload link if it gave one.
    async fn create_v2(&self, key: &str, answers: &mut Vec<Answer>) -> Option<String> {
        let created = self
            .twirp(
                "Twirp CreateCacheEntry",
                "CreateCacheEntry",
                json!({ "key": key, "version": VERSION }),
            )
            .await;
        let url = created
            .ok()
            .then(|| {
                created.json()["signed_upload_url"]
                    .as_str()
                    .map(str::to_owned)
            })
            .flatten();
        answers.push(created);
        url
    }

    /// FinalizeCacheEntryUpload of `size` bytes for `key`, its answer kept in `answers`;
    /// whether the entry was saved.
    async fn finalize_v2(&self, key: &str, size: usize, answers: &mut Vec<Answer>) -> bool {
        let finalize = self
            .twirp(
                "Twirp FinalizeCacheEntryUpload",
                "FinalizeCacheEntryUpload",
                json!({ "key": key, "version": VERSION, "size_bytes": size.to_string() }),
            )
            .await;
        let saved = finalize.ok() && finalize.json()["ok"] == true;
        answers.push(finalize);
        saved
    }

    /// The v2 client's save of `data` as one Put Blob; the answers, and whether it saved.
    async fn save_v2(&self, key: &str, data: &[u8]) -> (Vec<Answer>, bool) {
        let mut answers = Vec::new();
        let Some(url) = self.create_v2(key, &mut answers).await else {
            return (answers, false);
        };
        let put = self
            .http
            .put(&url)
            .header("x-ms-blob-type", "BlockBlob")
            .body(data.to_vec());
        let put = self.send("Azure Put Blob", Speaks::Azure, put).await;
        let put_ok = put.status == 201;
        answers.push(put);
        if !put_ok {
            return (answers, false);
        }
        let saved = self.finalize_v2(key, data.len(), &mut answers).await;
        (answers, saved)
    }

    /// The v2 client's save of `blocks` as Put Block after Put Block, then Put Block List.
    async fn save_v2_blocks(&self, key: &str, blocks: &[Vec<u8>]) -> (Vec<Answer>, bool) {
        let mut answers = Vec::new();
        let Some(url) = self.create_v2(key, &mut answers).await else {
            return (answers, false);
        };
        let mut list = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>");
        for (i, block) in blocks.iter().enumerate() {
            let id = format!("YmxvY2st{i:04}");
            let put = self
                .http
                .put(format!("{url}&comp=block&blockid={id}"))
                .body(block.clone());
            let put = self.send("Azure Put Block", Speaks::Azure, put).await;
            let put_ok = put.status == 201;
            answers.push(put);
            if !put_ok {
                return (answers, false);
            }
            list.push_str(&format!("<Latest>{id}</Latest>"));
        }
        list.push_str("</BlockList>");
        let commit = self
            .http
            .put(format!("{url}&comp=blocklist"))
            .header("content-type", "application/xml")
            .body(list);
        let commit = self
            .send("Azure Put Block List", Speaks::Azure, commit)
            .await;
        let committed = commit.status == 201;
        answers.push(commit);
        if !committed {
            return (answers, false);
        }
        let size: usize = blocks.iter().map(Vec::len).sum();
        let saved = self.finalize_v2(key, size, &mut answers).await;
        (answers, saved)
    }

    /// The v2 client's restore of `key`: the answers, and the bytes of a hit downloaded whole.
    async fn restore_v2(&self, key: &str) -> (Vec<Answer>, Option<Vec<u8>>) {
        let mut answers = Vec::new();
        let found = self
            .twirp(
                "Twirp GetCacheEntryDownloadURL",
                "GetCacheEntryDownloadURL",
                json!({ "key": key, "version": VERSION }),
            )
            .await;
        let url = found
            .ok()
            .then(|| {
                found.json()["signed_download_url"]
                    .as_str()
                    .map(str::to_owned)
            })
            .flatten()
            .filter(|_| found.json()["ok"] == true);
        answers.push(found);
        let Some(url) = url else {
            return (answers, None);
        };
        let get = self
            .send("GET download link (v2)", Speaks::Azure, self.http.get(url))
            .await;
        let bytes = (get.status == 200).then(|| get.body.clone());
        answers.push(get);
        (answers, bytes)
    }

    /// The v1 client's save of `data` in one PATCH (chunked, as it sends them).
    async fn save_v1(&self, key: &str, data: &[u8]) -> (Vec<Answer>, bool) {
        let mut answers = Vec::new();
        let reserve = self
            .v1(reqwest::Method::POST, "caches")
            .header("content-type", "application/json")
            .body(json!({ "key": key, "version": VERSION, "cacheSize": data.len() }).to_string());
        let reserve = self.send("v1 POST caches", Speaks::V1, reserve).await;
        let id = (reserve.status == 201)
            .then(|| reserve.json()["cacheId"].as_i64())
            .flatten();
        answers.push(reserve);
        let Some(id) = id else {
            return (answers, false);
        };
        let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
            data.chunks(64 << 10).map(|c| Ok(c.to_vec())).collect();
        let patch = self
            .v1(reqwest::Method::PATCH, &format!("caches/{id}"))
            .header("content-type", "application/octet-stream")
            .header("content-range", format!("bytes 0-{}/*", data.len() - 1))
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                pieces,
            )));
        let patch = self.send("v1 PATCH caches/{id}", Speaks::V1, patch).await;
        let patched = patch.status == 204;
        answers.push(patch);
        if !patched {
            return (answers, false);
        }
        let commit = self
            .v1(reqwest::Method::POST, &format!("caches/{id}"))
            .header("content-type", "application/json")
            .body(json!({ "size": data.len() }).to_string());
        let commit = self.send("v1 POST caches/{id}", Speaks::V1, commit).await;
        let committed = commit.status == 204;
        answers.push(commit);
        (answers, committed)
    }

    /// The v1 client's restore of `key`.
    async fn restore_v1(&self, key: &str) -> (Vec<Answer>, Option<Vec<u8>>) {
        let mut answers = Vec::new();
        let keys = common::percent_encode(key);
        let lookup = self.v1(
            reqwest::Method::GET,
            &format!("cache?keys={keys}&version={VERSION}"),
        );
        let lookup = self.send("v1 GET cache", Speaks::V1, lookup).await;
        let url = (lookup.status == 200)
            .then(|| lookup.json()["archiveLocation"].as_str().map(str::to_owned))
            .flatten();
        answers.push(lookup);
        let Some(url) = url else {
            return (answers, None);
        };
        let get = self
            .send(
                "GET archiveLocation (v1)",
                Speaks::Azure,
                self.http.get(url),
            )
            .await;
        let bytes = (get.status == 200).then(|| get.body.clone());
        answers.push(get);
        (answers, bytes)
    }

    /// Saves `v2-{tag}` (Put Blob), `blocks-{tag}` (Put Block) and `v1-{tag}`, and restores what
    /// was given as `earlier` (keys and their bytes), all at once as several runners would.
    /// Every answer, and whether everything saved and every restore was byte-identical.
    async fn round(&self, tag: &str, earlier: &[(String, Vec<u8>)]) -> (Vec<Answer>, bool) {
        let seed = tag.bytes().map(u64::from).sum::<u64>();
        let small = random_bytes(SMALL, seed);
        // A large block goes to the store in one streamed PUT through a presigned link, a
        // small body (and v1's chunked PATCH) through object_store's client: both are tried.
        let blocks = [
            random_bytes(LARGE_BLOCK, seed + 1),
            random_bytes(SMALL, seed + 2),
        ];
        let (v2_key, blocks_key, v1_key) = (
            format!("v2-{tag}"),
            format!("blocks-{tag}"),
            format!("v1-{tag}"),
        );
        let restores =
            futures_util::future::join_all(earlier.iter().map(|(key, bytes)| async move {
                let (mut answers, got) = if key.starts_with("v1-") {
                    self.restore_v1(key).await
                } else {
                    self.restore_v2(key).await
                };
                let intact = got.as_deref() == Some(bytes.as_slice());
                if let Some(got) = got {
                    // A hit is whole or it is not a hit.
                    assert_eq!(got.len(), bytes.len(), "{key}: a hit of another length");
                    assert!(intact, "{key}: a hit with other bytes");
                }
                (std::mem::take(&mut answers), intact)
            }));
        let (v2, blocked, v1, ready, restored) = tokio::join!(
            self.save_v2(&v2_key, &small),
            self.save_v2_blocks(&blocks_key, &blocks),
            self.save_v1(&v1_key, &small),
            self.readyz(),
            restores,
        );
        let ready_ok = ready.ok();
        let mut answers = vec![ready];
        let mut all = ready_ok && v2.1 && blocked.1 && v1.1;
        answers.extend(v2.0);
        answers.extend(blocked.0);
        answers.extend(v1.0);
        for (restore, intact) in restored {
            answers.extend(restore);
            all &= intact;
        }
        (answers, all)
    }

    /// Polls `/readyz` until it is 200: the time that took.
    async fn ready_within(&self, bound: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let ready = self.readyz().await;
            if ready.ok() {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < bound,
                "/readyz is still {} after {bound:?}: {}",
                ready.status,
                ready.text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs rounds until one saves and restores everything: the time from `since` until that
    /// round was answered.
    async fn serving_within(&self, tag: &str, since: Instant, bound: Duration) -> Duration {
        let started = Instant::now();
        for attempt in 0.. {
            let (answers, all) = self.round(&format!("{tag}-{attempt}"), &[]).await;
            for answer in &answers {
                assert_ne!(answer.status, 500, "{}: {}", answer.what, answer.text());
            }
            if all {
                let served = since.elapsed();
                // What this round saved restores, byte for byte.
                let saved = self.saved_by(&format!("{tag}-{attempt}"));
                let (_, restored) = self.round(&format!("{tag}-check-{attempt}"), &saved).await;
                assert!(restored, "what was saved after recovery does not restore");
                return served;
            }
            assert!(
                started.elapsed() < bound,
                "hoard does not serve again within {bound:?}:\n{}",
                summary(&answers)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        unreachable!()
    }

    /// The keys [`Rig::round`] saved for `tag` (Put Blob and v1) and their bytes.
    fn saved_by(&self, tag: &str) -> Vec<(String, Vec<u8>)> {
        let seed = tag.bytes().map(u64::from).sum::<u64>();
        vec![
            (format!("v2-{tag}"), random_bytes(SMALL, seed)),
            (format!("v1-{tag}"), random_bytes(SMALL, seed)),
        ]
    }
}

/// What the clients saw: per request shape, the statuses and the slowest answer.
fn summary(answers: &[Answer]) -> String {
    let mut by: BTreeMap<&str, (BTreeMap<u16, usize>, Duration)> = BTreeMap::new();
    for a in answers {
        let (statuses, slowest) = by.entry(a.what).or_default();
        *statuses.entry(a.status).or_default() += 1;
        *slowest = (*slowest).max(a.took);
    }
    by.iter()
        .map(|(what, (statuses, slowest))| {
            let statuses: Vec<String> = statuses.iter().map(|(s, n)| format!("{s}×{n}")).collect();
            format!("  {what}: {} (slowest {slowest:.2?})", statuses.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A round while the store cannot serve: every answer a success or a retryable 503 within the
/// bound; what needs the store a 503 (it could not have succeeded); `/readyz` says `readiness`.
fn assert_store_unavailable(answers: &[Answer], readiness: &str) {
    for answer in answers {
        answer.assert_success_or_retry();
        if matches!(
            answer.what,
            "Azure Put Blob"
                | "Azure Put Block"
                | "v1 PATCH caches/{id}"
                | "GET download link (v2)"
                | "GET archiveLocation (v1)"
        ) {
            assert_eq!(answer.status, 503, "{}: {}", answer.what, answer.text());
        }
    }
    let ready = answers.iter().find(|a| a.what == "GET /readyz").unwrap();
    assert_eq!(ready.json()["error"], readiness, "{}", ready.text());
}

/// Saves an entry through each protocol before a fault: what the test restores during and
/// after it.
async fn saved_before(rig: &Rig) -> Vec<(String, Vec<u8>)> {
    let (answers, all) = rig.round("before", &[]).await;
    assert!(
        all,
        "the store works before the fault:\n{}",
        summary(&answers)
    );
    rig.saved_by("before")
}

/// The store killed: connections refused. Every answer a success or a retryable 503 within the
/// bound, the store-bound ones 503; started again (empty, its bucket made anew, as a store
/// that came back without its data), hoard is ready and serves by itself, and the entries whose
/// chunks went are misses.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_that_refuses_connections_is_a_503_and_hoard_recovers_by_itself() {
    let mut rig = Rig::start();
    let earlier = saved_before(&rig).await;

    rig.s3.kill();
    let (answers, _) = rig.round("refused", &earlier).await;
    eprintln!("store refusing connections:\n{}", summary(&answers));
    assert_store_unavailable(&answers, "the chunk store does not answer");
    // Server errors are always logged, with the route template and the status.
    let failed = || {
        let log = rig.hoard.log.lock().unwrap();
        log.iter()
            .filter(|l| l.contains("ERROR") && l.contains("response failed"))
            .cloned()
            .collect::<Vec<_>>()
    };
    let logged = common::eventually(Duration::from_secs(10), || {
        failed().iter().any(|l| l.contains("status=503"))
    })
    .await;
    assert!(logged, "no 503 is logged at error level: {:#?}", failed());
    assert!(
        failed()
            .iter()
            .all(|l| l.contains("route=/") && !l.contains("sig=")),
        "{:#?}",
        failed()
    );
    let log = rig.hoard.log.lock().unwrap().join("\n");
    assert!(!log.contains(&rig.s3.server.secret_access_key), "{log}");
    drop(log);

    rig.s3.start_again();
    rig.s3.make_bucket(BUCKET);
    let back = Instant::now();
    let ready = rig.ready_within(RECOVERY_BOUND).await;
    let serving = rig
        .serving_within("after-refused", back, RECOVERY_BOUND)
        .await;
    eprintln!(
        "store back (empty): /readyz 200 after {ready:.2?}, a whole round served after {serving:.2?}"
    );
    // The entries saved before lost their chunks with the server: misses, never a 500.
    let (answers, _) = rig.round("after-refused-earlier", &earlier).await;
    eprintln!("entries whose chunks went:\n{}", summary(&answers));
    for answer in &answers {
        assert!(
            answer.status != 500 && answer.status != 0,
            "{}: {}",
            answer.what,
            answer.text()
        );
    }
    for (key, _) in &earlier {
        let (_, got) = if key.starts_with("v1-") {
            rig.restore_v1(key).await
        } else {
            rig.restore_v2(key).await
        };
        assert_eq!(got, None, "{key}: its chunks are gone, it must be a miss");
    }
}

/// The store paused (SIGSTOP): connections accepted and never answered. Every answer a success
/// or a retryable 503 within the bound, never a hang; resumed, hoard serves by itself and what
/// was saved before restores byte-identical.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_store_is_a_503_within_bounds_and_hoard_recovers_by_itself() {
    let rig = Rig::start();
    let earlier = saved_before(&rig).await;

    rig.s3.pause();
    let (answers, _) = rig.round("paused", &earlier).await;
    eprintln!("store paused:\n{}", summary(&answers));
    assert_store_unavailable(&answers, "the chunk store does not answer within 5 s");

    rig.s3.resume();
    let back = Instant::now();
    let ready = rig.ready_within(RECOVERY_BOUND).await;
    let serving = rig
        .serving_within("after-paused", back, RECOVERY_BOUND)
        .await;
    eprintln!(
        "store resumed: /readyz 200 after {ready:.2?}, a whole round served after {serving:.2?}"
    );
    // Nothing acknowledged before the pause is lost.
    let (answers, all) = rig.round("after-paused-earlier", &earlier).await;
    assert!(
        all,
        "what was saved before the pause restores:\n{}",
        summary(&answers)
    );
}

/// The bucket emptied and made anew under a running hoard: `/readyz` is 200 again by itself
/// (the layout marker written again), an entry whose chunks went is a miss (never a 500), and
/// new saves restore.
#[tokio::test(flavor = "multi_thread")]
async fn an_emptied_bucket_is_ready_again_by_itself_and_lost_entries_are_misses() {
    let rig = Rig::start();
    let earlier = saved_before(&rig).await;

    rig.s3.empty_and_make(BUCKET);
    let emptied = Instant::now();
    let (answers, _) = rig.round("emptied", &earlier).await;
    eprintln!("bucket emptied and made anew:\n{}", summary(&answers));
    for answer in &answers {
        assert!(
            answer.status != 500 && answer.status != 0 && answer.took <= ANSWER_BOUND,
            "{}: {} after {:?}: {}",
            answer.what,
            answer.status,
            answer.took,
            answer.text()
        );
    }
    let ready = rig.ready_within(RECOVERY_BOUND).await;
    let serving = rig
        .serving_within("after-emptied", emptied, RECOVERY_BOUND)
        .await;
    eprintln!(
        "bucket emptied: /readyz 200 {ready:.2?} after the round above, a whole round served \
         {serving:.2?} after the emptying"
    );
    for (key, _) in &earlier {
        let (answers, got) = if key.starts_with("v1-") {
            rig.restore_v1(key).await
        } else {
            rig.restore_v2(key).await
        };
        assert_eq!(got, None, "{key}: its chunks are gone, it must be a miss");
        for answer in &answers {
            assert_ne!(answer.status, 500, "{}: {}", answer.what, answer.text());
        }
    }
}

/// A download under way when the store goes away ends with an error the client sees (its
/// body is cut short of `Content-Length`, which reqwest reports), never a clean short end,
/// and hoard logs one line with the entry and the cause.
#[tokio::test(flavor = "multi_thread")]
async fn a_download_cut_mid_stream_is_an_error_for_the_client() {
    let mut rig = Rig::start();
    // Eight blocks of 4 MiB, as the Azure SDK stages a large archive: eight chunks, opened
    // one after the other as the download reaches them.
    let blocks: Vec<Vec<u8>> = (0..8).map(|i| random_bytes(4 << 20, 100 + i)).collect();
    let whole: usize = blocks.iter().map(Vec::len).sum();
    let (answers, saved) = rig.save_v2_blocks("large", &blocks).await;
    assert!(saved, "{}", summary(&answers));
    let entry_id = answers.last().unwrap().json()["entry_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let found = rig
        .twirp(
            "Twirp GetCacheEntryDownloadURL",
            "GetCacheEntryDownloadURL",
            json!({ "key": "large", "version": VERSION }),
        )
        .await;
    let url = found.json()["signed_download_url"]
        .as_str()
        .unwrap()
        .to_owned();

    let mut res = rig.http.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.content_length(), Some(whole as u64));
    let mut got = 0usize;
    while got < 1 << 20 {
        got += res.chunk().await.unwrap().expect("the body goes on").len();
    }
    rig.s3.kill();
    let cut = Instant::now();
    let end = loop {
        match res.chunk().await {
            Ok(Some(bytes)) => got += bytes.len(),
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    eprintln!(
        "download cut: {got} of {whole} bytes, then {:?} after {:.2?}",
        end.as_ref().map_err(ToString::to_string),
        cut.elapsed()
    );
    assert!(
        end.is_err(),
        "the body ended cleanly after {got} of {whole} bytes"
    );
    assert!(got < whole, "{got} of {whole}");

    // One line, with the entry and the cause (log lines come through a pipe, a moment later).
    let broke_off = || {
        let log = rig.hoard.log.lock().unwrap();
        log.iter()
            .filter(|l| l.contains("a download broke off"))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert!(
        common::eventually(Duration::from_secs(10), || !broke_off().is_empty()).await,
        "no line says the download broke off"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lines = broke_off();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains(&format!("entry={entry_id}")),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains("error="),
        "the cause is logged: {}",
        lines[0]
    );
}
