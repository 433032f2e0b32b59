//! What the two reference servers share (the null baseline and the disk floor): plain hyper,
//! no router, no logging, and the few answers of the cache protocol they give, in the shapes
//! the bench client reads.

use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

pub const TWIRP: &str = "/twirp/github.actions.results.api.v1.CacheService/";

pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

pub fn full(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut res = Response::new(
        Full::new(body.into())
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *res.status_mut() = status;
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    res
}

pub fn json(value: serde_json::Value) -> Response<Body> {
    full(StatusCode::OK, "application/json", value.to_string())
}

/// The answer to every accepted upload: `201` with the header the Azure SDK reads.
pub fn created() -> Response<Body> {
    let mut res = full(
        StatusCode::CREATED,
        "application/octet-stream",
        Bytes::new(),
    );
    res.headers_mut().insert(
        "x-ms-request-id",
        hyper::header::HeaderValue::from_static("00000000-0000-0000-0000-000000000000"),
    );
    res
}

/// A Twirp method the server does not have.
pub fn bad_route() -> Response<Body> {
    full(
        StatusCode::NOT_FOUND,
        "application/json",
        r#"{"code":"bad_route","msg":"no such method"}"#,
    )
}

/// GetCacheEntryDownloadURL's answer: the matched key and its link, or a miss.
pub fn lookup_answer(hit: Option<(String, String)>) -> Response<Body> {
    match hit {
        Some((matched, url)) => json(serde_json::json!({
            "ok": true,
            "signed_download_url": url,
            "matched_key": matched,
        })),
        None => json(serde_json::json!({ "ok": false })),
    }
}

/// The request's `Host`, for the links it is answered with.
pub fn host(req: &Request<Incoming>) -> String {
    req.headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_owned()
}

/// The JSON body of a Twirp call (`Null` if it is not JSON).
pub async fn json_body(body: Incoming) -> serde_json::Value {
    match body.collect().await {
        Ok(b) => serde_json::from_slice(&b.to_bytes()).unwrap_or_default(),
        Err(_) => serde_json::Value::Null,
    }
}

/// Serves HTTP/1.1 on `listen` with `handle` until the process is stopped.
pub async fn serve<H, F>(listen: SocketAddr, name: &str, handle: H) -> std::io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<Body>, std::convert::Infallible>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!("{name} listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(handle);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
