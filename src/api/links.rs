//! Signed blob links handed to clients (PROTOCOL.md §3.2):
//! `<base>/_blob/<kind>/<id>?se=<expiry>&ct=<row creation>&sig=…`. The link names the row's
//! creation time, which the signature covers, so a request is checked before any row is
//! loaded; the row loaded must then have that creation time (an id reused after a reset opens
//! nothing).
//!
//! Three non-empty path segments satisfy the Azure SDK's URL parser for every host form, and the
//! query is never empty (sccache needs one, §12). The base is `--public-url` if set, else the
//! origin the runner used to reach us (`Host`, `X-Forwarded-Proto`), so a server on all
//! interfaces hands each runner a URL it can reach.

use axum::http::{header, HeaderMap};

use super::AppState;
use crate::auth::{LinkId, LinkTarget, Purpose};

/// The request names no host a link could point at, and `--public-url` is not set.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request has no usable Host header; set --public-url")]
pub struct NoLinkBase;

pub const UPLOAD_PREFIX: &str = "/_blob/uploads/";
pub const DOWNLOAD_PREFIX: &str = "/_blob/entries/";

/// The link to `target`: an upload link for an [`UploadId`](crate::model::UploadId), a
/// download link for an [`EntryId`](crate::model::EntryId).
pub fn signed<Id: LinkId>(
    app: &AppState,
    headers: &HeaderMap,
    target: LinkTarget<Id>,
) -> Result<String, NoLinkBase> {
    use std::fmt::Write as _;
    let (prefix, ttl) = match Id::PURPOSE {
        Purpose::Upload => (UPLOAD_PREFIX, app.config().upload_url_ttl),
        Purpose::Download => (DOWNLOAD_PREFIX, app.config().download_url_ttl),
    };
    let expires = app.signer().now() + ttl.as_secs().max(1);
    // Built in one buffer: every lookup and reservation makes a link.
    let mut link = String::with_capacity(192);
    push_base_url(app, headers, &mut link)?;
    let _ = write!(
        link,
        "{prefix}{}?se={expires}&ct={}&sig=",
        target.id, target.created_at
    );
    app.signer().sign_into(target, expires, &mut link);
    Ok(link)
}

/// HTTP/2 requests name their origin in the `:authority` pseudo-header, not `Host`: copy it
/// over so links are built the same way for both versions.
pub fn host_from_authority(headers: &mut HeaderMap, uri: &axum::http::Uri) {
    if headers.contains_key(header::HOST) {
        return;
    }
    if let Some(value) = uri
        .authority()
        .and_then(|a| axum::http::HeaderValue::from_str(a.as_str()).ok())
    {
        headers.insert(header::HOST, value);
    }
}

/// Appends the scheme and authority (and any path prefix of `--public-url`), without a trailing
/// slash.
fn push_base_url(app: &AppState, headers: &HeaderMap, out: &mut String) -> Result<(), NoLinkBase> {
    if let Some(public) = &app.config().public_url {
        out.push_str(public.as_str().trim_end_matches('/'));
        return Ok(());
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| is_authority(h))
        .ok_or(NoLinkBase)?;
    // hoard terminates TLS itself: the runner came over https, whatever a header says.
    let https = app.config().tls
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .and_then(|p| p.split(',').next())
            .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"));
    out.push_str(if https { "https://" } else { "http://" });
    out.push_str(host);
    Ok(())
}

/// A host[:port] with nothing that could change the URL's structure.
fn is_authority(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']' | b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::is_authority;

    #[test]
    fn only_plain_authorities_are_used_as_link_hosts() {
        assert!(is_authority("cache.internal:3000"));
        assert!(is_authority("10.0.0.5:3000"));
        assert!(is_authority("[::1]:3000"));
        assert!(!is_authority("evil.com/path"));
        assert!(!is_authority("a@b"));
        assert!(!is_authority(""));
    }
}
