//! HTTP: turns requests into domain calls and back. No business rules live here.
//!
//! Each protocol answers in its own error shape, including for unknown paths: twirp JSON under
//! `/twirp/`, Azure XML under `/_blob/` (clients retry text errors, PROTOCOL.md §2.4), JSON with
//! a `message` under `/_apis/artifactcache/`. Both cache services are also served under any
//! path prefix, which may name a namespace (see `auth::namespaces`).

pub mod admin;
mod blob;
pub mod blocklist;
mod legacy;
mod links;
pub mod proto;
pub mod proxy;
pub mod range;
mod twirp;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, State};
use axum::http::{header, HeaderMap, Method, Request, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::Level;
use url::Url;

use crate::auth::{Callers, UrlSigner};
use crate::cache::Cache;
use crate::config::Limits;

/// What the HTTP layer needs to know of the configuration.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Base of signed links; `None` means "the origin the request came to".
    pub public_url: Option<Url>,
    pub upload_url_ttl: Duration,
    pub download_url_ttl: Duration,
    /// Start-up warnings also reported by `/readyz` (e.g. token verification being off).
    pub warnings: Vec<String>,
    pub limits: Limits,
    /// Whether hoard itself serves HTTPS: links are then `https`.
    pub tls: bool,
    /// Where requests that are not hoard's own go; `None` answers them with 404.
    pub upstream: Option<proxy::Upstream>,
    /// Turns on the admin API and dashboard (`None`: both answer 404).
    pub admin_token: Option<crate::secret::Secret>,
    /// Whether `/metrics` is served on its own address instead (then 404 here).
    pub metrics_elsewhere: bool,
    /// When the server started, for `status`.
    pub started: std::time::SystemTime,
    pub backends: admin::Backends,
    /// Answer plain downloads with a redirect to the object store (`--direct-downloads`).
    pub direct_downloads: bool,
}

/// A JSON answer (`Content-Type: application/json`), with `Retry-After` when given: the shape
/// of every Twirp and v1 answer, errors included.
fn json_response(
    status: StatusCode,
    body: &serde_json::Value,
    retry_after: Option<u64>,
) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, seconds.into());
    }
    response
}

/// Shared state of every handler; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    config: ApiConfig,
    cache: Cache,
    signer: UrlSigner,
    callers: Callers,
    shutdown: CancellationToken,
}

impl AppState {
    pub fn new(
        config: ApiConfig,
        cache: Cache,
        signer: UrlSigner,
        callers: Callers,
        shutdown: CancellationToken,
    ) -> Self {
        Self(Arc::new(Inner {
            config,
            cache,
            signer,
            callers,
            shutdown,
        }))
    }
    fn config(&self) -> &ApiConfig {
        &self.0.config
    }
    pub fn cache(&self) -> &Cache {
        &self.0.cache
    }
    fn signer(&self) -> &UrlSigner {
        &self.0.signer
    }
    /// Identifies a caller (see [`Callers::identify`]), counts how, and audits a refusal.
    async fn identify(
        &self,
        headers: &HeaderMap,
        prefix: &str,
    ) -> Result<crate::auth::Caller, crate::auth::CallerError> {
        let caller = self.0.callers.identify(headers, prefix).await;
        let metrics = self.cache().metrics();
        match &caller {
            Ok(c) => metrics.caller(c.how),
            Err(e) => {
                metrics.caller("refused");
                tracing::info!(target: "hoard::audit", action = "refused", reason = %e);
            }
        }
        caller
    }
}

const TWIRP_ROUTE: &str = "/twirp/github.actions.results.api.v1.CacheService/{method}";
const LEGACY_ROUTE: &str = "/_apis/artifactcache/{*rest}";

