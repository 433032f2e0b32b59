//! `hoard edge`: a byte cache on local disk beside the runners, in front of an origin (a
//! central hoard, one replica or many).
//!
//! The origin decides every lookup and every save; the edge keeps the entries' bytes. Lookups
//! and reservations are forwarded, and the links in their answers point at the edge
//! (`cache_api`); downloads are served from the edge's copy, each entry fetched from the origin
//! once (`downloads`, `fill`, `store`); everything else, uploads included, streams through
//! (`forward`). An entry's copy is named by what never changes for it: the entry's id and its
//! row's creation time, as the origin's download link names them (entries are immutable and
//! their ids never reused).

mod cache_api;
mod downloads;
mod fill;
mod forward;
mod metrics;
mod origin;
mod saves;
mod serve;
mod store;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hoard_server::api::paths::{blob_route, LinkKind};
use hoard_server::blob::transfer_memory::TransferMemory;
use hoard_server::model::units::parse_size;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::metrics::Counters;
use crate::origin::Origin;
use crate::store::Store;

/// `hoard edge`'s options.
#[derive(clap::Args, Debug, Clone)]
pub struct EdgeArgs {
    /// The origin: a hoard server's URL, such as http://hoard.example:3000. Replicas: repeat
    /// the option or separate the URLs with commas; requests go to them in turn.
    #[arg(long, env = "HOARD_ORIGIN", value_delimiter = ',', required = true)]
    pub origin: Vec<Url>,
    /// Address and port to listen on.
    #[arg(long, env = "HOARD_LISTEN", default_value = "0.0.0.0:3000")]
    pub listen: String,
    /// Directory holding the copies of entries (one edge per directory).
    #[arg(long, env = "HOARD_DATA_DIR", default_value = "./hoard-edge-data")]
    pub data_dir: PathBuf,
    /// The most the copies may take on disk; the least recently used go first.
    #[arg(long, env = "HOARD_MAX_BYTES", default_value = "10GiB", value_parser = parse_size)]
    pub max_bytes: u64,
    /// The edge's URL as runners reach it, for the links it hands out [default: the scheme
    /// http and the Host each runner used].
    #[arg(long, env = "HOARD_PUBLIC_URL")]
    pub public_url: Option<Url>,
    /// How long a lookup waits for the origin before it is answered as a miss.
    #[arg(long, env = "HOARD_LOOKUP_TIMEOUT", default_value = "1s", value_parser = humantime::parse_duration)]
    pub lookup_timeout: Duration,
    /// Memory for the blocks of entries being read and written, whatever the number of
    /// transfers.
    #[arg(long, env = "HOARD_TRANSFER_MEMORY", default_value = "8MiB", value_parser = parse_size)]
    pub transfer_memory: u64,
}

/// What the edge's handlers share.
pub struct Edge {
    origin: Arc<Origin>,
    store: Arc<Store>,
    fills: Arc<fill::Fills>,
    saves: saves::Saves,
    memory: Arc<TransferMemory>,
    counters: Arc<Counters>,
    lookup_timeout: Duration,
    /// Silence from a client or the origin for this long ends a transfer.
    idle: Duration,
    public_base: Option<String>,
}

/// Silence from the origin while it sends an entry, for this long, ends the fetch.
const IDLE: Duration = Duration::from_secs(60);

impl Edge {
    /// The base of the links the edge hands the client that sent `incoming`.
    fn base_for(&self, incoming: &HeaderMap) -> Option<String> {
        if let Some(base) = &self.public_base {
            return Some(base.clone());
        }
        let host = incoming.get(header::HOST)?.to_str().ok()?;
        // A Host header is an authority: nothing that would change where a link points.
        let plain = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
        plain.then(|| format!("http://{host}"))
    }
}

/// Why the edge could not start.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error("{0}")]
    Config(String),
    #[error("cannot open the edge's copies in {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr} (--listen, HOARD_LISTEN): {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs the edge until `stop`.
