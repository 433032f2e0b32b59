//! The cache services' calls through the edge: the origin decides every lookup and every save
//! (tokens, scopes, policies, quarantine stay there and take effect at once); the edge only
//! points the links in the origin's answers at itself, so that the bytes pass through it, and
//! answers for an origin that cannot: a lookup it does not answer within `--lookup-timeout` is
//! a miss, a save it cannot take is the write-denied answer, so that jobs go on without a cache.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Value};

use hoard_server::api::proxy::strip_hop_by_hop;

use crate::forward::{answered, outgoing};
use crate::origin::Answer;
use crate::saves::caller_of;
use crate::Edge;

/// The most of a cache call's body the edge reads (they are a few hundred bytes).
const CALL_BODY_LIMIT: usize = 1 << 20;
/// How long a call other than a lookup may wait for the origin.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const DENIED: &str = "cache write denied: this hoard edge cannot reach its origin";

/// The cache service's calls the edge takes part in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// v2 `GetCacheEntryDownloadURL`.
    Lookup,
    /// v2 `CreateCacheEntry`.
    Reserve,
    /// v2 `FinalizeCacheEntryUpload`.
    Finalize,
    /// v1 `GET …/_apis/artifactcache/cache`.
    LegacyLookup,
    /// v1 `POST …/_apis/artifactcache/caches`.
    LegacyReserve,
}

impl Call {
    /// The call a request makes, if it is one of these (under any path prefix, as hoard serves
    /// them).
    pub fn of(method: &Method, path: &str) -> Option<Self> {
        use hoard_server::api::paths::{LEGACY_BASE, TWIRP_SERVICE_PATH};
        if let Some(at) = path.find(TWIRP_SERVICE_PATH) {
            return match &path[at + TWIRP_SERVICE_PATH.len()..] {
                "GetCacheEntryDownloadURL" => Some(Self::Lookup),
                "CreateCacheEntry" => Some(Self::Reserve),
                "FinalizeCacheEntryUpload" => Some(Self::Finalize),
                _ => None,
            };
        }
        let at = path.find(LEGACY_BASE)?;
        match (method, &path[at + LEGACY_BASE.len()..]) {
            (&Method::GET, "cache") => Some(Self::LegacyLookup),
            (&Method::POST, "caches") => Some(Self::LegacyReserve),
            _ => None,
        }
    }

    fn is_lookup(self) -> bool {
        matches!(self, Self::Lookup | Self::LegacyLookup)
    }

    /// The link field of the origin's answer that the edge points at itself.
    fn link_field(self) -> Option<&'static str> {
        match self {
            Self::Lookup => Some("signed_download_url"),
            Self::Reserve => Some("signed_upload_url"),
            Self::LegacyLookup => Some("archiveLocation"),
            Self::Finalize | Self::LegacyReserve => None,
        }
    }
}

fn json_answer(status: StatusCode, body: &Value) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// What the client is told when the origin cannot decide (counted); `protobuf` when it asked
/// in Twirp's binary encoding (where an empty message is `ok: false`).
fn undecided(call: Call, protobuf: bool, counters: &crate::metrics::Counters) -> Response {
    let counter = if call.is_lookup() {
        &counters.lookups_unanswered
    } else {
        &counters.saves_refused
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if protobuf && matches!(call, Call::Lookup | Call::Reserve | Call::Finalize) {
        let mut response = Response::new(Body::empty());
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/protobuf"),
        );
        return response;
    }
    match call {
        // A quiet miss (PROTOCOL.md §2.7, §5.2).
        Call::Lookup => json_answer(StatusCode::OK, &json!({ "ok": false })),
        Call::LegacyLookup => {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }
        // `cache write denied:` is a warning and the job goes on (§2.4).
        Call::Reserve => json_answer(StatusCode::OK, &json!({ "ok": false, "message": DENIED })),
        Call::Finalize => json_answer(StatusCode::OK, &json!({ "ok": false, "message": DENIED })),
        // v1 retries 5xx; any other refusal ends the save at once.
        Call::LegacyReserve => json_answer(StatusCode::FORBIDDEN, &json!({ "message": DENIED })),
    }
}

