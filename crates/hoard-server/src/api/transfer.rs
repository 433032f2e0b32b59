//! The data plumbing both cache protocols share: request bodies streamed with an idle timeout,
//! and an entry's bytes served whole, ranged or redirected with the headers Azure-SDK clients
//! need (v2 downloads, and v1 artifact downloads through a Forgejo proxy).

use std::time::{Duration, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{StreamExt, TryStreamExt};

use super::azure::{request_id, AzureError, API_VERSION};
use super::range::{self, RangeRequest};
use super::AppState;
use crate::cache::OpenEntry;
use crate::model::ByteStream;

/// The request body as a stream that fails if the client sends nothing for `idle`.
pub(super) fn body_stream(body: Body, idle: std::time::Duration) -> ByteStream {
    let frames = body.into_data_stream().map_err(std::io::Error::other);
    Box::pin(futures_util::stream::unfold(
        Some(frames),
        move |state| async move {
            let mut frames = state?;
            match tokio::time::timeout(idle, frames.next()).await {
                Ok(Some(item)) => Some((item, Some(frames))),
                Ok(None) => None,
                Err(_) => Some((
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client sent nothing for too long",
                    )),
                    None,
                )),
            }
        },
    ))
}

/// Most of a refused upload's body read after a transient failure, and for how long.
const DRAIN_LIMIT: usize = 64 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Hands the request body to `store` (a domain call that reads it) and answers what it did;
/// after a transient failure, the rest of the body is read first (see [`Drainable::drain_after`]).
pub(super) async fn stored_from<T, Fut>(
    body: ByteStream,
    store: impl FnOnce(ByteStream) -> Fut,
) -> Result<T, crate::cache::CacheError>
where
    Fut: std::future::Future<Output = Result<T, crate::cache::CacheError>>,
{
    let (body, rest) = drainable(body);
    let stored = store(body).await;
    if let Err(e) = &stored {
        rest.drain_after(e).await;
    }
    stored
}

/// A request body handed to the domain, and what it leaves unread.
pub(super) struct Drainable {
    // Fused: the domain may have read it to its end, and a finished stream must not be polled.
    rest: std::sync::Arc<std::sync::Mutex<futures_util::stream::Fuse<ByteStream>>>,
}

/// `body` for the domain to read, and its remainder for [`Drainable::drain_after`].
fn drainable(body: ByteStream) -> (ByteStream, Drainable) {
    let rest = Drainable {
        rest: std::sync::Arc::new(std::sync::Mutex::new(body.fuse())),
    };
    let shared = Drainable {
        rest: rest.rest.clone(),
    };
    let stream = futures_util::stream::poll_fn(move |cx| shared.poll_next(cx));
    (Box::pin(stream), rest)
}

