//! The admin API under `/_hoard/api/v1/` (JSON; described by `openapi.json` beside this file)
//! and the dashboard's files under `/_hoard/`.
//!
//! Off unless an admin token is configured: then every `/_hoard/` path answers 404. Each API
//! call must carry `Authorization: Bearer <admin token>`, compared in constant time; field
//! names follow GitHub's REST cache API where it has one. The answers are the types of
//! [`wire`], which `hoard caches` and `hoard status` read back.

mod dashboard;
mod openapi;
mod query;
mod stats;
pub use hoard_model::admin_wire as wire;

use std::time::{Duration, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::AppState;
use crate::cache::admin::{Disposal, ListQuery, Listing, Purge, Restores, MAX_RESTORES};
use crate::cache::promotion::PromotionRequest;
use crate::cache::CacheError;
use crate::model::{
    EntryFilter, EntryId, ListedEntry, LogSafe, Promotion, RestoreQuery, RestoreRecord,
    RestoringJob, Scope,
};
use crate::secret::Secret;
use query::Query;

pub use dashboard::dashboard;

/// Where the dashboard lives; the API is under `API`.
pub const BASE: &str = "/_hoard/";
pub const API: &str = "/_hoard/api/v1/";

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
    fn internal() -> Self {
        Self(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request failed; the server log has the cause".into(),
        )
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let body = wire::ErrorMessage { message: self.1 };
        let mut response = json(self.0, &body).unwrap_or_else(|_| self.0.into_response());
        if self.0 == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"hoard admin\""),
            );
        }
        // A 503 is the database being away: retry soon.
        if self.0 == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        no_store(response)
    }
}

