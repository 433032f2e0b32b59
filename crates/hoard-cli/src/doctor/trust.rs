//! What `hoard doctor` trusts over HTTPS: what the Node client (`@actions/cache`) trusts, so
//! that doctor fails exactly when the client would. Node trusts the system store (here as
//! `rustls-native-certs` finds it, `SSL_CERT_FILE`/`SSL_CERT_DIR` included) plus the PEM file
//! `NODE_EXTRA_CA_CERTS` names, and accepts a server certificate that is itself one of those
//! trusted certificates even if it says `CA:TRUE` (what `openssl req -x509` makes by default),
//! where webpki refuses it (`CaUsedAsEndEntity`). Such a certificate must still be in its
//! validity period and name the host, as Node checks.
//!
//! When the handshake fails, [`problem`] names the certificate problem and its fix.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// A TLS configuration trusting what Node trusts; `extra_ca_certs` is `NODE_EXTRA_CA_CERTS`.
/// Also returns what could not be read, for a warning (Node too only warns about it).
pub fn client_config(extra_ca_certs: Option<&str>) -> Result<(ClientConfig, Vec<String>), String> {
    let mut unread = Vec::new();
    let native = rustls_native_certs::load_native_certs();
    unread.extend(native.errors.iter().map(|e| e.to_string()));
    let mut trusted = native.certs;
    if let Some(path) = extra_ca_certs.filter(|p| !p.is_empty()) {
        match CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        {
            Ok(certs) if certs.is_empty() => {
                unread.push(format!("NODE_EXTRA_CA_CERTS={path} holds no certificate"))
            }
            Ok(certs) => trusted.extend(certs),
            Err(e) => unread.push(format!("cannot read NODE_EXTRA_CA_CERTS={path}: {e}")),
        }
    }
    let mut roots = RootCertStore::empty();
    // A certificate webpki cannot take as an anchor is skipped, as Node skips what it cannot
    // parse.
    let _ = roots.add_parsable_certificates(trusted.iter().cloned());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("no usable trusted certificate on this machine: {e}"))?;
    let verifier = AsNodeDoes { trusted, webpki };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok((config, unread))
}

/// webpki's verification, except that a server certificate byte-equal to a trusted one is not
/// refused for being a CA certificate.
#[derive(Debug)]
struct AsNodeDoes {
    trusted: Vec<CertificateDer<'static>>,
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for AsNodeDoes {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match verified {
            // webpki checks the validity period before the basic constraints: a certificate
            // refused as a CA was in its period. Its name is checked here instead.
            Err(e) if is_ca_used_as_end_entity(&e) && self.is_trusted(end_entity) => {
                let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
                rustls::client::verify_server_name(&parsed, server_name)?;
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

impl AsNodeDoes {
    fn is_trusted(&self, cert: &CertificateDer<'_>) -> bool {
        self.trusted.iter().any(|t| t.as_ref() == cert.as_ref())
    }
}

/// rustls passes webpki's `CaUsedAsEndEntity` on as an opaque error that only its text names.
fn is_ca_used_as_end_entity(e: &rustls::Error) -> bool {
    matches!(e, rustls::Error::InvalidCertificate(CertificateError::Other(other))
        if other.to_string().contains("CaUsedAsEndEntity"))
}

/// The TLS error somewhere in `e`'s causes (an I/O error carries its cause inside, which its
/// `source` skips).
pub fn tls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(tls) = c.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        cause = match c
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => c.source(),
        };
    }
    None
}

/// The one-line `openssl` command that makes a proper self-signed server certificate for
/// `host` (not a CA, named by its subjectAltName, for server authentication).
fn make_one(host: &str) -> String {
    let san = if host.parse::<std::net::IpAddr>().is_ok() {
        format!("IP:{host}")
    } else {
        format!("DNS:{host}")
    };
    format!(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 \
         -subj /CN={host} -addext subjectAltName={san} -addext basicConstraints=critical,CA:FALSE \
         -addext extendedKeyUsage=serverAuth -keyout key.pem -out cert.pem"
    )
}

/// A name as webpki presents it (`DnsName("example.com")`): the part in quotes, if any.
fn unquoted(presented: &str) -> &str {
    match (presented.find('"'), presented.rfind('"')) {
        (Some(start), Some(end)) if start < end => &presented[start + 1..end],
        _ => presented,
    }
}

/// A certificate's time, as HTTP dates are written.
fn date(time: UnixTime) -> String {
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(time.as_secs()))
}

/// What is wrong with the server's certificate, and the fix, in words a person can act on;
/// `None` for a TLS failure that is not about the certificate.
pub fn problem(e: &rustls::Error, host: &str) -> Option<(String, String)> {
    let rustls::Error::InvalidCertificate(cert) = e else {
        return None;
    };
    let reload = "hoard reads --tls-cert again on SIGHUP";
    Some(match cert {
        CertificateError::Expired => (
            "the server's certificate has expired".to_owned(),
            format!("renew the certificate behind --tls-cert ({reload}), or check this machine's clock"),
        ),
        CertificateError::ExpiredContext { not_after, .. } => (
            format!("the server's certificate expired on {}", date(*not_after)),
            format!("renew the certificate behind --tls-cert ({reload}), or check this machine's clock"),
        ),
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => (
            "the server's certificate is not valid yet".to_owned(),
            "check the clocks of this machine and of the machine that made the certificate".to_owned(),
        ),
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => (
            match cert {
                CertificateError::NotValidForNameContext { presented, .. } if !presented.is_empty() => {
                    let names: Vec<&str> = presented.iter().map(|n| unquoted(n)).collect();
                    format!("the server's certificate does not name {host}: it names {}", names.join(", "))
                }
                _ => format!("the server's certificate does not name {host}"),
            },
            format!(
                "use a URL with a host name the certificate holds (its subjectAltName), or make one that names {host}: {} ({reload})",
                make_one(host)
            ),
        ),
        CertificateError::UnknownIssuer => (
            "this machine does not trust the server's certificate (unknown issuer)".to_owned(),
            "give the client the certificate of the CA that signed it, or the self-signed certificate itself: NODE_EXTRA_CA_CERTS=/path/to/ca.pem (doctor reads it too), or add it to the system trust store".to_owned(),
        ),
        _ if is_ca_used_as_end_entity(e) => (
            "the server's certificate is a CA certificate (CA:TRUE, as `openssl req -x509` makes by default), and this machine does not trust it as itself".to_owned(),
            format!(
                "trust that very certificate as the client will (NODE_EXTRA_CA_CERTS=/path/to/cert.pem), or make a proper server certificate: {} ({reload})",
                make_one(host)
            ),
        ),
        other => (
            format!("the server's certificate was refused: {other}"),
            format!("check the certificate behind --tls-cert: openssl x509 -noout -text -in cert.pem; a proper one: {}", make_one(host)),
        ),
    })
}
