//! The server side of `hoard doctor`: readiness and clock, the token on a lookup, then a tiny
//! entry saved, restored and compared through the protocol the client will use.

use std::time::{Duration, Instant, SystemTime};

use rand::RngCore;
use reqwest::{header, Client, Response, StatusCode};
use serde_json::{json, Value};
use url::Url;

use super::{trust, Finding, Protocol};

const SERVICE: &str = "twirp/github.actions.results.api.v1.CacheService/";
/// More clock difference than this and tokens fail their `exp`/`nbf` checks (the server's
/// default `--token-leeway`).
const MAX_SKEW_SECS: u64 = 60;
const PROBE_BYTES: usize = 1024;

/// `extra_ca_certs` is `NODE_EXTRA_CA_CERTS`: over HTTPS doctor trusts what the client does.
pub async fn probe(
    protocol: Protocol,
    base: &Url,
    token: &str,
    extra_ca_certs: Option<&str>,
    timeout: Duration,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let built = trust::client_config(extra_ca_certs).and_then(|(tls, unread)| {
        for problem in unread {
            out.push(Finding::warn(
                format!("trusted certificates: {problem}"),
                "the client skips what it cannot read too: fix the file or the variable",
            ));
        }
        Client::builder()
            .timeout(timeout)
            .use_preconfigured_tls(tls)
            .build()
            .map_err(|e| e.to_string())
    });
    let http = match built {
        Ok(http) => http,
        Err(e) => {
            out.push(Finding::fail(
                format!("cannot make an HTTP client: {e}"),
                "check this machine's TLS trust store",
            ));
            return out;
        }
    };
    let probe = Probe {
        http,
        base: base.clone(),
        token: token.to_owned(),
        protocol,
        key: format!("hoard-doctor-{}", random_hex(8)),
        version: random_hex(32),
    };
    if !probe.ready(&mut out).await {
        return out;
    }
    if !probe.lookup(&mut out).await {
        return out;
    }
    probe.round_trip(&mut out).await;
    out
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    hex::encode(buf)
}

struct Probe {
    http: Client,
    base: Url,
    token: String,
    protocol: Protocol,
    key: String,
    version: String,
}

/// The error message of a Twirp (`msg`) or v1 (`message`) answer, or its text.
async fn message_of(res: Response) -> String {
    let text = res.text().await.unwrap_or_default();
    match serde_json::from_str::<Value>(&text) {
        Ok(v) => v["msg"]
            .as_str()
            .or(v["message"].as_str())
            .unwrap_or(&text)
            .to_owned(),
        Err(_) => text.chars().take(200).collect(),
    }
}

/// How far this machine's clock is from the server's `Date`.
fn clock_finding(server: SystemTime) -> Finding {
    let (skew, side) = match SystemTime::now().duration_since(server) {
        Ok(ahead) => (ahead.as_secs(), "ahead of"),
        Err(behind) => (behind.duration().as_secs(), "behind"),
    };
    if skew > MAX_SKEW_SECS {
        Finding::fail(
            format!("clock: this machine is {skew} s {side} the server: tokens are checked against the server's clock with {MAX_SKEW_SECS} s of leeway"),
            "synchronise both clocks (NTP), or raise the server's --token-leeway",
        )
    } else {
        Finding::ok(format!("clock: within {} s of the server's", skew.max(1)))
    }
}

/// The innermost cause of an error ("Connection refused" rather than "client error").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    cause.to_string()
}

/// What to do about a token the server refused, from its message.
fn token_fix(message: &str) -> String {
    if message.contains("issuer") && message.contains("not trusted") {
        "add the token's issuer to the server's --token-issuer (HOARD_TOKEN_ISSUERS)".into()
    } else if message.contains("HS256") {
        "give the server the forge's token secret (--token-hs256-secret-file), or use a namespace prefix (--namespaces-file)".into()
    } else if message.contains("signature") || message.contains("no key") {
        "the token was signed with a key the server does not have: for GitHub tokens check --token-issuer (or --jwks-file), for a forge give --token-hs256-secret-file the forge's secret".into()
    } else if message.contains("expired") || message.contains("nbf") {
        "run hoard doctor inside the job, with the job's own token, and check both clocks".into()
    } else if message.contains("repository_id") {
        "tokens must name their repository; see docs/security.md, 'What a token must carry'".into()
    } else {
        "see docs/security.md, 'Answers to a refused token'".into()
    }
}

