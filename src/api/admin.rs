//! The admin API under `/_hoard/api/v1/` (JSON; described by `openapi.json` beside this file)
//! and the dashboard's files under `/_hoard/`.
//!
//! Off unless an admin token is configured: then every `/_hoard/` path answers 404. Each API
//! call must carry `Authorization: Bearer <admin token>`, compared in constant time; field
//! names follow GitHub's REST cache API where it has one.

use std::time::{Duration, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::AppState;
use crate::cache::admin::{ListQuery, Listing, MAX_PAGE};
use crate::cache::CacheError;
use crate::model::{CacheKey, Scope};
use crate::model::{EntryFilter, EntryOrder, ListedEntry, RepositoryUsage};
use crate::secret::Secret;

/// Where the dashboard lives; the API is under `API`.
pub const BASE: &str = "/_hoard/";
pub const API: &str = "/_hoard/api/v1/";

const OPENAPI: &str = include_str!("openapi.json");
const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const STYLE_CSS: &str = include_str!("ui/style.css");

/// Entries a page lists unless asked otherwise (GitHub's default).
const DEFAULT_PAGE: usize = 30;

/// An admin API error: a status and a sentence, as `{"message": …}`.
#[derive(Debug)]
pub struct AdminError(StatusCode, String);

impl AdminError {
    fn bad(message: impl Into<String>) -> Self {
        Self(StatusCode::BAD_REQUEST, message.into())
    }
    fn not_found(message: impl Into<String>) -> Self {
        Self(StatusCode::NOT_FOUND, message.into())
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let mut response = super::json_response(self.0, &json!({ "message": self.1 }), None);
        if self.0 == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"hoard admin\""),
            );
        }
        no_store(response)
    }
}

impl From<CacheError> for AdminError {
    fn from(e: CacheError) -> Self {
        if e.is_transient() {
            tracing::warn!(error = %e, "admin API: the database is unavailable");
            return Self(
                StatusCode::SERVICE_UNAVAILABLE,
                "the metadata database is unavailable; retry later".into(),
            );
        }
        tracing::error!(error = %e, "admin API request failed");
        Self(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request failed; the server log has the cause".into(),
        )
    }
}

type AdminResult = Result<Response, AdminError>;

/// Answers of the admin API are never cached by browsers or proxies.
fn no_store(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn ok(body: Value) -> AdminResult {
    Ok(no_store(super::json_response(StatusCode::OK, &body, None)))
}

/// The admin token, if the API is on.
fn admin_token(app: &AppState) -> Result<&Secret, AdminError> {
    app.config().admin_token.as_ref().ok_or_else(|| {
        AdminError::not_found(
            "the admin API and dashboard are off; start hoard with --admin-token-file or HOARD_ADMIN_TOKEN",
        )
    })
}

/// Checks the bearer token against the admin token in constant time: both are hashed first,
/// so neither their lengths nor a common prefix shows in the time taken.
fn authorize(app: &AppState, headers: &HeaderMap) -> Result<(), AdminError> {
    use sha2::{Digest, Sha256};
    let expected = admin_token(app)?;
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let Some(presented) = presented else {
        return Err(AdminError(
            StatusCode::UNAUTHORIZED,
            "the admin API needs an Authorization: Bearer <admin token> header".into(),
        ));
    };
    let (a, b) = (
        Sha256::digest(presented.as_bytes()),
        Sha256::digest(expected.expose()),
    );
    let differ = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    if differ != 0 {
        tracing::info!(target: "hoard::audit", action = "refused", reason = "wrong admin token");
        return Err(AdminError(
            StatusCode::UNAUTHORIZED,
            "the admin token was refused".into(),
        ));
    }
    Ok(())
}

/// The query string as pairs, percent-decoded.
fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn param<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

/// The entry filter of a query string: `repository`, `ref`, `key` (a prefix) and `version`.
fn filter_of(pairs: &[(String, String)]) -> Result<EntryFilter, AdminError> {
    let bounded = |name: &str| -> Result<Option<String>, AdminError> {
        match param(pairs, name) {
            Some(v) if v.len() > 1024 || v.chars().any(char::is_control) => Err(AdminError::bad(
                format!("{name} must be at most 1024 bytes without control characters"),
            )),
            other => Ok(other.map(str::to_owned)),
        }
    };
    let key = match param(pairs, "key") {
        // A prefix of a valid key is itself a valid key (no commas, no control characters).
        Some(k) => Some(
            CacheKey::parse(k)
                .map_err(|e| AdminError::bad(e.0))?
                .folded(),
        ),
        None => None,
    };
    Ok(EntryFilter {
        repository: bounded("repository")?,
        repository_id: None,
        scope: bounded("ref")?.map(Scope::new),
        folded_key_prefix: key,
        version: bounded("version")?,
    })
}

/// `sort` as GitHub names it.
fn order_of(pairs: &[(String, String)]) -> Result<EntryOrder, AdminError> {
    match param(pairs, "sort") {
        None | Some("last_accessed_at") => Ok(EntryOrder::LastUsed),
        Some("size_in_bytes") => Ok(EntryOrder::Size),
        Some("created_at") => Ok(EntryOrder::Created),
        Some(other) => Err(AdminError::bad(format!(
            "sort must be last_accessed_at, size_in_bytes or created_at, not {other:?}"
        ))),
    }
}

fn order_name(order: EntryOrder) -> &'static str {
    match order {
        EntryOrder::LastUsed => "last_accessed_at",
        EntryOrder::Size => "size_in_bytes",
        EntryOrder::Created => "created_at",
    }
}

