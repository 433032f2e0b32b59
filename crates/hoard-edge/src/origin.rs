//! The origin: a central hoard, one replica or many (`--origin`, repeated or comma-separated).
//! Requests go to the replicas in turn; one that refuses a connection or does not answer in
//! time is left aside until its `/readyz` answers again (checked every [`CHECK_EVERY`]), so an
//! origin that is down costs a lookup nothing once it is known to be down.
//!
//! Calls (lookups, reservations, the `HEAD` before a download) to a replica reached over plain
//! HTTP, as inside a cluster, go through hyper's own client: every lookup of every runner of a
//! node passes here, and `reqwest` costs each one a URL parse and copies of its headers (a
//! fifth of the edge's CPU for a lookup). Replicas behind TLS, and every streamed body, go
//! through `reqwest`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::{HeaderMap, Method, Request, Response, Uri};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use url::Url;

/// How often each replica's `/readyz` is asked.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);
/// How long a connection to a replica may take: the origin is near (a data centre's network).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a connection to a replica stays pooled unused: below hoard's own `--idle-timeout`
/// (60 s by default), so that the edge never sends a request down a connection the origin is
/// closing.
const POOL_IDLE: Duration = Duration::from_secs(30);
/// The most of a call's answer the edge reads (they are a few hundred bytes).
const ANSWER_LIMIT: usize = 1 << 20;

/// The origin's answer to a call, read whole.
pub type Answer = Response<Bytes>;

struct Replica {
    /// Its URL without a trailing slash; request paths are appended.
    base: String,
    /// Reached over plain HTTP (calls go through hyper's own client).
    plain: bool,
    up: AtomicBool,
}

/// Why one replica gave no answer.
struct Failure {
    /// It could not be reached at all (it is left aside).
    unreachable: bool,
    message: String,
}

impl Failure {
    fn of_reqwest(e: reqwest::Error) -> Self {
        Self {
            unreachable: e.is_connect() || e.is_timeout(),
            message: e.to_string(),
        }
    }
}

/// The origin could not answer.
#[derive(Debug, thiserror::Error)]
pub enum Unanswered {
    #[error("no origin replica is reachable")]
    AllDown,
    #[error("the origin did not answer within {0:?}")]
    Late(Duration),
    #[error("the origin could not be reached: {0}")]
    Failed(String),
}

/// The replicas and the HTTP clients that reach them.
pub struct Origin {
    replicas: Vec<Replica>,
    next: AtomicUsize,
    /// For calls to replicas over plain HTTP.
    calls: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
    /// For calls to replicas behind TLS, and streamed bodies: the origin's answer as it is (no
    /// redirect followed).
    api: reqwest::Client,
    /// For entries' bytes: follows the origin's redirect to its object store
    /// (`--direct-downloads`).
    bytes: reqwest::Client,
}

impl std::fmt::Debug for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.replicas.iter().map(|r| &r.base))
            .finish()
    }
}

