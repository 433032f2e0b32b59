//! A protocol client that sends exactly what `@actions/cache` 6.3.0 sends: Twirp JSON calls,
//! Azure-style Put Blob / Put Block / Put Block List uploads, and plain GET downloads.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use serde_json::{json, Value};

const SERVICE: &str = "/twirp/github.actions.results.api.v1.CacheService/";

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Protocol(String),
    #[error("HTTP: {0}")]
    Http(#[from] reqwest::Error),
}

pub type Result<T> = std::result::Result<T, BenchError>;

fn fail<T>(msg: impl Into<String>) -> Result<T> {
    Err(BenchError::Protocol(msg.into()))
}

#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    /// Compare downloaded bytes with what was uploaded (false for the null baseline, which
    /// serves zeros: only the length is checked there).
    pub verify_content: bool,
    /// Servers behind this one (an edge's origin): their background work is the target's too.
    behind: Vec<String>,
}

impl Client {
    pub fn new(base: &str, token: &str, verify_content: bool) -> Self {
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .http1_only()
            .build()
            .expect("a plain HTTP client always builds");
        Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            verify_content,
            behind: Vec::new(),
        }
    }

    /// This client, for a target with `servers` behind it (an edge's origin).
    pub fn behind(mut self, servers: Vec<String>) -> Self {
        self.behind = servers;
        self
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The same connections, sending another token (another job's identity).
    pub fn with_token(&self, token: &str) -> Self {
        Self {
            token: token.to_owned(),
            ..self.clone()
        }
    }

    async fn twirp(&self, method: &str, body: Value) -> Result<Value> {
        let res = self
            .http
            .post(format!("{}{SERVICE}{method}", self.base))
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?;
        let status = res.status();
        let text = res.text().await?;
        if !status.is_success() {
            return fail(format!("{method}: HTTP {status}: {text}"));
        }
        serde_json::from_str(&text).or_else(|_| fail(format!("{method}: not JSON: {text}")))
    }

    /// CreateCacheEntry; returns the signed upload URL.
    pub async fn reserve(&self, key: &str, version: &str) -> Result<String> {
        let res = self
            .twirp(
                "CreateCacheEntry",
                json!({ "key": key, "version": version }),
            )
            .await?;
        match res["signed_upload_url"].as_str() {
            Some(url) if res["ok"] == true => Ok(url.to_owned()),
            _ => fail(format!("CreateCacheEntry {key}: {res}")),
        }
    }

    /// Put Blob: the whole archive in one request (what the SDK does up to 128 MiB).
    pub async fn put_whole(&self, url: &str, data: Bytes) -> Result<()> {
        let res = self
            .http
            .put(url)
            .header("x-ms-blob-type", "BlockBlob")
            .header("x-ms-version", "2026-02-06")
            .header("content-type", "application/octet-stream")
            .body(data)
            .send()
            .await?;
        expect_201(res, "Put Blob").await
    }

    /// Put Block for each `block`-sized piece, `in_flight` at a time, then Put Block List.
    pub async fn put_blocks(
        &self,
        url: &str,
        data: Bytes,
        block: usize,
        in_flight: usize,
    ) -> Result<()> {
        let prefix = hoard_model::random_uuid();
        let count = data.len().div_ceil(block.max(1)).max(1);
        let ids: Vec<String> = (0..count)
            .map(|i| STANDARD.encode(format!("{prefix}{i:012}")))
            .collect();
        futures_util::stream::iter(ids.iter().enumerate())
            .map(|(i, id)| {
                let piece =
                    data.slice((i * block).min(data.len())..((i + 1) * block).min(data.len()));
                let req = self
                    .http
                    .put(format!("{url}&comp=block&blockid={}", encode_query(id)))
                    .header("x-ms-version", "2026-02-06")
                    .header("content-type", "application/octet-stream")
                    .body(piece);
                async move { expect_201(req.send().await?, "Put Block").await }
            })
            .buffer_unordered(in_flight.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        let list: String = ids
            .iter()
            .map(|id| format!("<Latest>{id}</Latest>"))
            .collect();
        let xml = format!(
            r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?><BlockList>{list}</BlockList>"#
        );
        let res = self
            .http
            .put(format!("{url}&comp=blocklist"))
            .header("x-ms-version", "2026-02-06")
            .header("content-type", "application/xml")
            .body(xml)
            .send()
            .await?;
        expect_201(res, "Put Block List").await
    }

    pub async fn finalize(&self, key: &str, version: &str, size: usize) -> Result<()> {
        let res = self
            .twirp(
                "FinalizeCacheEntryUpload",
                json!({ "key": key, "size_bytes": size.to_string(), "version": version }),
            )
            .await?;
        if res["ok"] != true {
            return fail(format!("FinalizeCacheEntryUpload {key}: {res}"));
        }
        Ok(())
    }

    /// GetCacheEntryDownloadURL; the signed URL of the hit, or `None` for a miss.
    pub async fn lookup(
        &self,
        key: &str,
        restore_keys: &[&str],
        version: &str,
    ) -> Result<Option<String>> {
        Ok(self
            .lookup_matched(key, restore_keys, version)
            .await?
            .map(|(url, _)| url))
    }

    /// GetCacheEntryDownloadURL; the signed URL and the matched key of the hit, or `None`.
    pub async fn lookup_matched(
        &self,
        key: &str,
        restore_keys: &[&str],
        version: &str,
    ) -> Result<Option<(String, String)>> {
        let mut req = json!({ "key": key, "version": version });
        if !restore_keys.is_empty() {
            req["restore_keys"] = json!(restore_keys);
        }
        let res = self.twirp("GetCacheEntryDownloadURL", req).await?;
        if res["ok"] != true {
            return Ok(None);
        }
        match (
            res["signed_download_url"].as_str(),
            res["matched_key"].as_str(),
        ) {
            (Some(url), Some(matched)) => Ok(Some((url.to_owned(), matched.to_owned()))),
            (Some(url), None) => Ok(Some((url.to_owned(), key.to_owned()))),
            (None, _) => fail(format!(
                "GetCacheEntryDownloadURL {key}: ok without a URL: {res}"
            )),
        }
    }

    /// A save as `@actions/cache` 6.3.0 makes it: reserve, one Put Blob up to `single_put_max`
    /// bytes (else `block`-sized Put Blocks, `in_flight` at a time, and Put Block List), finalize.
    pub async fn save_sdk(
        &self,
        key: &str,
        version: &str,
        payload: Bytes,
        single_put_max: usize,
        block: usize,
        in_flight: usize,
    ) -> Result<()> {
        let url = self.reserve(key, version).await?;
        let size = payload.len();
        if size <= single_put_max {
            self.put_whole(&url, payload).await?;
        } else {
            self.put_blocks(&url, payload, block, in_flight).await?;
        }
        self.finalize(key, version, size).await
    }

    /// Plain GET of a download URL, checking length (and content unless disabled).
    pub async fn download(&self, url: &str, expected: &Bytes) -> Result<u64> {
        let res = self
            .http
            .get(url)
            .header("user-agent", "actions/cache")
            .send()
            .await?;
        if res.status() != 200 {
            return fail(format!("download: HTTP {}", res.status()));
        }
        let mut stream = res.bytes_stream();
        let mut pos = 0usize;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            let end = pos + chunk.len();
            if end > expected.len() {
                return fail(format!(
                    "download: more than the {} bytes uploaded",
                    expected.len()
                ));
            }
            if self.verify_content && expected[pos..end] != chunk[..] {
                return fail(format!(
                    "download: bytes {pos}..{end} differ from what was uploaded"
                ));
            }
            pos = end;
        }
        if pos != expected.len() {
            return fail(format!(
                "download: {pos} bytes instead of {}",
                expected.len()
            ));
        }
        Ok(pos as u64)
    }

    /// Entries the server, and those behind it, have yet to digest in the background
    /// (`hoard_digests_pending` in their metrics); `None` if none of them reports it.
    pub async fn digests_pending(&self) -> Option<u64> {
        let servers = std::iter::once(&self.base).chain(&self.behind);
        let pending = futures_util::future::join_all(servers.map(|s| self.digests_pending_at(s)));
        pending.await.into_iter().flatten().reduce(|a, b| a + b)
    }

    async fn digests_pending_at(&self, base: &str) -> Option<u64> {
        let res = self.http.get(format!("{base}/metrics")).send().await.ok()?;
        if !res.status().is_success() {
            return None;
        }
        let text = res.text().await.ok()?;
        let value = text
            .lines()
            .find_map(|line| line.strip_prefix("hoard_digests_pending "))?;
        value.trim().parse::<f64>().ok().map(|n| n as u64)
    }

    /// Lookup then download: what a restore does.
    pub async fn restore(&self, key: &str, version: &str, expected: &Bytes) -> Result<u64> {
        match self.lookup(key, &[], version).await? {
            Some(url) => self.download(&url, expected).await,
            None => fail(format!("lookup {key}: miss for an entry that was saved")),
        }
    }
}

async fn expect_201(res: reqwest::Response, what: &str) -> Result<()> {
    let status = res.status();
    if status != 201 {
        let body = res.text().await.unwrap_or_default();
        return fail(format!(
            "{what}: HTTP {status} (the SDK needs exactly 201): {body}"
        ));
    }
    Ok(())
}

/// Percent-encodes a query value (block ids are base64: `+`, `/`, `=`).
fn encode_query(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}
