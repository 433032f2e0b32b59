//! HTTPS without a separate proxy (`--tls-cert`, `--tls-key`): rustls with the ring provider,
//! HTTP/2 or HTTP/1.1 by ALPN. The certificate and key are read at start-up and again on
//! SIGHUP, so a renewed certificate is served without a restart; a reload that fails keeps the
//! certificate in use.

use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Where the PEM files are: named by the configuration, read here.
pub use crate::config::TlsFiles;

impl TlsFiles {
    /// Reads both files into a server configuration.
    pub fn load(&self) -> Result<Arc<ServerConfig>, String> {
        let certs = CertificateDer::pem_file_iter(&self.cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("--tls-cert {}: {e}", self.cert.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "--tls-cert {} holds no certificate",
                self.cert.display()
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| format!("--tls-key {}: {e}", self.key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| format!("--tls-cert and --tls-key do not make a usable pair: {e}"))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The configuration new connections get; replaced whole on reload, so a handshake under way
/// keeps the one it started with.
#[derive(Debug)]
pub struct Reloadable {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
}

impl Reloadable {
    pub fn new(files: TlsFiles) -> Result<Self, String> {
        let current = RwLock::new(files.load()?);
        Ok(Self { files, current })
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = self.current.read().unwrap_or_else(|p| p.into_inner());
        tokio_rustls::TlsAcceptor::from(config.clone())
    }

    /// Reads the files again; on failure the certificate in use stays.
    pub fn reload(&self) -> Result<(), String> {
        let fresh = self.files.load()?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    pub fn cert_path(&self) -> &Path {
        &self.files.cert
    }
}