/// The label a request to `path` is counted under in the request metrics: the route template
/// the router matches it to, except that the cache services' calls are labelled by call
/// (also when served under a path prefix, through the fallback), and `other` for the rest.
/// Cheap (prefix and suffix compares), as it runs on every request.
pub fn route_label(path: &str) -> &'static str {
    if let Some(call) = twirp::rpc_route(path) {
        return call;
    }
    if let Some(blob) = path.strip_prefix("/_blob/") {
        return match blob.split_once('/') {
            Some(("uploads", id)) if !id.is_empty() && !id.contains('/') => "/_blob/uploads/{id}",
            Some(("entries", id)) if !id.is_empty() && !id.contains('/') => "/_blob/entries/{id}",
            _ => "other",
        };
    }
    if let Some(endpoint) = legacy::route_label(path) {
        return endpoint;
    }
    match path {
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        "/metrics" => "/metrics",
        "/_hoard" => "/_hoard",
        "/_hoard/" => "/_hoard/",
        _ if path.starts_with("/_hoard/api/v1/") => "/_hoard/api/v1/{*rest}",
        _ if path.starts_with("/_hoard/") => "/_hoard/{*rest}",
        _ if path.starts_with(twirp::SERVICE_PATH) => TWIRP_ROUTE,
        _ if path.starts_with(legacy::BASE) => LEGACY_ROUTE,
        _ => "other",
    }
}

/// Every label [`route_label`] gives, so that metrics keep their handles (see
/// `Metrics::with_routes`).
pub const ROUTE_LABELS: &[&str] = &[
    "/twirp/github.actions.results.api.v1.CacheService/GetCacheEntryDownloadURL",
    "/_blob/entries/{id}",
    "/_blob/uploads/{id}",
    "/twirp/github.actions.results.api.v1.CacheService/CreateCacheEntry",
    "/twirp/github.actions.results.api.v1.CacheService/FinalizeCacheEntryUpload",
    "/_apis/artifactcache/cache",
    "/_apis/artifactcache/caches",
    "/_apis/artifactcache/caches/{id}",
    "/_apis/artifactcache/artifacts/{id}",
    "/_apis/artifactcache/clean",
    TWIRP_ROUTE,
    LEGACY_ROUTE,
    "/healthz",
    "/readyz",
    "/metrics",
    "/_hoard",
    "/_hoard/",
    "/_hoard/api/v1/{*rest}",
    "/_hoard/{*rest}",
    "other",
];

pub fn router(state: AppState) -> Router {
    // Request logs name the route template, never the raw URI: links carry signatures. They
    // are debug-level: a span and a line per request cost a lookup about a sixth of its
    // instructions (docs/benchmarks.md), and /metrics counts requests. Decisions (reserve,
    // finalize, delete, refusals) are logged at info under hoard::audit; server errors always.
    let trace = TraceLayer::new_for_http()
        .make_span_with(|req: &Request<Body>| {
            let route = req
                .extensions()
                .get::<MatchedPath>()
                .map_or("(unmatched)", MatchedPath::as_str);
            tracing::debug_span!("request", method = %req.method(), route)
        })
        .on_request(())
        .on_response(DefaultOnResponse::new().level(Level::DEBUG))
        .on_failure(DefaultOnFailure::new().level(Level::ERROR));
    Router::new()
        .route(TWIRP_ROUTE, any(twirp::call))
        .route(LEGACY_ROUTE, any(legacy::root))
        .route(
            &format!("{}{{id}}", links::UPLOAD_PREFIX),
            any(blob::upload),
        )
        .route(
            &format!("{}{{id}}", links::DOWNLOAD_PREFIX),
            any(blob::download),
        )
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/_hoard", get(admin::dashboard))
        .route("/_hoard/", get(admin::dashboard))
        .route("/_hoard/api/v1/{*rest}", any(admin::api))
        .route("/_hoard/{*rest}", any(admin::dashboard))
        .fallback(fallback)
        .layer(trace)
        .with_state(state)
}

/// The router of `--metrics-listen`: `/metrics` alone.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_anywhere))
        .with_state(state)
}

/// `/metrics` on the main address, unless it is served elsewhere.
async fn metrics(State(app): State<AppState>) -> Response {
    if app.config().metrics_elsewhere {
        return json_response(
            StatusCode::NOT_FOUND,
            &serde_json::json!({ "message": "not found" }),
            None,
        );
    }
    metrics_anywhere(State(app)).await
}

/// `/metrics`: Prometheus text format.
async fn metrics_anywhere(State(app): State<AppState>) -> Response {
    let stored = match app.cache().totals().await {
        Ok(totals) => Some(totals),
        Err(e) => {
            tracing::warn!(error = %e, "metrics: cannot read the store's totals");
            None
        }
    };
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.cache().metrics().render(stored),
    )
        .into_response()
}

async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