/// A cursor names the sort it belongs to, so one from another sort is refused, not misread.
fn cursor(order: EntryOrder, descending: bool, (value, id): (i64, i64)) -> String {
    format!("{}{value}.{id}", cursor_prefix(order, descending))
}

fn cursor_prefix(order: EntryOrder, descending: bool) -> String {
    let direction = if descending { "desc" } else { "asc" };
    format!("{}.{direction}.", order_name(order))
}

fn parse_cursor(raw: &str, order: EntryOrder, descending: bool) -> Result<(i64, i64), AdminError> {
    let bad = || {
        AdminError::bad(
            "cursor is not one this listing returned (the sort, direction or filter changed?)",
        )
    };
    let numbers = raw
        .strip_prefix(&cursor_prefix(order, descending))
        .ok_or_else(bad)?;
    let (value, id) = numbers.split_once('.').ok_or_else(bad)?;
    Ok((
        value.parse().map_err(|_| bad())?,
        id.parse().map_err(|_| bad())?,
    ))
}

fn time(millis: i64) -> String {
    // RFC 3339 has four-digit years: a stored time past 9999 (a bad clock) is shown as the last
    // instant it can name rather than failing the answer.
    const LAST: i64 = 253_402_300_799_999;
    let at = UNIX_EPOCH + Duration::from_millis(millis.clamp(0, LAST) as u64);
    humantime::format_rfc3339_millis(at).to_string()
}

fn ratio(hits: u64, misses: u64) -> Value {
    let lookups = hits + misses;
    if lookups == 0 {
        Value::Null
    } else {
        json!((hits as f64 / lookups as f64 * 1000.0).round() / 1000.0)
    }
}

/// An entry as the API shows it (GitHub's `actions_caches` item, plus repository and hits).
fn entry_json(listed: &ListedEntry) -> Value {
    let e = &listed.entry;
    json!({
        "id": e.id,
        "repository_id": e.repository.as_str(),
        "repository": listed.repository_name,
        "ref": e.scope.as_str(),
        "key": e.key,
        "version": e.version,
        "size_in_bytes": e.size,
        "created_at": time(e.created_at),
        "last_accessed_at": time(e.last_used_at),
        "hits": e.hits,
    })
}

fn repository_json(r: &RepositoryUsage) -> Value {
    json!({
        "repository_id": r.repository.as_str(),
        "full_name": r.name,
        "active_caches_size_in_bytes": r.bytes,
        "active_caches_count": r.entries,
        "hits": r.hits,
        "misses": r.misses,
        "hit_ratio": ratio(r.hits, r.misses),
    })
}

/// The entry `caches/{id}` names.
async fn entry(app: &AppState, id: Option<&str>) -> Result<ListedEntry, AdminError> {
    let id = id_of(id.unwrap_or_default())?;
    app.cache()
        .listed_entry(id)
        .await?
        .ok_or_else(|| AdminError::not_found("no such cache entry"))
}

fn id_of(raw: &str) -> Result<i64, AdminError> {
    raw.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| AdminError::not_found("no such cache entry"))
}

