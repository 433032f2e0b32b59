//! Twirp `CacheService` v2 (PROTOCOL.md §2): JSON and binary protobuf, errors always twirp JSON.

use axum::body::{to_bytes, Body};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use prost::Message;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::origin::ClientAddress;
use super::proto::{
    CreateCacheEntryRequest, CreateCacheEntryResponse, FinalizeCacheEntryUploadRequest,
    FinalizeCacheEntryUploadResponse, GetCacheEntryDownloadUrlRequest,
    GetCacheEntryDownloadUrlResponse,
};
use super::{links, AppState};
use crate::auth::{CallerError, Identity};
use crate::cache::CacheError;
use crate::model::Lookup;

/// Path of the service, served at the origin root (§2.1).
pub const SERVICE_PATH: &str = "/twirp/github.actions.results.api.v1.CacheService/";

/// The route label of a call of the cache service, at the origin root or under a prefix, by the
/// call's name; `None` for other paths and for unknown calls (whose names are the client's).
pub fn rpc_route(path: &str) -> Option<&'static str> {
    // A suffix compare, not a search: this runs on every request.
    RPC_ROUTES.into_iter().find(|route| path.ends_with(route))
}

/// The paths of the calls at the origin root.
pub const RPC_ROUTES: [&str; 3] = [
    "/twirp/github.actions.results.api.v1.CacheService/CreateCacheEntry",
    "/twirp/github.actions.results.api.v1.CacheService/FinalizeCacheEntryUpload",
    "/twirp/github.actions.results.api.v1.CacheService/GetCacheEntryDownloadURL",
];

/// Twirp requests are small; anything bigger is not a cache call.
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// A twirp error: `{"code": …, "msg": …}` with the status twirp assigns to the code (§10.1).
#[derive(Debug)]
pub struct TwirpError {
    code: &'static str,
    msg: String,
    /// Seconds for a `Retry-After` header (the client shows it on 429, §2.4).
    retry_after: Option<u64>,
}

impl TwirpError {
    pub fn new(code: &'static str, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            retry_after: None,
        }
    }

    fn status(&self) -> StatusCode {
        match self.code {
            "invalid_argument" | "malformed" | "out_of_range" => StatusCode::BAD_REQUEST,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            "permission_denied" => StatusCode::FORBIDDEN,
            "not_found" | "bad_route" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "failed_precondition" => StatusCode::PRECONDITION_FAILED,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for TwirpError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.code, "msg": self.msg });
        super::json_response(self.status(), &body, self.retry_after)
    }
}

impl From<CacheError> for TwirpError {
    fn from(e: CacheError) -> Self {
        match e {
            CacheError::Invalid(e) => Self::new("invalid_argument", e.to_string()),
            CacheError::Conflict => Self::new("already_exists", e.to_string()),
            CacheError::ReadDenied
            | CacheError::ReadDeniedByPolicy(_)
            | CacheError::WriteDenied
            | CacheError::WriteDeniedByPolicy(_) => Self::new("permission_denied", e.to_string()),
            CacheError::TooManyUploads => Self {
                retry_after: Some(60),
                ..Self::new("resource_exhausted", e.to_string())
            },
            CacheError::StorageFull => {
                tracing::warn!("a reservation was refused: the cache storage is full");
                Self {
                    retry_after: Some(60),
                    ..Self::new("resource_exhausted", e.to_string())
                }
            }
            ref e if e.is_transient() => {
                tracing::warn!(error = %e, "cache service call could not be served now");
                Self {
                    retry_after: Some(1),
                    ..Self::new("unavailable", e.client_message())
                }
            }
            // No twirp call carries a body to the chunk store; a body failure here is ours.
            CacheError::Storage(_)
            | CacheError::BodyFailed(_)
            | CacheError::BodyLengthMismatch { .. }
            | CacheError::Meta(_) => {
                tracing::error!(error = %e, "cache service call failed");
                Self::new("internal", "internal error")
            }
            other => Self::new("failed_precondition", other.to_string()),
        }
    }
}

impl From<links::NoLinkBase> for TwirpError {
    fn from(e: links::NoLinkBase) -> Self {
        Self::new("invalid_argument", e.to_string())
    }
}

/// A refused caller (audited where it was identified).
impl From<CallerError> for TwirpError {
    fn from(e: CallerError) -> Self {
        match e {
            CallerError::Token(e) => Self::new("unauthenticated", e.to_string()),
            CallerError::Forgejo(e) => Self::new("permission_denied", e.to_string()),
            CallerError::UnknownPrefix => Self::new("bad_route", "no such route"),
        }
    }
}

/// The two encodings a twirp client may use.
#[derive(Debug, Clone, Copy)]
enum Encoding {
    Json,
    Protobuf,
}

