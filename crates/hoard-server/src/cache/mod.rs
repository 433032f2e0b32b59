//! The domain: who may reserve, upload, finalize and restore what, and in which order entries
//! match. Talks only to [`MetaStore`] and [`BlobStore`]; knows nothing of HTTP.
//!
//! Every change follows one pattern: load state from the metadata store, decide with a pure
//! function of [`upload`] or [`matching`], and have the store apply the decision only if the
//! state it was made on is unchanged (the upload's revision). A change refused as stale is
//! decided again on fresh state, so concurrent requests, in this process or another one sharing
//! the database, never apply a decision made on state that no longer holds.
//!
//! This module wires [`Cache`] together; saving is in `save` (and v1's ranges in `ranges`),
//! restoring in `restore`, and what a call answers when it fails in [`CacheError`].

pub mod admin;
mod backoff;
mod digest_pass;
pub mod durability;
mod error;
pub mod family_stats;
pub mod insight;
mod integrity;
pub mod lifecycle;
pub mod matching;
mod names;
mod pacing;
pub mod policy;
pub mod promotion;
mod ranges;
mod read_through;
pub mod recent;
mod restore;
mod save;
pub mod tools;
pub mod upload;
pub mod usage;
pub mod webhooks;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::Identity;
use crate::blob::BlobStore;
use crate::meta::{MetaError, MetaStore};
use crate::model::{BlobName, CacheKey, Clock, Counters, EntryId, LogSafe, RefClass, Scope, Slot};

pub use error::CacheError;
pub use pacing::{Serving, Traffic};
pub use restore::{slices, Hit, OpenEntry};
use save::LinkedUpload;

/// How long `/readyz` waits for the metadata database: its answer, with the time to make it,
/// comes within 3 s.
pub const DATABASE_READINESS_DEADLINE: Duration = Duration::from_millis(2500);

/// How long `/readyz` and the admin API wait to learn whether the policy file on disk differs
/// from the policy in force (a stat, and a read of at most 1 MiB when it changed).
pub const POLICY_FILE_CHECK_DEADLINE: Duration = Duration::from_millis(300);

/// Domain settings.
#[derive(Debug, Clone)]
pub struct Policy {
    /// How long a reservation may stay open before another job may take the key
    /// (GitHub: 24 h, PROTOCOL.md §9).
    pub reservation_ttl: Duration,
    /// How often stored chunks are made durable against a machine crash.
    pub sync_interval: Duration,
    /// Most uploads one repository may have open at once.
    pub max_open_uploads: u32,
    /// Largest entry accepted, in bytes.
    pub max_entry_size: u64,
    /// How long a lookup's answer is reused (see [`recent`]); zero turns that off.
    pub lookup_cache_ttl: Duration,
    /// Quotas, limits, expiry and garbage collection (see [`lifecycle`]).
    pub lifecycle: lifecycle::Limits,
    /// Most key families whose statistics are kept per repository (see [`family_stats`]).
    pub stats_max_families: usize,
}

#[derive(Debug, Clone)]
pub struct Cache {
    meta: Arc<dyn MetaStore>,
    blobs: Arc<dyn BlobStore>,
    policy: Policy,
    clock: Arc<dyn Clock>,
    usage: usage::UsageBuffer,
    /// Statistics by key family, written with `usage`.
    stats: family_stats::FamilyStats,
    /// Recent lookup answers (see [`recent`]).
    lookups: Arc<recent::RecentLookups>,
    /// Entries recently finalized or opened here: immutable once visible, so a download needs
    /// no query while its entry is known (same TTL and generations as lookups).
    entries: Arc<recent::Recent<EntryId, OpenEntry>>,
    /// Entries this process quarantined.
    quarantined: Arc<std::sync::atomic::AtomicU64>,
    /// Repositories whose quota a finalize is enforcing (see [`Cache::enforce_quota`]).
    evicting: Arc<lifecycle::Evicting>,
    /// Entries whose digest the digest pass is to record (see [`digest_pass`]).
    digests: Arc<digest_pass::DigestQueue>,
    metrics: Arc<crate::metrics::Metrics>,
    /// The write policy in force (`--policy-file`), swapped whole on reload.
    write_policy: Arc<policy::PolicyCell>,
    /// Which name goes with which repository id, for policy rules by name.
    names: Arc<names::RepositoryNames>,
}

