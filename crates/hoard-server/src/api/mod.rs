//! HTTP: turns requests into domain calls and back. No business rules live here.
//!
//! Each protocol answers in its own error shape, including for unknown paths: twirp JSON under
//! `/twirp/`, Azure XML under `/_blob/` (clients retry text errors, PROTOCOL.md §2.4), JSON with
//! a `message` under `/_apis/artifactcache/`. Both cache services are also served under any
//! path prefix, which may name a namespace (see `auth::namespaces`).
//!
//! One module per idea: `state` (what handlers share), `router` (paths, labels, unknown
//! paths), one module per protocol (`twirp`, `blob` with its error shape in `azure`,
//! `legacy`, `admin`), `transfer` for the body streaming and entry serving v2 and v1 share,
//! and `ops` for `/healthz`, `/readyz` and `/metrics`.

pub mod admin;
mod azure;
mod bazel;
mod blob;
pub mod blocklist;
mod dav;
mod gocache;
mod legacy;
mod links;
mod nx;
mod objects;
mod ops;
pub mod origin;
pub mod proto;
pub mod proxy;
mod query;
pub mod range;
pub mod read_through;
mod router;
mod state;
mod transfer;
mod turbo;
mod twirp;
mod webhooks;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// The paths of the cache services and of the links hoard hands out, for `hoard edge`, which
/// forwards them to a hoard.
pub mod paths {
    pub use super::legacy::BASE as LEGACY_BASE;
    pub use super::links::{blob_route, LinkKind, DOWNLOAD_PREFIX, UPLOAD_PREFIX};
    pub use super::twirp::SERVICE_PATH as TWIRP_SERVICE_PATH;
}

pub use router::{is_cache_route, metrics_router, route_label, router, ROUTE_LABELS};
pub use state::{ApiConfig, AppState};

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