/// `link`, one of the origin's blob links, pointing at `edge_base` instead; `None` for other
/// links (a Forgejo runner's proxy), which are left as they are.
pub fn pointed_at(link: &str, edge_base: &str) -> Option<String> {
    // Read by hand rather than parsed as a URL: every hit of every lookup passes here, and
    // the origin's links are its own (absolute, nothing to normalise).
    let (scheme, rest) = link.split_once("://")?;
    if !matches!(scheme, "http" | "https") {
        return None;
    }
    let from_path = &rest[rest.find('/')?..];
    let path_end = from_path.find(['?', '#']).unwrap_or(from_path.len());
    // From the blob prefix on: an origin behind a path prefix has it before.
    let at = from_path[..path_end].find("/_blob/")?;
    Some(format!("{edge_base}{}", &from_path[at..]))
}

/// Takes part in `call`: forwards it, points the answer's link at the edge, and answers for an
/// origin that cannot.
pub async fn call(
    edge: &Edge,
    call: Call,
    uri: &Uri,
    incoming: HeaderMap,
    client: Option<SocketAddr>,
    body: Body,
) -> Response {
    let body = match axum::body::to_bytes(body, CALL_BODY_LIMIT).await {
        Ok(body) => body,
        Err(_) => {
            return json_answer(
                StatusCode::BAD_REQUEST,
                &json!({"code": "malformed", "msg": "the request body could not be read"}),
            )
        }
    };
    let method = if call == Call::LegacyLookup {
        Method::GET
    } else {
        Method::POST
    };
    let within = if call.is_lookup() {
        edge.lookup_timeout
    } else {
        CALL_TIMEOUT
    };
    let protobuf_asked = is_protobuf(&incoming);
    let base = edge.base_for(&incoming);
    let caller = matches!(call, Call::Reserve | Call::Finalize)
        .then(|| caller_of(incoming.get(header::AUTHORIZATION).map(|v| v.as_bytes())));
    let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
    let answer = edge
        .origin
        .send(
            method,
            path_and_query,
            &outgoing(incoming, client),
            body.clone(),
            within,
        )
        .await;
    let counters = &edge.counters;
    let answer = match answer {
        // A server error is the origin unable to decide, as much as silence is.
        Ok(answer) if answer.status().is_server_error() && call != Call::Finalize => {
            tracing::warn!(
                status = answer.status().as_u16(),
                ?call,
                "the origin could not decide a cache call"
            );
            None
        }
        Ok(answer) => Some(answer),
        Err(e) => {
            tracing::warn!(error = %e, ?call, "the origin did not answer a cache call");
            None
        }
    };
    let Some(answer) = answer else {
        return undecided(call, protobuf_asked, counters);
    };
    if call == Call::Finalize && answer.status() == StatusCode::OK {
        if let Some(((key, version), entry)) =
            saving_of(call, &body, protobuf_asked).zip(finalized_entry(&answer))
        {
            edge.saves
                .finalized(caller.unwrap_or_default(), &key, &version, entry);
        }
        return answered(answer);
    }
    let Some(field) = call
        .link_field()
        .filter(|_| answer.status() == StatusCode::OK)
    else {
        if call.is_lookup() {
            counters.lookups_miss.fetch_add(1, Ordering::Relaxed);
        }
        return answered(answer);
    };
    let (mut parts, answer_body) = answer.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::CONTENT_LENGTH);
    let pointed = if is_protobuf(&parts.headers) {
        pointed_protobuf(call, &answer_body, base.as_deref())
    } else {
        pointed_json(field, &answer_body, base.as_deref())
    };
    let Some((answer_body, link)) = pointed else {
        return undecided(call, protobuf_asked, counters);
    };
    let hit = link.as_deref().is_some_and(|l| !l.is_empty());
    if call.is_lookup() {
        let counter = if hit {
            &counters.lookups_hit
        } else {
            &counters.lookups_miss
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    if call == Call::Reserve {
        // Its upload may be kept on the way (saves.rs).
        let upload = link.as_deref().and_then(upload_of);
        if let Some(((key, version), upload)) = saving_of(call, &body, protobuf_asked).zip(upload) {
            edge.saves
                .reserved(caller.unwrap_or_default(), &key, &version, &upload);
        }
    }
    Response::from_parts(parts, Body::from(answer_body))
}

/// The upload link segment of one of the origin's upload links.
fn upload_of(link: &str) -> Option<String> {
    use hoard_server::api::paths::{blob_route, LinkKind};
    let url = url::Url::parse(link).ok()?;
    let path = url.path();
    match blob_route(&path[path.find("/_blob/")?..])? {
        (LinkKind::Upload, segment) => Some(segment.into_owned()),
        _ => None,
    }
}

/// The key and version a reservation or a finalize names.
fn saving_of(call: Call, request: &[u8], protobuf: bool) -> Option<(String, String)> {
    use hoard_server::api::proto::{CreateCacheEntryRequest, FinalizeCacheEntryUploadRequest};
    use prost::Message as _;
    if !protobuf {
        let value: Value = serde_json::from_slice(request).ok()?;
        let text = |name: &str| value.get(name)?.as_str().map(str::to_owned);
        return text("key").zip(text("version"));
    }
    match call {
        Call::Reserve => CreateCacheEntryRequest::decode(request)
            .ok()
            .map(|r| (r.key, r.version)),
        Call::Finalize => FinalizeCacheEntryUploadRequest::decode(request)
            .ok()
            .map(|r| (r.key, r.version)),
        _ => None,
    }
}

/// The entry a finalize the origin answered made, so that an upload the edge kept on the way
/// becomes that entry's copy.
fn finalized_entry(answer: &Answer) -> Option<i64> {
    use hoard_server::api::proto::FinalizeCacheEntryUploadResponse;
    use prost::Message as _;
    if is_protobuf(answer.headers()) {
        return FinalizeCacheEntryUploadResponse::decode(answer.body().as_ref())
            .ok()
            .filter(|f| f.ok)
            .map(|f| f.entry_id);
    }
    serde_json::from_slice::<Value>(answer.body())
        .ok()
        .filter(|v| v["ok"] == true)
        .and_then(|v| match &v["entry_id"] {
            Value::String(id) => id.parse::<i64>().ok(),
            id => id.as_i64(),
        })
}

fn is_protobuf(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let value = value.as_bytes().trim_ascii_start();
    ["application/protobuf", "application/x-protobuf"]
        .iter()
        .any(|kind| {
            value
                .get(..kind.len())
                .is_some_and(|v| v.eq_ignore_ascii_case(kind.as_bytes()))
        })
}

/// A JSON answer with its link `field` pointed at `base`, and the link as the origin gave it;
/// `None` if it is not JSON.
fn pointed_json(field: &str, body: &[u8], base: Option<&str>) -> Option<(Vec<u8>, Option<String>)> {
    if let Some(spliced) = spliced_json(field, body, base) {
        return Some(spliced);
    }
    let mut value: Value = serde_json::from_slice(body).ok()?;
    let link = value.get(field).and_then(Value::as_str).map(str::to_owned);
    if let Some(pointed) = link
        .as_deref()
        .zip(base)
        .and_then(|(l, base)| pointed_at(l, base))
    {
        value[field] = Value::String(pointed);
    }
    Some((value.to_string().into_bytes(), link))
}

/// [`pointed_json`] without parsing the answer, for the shape hoard writes (`"field":"link"`,
/// the link free of escapes): the link's bytes are replaced where they are. `None` for any
/// other shape, which is parsed instead.
fn spliced_json(field: &str, body: &[u8], base: Option<&str>) -> Option<(Vec<u8>, Option<String>)> {
    let text = std::str::from_utf8(body).ok()?;
    // The field's name between quotes and then `:"` occurs nowhere else: inside a string
    // every quote is escaped.
    let needle = format!("\"{field}\":\"");
    let start = text.find(&needle)? + needle.len();
    let len = text[start..].find('"')?;
    let link = &text[start..start + len];
    if link.contains('\\') || text[start + len..].contains(&needle) {
        return None;
    }
    let Some(pointed) = base.and_then(|base| pointed_at(link, base)) else {
        return Some((body.to_vec(), Some(link.to_owned())));
    };
    let mut out = Vec::with_capacity(body.len() + pointed.len());
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(pointed.as_bytes());
    out.extend_from_slice(&body[start + len..]);
    Some((out, Some(link.to_owned())))
}

/// [`pointed_json`] for a protobuf answer (Twirp's binary encoding).
fn pointed_protobuf(
    call: Call,
    body: &[u8],
    base: Option<&str>,
) -> Option<(Vec<u8>, Option<String>)> {
    use hoard_server::api::proto::{CreateCacheEntryResponse, GetCacheEntryDownloadUrlResponse};
    use prost::Message as _;
    let point = |link: &mut String| {
        if let Some(pointed) = base.and_then(|base| pointed_at(link, base)) {
            *link = pointed;
        }
    };
    match call {
        Call::Lookup => {
            let mut answer = GetCacheEntryDownloadUrlResponse::decode(body).ok()?;
            let link = answer.signed_download_url.clone();
            point(&mut answer.signed_download_url);
            Some((answer.encode_to_vec(), Some(link)))
        }
        Call::Reserve => {
            let mut answer = CreateCacheEntryResponse::decode(body).ok()?;
            let link = answer.signed_upload_url.clone();
            point(&mut answer.signed_upload_url);
            Some((answer.encode_to_vec(), Some(link)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_origins_blob_links_point_at_the_edge_and_others_stay() {
        let edge = "http://10.0.0.7:3000";
        for (link, pointed) in [
            (
                "https://cache.example/_blob/entries/12.1700000000000?se=2026-12-07T10%3A00%3A00Z&sig=abc",
                Some("http://10.0.0.7:3000/_blob/entries/12.1700000000000?se=2026-12-07T10%3A00%3A00Z&sig=abc"),
            ),
            // An origin behind a path prefix: the link is the edge's from the blob prefix on.
            (
                "https://cache.example/hoard/_blob/uploads/3.5?se=x&sig=y",
                Some("http://10.0.0.7:3000/_blob/uploads/3.5?se=x&sig=y"),
            ),
            // A Forgejo runner's proxy link is the runner's business.
            ("http://runner:4000/run-1/_apis/artifactcache/artifacts/4", None),
            ("not a link", None),
            ("http://o:1/p?then=/_blob/entries/1.2", None),
            ("ftp://o/_blob/entries/1.2", None),
            ("http://o:1", None),
        ] {
            assert_eq!(pointed_at(link, edge).as_deref(), pointed, "{link}");
        }
    }

    #[test]
    fn a_json_answer_gets_the_edges_link_spliced_or_parsed_alike() {
        let base = Some("http://edge:3000");
        let field = "signed_download_url";
        for body in [
            r#"{"ok":true,"signed_download_url":"http://o:1/_blob/entries/1.2?sig=a%2Fb","matched_key":"k"}"#,
            // Shapes the splice leaves to the parser: spaces, an escaped slash, a nested twin.
            r#"{"ok": true, "signed_download_url": "http://o:1/_blob/entries/1.2?sig=a%2Fb", "matched_key": "k"}"#,
            r#"{"ok":true,"signed_download_url":"http:\/\/o:1\/_blob\/entries\/1.2?sig=a%2Fb","matched_key":"k"}"#,
            r#"{"ok":true,"matched_key":"\"signed_download_url\":\"x","signed_download_url":"http://o:1/_blob/entries/1.2?sig=a%2Fb"}"#,
        ] {
            let (out, link) = pointed_json(field, body.as_bytes(), base).expect(body);
            let out: Value = serde_json::from_slice(&out).expect(body);
            assert_eq!(
                out[field], "http://edge:3000/_blob/entries/1.2?sig=a%2Fb",
                "{body}"
            );
            assert_eq!(
                link.as_deref(),
                Some("http://o:1/_blob/entries/1.2?sig=a%2Fb")
            );
            let original: Value = serde_json::from_str(body).unwrap();
            assert_eq!(out["matched_key"], original["matched_key"], "{body}");
        }
        // A miss has no link; a foreign link stays.
        let (out, link) =
            pointed_json(field, br#"{"ok":false,"signed_download_url":""}"#, base).unwrap();
        assert_eq!(
            (out.as_slice(), link.as_deref()),
            (&br#"{"ok":false,"signed_download_url":""}"#[..], Some(""))
        );
        assert!(pointed_json(field, b"not json", base).is_none());
    }

    #[test]
    fn calls_are_known_under_any_prefix_and_nothing_else_is() {
        let twirp = "/twirp/github.actions.results.api.v1.CacheService/";
        for (method, path, call) in [
            (
                Method::POST,
                format!("{twirp}GetCacheEntryDownloadURL"),
                Some(Call::Lookup),
            ),
            (
                Method::POST,
                format!("/ns/x{twirp}CreateCacheEntry"),
                Some(Call::Reserve),
            ),
            (
                Method::POST,
                format!("{twirp}FinalizeCacheEntryUpload"),
                Some(Call::Finalize),
            ),
            (Method::POST, format!("{twirp}DeleteCacheEntry"), None),
            (
                Method::GET,
                "/_apis/artifactcache/cache".to_owned(),
                Some(Call::LegacyLookup),
            ),
            (
                Method::POST,
                "/p/_apis/artifactcache/caches".to_owned(),
                Some(Call::LegacyReserve),
            ),
            (
                Method::PATCH,
                "/_apis/artifactcache/caches/4".to_owned(),
                None,
            ),
            (Method::GET, "/_blob/entries/1.2".to_owned(), None),
        ] {
            assert_eq!(Call::of(&method, &path), call, "{method} {path}");
        }
    }
}
