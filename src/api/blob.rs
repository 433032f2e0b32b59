//! Blob endpoints behind signed links: the Azure Blob subset the SDK speaks for uploads
//! (PROTOCOL.md §3) and plain or ranged downloads (§4). Errors are Azure-style XML.

use std::time::{Duration, UNIX_EPOCH};

use axum::body::{to_bytes, Body};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures_util::{StreamExt, TryStreamExt};
use percent_encoding::percent_decode_str;

use super::links::unix_now;
use super::range::{self, RangeRequest};
use super::{blocklist, AppState};
use crate::auth::signing::SignatureError;
use crate::auth::{LinkTarget, Purpose};
use crate::cache::{CacheError, OpenEntry};
use crate::model::{BlockId, BlockRef, ByteStream};

/// The x-ms-version we answer with; clients ignore the value.
const API_VERSION: &str = "2025-01-05";
/// A block list of 50,000 ids of 64 characters, with room to spare.
const MAX_BLOCK_LIST_BYTES: usize = 8 << 20;

/// An Azure Storage error: XML body plus `x-ms-error-code`.
#[derive(Debug)]
pub struct AzureError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl AzureError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "BlobNotFound",
            "The specified blob does not exist.",
        )
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl IntoResponse for AzureError {
    fn into_response(self) -> Response {
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{}</Code><Message>{}</Message></Error>",
            self.code,
            xml_escape(&self.message)
        );
        let mut response = (self.status, body).into_response();
        let h = response.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/xml"),
        );
        h.insert("x-ms-error-code", HeaderValue::from_static(self.code));
        h.insert("x-ms-version", HeaderValue::from_static(API_VERSION));
        h.insert("x-ms-request-id", request_id());
        response
    }
}

impl From<SignatureError> for AzureError {
    fn from(e: SignatureError) -> Self {
        Self::new(StatusCode::FORBIDDEN, "AuthenticationFailed", e.to_string())
    }
}

impl From<CacheError> for AzureError {
    fn from(e: CacheError) -> Self {
        match e {
            CacheError::UploadNotFound | CacheError::EntryNotFound => Self::not_found(),
            CacheError::UploadClosed => {
                Self::new(StatusCode::FORBIDDEN, "AuthorizationFailure", e.to_string())
            }
            CacheError::TooManyBlocks => Self::new(
                StatusCode::CONFLICT,
                "BlockCountExceedsLimit",
                e.to_string(),
            ),
            CacheError::UnknownBlock => {
                Self::new(StatusCode::BAD_REQUEST, "InvalidBlockList", e.to_string())
            }
            CacheError::TooLarge(_) => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestBodyTooLarge",
                e.to_string(),
            ),
            CacheError::Invalid(e) => Self::new(
                StatusCode::BAD_REQUEST,
                "InvalidQueryParameterValue",
                e.to_string(),
            ),
            // A link to a row that does not exist is refused like a forged one: it cannot have
            // been signed for that row.
            CacheError::NoSuchLink => SignatureError::Forged.into(),
            CacheError::BodyLengthMismatch { .. } => {
                Self::new(StatusCode::BAD_REQUEST, "InvalidInput", e.to_string())
            }
            CacheError::BodyFailed(_) => Self::new(
                StatusCode::BAD_REQUEST,
                "IncompleteBody",
                "The request body ended early or failed.",
            ),
            // Not retried by the Azure SDK: the upload was abandoned and its chunks freed.
            CacheError::StorageFull => Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "InsufficientStorage",
                "The cache storage is full; this upload was abandoned and its blocks deleted.",
            ),
            ref e if e.is_transient() => {
                tracing::warn!(error = %e, "blob request could not be served now");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServerBusy",
                    "The server is busy; retry.",
                )
            }
            CacheError::Storage(_) | CacheError::Meta(_) => {
                tracing::error!(error = %e, "blob request failed");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    "The server encountered an internal error.",
                )
            }
            other => Self::new(StatusCode::BAD_REQUEST, "InvalidInput", other.to_string()),
        }
    }
}

fn request_id() -> HeaderValue {
    HeaderValue::from_str(&crate::model::random_uuid())
        .unwrap_or_else(|_| HeaderValue::from_static("00000000-0000-0000-0000-000000000000"))
}

/// Query parameters, percent-decoded without turning `+` into a space: block ids are base64
/// and may carry a literal `+` (PROTOCOL.md §12), and v1 clients encode keys with
/// `encodeURIComponent`, so a literal `+` is a `+`.
pub(super) struct Query(Vec<(String, Vec<u8>)>);