/// Every `/_hoard/api/v1/…` request.
pub async fn api(
    State(app): State<AppState>,
    Path(rest): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    route(&app, &rest, &method, &uri, &headers)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn route(
    app: &AppState,
    rest: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> AdminResult {
    admin_token(app)?;
    if rest == "openapi.json" && *method == Method::GET {
        return Ok(no_store(
            ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response(),
        ));
    }
    authorize(app, headers)?;
    let pairs = query_pairs(uri);
    let path = rest.trim_end_matches('/');
    let one = path.strip_prefix("caches/");
    match (method, path) {
        (&Method::GET, "status") => status(app).await,
        (&Method::GET, "usage") => usage(app, &pairs).await,
        (&Method::GET, "caches") => list(app, &pairs).await,
        (&Method::DELETE, "caches") => delete_matching(app, &pairs).await,
        (&Method::GET, _) if one.is_some() => ok(entry_json(&entry(app, one).await?)),
        (&Method::DELETE, _) if one.is_some() => {
            let listed = entry(app, one).await?;
            match app.cache().delete_entries(&[listed], "admin").await? {
                0 => Err(AdminError::not_found("no such cache entry")),
                deleted => ok(json!({ "deleted": deleted })),
            }
        }
        // A known endpoint, another method.
        _ if one.is_some() || matches!(path, "status" | "usage" | "caches") => Err(AdminError(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed here"),
        )),
        _ => Err(AdminError::not_found(format!(
            "no such admin API endpoint: {}{}",
            API,
            rest.chars().take(100).collect::<String>()
        ))),
    }
}

async fn status(app: &AppState) -> AdminResult {
    let status = app.cache().status().await?;
    let config = app.config();
    let (hits, misses) = app.cache().metrics().lookup_totals();
    let uptime = config.started.elapsed().unwrap_or_default();
    let started_at = config
        .started
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as i64;
    let limits = &status.limits;
    let mut warnings = config.warnings.clone();
    warnings.extend(status.warnings);
    ok(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "started_at": time(started_at),
        "uptime_seconds": uptime.as_secs(),
        "database": config.backends.database,
        "storage": config.backends.storage,
        "limits": {
            "max_entry_size": status.max_entry_size,
            "repository_quota": limits.repo_quota,
            "max_storage": limits.max_storage,
            "unused_ttl_seconds": limits.unused_ttl.map(|d| d.as_secs()),
            "max_age_seconds": limits.max_age.map(|d| d.as_secs()),
            "max_open_uploads": config.limits.max_open_uploads,
        },
        "usage": {
            "size_in_bytes": status.totals.bytes,
            "entries": status.totals.entries,
            "open_uploads": status.totals.open_uploads,
        },
        "lookups": { "hits": hits, "misses": misses, "hit_ratio": ratio(hits, misses) },
        "quarantined": status.quarantined,
        "warnings": warnings,
    }))
}

async fn usage(app: &AppState, pairs: &[(String, String)]) -> AdminResult {
    let limit = page_size(pairs, "limit", 100)?;
    let (count, repositories) = app
        .cache()
        .repositories(param(pairs, "repository"), limit)
        .await?;
    let totals = app.cache().totals().await?;
    ok(json!({
        "total": {
            "size_in_bytes": totals.bytes,
            "entries": totals.entries,
            "open_uploads": totals.open_uploads,
        },
        "repository_count": count,
        "repositories": repositories.iter().map(repository_json).collect::<Vec<_>>(),
    }))
}

fn page_size(pairs: &[(String, String)], name: &str, default: usize) -> Result<usize, AdminError> {
    match param(pairs, name) {
        None => Ok(default),
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| {
                AdminError::bad(format!("{name} must be a number from 1 to {MAX_PAGE}"))
            }),
    }
}

async fn list(app: &AppState, pairs: &[(String, String)]) -> AdminResult {
    let order = order_of(pairs)?;
    let descending = match param(pairs, "direction") {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(AdminError::bad(format!(
                "direction must be asc or desc, not {other:?}"
            )))
        }
    };
    let after = param(pairs, "cursor")
        .map(|raw| parse_cursor(raw, order, descending))
        .transpose()?;
    let query = ListQuery {
        filter: filter_of(pairs)?,
        order,
        descending,
        after,
        limit: page_size(pairs, "per_page", DEFAULT_PAGE)?,
    };
    let Listing {
        total,
        entries,
        next,
    } = app.cache().list_entries(&query).await?;
    ok(json!({
        "total_count": total,
        "actions_caches": entries.iter().map(entry_json).collect::<Vec<_>>(),
        "next_cursor": next.map(|n| cursor(order, descending, n)),
    }))
}

