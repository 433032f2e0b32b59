//! Where a request comes from, as provenance records it: the connection's peer, or, when the
//! peer is a proxy the operator trusts (`--trusted-proxies`), the first hop of
//! `X-Forwarded-For` that is not itself trusted. A client can write anything in that header,
//! so it is read only from trusted peers, and right to left: each trusted proxy appends the
//! address it saw, and the first address no trusted proxy vouches for is the client.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use ipnet::IpNet;

use super::AppState;

/// The connection's peer, put on each request by the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// The networks whose `X-Forwarded-For` is believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    pub fn new(nets: Vec<IpNet>) -> Self {
        Self(nets)
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        // An IPv4 address that arrived as IPv4-mapped IPv6 (a dual-stack listener) as IPv4.
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }
}

/// The client's address for a request from `peer` carrying `headers`: the peer's, unless it
/// is trusted and `X-Forwarded-For` names an untrusted hop. `None` when the peer is unknown.
/// An address, not text: only a save formats it, lookups never pay for that.
pub fn client_address(
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
) -> Option<IpAddr> {
    let peer = peer?.ip().to_canonical();
    if !trusted.trusts(peer) {
        return Some(peer);
    }
    // Every X-Forwarded-For line, in order, as one list of hops; the nearest is last.
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        // A hop that is not an address (a proxy's "unknown", garbage): nothing beyond it can
        // be believed, so the last trusted address stands.
        // Some proxies append the port (`203.0.113.7:4711`, `[2001:db8::1]:443`).
        let parsed = hop
            .parse::<IpAddr>()
            .or_else(|_| hop.parse::<SocketAddr>().map(|a| a.ip()));
        let Ok(ip) = parsed else {
            break;
        };
        client = ip.to_canonical();
        if !trusted.trusts(client) {
            break;
        }
    }
    Some(client)
}

/// The client's address, for handlers (see [`client_address`]).
#[derive(Debug, Clone, Copy)]
pub struct ClientAddress(pub Option<IpAddr>);

impl FromRequestParts<AppState> for ClientAddress {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, Infallible> {
        let peer = parts.extensions.get::<Peer>().map(|p| p.0);
        Ok(Self(client_address(
            peer,
            &parts.headers,
            &app.config().trusted_proxies,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    fn trusting(nets: &[&str]) -> TrustedProxies {
        TrustedProxies::new(nets.iter().map(|n| n.parse().unwrap()).collect())
    }

    fn peer(ip: &str) -> Option<SocketAddr> {
        Some(SocketAddr::new(ip.parse().unwrap(), 40000))
    }

    #[test]
    fn an_untrusted_peers_forwarded_for_is_ignored() {
        let trusted = trusting(&["10.0.0.0/8"]);
        let forged = headers(&["203.0.113.9"]);
        assert_eq!(
            client_address(peer("192.0.2.7"), &forged, &trusted)
                .unwrap()
                .to_string(),
            "192.0.2.7"
        );
        let none = TrustedProxies::default();
        assert_eq!(
            client_address(peer("10.0.0.2"), &forged, &none)
                .unwrap()
                .to_string(),
            "10.0.0.2"
        );
    }

    #[test]
    fn a_trusted_proxy_names_the_first_untrusted_hop_from_the_right() {
        let trusted = trusting(&["10.0.0.0/8", "127.0.0.1/32"]);
        // The client forged the first address; the proxies appended the rest.
        let h = headers(&["6.6.6.6, 198.51.100.4", "10.1.1.1"]);
        assert_eq!(
            client_address(peer("127.0.0.1"), &h, &trusted)
                .unwrap()
                .to_string(),
            "198.51.100.4"
        );
        // Only trusted hops: the farthest one is the client.
        let h = headers(&["10.2.2.2, 10.1.1.1"]);
        assert_eq!(
            client_address(peer("10.0.0.1"), &h, &trusted)
                .unwrap()
                .to_string(),
            "10.2.2.2"
        );
        // No header: the proxy itself.
        assert_eq!(
            client_address(peer("10.0.0.1"), &HeaderMap::new(), &trusted)
                .unwrap()
                .to_string(),
            "10.0.0.1"
        );
        // Hops with ports are read too.
        let h = headers(&["[2001:db8::5]:443, 198.51.100.4:4711"]);
        assert_eq!(
            client_address(peer("10.0.0.1"), &h, &trusted)
                .unwrap()
                .to_string(),
            "198.51.100.4"
        );
        // Garbage stops the walk at the last trusted address.
        let h = headers(&["198.51.100.4, unknown"]);
        assert_eq!(
            client_address(peer("10.0.0.1"), &h, &trusted)
                .unwrap()
                .to_string(),
            "10.0.0.1"
        );
    }

    #[test]
    fn mapped_ipv4_peers_are_shown_and_matched_as_ipv4() {
        let trusted = trusting(&["127.0.0.0/8"]);
        let h = headers(&["198.51.100.4"]);
        assert_eq!(
            client_address(peer("::ffff:127.0.0.1"), &h, &trusted)
                .unwrap()
                .to_string(),
            "198.51.100.4"
        );
        assert_eq!(
            client_address(peer("::ffff:192.0.2.1"), &HeaderMap::new(), &trusted)
                .unwrap()
                .to_string(),
            "192.0.2.1"
        );
    }
}
