//! Prometheus metrics, served at `/metrics` in the text format. Cardinality stays bounded:
//! labels are route templates, status classes, outcomes, causes and operations, never keys or
//! entries; repositories only behind `--metrics-repositories`, capped.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RepositoryLabels {
    repository: String,
    outcome: &'static str,
}

/// Lookups per repository for the first `cap` repositories this process sees; the rest are
/// counted as `other`, so the series stay bounded.
struct PerRepository {
    cap: usize,
    seen: std::sync::Mutex<std::collections::HashSet<String>>,
    lookups: Family<RepositoryLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FamilyLabels {
    repository: String,
    family: String,
    outcome: &'static str,
}

/// Lookups per key family for the first `cap` (repository, family) pairs this process sees; the
/// rest are counted as repository and family `other`.
struct PerFamily {
    cap: usize,
    seen: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
    lookups: Family<FamilyLabels, Counter>,
    /// Hits served by promoted entries (outcome `exact_hit` or `restore_key_hit`).
    promoted: Family<FamilyLabels, Counter>,
}

/// `value` with every character other than letters, digits and `._/:@-` made `_`: names come
/// from tokens and keys, and the text format writes label values as they are.
fn label_safe(value: &str) -> std::borrow::Cow<'_, str> {
    let safe = |c: char| c.is_ascii_alphanumeric() || "._/:@-".contains(c);
    if value.chars().all(safe) {
        return value.into();
    }
    value
        .chars()
        .map(|c| if safe(c) { c } else { '_' })
        .collect::<String>()
        .into()
}

/// A route's request counters (by status class) and duration histogram, resolved once: the
/// request path then counts with an atomic add instead of hashing its labels in the family.
#[derive(Default)]
struct RouteHandles {
    statuses: [OnceLock<Counter>; 5],
    duration: OnceLock<Histogram>,
}

const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// How callers are identified, in the order of [`Metrics::callers`].
const CALLER_OUTCOMES: [&str; 5] = ["token", "forgejo", "namespace", "anonymous", "refused"];

/// The label of repositories past the cap.
const OTHER_REPOSITORIES: &str = "other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: &'static str,
}

/// How a lookup ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupOutcome {
    /// The primary key itself.
    Exact,
    /// The newest entry whose key starts with the primary key.
    Prefix,
    /// One of the restore keys, exactly or as a prefix.
    RestoreKey,
    Miss,
}

impl LookupOutcome {
    fn label(self) -> &'static str {
        match self {
            Self::Exact => "exact_hit",
            Self::Prefix => "prefix_hit",
            Self::RestoreKey => "restore_key_hit",
            Self::Miss => "miss",
        }
    }
}

fn latency_buckets() -> Histogram {
    // 0.5 ms to ~16 s: lookups sit at the bottom, large uploads at the top.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0005, 2.0, 16,
    ))
}