impl Probe {
    fn origin(&self) -> String {
        self.base.origin().ascii_serialization()
    }

    fn v1(&self, resource: &str) -> String {
        format!("{}_apis/artifactcache/{resource}", self.base)
    }

    /// `/readyz` and the clock. False if the server cannot be reached.
    async fn ready(&self, out: &mut Vec<Finding>) -> bool {
        let origin = self.origin();
        let res = match self.http.get(format!("{origin}/readyz")).send().await {
            Ok(res) => res,
            Err(e) => {
                let host = self.base.host_str().unwrap_or_default();
                if let Some((problem, fix)) =
                    trust::tls_error(&e).and_then(|tls| trust::problem(tls, host))
                {
                    out.push(Finding::fail(format!("TLS with {origin}: {problem}"), fix));
                    return false;
                }
                let cause = root_cause(&e);
                out.push(Finding::fail(
                    format!("cannot reach {origin}: {cause}"),
                    format!("check the host and port in the URL, that hoard runs there (--listen, default 0.0.0.0:3000) and that no firewall is in the way; from this machine, try curl {origin}/readyz"),
                ));
                return false;
            }
        };
        let clock = res
            .headers()
            .get(header::DATE)
            .and_then(|d| d.to_str().ok())
            .and_then(|d| httpdate::parse_http_date(d).ok())
            .map(clock_finding);
        let status = res.status();
        let body: Value = res.json().await.unwrap_or(Value::Null);
        match (status, body["status"].as_str()) {
            (StatusCode::OK, Some("ready")) => {
                out.push(Finding::ok(format!("server: {origin} answers and is ready")));
                for warning in body["warnings"].as_array().into_iter().flatten() {
                    out.push(Finding::warn(
                        format!("server warning: {}", warning.as_str().unwrap_or_default()),
                        "see the server's start-up log and docs/security.md",
                    ));
                }
            }
            (_, Some(state)) => out.push(Finding::fail(
                format!("server: {origin} answers but is {state}: {}", body["error"].as_str().unwrap_or("")),
                "read the server's log: /readyz names the part that fails (database or chunk store)",
            )),
            _ => out.push(Finding::warn(
                format!("server: {origin}/readyz answered {status}, not hoard's readiness"),
                "if this is not hoard, point the URL at hoard",
            )),
        }
        out.extend(clock);
        true
    }

    /// A lookup of a key that does not exist: is the token accepted, and is the protocol served?
    async fn lookup(&self, out: &mut Vec<Finding>) -> bool {
        let res = match self.lookup_request().await {
            Ok(res) => res,
            Err(e) => {
                out.push(Finding::fail(
                    format!("lookup: the request failed: {e}"),
                    "check the server's log",
                ));
                return false;
            }
        };
        let status = res.status();
        let (what, url_var) = match self.protocol {
            Protocol::V2 => ("cache service v2 (Twirp)", "ACTIONS_RESULTS_URL"),
            Protocol::V1 => (
                "the v1 cache service (_apis/artifactcache)",
                "ACTIONS_CACHE_URL",
            ),
        };
        match status {
            StatusCode::OK | StatusCode::NO_CONTENT => {
                out.push(Finding::ok(format!(
                    "token: accepted; {what} answers lookups"
                )));
                true
            }
            StatusCode::UNAUTHORIZED => {
                let message = message_of(res).await;
                let fix = token_fix(&message);
                out.push(Finding::fail(
                    format!("token: refused by the server: {message}"),
                    fix,
                ));
                false
            }
            StatusCode::FORBIDDEN => {
                let message = message_of(res).await;
                out.push(Finding::fail(
                    format!("token: accepted, but lookups are refused: {message}"),
                    "the token grants no readable scope here; check the job's permissions (or the namespace and Forgejo settings)",
                ));
                false
            }
            StatusCode::NOT_FOUND => {
                let url = match self.protocol {
                    Protocol::V2 => format!("{}/{SERVICE}", self.origin()),
                    Protocol::V1 => self.v1(""),
                };
                out.push(Finding::fail(
                    format!("{url} answered 404: the server does not serve {what} there"),
                    format!("point {url_var} at a server that speaks it (hoard serves both protocols at its root, and v1 under any path prefix; under a namespace prefix, check the secret)"),
                ));
                false
            }
            other => {
                let message = message_of(res).await;
                out.push(Finding::fail(
                    format!("lookup: the server answered {other}: {message}"),
                    "read the server's log",
                ));
                false
            }
        }
    }

