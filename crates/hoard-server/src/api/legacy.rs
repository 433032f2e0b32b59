//! The legacy cache service (`_apis/artifactcache`, PROTOCOL.md §5) for `@actions/cache` < 4,
//! GHES and forge clients (Gitea, Forgejo, act), at the origin root and under any path prefix
//! (`ACTIONS_CACHE_URL=http://hoard:3000/<prefix>/`). Same store, same entries and same rules as
//! v2: a v1 upload's ranges are chunks, and an entry saved by either protocol restores through
//! the other. Errors are JSON with a `message`, which the v1 client shows.

use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::origin::ClientAddress;
use super::query::Query;
use super::{links, transfer, AppState};
use crate::auth::{Caller, CallerError, Identity};
use crate::cache::CacheError;
use crate::model::{EntryId, Lookup, UploadId};

/// Where the service lives, under the origin or a prefix.
pub const BASE: &str = "/_apis/artifactcache/";

/// The route label of a v1 request, at the origin root or under a prefix: the endpoint's
/// template. `None` for paths that are no v1 endpoint.
pub fn route_label(path: &str) -> Option<&'static str> {
    // Suffix compares, not a search: this runs on every request.
    const ENDPOINTS: [&str; 3] = [
        "/_apis/artifactcache/cache",
        "/_apis/artifactcache/caches",
        "/_apis/artifactcache/clean",
    ];
    if let Some(endpoint) = ENDPOINTS.into_iter().find(|e| path.ends_with(e)) {
        return Some(endpoint);
    }
    let (parent, _id) = path.rsplit_once('/')?;
    if parent.ends_with("/_apis/artifactcache/caches") {
        Some("/_apis/artifactcache/caches/{id}")
    } else if parent.ends_with("/_apis/artifactcache/artifacts") {
        Some("/_apis/artifactcache/artifacts/{id}")
    } else {
        None
    }
}
/// Reserve and commit bodies are a few dozen bytes.
const MAX_JSON_BYTES: usize = 64 * 1024;

/// A v1 error: `{"message": …}` (the client shows `message`), with GitHub's `typeKey` where
/// the client or users look for one.
#[derive(Debug)]
pub struct LegacyError {
    status: StatusCode,
    message: String,
    type_key: Option<&'static str>,
    retry_after: Option<u64>,
}

impl LegacyError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            type_key: None,
            retry_after: None,
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not found")
    }
}

impl IntoResponse for LegacyError {
    fn into_response(self) -> Response {
        let mut body = json!({ "message": self.message });
        if let Some(type_key) = self.type_key {
            body["typeKey"] = type_key.into();
        }
        super::json_response(self.status, &body, self.retry_after)
    }
}

/// A refused caller (audited where it was identified).
impl From<CallerError> for LegacyError {
    fn from(e: CallerError) -> Self {
        match e {
            CallerError::Token(e) => Self::new(StatusCode::UNAUTHORIZED, e.to_string()),
            CallerError::Forgejo(e) => Self::new(StatusCode::FORBIDDEN, e.to_string()),
            CallerError::UnknownPrefix => Self::not_found(),
        }
    }
}

impl From<CacheError> for LegacyError {
    fn from(e: CacheError) -> Self {
        match e {
            CacheError::WriteDenied
            | CacheError::ReadDenied
            | CacheError::WriteDeniedByPolicy(_)
            | CacheError::ReadDeniedByPolicy(_) => Self::new(StatusCode::FORBIDDEN, e.to_string()),
            CacheError::UploadNotFound => Self::new(StatusCode::NOT_FOUND, "no such cache"),
            CacheError::EntryNotFound => Self::new(StatusCode::NOT_FOUND, "no such entry"),
            CacheError::UploadClosed => {
                Self::bad_request("the cache is already committed or was abandoned")
            }
            CacheError::TooManyUploads => Self {
                retry_after: Some(60),
                ..Self::new(StatusCode::TOO_MANY_REQUESTS, e.to_string())
            },
            CacheError::StorageFull => {
                tracing::warn!("a v1 request was refused: the cache storage is full");
                Self::new(StatusCode::INSUFFICIENT_STORAGE, e.to_string())
            }
            // 503 is what the v1 client retries (once, after 5 s).
            ref e if e.is_transient() => {
                tracing::warn!(error = %e, "v1 request could not be served now");
                Self {
                    retry_after: Some(1),
                    ..Self::new(StatusCode::SERVICE_UNAVAILABLE, e.client_message())
                }
            }
            CacheError::BodyLengthMismatch { .. } => Self::bad_request(e.to_string()),
            CacheError::BodyFailed(_) => {
                Self::bad_request("the request body ended early or failed")
            }
            CacheError::Storage(_) | CacheError::Meta(_) => {
                tracing::error!(error = %e, "v1 request failed");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
            }
            // Invalid input, a conflict outside a reservation, sizes and ranges that do not
            // add up, entries over the size limit (the client's "data cap" answer is 400).
            other => Self::bad_request(other.to_string()),
        }
    }
}

