//! Turborepo's remote cache API (`/v8/artifacts`, docs/build-tools.md), as `turbo` 2.x calls
//! it with `--api <hoard's URL> --token <the job's runtime token> --team <any name>`: artifacts
//! by hash (`GET`, `HEAD`, `PUT`), the batch query (`POST /v8/artifacts`), usage events (taken
//! and dropped) and the status. The token is verified as the cache API verifies it, and an
//! artifact is an entry of the job's repository and scope (see [`crate::cache::tools`]).
//! Errors are `{"error": {"code", "message"}}`, which `turbo` prints.

use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::origin::ClientAddress;
use super::query::Query;
use super::{objects, AppState};
use crate::auth::{Caller, CallerError};
use crate::cache::tools::{ToolHit, ToolSave};
use crate::cache::CacheError;
use crate::model::{Tool, ToolObject};

/// Where the API lives (`TURBO_API` is hoard's address).
pub const BASE: &str = "/v8/artifacts";

/// The headers `turbo` sends with an artifact and reads back with it: the task's duration
/// (the time a hit saves) and, with `remoteCache.signature`, the artifact's signature.
const KEPT_HEADERS: [&str; 4] = [
    "x-artifact-duration",
    "x-artifact-tag",
    "x-artifact-sha",
    "x-artifact-dirty-hash",
];

/// The longest hash and team name taken (turbo's hashes are 16 hex digits).
const MAX_NAME: usize = 128;

/// The batch query's body is a list of hashes.
const MAX_QUERY_BYTES: usize = 64 * 1024;
const MAX_QUERY_HASHES: usize = 100;

/// A refusal, in the shape `turbo` reads.
#[derive(Debug)]
pub struct TurboError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl TurboError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "Artifact not found")
    }
}

impl IntoResponse for TurboError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        objects::with_retry_after(super::json_response(self.status, &body, None))
    }
}

/// The error code of a status, as Vercel's API names them.
fn code_of(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limited",
        StatusCode::INSUFFICIENT_STORAGE => "storage_full",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        StatusCode::INTERNAL_SERVER_ERROR => "internal",
        _ => "bad_request",
    }
}

impl From<CallerError> for TurboError {
    fn from(e: CallerError) -> Self {
        let status = objects::caller_status(&e);
        Self::new(status, code_of(status), e.to_string())
    }
}

impl From<CacheError> for TurboError {
    fn from(e: CacheError) -> Self {
        let status = objects::status_of(&e);
        Self::new(status, code_of(status), objects::message_of(&e))
    }
}

