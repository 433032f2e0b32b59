//! `POST /_hoard/webhooks/github`: GitHub's webhook deliveries (issue #58), verified by
//! `X-Hub-Signature-256` with the secret of `--github-webhook-secret-file`, then handed to the
//! domain (`cache::webhooks`). Answers are JSON with a `message`:
//!
//! - 404 without a secret (the receiver is off), 405 for another method;
//! - 401 for a missing or wrong signature: nothing is applied;
//! - 413 for a body over [`MAX_DELIVERY_BYTES`], 400 for a delivery without its id or event, or
//!   whose body is not the event GitHub sends;
//! - 202 for an event or action hoard does not act on; 200 otherwise, a redelivery included
//!   (`"seen": true`: not applied again);
//! - 503 when it cannot be applied now: GitHub shows the failure, and a redelivery applies it
//!   (a delivery counts as received only once applied).

use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use super::{json_response, AppState};
use crate::cache::webhooks::{DeliveryError, GithubDelivery, Outcome};
use crate::cache::CacheError;
use crate::model::LogSafe;

/// The largest delivery read: GitHub caps payloads at 25 MB, and the events hoard reads are
/// far smaller (a push lists at most 20 commits).
pub const MAX_DELIVERY_BYTES: usize = 8 << 20;

/// The longest delivery id or event name kept (GitHub's are a GUID and a short word).
const MAX_HEADER: usize = 128;

fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    json_response(status, &body, None)
}

fn message(status: StatusCode, text: impl Into<String>) -> Response {
    answer(status, json!({ "message": text.into() }))
}

/// Whether `signature` (`sha256=<hex>`) is the HMAC-SHA256 of `body` with `secret`, compared
/// in constant time.
pub fn signed(secret: &[u8], body: &[u8], signature: &str) -> bool {
    let Some(hex) = signature.strip_prefix("sha256=") else {
        return false;
    };
    let Ok(expected) = hex::decode(hex) else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&expected).is_ok()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= MAX_HEADER)
}

/// A delivery without a valid signature: logged, answered 401, nothing applied.
fn refused(headers: &HeaderMap) -> Response {
    tracing::warn!(
        target: "hoard::audit",
        action = "webhook_refused",
        delivery = %LogSafe(header(headers, "x-github-delivery").unwrap_or_default()),
        "a webhook delivery without a valid X-Hub-Signature-256: ignored"
    );
    message(
        StatusCode::UNAUTHORIZED,
        "the delivery's X-Hub-Signature-256 is missing or does not match the webhook secret",
    )
}

pub async fn github(
    State(app): State<AppState>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(secret) = &app.config().github_webhook_secret else {
        return message(
            StatusCode::NOT_FOUND,
            "the GitHub webhook receiver is off: start hoard with --github-webhook-secret-file",
        );
    };
    if method != Method::POST {
        return message(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed here"),
        );
    }
    let signature = headers
        .get("x-hub-signature-256")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // Unsigned: refused before its body is read.
    if !signature.starts_with("sha256=") {
        return refused(&headers);
    }
    let Ok(body) = to_bytes(body, MAX_DELIVERY_BYTES).await else {
        return message(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a delivery is at most {MAX_DELIVERY_BYTES} bytes"),
        );
    };
    if !signed(secret.expose(), &body, &signature) {
        return refused(&headers);
    }
    let (Some(id), Some(event)) = (
        header(&headers, "x-github-delivery"),
        header(&headers, "x-github-event"),
    ) else {
        return message(
            StatusCode::BAD_REQUEST,
            "a delivery names its X-GitHub-Delivery and X-GitHub-Event",
        );
    };
    let delivery = GithubDelivery {
        id,
        event,
        body: &body,
    };
    match app.cache().github_delivery(delivery).await {
        Ok(Outcome::Applied { promoted, expired }) => {
            tracing::info!(
                target: "hoard::audit",
                action = "webhook",
                delivery = %LogSafe(id),
                event = %LogSafe(event),
                promoted,
                expired,
            );
            answer(
                StatusCode::OK,
                json!({ "delivery": id, "event": event, "promoted": promoted, "expired": expired }),
            )
        }
        Ok(Outcome::Seen) => answer(
            StatusCode::OK,
            json!({ "delivery": id, "event": event, "seen": true }),
        ),
        Ok(Outcome::Ignored) => answer(
            StatusCode::ACCEPTED,
            json!({ "delivery": id, "event": event, "message": "hoard does not act on this event or action" }),
        ),
        Err(e @ DeliveryError::Malformed(..)) => {
            tracing::warn!(delivery = %LogSafe(id), error = %e, "a webhook delivery could not be read");
            message(
                StatusCode::BAD_REQUEST,
                format!("the body is not the {} event GitHub sends", LogSafe(event)),
            )
        }
        Err(DeliveryError::Cache(e)) => {
            tracing::error!(delivery = %LogSafe(id), error = %e, "could not apply a webhook delivery");
            let status = match e {
                CacheError::Invalid(_) => StatusCode::BAD_REQUEST,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            message(
                status,
                "the delivery could not be applied now; redeliver it later",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_githubs_hmac_sha256() {
        // GitHub's documented example: secret "It's a Secret to Everybody", body
        // "Hello, World!".
        let expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert!(signed(
            b"It's a Secret to Everybody",
            b"Hello, World!",
            expected
        ));
        assert!(!signed(b"another secret", b"Hello, World!", expected));
        assert!(!signed(
            b"It's a Secret to Everybody",
            b"Hello, World?",
            expected
        ));
        assert!(!signed(
            b"It's a Secret to Everybody",
            b"Hello, World!",
            &expected[7..]
        ));
        assert!(!signed(
            b"It's a Secret to Everybody",
            b"Hello, World!",
            "sha256=zz"
        ));
        assert!(!signed(b"It's a Secret to Everybody", b"Hello, World!", ""));
    }
}