impl From<links::NoLinkBase> for LegacyError {
    fn from(e: links::NoLinkBase) -> Self {
        Self::bad_request(e.to_string())
    }
}

/// `/_apis/artifactcache/…` at the origin root.
pub async fn root(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    ClientAddress(address): ClientAddress,
    mut headers: HeaderMap,
    body: Body,
) -> Response {
    links::host_from_authority(&mut headers, &uri);
    let rest = uri.path().strip_prefix(BASE).unwrap_or("");
    let request = Request {
        method: &method,
        uri: &uri,
        headers: &headers,
        address,
    };
    dispatch(&app, "", rest, request, body).await
}

/// What a v1 call is served on, besides its body.
#[derive(Clone, Copy)]
pub(super) struct Request<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    /// The client's address (see `origin`).
    pub address: Option<std::net::IpAddr>,
}

/// One v1 call: `prefix` is the path before `/_apis/artifactcache/` (without slashes) and
/// `rest` the resource after it.
pub(super) async fn dispatch(
    app: &AppState,
    prefix: &str,
    rest: &str,
    request: Request<'_>,
    body: Body,
) -> Response {
    serve(app, prefix, rest, request, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// The resources of the service.
enum Resource {
    /// `cache?keys=&version=`
    Lookup,
    /// `caches` (POST reserves, GET lists)
    Caches,
    /// `caches/{id}`
    Upload(UploadId),
    /// `artifacts/{id}`, a download through a Forgejo proxy
    Artifact(EntryId),
    /// `clean` (act and Forgejo answer it and do nothing)
    Clean,
}

impl Resource {
    fn parse(rest: &str) -> Option<Self> {
        let id = |raw: &str| raw.parse::<i64>().ok().filter(|id| *id > 0);
        Some(match rest.trim_end_matches('/') {
            "cache" => Self::Lookup,
            "caches" => Self::Caches,
            "clean" => Self::Clean,
            other => match other.split_once('/')? {
                ("caches", raw) => Self::Upload(UploadId::new(id(raw)?)),
                ("artifacts", raw) => Self::Artifact(EntryId::new(id(raw)?)),
                _ => return None,
            },
        })
    }
}

async fn serve(
    app: &AppState,
    prefix: &str,
    rest: &str,
    request: Request<'_>,
    body: Body,
) -> Result<Response, LegacyError> {
    let Request {
        method,
        uri,
        headers,
        address,
    } = request;
    let resource = Resource::parse(rest).ok_or_else(LegacyError::not_found)?;
    let caller = app.identify(headers, prefix, address).await?;
    let who = &caller.identity;
    let not_allowed = || {
        LegacyError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not supported here"),
        )
    };
    match (resource, method.as_str()) {
        (Resource::Lookup, "GET") => lookup(app, &caller, uri, headers).await,
        (Resource::Caches, "POST") => reserve(app, who, caller.address, body).await,
        (Resource::Caches, "GET") => list(app, who, uri).await,
        (Resource::Upload(id), "PATCH") => upload(app, who, id, headers, body).await,
        (Resource::Upload(id), "POST") => commit(app, who, id, body).await,
        (Resource::Artifact(id), "GET" | "HEAD") => {
            let open = app.cache().readable_entry(who, id).await?;
            Ok(transfer::serve_entry(app, method, &open, headers)
                .await
                .into_response())
        }
        (Resource::Clean, "POST") => Ok(Json::ok(json!({}))),
        _ => Err(not_allowed()),
    }
}

/// JSON success answers.
struct Json;

impl Json {
    fn ok(body: serde_json::Value) -> Response {
        Self::with(StatusCode::OK, body)
    }

    fn with(status: StatusCode, body: serde_json::Value) -> Response {
        super::json_response(status, &body, None)
    }
}

/// `GET cache?keys=k1,k2&version=V`: 200 with `archiveLocation`, or 204 on a miss.
async fn lookup(
    app: &AppState,
    caller: &Caller,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response, LegacyError> {
    let query = Query::parse(uri);
    let keys = query
        .str("keys")
        .ok_or_else(|| LegacyError::bad_request("the keys parameter is required"))?;
    let version = query
        .str("version")
        .ok_or_else(|| LegacyError::bad_request("the version parameter is required"))?;
    let mut keys = keys.split(',').map(str::to_owned);
    let primary = keys.next().unwrap_or_default();
    let restore: Vec<String> = keys.collect();
    let lookup = Lookup::parse(&primary, &restore, version).map_err(CacheError::from)?;
    let Some(hit) = app
        .cache()
        .lookup(&caller.identity, caller.address, &lookup)
        .await?
    else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let archive_location = match caller.forgejo.as_ref() {
        // The job reaches the cache only through its runner's proxy, which adds the MAC to
        // the download too; the lookup's authorization covers the entry.
        Some(run) if run.proxy_url.is_some() && run.run_id.is_some() => format!(
            "{}/{}{BASE}artifacts/{}",
            run.proxy_url.as_deref().unwrap_or_default(),
            run.run_id.as_deref().unwrap_or_default(),
            hit.entry.id
        ),
        _ => links::signed(app, headers, hit.entry)?,
    };
    Ok(Json::ok(json!({
        "scope": hit.scope.as_str(),
        "cacheKey": hit.matched_key,
        "cacheVersion": version,
        "creationTime": creation_time(hit.entry.created_at),
        "archiveLocation": archive_location,
    })))
}

/// Milliseconds since the epoch as the RFC 3339 time GitHub answered.
fn creation_time(millis: i64) -> String {
    crate::model::rfc3339_millis(millis)
}

/// `GET caches?key=K`: the entries of that exact key, any version, that the caller may read.
/// Clients ask only with debug logging on, after a miss, to name the versions that exist.
async fn list(app: &AppState, who: &Identity, uri: &Uri) -> Result<Response, LegacyError> {
    let key = Query::parse(uri)
        .str("key")
        .ok_or_else(|| LegacyError::bad_request("the key parameter is required"))?
        .to_owned();
    let entries = app.cache().list_key(who, &key).await?;
    let listed: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| {
            json!({
                "cacheKey": e.key,
                "scope": e.scope.as_str(),
                "cacheVersion": e.version,
                "creationTime": creation_time(e.created_at),
            })
        })
        .collect();
    Ok(Json::ok(
        json!({ "totalCount": listed.len(), "artifactCaches": listed }),
    ))
}

/// Reads a small JSON body, within the idle timeout however it trickles.
async fn json_body<T: for<'de> Deserialize<'de>>(
    app: &AppState,
    body: Body,
) -> Result<T, LegacyError> {
    let idle = app.config().limits.idle_timeout;
    let bytes = tokio::time::timeout(idle, to_bytes(body, MAX_JSON_BYTES))
        .await
        .map_err(|_| LegacyError::bad_request("the request body did not arrive in time"))?
        .map_err(|_| {
            LegacyError::bad_request(format!(
                "request bodies are limited to {MAX_JSON_BYTES} bytes"
            ))
        })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| LegacyError::bad_request(format!("the JSON request body is invalid: {e}")))
}

