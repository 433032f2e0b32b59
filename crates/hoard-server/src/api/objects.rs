//! What every build tool's protocol does with an object ([`crate::cache::tools`]): identify
//! the caller, serve an object found with the headers it was saved with, take one whose length
//! is declared, and say why not with the status codes the tools read. The protocols (Turborepo,
//! Nx, WebDAV, Bazel) differ only in their paths, names and error bodies.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{transfer, AppState};
use crate::auth::{Caller, CallerError};
use crate::cache::tools::{ToolHit, ToolSave};
use crate::cache::CacheError;
use crate::model::{Tool, ToolObject};

/// The body's declared length: every tool sends one (the size is checked before a byte is
/// stored, as a save's is).
pub(super) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Object `name` of `tool` as `caller` may read it, served as any download is (`HEAD`,
/// ranges) with the headers it was saved with; `None` on a miss.
pub(super) async fn serve(
    app: &AppState,
    caller: &Caller,
    tool: Tool,
    name: &str,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Option<Response>, CacheError> {
    let found = app
        .cache()
        .find_tool_object(&caller.identity, caller.address, tool, name)
        .await?;
    let Some(ToolHit { open, object }) = found else {
        return Ok(None);
    };
    let mut response = match transfer::stream_entry(app, method, &open, headers).await {
        Ok(response) => response,
        // A precondition or range that does not hold, or the bytes unreadable now: the status
        // says which, in the tools' plain words rather than Azure's XML.
        Err(e) => {
            let status = e.into_response().status();
            let said = status
                .canonical_reason()
                .unwrap_or("the object cannot be served");
            return Ok(Some(plain(status, said)));
        }
    };
    let kept = object.as_ref().into_iter().flat_map(ToolObject::headers);
    for (name, value) in kept {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    Ok(Some(response))
}

/// Takes `body` (`len` bytes) as object `name` in `caller`'s write scope; with `sha256`, only
/// if that is its content's digest.
pub(super) async fn take(
    app: &AppState,
    caller: &Caller,
    object: &ToolObject,
    name: &str,
    (body, len): (Body, u64),
    sha256: Option<[u8; 32]>,
) -> Result<ToolSave, CacheError> {
    let idle = app.config().limits.idle_timeout;
    let stream = transfer::body_stream(body, idle);
    app.cache()
        .save_tool_object(
            &caller.identity,
            caller.address,
            object,
            name,
            stream,
            len,
            sha256,
        )
        .await
}

/// The status a refused call answers, the same for every tool.
pub(super) fn status_of(e: &CacheError) -> StatusCode {
    match e {
        CacheError::WriteDenied
        | CacheError::ReadDenied
        | CacheError::WriteDeniedByPolicy(_)
        | CacheError::ReadDeniedByPolicy(_) => StatusCode::FORBIDDEN,
        CacheError::EntryNotFound => StatusCode::NOT_FOUND,
        CacheError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        CacheError::TooManyUploads => StatusCode::TOO_MANY_REQUESTS,
        // A finalize that lost a race: a retry decides again.
        CacheError::UploadClosed => StatusCode::SERVICE_UNAVAILABLE,
        CacheError::StorageFull => StatusCode::INSUFFICIENT_STORAGE,
        e if e.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
        CacheError::Storage(_) | CacheError::Meta(_) => StatusCode::INTERNAL_SERVER_ERROR,
        // Invalid names, a body shorter or longer than declared or not of its digest.
        _ => StatusCode::BAD_REQUEST,
    }
}

/// The words a refused call answers: what went wrong, except for failures of hoard's own
/// stores, which are logged and not shown.
pub(super) fn message_of(e: &CacheError) -> String {
    match status_of(e) {
        StatusCode::INTERNAL_SERVER_ERROR => {
            tracing::error!(error = %e, "build tool request failed");
            "internal error".into()
        }
        StatusCode::SERVICE_UNAVAILABLE => e.client_message(),
        _ => e.to_string(),
    }
}

/// The status of a caller refused.
pub(super) fn caller_status(e: &CallerError) -> StatusCode {
    match e {
        CallerError::Token(_) => StatusCode::UNAUTHORIZED,
        CallerError::Forgejo(_) => StatusCode::FORBIDDEN,
        CallerError::UnknownPrefix => StatusCode::NOT_FOUND,
    }
}

/// A refusal in plain text, for the tools that read only the status (Nx, Bazel, WebDAV).
pub(super) fn plain(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message.into(),
    )
        .into_response()
}

/// [`plain`] for a refused call, with `Retry-After` where a retry is the answer.
pub(super) fn plain_refusal(e: CacheError) -> Response {
    with_retry_after(plain(status_of(&e), message_of(&e)))
}

/// `response` with `Retry-After` if its status asks for a retry (429, 503).
pub(super) fn with_retry_after(mut response: Response) -> Response {
    let seconds = match response.status() {
        StatusCode::TOO_MANY_REQUESTS => "60",
        StatusCode::SERVICE_UNAVAILABLE => "1",
        _ => return response,
    };
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static(seconds));
    response
}

/// The caller of a request to a plain-text protocol, or the refusal to answer.
pub(super) async fn plain_caller(
    app: &AppState,
    headers: &HeaderMap,
    address: Option<std::net::IpAddr>,
) -> Result<Caller, Response> {
    app.identify(headers, "", address)
        .await
        .map_err(plain_caller_refusal)
}

/// What a plain-text protocol answers for a `PUT` taken: a new object, or one the job's scope
/// had already.
#[derive(Debug, Clone, Copy)]
pub(super) struct Taken {
    pub saved: StatusCode,
    pub present: StatusCode,
}

impl Taken {
    /// 200 either way (Bazel, Go).
    pub const OK: Self = Self {
        saved: StatusCode::OK,
        present: StatusCode::OK,
    };
}

/// `GET`, `HEAD` and `PUT` of object `name` of `tool` for the protocols whose clients read only
/// the status (Nx, Bazel, WebDAV, Go): the object or 404, or the body taken (its
/// `Content-Length` required; with `sha256`, only a body of that digest). `None` for any other
/// method, which the protocol answers itself.
#[allow(clippy::too_many_arguments)]
pub(super) async fn plain_object(
    app: &AppState,
    caller: &Caller,
    object: &ToolObject,
    name: &str,
    (method, headers, body): (&Method, &HeaderMap, Body),
    taken: Taken,
    sha256: Option<[u8; 32]>,
) -> Option<Response> {
    Some(match *method {
        Method::GET | Method::HEAD => {
            match serve(app, caller, object.tool, name, method, headers).await {
                Ok(Some(found)) => found,
                Ok(None) => plain(StatusCode::NOT_FOUND, "not found"),
                Err(e) => plain_refusal(e),
            }
        }
        Method::PUT => {
            let Some(len) = declared_length(headers) else {
                return Some(plain(
                    StatusCode::LENGTH_REQUIRED,
                    "Content-Length is required",
                ));
            };
            match take(app, caller, object, name, (body, len), sha256).await {
                Ok(ToolSave::Saved(_)) => plain(taken.saved, ""),
                Ok(ToolSave::Present) => plain(taken.present, ""),
                Err(e) => plain_refusal(e),
            }
        }
        _ => return None,
    })
}

/// A whole request of a plain-text protocol for object `name` (Nx, Bazel, Go): the caller
/// identified, then [`plain_object`]; any other method is refused, naming `protocol`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn plain_request(
    app: &AppState,
    address: Option<std::net::IpAddr>,
    (method, headers, body): (&Method, &HeaderMap, Body),
    object: &ToolObject,
    name: &str,
    taken: Taken,
    sha256: Option<[u8; 32]>,
    protocol: &str,
) -> Response {
    let caller = match plain_caller(app, headers, address).await {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    let request = (method, headers, body);
    match plain_object(app, &caller, object, name, request, taken, sha256).await {
        Some(answer) => answer,
        None => plain(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not part of {protocol}"),
        ),
    }
}

/// [`plain`] for a refused caller.
pub(super) fn plain_caller_refusal(e: CallerError) -> Response {
    plain(caller_status(&e), e.to_string())
}

/// The longest a tool token lives when its runtime token names no expiry (tokens are read
/// unverified, `--insecure-skip-token-validation`): a job's longest run on GitHub.
const TOOL_TOKEN_FALLBACK_LIFETIME: u64 = 6 * 3600;

/// `POST /_hoard/tools/token` with the job's runtime token: a tool token for the job's build
/// tools (`auth/tool_token.rs`), `{"token", "expires_at"}`. Only a runtime token is exchanged:
/// a tool token, a namespace or an anonymous caller has none to derive from.
pub async fn mint_tool_token(
    axum::extract::State(app): axum::extract::State<AppState>,
    super::origin::ClientAddress(address): super::origin::ClientAddress,
    headers: HeaderMap,
) -> Response {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::auth::verify::credential)
        .map(|t| t.trim().to_owned());
    let Some(runtime) = presented.filter(|t| !t.starts_with(crate::auth::tool_token::PREFIX))
    else {
        return plain(
            StatusCode::UNAUTHORIZED,
            "send the job's runtime token (ACTIONS_RUNTIME_TOKEN) as the bearer token",
        );
    };
    let caller = match plain_caller(&app, &headers, address).await {
        Ok(caller) if caller.how == "token" => caller,
        Ok(_) => return plain(StatusCode::FORBIDDEN, "only a runtime token is exchanged"),
        Err(refused) => return refused,
    };
    let signer = app.signer();
    let exp = crate::auth::tool_token::jwt_expiry(&runtime)
        .unwrap_or_else(|| signer.now() + TOOL_TOKEN_FALLBACK_LIFETIME);
    let token = signer.tool_token(&caller.identity, exp);
    tracing::info!(
        target: "hoard::audit",
        action = "tool_token",
        repository = %crate::model::LogSafe(caller.identity.display_repository()),
        subject = %crate::model::LogSafe(&caller.identity.subject),
        exp,
    );
    let expires_at =
        crate::model::rfc3339_millis(exp.saturating_mul(1000).min(i64::MAX as u64) as i64);
    super::json_response(
        StatusCode::OK,
        &serde_json::json!({ "token": token, "expires_at": expires_at }),
        None,
    )
}
