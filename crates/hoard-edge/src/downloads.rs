//! Entries' bytes through the edge (`GET`/`HEAD /_blob/entries/<id>.<created>?…`, the links
//! the edge handed out in the origin's lookup answers).
//!
//! The origin decides first, every time: a `HEAD` of the same signed link says whether it still
//! opens a live entry (a purge or a quarantine at the origin takes effect at once, even where
//! the edge holds the bytes) and how large it is. Then the bytes come from the edge's copy when
//! it has a sound one, else from the one fetch of that entry (started now, or joined). Should a
//! copy prove damaged or a fetch stop, the rest of the answer comes from the origin by range:
//! the client gets every byte right or its connection cut, never a wrong byte.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use futures_util::{StreamExt, TryStreamExt};
use hoard_server::api::range::{self, RangeRequest};
use hoard_server::model::ByteStream;

use crate::fill::{Joined, Source};
use crate::forward::{answered, forward, outgoing, unreachable};
use crate::Edge;

/// How long the origin may take to say whether a link opens an entry, and to start sending it.
const DECIDE_TIMEOUT: Duration = Duration::from_secs(10);

/// The origin's headers that describe the entry, passed on as they are.
const ENTRY_HEADERS: [&str; 5] = [
    "etag",
    "last-modified",
    "content-type",
    "x-ms-blob-type",
    "x-ms-version",
];

/// Serves a download link; `key` is the link's `<id>.<created>`.
pub async fn serve(
    edge: &Arc<Edge>,
    key: String,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    client: Option<SocketAddr>,
) -> Response {
    let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    // The range is the edge's to answer; preconditions are the origin's.
    let mut asking = outgoing(headers.clone(), client);
    asking.remove(header::RANGE);
    asking.remove("x-ms-range");
    let decided = edge
        .origin
        .send(
            Method::HEAD,
            &path_and_query,
            &asking,
            bytes::Bytes::new(),
            DECIDE_TIMEOUT,
        )
        .await;
    let decided = match decided {
        Ok(decided) => decided,
        Err(e) => {
            tracing::warn!(copy = %key, error = %e, "the origin did not say whether a download link opens an entry");
            return unreachable(uri.path());
        }
    };
    if decided.status() != StatusCode::OK {
        // Refused, gone, a precondition unmet: the origin's own answer, body and all.
        return if method == Method::HEAD {
            answered(decided)
        } else {
            forward(edge, method, uri, headers, client, Body::empty()).await
        };
    }
    let Some(size) = decided
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return forward(edge, method, uri, headers, client, Body::empty()).await;
    };
    let wanted = headers
        .get("x-ms-range")
        .or_else(|| headers.get(header::RANGE))
        .and_then(|v| v.to_str().ok());
    let (status, start, len) = match range::resolve(wanted, size) {
        RangeRequest::Full => (StatusCode::OK, 0, size),
        RangeRequest::Partial { start, len } => (StatusCode::PARTIAL_CONTENT, start, len),
        RangeRequest::Unsatisfiable => {
            return forward(edge, method, uri, headers, client, Body::empty()).await
        }
    };
    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    {
        let out = response.headers_mut();
        for name in ENTRY_HEADERS {
            if let Some(v) = decided.headers().get(name) {
                out.insert(HeaderName::from_static(name), v.clone());
            }
        }
        out.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        if status == StatusCode::PARTIAL_CONTENT {
            if let Ok(v) =
                HeaderValue::from_str(&format!("bytes {start}-{}/{size}", start + len - 1))
            {
                out.insert(header::CONTENT_RANGE, v);
            }
        }
    }
    if method == Method::HEAD || len == 0 {
        return response;
    }
    let recovering = Recovering {
        edge: edge.clone(),
        key,
        path_and_query,
        end: start + len,
    };
    let leg = match bytes_of(
        edge,
        &recovering.key,
        &recovering.path_and_query,
        size,
        start,
        len,
    )
    .await
    {
        Some(bytes) => Leg::Local(bytes),
        // Not kept here: straight from the origin, counted all the same.
        None => match recovering.rest_from(start).await {
            Ok(bytes) => Leg::Origin(bytes),
            Err(e) => {
                tracing::warn!(copy = %recovering.key, error = %e, "cannot stream an entry from the origin");
                return unreachable(uri.path());
            }
        },
    };
    *response.body_mut() = Body::from_stream(recovering.around(leg, start));
    response
}

