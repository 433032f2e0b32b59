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
use super::{blocklist, links, AppState};
use crate::auth::{LinkId, LinkTarget};
use crate::cache::CacheError;
use crate::model::{BlockId, BlockRef, EntryId, Upload, UploadBlocks, UploadId};

/// A block list of 50,000 ids of 64 characters, with room to spare.
const MAX_BLOCK_LIST_BYTES: usize = 8 << 20;

/// Checks a request's link for what `Id` opens before anything is loaded (see [`links::check`]).
fn authorize<Id: LinkId>(
    app: &AppState,
    segment: &str,
    query: &Query,
    make: impl FnOnce(i64) -> Id,
) -> Result<LinkTarget<Id>, AzureError> {
    links::check(app.signer(), segment, query, make).map_err(|refused| match refused {
        links::Refused::NoSuchPath => AzureError::not_found(),
        links::Refused::Signature(e) => e.into(),
    })
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

/// `/_blob/uploads/{id}`: Put Blob, Put Block (`comp=block`) or Put Block List
/// (`comp=blocklist`), each answered exactly `201 Created` (§3.5); Get Blob Properties (`HEAD`)
/// and Get Block List (`GET ?comp=blocklist`), which Azure clients call around an upload.
pub async fn upload(
    State(app): State<AppState>,
    method: Method,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    upload_at(app, method, &id, uri, headers, body).await
}

/// [`upload`] for the decoded last segment `id` of the path (the router's fallback routes
/// paths with an encoded `/` here).
pub async fn upload_at(
    app: AppState,
    method: Method,
    id: &str,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let query = Query::parse(&uri);
    let answer = match method {
        Method::PUT => put(app, id, query, headers, body).await,
        Method::HEAD => upload_properties(app, id, query).await,
        Method::GET if query.str("comp") == Some("blocklist") => block_list(app, id, query).await,
        _ => Err(AzureError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "UnsupportedHttpVerb",
            format!("{method} is not supported on upload links."),
        )),
    };
    answer.unwrap_or_else(IntoResponse::into_response)
}

/// Get Blob Properties on an upload link: the committed blob (Put Blob, or the last Put Block
/// List) as Azure describes it, or 404 `BlobNotFound` before anything is committed, with its
/// error headers and, as for every `HEAD`, no body. azcopy checks the length it uploaded here.
async fn upload_properties(app: AppState, id: &str, query: Query) -> Result<Response, AzureError> {
    let answer = async {
        let target = authorize(&app, id, &query, UploadId::new)?;
        let (upload, blocks) = app.cache().upload_blocks(target).await?;
        if !upload.is_open() || blocks.parts.is_empty() {
            return Err(AzureError::not_found());
        }
        let mut response = Response::new(Body::empty());
        let h = response.headers_mut();
        blob_headers(h, &upload, &blocks);
        h.insert(
            header::CONTENT_LENGTH,
            HeaderValue::from(blocks.committed_size()),
        );
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        h.insert("x-ms-blob-type", HeaderValue::from_static("BlockBlob"));
        h.insert("x-ms-lease-state", HeaderValue::from_static("available"));
        h.insert("x-ms-lease-status", HeaderValue::from_static("unlocked"));
        h.insert("x-ms-server-encrypted", HeaderValue::from_static("false"));
        Ok::<_, AzureError>(response)
    };
    answer.await.or_else(|e| {
        // A HEAD answer has no body; its error is in x-ms-error-code.
        let mut response = e.into_response();
        *response.body_mut() = Body::empty();
        response.headers_mut().remove(header::CONTENT_TYPE);
        response.headers_mut().remove(header::CONTENT_LENGTH);
        Ok::<_, AzureError>(response)
    })
}

