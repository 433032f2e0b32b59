//! The dashboard: three files built into the binary, served under `/_hoard/` with a policy
//! that lets the page load nothing but itself. It reads the admin API like any client.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use super::{admin_token, AdminError, BASE};
use crate::api::AppState;

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const STYLE_CSS: &str = include_str!("ui/style.css");

/// The dashboard's files, and 404 for other `/_hoard/` paths.
pub async fn dashboard(State(app): State<AppState>, uri: Uri) -> Response {
    if let Err(e) = admin_token(&app) {
        return e.into_response();
    }
    let (content_type, body) = match uri.path() {
        "/_hoard/" | "/_hoard/index.html" => ("text/html; charset=utf-8", INDEX_HTML),
        "/_hoard/app.js" => ("text/javascript; charset=utf-8", APP_JS),
        "/_hoard/style.css" => ("text/css; charset=utf-8", STYLE_CSS),
        "/_hoard" => {
            return (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, BASE)]).into_response()
        }
        _ => return AdminError::not_found("not found").into_response(),
    };
    let mut response = ([(header::CONTENT_TYPE, content_type)], Body::from(body)).into_response();
    let headers = response.headers_mut();
    // Everything the page loads is its own: no inline script, no other origin, no framing.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