/// `DELETE caches?key=…&repository=…&ref=…&version=…`: every entry the filter selects. A
/// filter is required: deleting everything takes `all=true`, so a forgotten parameter cannot.
async fn delete_matching(app: &AppState, pairs: &[(String, String)]) -> AdminResult {
    let mut filter = filter_of(pairs)?;
    if filter.is_everything() && param(pairs, "all") != Some("true") {
        return Err(AdminError::bad(
            "name what to delete with key, repository, ref or version (or all=true to delete every entry)",
        ));
    }
    // Names are not unique: a deletion resolves the repository to one id first.
    if let Some(wanted) = filter.repository.take() {
        match one_repository(app, &wanted).await? {
            Some(id) => filter.repository_id = Some(id),
            None => return ok(json!({ "deleted": 0 })),
        }
    }
    let deleted = app.cache().delete_matching(&filter, "admin").await?;
    ok(json!({ "deleted": deleted }))
}

/// The one repository `wanted` names: the repository with that id, else the only one with that
/// name; `None` if there is none; 409 if several share the name.
async fn one_repository(app: &AppState, wanted: &str) -> Result<Option<String>, AdminError> {
    let (_, found) = app.cache().repositories(Some(wanted), 100).await?;
    if found.iter().any(|r| r.repository.as_str() == wanted) {
        return Ok(Some(wanted.to_owned()));
    }
    match found.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.repository.as_str().to_owned())),
        several => Err(AdminError(
            StatusCode::CONFLICT,
            format!(
                "{} repositories are named {wanted:?} (ids {}); delete by repository id",
                several.len(),
                several
                    .iter()
                    .map(|r| format!("{:?}", r.repository.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// The dashboard's files, and 404 for other `/_hoard/` paths.
pub async fn dashboard(State(app): State<AppState>, uri: Uri) -> Response {
    if let Err(e) = admin_token(&app) {
        return e.into_response();
    }
    let (content_type, body) = match uri.path() {
        "/_hoard/" | "/_hoard/index.html" => ("text/html; charset=utf-8", INDEX_HTML),
        "/_hoard/app.js" => ("text/javascript; charset=utf-8", APP_JS),
        "/_hoard/style.css" => ("text/css; charset=utf-8", STYLE_CSS),
        "/_hoard" => {
            return (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, BASE)]).into_response()
        }
        _ => return AdminError::not_found("not found").into_response(),
    };
    let mut response = ([(header::CONTENT_TYPE, content_type)], Body::from(body)).into_response();
    let headers = response.headers_mut();
    // Everything the page loads is its own: no inline script, no other origin, no framing.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// What the metadata and the entry bytes are kept in, for `status`.
#[derive(Debug, Clone)]
pub struct Backends {
    /// `sqlite`, `postgres` or `mysql`.
    pub database: &'static str,
    /// `file`, for now.
    pub storage: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_belong_to_their_sort() {
        let c = cursor(EntryOrder::Size, true, (1234, 56));
        assert_eq!(
            parse_cursor(&c, EntryOrder::Size, true).unwrap(),
            (1234, 56)
        );
        let negative = cursor(EntryOrder::Created, false, (-5, 7));
        assert_eq!(
            parse_cursor(&negative, EntryOrder::Created, false).unwrap(),
            (-5, 7)
        );
        assert!(parse_cursor(&c, EntryOrder::Size, false).is_err());
        assert!(parse_cursor(&c, EntryOrder::Created, true).is_err());
        assert!(parse_cursor("size_in_bytes.desc.x.1", EntryOrder::Size, true).is_err());
        assert!(parse_cursor("", EntryOrder::Size, true).is_err());
    }

    #[test]
    fn hit_ratios_are_rounded_and_null_without_lookups() {
        assert_eq!(ratio(0, 0), Value::Null);
        assert_eq!(ratio(2, 1), json!(0.667));
        assert_eq!(ratio(5, 0), json!(1.0));
    }
}