impl From<CacheError> for AdminError {
    fn from(e: CacheError) -> Self {
        match e {
            CacheError::Invalid(invalid) => return Self::bad(invalid.0),
            CacheError::UnknownRepository(_) => return Self::not_found(e.to_string()),
            CacheError::AmbiguousRepository(_)
            | CacheError::SlotTaken
            | CacheError::WrongState(_) => return Self(StatusCode::CONFLICT, e.to_string()),
            CacheError::EntryNotFound => return Self::not_found(e.to_string()),
            // The operator's download of a damaged entry: say how (issue #57).
            CacheError::Damaged(_) => {
                return Self(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            }
            _ => {}
        }
        if e.is_transient() {
            tracing::warn!(error = %e, "admin API: the database is unavailable");
            return Self(
                StatusCode::SERVICE_UNAVAILABLE,
                "the metadata database is unavailable; retry later".into(),
            );
        }
        tracing::error!(error = %e, "admin API request failed");
        Self::internal()
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

/// `body` as JSON. It goes through `serde_json::Value` so that keys keep the alphabetical order
/// the answers have always had (serde_json's map is sorted), not the structs' field order.
fn json(status: StatusCode, body: &impl Serialize) -> AdminResult {
    let value = serde_json::to_value(body).map_err(|e| {
        tracing::error!(error = %e, "admin API: an answer does not serialize");
        AdminError::internal()
    })?;
    Ok((
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response())
}

fn ok(body: &impl Serialize) -> AdminResult {
    Ok(no_store(json(StatusCode::OK, body)?))
}

/// The admin token, if the API is on.
fn admin_token(app: &AppState) -> Result<&Secret, AdminError> {
    app.config().admin_token.as_ref().ok_or_else(|| {
        AdminError::not_found(
            "the admin API and dashboard are off; start hoard with --admin-token-file or HOARD_ADMIN_TOKEN",
        )
    })
}

/// Checks the bearer token against the admin token, in constant time ([`Secret::matches`]).
fn authorize(app: &AppState, headers: &HeaderMap) -> Result<(), AdminError> {
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
    if !expected.matches(presented.as_bytes()) {
        tracing::info!(target: "hoard::audit", action = "refused", reason = "wrong admin token");
        return Err(AdminError(
            StatusCode::UNAUTHORIZED,
            "the admin token was refused".into(),
        ));
    }
    Ok(())
}

/// The entry `caches/{id}` names, and who restored it.
async fn entry_with_readers(
    app: &AppState,
    id: Option<&str>,
) -> Result<(ListedEntry, Vec<RestoreRecord>), AdminError> {
    let id = id_of(id.unwrap_or_default())?;
    app.cache()
        .entry_with_readers(id)
        .await?
        .ok_or_else(|| AdminError::not_found("no such cache entry"))
}

/// The entry `caches/{id}` names.
async fn entry(app: &AppState, id: Option<&str>) -> Result<ListedEntry, AdminError> {
    let id = id_of(id.unwrap_or_default())?;
    app.cache()
        .listed_entry(id)
        .await?
        .ok_or_else(|| AdminError::not_found("no such cache entry"))
}

fn id_of(raw: &str) -> Result<EntryId, AdminError> {
    raw.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .map(EntryId::new)
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
            (
                [(header::CONTENT_TYPE, "application/json")],
                openapi::DOCUMENT,
            )
                .into_response(),
        ));
    }
    authorize(app, headers)?;
    let query = Query::of(uri);
    let path = rest.trim_end_matches('/');
    let one = path.strip_prefix("caches/");
    // `caches/{id}/content` and `caches/{id}/release`.
    let (one, action) = match one.and_then(|rest| rest.split_once('/')) {
        Some((id, action)) => (Some(id), Some(action)),
        None => (one, None),
    };
    // Every endpoint names the parameters it reads; anything else is refused before it acts.
    use query::{DELETION, FAMILIES, FILTER, PAGE, PERIOD, RESTORES, SERIES, USAGE};
    let allowed: &[&[&str]] = match (method, path) {
        _ if action.is_some() => &[],
        (&Method::GET, "usage") => &[USAGE],
        (&Method::GET, "stats") => &[PERIOD, SERIES],
        (&Method::GET, "stats/families") => &[PERIOD, FAMILIES],
        (&Method::GET, "caches") => &[FILTER, PAGE],
        (&Method::GET, "restores") => &[RESTORES],
        (&Method::DELETE, "caches") => &[FILTER, DELETION],
        (&Method::POST, "promotions") => &[&["repository", "from_ref", "to_ref", "dry_run"]],
        (&Method::POST, "tokens") => &[&["repository", "ref", "write", "ttl", "subject"]],
        (&Method::DELETE, _) if one.is_some() => &[&["dry_run", "quarantine", "restores"]],
        _ => &[],
    };
    query.only(allowed)?;
    match (method, action) {
        (&Method::GET, Some("content")) => return content(app, one).await,
        (&Method::POST, Some("release")) => return ok(&release(app, one).await?),
        (_, Some("content" | "release")) => {
            return Err(AdminError(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{method} is not allowed here"),
            ))
        }
        (_, Some(_)) => {
            return Err(AdminError::not_found(format!(
                "no such admin API endpoint: {}{}",
                API,
                rest.chars().take(100).collect::<String>()
            )))
        }
        (_, None) => {}
    }
    match (method, path) {
        (&Method::GET, "status") => ok(&status(app).await?),
        (&Method::GET, "usage") => ok(&usage(app, &query).await?),
        (&Method::GET, "policy") => ok(&policy(app).await),
        (&Method::GET, "stats") => ok(&stats::series(app, &query).await?),
        (&Method::GET, "stats/families") => ok(&stats::families(app, &query).await?),
        (&Method::GET, "caches") => ok(&list(app, &query).await?),
        (&Method::GET, "restores") => ok(&restores(app, &query).await?),
        (&Method::DELETE, "caches") => ok(&delete_matching(app, &query).await?),
        (&Method::POST, "promotions") => ok(&promote(app, &query).await?),
        (&Method::POST, "tokens") => ok(&issue_token(app, &query).await?),
        (&Method::GET, _) if one.is_some() => ok(&detail(app, one).await?),
        (&Method::DELETE, _) if one.is_some() => ok(&delete_one(app, one, &query).await?),
        // A known endpoint, another method.
        _ if one.is_some()
            || matches!(
                path,
                "status"
                    | "usage"
                    | "caches"
                    | "restores"
                    | "policy"
                    | "stats"
                    | "stats/families"
                    | "promotions"
                    | "tokens"
            ) =>
        {
            Err(AdminError(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{method} is not allowed here"),
            ))
        }
        _ => Err(AdminError::not_found(format!(
            "no such admin API endpoint: {}{}",
            API,
            rest.chars().take(100).collect::<String>()
        ))),
    }
}

async fn status(app: &AppState) -> Result<wire::Status, AdminError> {
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
    warnings.extend(app.cache().policy_warnings());
    let policy = policy(app).await;
    warnings.extend(policy.warnings.iter().cloned());
    Ok(wire::Status {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started_at: wire::time(started_at),
        uptime_seconds: uptime.as_secs(),
        database: config.backends.database.to_owned(),
        storage: config.backends.storage.to_owned(),
        limits: wire::Limits {
            max_entry_size: status.max_entry_size,
            repository_quota: limits.repo_quota,
            max_storage: limits.max_storage,
            unused_ttl_seconds: limits.unused_ttl.map(|d| d.as_secs()),
            max_age_seconds: limits.max_age.map(|d| d.as_secs()),
            max_open_uploads: config.limits.max_open_uploads,
        },
        usage: status.totals.into(),
        lookups: wire::Lookups::new(hits, misses),
        quarantined: status.quarantined,
        warnings,
        policy: Some(policy),
    })
}

/// `GET policy`: the write policy in force, the last attempt to load its file, and whether
/// the file on disk still holds it.
async fn policy(app: &AppState) -> wire::Policy {
    let Some(health) = app.cache().policy_health().await else {
        return wire::Policy {
            source: None,
            loaded_at: None,
            rules: Vec::new(),
            digest: None,
            last_attempt: None,
            differs_from_file: None,
            file_changed_at: None,
            warnings: Vec::new(),
            promotions: Vec::new(),
        };
    };
    let policy = &health.installed.policy;
    let attempt = &health.last_attempt;
    use crate::cache::policy::OnDisk;
    wire::Policy {
        source: policy.source.as_deref().map(|p| p.display().to_string()),
        loaded_at: Some(wire::time(health.installed.loaded_at)),
        rules: policy
            .rules
            .iter()
            .map(|r| wire::PolicyRule {
                repository: r.repository.clone(),
                scope: r.scope.clone(),
                access: r.access.as_str().to_owned(),
                callers: r
                    .callers
                    .as_ref()
                    .map(|kinds| kinds.iter().map(|k| k.as_str().to_owned()).collect()),
                line: r.line as u64,
            })
            .collect(),
        promotions: policy
            .promotions
            .iter()
            .map(|p| wire::PolicyPromotion {
                repository: p.repository.clone(),
                merge_queues: p.promotions.merge_queues,
                merged_pull_requests: p.promotions.merged_pull_requests,
                forks: p.promotions.forks,
                line: p.line as u64,
            })
            .collect(),
        digest: policy.stamp.as_ref().map(|s| s.digest()),
        last_attempt: Some(wire::PolicyAttempt {
            at: wire::time(attempt.at),
            outcome: if attempt.error.is_some() {
                "failed"
            } else {
                "ok"
            }
            .to_owned(),
            error: attempt.error.clone(),
        }),
        differs_from_file: match health.on_disk {
            OnDisk::Unknown => None,
            _ => Some(health.differs_from_file()),
        },
        file_changed_at: match health.on_disk {
            OnDisk::Changed { modified: Some(at) } => Some(wire::time(at)),
            _ => None,
        },
        warnings: health.warnings(),
    }
}

async fn usage(app: &AppState, query: &Query) -> Result<wire::Usage, AdminError> {
    let limit = query.page_size("limit", 100)?;
    let (count, repositories) = app
        .cache()
        .repositories(query.param("repository"), limit)
        .await?;
    let totals = app.cache().totals().await?;
    Ok(wire::Usage {
        total: totals.into(),
        repository_count: count,
        repositories: repositories.iter().map(wire::Repository::from).collect(),
    })
}

async fn list(app: &AppState, query: &Query) -> Result<wire::CacheList, AdminError> {
    let order = query.order()?;
    let descending = query.descending()?;
    let after = query
        .param("cursor")
        .map(|raw| query::parse_cursor(raw, order, descending))
        .transpose()?;
    let asked = ListQuery {
        filter: query.filter()?,
        order,
        descending,
        after,
        limit: query.page_size("per_page", query::DEFAULT_PAGE)?,
    };
    let Listing {
        total,
        entries,
        next,
    } = app.cache().select_entries(&asked).await?;
    Ok(wire::CacheList {
        total_count: total,
        actions_caches: entries
            .iter()
            .map(|e| wire::Cache::of(e, quarantine_retention(app)))
            .collect(),
        next_cursor: next.map(|n| query::cursor(order, descending, n)),
    })
}

/// `GET caches/{id}`: the entry and who received it.
async fn detail(app: &AppState, id: Option<&str>) -> Result<wire::CacheDetail, AdminError> {
    let (listed, records) = entry_with_readers(app, id).await?;
    Ok(wire::CacheDetail {
        cache: wire::Cache::of(&listed, quarantine_retention(app)),
        restored_by: records.iter().map(wire::Restore::from).collect(),
    })
}

/// `GET restores?…`: which jobs restored the entries written under the filter (the blast
/// radius of a writer), and the records, most recent first.
async fn restores(app: &AppState, query: &Query) -> Result<wire::RestoreList, AdminError> {
    let limit = query.count_up_to("per_page", MAX_RESTORES, MAX_RESTORES)?;
    let asked = RestoreQuery {
        entries: Vec::new(),
        written_under: query.filter()?,
        limit,
    };
    let Restores { records, truncated } = app.cache().restores(&asked).await?;
    Ok(wire::RestoreList {
        jobs: jobs_of(&records),
        restores: records.iter().map(wire::Restore::from).collect(),
        truncated,
    })
}

/// The jobs that restored the first [`MAX_RESTORES`] of `ids`, for a dry run's answer.
async fn restoring_jobs(
    app: &AppState,
    ids: &[EntryId],
) -> Result<Vec<wire::RestoringJob>, AdminError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let records = app
        .cache()
        .restores(&RestoreQuery {
            entries: ids.iter().copied().take(MAX_RESTORES).collect(),
            limit: MAX_RESTORES,
            ..RestoreQuery::default()
        })
        .await?
        .records;
    Ok(jobs_of(&records))
}