impl Drainable {
    fn poll_next(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::io::Result<bytes::Bytes>>> {
        let mut body = self.rest.lock().unwrap_or_else(|p| p.into_inner());
        body.poll_next_unpin(cx)
    }

    /// After a transient failure (the store or the database is away), reads what the client is
    /// still sending, up to [`DRAIN_LIMIT`] bytes within [`DRAIN_TIME`], before the 503 goes
    /// out: a server that answers while a body is arriving and closes the connection resets
    /// it, and the client sees a broken connection instead of the "retry" it is owed.
    pub(super) async fn drain_after(self, failure: &crate::cache::CacheError) {
        if !failure.is_transient() {
            return;
        }
        let read = async {
            let mut read = 0usize;
            while read <= DRAIN_LIMIT {
                let frame = std::future::poll_fn(|cx| self.poll_next(cx)).await;
                match frame {
                    Some(Ok(frame)) => read += frame.len(),
                    _ => return,
                }
            }
        };
        let _ = tokio::time::timeout(DRAIN_TIME, read).await;
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// How long the object store's link in a direct-download redirect stays valid: the runner
/// follows it at once, and the store checks it only when the request starts.
const DIRECT_LINK_TTL: Duration = Duration::from_secs(300);

/// Headers that only this server can answer: the ETag is hoard's, and the store would not
/// honour Azure's range header.
const NOT_REDIRECTED: [&str; 5] = [
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "x-ms-range",
];

/// Answers a GET or HEAD of an entry the caller may read: whole, or the one range asked for
/// (`x-ms-range` or `Range`), with the headers Azure-SDK clients need. With
/// `--direct-downloads`, a plain GET of an entry stored as one object is redirected to it.
pub(super) async fn serve_entry(
    app: &AppState,
    method: &Method,
    open: &OpenEntry,
    headers: &HeaderMap,
) -> Result<Response, AzureError> {
    let cache = app.cache();
    if app.config().direct_downloads
        && method == Method::GET
        && !NOT_REDIRECTED.iter().any(|h| headers.contains_key(*h))
    {
        let link = cache
            .direct_link(open, DIRECT_LINK_TTL)
            .await
            .unwrap_or_else(|e| {
                // Start-up proved presigning works; streaming is still a right answer.
                tracing::warn!(entry = open.entry.id.get(), error = %e, "cannot presign a direct download link; streaming instead");
                None
            });
        if let Some(response) = link.and_then(|link| redirect_to(link.as_str())) {
            return Ok(response);
        }
    }
    stream_entry(app, method, open, headers).await
}

/// A redirect to `link` (a signed link elsewhere, not to be cached); `None` if it cannot be a
/// header.
pub(super) fn redirect_to(link: &str) -> Option<Response> {
    let location = HeaderValue::from_str(link).ok()?;
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::TEMPORARY_REDIRECT;
    response.headers_mut().insert(header::LOCATION, location);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Some(response)
}

/// [`serve_entry`] without the redirect: the bytes from hoard itself (the build tools' clients
/// read headers that a storage service's answer would not carry, and Bazel follows no
/// redirect).
pub(super) async fn stream_entry(
    app: &AppState,
    method: &Method,
    open: &OpenEntry,
    headers: &HeaderMap,
) -> Result<Response, AzureError> {
    let cache = app.cache();
    let size = open.entry.size;
    let etag = format!(
        "\"0x{:X}{:04X}\"",
        open.entry.created_at,
        open.entry.id.get() & 0xFFFF
    );
    if let Some(wanted) = header_str(headers, "if-match") {
        if wanted.trim() != "*" && !wanted.split(',').any(|t| t.trim() == etag) {
            return Err(AzureError::new(
                StatusCode::PRECONDITION_FAILED,
                "ConditionNotMet",
                "The condition specified using HTTP conditional header(s) is not met.",
            ));
        }
    }
    // x-ms-range wins over Range when both are present (§4.3).
    let range_header = header_str(headers, "x-ms-range").or_else(|| header_str(headers, "range"));
    let (status, start, len) = match range::resolve(range_header, size) {
        RangeRequest::Full => (StatusCode::OK, 0, size),
        RangeRequest::Partial { start, len } => (StatusCode::PARTIAL_CONTENT, start, len),
        RangeRequest::Unsatisfiable => {
            let mut response = AzureError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "InvalidRange",
                "The range specified is invalid for the current size of the resource.",
            )
            .into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                response.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(response);
        }
    };
    let body = if method == Method::HEAD || len == 0 {
        Body::empty()
    } else {
        Body::from_stream(cache.read(open, start, len).await?)
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let last_modified = httpdate::fmt_http_date(
        UNIX_EPOCH + Duration::from_millis(open.entry.created_at.max(0) as u64),
    );
    let h = response.headers_mut();
    let mut set = |name: HeaderName, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    };
    set(header::CONTENT_LENGTH, len.to_string());
    set(header::ETAG, etag);
    set(header::LAST_MODIFIED, last_modified);
    if status == StatusCode::PARTIAL_CONTENT {
        set(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{size}", start + len - 1),
        );
    }
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert("x-ms-blob-type", HeaderValue::from_static("BlockBlob"));
    h.insert("x-ms-version", HeaderValue::from_static(API_VERSION));
    h.insert("x-ms-request-id", request_id());
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheError;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A body of `frames` frames that counts how many were read; like [`body_stream`], it
    /// must not be polled once it has ended.
    fn counted(frames: usize, read: Arc<AtomicUsize>) -> ByteStream {
        Box::pin(futures_util::stream::unfold(0, move |sent| {
            let read = read.clone();
            async move {
                (sent < frames).then(|| {
                    read.fetch_add(1, Ordering::Relaxed);
                    (Ok(bytes::Bytes::from_static(&[7; 1024])), sent + 1)
                })
            }
        }))
    }

    #[tokio::test]
    async fn a_transient_failure_reads_the_rest_of_the_body_and_others_do_not() {
        for (failure, drained) in [
            (
                CacheError::storage_unavailable("the store refuses connections"),
                10,
            ),
            (CacheError::NoSuchLink, 3),
        ] {
            let read = Arc::new(AtomicUsize::new(0));
            let (mut body, rest) = drainable(counted(10, read.clone()));
            for _ in 0..3 {
                body.next().await.unwrap().unwrap();
            }
            drop(body);
            rest.drain_after(&failure).await;
            assert_eq!(read.load(Ordering::Relaxed), drained, "{failure:?}");
        }
    }

    #[tokio::test]
    async fn a_body_read_to_its_end_drains_at_once() {
        let read = Arc::new(AtomicUsize::new(0));
        let (mut body, rest) = drainable(counted(2, read.clone()));
        while body.next().await.is_some() {}
        drop(body);
        // Polling a finished body again must not panic (the stream is fused).
        rest.drain_after(&CacheError::storage_unavailable("away"))
            .await;
        assert_eq!(read.load(Ordering::Relaxed), 2);
    }
}