    async fn lookup_request(&self) -> reqwest::Result<Response> {
        match self.protocol {
            Protocol::V2 => {
                self.twirp(
                    "GetCacheEntryDownloadURL",
                    json!({ "key": self.key, "version": self.version }),
                )
                .await
            }
            Protocol::V1 => {
                self.http
                    .get(self.v1(&format!("cache?keys={}&version={}", self.key, self.version)))
                    .bearer_auth(&self.token)
                    .header(header::ACCEPT, "application/json;api-version=6.0-preview.1")
                    .send()
                    .await
            }
        }
    }

    async fn twirp(&self, method: &str, body: Value) -> reqwest::Result<Response> {
        self.http
            .post(format!("{}/{SERVICE}{method}", self.origin()))
            .bearer_auth(&self.token)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
    }

    /// Saves a tiny entry, restores it and compares the bytes.
    async fn round_trip(&self, out: &mut Vec<Finding>) {
        let mut payload = vec![0u8; PROBE_BYTES];
        rand::rng().fill_bytes(&mut payload);
        let started = Instant::now();
        let result = match self.protocol {
            Protocol::V2 => self.round_trip_v2(&payload).await,
            Protocol::V1 => self.round_trip_v1(&payload).await,
        };
        match result {
            Ok(()) => out.push(Finding::ok(format!(
                "save and restore: a {} KiB entry ({}) saved, restored and matched in {} ms",
                PROBE_BYTES / 1024,
                self.key,
                started.elapsed().as_millis()
            ))),
            Err(Step::WriteDenied(message)) => out.push(Finding::warn(
                format!("save: the token may not save here ({message}); restores work"),
                "a read-only token (a pull request from a fork, a read-only namespace) cannot save; nothing to fix if that is intended",
            )),
            Err(Step::Failed(step, message)) => out.push(Finding::fail(
                format!("save and restore: {step} failed: {message}"),
                "read the server's log around this time (hoard::audit lines name each reservation and finalize)",
            )),
        }
    }

    async fn round_trip_v2(&self, payload: &[u8]) -> Result<(), Step> {
        let created = self
            .twirp_json(
                "CreateCacheEntry",
                json!({ "key": self.key, "version": self.version }),
            )
            .await?;
        if created["ok"] != true {
            let message = created["message"].as_str().unwrap_or("refused").to_owned();
            if message.contains("write denied") {
                return Err(Step::WriteDenied(message));
            }
            return Err(Step::Failed("CreateCacheEntry", message));
        }
        let upload = created["signed_upload_url"].as_str().unwrap_or_default();
        let res = self
            .http
            .put(upload)
            .header("x-ms-blob-type", "BlockBlob")
            .body(payload.to_vec())
            .send()
            .await
            .map_err(|e| Step::Failed("the upload to the signed link", e.to_string()))?;
        if res.status() != StatusCode::CREATED {
            return Err(Step::Failed(
                "the upload to the signed link",
                format!("{} {}", res.status(), message_of(res).await),
            ));
        }
        let finalized = self
            .twirp_json(
                "FinalizeCacheEntryUpload",
                json!({ "key": self.key, "version": self.version, "size_bytes": payload.len().to_string() }),
            )
            .await?;
        if finalized["ok"] != true {
            return Err(Step::Failed(
                "FinalizeCacheEntryUpload",
                finalized["message"].to_string(),
            ));
        }
        let hit = self
            .twirp_json(
                "GetCacheEntryDownloadURL",
                json!({ "key": self.key, "version": self.version }),
            )
            .await?;
        if hit["ok"] != true {
            return Err(Step::Failed(
                "the restore lookup",
                "the entry just saved was not found".into(),
            ));
        }
        self.download(
            hit["signed_download_url"].as_str().unwrap_or_default(),
            payload,
        )
        .await
    }