/// Every metric hoard exports.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<RouteLabels, Histogram, fn() -> Histogram>,
    lookups: Family<OutcomeLabels, Counter>,
    promoted_hits: Counter,
    uploaded: Counter,
    downloaded: Counter,
    tokens: Family<OutcomeLabels, Counter>,
    removed: Family<CauseLabels, Counter>,
    chunks_deleted: Family<CauseLabels, Counter>,
    stored_bytes: Gauge,
    stored_entries: Gauge,
    open_uploads: Gauge,
    digests_pending: Gauge,
    policy_reload_failures: Counter,
    policy_last_load: Gauge,
    database: Family<OperationLabels, Histogram, fn() -> Histogram>,
    storage: Family<OperationLabels, Histogram, fn() -> Histogram>,
    per_repository: Option<PerRepository>,
    per_family: Option<PerFamily>,
    /// Routes whose handles are kept (see [`Metrics::with_routes`]), and their handles.
    known_routes: &'static [&'static str],
    route_handles: Box<[RouteHandles]>,
    /// Lookups by [`LookupOutcome`], and callers by [`CALLER_OUTCOMES`], resolved once.
    outcomes: [OnceLock<Counter>; 4],
    callers: [OnceLock<Counter>; 5],
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("hoard");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by route template and status class",
            requests.clone(),
        );
        let durations = Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_buckets,
        );
        registry.register_with_unit(
            "http_request_duration",
            "Time to the response's head, by route template (downloads stream after it)",
            Unit::Seconds,
            durations.clone(),
        );
        let lookups = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "lookups",
            "Cache lookups by outcome: exact_hit, prefix_hit, restore_key_hit, miss",
            lookups.clone(),
        );
        let promoted_hits = Counter::default();
        registry.register(
            "promoted_hits",
            "Cache hits served by an entry promoted from another ref (a merge queue's, a merged pull request's): counted in hoard_lookups_total too",
            promoted_hits.clone(),
        );
        let uploaded = Counter::default();
        registry.register_with_unit(
            "uploaded",
            "Bytes stored as chunks (uploads and v1 ranges)",
            Unit::Bytes,
            uploaded.clone(),
        );
        let downloaded = Counter::default();
        registry.register_with_unit(
            "downloaded",
            "Bytes of entries sent to clients",
            Unit::Bytes,
            downloaded.clone(),
        );
        let tokens = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "caller_checks",
            "Callers identified, by how: token, forgejo, namespace, anonymous; or refused",
            tokens.clone(),
        );
        let removed = Family::<CauseLabels, Counter>::default();
        registry.register(
            "entries_removed",
            "Entries removed, by cause: evicted, expired, quarantined, deleted (by an operator)",
            removed.clone(),
        );
        let chunks_deleted = Family::<CauseLabels, Counter>::default();
        registry.register(
            "chunks_deleted",
            "Chunks deleted by maintenance: grace_over (removed entries), orphan",
            chunks_deleted.clone(),
        );
        let stored_bytes = Gauge::default();
        registry.register_with_unit(
            "stored",
            "Bytes of all entries (read from the metadata database at each scrape)",
            Unit::Bytes,
            stored_bytes.clone(),
        );
        let stored_entries = Gauge::default();
        registry.register(
            "stored_entries",
            "Entries of all repositories (read from the metadata database at each scrape)",
            stored_entries.clone(),
        );
        let open_uploads = Gauge::default();
        registry.register(
            "open_uploads",
            "Uploads reserved and not yet finalized or abandoned (read at each scrape)",
            open_uploads.clone(),
        );
        let digests_pending = Gauge::default();
        registry.register(
            "digests_pending",
            "Entries this process queued for the digest pass and not yet hashed",
            digests_pending.clone(),
        );
        let policy_reload_failures = Counter::default();
        registry.register(
            "policy_reload_failures",
            "Reloads of the write policy file (SIGHUP) that failed, leaving the policy before in force",
            policy_reload_failures.clone(),
        );
        let policy_last_load = Gauge::default();
        registry.register_with_unit(
            "policy_last_load_timestamp",
            "When the write policy in force was loaded (start-up or reload), in Unix seconds; 0 without --policy-file",
            Unit::Seconds,
            policy_last_load.clone(),
        );
        let database =
            Family::<OperationLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_buckets,
            );
        registry.register_with_unit(
            "database_operation_duration",
            "Time of metadata database operations, by operation (the metadata store's method)",
            Unit::Seconds,
            database.clone(),
        );
        let storage = Family::<OperationLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_buckets,
        );
        registry.register_with_unit(
            "storage_operation_duration",
            "Time of chunk store operations: put (receiving and storing a chunk), get (opening one), delete, list, sync, ping, capacity",
            Unit::Seconds,
            storage.clone(),
        );
        Self {
            per_repository: None,
            per_family: None,
            known_routes: &[],
            route_handles: Box::default(),
            outcomes: Default::default(),
            callers: Default::default(),
            database,
            storage,
            registry,
            stored_entries,
            open_uploads,
            digests_pending,
            policy_reload_failures,
            policy_last_load,
            requests,
            durations,
            lookups,
            promoted_hits,
            uploaded,
            downloaded,
            tokens,
            removed,
            chunks_deleted,
            stored_bytes,
        }
    }

    /// Keeps the handles of these routes' series once they are first used, so that counting
    /// a request on them neither allocates nor hashes. Other routes are counted too, through
    /// the families.
    pub fn with_routes(mut self, routes: &'static [&'static str]) -> Self {
        self.known_routes = routes;
        self.route_handles = routes.iter().map(|_| RouteHandles::default()).collect();
        self
    }

    /// One answered request: its route template (or `other`), status and time to the head.
    pub fn request(&self, route: &str, status: u16, elapsed: Duration) {
        let class = match status {
            100..=199 => 0,
            200..=299 => 1,
            300..=399 => 2,
            400..=499 => 3,
            _ => 4,
        };
        let counter_of = || {
            self.requests
                .get_or_create(&RequestLabels {
                    route: route.to_owned(),
                    status: STATUS_CLASSES[class],
                })
                .clone()
        };
        let histogram_of = || {
            self.durations
                .get_or_create(&RouteLabels {
                    route: route.to_owned(),
                })
                .clone()
        };
        match self.known_routes.iter().position(|known| *known == route) {
            Some(i) => {
                let handles = &self.route_handles[i];
                handles.statuses[class].get_or_init(counter_of).inc();
                handles
                    .duration
                    .get_or_init(histogram_of)
                    .observe(elapsed.as_secs_f64());
            }
            None => {
                counter_of().inc();
                histogram_of().observe(elapsed.as_secs_f64());
            }
        }
    }

    fn outcome(&self, outcome: LookupOutcome) -> &Counter {
        let index = match outcome {
            LookupOutcome::Exact => 0,
            LookupOutcome::Prefix => 1,
            LookupOutcome::RestoreKey => 2,
            LookupOutcome::Miss => 3,
        };
        self.outcomes[index].get_or_init(|| {
            self.lookups
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.label(),
                })
                .clone()
        })
    }

    pub fn lookup(&self, outcome: LookupOutcome) {
        self.outcome(outcome).inc();
    }

    /// A hit served by a promoted entry (counted by [`Metrics::lookup`] too).
    pub fn promoted_hit(&self) {
        self.promoted_hits.inc();
    }

    /// Also counts lookups per repository (`hoard_repository_lookups_total`), for the first
    /// `cap` repositories seen.
    pub fn with_repositories(mut self, cap: usize) -> Self {
        if cap == 0 {
            return self;
        }
        let lookups = Family::<RepositoryLabels, Counter>::default();
        self.registry.register(
            "repository_lookups",
            "Cache lookups per repository (owner/name, else its id) by outcome: hit, miss; repositories past --metrics-repositories are `other`",
            lookups.clone(),
        );
        self.per_repository = Some(PerRepository {
            cap,
            seen: Default::default(),
            lookups,
        });
        self
    }

    /// A lookup of a repository (its name, or its id if it has none), if per-repository
    /// series are on. Characters other than letters, digits and `._/:@-` become `_`: the name
    /// comes from a token, and the text format writes label values as they are.
    pub fn repository_lookup(&self, repository: &str, hit: bool) {
        let Some(per) = &self.per_repository else {
            return;
        };
        let repository = label_safe(repository);
        let label = {
            let mut seen = per.seen.lock().unwrap_or_else(|p| p.into_inner());
            if seen.contains(repository.as_ref()) {
                repository.as_ref()
            } else if seen.len() < per.cap {
                seen.insert(repository.to_string());
                repository.as_ref()
            } else {
                OTHER_REPOSITORIES
            }
        };
        per.lookups
            .get_or_create(&RepositoryLabels {
                repository: label.to_owned(),
                outcome: if hit { "hit" } else { "miss" },
            })
            .inc();
    }

    /// Also counts lookups per key family (`hoard_family_lookups_total`), for the first `cap`
    /// (repository, family) pairs seen.
    pub fn with_families(mut self, cap: usize) -> Self {
        if cap == 0 {
            return self;
        }
        let lookups = Family::<FamilyLabels, Counter>::default();
        self.registry.register(
            "family_lookups",
            "Cache lookups per repository and key family by outcome: exact_hit, restore_key_hit, miss; pairs past --metrics-families are `other`",
            lookups.clone(),
        );
        let promoted = Family::<FamilyLabels, Counter>::default();
        self.registry.register(
            "family_promoted_hits",
            "Cache hits served by an entry promoted from another ref, per repository and key family by outcome: exact_hit, restore_key_hit (counted in hoard_family_lookups_total too)",
            promoted.clone(),
        );
        self.per_family = Some(PerFamily {
            cap,
            seen: Default::default(),
            lookups,
            promoted,
        });
        self
    }

    /// A lookup of `family` in a repository (its name, or its id), if per-family series are on;
    /// a hit (`outcome`) served by a promoted entry counts in the promoted series too.
    pub fn family_lookup(
        &self,
        repository: &str,
        family: &str,
        outcome: &'static str,
        promoted: bool,
    ) {
        let Some(per) = &self.per_family else {
            return;
        };
        let pair = (
            label_safe(repository).into_owned(),
            label_safe(family).into_owned(),
        );
        let pair = {
            let mut seen = per.seen.lock().unwrap_or_else(|p| p.into_inner());
            if seen.contains(&pair) {
                pair
            } else if seen.len() < per.cap {
                seen.insert(pair.clone());
                pair
            } else {
                (OTHER_REPOSITORIES.to_owned(), OTHER_REPOSITORIES.to_owned())
            }
        };
        let labels = FamilyLabels {
            repository: pair.0,
            family: pair.1,
            outcome,
        };
        if promoted {
            per.promoted.get_or_create(&labels).inc();
        }
        per.lookups.get_or_create(&labels).inc();
    }

    /// One metadata database operation and how long it took.
    pub fn database(&self, operation: &'static str, elapsed: Duration) {
        self.database
            .get_or_create(&OperationLabels { operation })
            .observe(elapsed.as_secs_f64());
    }

    /// One chunk store operation and how long it took.
    pub fn storage(&self, operation: &'static str, elapsed: Duration) {
        self.storage
            .get_or_create(&OperationLabels { operation })
            .observe(elapsed.as_secs_f64());
    }

    /// Lookups since start that found an entry, and that found none.
    pub fn lookup_totals(&self) -> (u64, u64) {
        let count = |outcome: LookupOutcome| self.outcome(outcome).get();
        let hits = [
            LookupOutcome::Exact,
            LookupOutcome::Prefix,
            LookupOutcome::RestoreKey,
        ]
        .into_iter()
        .map(count)
        .sum();
        (hits, count(LookupOutcome::Miss))
    }

    pub fn uploaded(&self, bytes: u64) {
        self.uploaded.inc_by(bytes);
    }

    pub fn downloaded(&self, bytes: u64) {
        self.downloaded.inc_by(bytes);
    }

    /// How a caller was identified (`token`, `forgejo`, `namespace`, `anonymous`) or refused
    /// (`refused`).
    pub fn caller(&self, outcome: &'static str) {
        let counter = |outcome| {
            self.tokens
                .get_or_create(&OutcomeLabels { outcome })
                .clone()
        };
        match CALLER_OUTCOMES.iter().position(|known| *known == outcome) {
            Some(i) => self.callers[i].get_or_init(|| counter(outcome)).inc(),
            None => counter(outcome).inc(),
        };
    }

    pub fn removed(&self, cause: &'static str, entries: u64) {
        self.removed
            .get_or_create(&CauseLabels { cause })
            .inc_by(entries);
    }

    pub fn chunks_deleted(&self, cause: &'static str, chunks: u64) {
        self.chunks_deleted
            .get_or_create(&CauseLabels { cause })
            .inc_by(chunks);
    }

    /// The entries waiting for the digest pass, as of now.
    pub fn digests_pending(&self, queued: usize) {
        self.digests_pending
            .set(queued.min(i64::MAX as usize) as i64);
    }

    /// A write policy put in force at `at` (milliseconds since the epoch).
    pub fn policy_loaded(&self, at: i64) {
        self.policy_last_load.set(at.div_euclid(1000));
    }

    /// A reload of the write policy file that failed.
    pub fn policy_reload_failed(&self) {
        self.policy_reload_failures.inc();
    }

    /// The text exposition, with the store's totals as read now.
    pub fn render(&self, totals: Option<crate::model::Totals>) -> String {
        if let Some(t) = totals {
            let gauge = |n: u64| n.min(i64::MAX as u64) as i64;
            self.stored_bytes.set(gauge(t.bytes));
            self.stored_entries.set(gauge(t.entries));
            self.open_uploads.set(gauge(t.open_uploads));
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn repository_labels_are_capped_and_cleaned() {
        let m = Metrics::new().with_repositories(2);
        m.repository_lookup("octo/a", true);
        m.repository_lookup("evil\"} 1\nhoard_fake 9", false);
        m.repository_lookup("octo/c", true);
        let text = m.render(None);
        assert!(
            text.contains("repository=\"octo/a\",outcome=\"hit\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("repository=\"evil___1_hoard_fake_9\""),
            "{text}"
        );
        assert!(
            text.contains("repository=\"other\",outcome=\"hit\"} 1"),
            "{text}"
        );
        assert!(!text.contains("hoard_fake 9"), "{text}");
    }

    use super::*;

    #[test]
    fn counters_and_histograms_render_as_prometheus_text() {
        let m = Metrics::new();
        m.request("/healthz", 200, Duration::from_millis(1));
        m.request("/healthz", 503, Duration::from_millis(1));
        m.lookup(LookupOutcome::Miss);
        m.uploaded(10);
        m.policy_loaded(1_764_619_200_999);
        m.policy_reload_failed();
        let text = m.render(Some(crate::model::Totals {
            bytes: 42,
            entries: 2,
            repositories: 1,
            open_uploads: 1,
        }));
        for line in [
            "hoard_http_requests_total{route=\"/healthz\",status=\"2xx\"} 1",
            "hoard_http_requests_total{route=\"/healthz\",status=\"5xx\"} 1",
            "hoard_http_request_duration_seconds_count{route=\"/healthz\"} 2",
            "hoard_lookups_total{outcome=\"miss\"} 1",
            "hoard_uploaded_bytes_total 10",
            "hoard_stored_bytes 42",
            "hoard_stored_entries 2",
            "hoard_open_uploads 1",
            "hoard_policy_reload_failures_total 1",
            "hoard_policy_last_load_timestamp_seconds 1764619200",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
