//! Read-through to an upstream cache (`--upstream-cache`, issue #59): on a local miss of a v2
//! lookup, hoard asks the upstream (GitHub's cache service) with the job's own token. On a hit
//! the client gets a link of hoard's (`/_blob/through/<ticket>`) whose download streams the
//! upstream's bytes to it while storing them in the job's own scope (`cache/read_through.rs`),
//! so the first restore goes at the upstream's pace and the next is local. A job that may not
//! write there gets the upstream's own link; so does a second miss of the same lookup while the
//! first is being read through (one fetch each). An entry larger than
//! `--upstream-cache-max-size`, of no stated length, or asked by range is streamed, not stored.
//! Upstream errors and time-outs are misses, never failures; at most `--upstream-cache-fetches`
//! run at once. Nothing is stored but a whole entry of the length the upstream stated.
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
use crate::model::{CallerKind, LogSafe};

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
    /// The read-throughs handed out and not yet taken, by ticket.
    tickets: Mutex<HashMap<String, Arc<Ticket>>>,
    /// The lookups being read through (their questions) and since when: a second miss
    /// meanwhile is sent upstream. One older than [`TICKET_TTL`] no longer counts (its ticket
    /// was never used, as after a lookup-only restore).
    flights: Mutex<HashMap<String, std::time::Instant>>,
}

/// A read-through handed to a client: what its download fetches and stores.
#[derive(Debug)]
struct Ticket {
    link: String,
    who: Identity,
    address: Option<std::net::IpAddr>,
    key: String,
    version: String,
    question: String,
    at: std::time::Instant,
}

