//! hoard's server: a self-hosted cache server for GitHub Actions.
//!
//! `api` turns HTTP into calls on `cache` (the rules), which talks to `meta` (metadata) and
//! `blob` (chunk bytes) through traits; `auth` reads tokens and signs links (DESIGN.md §3).
//! The records it shares with the clients are `hoard-model`'s, seen here as `model`.

pub mod api;
pub mod auth;
pub mod blob;
pub mod cache;
pub mod config;
mod conn;
pub mod meta;
pub mod metrics;
pub mod secret;
pub mod tls;

pub use hoard_model as model;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::{ApiConfig, AppState};
use crate::auth::{Callers, UrlSigner, Verifier};
use crate::blob::FsStore;
use crate::cache::{Cache, Policy};
use crate::config::Config;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "cannot open the metadata database {url} (--database-url, HOARD_DATABASE_URL): {source}"
    )]
    Meta {
        url: String,
        source: meta::MetaError,
    },
    #[error("cannot open the chunk store (--storage-url, HOARD_STORAGE_URL): {0}")]
    Blob(#[from] blob::BlobError),
    #[error("--direct-downloads (HOARD_DIRECT_DOWNLOADS) needs storage credentials that can presign links: {0}")]
    DirectDownloads(String),
    #[error("start-up recovery failed: {0}")]
    Recover(#[from] cache::CacheError),
    #[error("{0}")]
    Upstream(String),
    #[error("{0}")]
    Tls(String),
    #[error("cannot load the URL signing key: {0}")]
    SigningKey(std::io::Error),
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// Warning shown at start-up and on `/readyz` when token checks are turned off.
pub const UNVERIFIED_TOKENS_WARNING: &str =
    "--insecure-skip-token-validation is set: runtime tokens are read without checking their signature, so any client that can reach this server can read and write any repository's entries";

/// Opens storage and metadata (running migrations) and builds the domain on them: what
/// `serve`, `gc` and `verify` share.
pub async fn open_cache(config: &Config) -> Result<Cache, ServeError> {
    std::fs::create_dir_all(&config.data_dir).map_err(|source| ServeError::DataDir {
        path: config.data_dir.display().to_string(),
        source,
    })?;
    let meta = meta::open_with(&config.database, config.database_pool)
        .await
        .map_err(|source| ServeError::Meta {
            url: config.database.redacted(),
            source,
        })?;
    let blobs: Arc<dyn blob::BlobStore> = match &config.storage {
        config::Storage::Dir(dir) => {
            Arc::new(FsStore::open(dir)?.with_transfer_memory(config.transfer_memory))
        }
        config::Storage::Object(url) => Arc::new(blob::ObjectStorage::open(url).await?),
    };
    // Every database and storage operation is timed for /metrics.
    let metrics = Arc::new(
        metrics::Metrics::new()
            .with_routes(api::ROUTE_LABELS)
            .with_repositories(config.metrics_repositories)
            .with_families(config.metrics_families),
    );
    let meta = Arc::new(meta::Timed::new(meta, metrics.clone()));
    let blobs = Arc::new(blob::Timed::new(blobs, metrics.clone()));
    Ok(Cache::new(
        meta,
        blobs,
        Policy {
            reservation_ttl: config.reservation_ttl,
            sync_interval: config.sync_interval,
            max_open_uploads: config.limits.max_open_uploads,
            max_entry_size: config.limits.max_entry_size,
            lookup_cache_ttl: config.lookup_cache_ttl,
            lifecycle: config.lifecycle.clone(),
            stats_max_families: config.stats_max_families,
        },
        config.clock.clone(),
    )
    .with_metrics(metrics))
}

/// The most an HTTP/1 connection buffers of a request at once (see `serve`).
const READ_BUFFER: usize = 64 << 10;

/// Opens storage and metadata (running migrations) and builds the handlers' state, so that bad
/// settings fail before the port is bound.
pub async fn build_state(
    config: &Config,
    shutdown: CancellationToken,
) -> Result<AppState, ServeError> {
    let cache = open_cache(config).await?;
    let signer = match &config.signing_key {
        Some(key) => UrlSigner::new(key.clone()),
        None => {
            UrlSigner::load_or_create(&config.signing_key_file).map_err(ServeError::SigningKey)?
        }
    }
    .with_clock(config.clock.clone());
    cache.recover().await?;
    if let Some(policy) = &config.policy {
        log_policy("write policy loaded", policy);
        cache.set_write_policy(policy.clone());
        pair_names_for_policy(&cache).await;
    }
    if config.direct_downloads {
        cache
            .can_presign()
            .await
            .map_err(ServeError::DirectDownloads)?;
    }
    let mut warnings = Vec::new();
    if config.tokens.insecure_skip_validation {
        warnings.push(UNVERIFIED_TOKENS_WARNING.to_owned());
    }
    if config.anonymous.is_some() {
        warnings.push(auth::callers::ANONYMOUS_WARNING.to_owned());
    }
    if let Some(token) = &config.admin_token {
        if token.len() < config::SHORT_ADMIN_TOKEN {
            warnings.push(config::SHORT_ADMIN_TOKEN_WARNING.to_owned());
        }
    }
    let api = ApiConfig {
        public_url: config.public_url.clone(),
        upload_url_ttl: config.upload_url_ttl,
        download_url_ttl: config.download_url_ttl,
        warnings,
        limits: config.limits.clone(),
        tls: config.tls.is_some(),
        admin_token: config.admin_token.clone(),
        github_webhook_secret: config.github_webhook_secret.clone(),
        metrics_elsewhere: config.metrics_listen.is_some(),
        started: std::time::SystemTime::now(),
        backends: api::admin::Backends {
            database: match config.database {
                meta::DatabaseUrl::Sqlite(_) => "sqlite",
                meta::DatabaseUrl::Postgres(_) => "postgres",
                meta::DatabaseUrl::MySql(_) => "mysql",
            },
            storage: cache.storage_kind(),
        },
        direct_downloads: config.direct_downloads,
        trusted_proxies: api::origin::TrustedProxies::new(config.trusted_proxies.clone()),
        upstream_cache: match &config.upstream_cache {
            Some(upstream) => Some(Arc::new(
                api::read_through::UpstreamCache::new(upstream, config.limits.idle_timeout)
                    .map_err(ServeError::Upstream)?,
            )),
            None => None,
        },
        upstream: match &config.upstream_results_url {
            Some(url) => Some(
                api::proxy::Upstream::new(url.clone(), config.limits.idle_timeout)
                    .map_err(ServeError::Upstream)?,
            ),
            None => None,
        },
    };
    Ok(AppState::new(
        api,
        cache,
        signer.clone(),
        Callers {
            tokens: Verifier::new(config.tokens.clone())
                .with_clock(config.clock.clone())
                .with_tool_tokens(signer),
            forgejo: config.forgejo.clone(),
            namespaces: config.namespaces.clone(),
            anonymous: config.anonymous,
        },
        shutdown,
    ))
}

/// Serves `/metrics` alone on `listener` (`--metrics-listen`) until `shutdown`.
pub async fn serve_metrics(state: AppState, listener: TcpListener, shutdown: CancellationToken) {
    let router = api::metrics_router(state);
    if let Err(e) = axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
    {
        tracing::error!("the metrics listener stopped: {e}");
    }
}

/// Pairs repository ids with the names the store knows, for the policy just put in force,
/// and warns of each rule by name that no token has tied to an id yet.
async fn pair_names_for_policy(cache: &Cache) {
    if let Err(e) = cache.learn_repository_names().await {
        tracing::warn!(error = %e, "cannot read the repositories' names; policy rules by name apply once tokens name them");
    }
    for warning in cache.policy_warnings() {
        tracing::warn!("{warning}");
    }
}

/// One info line for a policy put in force: `<what> from <path>: N rules`.
fn log_policy(what: &str, policy: &cache::policy::Policy) {
    let source = policy
        .source
        .as_deref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let rules = policy.rules.len();
    tracing::info!(policy = %source, rules, "{what} from {source}: {rules} rules");
}

/// Reads the write policy file again and puts it in force on `cache`; a file that does not
/// parse leaves the policy in force as it is and says why, in one sentence naming the file.
/// Either outcome is kept for `hoard status`, `/readyz`, the admin API and the metrics.
pub fn reload_policy(
    cache: &Cache,
    path: &std::path::Path,
) -> Result<(), cache::policy::PolicyError> {
    let rules = cache.reload_write_policy(path)?;
    let source = path.display().to_string();
    tracing::info!(policy = %source, rules, "SIGHUP: policy reloaded from {source}: {rules} rules");
    Ok(())
}

/// On each SIGHUP until `stop`, reads again what can be reloaded: the TLS certificate and key,
/// and the write policy file, each logging one line. Without either, SIGHUP (a service
/// manager's reload) is logged and otherwise ignored rather than ending the process.
async fn reload_on_sighup(
    tls: Option<Arc<tls::Reloadable>>,
    policy: Option<(std::path::PathBuf, Cache)>,
    stop: CancellationToken,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(
                "cannot watch SIGHUP, TLS certificates and the policy file will not be reloaded: {e}"
            );
            return;
        }
    };
    loop {
        tokio::select! {
            Some(()) = hangups.recv() => {
                if let Some(t) = tls.as_deref() {
                    match t.reload() {
                        Ok(()) => tracing::info!(cert = %t.cert_path().display(), "SIGHUP: TLS certificate reloaded"),
                        Err(e) => tracing::error!("SIGHUP: TLS certificate not reloaded, the previous one stays: {e}"),
                    }
                }
                if let Some((path, cache)) = &policy {
                    match reload_policy(cache, path) {
                        Ok(()) => pair_names_for_policy(cache).await,
                        Err(e) => tracing::error!("SIGHUP: policy not reloaded, the previous one stays: {e}"),
                    }
                }
                if tls.is_none() && policy.is_none() {
                    tracing::info!("SIGHUP: nothing to reload (no --tls-cert or --policy-file)");
                }
            }
            () = stop.cancelled() => return,
        }
    }
}

