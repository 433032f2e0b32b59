//! Read-through to an upstream cache (`--upstream-cache`, issue #59): on a local miss of a v2
//! lookup, hoard asks the upstream (GitHub's cache service) with the job's own token. A hit is
//! fetched and stored in the job's own scope (`cache/read_through.rs`), and the client gets
//! hoard's link to it, so the next restore is local; a job that may not write there, or an
//! entry larger than `--upstream-cache-max-size`, gets the upstream's own link. Upstream errors
//! and time-outs are misses, never failures. At most `--upstream-cache-fetches` run at once,
//! and concurrent misses of one lookup make one fetch.
//!
//! Only a runtime token an issuer gave the job goes upstream, never one of hoard's own (tool
//! and developer tokens), and nothing of a token is logged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{header, HeaderMap};
use futures_util::TryStreamExt;
use tokio::sync::Semaphore;

use super::proto::{GetCacheEntryDownloadUrlRequest, GetCacheEntryDownloadUrlResponse};
use super::AppState;
use crate::auth::Identity;
use crate::config;
use crate::model::{CallerKind, LogSafe, Lookup};

/// The upstream cache and what bounds its use.
#[derive(Debug)]
pub struct UpstreamCache {
    base: String,
    /// Its host, as an entry's record names it.
    host: String,
    /// For lookups: the answer as it is.
    api: reqwest::Client,
    /// For entries' bytes: storage links may redirect.
    bytes: reqwest::Client,
    timeout: Duration,
    max_size: u64,
    fetches: Arc<Semaphore>,
    /// One lock per lookup being read through: concurrent misses wait for the first.
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl UpstreamCache {
    pub fn new(config: &config::UpstreamCache, idle: Duration) -> Result<Self, String> {
        let client = |redirects| {
            reqwest::Client::builder()
                .connect_timeout(config.timeout)
                .read_timeout(idle)
                .redirect(redirects)
                .build()
                .map_err(|e| format!("cannot build the HTTP client for --upstream-cache: {e}"))
        };
        Ok(Self {
            base: config.url.as_str().trim_end_matches('/').to_owned(),
            host: config.url.host_str().unwrap_or_default().to_owned(),
            api: client(reqwest::redirect::Policy::none())?,
            bytes: client(reqwest::redirect::Policy::limited(3))?,
            timeout: config.timeout,
            max_size: config.max_size,
            fetches: Arc::new(Semaphore::new(config.fetches)),
            flights: Mutex::default(),
        })
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// The lock of one lookup's read-through; dropped from the map once nobody holds it.
    fn flight(&self, question: String) -> Flight<'_> {
        let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        let lock = flights.entry(question.clone()).or_default().clone();
        Flight {
            cache: self,
            question,
            lock,
        }
    }

    /// The upstream's answer to `req` with the job's `authorization`, if it is a hit.
    async fn ask(
        &self,
        authorization: &header::HeaderValue,
        req: &GetCacheEntryDownloadUrlRequest,
    ) -> Option<GetCacheEntryDownloadUrlResponse> {
        let mut body = serde_json::json!({ "key": req.key, "version": req.version });
        if !req.restore_keys.is_empty() {
            body["restore_keys"] = serde_json::json!(req.restore_keys);
        }
        let asked = self
            .api
            .post(format!(
                "{}{}GetCacheEntryDownloadURL",
                self.base,
                super::twirp::SERVICE_PATH
            ))
            .header(header::AUTHORIZATION, authorization.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .timeout(self.timeout)
            .send()
            .await;
        let answer = match asked {
            Ok(answer) if answer.status().is_success() => answer,
            Ok(answer) => {
                tracing::info!(upstream = %self.host, status = answer.status().as_u16(), "the upstream cache refused a lookup: a miss");
                return None;
            }
            Err(e) => {
                tracing::warn!(upstream = %self.host, error = %LogSafe(&e.to_string()), "the upstream cache did not answer a lookup: a miss");
                return None;
            }
        };
        let value: serde_json::Value = tokio::time::timeout(self.timeout, answer.json())
            .await
            .ok()?
            .ok()?;
        let text = |name: &str| {
            value
                .get(name)?
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        (value["ok"] == true).then_some(())?;
        Some(GetCacheEntryDownloadUrlResponse {
            ok: true,
            signed_download_url: text("signed_download_url")?,
            matched_key: text("matched_key")?,
        })
    }
}

/// A held read-through lock of one lookup.
struct Flight<'a> {
    cache: &'a UpstreamCache,
    question: String,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut flights = self.cache.flights.lock().unwrap_or_else(|p| p.into_inner());
        // The map's own reference and this one: nobody else waits.
        if Arc::strong_count(&self.lock) <= 2 {
            flights.remove(&self.question);
        }
    }
}

/// Whether the caller's credentials may go upstream: a runtime token an issuer gave the job.
fn may_go_upstream(who: &Identity, headers: &HeaderMap) -> Option<header::HeaderValue> {
    let authorization = headers.get(header::AUTHORIZATION)?;
    let token = authorization.to_str().ok()?.strip_prefix("Bearer ")?;
    let issued = matches!(
        who.kind,
        CallerKind::Github | CallerKind::Ghes | CallerKind::Hs256
    );
    (issued && !token.starts_with(crate::auth::tool_token::PREFIX)).then(|| authorization.clone())
}

/// A lookup that missed here, read through the upstream cache: hoard's answer with its own
/// link once stored, the upstream's answer with its link when it cannot be stored here, `None`
/// for a miss.
pub(super) async fn on_miss(
    app: &AppState,
    who: &Identity,
    address: Option<std::net::IpAddr>,
    headers: &HeaderMap,
    req: &GetCacheEntryDownloadUrlRequest,
    lookup: &Lookup,
) -> Option<GetCacheEntryDownloadUrlResponse> {
    let upstream = app.config().upstream_cache.as_ref()?;
    let authorization = may_go_upstream(who, headers)?;
    let question = format!(
        "{}\0{}\0{}\0{}\0{}",
        who.repository.as_str(),
        who.write_scope.as_ref().map_or("", |s| s.as_str()),
        req.key,
        req.restore_keys.join("\0"),
        req.version
    );
    let flight = upstream.flight(question);
    let _one = flight.lock.lock().await;
    // Another request may have stored it while this one waited.
    if let Ok(Some(hit)) = app.cache().lookup(who, address, lookup).await {
        return local_answer(app, headers, hit);
    }
    let Ok(_fetching) = upstream.fetches.clone().try_acquire_owned() else {
        tracing::info!(upstream = %upstream.host, "read-throughs at their bound (--upstream-cache-fetches): a miss");
        return None;
    };
    let found = upstream.ask(&authorization, req).await?;
    if !app.cache().may_store(who, &found.matched_key, &req.version) {
        // Read-only here: the client reads the upstream's copy itself.
        return Some(found);
    }
    let fetched = upstream
        .bytes
        .get(&found.signed_download_url)
        .timeout(upstream.timeout)
        .send()
        .await;
    let fetched = match fetched {
        Ok(answer) if answer.status().is_success() => answer,
        Ok(answer) => {
            tracing::warn!(upstream = %upstream.host, status = answer.status().as_u16(), "the upstream cache's link answered an error: the client gets the link");
            return Some(found);
        }
        Err(e) => {
            tracing::warn!(upstream = %upstream.host, error = %LogSafe(&e.to_string()), "the upstream cache's link did not answer: the client gets the link");
            return Some(found);
        }
    };
    let Some(len) = fetched.content_length().filter(|n| *n <= upstream.max_size) else {
        return Some(found);
    };
    let body = Box::pin(fetched.bytes_stream().map_err(std::io::Error::other));
    let stored = app
        .cache()
        .save_read_through(
            who,
            address,
            &found.matched_key,
            &req.version,
            body,
            len,
            &upstream.host,
        )
        .await;
    if let Err(e) = stored {
        tracing::warn!(upstream = %upstream.host, key = %LogSafe(&found.matched_key), error = %e, "an entry read through from the upstream cache was not stored: the client gets its link");
        return Some(found);
    }
    match app.cache().lookup(who, address, lookup).await {
        Ok(Some(hit)) => local_answer(app, headers, hit),
        _ => Some(found),
    }
}

fn local_answer(
    app: &AppState,
    headers: &HeaderMap,
    hit: crate::cache::Hit,
) -> Option<GetCacheEntryDownloadUrlResponse> {
    Some(GetCacheEntryDownloadUrlResponse {
        ok: true,
        signed_download_url: super::links::signed(app, headers, hit.entry).ok()?,
        matched_key: hit.matched_key,
    })
}
