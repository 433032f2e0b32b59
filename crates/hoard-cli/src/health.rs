//! `hoard health`: asks a server's `/readyz` and exits 0 only if it answers 200. The container
//! image has no shell and no HTTP client, so this is what Compose, Podman and Kubernetes exec
//! probes run inside it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use url::Url;

/// Where `hoard health` asks when not given `--url`: this machine, on the port the server
/// listens on (HOARD_LISTEN, 3000 by default), over HTTPS when the server has a certificate.
pub fn default_url(listen: Option<&str>, tls: bool) -> Result<Url, String> {
    let listen = listen.unwrap_or("0.0.0.0:3000");
    let addr: SocketAddr = listen.parse().map_err(|_| {
        format!("HOARD_LISTEN must be an IP address and port such as 0.0.0.0:3000, not {listen:?}; or give --url")
    })?;
    // A server on every interface answers on loopback.
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let scheme = if tls { "https" } else { "http" };
    Url::parse(&format!(
        "{scheme}://{}/readyz",
        SocketAddr::new(ip, addr.port())
    ))
    .map_err(|e| format!("cannot make the /readyz URL from {listen}: {e}"))
}

/// Asks `url` once. `Ok` with the server's status line when it answered 200, otherwise the
/// reason in one sentence.
pub async fn check(url: &Url, timeout: Duration) -> Result<String, String> {
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .no_proxy()
        // The server's own certificate names the host runners use, not the loopback address
        // this asks; the probe checks that the server answers, not who it is.
        .danger_accept_invalid_certs(is_loopback(url))
        .build()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
    let response = client
        .get(url.clone())
        .send()
        .await
        .map_err(|e| format!("{url} did not answer: {e}"))?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    let summary = body.trim();
    if status == reqwest::StatusCode::OK {
        Ok(format!("{url}: {status} {summary}"))
    } else {
        Err(format!("{url} answered {status}: {summary}"))
    }
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name == "localhost",
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_interface_is_asked_on_loopback_at_the_listen_port() {
        let url = default_url(Some("0.0.0.0:8080"), false).unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:8080/readyz");
        let url = default_url(Some("[::]:3000"), true).unwrap();
        assert_eq!(url.as_str(), "https://[::1]:3000/readyz");
        let url = default_url(Some("10.1.2.3:3000"), false).unwrap();
        assert_eq!(url.as_str(), "http://10.1.2.3:3000/readyz");
    }

    #[test]
    fn the_image_default_is_port_3000() {
        let url = default_url(None, false).unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:3000/readyz");
    }

    #[test]
    fn a_listen_address_that_is_not_one_is_refused_with_the_way_out() {
        let err = default_url(Some("localhost:3000"), false).unwrap_err();
        assert!(err.contains("--url"), "{err}");
    }

    #[test]
    fn only_loopback_certificates_go_unchecked() {
        assert!(is_loopback(&Url::parse("https://127.0.0.1:3000/").unwrap()));
        assert!(is_loopback(&Url::parse("https://[::1]:3000/").unwrap()));
        assert!(is_loopback(&Url::parse("https://localhost:3000/").unwrap()));
        assert!(!is_loopback(
            &Url::parse("https://cache.internal:3000/").unwrap()
        ));
        assert!(!is_loopback(&Url::parse("https://10.0.0.1:3000/").unwrap()));
    }
}
