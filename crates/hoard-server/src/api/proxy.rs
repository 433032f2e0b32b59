//! Pass-through to the results service (`--upstream-results-url`). A runner pointed at hoard
//! through `ACTIONS_RESULTS_URL` also sends `actions/upload-artifact` and `download-artifact`
//! (v4 and later) here: their `ArtifactService` calls share the base URL (PROTOCOL.md §6.2).
//! Every request that is not hoard's own is forwarded as it came (method, path, query, headers
//! with `Authorization`, body) and the answer returned as it came, both streaming. Only
//! hop-by-hop headers are dropped. Nothing of a body or a token is logged.

use crate::model::LogSafe;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, Method, StatusCode, Uri};
use axum::response::Response;
use url::Url;

/// Where requests that are not hoard's own go.
#[derive(Debug, Clone)]
pub struct Upstream {
    base: Url,
    http: reqwest::Client,
    /// A client that sends nothing of a body for this long is cut off.
    idle: Duration,
}

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1, with the
/// non-standard `Proxy-Connection` some clients still send), and `Host`, which names hoard:
/// never forwarded in either direction.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

impl Upstream {
    /// `base` is the results service's URL; a path in it prefixes every forwarded path.
    pub fn new(base: Url, idle: Duration) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(idle)
            // The answer is the upstream's, redirects included.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the HTTP client for --upstream-results-url: {e}"))?;
        Ok(Self { base, http, idle })
    }

    /// The results service's URL, as `/readyz` names it.
    pub fn base(&self) -> &Url {
        &self.base
    }

    pub fn host(&self) -> &str {
        self.base.host_str().unwrap_or("")
    }

    fn url_for(&self, uri: &Uri) -> String {
        let base = self.base.as_str().trim_end_matches('/');
        match uri.query() {
            Some(query) => format!("{base}{}?{query}", uri.path()),
            None => format!("{base}{}", uri.path()),
        }
    }

    /// Forwards one request and streams the answer back; a Twirp-shaped 502 if the upstream
    /// cannot be reached or fails before answering.
    pub async fn forward(
        &self,
        method: Method,
        uri: &Uri,
        headers: HeaderMap,
        body: Body,
    ) -> Response {
        let mut outgoing = headers;
        strip_hop_by_hop(&mut outgoing);
        outgoing.remove(header::HOST);
        let body = super::transfer::body_stream(body, self.idle);
        let request = self
            .http
            .request(method.clone(), self.url_for(uri))
            .headers(outgoing)
            .body(reqwest::Body::wrap_stream(body));
        let answer = match request.send().await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(%method, path = %LogSafe(uri.path()), upstream = self.host(), error = %LogSafe(&e.to_string()), "the upstream results service could not be reached");
                return unreachable(self.host());
            }
        };
        tracing::info!(%method, path = %LogSafe(uri.path()), status = answer.status().as_u16(), "forwarded to the upstream results service");
        relayed(axum::http::Response::from(answer))
    }
}

/// An answer from another server as the client gets it: its status, its headers but the
/// hop-by-hop ones, its body streamed.
pub fn relayed<B>(answer: axum::http::Response<B>) -> Response
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let (parts, body) = answer.into_parts();
    let mut response = Response::new(Body::new(body));
    *response.status_mut() = parts.status;
    *response.headers_mut() = parts.headers;
    strip_hop_by_hop(response.headers_mut());
    response
}

/// Removes hop-by-hop headers, and those the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(&named) {
        headers.remove(name);
    }
}

/// 502 in Twirp's error shape, which the artifact client reads and retries.
fn unreachable(host: &str) -> Response {
    let body = serde_json::json!({
        "code": "unavailable",
        "msg": format!("hoard could not reach the upstream results service at {host}"),
    });
    super::json_response(StatusCode::BAD_GATEWAY, &body, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "content-type"]);
    }

    #[test]
    fn paths_and_queries_are_kept_under_the_upstream_base() {
        let up = Upstream::new(
            Url::parse("https://results.example/prefix/").unwrap(),
            Duration::from_secs(1),
        )
        .unwrap();
        let uri: Uri = "/twirp/x.ArtifactService/Create?a=1&b=%2F".parse().unwrap();
        assert_eq!(
            up.url_for(&uri),
            "https://results.example/prefix/twirp/x.ArtifactService/Create?a=1&b=%2F"
        );
    }
}
