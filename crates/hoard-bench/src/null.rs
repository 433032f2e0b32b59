//! The null baseline: a trivial HTTP server with nothing behind it, speaking just enough of the
//! protocol for `hoard bench` to drive it like a real cache. It discards uploads, serves
//! downloads of the right length (zeros), and answers Twirp calls with minimal well-formed JSON.
//! Whatever it reaches is the practical limit of HTTP over loopback on this machine.
//!
//! Plain hyper, no router, no logging: as little as possible between the socket and the client.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};

use super::reference::{
    self, bad_route, created, full, json, lookup_answer, Body, Identities, Index, TWIRP,
};

const ZEROS: &[u8] = &[0u8; 1 << 20];

#[derive(Default)]
struct State {
    /// Finalized sizes by repository, scope, version and key, so lookups hit as on GitHub
    /// (restore keys by prefix, newest first) and downloads have the right length.
    sizes: Mutex<Index<u64>>,
    identities: Identities,
    /// The tools phase's objects' sizes (Bazel's and Turborepo's), by path and query.
    objects: Mutex<std::collections::HashMap<String, u64>>,
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

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, std::convert::Infallible> {
    let path = req.uri().path().to_owned();
    let host = reference::host(&req);
    if let Some(method) = path.strip_prefix(TWIRP) {
        let method = method.to_owned();
        let who = state.identities.of(&req);
        let body = reference::json_body(req.into_body()).await;
        let key = body["key"].as_str().unwrap_or_default();
        let version = body["version"].as_str().unwrap_or_default();
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
                    .insert(&who, version, key, size);
                json(serde_json::json!({ "ok": true, "entry_id": "1" }))
            }
            "GetCacheEntryDownloadURL" => {
                let restore = body["restore_keys"].as_array().cloned().unwrap_or_default();
                let keys = std::iter::once(key).chain(restore.iter().filter_map(|k| k.as_str()));
                let hit = state
                    .sizes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .find(&who, version, keys);
                lookup_answer(hit.map(|(matched, size)| {
                    (matched, format!("http://{host}/null/download/{size}?sig=x"))
                }))
            }
            _ => bad_route(),
        });
    }
    if !path.starts_with("/null/") && path != "/healthz" && path != "/readyz" {
        return Ok(object(&state, req).await);
    }
    if path.starts_with("/null/upload/") {
        return Ok(match drain(req.into_body()).await {
            Ok(_) => created(),
            Err(_) => full(StatusCode::BAD_REQUEST, "text/plain", "body"),
        });
    }
    if let Some(size) = path
        .strip_prefix("/null/download/")
        .and_then(|s| s.parse::<u64>().ok())
    {
        let frames = futures_util::stream::unfold(size, |left| async move {
            (left > 0).then(|| {
                let n = left.min(ZEROS.len() as u64);
                (
                    Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(&ZEROS[..n as usize]))),
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

/// Any other path is a build tool's object: a PUT's length is kept, a GET gets that many zeros.
async fn object(state: &State, req: Request<Incoming>) -> Response<Body> {
    let name = req.uri().to_string();
    let objects = || state.objects.lock().unwrap_or_else(|p| p.into_inner());
    if req.method() == hyper::Method::PUT {
        return match drain(req.into_body()).await {
            Ok(len) => {
                objects().insert(name, len);
                full(StatusCode::OK, "text/plain", "")
            }
            Err(_) => full(StatusCode::BAD_REQUEST, "text/plain", "body"),
        };
    }
    let Some(size) = objects().get(&name).copied() else {
        return full(StatusCode::NOT_FOUND, "text/plain", "not found");
    };
    let body = match ZEROS.get(..size as usize) {
        Some(zeros) => Bytes::from_static(zeros),
        None => Bytes::from(vec![0u8; size as usize]),
    };
    full(StatusCode::OK, "application/octet-stream", body)
}

/// Serves until the process is stopped.
pub async fn run(listen: SocketAddr) -> std::io::Result<()> {
    let state = Arc::new(State::default());
    reference::serve(listen, "null baseline", move |req| {
        handle(state.clone(), req)
    })
    .await
}