impl Encoding {
    fn of(headers: &HeaderMap) -> Result<Self, TwirpError> {
        let ct = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json");
        let mime = ct.split(';').next().unwrap_or("").trim();
        let is = |name: &str| mime.eq_ignore_ascii_case(name);
        if mime.is_empty() || is("application/json") {
            Ok(Self::Json)
        } else if is("application/protobuf") || is("application/x-protobuf") {
            Ok(Self::Protobuf)
        } else {
            Err(TwirpError::new(
                "bad_route",
                format!("unexpected Content-Type {ct:?}"),
            ))
        }
    }

    fn decode<T: Message + Default + DeserializeOwned>(self, body: &[u8]) -> Result<T, TwirpError> {
        match self {
            Self::Json => serde_json::from_slice(body).map_err(|e| {
                TwirpError::new(
                    "malformed",
                    format!("the JSON request body is invalid: {e}"),
                )
            }),
            Self::Protobuf => T::decode(body).map_err(|e| {
                TwirpError::new(
                    "malformed",
                    format!("the protobuf request body is invalid: {e}"),
                )
            }),
        }
    }

    fn reply<T: Message + Serialize>(self, message: &T) -> Response {
        match self {
            Self::Json => {
                // Room for a lookup's answer (a link and a key) at once: no regrowing.
                let mut body = Vec::with_capacity(512);
                if serde_json::to_writer(&mut body, message).is_err() {
                    body = b"{}".to_vec();
                }
                ([(header::CONTENT_TYPE, "application/json")], body).into_response()
            }
            Self::Protobuf => (
                [(header::CONTENT_TYPE, "application/protobuf")],
                message.encode_to_vec(),
            )
                .into_response(),
        }
    }
}

