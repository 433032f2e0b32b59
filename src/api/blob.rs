//! Blob endpoints behind signed links: the Azure Blob subset the SDK speaks for uploads
//! (PROTOCOL.md §3) and plain or ranged downloads (§4). Errors are Azure-style XML.

use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use super::azure::{request_id, AzureError, API_VERSION};
use super::query::Query;
use super::transfer::{body_stream, serve_entry, stored_from};
use super::{blocklist, AppState};
use crate::auth::signing::SignatureError;
use crate::auth::{LinkId, LinkTarget};
use crate::cache::CacheError;
use crate::model::{BlockId, BlockRef, EntryId, UploadId};

/// A block list of 50,000 ids of 64 characters, with room to spare.
const MAX_BLOCK_LIST_BYTES: usize = 8 << 20;

/// The id segment of a link; anything else names nothing.
fn link_id(raw: &str) -> Result<i64, AzureError> {
    raw.parse()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(AzureError::not_found)
}

/// Checks a link's signature for what `Id` opens before anything is loaded: the id is the
/// path's, the row's creation time the link's `ct`. Returns the target the signature covers.
fn authorize<Id: LinkId>(
    app: &AppState,
    id: Id,
    query: &Query,
) -> Result<LinkTarget<Id>, AzureError> {
    let created_at = query
        .str("ct")
        .and_then(|ct| ct.parse().ok())
        .ok_or(SignatureError::Malformed)?;
    let target = LinkTarget { id, created_at };
    app.signer()
        .verify(target, query.str("se"), query.str("sig"))?;
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
    let target = authorize(&app, UploadId::new(link_id(&id)?), &query)?;
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
            stored_from(body_stream(body, idle), |body| {
                cache.put_blob(target, body, declared)
            })
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
            stored_from(body_stream(body, idle), |body| {
                cache.put_block(target, block, body, declared)
            })
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
    let target = authorize(&app, EntryId::new(link_id(&id)?), &query)?;
    let open = app.cache().open_link(target).await?;
    serve_entry(&app, &method, &open, &headers).await
}
