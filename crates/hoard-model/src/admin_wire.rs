//! The admin API's answers as types: the server serializes them, `hoard caches` and
//! `hoard status` deserialize them, and `openapi.json` is checked against them (see
//! `openapi.rs`). Field names are the wire names (GitHub's REST cache API where it has one,
//! read by the dashboard too): renaming a field changes the API.
//!
//! Plain strings and numbers only, so that a client needs nothing from the domain to read them.

use serde::{Deserialize, Serialize};

use crate::{ListedEntry, Millis, Provenance, RepositoryUsage};

/// Every error: `{"message": …}` (schema `Error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorMessage {
    pub message: String,
}

/// An entry: GitHub's `actions_caches` item, plus repository name and hits (schema `Cache`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cache {
    pub id: i64,
    pub repository_id: String,
    /// Owner/name, empty if no caller named it.
    pub repository: String,
    #[serde(rename = "ref")]
    pub git_ref: String,
    pub key: String,
    pub version: String,
    pub size_in_bytes: u64,
    /// RFC 3339 with milliseconds.
    pub created_at: String,
    /// The latest restore, or the creation time.
    pub last_accessed_at: String,
    pub hits: u64,
    /// Who wrote it; `None` (null) for entries saved before hoard recorded it.
    pub written_by: Option<WrittenBy>,
    /// `sha256:<hex>` of the entry's bytes (one chunk), or `sha256-chunks:<hex>` of its chunks'
    /// SHA-256s in order; `None` (null) for entries saved before hoard recorded it.
    pub digest: Option<String>,
    /// `live`, or `quarantined`: out of every lookup, kept for examination.
    #[serde(default = "live")]
    pub state: String,
    /// When it was put in quarantine (RFC 3339); only while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined_at: Option<String>,
    /// Why: `quarantined by admin`, or the damage an integrity check found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine_reason: Option<String>,
    /// When its quarantine ends and it is deleted (`--quarantine-retention` after it began).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine_expires_at: Option<String>,
    /// Where it came from, if it was promoted from another ref (schema `Promoted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted: Option<Promoted>,
    /// The build tool that wrote it through its own protocol (`turbo`); `None` (null) for an
    /// Actions cache entry.
    #[serde(default)]
    pub tool: Option<String>,
    /// Where it was read from (the upstream cache's host), for an entry stored on a local miss
    /// from the upstream cache; absent for every other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_through: Option<String>,
}

/// A promoted entry's origin (schema `Promoted`): see [`crate::Promotion`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Promoted {
    /// The ref of the entry it copies.
    pub from_ref: String,
    /// What promoted it: a GitHub webhook delivery's id, or `admin:<operator>`.
    pub by: String,
    /// Why: `merge_group:<head ref>`, `pull_request:<number>`, or empty by hand.
    pub cause: String,
}

impl From<&crate::Promotion> for Promoted {
    fn from(p: &crate::Promotion) -> Self {
        Self {
            from_ref: p.from_scope.as_str().to_owned(),
            by: p.by.clone(),
            cause: p.cause.clone(),
        }
    }
}

/// What a promotion did (schema `PromotionResult`): `POST promotions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromotionResult {
    pub repository_id: String,
    pub from_ref: String,
    pub to_ref: String,
    /// What the promoted entries record as their `promoted.by` (the purge filter
    /// `promoted_by` undoes the promotion).
    pub promoted_by: String,
    pub dry_run: bool,
    /// The entries made in `to_ref` (or that would be, on a dry run).
    pub promoted: Vec<PromotedEntry>,
    /// Entries whose key and version `to_ref` holds already: the entry there stays.
    pub present: u64,
    /// Entries the write policy refuses in `to_ref` (a freeze or a denial).
    pub refused: u64,
}

/// A token issued for one repository's build tools outside Actions (schema `ToolToken`):
/// `POST tokens`. It reads `read_refs` (and writes `write_ref`, if any) of the repository at
/// hoard's build-tool endpoints and cache API, until `expires_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolToken {
    pub token: String,
    pub repository_id: String,
    /// Owner/name, empty if no caller named it.
    pub repository: String,
    pub read_refs: Vec<String>,
    /// `None` (null) for a read-only token, the default.
    pub write_ref: Option<String>,
    /// Who it is for: recorded as the writer (`written_by.subject`) and in the audit log.
    pub subject: String,
    pub expires_at: String,
}