/// ETag, Last-Modified, x-ms-creation-time, x-ms-version and x-ms-request-id of an upload's
/// blob: its tag changes with every change to the upload.
fn blob_headers(h: &mut HeaderMap, upload: &Upload, blocks: &UploadBlocks) {
    let created = httpdate::fmt_http_date(
        std::time::UNIX_EPOCH + Duration::from_millis(upload.created_at.max(0) as u64),
    );
    if let Ok(v) = HeaderValue::from_str(&created) {
        if !blocks.parts.is_empty() {
            h.insert(header::LAST_MODIFIED, v.clone());
        }
        h.insert("x-ms-creation-time", v);
    }
    if !blocks.parts.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&format!("\"0x{:X}\"", upload.revision)) {
            h.insert(header::ETAG, v);
        }
    }
    h.insert("x-ms-version", HeaderValue::from_static(API_VERSION));
    h.insert("x-ms-request-id", request_id());
}

/// Get Block List (`GET ?comp=blocklist&blocklisttype=committed|uncommitted|all`, committed
/// by default): the blocks of the last Put Block List and the staged ones, by id and size. A
/// blob made by Put Blob has no committed blocks, as in Azure.
async fn block_list(app: AppState, id: &str, query: Query) -> Result<Response, AzureError> {
    let target = authorize(&app, id, &query, UploadId::new)?;
    let (committed, uncommitted) = match query.str("blocklisttype").unwrap_or("committed") {
        t if t.eq_ignore_ascii_case("committed") => (true, false),
        t if t.eq_ignore_ascii_case("uncommitted") => (false, true),
        t if t.eq_ignore_ascii_case("all") => (true, true),
        other => {
            return Err(AzureError::new(
                StatusCode::BAD_REQUEST,
                "InvalidQueryParameterValue",
                format!("blocklisttype={other} is not one of committed, uncommitted, all."),
            ))
        }
    };
    let (upload, blocks) = app.cache().upload_blocks(target).await?;
    if !upload.is_open() {
        return Err(AzureError::not_found());
    }
    let mut staged: Vec<_> = blocks.staged.iter().collect();
    staged.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let xml = block_list_xml(
        committed.then(|| {
            blocks
                .parts
                .iter()
                .filter(|(id, _)| *id != BlockId::whole_blob())
                .map(|(id, chunk)| (id, chunk.size))
                .collect()
        }),
        uncommitted.then(|| {
            staged
                .into_iter()
                .map(|(id, chunk)| (id, chunk.size))
                .collect()
        }),
    );
    let mut response = Response::new(Body::from(xml));
    let h = response.headers_mut();
    blob_headers(h, &upload, &blocks);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    h.insert(
        "x-ms-blob-content-length",
        HeaderValue::from(blocks.committed_size()),
    );
    Ok(response)
}

/// `<BlockList><CommittedBlocks><Block><Name>id</Name><Size>n</Size></Block>…` as Azure writes
/// it; a list left out (`None`) is not written.
fn block_list_xml(
    committed: Option<Vec<(&BlockId, u64)>>,
    uncommitted: Option<Vec<(&BlockId, u64)>>,
) -> String {
    use std::fmt::Write as _;
    let mut xml = String::from(r#"<?xml version="1.0" encoding="utf-8"?><BlockList>"#);
    for (name, blocks) in [
        ("CommittedBlocks", committed),
        ("UncommittedBlocks", uncommitted),
    ] {
        let Some(blocks) = blocks else { continue };
        let _ = write!(xml, "<{name}>");
        for (id, size) in blocks {
            let id = String::from_utf8_lossy(id.as_bytes());
            let _ = write!(
                xml,
                "<Block><Name>{}</Name><Size>{size}</Size></Block>",
                quick_xml::escape::escape(id.as_ref())
            );
        }
        let _ = write!(xml, "</{name}>");
    }
    xml.push_str("</BlockList>");
    xml
}

async fn put(
    app: AppState,
    id: &str,
    query: Query,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, AzureError> {
    let target = authorize(&app, id, &query, UploadId::new)?;
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
    download_at(app, method, &id, uri, headers).await
}

/// [`download`] for the decoded last segment `id` of the path.
pub async fn download_at(
    app: AppState,
    method: Method,
    id: &str,
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
    id: &str,
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
    let target = authorize(&app, id, &query, EntryId::new)?;
    let open = app.cache().open_link(target).await?;
    serve_entry(&app, &method, &open, &headers).await
}
