//! The null baseline: a trivial HTTP server with nothing behind it, speaking just enough of the
//! protocol for `hoard bench` to drive it like a real cache. It discards uploads, serves
//! downloads of the right length (zeros), and answers Twirp calls with minimal well-formed JSON.
//! Whatever it reaches is the practical limit of HTTP over loopback on this machine.
//!
//! Plain hyper, no router, no logging: as little as possible between the socket and the client.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

const TWIRP: &str = "/twirp/github.actions.results.api.v1.CacheService/";
const ZEROS: &[u8] = &[0u8; 1 << 20];

type Body = UnsyncBoxBody<Bytes, Infallible>;

#[derive(Default)]
struct State {
    /// Finalized sizes by key, so lookups hit and downloads have the right length.
    sizes: Mutex<HashMap<String, u64>>,
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut res = Response::new(Full::new(body.into()).boxed_unsync());
    *res.status_mut() = status;
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    res
}

fn json(value: serde_json::Value) -> Response<Body> {
    full(StatusCode::OK, "application/json", value.to_string())
}

async fn drain(mut body: Incoming) -> Result<u64, hyper::Error> {
    let mut n = 0;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            n += data.len() as u64;
        }
    }
    Ok(n)
}

async fn read_json(body: Incoming) -> serde_json::Value {
    match body.collect().await {
        Ok(b) => serde_json::from_slice(&b.to_bytes()).unwrap_or_default(),
        Err(_) => serde_json::Value::Null,
    }
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, hyper::Error> {
    let path = req.uri().path().to_owned();
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_owned();
    if let Some(method) = path.strip_prefix(TWIRP) {
        let method = method.to_owned();
        let body = read_json(req.into_body()).await;
        let key = body["key"].as_str().unwrap_or_default().to_owned();
        return Ok(match method.as_str() {
            "CreateCacheEntry" => json(serde_json::json!({
                "ok": true,
                "signed_upload_url": format!("http://{host}/null/upload/1?sig=x"),
            })),
            "FinalizeCacheEntryUpload" => {
                let size = match &body["size_bytes"] {
                    serde_json::Value::String(s) => s.parse().unwrap_or(0),
                    v => v.as_u64().unwrap_or(0),
                };
                state
                    .sizes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, size);
                json(serde_json::json!({ "ok": true, "entry_id": "1" }))
            }
            "GetCacheEntryDownloadURL" => {
                let restore = body["restore_keys"].as_array().cloned().unwrap_or_default();
                let keys =
                    std::iter::once(key.as_str()).chain(restore.iter().filter_map(|k| k.as_str()));
                let hit = {
                    let sizes = state.sizes.lock().unwrap_or_else(|p| p.into_inner());
                    keys.into_iter()
                        .find_map(|k| sizes.get(k).map(|s| (k.to_owned(), *s)))
                };
                match hit {
                    Some((matched, size)) => json(serde_json::json!({
                        "ok": true,
                        "signed_download_url": format!("http://{host}/null/download/{size}?sig=x"),
                        "matched_key": matched,
                    })),
                    None => json(serde_json::json!({ "ok": false })),
                }
            }
            _ => full(
                StatusCode::NOT_FOUND,
                "application/json",
                r#"{"code":"bad_route","msg":"no such method"}"#,
            ),
        });
    }
    if path.starts_with("/null/upload/") {
        drain(req.into_body()).await?;
        let mut res = full(
            StatusCode::CREATED,
            "application/octet-stream",
            Bytes::new(),
        );
        res.headers_mut().insert(
            "x-ms-request-id",
            hyper::header::HeaderValue::from_static("00000000-0000-0000-0000-000000000000"),
        );
        return Ok(res);
    }
    if let Some(size) = path
        .strip_prefix("/null/download/")
        .and_then(|s| s.parse::<u64>().ok())
    {
        let frames = futures_util::stream::unfold(size, |left| async move {
            (left > 0).then(|| {
                let n = left.min(ZEROS.len() as u64);
                (
                    Ok::<_, Infallible>(Frame::data(Bytes::from_static(&ZEROS[..n as usize]))),
                    left - n,
                )
            })
        });
        let mut res = Response::new(StreamBody::new(frames).boxed_unsync());
        res.headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, size.into());
        return Ok(res);
    }
    if path == "/healthz" || path == "/readyz" {
        return Ok(json(serde_json::json!({ "status": "ok" })));
    }
    Ok(full(StatusCode::NOT_FOUND, "text/plain", "not found"))
}

/// Serves until the process is stopped.
pub async fn run(listen: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!("null baseline listening on {}", listener.local_addr()?);
    let state = Arc::new(State::default());
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