/// One promoted entry (schema `PromotedEntry`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromotedEntry {
    /// The new entry's id; `None` (null) on a dry run.
    pub id: Option<i64>,
    /// The entry it copies.
    pub from_id: i64,
    pub key: String,
    pub version: String,
    pub size_in_bytes: u64,
}

fn live() -> String {
    "live".to_owned()
}

impl Cache {
    /// `listed` as the API shows it, its quarantine ending `retention` after it began.
    pub fn of(listed: &ListedEntry, retention: std::time::Duration) -> Self {
        let mut cache = Self::from(listed);
        if let Some(q) = &listed.quarantine {
            let ends =
                q.at.saturating_add(retention.as_millis().min(i64::MAX as u128) as i64);
            cache.quarantine_expires_at = Some(time(ends));
        }
        cache
    }
}

/// Who wrote an entry (schema `WrittenBy`): recorded when the upload was reserved. Empty
/// strings where the caller had nothing to say.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WrittenBy {
    /// `github`, `ghes`, `hs256`, `forgejo`, `namespace` or `anonymous`.
    pub kind: String,
    pub issuer: String,
    pub subject: String,
    pub run_id: String,
    pub job_id: String,
    pub address: String,
}

/// One entry with the jobs that received it (schema `CacheDetail`): `GET caches/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheDetail {
    #[serde(flatten)]
    pub cache: Cache,
    /// Who restored it, most recent first: its most recent readers (`hits` counts every
    /// restore).
    pub restored_by: Vec<Restore>,
}

/// One reader's restores of one entry (schema `Restore`), kept through a purge or quarantine
/// of the entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Restore {
    pub entry_id: i64,
    pub repository_id: String,
    #[serde(rename = "ref")]
    pub git_ref: String,
    pub key: String,
    /// The entry's writer, as it recorded it; `None` (null) if it recorded none.
    pub written_by: Option<WrittenBy>,
    pub written_at: String,
    /// Who received the entry.
    pub reader: WrittenBy,
    pub first_restored_at: String,
    pub last_restored_at: String,
    /// How many times this reader restored it.
    pub count: u64,
}

/// A job that restored entries (schema `RestoringJob`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoringJob {
    pub kind: String,
    pub subject: String,
    pub run_id: String,
    pub job_id: String,
    /// How many of the entries it restored, how many times in all, and when last.
    pub entries: u64,
    pub restores: u64,
    pub last_restored_at: String,
}

/// `GET restores` (schema `RestoreList`): which jobs restored the entries written under the
/// filter, and each record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreList {
    pub jobs: Vec<RestoringJob>,
    pub restores: Vec<Restore>,
    /// More records matched than the answer holds (the most recent are given).
    pub truncated: bool,
}

impl From<&crate::RestoreRecord> for Restore {
    fn from(r: &crate::RestoreRecord) -> Self {
        Self {
            entry_id: r.entry_id.get(),
            repository_id: r.repository.as_str().to_owned(),
            git_ref: r.scope.as_str().to_owned(),
            key: r.key.clone(),
            written_by: r.written_by.as_ref().map(WrittenBy::from),
            written_at: time(r.written_at),
            reader: WrittenBy::from(&r.reader),
            first_restored_at: time(r.first_at),
            last_restored_at: time(r.last_at),
            count: r.count,
        }
    }
}

impl From<&crate::RestoringJob> for RestoringJob {
    fn from(j: &crate::RestoringJob) -> Self {
        Self {
            kind: j.kind.as_str().to_owned(),
            subject: j.subject.clone(),
            run_id: j.run_id.clone(),
            job_id: j.job_id.clone(),
            entries: j.entries,
            restores: j.restores,
            last_restored_at: time(j.last_at),
        }
    }
}

/// A page of entries (schema `CacheList`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheList {
    /// Entries the filters select, on every page.
    pub total_count: u64,
    pub actions_caches: Vec<Cache>,
    /// The `cursor` of the next page; `None` (null) on the last page.
    pub next_cursor: Option<String>,
}