pub async fn run(args: EdgeArgs, stop: CancellationToken) -> Result<(), EdgeError> {
    let listen: SocketAddr = args.listen.parse().map_err(|_| {
        EdgeError::Config(format!(
            "--listen (HOARD_LISTEN) must be an IP address and port such as 0.0.0.0:3000, not {:?}.",
            args.listen
        ))
    })?;
    let origin = Origin::new(&args.origin, IDLE).map_err(EdgeError::Config)?;
    let public_base = match &args.public_url {
        Some(url) if !matches!(url.scheme(), "http" | "https") => {
            return Err(EdgeError::Config(format!(
                "--public-url {url} must be an http:// or https:// URL"
            )))
        }
        Some(url) => Some(url.as_str().trim_end_matches('/').to_owned()),
        None => None,
    };
    let store = {
        let dir = args.data_dir.clone();
        let max = args.max_bytes;
        tokio::task::spawn_blocking(move || Store::open(&dir, max))
            .await
            .map_err(std::io::Error::other)?
            .map_err(|source| EdgeError::DataDir {
                path: args.data_dir.display().to_string(),
                source,
            })?
    };
    let edge = Arc::new(Edge {
        origin: Arc::new(origin),
        store,
        fills: Arc::default(),
        saves: saves::Saves::default(),
        memory: TransferMemory::new(args.transfer_memory),
        counters: Arc::default(),
        lookup_timeout: args.lookup_timeout,
        idle: IDLE,
        public_base,
    });
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| EdgeError::Listen {
            addr: args.listen.clone(),
            source,
        })?;
    let (stored, copies) = edge.store.usage();
    tracing::info!(
        "edge of {:?}: {copies} copies ({stored} bytes of at most {}) in {}",
        edge.origin,
        args.max_bytes,
        args.data_dir.display()
    );
    tracing::info!("listening on {}", listener.local_addr()?);
    {
        let edge = edge.clone();
        let stop = stop.clone();
        tokio::spawn(async move { edge.origin.check_until(stop).await });
    }
    serve::serve(listener, router(edge), stop).await;
    Ok(())
}

fn router(edge: Arc<Edge>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .fallback(dispatch)
        .with_state(edge)
}

/// Ready while an origin replica answers: a runner set up by `hoard runner setup` then uses
/// the edge, and GitHub's cache otherwise.
async fn readyz(State(edge): State<Arc<Edge>>) -> Response {
    let (stored, copies) = edge.store.usage();
    let origins: Vec<_> = edge
        .origin
        .states()
        .into_iter()
        .map(|(url, up)| serde_json::json!({ "url": url, "up": up }))
        .collect();
    let ready = edge.origin.any_up();
    let body = serde_json::json!({
        "status": if ready { "ready" } else { "no origin replica answers" },
        "origin": origins,
        "copies": copies,
        "stored_bytes": stored,
        "max_bytes": edge.store.max_bytes(),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics_text(State(edge): State<Arc<Edge>>) -> Response {
    let text = metrics::render(&edge.counters, &edge.store, &edge.origin);
    let mut response = Response::new(Body::from(text));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

async fn dispatch(State(edge): State<Arc<Edge>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let client = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(client)| *client);
    let (method, uri, headers) = (parts.method, parts.uri, parts.headers);
    let path = uri.path();
    if let Some(call) = cache_api::Call::of(&method, path) {
        return cache_api::call(&edge, call, &uri, headers, client, body).await;
    }
    match (blob_route(path), &method) {
        (Some((LinkKind::Download, segment)), &Method::GET | &Method::HEAD)
            if store::is_key(&segment) =>
        {
            let key = segment.into_owned();
            return downloads::serve(&edge, key, method, &uri, &headers, client).await;
        }
        // A single-shot upload (no `comp=block` or `comp=blocklist`).
        (Some((LinkKind::Upload, segment)), &Method::PUT)
            if !uri.query().unwrap_or_default().contains("comp=") =>
        {
            let upload = segment.into_owned();
            return forward::upload_keeping(&edge, &upload, &uri, &headers, client, body).await;
        }
        _ => {}
    }
    forward::forward(&edge, method, &uri, &headers, client, body).await
}
