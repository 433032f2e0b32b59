//! Accepted connections: the TLS handshake (when hoard serves HTTPS) within the header timeout,
//! then HTTP/1.1 or HTTP/2 until the client is done, the connection idles, or the server stops.
//!
//! hyper times out HTTP/1.1 headers itself (`header_read_timeout`) but has no such timer for
//! HTTP/2, where a client may hold a connection open without ever completing a request. So each
//! connection counts the requests it is serving (until their response bodies end) and is shut
//! down gracefully (GOAWAY for HTTP/2) once it has served none for the header timeout: a slow or
//! silent client holds a connection for no longer in either version.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::tls::Reloadable;

/// What serves each request: the router, and the metrics every request is counted in.
#[derive(Clone)]
pub struct App {
    pub router: Router,
    pub metrics: Arc<Metrics>,
    /// Marked by every request of the cache's protocols.
    pub traffic: Arc<crate::cache::Traffic>,
}

/// Serves every accepted connection in a task of its own.
pub struct Connections {
    builder: auto::Builder<TokioExecutor>,
    app: App,
    tls: Option<Arc<Reloadable>>,
    /// How long a connection may go without serving a request, and a TLS handshake may take.
    idle: Duration,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Connections {
    pub fn new(
        builder: auto::Builder<TokioExecutor>,
        app: App,
        tls: Option<Arc<Reloadable>>,
        idle: Duration,
        stop: CancellationToken,
    ) -> Self {
        Self {
            builder,
            app,
            tls,
            idle,
            tasks: TaskTracker::new(),
            stop,
        }
    }

    pub fn serve(&self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let peer = stream.peer_addr().ok();
        let (builder, app, idle, stop) = (
            self.builder.clone(),
            self.app.clone(),
            self.idle,
            self.stop.clone(),
        );
        let acceptor = self.tls.as_ref().map(|tls| tls.acceptor());
        self.tasks.spawn(async move {
            match acceptor {
                None => run(stream, peer, builder, app, idle, stop).await,
                Some(acceptor) => {
                    let stream = match tokio::time::timeout(idle, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    run(stream, peer, builder, app, idle, stop).await;
                }
            }
        });
    }

    /// After the stop: waits up to `grace` for the connections to finish what they serve.
    /// False if some were still busy.
    pub async fn drain(self, grace: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(grace, self.tasks.wait()).await.is_ok()
    }
}

/// Serves one connection until it ends, shutting it down gracefully when it idles or the
/// server stops.
async fn run<I>(
    io: I,
    peer: Option<std::net::SocketAddr>,
    builder: auto::Builder<TokioExecutor>,
    app: App,
    idle: Duration,
    stop: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let service = TowerToHyperService::new(Tracked {
        app,
        activity: activity.clone(),
        peer: peer.map(crate::api::origin::Peer),
    });
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    let mut connection = std::pin::pin!(connection);
    let mut check = tokio::time::interval((idle / 4).max(Duration::from_millis(50)));
    let mut closing = false;
    loop {
        tokio::select! {
            _ = connection.as_mut() => return,
            () = stop.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = check.tick() => {
                let quiet = activity.idle_for();
                if !closing && quiet > idle {
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                } else if quiet > idle * 2 {
                    // An HTTP/2 graceful close waits for the client to acknowledge it; a
                    // silent client never does. Still nothing served: drop the connection.
                    return;
                }
            }
        }
    }
}

/// Requests a connection is serving, and when that count last changed.
struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    changed_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            changed_ms: AtomicU64::new(0),
        }
    }

    fn mark(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.changed_ms.store(now, Ordering::Relaxed);
    }

    /// How long the connection has served nothing; zero while it serves a request.
    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        let since = self.changed_ms.load(Ordering::Relaxed);
        self.started
            .elapsed()
            .saturating_sub(Duration::from_millis(since))
    }
}

/// Counts one request from its arrival until its response body ends or is dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.mark();
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.mark();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The router, counting what it serves.
#[derive(Clone)]
struct Tracked {
    app: App,
    activity: Arc<Activity>,
    /// The connection's peer, handed to each request (see `api::origin`).
    peer: Option<crate::api::origin::Peer>,
}

impl tower::Service<Request<Incoming>> for Tracked {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Incoming>) -> Self::Future {
        if let Some(peer) = self.peer {
            req.extensions_mut().insert(peer);
        }
        let guard = InFlight::new(self.activity.clone());
        let mut router = self.app.router.clone();
        let metrics = self.app.metrics.clone();
        // Counted here rather than in a router middleware, which costs allocations per
        // request; the label comes from the path as the router would route it.
        let route = crate::api::route_label(req.uri().path());
        // The cache's requests hold its background work back until they end.
        let serving = crate::api::is_cache_route(route).then(|| self.app.traffic.begin());
        let method = req.method().clone();
        let started = Instant::now();
        Box::pin(async move {
            let response = tower::Service::call(&mut router, req.map(Body::new)).await?;
            let elapsed = started.elapsed();
            metrics.request(route, response.status().as_u16(), elapsed);
            log_response(&method, route, response.status(), elapsed);
            Ok(response.map(|body| {
                Body::new(Counted {
                    body,
                    method,
                    route,
                    _guard: guard,
                    _serving: serving,
                })
            }))
        })
    }
}

/// The request log, under the target `hoard::request`: a line per request at debug level,
/// server errors always. Written here rather than by a tracing middleware, whose span and
/// body wrapper cost every request even with its lines off (1,100 instructions a lookup more
/// than this, docs/benchmarks-history.md). Routes are templates, never the URI: links carry signatures.
fn log_response(method: &Method, route: &'static str, status: StatusCode, elapsed: Duration) {
    let latency_ms = elapsed.as_secs_f64() * 1e3;
    if status.is_server_error() {
        tracing::error!(
            target: "hoard::request",
            %method, %route, status = status.as_u16(), latency_ms,
            "response failed"
        );
    } else {
        tracing::debug!(
            target: "hoard::request",
            %method, %route, status = status.as_u16(), latency_ms,
            "finished processing request"
        );
    }
}

/// A response body that keeps its request counted until it ends or is dropped, and logs
/// the error it ends with, if any (the status was sent long before).
struct Counted {
    body: Body,
    method: Method,
    route: &'static str,
    _guard: InFlight,
    _serving: Option<crate::cache::Serving>,
}

impl http_body::Body for Counted {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Err(error))) = &polled {
            let (method, route) = (&self.method, self.route);
            tracing::error!(
                target: "hoard::request",
                %method, %route, %error,
                "response body failed"
            );
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