/// What a deletion removed, or on a dry run would remove (schema `Deleted`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    /// Entries deleted; on a dry run, the entries that would be.
    pub deleted: u64,
    /// Nothing was deleted: the answer says what would have been.
    #[serde(default)]
    pub dry_run: bool,
    /// The entries went to quarantine (`quarantine=true`) rather than being deleted; left out
    /// when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quarantine: bool,
    /// Their bytes.
    #[serde(default)]
    pub size_in_bytes: u64,
    /// Their ids, oldest first: the first 10,000 (see `ids_truncated`).
    #[serde(default)]
    pub ids: Vec<i64>,
    /// More entries went than `ids` names.
    #[serde(default)]
    pub ids_truncated: bool,
    /// Open uploads the filter selects that the purge ended (on a dry run, would end), so the
    /// writer it purges cannot finalize what it staged; left out when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub uploads_aborted: u64,
    /// On a dry run, the jobs that restored the entries it would delete (of the first 1,000);
    /// left out when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restored_by: Vec<RestoringJob>,
    /// With `restores=true`, how many restore records went with the entries; left out
    /// otherwise, and on a dry run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_records_deleted: Option<u64>,
}

/// What one repository holds and how its lookups went (schema `Repository`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repository {
    pub repository_id: String,
    /// Owner/name, empty if no caller named it.
    pub full_name: String,
    pub active_caches_size_in_bytes: u64,
    pub active_caches_count: u64,
    /// Of those, the entries of branches (and of the empty scope of forges without refs).
    pub branch_caches_size_in_bytes: u64,
    pub branch_caches_count: u64,
    /// Of those, the entries of pull requests (`refs/pull/*`) and tags (`refs/tags/*`): what
    /// counts against `--pr-scope-share`.
    pub pr_and_tag_caches_size_in_bytes: u64,
    pub pr_and_tag_caches_count: u64,
    pub hits: u64,
    pub misses: u64,
    /// See [`hit_ratio`].
    pub hit_ratio: Option<f64>,
}

/// What the store holds (schema `Totals`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub size_in_bytes: u64,
    pub entries: u64,
    /// Uploads reserved and not yet finalized.
    pub open_uploads: u64,
}

/// Usage per repository, most bytes first (schema `Usage`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub total: Totals,
    /// Repositories known, listed or not.
    pub repository_count: u64,
    pub repositories: Vec<Repository>,
}

/// The server: version, uptime, backends, limits, usage, lookups, warnings (schema `Status`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub started_at: String,
    pub uptime_seconds: u64,
    /// `sqlite`, `postgres` or `mysql`.
    pub database: String,
    /// Where entry bytes live: `file`, `s3`, `gcs` or `azure`.
    pub storage: String,
    pub limits: Limits,
    pub usage: Totals,
    pub lookups: Lookups,
    /// Entries this process quarantined since it started.
    pub quarantined: u64,
    /// Conditions an operator should act on, each one sentence.
    pub warnings: Vec<String>,
    /// The write policy in force and its file's health, as `GET policy` answers; always
    /// sent, `None` only when read from a server from before it was part of the status.
    #[serde(default)]
    pub policy: Option<Policy>,
}

/// The limits the server enforces; `None` (null): no limit (`Status.limits`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_entry_size: u64,
    pub repository_quota: Option<u64>,
    pub max_storage: Option<u64>,
    pub unused_ttl_seconds: Option<u64>,
    pub max_age_seconds: Option<u64>,
    pub max_open_uploads: u32,
}

/// Lookups this process answered since it started (`Status.lookups`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lookups {
    pub hits: u64,
    pub misses: u64,
    pub hit_ratio: Option<f64>,
}

/// The write policy in force (`--policy-file`; schema `Policy`). Without one, `source` and
/// `loaded_at` are `None` (null) and there are no rules: every token may do what it grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// The file the rules were read from.
    pub source: Option<String>,
    /// When the file was last read (start-up or SIGHUP), RFC 3339.
    pub loaded_at: Option<String>,
    /// In the file's order: the first that applies decides, and refusals name it by its
    /// place from 1 ("policy rule 1").
    pub rules: Vec<PolicyRule>,
    /// `sha256:<hex>` of the file's bytes in force.
    #[serde(default)]
    pub digest: Option<String>,
    /// The last attempt to load the file (start-up or SIGHUP).
    #[serde(default)]
    pub last_attempt: Option<PolicyAttempt>,
    /// Whether the file on disk holds other bytes than the policy in force, or cannot be
    /// read (a reload would not give what is in force); `None` (null): not known.
    #[serde(default)]
    pub differs_from_file: Option<bool>,
    /// When the file on disk was changed, when it differs and the file system says.
    #[serde(default)]
    pub file_changed_at: Option<String>,
    /// What an operator must know: a failed reload, a file that differs (as `/readyz` says).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The `[[promotion]]`s in the file's order: which promotions GitHub's webhooks make.
    #[serde(default)]
    pub promotions: Vec<PolicyPromotion>,
}

