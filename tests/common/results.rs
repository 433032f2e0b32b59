//! A recording stand-in for GitHub's results service on loopback: it records every request
//! (method, path, `Authorization`), answers the cache service as a service without entries
//! would (a miss, no reservation), and the artifact service as `tests/proxy.rs`'s stand-in does,
//! with blob storage for the artifact's bytes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

pub const ARTIFACTS: &str = "/twirp/github.actions.results.api.v1.ArtifactService/";
pub const CACHE: &str = "/twirp/github.actions.results.api.v1.CacheService/";

/// One request as the stand-in saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
}

#[derive(Default)]
pub struct Results {
    pub base: String,
    seen: Mutex<Vec<Seen>>,
    blocks: Mutex<HashMap<String, Vec<u8>>>,
    blob: Mutex<Vec<u8>>,
}

type Shared = Arc<Results>;

impl Results {
    /// Starts on a free loopback port of the calling test's runtime.
    pub async fn start() -> Shared {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let results = Arc::new(Results {
            base: format!("http://{}", listener.local_addr().unwrap()),
            ..Default::default()
        });
        let app = Router::new()
            .route(&format!("{ARTIFACTS}{{method}}"), post(artifact_service))
            .route(&format!("{CACHE}{{method}}"), post(cache_service))
            .route("/{prefix}/_apis/artifactcache/cache", get(v1_miss))
            .route("/blob/container/artifact.zip", any(blob))
            .fallback(|| async { (StatusCode::NOT_FOUND, "not found") })
            .layer(axum::middleware::from_fn_with_state(
                results.clone(),
                record,
            ))
            .with_state(results.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        results
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The paths requested so far.
    pub fn paths(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.path).collect()
    }

    /// The artifact's bytes as uploaded.
    pub fn blob(&self) -> Vec<u8> {
        self.blob.lock().unwrap().clone()
    }
}

async fn record(
    State(results): State<Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let seen = Seen {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
        authorization: req
            .headers()
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_owned()),
    };
    results.seen.lock().unwrap().push(seen);
    next.run(req).await
}

/// A cache service with nothing in it that reserves nothing.
async fn cache_service(UrlPath(method): UrlPath<String>) -> Response {
    match method.as_str() {
        "GetCacheEntryDownloadURL" | "CreateCacheEntry" | "FinalizeCacheEntryUpload" => {
            Json(json!({ "ok": false })).into_response()
        }
        _ => (StatusCode::NOT_FOUND, "no such method").into_response(),
    }
}

async fn v1_miss() -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn artifact_service(
    State(results): State<Shared>,
    UrlPath(method): UrlPath<String>,
    Json(_req): Json<Value>,
) -> Response {
    let blob_url = format!(
        "{}/blob/container/artifact.zip?sig=upstream-signature",
        results.base
    );
    let answer = match method.as_str() {
        "CreateArtifact" => json!({ "ok": true, "signed_upload_url": blob_url }),
        "FinalizeArtifact" => json!({ "ok": true, "artifact_id": "42" }),
        _ => return (StatusCode::NOT_FOUND, "no such method").into_response(),
    };
    Json(answer).into_response()
}

/// Azure's Put Block, Put Block List and Put Blob.
async fn blob(State(results): State<Shared>, method: Method, uri: Uri, body: Bytes) -> Response {
    let query: HashMap<String, String> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    if method == Method::GET {
        return results.blob().into_response();
    }
    match query.get("comp").map(String::as_str) {
        Some("block") => {
            let id = query["blockid"].clone();
            results.blocks.lock().unwrap().insert(id, body.to_vec());
        }
        Some("blocklist") => {
            let xml = String::from_utf8(body.to_vec()).unwrap();
            let blocks = results.blocks.lock().unwrap();
            let mut whole = Vec::new();
            for part in xml.split("<Latest>").skip(1) {
                let id = part.split("</Latest>").next().unwrap();
                whole.extend_from_slice(&blocks[id]);
            }
            *results.blob.lock().unwrap() = whole;
        }
        _ => *results.blob.lock().unwrap() = body.to_vec(),
    }
    let mut response = StatusCode::CREATED.into_response();
    let h = response.headers_mut();
    h.insert("x-ms-request-id", "0".parse().unwrap());
    h.insert("etag", "\"0x1\"".parse().unwrap());
    h.insert(
        "last-modified",
        "Tue, 01 Dec 2026 00:00:00 GMT".parse().unwrap(),
    );
    response
}