impl Cache {
    pub fn new(
        meta: Arc<dyn MetaStore>,
        blobs: Arc<dyn BlobStore>,
        policy: Policy,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let policy_ttl = policy.lookup_cache_ttl;
        let max_families = policy.stats_max_families;
        Self {
            meta,
            blobs,
            policy,
            clock,
            usage: usage::UsageBuffer::default(),
            stats: family_stats::FamilyStats::new(max_families),
            lookups: Arc::new(recent::RecentLookups::new(policy_ttl)),
            entries: Arc::new(recent::Recent::new(policy_ttl)),
            quarantined: Arc::default(),
            evicting: Arc::default(),
            digests: Arc::default(),
            metrics: Arc::default(),
            write_policy: Arc::default(),
            names: Arc::default(),
        }
    }

    /// The server's time (the injected clock).
    pub fn now(&self) -> crate::model::Millis {
        self.clock.now()
    }

    /// Counts into `metrics` (shared with the stores' timing) instead of a registry of its own.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Start-up recovery: forgets entries a machine crash may have damaged (see
    /// [`durability`]). Run before serving.
    pub async fn recover(&self) -> Result<(), CacheError> {
        let recovered =
            durability::recover(self.meta.as_ref(), self.blobs.as_ref(), self.clock.now()).await;
        self.lookups.invalidate();
        self.entries.invalidate();
        recovered
    }

    /// Starts the background work of the domain (writing restore counts, syncing chunks to
    /// disk, the maintenance pass, the digest pass); the returned task ends after `stop`, once
    /// every loop has done its last round.
    pub fn spawn_background(
        &self,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let usage = tokio::spawn(self.usage.clone().run(
            self.meta.clone(),
            self.stats.clone(),
            self.clock.clone(),
            stop.clone(),
        ));
        let sync = tokio::spawn(durability::run(
            self.meta.clone(),
            self.blobs.clone(),
            self.policy.sync_interval,
            stop.clone(),
        ));
        let digests = self.spawn_digest_pass(stop.clone());
        let maintenance = tokio::spawn(self.clone().run_maintenance(stop));
        tokio::spawn(async move {
            let _ = usage.await;
            let _ = sync.await;
            let _ = maintenance.await;
            let _ = digests.await;
        })
    }

    /// Where the server marks the cache's requests as they arrive; background work keeps out
    /// of their way (see [`pacing`]).
    pub fn traffic(&self) -> Arc<Traffic> {
        self.digests.traffic.clone()
    }

