//! Go's build cache under `/_gocache/`, as `hoard gocache` (Go's `GOCACHEPROG`) uses it: an
//! action's record at `/_gocache/a/<action id>` (the output's id and size, a few bytes) and an
//! output at `/_gocache/o/<output id>`, kept only if its body's SHA-256 is its id (Go's output
//! ids are the SHA-256 of their content). Both are objects of the job's repository and scope
//! ([`crate::cache::tools`]); answers are plain text.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;

use super::origin::ClientAddress;
use super::{objects, AppState};
use crate::model::{Tool, ToolObject};

pub const BASE: &str = "/_gocache/";

/// The most an action's record holds (an output id and a size).
const MAX_RECORD: u64 = 256;

pub async fn serve(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    ClientAddress(address): ClientAddress,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let rest = uri.path().strip_prefix(BASE).unwrap_or_default();
    let Some((output, name)) = parse(rest) else {
        return objects::plain(
            StatusCode::NOT_FOUND,
            "Go's cache is /_gocache/a/<action id> and /_gocache/o/<output id>, each 64 \
             lowercase hex digits",
        );
    };
    if !output
        && method == Method::PUT
        && objects::declared_length(&headers).is_some_and(|len| len > MAX_RECORD)
    {
        return objects::plain(
            StatusCode::BAD_REQUEST,
            format!("an action's record is at most {MAX_RECORD} bytes"),
        );
    }
    // Names are checked hex: an output's always decodes to its digest.
    let sha256 = output
        .then(|| hex::decode(&name[2..]).ok()?.try_into().ok())
        .flatten();
    let object = ToolObject::bare(Tool::Go);
    let taken = objects::Taken::OK;
    let request = (&method, &headers, body);
    objects::plain_request(
        &app,
        address,
        request,
        &object,
        name,
        taken,
        sha256,
        "Go's cache",
    )
    .await
}

/// `a/<hex>` or `o/<hex>`: whether it is an output, and the object's name (the whole path).
fn parse(rest: &str) -> Option<(bool, &str)> {
    let (kind, id) = rest.split_once('/')?;
    let output = match kind {
        "a" => false,
        "o" => true,
        _ => return None,
    };
    let is_id = id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    is_id.then_some((output, rest))
}
