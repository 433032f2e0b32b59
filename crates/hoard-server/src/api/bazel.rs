//! Bazel's HTTP remote cache under `/_bazel/` (`--remote_cache=<hoard's URL>/_bazel`, with the
//! job's runtime token in `--remote_header=Authorization=Bearer …`): action results at
//! `/_bazel/ac/<sha256>` and content-addressed blobs at `/_bazel/cas/<sha256>`, each `GET`,
//! `HEAD` and `PUT`. A CAS write is kept only if its body's SHA-256 is its name. Both are
//! objects of the job's repository and scope ([`crate::cache::tools`]); answers are plain
//! text, as Bazel reads only the status.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;

use super::origin::ClientAddress;
use super::{objects, AppState};
use crate::model::{Tool, ToolObject};

pub const BASE: &str = "/_bazel/";

/// `/_bazel/{ac,cas}/<sha256>`.
pub async fn serve(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    ClientAddress(address): ClientAddress,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let rest = uri.path().strip_prefix(BASE).unwrap_or_default();
    let Some((tool, hash)) = parse(rest) else {
        return objects::plain(
            StatusCode::NOT_FOUND,
            "Bazel's cache is /_bazel/ac/<sha256> and /_bazel/cas/<sha256>, the SHA-256 in \
             64 lowercase hex digits",
        );
    };
    // Names are checked hex: a CAS name always decodes to its digest.
    let sha256 = (tool == Tool::BazelCas)
        .then(|| hex::decode(hash).ok()?.try_into().ok())
        .flatten();
    let object = ToolObject::bare(tool);
    let taken = objects::Taken::OK;
    let request = (&method, &headers, body);
    objects::plain_request(
        &app,
        address,
        request,
        &object,
        hash,
        taken,
        sha256,
        "Bazel's HTTP cache",
    )
    .await
}

/// `ac/<sha256>` or `cas/<sha256>`: the tool and the digest.
fn parse(rest: &str) -> Option<(Tool, &str)> {
    let (kind, hash) = rest.split_once('/')?;
    let tool = match kind {
        "ac" => Tool::BazelAc,
        "cas" => Tool::BazelCas,
        _ => return None,
    };
    let is_digest =
        hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    is_digest.then_some((tool, hash))
}