/// How long a ticket waits for its download.
const TICKET_TTL: Duration = Duration::from_secs(600);
/// The most tickets waiting at once; past it, clients get the upstream's links.
const MOST_TICKETS: usize = 1024;

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
            tickets: Mutex::default(),
            flights: Mutex::default(),
        })
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// Starts reading `question` through, unless it is already: false then.
    fn take_flight(&self, question: &str) -> bool {
        let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        flights.retain(|_, since| now.duration_since(*since) <= TICKET_TTL);
        if flights.contains_key(question) {
            return false;
        }
        flights.insert(question.to_owned(), now);
        true
    }

    fn land(&self, question: &str) {
        let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        flights.remove(question);
    }

    /// Hands out a ticket for `ticket`; `None` when too many wait.
    fn issue(&self, ticket: Ticket) -> Option<String> {
        let mut tickets = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        let stale: Vec<String> = tickets
            .iter()
            .filter(|(_, t)| now.duration_since(t.at) > TICKET_TTL)
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some(t) = tickets.remove(&name) {
                self.land(&t.question);
            }
        }
        if tickets.len() >= MOST_TICKETS {
            return None;
        }
        // Unguessable: holding it is what opens the download, as a signed link's signature.
        let name = crate::model::BlobName::random().as_str().to_owned();
        tickets.insert(name.clone(), Arc::new(ticket));
        Some(name)
    }

    /// The ticket `name`, taken: a ticket opens one download.
    /// The ticket `name`, left for the download it was issued for.
    fn peek(&self, name: &str) -> Option<Arc<Ticket>> {
        let tickets = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
        tickets.get(name).cloned()
    }

    fn take(&self, name: &str) -> Option<Arc<Ticket>> {
        let mut tickets = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
        tickets.remove(name)
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

/// A lookup that missed here, read through the upstream cache: a link of hoard's whose download
/// streams and stores the upstream's hit, or the upstream's own link when it cannot be stored
/// here; `None` for a miss.
pub(super) async fn on_miss(
    app: &AppState,
    who: &Identity,
    address: Option<std::net::IpAddr>,
    headers: &HeaderMap,
    req: &GetCacheEntryDownloadUrlRequest,
) -> Option<GetCacheEntryDownloadUrlResponse> {
    let upstream = app.config().upstream_cache.as_ref()?;
    let authorization = may_go_upstream(who, headers)?;
    let found = upstream.ask(&authorization, req).await?;
    if !app.cache().may_store(who, &found.matched_key, &req.version) {
        // Read-only here: the client reads the upstream's copy itself.
        return Some(found);
    }
    let question = format!(
        "{}\0{}\0{}\0{}",
        who.repository.as_str(),
        who.write_scope.as_ref().map_or("", |s| s.as_str()),
        found.matched_key,
        req.version
    );
    if !upstream.take_flight(&question) {
        // Being read through for another job: this one reads the upstream's copy.
        return Some(found);
    }
    let ticket = Ticket {
        link: found.signed_download_url.clone(),
        who: who.clone(),
        address,
        key: found.matched_key.clone(),
        version: req.version.clone(),
        question: question.clone(),
        at: std::time::Instant::now(),
    };
    let Some(name) = upstream.issue(ticket) else {
        upstream.land(&question);
        return Some(found);
    };
    let mut link = String::with_capacity(128);
    if super::links::push_base_url(app, headers, &mut link).is_err() {
        upstream.take(&name);
        upstream.land(&question);
        return Some(found);
    }
    // Three path segments and a query, as every client's link parser wants (links.rs).
    link.push_str(THROUGH_PREFIX);
    link.push_str(&name);
    link.push_str("?through=1");
    Some(GetCacheEntryDownloadUrlResponse {
        ok: true,
        signed_download_url: link,
        matched_key: found.matched_key,
    })
}

/// Bytes (in KiB) that may wait between a read-through's client and its store.
const IN_FLIGHT_KIB: usize = 8 << 10;

/// Where read-through downloads are served.
pub const THROUGH_PREFIX: &str = "/_blob/through/";

/// `GET /_blob/through/<ticket>`: the upstream's bytes, streamed to the client and, when they
/// can be, stored as they pass.
pub async fn download(
    app: &AppState,
    method: &axum::http::Method,
    name: &str,
    headers: &HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let not_found = || super::azure::AzureError::not_found().into_response();
    let Some(upstream) = app.config().upstream_cache.as_ref() else {
        return not_found();
    };
    // A HEAD (an Azure SDK's Get Properties) or a range is the upstream's to answer; the
    // ticket stays for the download that reads the whole entry through.
    let ranged = headers.contains_key(header::RANGE) || headers.contains_key("x-ms-range");
    if method == axum::http::Method::HEAD || ranged {
        return match upstream.peek(name) {
            Some(ticket) => redirect(&ticket.link),
            None => not_found(),
        };
    }
    if method != axum::http::Method::GET {
        return super::azure::AzureError::new(
            axum::http::StatusCode::METHOD_NOT_ALLOWED,
            "UnsupportedHttpVerb",
            format!("{method} is not supported on read-through links."),
        )
        .into_response();
    }
    let Some(ticket) = upstream.take(name) else {
        return not_found();
    };
    let landed = Landing {
        upstream: upstream.clone(),
        question: ticket.question.clone(),
    };
    let Ok(fetching) = upstream.fetches.clone().try_acquire_owned() else {
        tracing::info!(upstream = %upstream.host, "read-throughs at their bound (--upstream-cache-fetches): the client is sent upstream");
        return redirect(&ticket.link);
    };
    // The bound is on the answer's start; its body may take as long as it keeps coming (the
    // client's read timeout, the idle timeout, ends a silence).
    let failed = |why: String| {
        tracing::warn!(upstream = %upstream.host, reason = %LogSafe(&why), "the upstream cache's link did not send the entry");
        super::azure::AzureError::new(
            axum::http::StatusCode::BAD_GATEWAY,
            "ServerBusy",
            "the upstream cache did not send the entry",
        )
        .into_response()
    };
    let fetched =
        tokio::time::timeout(upstream.timeout, upstream.bytes.get(&ticket.link).send()).await;
    let fetched = match fetched {
        Ok(Ok(answer)) if answer.status() == reqwest::StatusCode::OK => answer,
        Ok(Ok(answer)) => return failed(format!("it answered {}", answer.status())),
        // Without the link: its query is a credential.
        Ok(Err(e)) => return failed(e.without_url().to_string()),
        Err(_) => return failed(format!("no answer within {:?}", upstream.timeout)),
    };
    let len = fetched.content_length();
    let bytes = fetched
        .bytes_stream()
        .map_err(|e| std::io::Error::other(e.without_url()));
    let mut response = axum::response::Response::new(axum::body::Body::empty());
    let out = response.headers_mut();
    out.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(len) = len {
        out.insert(header::CONTENT_LENGTH, header::HeaderValue::from(len));
    }
    let keep = len.filter(|n| *n > 0 && *n <= upstream.max_size);
    let Some(len) = keep else {
        *response.body_mut() = axum::body::Body::from_stream(bytes);
        return response;
    };
    // The store reads what the client is sent, as it is sent. Up to IN_FLIGHT bytes wait
    // between the two, so that neither waits for each write of the other; past it, the client
    // is slowed to the store's pace.
    let room = Arc::new(Semaphore::new(IN_FLIGHT_KIB));
    let (tx, rx) =
        tokio::sync::mpsc::unbounded_channel::<(bytes::Bytes, tokio::sync::OwnedSemaphorePermit)>();
    let stored: crate::model::ByteStream =
        Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            // The room is given back as the store takes the piece (it copies it into its blocks).
            rx.recv().await.map(|(piece, _room)| (Ok(piece), rx))
        }));
    {
        let (app, ticket, host) = (app.clone(), ticket.clone(), upstream.host.clone());
        tokio::spawn(async move {
            // Held until the entry is stored: the bound counts read-throughs under way, not
            // only their start.
            let (_landed, _fetching) = (landed, fetching);
            let saved = app
                .cache()
                .save_read_through(
                    &ticket.who,
                    ticket.address,
                    &ticket.key,
                    &ticket.version,
                    stored,
                    len,
                    &host,
                )
                .await;
            if let Err(e) = saved {
                tracing::info!(upstream = %host, key = %LogSafe(&ticket.key), error = %e, "an entry read through from the upstream cache was not stored");
            }
        });
    }
    let tee = Tee {
        bytes: Box::pin(bytes),
        store: Some(tx),
        room,
        batch: bytes::BytesMut::new(),
        left: len,
    };
    let teed = futures_util::stream::unfold(tee, |mut tee| async move {
        match futures_util::StreamExt::next(&mut tee.bytes).await {
            Some(Ok(piece)) => {
                tee.keep(&piece).await;
                Some((Ok(piece), tee))
            }
            Some(Err(e)) => {
                // A failed stream is not stored: the store sees it end short.
                tee.store = None;
                Some((Err(e), tee))
            }
            None => {
                tee.flush().await;
                None
            }
        }
    });
    *response.body_mut() = axum::body::Body::from_stream(teed);
    response
}