/// Ready when the database and storage answer and the server is not shutting down.
async fn readyz(State(app): State<AppState>) -> Response {
    let warnings = &app.config().warnings;
    if app.0.shutdown.is_cancelled() {
        let body = serde_json::json!({ "status": "shutting down", "warnings": warnings });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    match app.cache().ready().await {
        Ok(()) => {
            Json(serde_json::json!({ "status": "ready", "warnings": warnings })).into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            // The cause is in the log; the answer names only the part that failed.
            let failed = match e {
                crate::cache::CacheError::Storage(_) => "the chunk store does not answer",
                _ => "the metadata database does not answer",
            };
            let body = serde_json::json!({ "status": "unavailable", "error": failed, "warnings": warnings });
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

/// Unknown paths, in the shape of the protocol they look like. Clients that keep the path
/// prefix of `ACTIONS_RESULTS_URL` (buildx, sccache: §2.1, §12) reach the service here.
async fn fallback(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    mut headers: HeaderMap,
    body: Body,
) -> Response {
    links::host_from_authority(&mut headers, &uri);
    let path = uri.path();
    if let Some(idx) = path.find(twirp::SERVICE_PATH) {
        let rpc = &path[idx + twirp::SERVICE_PATH.len()..];
        let prefix = path[..idx].trim_matches('/');
        return twirp::dispatch(&app, prefix, rpc, &method, &headers, body)
            .await
            .unwrap_or_else(IntoResponse::into_response);
    }
    if let Some(idx) = path.find(legacy::BASE) {
        let prefix = path[..idx].trim_matches('/');
        let rest = &path[idx + legacy::BASE.len()..];
        return legacy::dispatch(&app, prefix, rest, &method, &uri, &headers, body).await;
    }
    if path.starts_with("/_blob/") {
        return blob::AzureError::not_found().into_response();
    }
    // The admin API lives at the root only. Under a prefix it is an error, never forwarded:
    // its bearer token is the admin token.
    if path.contains("/_hoard/") {
        return json_response(
            StatusCode::NOT_FOUND,
            &serde_json::json!({ "message": "the admin API and dashboard are at /_hoard/ on the server's root, not under a path prefix" }),
            None,
        );
    }
    if let Some(upstream) = &app.config().upstream {
        return upstream.forward(method, &uri, headers, body).await;
    }
    if path.contains("/twirp/") {
        return twirp::TwirpError::new("bad_route", format!("no such route {path}"))
            .into_response();
    }
    json_response(
        StatusCode::NOT_FOUND,
        &serde_json::json!({ "message": "not found" }),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::{route_label, ROUTE_LABELS};

    #[test]
    fn the_route_templates_name_the_services_paths() {
        assert_eq!(
            super::TWIRP_ROUTE,
            format!("{}{{method}}", super::twirp::SERVICE_PATH)
        );
        assert_eq!(
            super::LEGACY_ROUTE,
            format!("{}{{*rest}}", super::legacy::BASE)
        );
    }

    #[test]
    fn requests_are_labelled_as_the_router_routes_them() {
        let lookup = "/twirp/github.actions.results.api.v1.CacheService/GetCacheEntryDownloadURL";
        for (path, label) in [
            (lookup, lookup),
            (&format!("/some/prefix{lookup}")[..], lookup),
            (
                "/twirp/github.actions.results.api.v1.CacheService/Nope",
                super::TWIRP_ROUTE,
            ),
            ("/_blob/uploads/12", "/_blob/uploads/{id}"),
            ("/_blob/entries/7", "/_blob/entries/{id}"),
            ("/_blob/entries/7/x", "other"),
            ("/_blob/other", "other"),
            ("/_apis/artifactcache/cache", "/_apis/artifactcache/cache"),
            (
                "/secret/_apis/artifactcache/caches/9",
                "/_apis/artifactcache/caches/{id}",
            ),
            ("/_apis/artifactcache/nope", super::LEGACY_ROUTE),
            ("/healthz", "/healthz"),
            ("/_hoard/api/v1/caches/3", "/_hoard/api/v1/{*rest}"),
            ("/_hoard/app.js", "/_hoard/{*rest}"),
            ("/anything/else", "other"),
        ] {
            assert_eq!(route_label(path), label, "{path}");
            assert!(ROUTE_LABELS.contains(&label), "{label} has kept handles");
        }
    }
}