    /// What this process counts (see [`crate::metrics`]).
    pub fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        &self.metrics
    }

    /// The metrics' text exposition for a scrape, with the store's `totals` and the digest
    /// pass's queue as of now.
    pub fn render_metrics(&self, totals: Option<crate::model::Totals>) -> String {
        self.metrics.digests_pending(self.digests.len());
        self.metrics.render(totals)
    }

    /// What the metadata database holds: bytes, entries, open uploads.
    pub async fn totals(&self) -> Result<crate::model::Totals, CacheError> {
        Ok(self.meta.repositories(None, 0).await?.totals)
    }

    /// Ready when the database and the chunk store both answer, asked at once; the database
    /// gets [`DATABASE_READINESS_DEADLINE`] whatever it does (down, hung, every connection
    /// busy), so a probe with a short timeout hears a 503 rather than nothing.
    pub async fn ready(&self) -> Result<(), CacheError> {
        let database = async {
            tokio::time::timeout(DATABASE_READINESS_DEADLINE, self.meta.ping())
                .await
                .unwrap_or_else(|_| {
                    Err(MetaError::Unavailable(format!(
                        "no answer to a ping within {:.1} s",
                        DATABASE_READINESS_DEADLINE.as_secs_f64()
                    )))
                })
        };
        let (database, blobs) = tokio::join!(database, self.blobs.ping());
        database?;
        blobs?;
        Ok(())
    }

    /// What kind of store holds the chunks: `file`, `s3`, `gcs` or `azure`.
    pub fn storage_kind(&self) -> &'static str {
        self.blobs.kind()
    }

    /// Puts `policy` in force (at start-up, and on each reload), replacing the one before;
    /// requests decided from now on follow it.
    pub fn set_write_policy(&self, policy: policy::Policy) {
        let now = self.clock.now();
        let file = policy.source.clone();
        if let Some(lifted) = self.write_policy.set(policy, now) {
            let file = file.map(|p| p.display().to_string()).unwrap_or_default();
            let file = LogSafe(&file).to_string();
            tracing::warn!(policy = %file, rules_lifted = lifted.rules, "{}", lifted.warning(&file));
        }
        self.metrics.policy_loaded(now);
    }

    /// Reads the policy file at `path` again and puts it in force; the number of its rules.
    /// A file that cannot be used leaves the policy in force as it is; the failure is counted,
    /// and kept (see [`Cache::policy_health`]) until a load succeeds.
    pub fn reload_write_policy(
        &self,
        path: &std::path::Path,
    ) -> Result<usize, policy::PolicyError> {
        match policy::Policy::load(path) {
            Ok(loaded) => {
                let rules = loaded.rules.len();
                self.set_write_policy(loaded);
                Ok(rules)
            }
            Err(e) => {
                self.write_policy.failed(&e, self.clock.now());
                self.metrics.policy_reload_failed();
                Err(e)
            }
        }
    }

    /// The write policy's health: what is in force, the last attempt to load the file and
    /// whether the file on disk still holds what is in force; `None` without `--policy-file`.
    /// The file is compared on a blocking thread for at most [`POLICY_FILE_CHECK_DEADLINE`],
    /// one comparison at a time; past that, or while another is under way, whether it differs
    /// is not known.
    pub async fn policy_health(&self) -> Option<policy::Health> {
        let installed = self.write_policy.current()?;
        let last_attempt = self.write_policy.last_attempt().unwrap_or(policy::Attempt {
            at: installed.loaded_at,
            error: None,
        });
        let on_disk = match self.write_policy.start_check() {
            Some(checking) => {
                let compared = installed.clone();
                let check = tokio::task::spawn_blocking(move || checking.compare(&compared));
                match tokio::time::timeout(POLICY_FILE_CHECK_DEADLINE, check).await {
                    Ok(Ok(on_disk)) => on_disk,
                    _ => policy::OnDisk::Unknown,
                }
            }
            None => policy::OnDisk::Unknown,
        };
        Some(policy::Health {
            installed,
            last_attempt,
            on_disk,
            lifted: self.write_policy.lifted(),
        })
    }

    /// The write policy in force and when it was loaded; `None` without `--policy-file`.
    pub fn write_policy(&self) -> Option<Arc<policy::Installed>> {
        self.write_policy.current()
    }

    /// Pairs repository ids with the names the store recorded (at start-up and on each policy
    /// reload), so that policy rules by name hold for tokens that carry only the id.
    pub async fn learn_repository_names(&self) -> Result<(), CacheError> {
        let known = self.meta.repositories(None, usize::MAX >> 1).await?.listed;
        self.names
            .seed(known.into_iter().map(|r| (r.repository, r.name)));
        Ok(())
    }

    /// A sentence for each policy rule whose owner/name no token has tied to an id yet.
    pub fn policy_warnings(&self) -> Vec<String> {
        self.write_policy
            .with(|p| p.unresolved_names(|name| self.names.knows_name(name)))
            .unwrap_or_default()
    }

    /// Why the write policy does not allow a write of `who` to `scope`, if it does not; nothing
    /// is recorded (see [`Cache::check_write_policy`]).
    fn write_policy_refusal(&self, who: &Identity, scope: &Scope) -> Option<policy::Refusal> {
        // Names are looked up only while a policy is in force: lookups without one pay nothing.
        let decided = self.write_policy.with(|p| {
            self.names
                .with_name(who, |name| p.check_write_as(who, name, scope))
        });
        decided.and_then(Result::err)
    }

    /// Refuses a write of `who` to `scope` that the write policy does not allow.
    fn check_write_policy(&self, who: &Identity, scope: &Scope) -> Result<(), CacheError> {
        match self.write_policy_refusal(who, scope) {
            Some(refused) => {
                audit_refusal("write_denied", who, &refused);
                Err(CacheError::WriteDeniedByPolicy(refused))
            }
            None => Ok(()),
        }
    }

    /// [`Cache::check_write_policy`] for a write of `key`: a refusal is counted in the
    /// statistics, in the family a save of `key` would count in.
    fn check_write_policy_of(
        &self,
        who: &Identity,
        scope: &Scope,
        key: &CacheKey,
    ) -> Result<(), CacheError> {
        let checked = self.check_write_policy(who, scope);
        if let Err(CacheError::WriteDeniedByPolicy(_)) = &checked {
            self.count_refused_write(who, scope, key);
        }
        checked
    }

    /// Counts a write of `key` to `scope` that the write policy refused, in the family a save
    /// of `key` would count in.
    fn count_refused_write(&self, who: &Identity, scope: &Scope, key: &CacheKey) {
        let family = self
            .stats
            .family_of_save(&who.repository, key.as_str(), &key.folded());
        let class = RefClass::of_caller(Some(scope), &who.read_scopes);
        self.stats.refused(
            &who.repository,
            &family,
            class,
            self.clock.now(),
            &Counters::refused_write(),
        );
    }

    /// [`Cache::readable_scopes`] for a lookup of `keys` (the primary key first): a lookup the
    /// write policy refuses is counted in the statistics, in the lookup's family.
    fn lookup_scopes<'a>(
        &self,
        who: &'a Identity,
        keys: &[CacheKey],
    ) -> Result<Cow<'a, [Scope]>, CacheError> {
        let scopes = self.readable_scopes(who);
        if let (Err(CacheError::ReadDeniedByPolicy(_)), Some(primary)) = (&scopes, keys.first()) {
            let restore: Vec<String> = keys[1..].iter().map(CacheKey::folded).collect();
            let folded = primary.folded();
            let family = crate::model::family::family_folded(primary.as_str(), &folded, &restore);
            let class = RefClass::of_caller(who.write_scope.as_ref(), &who.read_scopes);
            self.stats.refused(
                &who.repository,
                family,
                class,
                self.clock.now(),
                &Counters::refused_read(),
            );
        }
        scopes
    }

    /// The scopes `who` may read, in token order: the token's readable scopes less those the
    /// write policy denies (borrowed as they are without a policy).
    fn readable_scopes<'a>(&self, who: &'a Identity) -> Result<Cow<'a, [Scope]>, CacheError> {
        if who.read_scopes.is_empty() {
            return Err(CacheError::ReadDenied);
        }
        let decided = self.write_policy.with(|p| {
            self.names
                .with_name(who, |name| p.readable_as(who, name, &who.read_scopes))
        });
        match decided {
            None => Ok(Cow::Borrowed(&who.read_scopes)),
            Some(Ok(kept)) => Ok(Cow::Owned(kept)),
            Some(Err(refused)) => {
                audit_refusal("read_denied", who, &refused);
                Err(CacheError::ReadDeniedByPolicy(refused))
            }
        }
    }

    /// Deletes blobs no metadata refers to any more. Failures only leave orphans behind.
    async fn collect(&self, garbage: Vec<BlobName>) {
        for name in garbage {
            if let Err(e) = self.blobs.delete(&name).await {
                tracing::warn!(blob = %name, error = %e, "could not delete an unreferenced chunk");
            }
        }
    }
}

