//! Query strings of signed links and v1 calls, decoded the way their clients encode them.

use axum::http::Uri;
use percent_encoding::percent_decode_str;

/// Query parameters, percent-decoded without turning `+` into a space: block ids are base64
/// and may carry a literal `+` (PROTOCOL.md §12), and v1 clients encode keys with
/// `encodeURIComponent`, so a literal `+` is a `+`.
pub(super) struct Query(Vec<(String, Vec<u8>)>);

impl Query {
    pub(super) fn parse(uri: &Uri) -> Self {
        let pairs = uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                let key = percent_decode_str(k)
                    .decode_utf8_lossy()
                    .to_ascii_lowercase();
                (key, percent_decode_str(v).collect())
            })
            .collect();
        Self(pairs)
    }

    pub(super) fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    pub(super) fn str(&self, name: &str) -> Option<&str> {
        self.bytes(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}
