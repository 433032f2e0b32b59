//! What every handler shares: the HTTP layer's settings ([`ApiConfig`]) and the state built
//! before the port is bound ([`AppState`]: the domain, the link signer, the callers' verifier).

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use tokio_util::sync::CancellationToken;
use url::Url;

use super::{admin, proxy};
use crate::auth::{Callers, UrlSigner};
use crate::cache::Cache;
use crate::config::Limits;
use crate::secret::Secret;

/// What the HTTP layer needs to know of the configuration.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Base of signed links; `None` means "the origin the request came to".
    pub public_url: Option<Url>,
    pub upload_url_ttl: Duration,
    pub download_url_ttl: Duration,
    /// Start-up warnings also reported by `/readyz` (e.g. token verification being off).
    pub warnings: Vec<String>,
    pub limits: Limits,
    /// Whether hoard itself serves HTTPS: links are then `https`.
    pub tls: bool,
    /// Where requests that are not hoard's own go; `None` answers them with 404.
    pub upstream: Option<proxy::Upstream>,
    /// The cache a local miss is read through (`--upstream-cache`).
    pub upstream_cache: Option<Arc<super::read_through::UpstreamCache>>,
    /// Turns on the admin API and dashboard (`None`: both answer 404).
    pub admin_token: Option<Secret>,
    /// Turns on the GitHub webhook receiver (`None`: it answers 404).
    pub github_webhook_secret: Option<Secret>,
    /// Whether `/metrics` is served on its own address instead (then 404 here).
    pub metrics_elsewhere: bool,
    /// When the server started, for `status`.
    pub started: std::time::SystemTime,
    pub backends: admin::Backends,
    /// Answer plain downloads with a redirect to the object store (`--direct-downloads`).
    pub direct_downloads: bool,
    /// Peers whose `X-Forwarded-For` names the client (`--trusted-proxies`).
    pub trusted_proxies: super::origin::TrustedProxies,
}

/// Shared state of every handler; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    config: ApiConfig,
    cache: Cache,
    signer: UrlSigner,
    callers: Callers,
    shutdown: CancellationToken,
}

impl AppState {
    pub fn new(
        config: ApiConfig,
        cache: Cache,
        signer: UrlSigner,
        callers: Callers,
        shutdown: CancellationToken,
    ) -> Self {
        Self(Arc::new(Inner {
            config,
            cache,
            signer,
            callers,
            shutdown,
        }))
    }
    pub(super) fn config(&self) -> &ApiConfig {
        &self.0.config
    }
    pub fn cache(&self) -> &Cache {
        &self.0.cache
    }
    /// Cancelled when the server begins to shut down (`/readyz` then answers 503).
    pub(super) fn shutdown(&self) -> &CancellationToken {
        &self.0.shutdown
    }
    pub(super) fn signer(&self) -> &UrlSigner {
        &self.0.signer
    }
    /// Whether a request that is not hoard's own must still never be forwarded upstream:
    /// its first path segment is, or starts with, a namespace's secret, or its
    /// `Authorization` carries the admin token (sent to a misspelled admin path).
    pub(super) fn keeps_to_itself(&self, path: &str, headers: &HeaderMap) -> bool {
        let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
        if self.0.callers.namespaces.guards(first) {
            return true;
        }
        let Some(token) = &self.0.config.admin_token else {
            return false;
        };
        headers
            .get_all(axum::http::header::AUTHORIZATION)
            .iter()
            .any(|value| carries(value.as_bytes(), token))
    }

    /// Identifies a caller (see [`Callers::identify`]), counts how, and audits a refusal.
    pub(super) async fn identify(
        &self,
        headers: &HeaderMap,
        prefix: &str,
        address: Option<std::net::IpAddr>,
    ) -> Result<crate::auth::Caller, crate::auth::CallerError> {
        let caller = self.0.callers.identify(headers, prefix, address).await;
        let metrics = self.cache().metrics();
        match &caller {
            Ok(c) => metrics.caller(c.how),
            Err(e) => {
                metrics.caller("refused");
                tracing::info!(target: "hoard::audit", action = "refused", reason = %crate::model::LogSafe(&e.to_string()));
            }
        }
        caller
    }
}

/// Whether an `Authorization` value is `token`, alone or after any scheme (`Bearer`, `token`,
/// …), in any case and spacing, or as the user or the password of `Basic` credentials (as git
/// and curl send a token). Compared as the admin API compares it ([`Secret::matches`]).
fn carries(value: &[u8], token: &Secret) -> bool {
    use base64::Engine as _;
    let value = value.trim_ascii();
    if token.matches(value) {
        return true;
    }
    let Some(at) = value.iter().position(|b| b.is_ascii_whitespace()) else {
        return false;
    };
    let (scheme, credentials) = (&value[..at], value[at..].trim_ascii());
    if token.matches(credentials) {
        return true;
    }
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return false;
    }
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(credentials) else {
        return false;
    };
    decoded
        .iter()
        .position(|b| *b == b':')
        .is_some_and(|at| token.matches(&decoded[..at]) || token.matches(&decoded[at + 1..]))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_admin_token_is_recognised_under_any_scheme() {
        let token = crate::secret::Secret::new(b"s3cret".to_vec());
        for value in [
            "Bearer s3cret",
            "bearer  s3cret ",
            "token s3cret",
            "s3cret",
            "BEARER\ts3cret",
        ] {
            assert!(super::carries(value.as_bytes(), &token), "{value:?}");
        }
        // Basic credentials: base64 of "x-access-token:s3cret" and of "s3cret:".
        for value in ["Basic eC1hY2Nlc3MtdG9rZW46czNjcmV0", "basic czNjcmV0Og=="] {
            assert!(super::carries(value.as_bytes(), &token), "{value:?}");
        }
        for value in [
            "Bearer s3cre",
            "Bearer s3cretx",
            "Bearer other",
            "",
            // "user:s3cretx", and a Basic value that is not base64.
            "Basic dXNlcjpzM2NyZXR4",
            "Basic s3cret:",
        ] {
            assert!(!super::carries(value.as_bytes(), &token), "{value:?}");
        }
    }
}