/// The bytes `start..start + len` of the entry from the edge's copy or the entry's fetch; `None`
/// when the edge keeps no copy of it (too large, a disk error): then the origin streams it.
async fn bytes_of(
    edge: &Arc<Edge>,
    key: &str,
    path_and_query: &str,
    size: u64,
    start: u64,
    len: u64,
) -> Option<ByteStream> {
    let counters = &edge.counters;
    let opened = {
        let (edge, key) = (edge.clone(), key.to_owned());
        tokio::task::spawn_blocking(move || {
            // A save through this edge may have left the entry's copy (saves.rs).
            if let Some((id, created)) = id_and_creation(&key) {
                edge.saves.adopt(&edge.store, id, &key, size, created);
            }
            edge.store.open_copy(&key, size)
        })
        .await
        .ok()
        .flatten()
    };
    if let Some(copy) = opened {
        counters.hits.fetch_add(1, Ordering::Relaxed);
        return Some(copy.read(edge.memory.clone(), start, len));
    }
    if !edge.store.could_keep(size) {
        counters.passed.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    let source = Source {
        origin: edge.origin.clone(),
        store: edge.store.clone(),
        memory: edge.memory.clone(),
        counters: edge.counters.clone(),
        start_within: DECIDE_TIMEOUT,
        idle: edge.idle,
    };
    match edge.fills.join_or_start(key, size, path_and_query, source) {
        Joined::Fill(fill) => {
            counters.misses.fetch_add(1, Ordering::Relaxed);
            Some(fill.follow(edge.memory.clone(), start, len))
        }
        Joined::Kept => {
            let (store, key) = (edge.store.clone(), key.to_owned());
            let copy = tokio::task::spawn_blocking(move || store.open_copy(&key, size))
                .await
                .ok()
                .flatten();
            let counter = if copy.is_some() {
                &counters.hits
            } else {
                &counters.passed
            };
            counter.fetch_add(1, Ordering::Relaxed);
            copy.map(|copy| copy.read(edge.memory.clone(), start, len))
        }
        Joined::Unkept => {
            counters.passed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// The entry id and row creation time a copy's name (`<id>.<created>`, milliseconds) gives.
fn id_and_creation(key: &str) -> Option<(i64, std::time::SystemTime)> {
    let (id, created) = key.split_once('.')?;
    let created = std::time::Duration::from_millis(created.parse().ok()?);
    Some((id.parse().ok()?, std::time::UNIX_EPOCH + created))
}

/// What a download needs to finish from the origin when its copy or its fetch fails.
struct Recovering {
    edge: Arc<Edge>,
    key: String,
    path_and_query: String,
    end: u64,
}

enum Leg {
    Local(ByteStream),
    Origin(ByteStream),
}

impl Recovering {
    /// The bytes of `leg` (from `start`), counted as served; on an error of the edge's own, the
    /// rest from the origin by range.
    fn around(self, leg: Leg, start: u64) -> ByteStream {
        let this = Arc::new(self);
        Box::pin(futures_util::stream::unfold(
            (Some(leg), start),
            move |(leg, pos)| {
                let this = this.clone();
                async move {
                    let mut leg = leg?;
                    loop {
                        let (item, local) = match &mut leg {
                            Leg::Local(s) => (s.next().await, true),
                            Leg::Origin(s) => (s.next().await, false),
                        };
                        match item {
                            None => return None,
                            Some(Ok(bytes)) => {
                                let counters = &this.edge.counters;
                                counters
                                    .bytes_served
                                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                                if !local {
                                    counters
                                        .bytes_from_origin
                                        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                                }
                                let next = pos + bytes.len() as u64;
                                return Some((Ok(bytes), (Some(leg), next)));
                            }
                            Some(Err(e)) if local && pos < this.end => {
                                if e.kind() == std::io::ErrorKind::InvalidData {
                                    tracing::warn!(copy = %this.key, error = %e, "an edge copy is damaged: dropped, the rest comes from the origin");
                                    this.edge.store.drop_damaged(&this.key);
                                } else {
                                    tracing::warn!(copy = %this.key, error = %e, "the rest of a download comes from the origin");
                                }
                                match this.rest_from(pos).await {
                                    Ok(rest) => leg = Leg::Origin(rest),
                                    Err(e) => return Some((Err(e), (None, pos))),
                                }
                            }
                            Some(Err(e)) => return Some((Err(e), (None, pos))),
                        }
                    }
                }
            },
        ))
    }

    /// The bytes `from..end` from the origin.
    async fn rest_from(&self, from: u64) -> std::io::Result<ByteStream> {
        let answer = self
            .edge
            .origin
            .fetch(&self.path_and_query, Some((from, self.end)), DECIDE_TIMEOUT)
            .await
            .map_err(std::io::Error::other)?;
        let starts_at = |answer: &reqwest::Response| {
            answer
                .headers()
                .get(header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("bytes "))
                .and_then(|v| v.split('-').next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        let fine = match answer.status() {
            StatusCode::PARTIAL_CONTENT => starts_at(&answer) == Some(from),
            StatusCode::OK => from == 0,
            _ => false,
        };
        if !fine {
            return Err(std::io::Error::other(format!(
                "the origin answered {} to the rest of a download",
                answer.status()
            )));
        }
        // No more than asked for, whatever the origin sends.
        let mut left = self.end - from;
        let rest = answer
            .bytes_stream()
            .map_err(std::io::Error::other)
            .try_filter_map(move |mut bytes| {
                bytes.truncate(left.min(bytes.len() as u64) as usize);
                left -= bytes.len() as u64;
                std::future::ready(Ok((!bytes.is_empty()).then_some(bytes)))
            });
        Ok(Box::pin(rest))
    }
}