/// The jobs that made `records`, most recent first.
fn jobs_of(records: &[RestoreRecord]) -> Vec<wire::RestoringJob> {
    RestoringJob::of(records)
        .iter()
        .map(wire::RestoringJob::from)
        .collect()
}

/// `DELETE caches/{id}`; with `dry_run=true`, what it would delete.
async fn delete_one(
    app: &AppState,
    id: Option<&str>,
    query: &Query,
) -> Result<wire::Deleted, AdminError> {
    let dry_run = query.flag("dry_run")?;
    let disposal = disposal(query)?;
    if dry_run {
        let (listed, records) = entry_with_readers(app, id).await?;
        refuse_quarantine_twice(&listed, disposal)?;
        let mut purge = Purge::default();
        purge.add(&listed.entry);
        return Ok(deleted(purge, true, disposal, jobs_of(&records)));
    }
    let listed = entry(app, id).await?;
    refuse_quarantine_twice(&listed, disposal)?;
    let purge = app
        .cache()
        .delete_entries(&[listed], "admin", disposal)
        .await?;
    if purge.count == 0 {
        return Err(AdminError::not_found("no such cache entry"));
    }
    Ok(deleted(purge, false, disposal, Vec::new()))
}

fn quarantine_retention(app: &AppState) -> std::time::Duration {
    app.cache().quarantine_retention()
}