    async fn twirp_json(&self, method: &'static str, body: Value) -> Result<Value, Step> {
        let res = succeeded(method, self.twirp(method, body).await).await?;
        res.json()
            .await
            .map_err(|e| Step::Failed(method, e.to_string()))
    }

    async fn round_trip_v1(&self, payload: &[u8]) -> Result<(), Step> {
        let send = |req: reqwest::RequestBuilder| async move {
            req.bearer_auth(&self.token)
                .header(header::ACCEPT, "application/json;api-version=6.0-preview.1")
                .send()
                .await
        };
        let step = "POST caches (reserve)";
        let res = send(
            self.http
                .post(self.v1("caches"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(
                    json!({ "key": self.key, "version": self.version, "cacheSize": payload.len() })
                        .to_string(),
                ),
        )
        .await
        .map_err(|e| Step::Failed(step, e.to_string()))?;
        let status = res.status();
        if !status.is_success() {
            let message = message_of(res).await;
            if message.contains("write denied") {
                return Err(Step::WriteDenied(message));
            }
            return Err(Step::Failed(step, format!("{status} {message}")));
        }
        let reserved: Value = res
            .json()
            .await
            .map_err(|e| Step::Failed(step, e.to_string()))?;
        let id = reserved["cacheId"].as_i64().unwrap_or(0);
        succeeded(
            "PATCH caches/{id} (upload)",
            send(
                self.http
                    .patch(self.v1(&format!("caches/{id}")))
                    .header(header::CONTENT_TYPE, "application/octet-stream")
                    .header(
                        header::CONTENT_RANGE,
                        format!("bytes 0-{}/*", payload.len() - 1),
                    )
                    .body(payload.to_vec()),
            )
            .await,
        )
        .await?;
        succeeded(
            "POST caches/{id} (commit)",
            send(
                self.http
                    .post(self.v1(&format!("caches/{id}")))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(json!({ "size": payload.len() }).to_string()),
            )
            .await,
        )
        .await?;
        let step = "GET cache (restore lookup)";
        let res = self
            .lookup_request()
            .await
            .map_err(|e| Step::Failed(step, e.to_string()))?;
        if res.status() != StatusCode::OK {
            return Err(Step::Failed(
                step,
                format!("{}: the entry just saved was not found", res.status()),
            ));
        }
        let hit: Value = res
            .json()
            .await
            .map_err(|e| Step::Failed(step, e.to_string()))?;
        self.download(hit["archiveLocation"].as_str().unwrap_or_default(), payload)
            .await
    }

    async fn download(&self, url: &str, expected: &[u8]) -> Result<(), Step> {
        let step = "the download";
        let res = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| Step::Failed(step, e.to_string()))?;
        if res.status() != StatusCode::OK {
            return Err(Step::Failed(
                step,
                format!("{} {}", res.status(), message_of(res).await),
            ));
        }
        let bytes = res
            .bytes()
            .await
            .map_err(|e| Step::Failed(step, e.to_string()))?;
        if bytes.as_ref() != expected {
            return Err(Step::Failed(
                step,
                "the restored bytes differ from the saved ones".into(),
            ));
        }
        Ok(())
    }
}

/// A step's answer if it is a success; else where and how it failed.
async fn succeeded(step: &'static str, sent: reqwest::Result<Response>) -> Result<Response, Step> {
    let res = sent.map_err(|e| Step::Failed(step, e.to_string()))?;
    if !res.status().is_success() {
        return Err(Step::Failed(
            step,
            format!("{} {}", res.status(), message_of(res).await),
        ));
    }
    Ok(res)
}

/// Where a save and restore stopped.
enum Step {
    /// The token may not save: not a failure of the set-up.
    WriteDenied(String),
    Failed(&'static str, String),
}