/// One `[[promotion]]` of the policy file (schema `PolicyPromotion`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyPromotion {
    /// An id, owner/name or a glob over them.
    pub repository: String,
    pub merge_queues: bool,
    pub merged_pull_requests: bool,
    pub forks: bool,
    /// The line of the file it starts on.
    pub line: u64,
}

/// One attempt to load the policy file (`Policy.last_attempt`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyAttempt {
    /// RFC 3339.
    pub at: String,
    /// `ok` (put in force) or `failed` (the policy before stays in force).
    pub outcome: String,
    /// Why it failed, one sentence naming the file and line; `None` (null) when it did not.
    pub error: Option<String>,
}

/// One rule of the policy (`Policy.rules`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRule {
    /// A glob over the repository id and owner/name; `*` for every repository.
    pub repository: String,
    /// A glob over the scope (git ref).
    pub scope: String,
    /// `read-write`, `read-only` or `deny`.
    pub access: String,
    /// The caller kinds the rule applies to; `None` (null): every caller.
    pub callers: Option<Vec<String>>,
    /// The line of the file the rule starts on.
    #[serde(default)]
    pub line: u64,
}

impl From<&ListedEntry> for Cache {
    fn from(listed: &ListedEntry) -> Self {
        let (e, record) = (&listed.entry, &listed.record);
        Self {
            id: e.id.get(),
            repository_id: e.repository.as_str().to_owned(),
            repository: listed.repository_name.clone(),
            git_ref: e.scope.as_str().to_owned(),
            key: e.key.clone(),
            version: e.version.clone(),
            size_in_bytes: e.size,
            created_at: time(e.created_at),
            last_accessed_at: time(e.last_used_at),
            hits: e.hits,
            written_by: record.written_by.as_ref().map(WrittenBy::from),
            digest: (!record.digest.is_empty()).then(|| record.digest.clone()),
            state: match listed.quarantine {
                Some(_) => "quarantined",
                None => "live",
            }
            .to_owned(),
            quarantined_at: listed.quarantine.as_ref().map(|q| time(q.at)),
            quarantine_reason: listed.quarantine.as_ref().map(|q| q.reason.clone()),
            quarantine_expires_at: None,
            promoted: record.promotion.as_ref().map(Promoted::from),
            tool: record.tool.as_ref().map(|t| t.tool.as_str().to_owned()),
            read_through: record.read_through.clone(),
        }
    }
}

impl From<&Provenance> for WrittenBy {
    fn from(p: &Provenance) -> Self {
        Self {
            kind: p.kind.as_str().to_owned(),
            issuer: p.issuer.clone(),
            subject: p.subject.clone(),
            run_id: p.run_id.clone(),
            job_id: p.job_id.clone(),
            address: p.address.clone(),
        }
    }
}

impl From<&RepositoryUsage> for Repository {
    fn from(r: &RepositoryUsage) -> Self {
        Self {
            repository_id: r.repository.as_str().to_owned(),
            full_name: r.name.clone(),
            active_caches_size_in_bytes: r.bytes,
            active_caches_count: r.entries,
            branch_caches_size_in_bytes: r.bytes.saturating_sub(r.pr_bytes),
            branch_caches_count: r.entries.saturating_sub(r.pr_entries),
            pr_and_tag_caches_size_in_bytes: r.pr_bytes,
            pr_and_tag_caches_count: r.pr_entries,
            hits: r.hits,
            misses: r.misses,
            hit_ratio: hit_ratio(r.hits, r.misses),
        }
    }
}

impl From<crate::Totals> for Totals {
    fn from(t: crate::Totals) -> Self {
        Self {
            size_in_bytes: t.bytes,
            entries: t.entries,
            open_uploads: t.open_uploads,
        }
    }
}

impl Lookups {
    pub fn new(hits: u64, misses: u64) -> Self {
        Self {
            hits,
            misses,
            hit_ratio: hit_ratio(hits, misses),
        }
    }
}

/// hits / (hits + misses), to three decimals; `None` without lookups.
pub fn hit_ratio(hits: u64, misses: u64) -> Option<f64> {
    let lookups = hits + misses;
    (lookups > 0).then(|| (hits as f64 / lookups as f64 * 1000.0).round() / 1000.0)
}

