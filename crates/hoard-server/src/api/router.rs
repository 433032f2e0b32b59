//! The one router: which path goes to which protocol, the label each request is counted under
//! (counting and logging happen where connections are served, in `conn`), and the answer to
//! unknown paths in the shape of the protocol they look like.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;

use super::origin::ClientAddress;
use super::{
    admin, azure, bazel, blob, dav, gocache, json_response, legacy, links, nx, objects, ops, turbo,
    twirp, AppState,
};

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
    if path.starts_with("/_blob") || path.starts_with("/%5") {
        match links::blob_route(path) {
            Some((links::LinkKind::Upload, _)) => return "/_blob/uploads/{id}",
            Some((links::LinkKind::Download, _)) => return "/_blob/entries/{id}",
            None if path.starts_with("/_blob/") => return "other",
            None => {}
        }
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
        "/_hoard/webhooks/github" => "/_hoard/webhooks/github",
        "/_hoard/tools/token" => "/_hoard/tools/token",
        _ if path.starts_with(nx::BASE) => "/v1/cache/{hash}",
        _ if path.starts_with(dav::BASE) => "/_dav/{*path}",
        _ if path.starts_with("/_bazel/ac/") => "/_bazel/ac/{sha256}",
        _ if path.starts_with("/_bazel/cas/") => "/_bazel/cas/{sha256}",
        _ if path.starts_with("/_gocache/a/") => "/_gocache/a/{action}",
        _ if path.starts_with("/_gocache/o/") => "/_gocache/o/{output}",
        turbo::BASE => turbo::BASE,
        "/v8/artifacts/status" => "/v8/artifacts/status",
        "/v8/artifacts/events" => "/v8/artifacts/events",
        _ if path.starts_with("/v8/artifacts/") => "/v8/artifacts/{hash}",
        _ if path.starts_with("/_hoard/api/v1/") => "/_hoard/api/v1/{*rest}",
        _ if path.starts_with("/_hoard/") => "/_hoard/{*rest}",
        _ if path.starts_with(twirp::SERVICE_PATH) => TWIRP_ROUTE,
        _ if path.starts_with(legacy::BASE) => LEGACY_ROUTE,
        _ => "other",
    }
}

/// Whether a request under `label` (from [`route_label`]) is one of the cache's protocols, as
/// opposed to the operator's (admin API, dashboard, metrics, health).
pub fn is_cache_route(label: &str) -> bool {
    label.starts_with("/twirp/")
        || label.starts_with("/_blob/")
        || label.starts_with("/_apis/")
        || label.starts_with(turbo::BASE)
        || label.starts_with(nx::BASE)
        || label.starts_with(dav::BASE)
        || label.starts_with(bazel::BASE)
        || label.starts_with(gocache::BASE)
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
    turbo::BASE,
    "/v8/artifacts/{hash}",
    "/v8/artifacts/status",
    "/v8/artifacts/events",
    "/v1/cache/{hash}",
    "/_dav/{*path}",
    "/_bazel/ac/{sha256}",
    "/_bazel/cas/{sha256}",
    "/_gocache/a/{action}",
    "/_gocache/o/{output}",
    "/healthz",
    "/readyz",
    "/metrics",
    "/_hoard",
    "/_hoard/",
    "/_hoard/api/v1/{*rest}",
    "/_hoard/webhooks/github",
    "/_hoard/tools/token",
    "/_hoard/{*rest}",
    "other",
];

pub fn router(state: AppState) -> Router {
    // Requests are counted and logged where connections are served (`conn`).
    // The calls by name as well as by template: a route without a parameter spares every
    // call the router's copy of the parameter; the template answers unknown names.
    let calls = twirp::RPC_ROUTES
        .into_iter()
        .fold(Router::new(), |calls, path| {
            calls.route(path, any(twirp::call))
        });
    calls
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
        .route(turbo::BASE, any(turbo::serve))
        .route("/v8/artifacts/{*rest}", any(turbo::serve))
        .route("/v1/cache/{hash}", any(nx::serve))
        .route("/_dav", any(dav::serve))
        .route("/_dav/", any(dav::serve))
        .route("/_dav/{*path}", any(dav::serve))
        .route("/_bazel/{*rest}", any(bazel::serve))
        .route("/_gocache/{*rest}", any(gocache::serve))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/_hoard", get(admin::dashboard))
        .route("/_hoard/", get(admin::dashboard))
        .route("/_hoard/api/v1/{*rest}", any(admin::api))
        .route("/_hoard/webhooks/github", any(super::webhooks::github))
        .route("/_hoard/tools/token", post(objects::mint_tool_token))
        .route("/_hoard/{*rest}", any(admin::dashboard))
        .fallback(fallback)
        .with_state(state)
}