#[derive(Deserialize)]
struct ReserveRequest {
    key: String,
    version: String,
    /// Absent from very old clients.
    #[serde(rename = "cacheSize", default)]
    cache_size: Option<u64>,
}

/// `POST caches`: 201 `{"cacheId"}`, 409 when the key is saved or being saved, 400 over the
/// size limit (the client reports it as the data cap).
async fn reserve(
    app: &AppState,
    who: &Identity,
    address: Option<std::net::IpAddr>,
    body: Body,
) -> Result<Response, LegacyError> {
    let req: ReserveRequest = json_body(app, body).await?;
    let max = app.config().limits.max_entry_size;
    if let Some(size) = req.cache_size.filter(|size| *size > max) {
        return Err(LegacyError::bad_request(format!(
            "Cache size of {size} B is over the limit of {max} B per entry, not saving cache."
        )));
    }
    match app
        .cache()
        .reserve(who, address, &req.key, &req.version)
        .await
    {
        Ok(upload) => Ok(Json::with(
            StatusCode::CREATED,
            json!({ "cacheId": upload.id.get() }),
        )),
        Err(CacheError::Conflict) => {
            let scope = who.write_scope.as_ref().map_or("", |s| s.as_str());
            Err(LegacyError {
                type_key: Some("ArtifactCacheAlreadyExistsException"),
                ..LegacyError::new(
                    StatusCode::CONFLICT,
                    format!(
                        "Cache already exists. Scope: {scope}, Key: {}, Version: {}",
                        req.key, req.version
                    ),
                )
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// `Content-Range: bytes <start>-<end>/<total or *>` (end inclusive) as (start, length).
fn content_range(headers: &HeaderMap) -> Result<(u64, u64), LegacyError> {
    let bad = || {
        LegacyError::bad_request("Content-Range must be bytes <start>-<end>/* with start <= end")
    };
    let raw = headers
        .get(header::CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(bad)?;
    let spec = raw.trim().strip_prefix("bytes ").ok_or_else(bad)?;
    let (span, total) = spec.split_once('/').ok_or_else(bad)?;
    let (start, end) = span.split_once('-').ok_or_else(bad)?;
    let start: u64 = start.trim().parse().map_err(|_| bad())?;
    let end: u64 = end.trim().parse().map_err(|_| bad())?;
    if end < start {
        return Err(bad());
    }
    let total = total.trim();
    if total != "*" && total.parse::<u64>().map_or(true, |t| end >= t) {
        return Err(bad());
    }
    Ok((start, end - start + 1))
}

/// `PATCH caches/{id}`: one range of the archive, streamed to its own chunk; 204.
async fn upload(
    app: &AppState,
    who: &Identity,
    id: UploadId,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, LegacyError> {
    let (start, len) = content_range(headers)?;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .map(|v| v.to_str().ok().and_then(|s| s.parse::<u64>().ok()));
    match declared {
        Some(Some(n)) if n != len => {
            return Err(LegacyError::bad_request(format!(
                "Content-Length {n} does not match the {len} bytes of Content-Range"
            )))
        }
        Some(None) => return Err(LegacyError::bad_request("Content-Length is not a number")),
        _ => {}
    }
    let body = transfer::body_stream(body, app.config().limits.idle_timeout);
    transfer::stored_from(body, |body| {
        app.cache().stage_range(who, id, start, len, body)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct CommitRequest {
    size: u64,
}

/// `POST caches/{id}` with `{"size"}`: the ranges become the entry; 204.
async fn commit(
    app: &AppState,
    who: &Identity,
    id: UploadId,
    body: Body,
) -> Result<Response, LegacyError> {
    let req: CommitRequest = json_body(app, body).await?;
    app.cache().commit_ranges(who, id, req.size).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_unavailable_database_is_a_503_that_names_no_host() {
        use super::*;
        let e = CacheError::database_unavailable(
            "error connecting to db.internal:5432: connection refused",
        );
        let v1 = LegacyError::from(e);
        assert_eq!(v1.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!v1.message.contains("db.internal"), "{}", v1.message);
    }

    #[test]
    fn an_unavailable_store_is_a_503_with_retry_after() {
        use super::*;
        let e = CacheError::storage_unavailable("connection refused at 10.1.2.3:9000");
        let v1 = LegacyError::from(e);
        assert_eq!(v1.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(v1.retry_after, Some(1));
        assert!(!v1.message.contains("10.1.2.3"), "{}", v1.message);
    }

    #[test]
    fn requests_are_labelled_by_endpoint_wherever_they_are_served() {
        use super::route_label;
        assert_eq!(
            route_label("/_apis/artifactcache/cache"),
            Some("/_apis/artifactcache/cache")
        );
        assert_eq!(
            route_label("/secret-prefix/_apis/artifactcache/caches/42"),
            Some("/_apis/artifactcache/caches/{id}")
        );
        assert_eq!(
            route_label("/_apis/artifactcache/artifacts/7"),
            Some("/_apis/artifactcache/artifacts/{id}")
        );
        assert_eq!(route_label("/_apis/artifactcache/unknown"), None);
        assert_eq!(route_label("/healthz"), None);
    }

    use super::*;
    use axum::http::HeaderValue;

    fn range(value: &str) -> Result<(u64, u64), LegacyError> {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_RANGE, HeaderValue::from_str(value).unwrap());
        content_range(&h)
    }

    #[test]
    fn content_ranges_are_inclusive_spans() {
        assert_eq!(range("bytes 0-33554431/*").unwrap(), (0, 32 << 20));
        assert_eq!(range("bytes 10-10/*").unwrap(), (10, 1));
        assert_eq!(range("bytes 0-9/10").unwrap(), (0, 10));
        for bad in [
            "bytes 5-4/*",
            "bytes 0-9/9",
            "bytes -1-3/*",
            "items 0-1/*",
            "bytes 0-/*",
            "bytes 0-1",
            "bytes 0-99999999999999999999/*",
        ] {
            assert!(range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn resources_are_parsed_strictly() {
        assert!(matches!(Resource::parse("cache"), Some(Resource::Lookup)));
        assert!(matches!(
            Resource::parse("caches/7"),
            Some(Resource::Upload(id)) if id == UploadId::new(7)
        ));
        assert!(matches!(
            Resource::parse("artifacts/9"),
            Some(Resource::Artifact(id)) if id == EntryId::new(9)
        ));
        for bad in [
            "caches/0",
            "caches/-1",
            "caches/x",
            "caches/1/2",
            "nope",
            "",
        ] {
            assert!(Resource::parse(bad).is_none(), "{bad}");
        }
    }
}