/// Counters of cache statistics (schema `StatsCounters`): lookups = exact_hits +
/// restore_key_hits + misses; evictions = the sum of `evictions_by_cause`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsCounters {
    pub lookups: u64,
    pub exact_hits: u64,
    pub restore_key_hits: u64,
    pub misses: u64,
    /// Sizes of the entries the hits named.
    pub bytes_restored: u64,
    pub saves: u64,
    pub bytes_saved: u64,
    pub evictions: u64,
    pub evictions_by_cause: EvictionsByCause,
    /// Writes (reservations and finalizes) the write policy refused.
    #[serde(default)]
    pub refused_writes: u64,
    /// Lookups the write policy refused (not in `lookups`).
    #[serde(default)]
    pub refused_reads: u64,
    /// Hits served by an entry promoted from another ref (in `exact_hits` or
    /// `restore_key_hits` too).
    #[serde(default)]
    pub promoted_hits: u64,
}

/// Entries removed, by cause (schema `EvictionsByCause`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictionsByCause {
    /// The repository's quota or the server's storage limit.
    pub evicted: u64,
    /// Unused for too long, or too old.
    pub expired: u64,
    /// A chunk was damaged or missing.
    pub quarantined: u64,
    /// An operator deleted it.
    pub deleted: u64,
}

impl From<&crate::Counters> for StatsCounters {
    fn from(c: &crate::Counters) -> Self {
        Self {
            lookups: c.lookups,
            exact_hits: c.exact_hits,
            restore_key_hits: c.restore_key_hits,
            misses: c.misses,
            bytes_restored: c.bytes_restored,
            saves: c.saves,
            bytes_saved: c.bytes_saved,
            evictions: c.evictions.total(),
            evictions_by_cause: EvictionsByCause {
                evicted: c.evictions.evicted,
                expired: c.evictions.expired,
                quarantined: c.evictions.quarantined,
                deleted: c.evictions.deleted,
            },
            refused_writes: c.refused_writes,
            refused_reads: c.refused_reads,
            promoted_hits: c.promoted_hits,
        }
    }
}

/// One bucket of a series (schema `StatsPoint`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsPoint {
    /// The bucket's start, RFC 3339 (UTC).
    pub start: String,
    #[serde(flatten)]
    pub counters: StatsCounters,
}

/// `GET stats` (schema `Stats`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// `hour` or `day`.
    pub bucket: String,
    /// The first bucket's start.
    pub since: String,
    pub until: String,
    /// The repository's id, `None` (null) for the whole server.
    pub repository: Option<String>,
    pub family: Option<String>,
    pub scope_class: Option<String>,
    pub totals: StatsCounters,
    /// One point per bucket, oldest first, zeros included.
    pub series: Vec<StatsPoint>,
}

/// A family's counters per bucket (schema `FamilyTrend`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FamilyTrend {
    pub lookups: Vec<u64>,
    pub hits: Vec<u64>,
    pub misses: Vec<u64>,
}

/// One family of one repository for one class of refs (schema `FamilyStats`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FamilyStats {
    pub repository: String,
    pub repository_name: String,
    pub family: String,
    pub scope_class: String,
    #[serde(flatten)]
    pub counters: StatsCounters,
    /// Hits over lookups; `None` (null) without lookups.
    pub hit_ratio: Option<f64>,
    /// What its entries hold now.
    pub bytes_stored: u64,
    pub entries: u64,
    pub trend: FamilyTrend,
}

/// `GET stats/families` (schema `Families`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Families {
    pub since: String,
    pub until: String,
    /// The trend's bucket: `hour` or `day`.
    pub bucket: String,
    /// The repository's quota, or without a repository the server's storage limit.
    pub quota_bytes: Option<u64>,
    /// Bytes of every entry the filter covers.
    pub stored_bytes: u64,
    pub families: Vec<FamilyStats>,
}

/// A bucket's start: RFC 3339 to the second.
pub fn bucket_time(millis: Millis) -> String {
    crate::rfc3339_seconds(millis)
}

pub fn time(millis: Millis) -> String {
    crate::rfc3339_millis(millis)
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_ratios_are_rounded_and_none_without_lookups() {
        assert_eq!(hit_ratio(0, 0), None);
        assert_eq!(hit_ratio(2, 1), Some(0.667));
        assert_eq!(hit_ratio(5, 0), Some(1.0));
    }

    #[test]
    fn times_are_rfc3339_with_milliseconds_and_clamped() {
        assert_eq!(time(1_500), "1970-01-01T00:00:01.500Z");
        assert_eq!(time(-1), "1970-01-01T00:00:00.000Z");
        assert_eq!(time(i64::MAX), "9999-12-31T23:59:59.999Z");
    }
}