/// `/v8/artifacts` and everything under it.
pub async fn serve(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    ClientAddress(address): ClientAddress,
    headers: HeaderMap,
    body: Body,
) -> Response {
    dispatch(&app, &method, &uri, address, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn dispatch(
    app: &AppState,
    method: &Method,
    uri: &Uri,
    address: Option<std::net::IpAddr>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, TurboError> {
    let rest = uri.path().strip_prefix(BASE).unwrap_or_default();
    if method == Method::OPTIONS {
        return Ok(preflight());
    }
    let caller = app.identify(headers, "", address).await?;
    match (rest, method.as_str()) {
        ("/status", "GET") => Ok(ok(json!({ "status": "enabled" }))),
        // Usage events (hits and misses as turbo saw them): hoard counts its own.
        ("/events", "POST") => Ok(ok(json!({}))),
        ("" | "/", "POST") => query(app, &caller, uri, body).await,
        (hash, "GET" | "HEAD" | "PUT") if hash.len() > 1 => {
            let name = object_name(uri, &hash[1..])?;
            if method == Method::PUT {
                put(app, &caller, &name, headers, body).await
            } else {
                get(app, &caller, method, &name, headers).await
            }
        }
        _ => Err(TurboError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{method} {} is not part of the API", uri.path()),
        )),
    }
}

/// A name turbo sends (a hash, a team): letters, digits, `.`, `_` and `-`.
fn valid_name(raw: &str) -> bool {
    raw.len() <= MAX_NAME
        && raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The object name of `hash` for the team the query names (`teamId` or `slug`): artifacts of
/// different teams of one repository are apart.
fn object_name(uri: &Uri, hash: &str) -> Result<String, TurboError> {
    if hash.is_empty() || !valid_name(hash) {
        return Err(TurboError::bad_request(
            "an artifact hash is 1 to 128 letters, digits, '.', '_' or '-'",
        ));
    }
    let query = Query::parse(uri);
    let team = query
        .str("teamId")
        .or_else(|| query.str("slug"))
        .unwrap_or_default();
    if !valid_name(team) {
        return Err(TurboError::bad_request(
            "a team is at most 128 letters, digits, '.', '_' or '-'",
        ));
    }
    Ok(format!("{team}/{hash}"))
}

fn ok(body: serde_json::Value) -> Response {
    super::json_response(StatusCode::OK, &body, None)
}

/// What `turbo --preflight` asks before each call: the headers it may send.
fn preflight() -> Response {
    (
        StatusCode::OK,
        [
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
            (
                header::ACCESS_CONTROL_ALLOW_METHODS,
                "GET, HEAD, PUT, POST, OPTIONS",
            ),
            (
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                "Authorization, Content-Type, User-Agent, x-artifact-duration, x-artifact-tag, \
                 x-artifact-sha, x-artifact-dirty-hash, x-artifact-client-ci, \
                 x-artifact-client-interactive",
            ),
        ],
    )
        .into_response()
}

/// `GET` and `HEAD /v8/artifacts/{hash}`: the artifact with the headers it was saved with, or
/// 404.
async fn get(
    app: &AppState,
    caller: &Caller,
    method: &Method,
    name: &str,
    headers: &HeaderMap,
) -> Result<Response, TurboError> {
    objects::serve(app, caller, Tool::Turbo, name, method, headers)
        .await?
        .ok_or_else(TurboError::not_found)
}

/// `PUT /v8/artifacts/{hash}`: stores the artifact in the job's scope, with the headers turbo
/// reads back.
async fn put(
    app: &AppState,
    caller: &Caller,
    name: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, TurboError> {
    let len = objects::declared_length(headers).ok_or_else(|| {
        TurboError::new(
            StatusCode::LENGTH_REQUIRED,
            "length_required",
            "an artifact is sent with its Content-Length",
        )
    })?;
    if let Some(duration) = headers.get("x-artifact-duration") {
        // turbo reads it back as a whole number of milliseconds.
        if duration
            .to_str()
            .ok()
            .and_then(|d| d.parse::<u64>().ok())
            .is_none()
        {
            return Err(TurboError::bad_request(
                "x-artifact-duration is a whole number of milliseconds",
            ));
        }
    }
    let sent = KEPT_HEADERS.iter().filter_map(|name| {
        let value = headers.get(*name)?.to_str().ok()?;
        Some((*name, value))
    });
    let object = ToolObject::new(Tool::Turbo, sent)
        .ok_or_else(|| TurboError::bad_request("the x-artifact-* headers are too long to keep"))?;
    let saved = objects::take(app, caller, &object, name, (body, len), None).await?;
    let hash = name.rsplit('/').next().unwrap_or(name);
    let answer = json!({ "urls": [format!("{BASE}/{hash}")] });
    Ok(match saved {
        ToolSave::Saved(_) => ok(answer),
        ToolSave::Present => super::json_response(StatusCode::ACCEPTED, &answer, None),
    })
}

#[derive(Deserialize)]
struct QueryRequest {
    hashes: Vec<String>,
}

/// `POST /v8/artifacts` `{"hashes": [...]}`: for each, its size, duration and tag, or `null`
/// where the job cannot read it.
async fn query(
    app: &AppState,
    caller: &Caller,
    uri: &Uri,
    body: Body,
) -> Result<Response, TurboError> {
    let idle = app.config().limits.idle_timeout;
    let bytes = tokio::time::timeout(idle, to_bytes(body, MAX_QUERY_BYTES))
        .await
        .map_err(|_| TurboError::bad_request("the request body did not arrive in time"))?
        .map_err(|_| {
            TurboError::bad_request(format!("the body is limited to {MAX_QUERY_BYTES} bytes"))
        })?;
    let request: QueryRequest = serde_json::from_slice(&bytes)
        .map_err(|e| TurboError::bad_request(format!("the JSON body is invalid: {e}")))?;
    if request.hashes.len() > MAX_QUERY_HASHES {
        return Err(TurboError::bad_request(format!(
            "at most {MAX_QUERY_HASHES} hashes per query"
        )));
    }
    let mut answer = serde_json::Map::new();
    for hash in request.hashes {
        let name = object_name(uri, &hash)?;
        let found = app
            .cache()
            .find_tool_object(&caller.identity, caller.address, Tool::Turbo, &name)
            .await?;
        let value = match found {
            None => serde_json::Value::Null,
            Some(ToolHit { open, object }) => {
                let header = |wanted: &str| {
                    object
                        .as_ref()
                        .and_then(|o| o.headers().find(|(n, _)| *n == wanted).map(|(_, v)| v))
                };
                json!({
                    "size": open.entry.size,
                    "taskDurationMs": header("x-artifact-duration")
                        .and_then(|d| d.parse::<u64>().ok())
                        .unwrap_or(0),
                    "tag": header("x-artifact-tag"),
                })
            }
        };
        answer.insert(hash, value);
    }
    Ok(ok(serde_json::Value::Object(answer)))
}
