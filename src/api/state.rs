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
    /// Turns on the admin API and dashboard (`None`: both answer 404).
    pub admin_token: Option<crate::secret::Secret>,
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
                tracing::info!(target: "hoard::audit", action = "refused", reason = %e);
            }
        }
        caller
    }
}