/// Forgets every reused answer (lookups and entries' chunk lists) unless disarmed: held across
/// a change that outdates answers, so that a change committed after its caller gave up (another
/// caller's batch may commit it, `meta/group_commit.rs`) outdates them all the same. Forgetting
/// too much only costs a query.
pub(crate) struct ForgetIfDropped<'a> {
    cache: &'a Cache,
    armed: bool,
}

impl<'a> ForgetIfDropped<'a> {
    pub(crate) fn new(cache: &'a Cache) -> Self {
        Self { cache, armed: true }
    }

    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ForgetIfDropped<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.cache.lookups.invalidate();
            self.cache.entries.invalidate();
        }
    }
}

/// The audit trail of writes: who reserved or finalized what (issue #4, point 5). The token's
/// claims are the client's text, so they are clipped. `id` is the upload's (reserve) or the
/// entry's (finalize).
fn audit(action: &str, who: &Identity, slot: &Slot, id: i64) {
    tracing::info!(
        target: "hoard::audit",
        action,
        repository = %LogSafe(slot.repository.as_str()),
        scope = %LogSafe(slot.scope.as_str()),
        key = %LogSafe(slot.key.as_str()),
        version = %LogSafe(slot.version.as_str()),
        kind = %who.kind,
        subject = %LogSafe(&who.subject),
        run_id = %LogSafe(&who.run_id),
        job_id = %LogSafe(&who.job_id),
        id,
    );
}

/// The audit line of a write or read the write policy refused.
fn audit_refusal(action: &str, who: &Identity, refused: &policy::Refusal) {
    tracing::info!(
        target: "hoard::audit",
        action,
        rule = refused.rule,
        access = %refused.access,
        repository = %LogSafe(who.repository.as_str()),
        repository_name = %LogSafe(&who.repository_name),
        scope = %LogSafe(refused.scope.as_str()),
        kind = %who.kind,
        subject = %LogSafe(&who.subject),
        run_id = %LogSafe(&who.run_id),
        job_id = %LogSafe(&who.job_id),
    );
}

/// How often a change refused as stale (another request changed the same upload between this
/// one's read and write) is decided again before the request gives up.
const MAX_ATTEMPTS: usize = 16;

/// Runs `attempt` (told how many tries came before it) again while the store refuses its
/// change as stale.
async fn retry_stale<T, F, Fut>(mut attempt: F) -> Result<T, CacheError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, CacheError>>,
{
    for tries in 0..MAX_ATTEMPTS {
        match attempt(tries).await {
            Err(CacheError::Meta(MetaError::Stale)) => tokio::task::yield_now().await,
            other => return other,
        }
    }
    Err(CacheError::Busy)
}

#[cfg(test)]
mod tests;
