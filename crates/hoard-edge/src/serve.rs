//! The edge's accept loop: HTTP/1.1 or HTTP/2 on each connection, with a small read buffer per
//! HTTP/1 connection (an edge runs on every node: what each of many connections holds counts),
//! the client's address handed to the handlers, and a graceful stop.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

/// The most an HTTP/1 connection buffers of a request at once; also the bound of its headers.
const READ_BUFFER: usize = 64 << 10;
/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the requests under way may take to finish once the edge is told to stop.
const GRACE: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `stop`, then lets the requests under way finish.
pub async fn serve(listener: TcpListener, router: Router, stop: CancellationToken) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .max_buf_size(READ_BUFFER)
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let tasks = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, most often: accept again in a moment.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (router, builder, stop) = (router.clone(), builder.clone(), stop.clone());
        tasks.spawn(async move {
            let service =
                hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                    request
                        .extensions_mut()
                        .insert(ConnectInfo::<SocketAddr>(peer));
                    let router = router.clone();
                    async move {
                        Ok::<_, Infallible>(
                            router.oneshot(request).await.unwrap_or_else(|e| match e {}),
                        )
                    }
                });
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(GRACE, connection).await;
                }
            }
        });
    }
    tasks.close();
    let _ = tokio::time::timeout(GRACE, tasks.wait()).await;
}
