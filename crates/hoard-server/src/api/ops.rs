//! The operator's endpoints: `/healthz` (the process answers), `/readyz` (the database and
//! storage answer, and the server is not shutting down) and `/metrics` (Prometheus text).
//! `/readyz` also says where hoard forwards what is not its own (`forwarding.results`, the
//! `--upstream-results-url`, or `null`): `hoard runner setup`, `hoard runner doctor` and the
//! runner's job-started hook read it, unauthenticated, before sending artifacts through hoard.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{json_response, AppState};

/// `/metrics` on the main address, unless it is served elsewhere.
pub(super) async fn metrics(State(app): State<AppState>) -> Response {
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
pub(super) async fn metrics_anywhere(State(app): State<AppState>) -> Response {
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
        app.cache().render_metrics(stored),
    )
        .into_response()
}

pub(super) async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

/// Ready when the database and storage answer and the server is not shutting down. Warnings
/// never make it fail: among them, a write policy file that failed to reload or that differs
/// from the policy in force.
pub(super) async fn readyz(State(app): State<AppState>) -> Response {
    let mut warnings = app.config().warnings.clone();
    warnings.extend(app.cache().policy_warnings());
    if let Some(health) = app.cache().policy_health().await {
        warnings.extend(health.warnings());
    }
    // The results service's URL is GitHub's (or the enterprise's) public address, not a secret.
    // Only a ready server says it: `hoard runner` reads it from a 200, and a failing answer
    // stays what it was.
    let forwarding = serde_json::json!({
        "results": app.config().upstream.as_ref().map(|u| u.base().as_str()),
    });
    if app.shutdown().is_cancelled() {
        let body = serde_json::json!({ "status": "shutting down", "warnings": warnings });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    match app.cache().ready().await {
        Ok(()) => {
            Json(serde_json::json!({ "status": "ready", "warnings": warnings, "forwarding": forwarding }))
                .into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            // The cause is in the log; the answer names only the part that failed.
            let failed = match &e {
                crate::cache::CacheError::Storage(e) => e.readiness(),
                other => other.database_readiness(),
            };
            let body = serde_json::json!({ "status": "unavailable", "error": failed, "warnings": warnings });
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}
