//! What the two reference servers share (the null baseline and the disk floor): plain hyper,
//! no router, no logging, and the few answers of the cache protocol they give, in the shapes
//! the bench client reads.

use std::collections::{BTreeMap, HashMap};
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

/// Who a request comes from, read from its runtime token without checking the signature (the
/// reference servers trust the bench): the repository, the scopes it may read in token order and
/// the one it writes (PROTOCOL.md §8). A request without a readable token is the empty
/// repository, reading and writing the empty scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub repository: String,
    pub read: Vec<String>,
    pub write: String,
}

impl Identity {
    fn anonymous() -> Self {
        Self {
            repository: String::new(),
            read: vec![String::new()],
            write: String::new(),
        }
    }

    /// From the value of an `Authorization: Bearer` header.
    pub fn from_bearer(header: Option<&[u8]>) -> Self {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        let read = || -> Option<Self> {
            let token = std::str::from_utf8(header?).ok()?.strip_prefix("Bearer ")?;
            let payload = URL_SAFE_NO_PAD.decode(token.split('.').nth(1)?).ok()?;
            let claims: serde_json::Value = serde_json::from_slice(&payload).ok()?;
            let repository = match &claims["repository_id"] {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                _ => String::new(),
            };
            let ac: Vec<serde_json::Value> = serde_json::from_str(claims["ac"].as_str()?).ok()?;
            let with = |bit: u64| {
                ac.iter()
                    .filter(move |s| s["Permission"].as_u64().unwrap_or(0) & bit != 0)
                    .filter_map(|s| s["Scope"].as_str().map(str::to_owned))
            };
            Some(Self {
                repository,
                read: with(1).collect(),
                write: with(2).next().unwrap_or_default(),
            })
        };
        read().unwrap_or_else(Self::anonymous)
    }
}

/// Identities by token, so that a token is read once, not on every request.
#[derive(Default)]
pub struct Identities(std::sync::Mutex<HashMap<Vec<u8>, std::sync::Arc<Identity>>>);

impl Identities {
    pub fn of(&self, req: &Request<Incoming>) -> std::sync::Arc<Identity> {
        let header = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .map(|h| h.as_bytes());
        let key = header.unwrap_or_default();
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = known.get(key) {
            return id.clone();
        }
        let id = std::sync::Arc::new(Identity::from_bearer(header));
        known.insert(key.to_vec(), id.clone());
        id
    }
}

/// Finalized entries as GitHub matches them (PROTOCOL.md §9): per repository and version, for
/// each readable scope in token order, each key in turn (the primary, then the restore keys):
/// the exact key, else the newest entry whose key starts with it. Keys compare case-insensitively.
pub struct Index<V> {
    /// By (repository, scope, version).
    scopes: HashMap<(String, String, String), Entries<V>>,
    next: u64,
}

/// One scope's entries of one version: folded key → (order of creation, stored key, value).
type Entries<V> = BTreeMap<String, (u64, String, V)>;

impl<V> Default for Index<V> {
    fn default() -> Self {
        Self {
            scopes: HashMap::new(),
            next: 0,
        }
    }
}

impl<V: Clone> Index<V> {
    /// Records an entry in `who`'s write scope; a later one is newer.
    pub fn insert(&mut self, who: &Identity, version: &str, key: &str, value: V) {
        self.next += 1;
        self.scopes
            .entry((
                who.repository.clone(),
                who.write.clone(),
                version.to_owned(),
            ))
            .or_default()
            .insert(key.to_lowercase(), (self.next, key.to_owned(), value));
    }

    /// The entry a lookup of `keys` (primary first) restores for `who`: its key and value.
    pub fn find<'k>(
        &self,
        who: &Identity,
        version: &str,
        keys: impl IntoIterator<Item = &'k str> + Clone,
    ) -> Option<(String, V)> {
        for scope in &who.read {
            let Some(entries) =
                self.scopes
                    .get(&(who.repository.clone(), scope.clone(), version.to_owned()))
            else {
                continue;
            };
            for key in keys.clone() {
                let key = key.to_lowercase();
                if let Some((_, stored, v)) = entries.get(&key) {
                    return Some((stored.clone(), v.clone()));
                }
                let newest = entries
                    .range(key.clone()..)
                    .take_while(|(k, _)| k.starts_with(&key))
                    .max_by_key(|(_, (order, _, _))| *order);
                if let Some((_, (_, stored, v))) = newest {
                    return Some((stored.clone(), v.clone()));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(repository: &str, read: &[&str], write: &str) -> Identity {
        Identity {
            repository: repository.into(),
            read: read.iter().map(|s| (*s).to_owned()).collect(),
            write: write.into(),
        }
    }

    const MAIN: &str = "refs/heads/main";
    const PR: &str = "refs/pull/7/merge";

    #[test]
    fn tokens_give_repository_and_scopes_in_order() {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        let claims = serde_json::json!({
            "repository_id": 42,
            "ac": r#"[{"Scope":"refs/pull/7/merge","Permission":3},{"Scope":"refs/heads/main","Permission":1}]"#,
        });
        let token = format!("Bearer x.{}.y", URL_SAFE_NO_PAD.encode(claims.to_string()));
        assert_eq!(
            Identity::from_bearer(Some(token.as_bytes())),
            who("42", &[PR, MAIN], PR)
        );
        assert_eq!(Identity::from_bearer(None), Identity::anonymous());
        assert_eq!(
            Identity::from_bearer(Some(b"Bearer not-a-jwt")),
            Identity::anonymous()
        );
    }

    #[test]
    fn lookups_follow_githubs_order() {
        let main = who("r", &[MAIN], MAIN);
        let pr = who("r", &[PR, MAIN], PR);
        let mut index = Index::default();
        index.insert(&main, "v", "deps-a-1", 1);
        index.insert(&main, "v", "deps-a-2", 2);
        index.insert(&main, "v", "deps-a-0", 3);
        // Exact first, then the newest by creation (not by key order), case-insensitively.
        assert_eq!(
            index.find(&main, "v", ["deps-a-1"]),
            Some(("deps-a-1".into(), 1))
        );
        assert_eq!(
            index.find(&main, "v", ["DEPS-A-"]),
            Some(("deps-a-0".into(), 3))
        );
        assert_eq!(
            index.find(&main, "v", ["deps-a-9", "deps-a-"]),
            Some(("deps-a-0".into(), 3))
        );
        assert_eq!(index.find(&main, "v", ["deps-b-", "other-"]), None);
        // Other versions and repositories see nothing.
        assert_eq!(index.find(&main, "w", ["deps-a-1"]), None);
        assert_eq!(index.find(&who("s", &[MAIN], MAIN), "v", ["deps-"]), None);
        // A pull request reads its own scope first, then main; main never reads the PR's.
        index.insert(&pr, "v", "deps-a-pr", 4);
        assert_eq!(
            index.find(&pr, "v", ["deps-a-"]),
            Some(("deps-a-pr".into(), 4))
        );
        assert_eq!(
            index.find(&pr, "v", ["deps-a-1"]),
            Some(("deps-a-1".into(), 1))
        );
        assert_eq!(index.find(&main, "v", ["deps-a-pr"]), None);
        // Every key is tried in the PR's scope before main's.
        assert_eq!(
            index.find(&pr, "v", ["deps-a-2", "deps-"]),
            Some(("deps-a-pr".into(), 4))
        );
    }
}
