//! The disk floor (BENCHMARKS.md, "The disk floor"): the simplest correct disk-backed server,
//! what any server that keeps entries on disk must at least pay. Each PUT body goes to its own
//! file with large buffered writes on blocking threads (no database, no hashing, no fsync); a
//! block list records the order of the files; a download streams them back in that order with
//! 1 MiB reads; lookups are an in-memory map that matches as GitHub does (per repository and
//! scope from the token, restore keys by prefix, newest first). `hoard bench --baseline-disk` runs it as its own
//! process, on its own temporary directory, beside the null baseline.
//!
//! Plain hyper, no router, no logging, like the null baseline.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};

use super::reference::{
    self, bad_route, created, full, json, lookup_answer, Body, Identities, Identity, Index, TWIRP,
};

/// Reads are this large.
const IO_SIZE: usize = 1 << 20;
/// Received buffers are written once this many bytes have gathered.
const WRITE_BATCH: usize = 4 << 20;

/// A file and its length.
#[derive(Clone)]
struct Part {
    path: PathBuf,
    len: u64,
}

struct Upload {
    who: Arc<Identity>,
    version: String,
    key: String,
    blocks: HashMap<Vec<u8>, Part>,
    order: Vec<Part>,
}

struct State {
    dir: PathBuf,
    next: AtomicU64,
    uploads: Mutex<HashMap<u64, Upload>>,
    /// Finalized entries: their ids by repository, scope, version and key, their parts in
    /// order by id.
    entries: Mutex<Index<u64>>,
    identities: Identities,
    by_id: Mutex<HashMap<u64, Arc<Vec<Part>>>>,
    /// The tools phase's objects (Bazel's and Turborepo's), a file each, by path and query.
    objects: Mutex<HashMap<String, Arc<Vec<Part>>>>,
}

/// Query value `name`, percent-decoded.
fn query<'a>(req: &'a Request<Incoming>, name: &str) -> Option<std::borrow::Cow<'a, [u8]>> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| percent_encoding::percent_decode_str(v).into())
    })
}

/// Writes a body to `path` in batches of at least `WRITE_BATCH` bytes, straight from the
/// received buffers, each batch (the first one creating the file) on a blocking thread while the
/// next one arrives.
async fn write_body(mut body: Incoming, path: PathBuf) -> std::io::Result<u64> {
    type Write = tokio::task::JoinHandle<std::io::Result<std::fs::File>>;
    let mut in_flight: Option<Write> = None;
    let mut batch: Vec<Bytes> = Vec::new();
    let mut batch_len = 0usize;
    let mut len = 0u64;
    loop {
        let frame = body.frame().await;
        let done = frame.is_none();
        if let Some(frame) = frame {
            if let Ok(data) = frame.map_err(std::io::Error::other)?.into_data() {
                batch_len += data.len();
                len += data.len() as u64;
                batch.push(data);
            }
        }
        if batch_len >= WRITE_BATCH || done {
            let open = match in_flight.take() {
                Some(write) => Some(write.await.map_err(std::io::Error::other)??),
                None => None,
            };
            let (frames, path) = (std::mem::take(&mut batch), path.clone());
            batch_len = 0;
            in_flight = Some(tokio::task::spawn_blocking(move || {
                let mut f = match open {
                    Some(f) => f,
                    None => std::fs::File::create(&path)?,
                };
                for frame in &frames {
                    f.write_all(frame)?;
                }
                Ok(f)
            }));
        }
        if done {
            if let Some(write) = in_flight {
                write.await.map_err(std::io::Error::other)??;
            }
            return Ok(len);
        }
    }
}

/// Streams `parts` in order, 1 MiB per read, each read on a blocking thread.
fn stream_parts(parts: Arc<Vec<Part>>) -> Body {
    let reads = futures_util::stream::unfold(
        (0usize, None::<std::fs::File>),
        move |(mut index, mut file)| {
            let parts = parts.clone();
            async move {
                loop {
                    let mut current = match file.take() {
                        Some(f) => f,
                        None => {
                            let part = parts.get(index)?;
                            match std::fs::File::open(&part.path) {
                                Ok(f) => f,
                                Err(e) => return Some((Err(e), (parts.len(), None))),
                            }
                        }
                    };
                    let read = tokio::task::spawn_blocking(move || {
                        let mut buf = vec![0u8; IO_SIZE];
                        let n = current.read(&mut buf)?;
                        buf.truncate(n);
                        Ok::<_, std::io::Error>((current, buf))
                    })
                    .await
                    .map_err(std::io::Error::other)
                    .and_then(|r| r);
                    match read {
                        Err(e) => return Some((Err(e), (parts.len(), None))),
                        Ok((_, buf)) if buf.is_empty() => index += 1,
                        Ok((f, buf)) => {
                            return Some((Ok(Frame::data(Bytes::from(buf))), (index, Some(f))))
                        }
                    }
                }
            }
        },
    );
    StreamBody::new(reads).boxed_unsync()
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
        return Ok(twirp(&state, &method, &host, who, &body));
    }
    if let Some(id) = path
        .strip_prefix("/floor/upload/")
        .and_then(|s| s.parse::<u64>().ok())
    {
        return Ok(upload(&state, id, req).await);
    }
    if let Some(id) = path
        .strip_prefix("/floor/download/")
        .and_then(|s| s.parse::<u64>().ok())
    {
        let parts = state
            .by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned();
        let Some(parts) = parts else {
            return Ok(full(StatusCode::NOT_FOUND, "text/plain", "no such entry"));
        };
        let size: u64 = parts.iter().map(|p| p.len).sum();
        let mut res = Response::new(stream_parts(parts));
        res.headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, size.into());
        return Ok(res);
    }
    if path == "/healthz" || path == "/readyz" {
        return Ok(json(serde_json::json!({ "status": "ok" })));
    }
    Ok(object(&state, req).await)
}