/// `POST /twirp/github.actions.results.api.v1.CacheService/{method}`. The request is taken
/// whole and the call's name read off the path as sent (twirp names are plain ASCII): the
/// extractors would copy the header map and decode the name into a string of its own, on the
/// path every lookup takes.
pub async fn call(State(app): State<AppState>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let Ok(ClientAddress(address)) = ClientAddress::from_request_parts(&mut parts, &app).await;
    links::host_from_authority(&mut parts.headers, &parts.uri);
    let method = parts.uri.path().rsplit('/').next().unwrap_or_default();
    dispatch(
        &app,
        "",
        method,
        &parts.method,
        &parts.headers,
        address,
        body,
    )
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// Serves one call; `prefix` is the path before `/twirp/` (clients that keep the path of
/// `ACTIONS_RESULTS_URL`), which may name a namespace.
pub(super) async fn dispatch(
    app: &AppState,
    prefix: &str,
    method: &str,
    http_method: &Method,
    headers: &HeaderMap,
    address: Option<std::net::IpAddr>,
    body: Body,
) -> Result<Response, TwirpError> {
    if http_method != Method::POST {
        return Err(TwirpError::new(
            "bad_route",
            format!("{http_method} is not supported; twirp calls are POST"),
        ));
    }
    let handler = match method {
        "CreateCacheEntry" => Rpc::Create,
        "FinalizeCacheEntryUpload" => Rpc::Finalize,
        "GetCacheEntryDownloadURL" => Rpc::Lookup,
        other => {
            return Err(TwirpError::new(
                "bad_route",
                format!("no such method {other:?}"),
            ))
        }
    };
    let encoding = Encoding::of(headers)?;
    // Who is calling is settled before the body is read: a stranger costs no body read.
    let caller = app.identify(headers, prefix, address).await?;
    let who = &caller.identity;
    // A control request is small: it must arrive within the idle timeout, however it trickles.
    let idle = app.config().limits.idle_timeout;
    let body = tokio::time::timeout(idle, to_bytes(body, MAX_REQUEST_BYTES))
        .await
        .map_err(|_| TwirpError::new("malformed", "the request body did not arrive in time"))?
        .map_err(|_| {
            TwirpError::new(
                "malformed",
                format!("request bodies are limited to {MAX_REQUEST_BYTES} bytes"),
            )
        })?;
    match handler {
        Rpc::Create => create(app, who, caller.address, headers, encoding.decode(&body)?)
            .await
            .map(|r| encoding.reply(&r)),
        Rpc::Finalize => finalize(app, who, encoding.decode(&body)?)
            .await
            .map(|r| encoding.reply(&r)),
        Rpc::Lookup => lookup(app, who, caller.address, headers, encoding.decode(&body)?)
            .await
            .map(|r| encoding.reply(&r)),
    }
}

enum Rpc {
    Create,
    Finalize,
    Lookup,
}

async fn create(
    app: &AppState,
    who: &Identity,
    address: Option<std::net::IpAddr>,
    headers: &HeaderMap,
    req: CreateCacheEntryRequest,
) -> Result<CreateCacheEntryResponse, TwirpError> {
    match app
        .cache()
        .reserve(who, address, &req.key, &req.version)
        .await
    {
        Ok(upload) => Ok(CreateCacheEntryResponse {
            ok: true,
            signed_upload_url: links::signed(app, headers, upload)?,
            message: String::new(),
        }),
        // GitHub answers a token without a writable scope with 200 ok:false (§2.4, §12); a
        // write the policy refuses is answered the same, so the client warns and goes on.
        Err(e @ (CacheError::WriteDenied | CacheError::WriteDeniedByPolicy(_))) => {
            Ok(CreateCacheEntryResponse {
                ok: false,
                signed_upload_url: String::new(),
                message: e.to_string(),
            })
        }
        Err(e) => Err(e.into()),
    }
}

async fn finalize(
    app: &AppState,
    who: &Identity,
    req: FinalizeCacheEntryUploadRequest,
) -> Result<FinalizeCacheEntryUploadResponse, TwirpError> {
    if req.size_bytes < 0 {
        return Err(TwirpError::new(
            "invalid_argument",
            "size_bytes must not be negative",
        ));
    }
    match app
        .cache()
        .finalize(who, &req.key, &req.version, req.size_bytes as u64)
        .await
    {
        Ok(entry) => Ok(FinalizeCacheEntryUploadResponse {
            ok: true,
            entry_id: entry.get(),
            message: String::new(),
        }),
        // Outcomes the client reports as a warning with our message (§2.6).
        Err(
            e @ (CacheError::WriteDenied
            | CacheError::WriteDeniedByPolicy(_)
            | CacheError::NoReservation
            | CacheError::NothingUploaded
            | CacheError::TooLarge(_)
            | CacheError::SizeMismatch { .. }),
        ) => Ok(FinalizeCacheEntryUploadResponse {
            ok: false,
            entry_id: 0,
            message: e.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}

async fn lookup(
    app: &AppState,
    who: &Identity,
    address: Option<std::net::IpAddr>,
    headers: &HeaderMap,
    req: GetCacheEntryDownloadUrlRequest,
) -> Result<GetCacheEntryDownloadUrlResponse, TwirpError> {
    let lookup =
        Lookup::parse(&req.key, &req.restore_keys, &req.version).map_err(CacheError::from)?;
    match app.cache().lookup(who, address, &lookup).await? {
        // A miss is 200 {"ok":false}: a 404 would make the client print a warning (§2.7). With
        // --upstream-cache, the upstream is asked first.
        // Boxed: its state (a request upstream) stays out of every other call's future.
        None if app.config().upstream_cache.is_some() => Ok(Box::pin(
            super::read_through::on_miss(app, who, address, headers, &req),
        )
        .await
        .unwrap_or_default()),
        None => Ok(GetCacheEntryDownloadUrlResponse::default()),
        Some(hit) => Ok(GetCacheEntryDownloadUrlResponse {
            ok: true,
            signed_download_url: links::signed(app, headers, hit.entry)?,
            matched_key: hit.matched_key,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoding_is_read_off_the_content_type_whatever_its_case() {
        let of = |ct: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(ct) = ct {
                headers.insert(header::CONTENT_TYPE, ct.parse().unwrap());
            }
            Encoding::of(&headers).map_err(|e| e.code)
        };
        assert!(matches!(of(None), Ok(Encoding::Json)));
        assert!(matches!(of(Some("")), Ok(Encoding::Json)));
        assert!(matches!(
            of(Some("Application/JSON; charset=utf-8")),
            Ok(Encoding::Json)
        ));
        assert!(matches!(
            of(Some("application/protobuf")),
            Ok(Encoding::Protobuf)
        ));
        assert!(matches!(
            of(Some(" APPLICATION/X-PROTOBUF ")),
            Ok(Encoding::Protobuf)
        ));
        assert!(matches!(of(Some("text/plain")), Err("bad_route")));
        assert!(matches!(of(Some("application/jsonx")), Err("bad_route")));
    }

    #[test]
    fn an_unavailable_database_is_a_503_that_names_no_host() {
        let e = CacheError::database_unavailable(
            "error connecting to db.internal:5432: connection refused",
        );
        let twirp = TwirpError::from(e);
        assert_eq!((twirp.code, twirp.status().as_u16()), ("unavailable", 503));
        assert_eq!(twirp.retry_after, Some(1));
        assert!(!twirp.msg.contains("db.internal"), "{}", twirp.msg);
    }

    #[test]
    fn an_unavailable_store_is_unavailable_not_internal() {
        let e = CacheError::storage_unavailable("connection refused at 10.1.2.3:9000");
        let twirp = TwirpError::from(e);
        assert_eq!((twirp.code, twirp.status().as_u16()), ("unavailable", 503));
        assert_eq!(twirp.retry_after, Some(1));
        assert!(!twirp.msg.contains("10.1.2.3"), "{}", twirp.msg);
    }

    #[test]
    fn codes_map_to_twirps_http_statuses() {
        for (code, status) in [
            ("invalid_argument", 400),
            ("failed_precondition", 412),
            ("resource_exhausted", 429),
            ("unavailable", 503),
            ("internal", 500),
        ] {
            assert_eq!(
                TwirpError::new(code, "m").status().as_u16(),
                status,
                "{code}"
            );
        }
    }
}
