//! Requests the edge does not answer itself go to the origin as they came (method, path,
//! query, headers with `Authorization`, body), and the answer comes back as it went, both
//! streamed: uploads, the build tools' protocols, the admin API. Only hop-by-hop headers are
//! dropped, and the client's address is added as `X-Forwarded-For`.

use std::net::SocketAddr;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use hoard_server::api::proxy::{relayed, strip_hop_by_hop};

use crate::origin::Answer;
use crate::saves::{teed, Writer};
use crate::Edge;

/// The client's headers as the origin should see them.
pub fn outgoing(mut headers: HeaderMap, client: Option<SocketAddr>) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    if let Some(client) = client {
        let chain = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(earlier) => format!("{earlier}, {}", client.ip()),
            None => client.ip().to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&chain) {
            headers.insert("x-forwarded-for", v);
        }
    }
    headers
}

/// The origin's answer to a call as the client gets it.
pub fn answered(answer: Answer) -> Response {
    relayed(answer.map(http_body_util::Full::new))
}

/// The origin's answer as the client gets it, its body streamed.
pub fn answer_of(answer: reqwest::Response) -> Response {
    relayed(axum::http::Response::from(answer))
}

/// Forwards one request to the origin and streams its answer back; a 502 in the shape of the
/// protocol the path belongs to if no replica answers.
pub async fn forward(
    edge: &Edge,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    client: Option<SocketAddr>,
    body: Body,
) -> Response {
    let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
    let body = reqwest::Body::wrap_stream(body.into_data_stream());
    match edge
        .origin
        .stream(
            method,
            path_and_query,
            outgoing(headers.clone(), client),
            body,
        )
        .await
    {
        Ok(answer) => answer_of(answer),
        Err(e) => {
            tracing::warn!(path = uri.path(), error = %e, "a request could not be forwarded to the origin");
            unreachable(uri.path())
        }
    }
}

/// A single-shot upload (Put Blob) to the link `upload`, forwarded as [`forward`] does, and
/// written to a copy on the way when its reservation went through this edge and there is room:
/// kept once the origin took it (see [`crate::saves`]).
pub async fn upload_keeping(
    edge: &Edge,
    upload: &str,
    uri: &Uri,
    headers: &HeaderMap,
    client: Option<SocketAddr>,
    body: Body,
) -> Response {
    let size = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let writer = match size {
        Some(size) if size > 0 && edge.saves.wanted(upload) => {
            let (store, upload) = (edge.store.clone(), upload.to_owned());
            tokio::task::spawn_blocking(move || Writer::start(&store, &upload, size))
                .await
                .ok()
                .flatten()
        }
        _ => None,
    };
    let Some(writer) = writer else {
        return forward(edge, Method::PUT, uri, headers, client, body).await;
    };
    // Pieces in flight between the network and the disk (each at most a read buffer, 64 KiB:
    // 1 MiB an upload), so that neither waits for each step of the other.
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let writing = tokio::task::spawn_blocking(move || writer.run(rx));
    let body = reqwest::Body::wrap_stream(teed(body.into_data_stream(), tx));
    let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
    let answer = edge
        .origin
        .stream(
            Method::PUT,
            path_and_query,
            outgoing(headers.clone(), client),
            body,
        )
        .await;
    let finished = tokio::time::timeout(std::time::Duration::from_secs(30), writing)
        .await
        .ok()
        .and_then(Result::ok)
        .flatten();
    match answer {
        Ok(answer) => {
            if let Some(finished) = finished {
                if answer.status() == StatusCode::CREATED {
                    finished.keep(&edge.saves, upload);
                } else {
                    finished.drop_copy();
                }
            }
            answer_of(answer)
        }
        Err(e) => {
            if let Some(finished) = finished {
                finished.drop_copy();
            }
            tracing::warn!(path = uri.path(), error = %e, "an upload could not be forwarded to the origin");
            unreachable(uri.path())
        }
    }
}

/// 502 for a path whose origin cannot be reached, in its protocol's error shape (Azure's XML
/// under `/_blob/`, Twirp's JSON, JSON with a `message` elsewhere).
pub fn unreachable(path: &str) -> Response {
    const WHY: &str = "this hoard edge cannot reach its origin";
    let (content_type, body) = if path.starts_with("/_blob/") {
        (
            "application/xml",
            format!(
                "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>ServerBusy</Code><Message>{WHY}</Message></Error>"
            ),
        )
    } else if path.contains("/twirp/") {
        (
            "application/json",
            serde_json::json!({"code": "unavailable", "msg": WHY}).to_string(),
        )
    } else {
        (
            "application/json",
            serde_json::json!({ "message": WHY }).to_string(),
        )
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