/// Any other path is a build tool's object: PUT keeps the body in a file of its own, GET
/// streams it back.
async fn object(state: &State, req: Request<Incoming>) -> Response<Body> {
    let name = req.uri().to_string();
    if req.method() == hyper::Method::PUT {
        let id = state.next.fetch_add(1, Ordering::Relaxed);
        let file = state.dir.join(format!("object-{id}"));
        return match write_body(req.into_body(), file.clone()).await {
            Ok(len) => {
                let parts = Arc::new(vec![Part { path: file, len }]);
                state
                    .objects
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name, parts);
                full(StatusCode::OK, "text/plain", "")
            }
            Err(e) => full(StatusCode::BAD_REQUEST, "text/plain", e.to_string()),
        };
    }
    let parts = state
        .objects
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&name)
        .cloned();
    let Some(parts) = parts else {
        return full(StatusCode::NOT_FOUND, "text/plain", "not found");
    };
    // Small objects are read whole, in one read of their length.
    let path = parts[0].path.clone();
    match tokio::task::spawn_blocking(move || std::fs::read(path)).await {
        Ok(Ok(bytes)) => full(StatusCode::OK, "application/octet-stream", bytes),
        _ => full(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            "unreadable",
        ),
    }
}

fn twirp(
    state: &State,
    method: &str,
    host: &str,
    who: Arc<Identity>,
    body: &serde_json::Value,
) -> Response<Body> {
    let key = body["key"].as_str().unwrap_or_default();
    let version = body["version"].as_str().unwrap_or_default();
    match method {
        "CreateCacheEntry" => {
            let id = state.next.fetch_add(1, Ordering::Relaxed);
            state
                .uploads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    id,
                    Upload {
                        who,
                        version: version.to_owned(),
                        key: key.to_owned(),
                        blocks: HashMap::new(),
                        order: Vec::new(),
                    },
                );
            json(serde_json::json!({
                "ok": true,
                "signed_upload_url": format!("http://{host}/floor/upload/{id}?sig=x"),
            }))
        }
        "FinalizeCacheEntryUpload" => {
            let upload = state
                .uploads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .find(|(_, u)| u.key == key && u.version == version && u.who == who)
                .map(|(id, _)| *id);
            let Some(id) = upload else {
                return json(serde_json::json!({ "ok": false }));
            };
            let upload = state
                .uploads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            let parts = Arc::new(upload.map(|u| u.order).unwrap_or_default());
            state
                .by_id
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, parts);
            state
                .entries
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(&who, version, key, id);
            json(serde_json::json!({ "ok": true, "entry_id": id.to_string() }))
        }
        "GetCacheEntryDownloadURL" => {
            let restore = body["restore_keys"].as_array().cloned().unwrap_or_default();
            let keys = std::iter::once(key).chain(restore.iter().filter_map(|k| k.as_str()));
            let hit = state
                .entries
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .find(&who, version, keys);
            lookup_answer(
                hit.map(|(matched, id)| {
                    (matched, format!("http://{host}/floor/download/{id}?sig=x"))
                }),
            )
        }
        _ => bad_route(),
    }
}

async fn upload(state: &State, id: u64, req: Request<Incoming>) -> Response<Body> {
    let comp = query(&req, "comp").map(|c| String::from_utf8_lossy(&c).into_owned());
    match comp.as_deref() {
        Some("blocklist") => {
            let xml = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return full(StatusCode::BAD_REQUEST, "text/plain", "body"),
            };
            let Ok(list) = hoard_server::api::blocklist::parse(&xml) else {
                return full(StatusCode::BAD_REQUEST, "text/plain", "block list");
            };
            let mut uploads = state.uploads.lock().unwrap_or_else(|p| p.into_inner());
            let Some(upload) = uploads.get_mut(&id) else {
                return full(StatusCode::NOT_FOUND, "text/plain", "no such upload");
            };
            let order: Option<Vec<Part>> = list
                .iter()
                .map(|b| upload.blocks.get(b.id.as_bytes()).cloned())
                .collect();
            match order {
                Some(order) => upload.order = order,
                None => return full(StatusCode::BAD_REQUEST, "text/plain", "unknown block"),
            }
            created()
        }
        other => {
            let block = match other {
                Some("block") => match query(&req, "blockid") {
                    Some(b) => Some(b.into_owned()),
                    None => return full(StatusCode::BAD_REQUEST, "text/plain", "blockid"),
                },
                _ => None,
            };
            let path = state.dir.join(format!(
                "{id}-{}",
                state.next.fetch_add(1, Ordering::Relaxed)
            ));
            let len = match write_body(req.into_body(), path.clone()).await {
                Ok(len) => len,
                Err(_) => return full(StatusCode::BAD_REQUEST, "text/plain", "body"),
            };
            let part = Part { path, len };
            let mut uploads = state.uploads.lock().unwrap_or_else(|p| p.into_inner());
            let Some(upload) = uploads.get_mut(&id) else {
                return full(StatusCode::NOT_FOUND, "text/plain", "no such upload");
            };
            match block {
                Some(block) => {
                    upload.blocks.insert(block, part);
                }
                None => upload.order = vec![part],
            }
            created()
        }
    }
}

/// Serves until the process is stopped, keeping its files under `dir`.
pub async fn run(listen: SocketAddr, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let state = Arc::new(State {
        dir: dir.to_owned(),
        next: AtomicU64::new(1),
        uploads: Mutex::default(),
        entries: Mutex::default(),
        identities: Identities::default(),
        by_id: Mutex::default(),
        objects: Mutex::default(),
    });
    reference::serve(listen, "disk floor", move |req| handle(state.clone(), req)).await
}