impl Query {
    pub(super) fn parse(uri: &Uri) -> Self {
        let pairs = uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                let key = percent_decode_str(k)
                    .decode_utf8_lossy()
                    .to_ascii_lowercase();
                (key, percent_decode_str(v).collect())
            })
            .collect();
        Self(pairs)
    }

    fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    pub(super) fn str(&self, name: &str) -> Option<&str> {
        self.bytes(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// The id segment of a link; anything else names nothing.
fn link_id(raw: &str) -> Result<i64, AzureError> {
    raw.parse()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(AzureError::not_found)
}

/// Checks a link's signature for `purpose` before anything is loaded: the id is the path's,
/// the row's creation time the link's `ct`. Returns the target the signature covers.
fn authorize(
    app: &AppState,
    purpose: Purpose,
    id: i64,
    query: &Query,
) -> Result<LinkTarget, AzureError> {
    let created_at = query
        .str("ct")
        .and_then(|ct| ct.parse().ok())
        .ok_or(SignatureError::Malformed)?;
    let target = LinkTarget { id, created_at };
    app.signer().verify(
        purpose,
        target,
        query.str("se"),
        query.str("sig"),
        unix_now(),
    )?;
    Ok(target)
}

fn declared_length(headers: &HeaderMap) -> Result<Option<u64>, AzureError> {
    match headers.get(header::CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Some)
            .ok_or_else(|| {
                AzureError::new(
                    StatusCode::BAD_REQUEST,
                    "InvalidHeaderValue",
                    "Content-Length is not a number.",
                )
            }),
    }
}

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

fn created(last_modified: bool) -> Response {
    let mut response = StatusCode::CREATED.into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    h.insert("x-ms-request-id", request_id());
    h.insert("x-ms-version", HeaderValue::from_static(API_VERSION));
    h.insert(
        "x-ms-request-server-encrypted",
        HeaderValue::from_static("false"),
    );
    if last_modified {
        let now = httpdate::fmt_http_date(std::time::SystemTime::now());
        if let Ok(v) = HeaderValue::from_str(&now) {
            h.insert(header::LAST_MODIFIED, v);
        }
        if let Ok(v) = HeaderValue::from_str(&format!("\"0x{:X}\"", crate::model::now_millis())) {
            h.insert(header::ETAG, v);
        }
    }
    response
}

/// `PUT /_blob/uploads/{id}`: Put Blob, Put Block (`comp=block`) or Put Block List
/// (`comp=blocklist`). Every success is exactly `201 Created` (§3.5).
pub async fn upload(
    State(app): State<AppState>,
    method: Method,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    put(app, method, id, uri, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn put(
    app: AppState,
    method: Method,
    id: String,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, AzureError> {
    if method != Method::PUT {
        return Err(AzureError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "UnsupportedHttpVerb",
            format!("{method} is not supported on upload links."),
        ));
    }
    let query = Query::parse(&uri);
    let target = authorize(&app, Purpose::Upload, link_id(&id)?, &query)?;
    let cache = app.cache();
    let idle = app.config().limits.idle_timeout;
    match query.str("comp") {
        None => {
            let blob_type = headers.get("x-ms-blob-type").and_then(|v| v.to_str().ok());
            if blob_type.is_some_and(|t| !t.eq_ignore_ascii_case("BlockBlob")) {
                return Err(AzureError::new(
                    StatusCode::BAD_REQUEST,
                    "InvalidHeaderValue",
                    "Only BlockBlob uploads are supported.",
                ));
            }
            let declared = declared_length(&headers)?;
            cache
                .put_blob(target, body_stream(body, idle), declared)
                .await?;
            Ok(created(true))
        }
        Some("block") => {
            let raw = query.bytes("blockid").ok_or_else(|| {
                AzureError::new(
                    StatusCode::BAD_REQUEST,
                    "MissingRequiredQueryParameter",
                    "Put Block needs a blockid.",
                )
            })?;
            let block = BlockId::parse(raw).map_err(CacheError::from)?;
            let declared = declared_length(&headers)?;
            cache
                .put_block(target, block, body_stream(body, idle), declared)
                .await?;
            Ok(created(false))
        }
        Some("blocklist") => {
            cache
                .put_block_list(target, read_block_list(body, idle))
                .await?;
            Ok(created(true))
        }
        Some(other) => Err(AzureError::new(
            StatusCode::BAD_REQUEST,
            "InvalidQueryParameterValue",
            format!("comp={other} is not supported on upload links."),
        )),
    }
}

/// A Put Block List body: at most [`MAX_BLOCK_LIST_BYTES`], arriving within `idle`.
async fn read_block_list(body: Body, idle: Duration) -> Result<Vec<BlockRef>, AzureError> {
    let xml = tokio::time::timeout(idle, to_bytes(body, MAX_BLOCK_LIST_BYTES))
        .await
        .map_err(|_| {
            AzureError::new(
                StatusCode::REQUEST_TIMEOUT,
                "OperationTimedOut",
                "The block list did not arrive in time.",
            )
        })?
        .map_err(|_| {
            AzureError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestBodyTooLarge",
                format!("Block lists are limited to {MAX_BLOCK_LIST_BYTES} bytes."),
            )
        })?;
    blocklist::parse(&xml).map_err(|e| {
        let code = match e {
            blocklist::BadBlockList::TooLong => "BlockListTooLong",
            blocklist::BadBlockList::Malformed(_) => "InvalidXmlDocument",
        };
        AzureError::new(StatusCode::BAD_REQUEST, code, e.to_string())
    })
}

/// `GET`/`HEAD /_blob/entries/{id}`: the entry's bytes, whole or one range.
pub async fn download(
    State(app): State<AppState>,
    method: Method,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    get(app, method, id, uri, headers)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn get(
    app: AppState,
    method: Method,
    id: String,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, AzureError> {
    if method != Method::GET && method != Method::HEAD {
        return Err(AzureError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "UnsupportedHttpVerb",
            format!("{method} is not supported on download links."),
        ));
    }
    let query = Query::parse(&uri);
    let target = authorize(&app, Purpose::Download, link_id(&id)?, &query)?;
    let open = app.cache().open_link(target).await?;
    serve_entry(&app, &method, &open, &headers).await
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
                tracing::warn!(entry = open.entry.id, error = %e, "cannot presign a direct download link; streaming instead");
                None
            });
        if let Some(link) = link {
            if let Ok(location) = HeaderValue::from_str(link.as_str()) {
                let mut response = Response::new(Body::empty());
                *response.status_mut() = StatusCode::TEMPORARY_REDIRECT;
                response.headers_mut().insert(header::LOCATION, location);
                response
                    .headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                return Ok(response);
            }
        }
    }
    let size = open.entry.size;
    let etag = format!(
        "\"0x{:X}{:04X}\"",
        open.entry.created_at,
        open.entry.id & 0xFFFF
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
