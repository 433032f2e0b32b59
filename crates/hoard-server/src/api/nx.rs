//! Nx's self-hosted remote cache API (`/v1/cache/<hash>`), as `nx` 20.8 and later call it
//! with `NX_SELF_HOSTED_REMOTE_CACHE_SERVER=<hoard's URL>` and the job's runtime token as
//! `NX_SELF_HOSTED_REMOTE_CACHE_ACCESS_TOKEN`: `GET` a task's outputs (404 when absent) and
//! `PUT` them (200; 409 when the job's scope holds them already, 403 for a token that writes
//! nowhere, both of which nx passes over). Each is an object of the job's repository and scope
//! ([`crate::cache::tools`]).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;

use super::origin::ClientAddress;
use super::{objects, AppState};
use crate::model::{Tool, ToolObject};

pub const BASE: &str = "/v1/cache/";

/// The longest hash taken (nx's are decimal digits).
const MAX_HASH: usize = 128;

pub async fn serve(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    ClientAddress(address): ClientAddress,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let hash = uri.path().strip_prefix(BASE).unwrap_or_default();
    let valid = !hash.is_empty()
        && hash.len() <= MAX_HASH
        && hash
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !valid {
        return objects::plain(
            StatusCode::BAD_REQUEST,
            "a hash is 1 to 128 letters, digits, '.', '_' or '-'",
        );
    }
    let object = ToolObject::bare(Tool::Nx);
    // Nx passes over a 409 (and a 403): the record is there, or cannot be written.
    let taken = objects::Taken {
        saved: StatusCode::OK,
        present: StatusCode::CONFLICT,
    };
    let request = (&method, &headers, body);
    objects::plain_request(
        &app,
        address,
        request,
        &object,
        hash,
        taken,
        None,
        "Nx's remote cache API",
    )
    .await
}
