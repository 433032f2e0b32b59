//! Signed blob links handed to clients (PROTOCOL.md §3.2):
//! `<base>/_blob/<kind>/<id>.<row creation>?se=<expiry>&sig=…`. The link names the row's
//! creation time, which the signature covers, so a request is checked before any row is
//! loaded; the row loaded must then have that creation time (an id reused after a reset opens
//! nothing).
//!
//! Azure SDKs take a link apart and put it back together (azcopy, on the Go SDK, does it for
//! every request), so everything hoard needs survives their SAS parsers: the creation time is
//! in the blob's name, which every SDK keeps; `se` is an ISO-8601 time to the second, which the
//! Go SDK re-encodes in the format it read and the others keep as text; `sig` is unpadded
//! URL-safe base64, which no encoder changes. A parameter no SAS parser knows would not do:
//! Python's drops every parameter it does not know. Links of the previous release
//! (`<id>?se=<Unix seconds>&ct=<row creation>&sig=…`) are still accepted until they expire.
//!
//! Three non-empty path segments satisfy the Azure SDK's URL parser for every host form, and the
//! query is never empty (sccache needs one, §12). The base is `--public-url` if set, else the
//! origin the runner used to reach us (`Host`, `X-Forwarded-Proto`), so a server on all
//! interfaces hands each runner a URL it can reach.

use std::borrow::Cow;

use axum::http::{header, HeaderMap};

use super::query::Query;
use super::AppState;
use crate::auth::signing::{expiry_text, SignatureError, UrlSigner};
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
    let (prefix, ttl) = match Id::PURPOSE {
        Purpose::Upload => (UPLOAD_PREFIX, app.config().upload_url_ttl),
        Purpose::Download => (DOWNLOAD_PREFIX, app.config().download_url_ttl),
    };
    let expires = app.signer().now() + ttl.as_secs().max(1);
    // Built in one buffer: every lookup and reservation makes a link.
    let mut link = String::with_capacity(192);
    push_base_url(app, headers, &mut link)?;
    link.push_str(prefix);
    push_signed_path(app.signer(), target, expires, &mut link);
    Ok(link)
}

/// Appends `<id>.<created>?se=<expiry>&sig=<signature>` (the colons of `se` percent-encoded,
/// as Azure writes them).
fn push_signed_path<Id: LinkId>(
    signer: &UrlSigner,
    target: LinkTarget<Id>,
    expires: u64,
    out: &mut String,
) {
    use std::fmt::Write as _;
    let se = expiry_text(expires).replace(':', "%3A");
    let _ = write!(out, "{}.{}?se={se}&sig=", target.id, target.created_at);
    signer.sign_into(target, expires, out);
}

/// The last segment of a link's path: the row's id, and its creation time for links of this
/// release (`<id>.<created>`); `None` if it names nothing.
pub fn parse_segment(raw: &str) -> Option<(i64, Option<i64>)> {
    let number = |s: &str| {
        (!s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<i64>().ok())
            .flatten()
            .filter(|n| *n > 0)
    };
    match raw.split_once('.') {
        None => Some((number(raw)?, None)),
        Some((id, created)) => Some((number(id)?, Some(number(created)?))),
    }
}

/// What a blob link opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    Upload,
    Download,
}

/// The kind and id segment of a blob link's path, matched after percent-decoding it once, so
/// that `/_blob/uploads%2F19.…` (the Go SDK encodes the `/` in a blob name when the host is a
/// name) routes as `/_blob/uploads/19.…`. The segment is everything after the prefix and must
/// hold no `/`: `..`, a doubled slash or a further segment names nothing, and nothing is ever
/// resolved against another path.
pub fn blob_route(path: &str) -> Option<(LinkKind, Cow<'_, str>)> {
    let decoded = percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .ok()?;
    let (kind, prefix) = if decoded.starts_with(UPLOAD_PREFIX) {
        (LinkKind::Upload, UPLOAD_PREFIX.len())
    } else if decoded.starts_with(DOWNLOAD_PREFIX) {
        (LinkKind::Download, DOWNLOAD_PREFIX.len())
    } else {
        return None;
    };
    let segment = match decoded {
        Cow::Borrowed(p) => Cow::Borrowed(&p[prefix..]),
        Cow::Owned(mut p) => {
            p.drain(..prefix);
            Cow::Owned(p)
        }
    };
    (!segment.is_empty() && !segment.contains('/')).then_some((kind, segment))
}