/// The router of `--metrics-listen`: `/metrics` alone.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(ops::metrics_anywhere))
        .with_state(state)
}

/// Unknown paths, in the shape of the protocol they look like. Clients that keep the path
/// prefix of `ACTIONS_RESULTS_URL` (buildx, sccache: §2.1, §12) reach the service here.
async fn fallback(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    ClientAddress(address): ClientAddress,
    mut headers: HeaderMap,
    body: Body,
) -> Response {
    links::host_from_authority(&mut headers, &uri);
    let path = uri.path();
    if let Some(idx) = path.find(twirp::SERVICE_PATH) {
        let rpc = &path[idx + twirp::SERVICE_PATH.len()..];
        let prefix = path[..idx].trim_matches('/');
        return twirp::dispatch(&app, prefix, rpc, &method, &headers, address, body)
            .await
            .unwrap_or_else(IntoResponse::into_response);
    }
    if let Some(idx) = path.find(legacy::BASE) {
        let prefix = path[..idx].trim_matches('/');
        let rest = &path[idx + legacy::BASE.len()..];
        let request = legacy::Request {
            method: &method,
            uri: &uri,
            headers: &headers,
            address,
        };
        return legacy::dispatch(&app, prefix, rest, request, body).await;
    }
    if let Some(ticket) = path.strip_prefix(super::read_through::THROUGH_PREFIX) {
        return super::read_through::download(&app, &method, ticket, &headers).await;
    }
    // Blob paths with an encoded `/` (the Go SDK's, by host name): matched decoded.
    if path.starts_with("/_blob") || path.starts_with("/%5") {
        match links::blob_route(path) {
            Some((links::LinkKind::Upload, id)) => {
                return blob::upload_at(app, method, &id, uri.clone(), headers, body).await
            }
            Some((links::LinkKind::Download, id)) => {
                return blob::download_at(app, method, &id, uri.clone(), headers).await
            }
            None if path.starts_with("/_blob/") => {
                return azure::AzureError::not_found().into_response()
            }
            None => {}
        }
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
    // What belongs to hoard never leaves it: a namespace's secret, the admin token. Such a
    // request is answered as any unknown path is without an upstream.
    if let Some(upstream) = &app.config().upstream {
        if !app.keeps_to_itself(path, &headers) {
            return upstream.forward(method, &uri, headers, body).await;
        }
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
    use super::{is_cache_route, route_label, ROUTE_LABELS};
    use crate::api::{legacy, twirp};

    #[test]
    fn the_route_templates_name_the_services_paths() {
        assert_eq!(
            super::TWIRP_ROUTE,
            format!("{}{{method}}", twirp::SERVICE_PATH)
        );
        assert_eq!(super::LEGACY_ROUTE, format!("{}{{*rest}}", legacy::BASE));
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
            ("/_blob/uploads%2F12.5", "/_blob/uploads/{id}"),
            ("/_blob/uploads/%2e%2e%2F12", "other"),
            ("/_blob//uploads/12", "other"),
            ("/%5Fblob/entries/7.5", "/_blob/entries/{id}"),
            (
                "/%5Bx/_apis/artifactcache/cache",
                "/_apis/artifactcache/cache",
            ),
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

    #[test]
    fn only_the_cache_protocols_count_as_the_caches_traffic() {
        for path in [
            "/twirp/github.actions.results.api.v1.CacheService/GetCacheEntryDownloadURL",
            "/twirp/github.actions.results.api.v1.CacheService/Nope",
            "/_blob/uploads/12",
            "/_blob/entries/7",
            "/_apis/artifactcache/cache",
            "/secret/_apis/artifactcache/caches/9",
            "/_apis/artifactcache/nope",
        ] {
            assert!(is_cache_route(route_label(path)), "{path}");
        }
        for path in [
            "/metrics",
            "/healthz",
            "/readyz",
            "/_hoard/api/v1/caches/3",
            "/_hoard/app.js",
            "/other",
        ] {
            assert!(!is_cache_route(route_label(path)), "{path}");
        }
    }
}