/// Serves on `listener` until `shutdown` is cancelled, then lets in-flight requests finish for
/// up to `config.shutdown_timeout`.
///
/// The accept loop is hyper's own rather than `axum::serve`, for the settings axum does not
/// expose: a header read timeout against slow clients, and HTTP/1 and h2c on one port.
pub async fn serve(
    config: &Config,
    state: AppState,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    use hyper_util::rt::{TokioExecutor, TokioTimer};
    use hyper_util::server::conn::auto;

    let background = state.cache().spawn_background(shutdown.clone());
    let tls = match &config.tls {
        Some(files) => Some(Arc::new(
            tls::Reloadable::new(files.clone()).map_err(ServeError::Tls)?,
        )),
        None => None,
    };
    let policy = config
        .policy
        .as_ref()
        .and_then(|p| p.source.clone())
        .map(|path| (path, state.cache().clone()));
    tokio::spawn(reload_on_sighup(tls.clone(), policy, shutdown.clone()));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.limits.header_timeout)
        // A connection's read buffer grows to at most this size (hyper's default is about 400
        // KiB). Larger buffers, freed as connections come and go, were what glibc's per-thread
        // arenas held on to when 64 jobs uploaded at once (the fleet's peak memory was about 70
        // MiB with 256 KiB, 45 MiB with 64 KiB). It bounds a request's headers too: a request
        // whose headers are larger is refused with 431 before it is read, and real tokens are
        // a few KiB.
        .max_buf_size(READ_BUFFER)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let app = conn::App {
        metrics: state.cache().metrics().clone(),
        traffic: state.cache().traffic(),
        router: api::router(state),
    };
    let connections = conn::Connections::new(
        builder,
        app,
        tls,
        config.limits.header_timeout,
        shutdown.clone(),
    );
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        connections.serve(stream);
    }
    drop(listener);
    let grace = config.shutdown_timeout;
    if !connections.drain(grace).await {
        tracing::warn!("in-flight requests did not finish within {grace:?}; stopping anyway");
    }
    let _ = background.await;
    Ok(())
}
