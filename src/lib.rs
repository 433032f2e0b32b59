//! hoard: a self-hosted cache server for GitHub Actions.
//!
//! `api` turns HTTP into calls on `cache` (the rules), which talks to `meta` (metadata) and
//! `blob` (chunk bytes) through traits; `auth` reads tokens and signs links (DESIGN.md §3).

pub mod api;
pub mod auth;
pub mod bench;
pub mod blob;
pub mod cache;
pub mod config;
pub mod meta;

use std::future::IntoFuture;
use std::sync::Arc;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::{ApiConfig, AppState};
use crate::auth::{TokenReader, UrlSigner};
use crate::blob::FsStore;
use crate::cache::{Cache, Policy};
use crate::config::Config;
use crate::meta::SqliteStore;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot open the database: {0}")]
    Meta(#[from] meta::MetaError),
    #[error("cannot open the chunk store: {0}")]
    Blob(#[from] blob::BlobError),
    #[error("start-up recovery failed: {0}")]
    Recover(#[from] cache::CacheError),
    #[error("cannot load the URL signing key: {0}")]
    SigningKey(std::io::Error),
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// Warning shown at start-up and on `/readyz` until tokens are verified (issue #4).
pub const UNVERIFIED_TOKENS_WARNING: &str =
    "runtime tokens are decoded without signature verification: any client that can reach this server can read and write any repository's entries";

/// Opens storage and metadata (running migrations) and builds the handlers' state, so that bad
/// settings fail before the port is bound.
pub async fn build_state(
    config: &Config,
    shutdown: CancellationToken,
) -> Result<AppState, ServeError> {
    std::fs::create_dir_all(&config.data_dir).map_err(|source| ServeError::DataDir {
        path: config.data_dir.display().to_string(),
        source,
    })?;
    if let Some(parent) = config
        .sqlite_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).map_err(|source| ServeError::DataDir {
            path: parent.display().to_string(),
            source,
        })?;
    }
    let meta = SqliteStore::open(&config.sqlite_path).await?;
    let blobs = FsStore::open(&config.storage_dir)?;
    let signer = UrlSigner::load_or_create(&config.data_dir.join("signing.key"))
        .map_err(ServeError::SigningKey)?;
    let cache = Cache::new(
        Arc::new(meta),
        Arc::new(blobs),
        Policy {
            reservation_ttl: config.reservation_ttl,
            sync_interval: config.sync_interval,
        },
    );
    cache.recover().await?;
    let api = ApiConfig {
        public_url: config.public_url.clone(),
        upload_url_ttl: config.upload_url_ttl,
        download_url_ttl: config.download_url_ttl,
        warnings: vec![UNVERIFIED_TOKENS_WARNING.to_owned()],
    };
    Ok(AppState::new(api, cache, signer, TokenReader, shutdown))
}

/// Serves on `listener` until `shutdown` is cancelled, then lets in-flight requests finish for
/// up to `config.shutdown_timeout`.
pub async fn serve(
    config: &Config,
    state: AppState,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let background = state.cache().spawn_background(shutdown.clone());
    let server = axum::serve(listener, api::router(state))
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .into_future();
    let grace = config.shutdown_timeout;
    let stopping = shutdown.clone();
    let deadline = async move {
        stopping.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        result = server => result?,
        () = deadline => tracing::warn!("in-flight requests did not finish within {grace:?}; stopping anyway"),
    }
    shutdown.cancel(); // The server may also end on its own (listener error).
    let _ = background.await;
    Ok(())
}