/// What a read-through download sends the client, and hands its store in batches of
/// [`BATCH`] bytes (the network's pieces are small: one wake-up of the store per piece would
/// set the pace).
struct Tee {
    bytes:
        std::pin::Pin<Box<dyn futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send>>,
    store: Option<
        tokio::sync::mpsc::UnboundedSender<(bytes::Bytes, tokio::sync::OwnedSemaphorePermit)>,
    >,
    room: Arc<Semaphore>,
    batch: bytes::BytesMut,
    /// Bytes of the entry still to come: the client's connection stops reading the upstream
    /// once the stated length has passed, so the end is known by it, not by the stream's end.
    left: u64,
}

/// What the store is handed at once.
const BATCH: usize = 1 << 20;

impl Tee {
    async fn keep(&mut self, piece: &[u8]) {
        if self.store.is_none() {
            return;
        }
        self.batch.extend_from_slice(piece);
        self.left = self.left.saturating_sub(piece.len() as u64);
        if self.batch.len() >= BATCH || self.left == 0 {
            self.flush().await;
        }
        if self.left == 0 {
            // The whole entry is handed over: the store learns the end as its channel closes.
            self.store = None;
        }
    }

    /// Hands the batch to the store once there is room for it.
    async fn flush(&mut self) {
        let Some(store) = &self.store else {
            return;
        };
        if self.batch.is_empty() {
            return;
        }
        let batch = self.batch.split().freeze();
        let kib = (batch.len() >> 10).clamp(1, IN_FLIGHT_KIB) as u32;
        let sent = match self.room.clone().acquire_many_owned(kib).await {
            Ok(permit) => store.send((batch, permit)).is_ok(),
            Err(_) => false,
        };
        if !sent {
            // The store stopped (refused, failed): nothing more is kept.
            self.store = None;
        }
    }
}

/// Ends a lookup's read-through when dropped, whatever happened to it.
struct Landing {
    upstream: Arc<UpstreamCache>,
    question: String,
}

impl Drop for Landing {
    fn drop(&mut self) {
        self.upstream.land(&self.question);
    }
}

fn redirect(link: &str) -> axum::response::Response {
    // A link no header can carry (the upstream would have to send one) opens nothing.
    super::transfer::redirect_to(link).unwrap_or_else(|| {
        axum::response::IntoResponse::into_response(super::azure::AzureError::not_found())
    })
}