/// Why a request's link opens nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The path names no row (404).
    NoSuchPath,
    /// The signature is missing, wrong or expired (403).
    Signature(SignatureError),
}

/// Checks the link a request came with, before anything is loaded: `segment` is the last
/// segment of its decoded path, `make` makes the id the link opens. The creation time is the
/// path's (this release) or the `ct` parameter's (links of earlier releases).
pub(super) fn check<Id: LinkId>(
    signer: &UrlSigner,
    segment: &str,
    query: &Query,
    make: impl FnOnce(i64) -> Id,
) -> Result<LinkTarget<Id>, Refused> {
    let (id, created) = parse_segment(segment).ok_or(Refused::NoSuchPath)?;
    let created_at = created
        .or_else(|| query.str("ct").and_then(|ct| ct.parse().ok()))
        .ok_or(Refused::Signature(SignatureError::Malformed))?;
    let target = LinkTarget {
        id: make(id),
        created_at,
    };
    signer
        .verify(target, query.str("se"), query.str("sig"))
        .map_err(Refused::Signature)?;
    Ok(target)
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
pub(super) fn push_base_url(
    app: &AppState,
    headers: &HeaderMap,
    out: &mut String,
) -> Result<(), NoLinkBase> {
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
    use super::*;
    use crate::model::{EntryId, UploadId};
    use crate::secret::Secret;
    use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

    /// The query parameters Azure's SAS parsers know: the Go SDK's `NewQueryParameters`
    /// (`sdk/storage/azblob/sas/query_params.go`) and Python's `QueryStringConstants`
    /// (`azure/storage/blob/_shared/shared_access_signature.py`).
    const SAS_KEYS: &[&str] = &[
        "sv", "ss", "srt", "sp", "se", "st", "spr", "sip", "si", "sig", "sr", "rscc", "rscd",
        "rsce", "rscl", "rsct", "skoid", "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid",
        "scid", "sdd", "ses", "sduoid", "srh", "sqh",
    ];

    /// Go's `url.QueryEscape` and Python's `quote(v, safe='')` leave these alone.
    const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');

    /// Go's `url.ParseQuery`: `&`-separated, `+` is a space, the rest percent-decoded.
    fn go_parse_query(query: &str) -> Vec<(String, String)> {
        query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                let decode = |s: &str| {
                    percent_decode_str(&s.replace('+', " "))
                        .decode_utf8()
                        .unwrap()
                        .into_owned()
                };
                (decode(k), decode(v))
            })
            .collect()
    }

    /// Go's `url.Values.Encode`: sorted by key, `url.QueryEscape`d.
    fn go_encode(mut values: Vec<(String, String)>) -> String {
        values.sort_by(|a, b| a.0.cmp(&b.0));
        let escape = |s: &str| utf8_percent_encode(s, UNRESERVED).to_string();
        values
            .iter()
            .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// `parseSASTimeString`: the formats the Go SDK reads a SAS time in, as patterns of
    /// digits (`9`) and literal characters. A time in none of them is dropped (its zero value
    /// is not encoded); one that parses is written back in the format it was read in.
    fn go_reads_sas_time(value: &str) -> bool {
        [
            "9999-99-99T99:99:99.9999999Z",
            "9999-99-99T99:99:99Z",
            "9999-99-99T99:99Z",
            "9999-99-99",
        ]
        .iter()
        .any(|pattern| {
            pattern.len() == value.len()
                && pattern.bytes().zip(value.bytes()).all(|(p, v)| {
                    if p == b'9' {
                        v.is_ascii_digit()
                    } else {
                        p == v
                    }
                })
        })
    }

    /// What `blob.ParseURL(link).String()` makes of a link's query in the Go SDK (azcopy
    /// does this for every request): the parameters it does not know, re-encoded, then the
    /// SAS parameters it kept, re-encoded.
    fn through_go_sdk(query: &str) -> String {
        let (mut sas, mut unparsed) = (Vec::new(), Vec::new());
        for (k, v) in go_parse_query(query) {
            let key = k.to_ascii_lowercase();
            if !SAS_KEYS.contains(&key.as_str()) {
                unparsed.push((k, v));
            } else if !matches!(key.as_str(), "se" | "st" | "skt" | "ske") || go_reads_sas_time(&v)
            {
                sas.push((key, v));
            }
        }
        [go_encode(unparsed), go_encode(sas)]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("&")
    }

    /// What Python's `parse_query` keeps of a link's query as its SAS token: the SAS
    /// parameters alone (`parse_qs`, then `quote(v, safe='')`); every other parameter is lost.
    fn through_python_sdk(query: &str) -> String {
        go_parse_query(query)
            .into_iter()
            .filter(|(k, v)| SAS_KEYS.contains(&k.as_str()) && !v.is_empty())
            .map(|(k, v)| format!("{k}={}", utf8_percent_encode(&v, UNRESERVED)))
            .collect::<Vec<_>>()
            .join("&")
    }

    fn accepted<Id: LinkId>(
        signer: &UrlSigner,
        link: &str,
        make: impl FnOnce(i64) -> Id,
    ) -> Result<LinkTarget<Id>, Refused> {
        let uri: axum::http::Uri = link.parse().unwrap();
        let segment = uri.path().rsplit('/').next().unwrap();
        check(signer, segment, &Query::parse(&uri), make)
    }

    const NOW: u64 = 1_796_310_245;

    fn link_to<Id: LinkId>(signer: &UrlSigner, target: LinkTarget<Id>) -> String {
        let mut link = format!("http://cache.internal:3000{UPLOAD_PREFIX}");
        push_signed_path(signer, target, NOW + 600, &mut link);
        link
    }

    fn signer() -> UrlSigner {
        let clock = std::sync::Arc::new(crate::model::ManualClock::starting_at(NOW as i64 * 1000));
        UrlSigner::new(Secret::new(vec![3; 32])).with_clock(clock)
    }

    #[test]
    fn links_survive_the_azure_sdks_url_parsers() {
        let signer = signer();
        let target = LinkTarget {
            id: UploadId::new(19),
            created_at: 1_796_310_000_123,
        };
        let link = link_to(&signer, target);
        let (path, query) = link.split_once('?').unwrap();
        assert!(path.ends_with("/_blob/uploads/19.1796310000123"), "{link}");
        assert!(
            query.starts_with("se=2026-12-03T15%3A14%3A05Z&sig="),
            "{link}"
        );
        assert_eq!(accepted(&signer, &link, UploadId::new), Ok(target));
        for (sdk, rebuilt) in [
            ("Go", through_go_sdk(query)),
            ("Python", through_python_sdk(query)),
            // What clients add to it: Put Block's parameters.
            (
                "Go",
                through_go_sdk(&format!("{query}&comp=block&blockid=YTAw")),
            ),
        ] {
            let rebuilt = format!("{path}?{rebuilt}");
            assert_eq!(
                accepted(&signer, &rebuilt, UploadId::new),
                Ok(target),
                "{sdk}: {rebuilt}"
            );
        }
        // Re-encoding what an SDK made changes nothing more: the link is at a fixed point.
        assert_eq!(
            through_go_sdk(&through_go_sdk(query)),
            through_go_sdk(query)
        );
    }

    #[test]
    fn links_of_the_previous_release_are_accepted_until_they_expire() {
        let signer = signer();
        let target = LinkTarget {
            id: EntryId::new(7),
            created_at: 1_796_310_000_123,
        };
        let old = |expires: u64| {
            format!(
                "http://10.0.0.5:3000{DOWNLOAD_PREFIX}7?se={expires}&ct={}&sig={}",
                target.created_at,
                signer.sign(target, expires)
            )
        };
        assert_eq!(accepted(&signer, &old(NOW + 1), EntryId::new), Ok(target));
        assert_eq!(
            accepted(&signer, &old(NOW), EntryId::new),
            Err(Refused::Signature(SignatureError::Expired))
        );
        // What the Azure SDKs did to them, and why they changed: the Go SDK drops an `se` it
        // cannot read as a time, Python drops `ct`.
        let query = old(NOW + 1).split_once('?').unwrap().1.to_owned();
        assert!(!through_go_sdk(&query).contains("se="));
        assert!(!through_python_sdk(&query).contains("ct="));
    }

    #[test]
    fn a_link_opens_only_the_row_it_was_signed_for() {
        let signer = signer();
        let target = LinkTarget {
            id: UploadId::new(19),
            created_at: 1_796_310_000_123,
        };
        let link = link_to(&signer, target);
        let malformed = Err(Refused::Signature(SignatureError::Malformed));
        let forged = Err(Refused::Signature(SignatureError::Forged));
        for (changed, expected) in [
            (link.replace("/19.", "/20."), forged),
            (link.replace(".1796310000123", ".1796310000124"), forged),
            (link.replace(".1796310000123", ""), malformed),
            (link.replace("sig=", "sig=A"), forged),
            (link.replace("%3A14%3A", "%3A15%3A"), forged),
            (link.replace("/19.", "/x."), Err(Refused::NoSuchPath)),
            (link.replace("/19.", "/0."), Err(Refused::NoSuchPath)),
            (link.replace("/19.", "/19.."), Err(Refused::NoSuchPath)),
        ] {
            assert_eq!(
                accepted(&signer, &changed, UploadId::new),
                expected,
                "{changed}"
            );
        }
    }

    #[test]
    fn blob_paths_are_matched_decoded_and_never_reach_another_row() {
        let upload = |s: &'static str| Some((LinkKind::Upload, Cow::Borrowed(s)));
        let download = |s: &'static str| Some((LinkKind::Download, Cow::Borrowed(s)));
        for (path, expected) in [
            ("/_blob/uploads/19.5", upload("19.5")),
            ("/_blob/uploads%2F19.5", upload("19.5")),
            ("/_blob/uploads%2f19.5", upload("19.5")),
            ("/_blob%2Fentries%2F7.5", download("7.5")),
            ("/%5Fblob/entries/7.5", download("7.5")),
            ("/_blob/entries/%37.5", download("7.5")),
        ] {
            assert_eq!(blob_route(path), expected, "{path}");
        }
        // Traversal, doubled slashes, further segments, double encoding: no route, or a
        // segment that names no row.
        for path in [
            "/_blob/uploads/%2e%2e%2Fentries%2F7.5",
            "/_blob/uploads/..%2Fentries/7.5",
            "/_blob/uploads/19.5%2F..%2F20.5",
            "/_blob/uploads//19.5",
            "/_blob/uploads%2F%2F19.5",
            "/_blob//uploads/19.5",
            "/_blob/uploads/",
            "/_blob/uploads%2F",
            "/_blob/entries/7.5/x",
            "/_blob/other/7.5",
            "/_blob/uploads/%ff",
        ] {
            assert_eq!(blob_route(path), None, "{path}");
        }
        for path in [
            "/_blob/uploads/%2e%2e",
            "/_blob/entries/%2E",
            "/_blob/uploads/%252F19.5",
            "/_blob/uploads/19.5%00",
        ] {
            let (_, segment) = blob_route(path).unwrap();
            assert_eq!(parse_segment(&segment), None, "{path}");
        }
    }

    #[test]
    fn path_segments_name_an_id_and_a_creation_time() {
        assert_eq!(parse_segment("19"), Some((19, None)));
        assert_eq!(
            parse_segment("19.1700000000000"),
            Some((19, Some(1_700_000_000_000)))
        );
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            "1.",
            ".1",
            "1.2.3",
            "1 ",
            "99999999999999999999",
            "a",
        ] {
            assert_eq!(parse_segment(bad), None, "{bad}");
        }
    }

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