impl Origin {
    /// `idle`: silence from a replica for this long while it sends a body ends the transfer.
    pub fn new(bases: &[Url], idle: Duration) -> Result<Self, String> {
        if bases.is_empty() {
            return Err("--origin (HOARD_ORIGIN) names no origin".into());
        }
        let mut replicas = Vec::with_capacity(bases.len());
        for base in bases {
            if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
                return Err(format!(
                    "--origin {base} must be an http:// or https:// URL of a hoard server"
                ));
            }
            replicas.push(Replica {
                base: base.as_str().trim_end_matches('/').to_owned(),
                plain: base.scheme() == "http",
                up: AtomicBool::new(true),
            });
        }
        let client = |redirects| {
            reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .pool_idle_timeout(POOL_IDLE)
                .read_timeout(idle)
                .redirect(redirects)
                .build()
                .map_err(|e| format!("cannot build the HTTP client for the origin: {e}"))
        };
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        let calls = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        Ok(Self {
            replicas,
            next: AtomicUsize::new(0),
            calls,
            api: client(reqwest::redirect::Policy::none())?,
            bytes: client(reqwest::redirect::Policy::limited(3))?,
        })
    }

    /// Each replica's URL and whether it answered its last check.
    pub fn states(&self) -> Vec<(String, bool)> {
        self.replicas
            .iter()
            .map(|r| (r.base.clone(), r.up.load(Ordering::Relaxed)))
            .collect()
    }

    pub fn any_up(&self) -> bool {
        self.replicas.iter().any(|r| r.up.load(Ordering::Relaxed))
    }

    /// The replicas that are up, starting with the next in turn.
    fn in_turn(&self) -> impl Iterator<Item = &Replica> {
        let n = self.replicas.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed) % n;
        (0..n)
            .map(move |i| &self.replicas[(first + i) % n])
            .filter(|r| r.up.load(Ordering::Relaxed))
    }

    fn mark_down(&self, replica: &Replica, why: &str) {
        if replica.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(origin = %replica.base, reason = why, "an origin replica is left aside until it answers /readyz");
        }
    }

    /// The first answer of the replicas in turn to `attempt` (the next one is asked when a
    /// replica gives none; one that cannot be reached is left aside), within `within`.
    async fn first_answer<T, F>(
        &self,
        within: Duration,
        attempt: impl Fn(&Replica) -> F,
    ) -> Result<T, Unanswered>
    where
        F: std::future::Future<Output = Result<T, Failure>>,
    {
        let tries = async {
            let mut last = Unanswered::AllDown;
            for replica in self.in_turn() {
                match attempt(replica).await {
                    Ok(answer) => return Ok(answer),
                    Err(failure) => {
                        if failure.unreachable {
                            self.mark_down(replica, &failure.message);
                        }
                        last = Unanswered::Failed(failure.message);
                    }
                }
            }
            Err(last)
        };
        tokio::time::timeout(within, tries)
            .await
            .unwrap_or(Err(Unanswered::Late(within)))
    }

    /// Sends a call (a request whose body is in memory) to the replicas in turn until one
    /// answers, within `within`, and reads its answer.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
        within: Duration,
    ) -> Result<Answer, Unanswered> {
        self.first_answer(within, |replica| {
            let (url, plain) = (format!("{}{path_and_query}", replica.base), replica.plain);
            let (method, headers, body) = (method.clone(), headers.clone(), body.clone());
            async move {
                if plain {
                    self.call_plain(method, url, headers, body).await
                } else {
                    self.call_tls(method, url, headers, body).await
                }
            }
        })
        .await
    }

    async fn call_plain(
        &self,
        method: Method,
        url: String,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Answer, Failure> {
        let uri = Uri::try_from(url).map_err(|e| Failure {
            unreachable: false,
            message: e.to_string(),
        })?;
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        let answer = self.calls.request(request).await.map_err(|e| Failure {
            unreachable: e.is_connect(),
            message: e.to_string(),
        })?;
        read_whole(answer).await
    }

    async fn call_tls(
        &self,
        method: Method,
        url: String,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Answer, Failure> {
        let request = self.api.request(method, url).headers(headers).body(body);
        let answer = request.send().await.map_err(Failure::of_reqwest)?;
        read_whole(Response::from(answer)).await
    }

    /// Sends a request with a streamed body to the next replica that is up (one try: a body
    /// cannot be sent twice).
    pub async fn stream(
        &self,
        method: Method,
        path_and_query: &str,
        headers: HeaderMap,
        body: reqwest::Body,
    ) -> Result<reqwest::Response, Unanswered> {
        let replica = self.in_turn().next().ok_or(Unanswered::AllDown)?;
        self.api
            .request(method, format!("{}{path_and_query}", replica.base))
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                if e.is_connect() {
                    self.mark_down(replica, &e.to_string());
                }
                Unanswered::Failed(e.to_string())
            })
    }

    /// GETs an entry's bytes (a download link's path and query), following the origin's
    /// redirect to its object store; `range` asks for bytes `from..end` only.
    pub async fn fetch(
        &self,
        path_and_query: &str,
        range: Option<(u64, u64)>,
        within: Duration,
    ) -> Result<reqwest::Response, Unanswered> {
        self.first_answer(within, |replica| {
            let request = self.bytes.get(format!("{}{path_and_query}", replica.base));
            let request = match range {
                Some((from, end)) => request.header("range", format!("bytes={from}-{}", end - 1)),
                None => request,
            };
            async move { request.send().await.map_err(Failure::of_reqwest) }
        })
        .await
    }

    /// Asks each replica's `/readyz` every [`CHECK_EVERY`] until `stop`, marking it up or down.
    pub async fn check_until(&self, stop: tokio_util::sync::CancellationToken) {
        let mut every = tokio::time::interval(CHECK_EVERY);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = every.tick() => {}
            }
            for replica in &self.replicas {
                let asked = self
                    .api
                    .get(format!("{}/readyz", replica.base))
                    .timeout(Duration::from_secs(1))
                    .send()
                    .await;
                match asked {
                    Ok(answer) if answer.status().is_success() => {
                        if !replica.up.swap(true, Ordering::Relaxed) {
                            tracing::info!(origin = %replica.base, "an origin replica answers again");
                        }
                    }
                    Ok(answer) => {
                        self.mark_down(replica, &format!("/readyz answered {}", answer.status()))
                    }
                    Err(e) => self.mark_down(replica, &e.to_string()),
                }
            }
        }
    }
}

/// An answer with its body read (at most [`ANSWER_LIMIT`]).
async fn read_whole<B>(answer: Response<B>) -> Result<Answer, Failure>
where
    B: http_body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (parts, body) = answer.into_parts();
    let body = Limited::new(body, ANSWER_LIMIT)
        .collect()
        .await
        .map_err(|e| Failure {
            unreachable: false,
            message: format!("the origin's answer could not be read: {e}"),
        })?
        .to_bytes();
    Ok(Response::from_parts(parts, body))
}