/// `quarantine=true`: keep what goes, in quarantine; `restores=true`: delete the entries'
/// restore records with them.
fn disposal(query: &Query) -> Result<Disposal, AdminError> {
    Ok(match (query.flag("quarantine")?, query.flag("restores")?) {
        (true, true) => {
            return Err(AdminError::bad(
                "quarantine=true keeps the entries' restore records for examination; restores=true deletes them: ask for one",
            ))
        }
        (true, false) => Disposal::Quarantine,
        (false, true) => Disposal::DeleteWithRestoreRecords,
        (false, false) => Disposal::Delete,
    })
}

fn refuse_quarantine_twice(listed: &ListedEntry, disposal: Disposal) -> Result<(), AdminError> {
    if listed.quarantine.is_some() && disposal == Disposal::Quarantine {
        return Err(CacheError::WrongState("the entry is in quarantine already").into());
    }
    Ok(())
}

/// `GET caches/{id}/content`: the entry's archive, live or in quarantine, checked chunk by
/// chunk as every download is, for an operator to examine.
async fn content(app: &AppState, id: Option<&str>) -> AdminResult {
    let id = id_of(id.unwrap_or_default())?;
    let open = app.cache().archive(id).await?;
    let size = open.entry.size;
    let body = app.cache().read(&open, 0, size).await?;
    let mut response = Response::new(axum::body::Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    if let Ok(name) =
        HeaderValue::from_str(&format!("attachment; filename=\"cache-{}.tzst\"", id.get()))
    {
        headers.insert(header::CONTENT_DISPOSITION, name);
    }
    Ok(no_store(response))
}

/// `POST caches/{id}/release`: a quarantined entry back among the entries.
async fn release(app: &AppState, id: Option<&str>) -> Result<wire::CacheDetail, AdminError> {
    let entry = id_of(id.unwrap_or_default())?;
    app.cache().release(entry, "admin").await?;
    detail(app, id).await
}

fn deleted(
    purge: Purge,
    dry_run: bool,
    disposal: Disposal,
    restored_by: Vec<wire::RestoringJob>,
) -> wire::Deleted {
    wire::Deleted {
        deleted: purge.count,
        quarantine: disposal == Disposal::Quarantine,
        dry_run,
        size_in_bytes: purge.bytes,
        ids_truncated: purge.count > purge.ids.len() as u64,
        ids: purge.ids.iter().map(|id| id.get()).collect(),
        uploads_aborted: purge.uploads,
        restored_by,
        restore_records_deleted: (disposal == Disposal::DeleteWithRestoreRecords && !dry_run)
            .then_some(purge.restore_records),
    }
}

/// `DELETE caches?…`: every entry the filter selects (see [`Query::filter`]); with
/// `dry_run=true`, nothing, answering what would go. A filter is required: deleting everything
/// takes `all=true`, so a forgotten parameter cannot.
async fn delete_matching(app: &AppState, query: &Query) -> Result<wire::Deleted, AdminError> {
    let mut filter = query.filter()?;
    let dry_run = query.flag("dry_run")?;
    let everything = EntryFilter {
        quarantined: false,
        ..filter.clone()
    }
    .is_everything();
    if everything && query.param("all") != Some("true") {
        return Err(AdminError::bad(
            "name what to delete with key, repository, ref, version, run_id, subject, kind, written_after or written_before (or all=true to delete every entry)",
        ));
    }
    // Names are not unique: a deletion resolves the repository to one id first.
    if let Some(wanted) = filter.repository.take() {
        // No repository by that id or name: the id filter then selects nothing, and the purge
        // is still audited.
        let one = app.cache().one_repository(&wanted).await?;
        filter.repository_id = Some(one.map_or(wanted, |r| r.repository.as_str().to_owned()));
    }
    let disposal = disposal(query)?;
    let purge = app
        .cache()
        .delete_matching(&filter, "admin", dry_run, disposal)
        .await?;
    let jobs = match dry_run {
        true => restoring_jobs(app, &purge.ids).await?,
        false => Vec::new(),
    };
    Ok(deleted(purge, dry_run, disposal, jobs))
}

/// `POST promotions`: the entries of `from_ref` promoted into `to_ref` by hand, under a
/// `promoted_by` of their own (see [`crate::cache::promotion`]).
async fn promote(app: &AppState, query: &Query) -> Result<wire::PromotionResult, AdminError> {
    let required = |name: &str| {
        query
            .param(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| AdminError::bad(format!("{name} is required")))
    };
    let (wanted, from, to) = (
        required("repository")?,
        required("from_ref")?,
        required("to_ref")?,
    );
    let dry_run = query.flag("dry_run")?;
    let repository = app
        .cache()
        .one_repository(wanted)
        .await?
        .ok_or_else(|| {
            AdminError::not_found(format!(
                "no such repository: {:?}",
                LogSafe(wanted).to_string()
            ))
        })?
        .repository;
    let (from, to) = (Scope::new(from), Scope::new(to));
    let by = Promotion::by_hand();
    let request = PromotionRequest {
        repository: &repository,
        from_scope: &from,
        to_scope: &to,
        written_after: None,
        by: &by,
        cause: "",
        dry_run,
    };
    let report = app.cache().promote(&request).await?;
    Ok(wire::PromotionResult {
        repository_id: repository.as_str().to_owned(),
        from_ref: from.as_str().to_owned(),
        to_ref: to.as_str().to_owned(),
        promoted_by: by,
        dry_run,
        promoted: report
            .promoted
            .iter()
            .map(|p| wire::PromotedEntry {
                id: p.id.map(|id| id.get()),
                from_id: p.from.get(),
                key: p.key.clone(),
                version: p.version.clone(),
                size_in_bytes: p.size,
            })
            .collect(),
        present: report.present,
        refused: report.refused,
    })
}

/// How long an issued token lives unless asked otherwise, and at most.
const TOKEN_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
const TOKEN_TTL_MAX: Duration = Duration::from_secs(366 * 24 * 3600);
const TOKEN_TTL_MIN: Duration = Duration::from_secs(60);

/// `POST tokens`: a token for one repository's build tools outside Actions (a developer's
/// machine): it reads one ref (`ref`, refs/heads/main unless named) and, with `write=true`
/// only, writes there, until it expires (`ttl`). Signed with the signing key like the tokens
/// jobs exchange (`auth/tool_token.rs`): rotating the key revokes every one.
async fn issue_token(app: &AppState, query: &Query) -> Result<wire::ToolToken, AdminError> {
    let wanted = query
        .param("repository")
        .filter(|v| !v.is_empty())
        .ok_or_else(|| AdminError::bad("repository is required"))?;
    let scope = Scope::new(query.param("ref").unwrap_or("refs/heads/main"));
    let name = scope.as_str();
    if !name.starts_with("refs/")
        || name.len() > 255
        || name.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(AdminError::bad(
            "ref must be a full ref name, such as refs/heads/main",
        ));
    }
    let write = query.flag("write")?;
    let ttl = match query.param("ttl") {
        None => TOKEN_TTL,
        Some(raw) => humantime::parse_duration(raw)
            .ok()
            .filter(|d| *d >= TOKEN_TTL_MIN && *d <= TOKEN_TTL_MAX)
            .ok_or_else(|| {
                AdminError::bad(format!(
                    "ttl must be a duration such as 12h or 30d, from 1m to 366d, not {:?}",
                    LogSafe(raw).to_string()
                ))
            })?,
    };
    let subject = match query.param("subject") {
        None | Some("") => "developer".to_owned(),
        Some(s) if s.len() <= 100 && !s.chars().any(char::is_control) => format!("developer:{s}"),
        Some(_) => {
            return Err(AdminError::bad(
                "subject must be a name of at most 100 characters",
            ))
        }
    };
    let repository = app.cache().one_repository(wanted).await?.ok_or_else(|| {
        AdminError::not_found(format!(
            "no such repository: {:?} (hoard knows a repository once a job has used it)",
            LogSafe(wanted).to_string()
        ))
    })?;
    let who = crate::auth::token::Identity {
        repository: repository.repository.clone(),
        repository_name: repository.name.clone(),
        read_scopes: vec![scope.clone()],
        write_scope: write.then(|| scope.clone()),
        kind: crate::model::CallerKind::Developer,
        issuer: String::new(),
        subject,
        run_id: String::new(),
        job_id: String::new(),
    };
    let signer = app.signer();
    let exp = signer.now() + ttl.as_secs();
    let token = signer.tool_token(&who, exp);
    tracing::info!(
        target: "hoard::audit",
        action = "issue_token",
        repository = %LogSafe(who.display_repository()),
        scope = %LogSafe(scope.as_str()),
        write,
        subject = %LogSafe(&who.subject),
        expires = exp,
        // Names the token in later questions without being it.
        fingerprint = %hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes())[..6]),
        "a token was issued for a repository's build tools"
    );
    Ok(wire::ToolToken {
        token,
        repository_id: who.repository.as_str().to_owned(),
        repository: who.repository_name.clone(),
        read_refs: vec![scope.as_str().to_owned()],
        write_ref: who.write_scope.as_ref().map(|s| s.as_str().to_owned()),
        subject: who.subject.clone(),
        expires_at: wire::time(exp as i64 * 1000),
    })
}

/// What the metadata and the entry bytes are kept in, for `status`.
#[derive(Debug, Clone)]
pub struct Backends {
    /// `sqlite`, `postgres` or `mysql`.
    pub database: &'static str,
    /// Where entry bytes live: `file`, `s3`, `gcs` or `azure`.
    pub storage: &'static str,
}
