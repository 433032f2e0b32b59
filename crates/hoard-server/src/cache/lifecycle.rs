//! Lifecycle: what leaves the cache, and when (GitHub's rules, plus the operator's limits).
//!
//! - After each finalize, the repository's least recently used entries are evicted until it is
//!   under its quota (`--repo-quota`, GitHub: 10 GB). Pull-request and tag entries also keep
//!   within their share of it (`--pr-scope-share`) and go first; a branch's entry is never
//!   evicted to make room for one of theirs ([`quota_steps`]).
//! - A maintenance pass, every `--gc-interval` on every process, aborts abandoned uploads,
//!   expires unused (and, optionally, old) entries, evicts across repositories while the store
//!   is over `--max-storage` or under `--min-free-space`, deletes the chunks whose deletion is
//!   due, and deletes orphaned chunks.
//! - Removing an entry deletes its rows at once (the next lookup misses) but only schedules its
//!   chunks' deletion, `--deletion-grace` later: a reader who got a download link before the
//!   removal still streams the whole entry, on any store.
//!
//! Every step is safe on several processes sharing a database: removals skip entries already
//! gone and report only what they removed, deletes are idempotent, and a chunk is deleted as an
//! orphan only when no row names it and it is older than the grace period, so a chunk whose
//! metadata is still being written is never taken.
//!
//! The choices (which entries, how many bytes must go) are pure functions, tested alone.

use std::time::Duration;

use futures_util::StreamExt;

use super::backoff::Backoff;
use super::{Cache, CacheError};
use crate::blob::Capacity;
use crate::meta::{
    EntryMove, EntryState, EntryWalk, Removal, RestoreBound, RestoreDrop, UploadSweep, UsageOf,
};
use crate::model::{
    BlobName, EntryId, EntryUse, LogSafe, Millis, QuotaUsage, RemovalCause, RepoId, ScopeClass,
    Share, UploadId,
};

/// How much free space `--min-free-space` keeps (parsed in `model`, where `config` reads it too).
pub use crate::model::units::FreeSpace;

/// How many rows one step of a pass loads at a time: memory stays bounded on any store.
const BATCH: usize = 500;
/// How many eviction candidates a quota check loads first: one finalize usually frees room by
/// evicting one or two entries, and loading 500 rows for that costs more than the eviction.
const FIRST_CANDIDATES: usize = 8;

/// Restore records dropped per statement when a bound is over.
const BATCH_RESTORES: usize = 5000;

/// The operator's lifecycle settings.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Bytes one repository's entries may hold (`None`: unlimited).
    pub repo_quota: Option<u64>,
    /// The share of `repo_quota` that a repository's pull-request and tag entries may hold
    /// (the whole: plain LRU over the repository).
    pub pr_scope_share: Share,
    /// Bytes all entries may hold together (`None`: unlimited).
    pub max_storage: Option<u64>,
    /// Free space to keep on a local-disk store's file system.
    pub min_free_space: Option<FreeSpace>,
    /// Entries unused for this long expire (`None`: never).
    pub unused_ttl: Option<Duration>,
    /// Entries older than this expire, used or not (`None`: never).
    pub max_age: Option<Duration>,
    /// How long removed entries' chunks stay readable, and how old an unreferenced chunk must
    /// be before it counts as an orphan.
    pub deletion_grace: Duration,
    /// How often the maintenance pass runs.
    pub gc_interval: Duration,
    /// How long hourly statistics stay hourly before they are folded into days.
    pub stats_retention: Duration,
    /// How long a restore record is kept after its latest restore (who received which entry:
    /// the incident playbook's "which jobs restored it").
    pub restore_records_retention: Duration,
    /// The most restore records one repository keeps, and all repositories together (`None`:
    /// no bound); the oldest (by latest restore) go first, at each maintenance pass.
    pub max_restore_records_per_repository: Option<u64>,
    pub max_restore_records: Option<u64>,
    /// How long a quarantined entry is kept (out of every lookup, for examination) before it
    /// goes for good.
    pub quarantine_retention: Duration,
}

impl Default for Limits {
    /// No limits, no expiry: what tests of other rules start from.
    fn default() -> Self {
        Self {
            repo_quota: None,
            pr_scope_share: Share::default(),
            max_storage: None,
            min_free_space: None,
            unused_ttl: None,
            max_age: None,
            deletion_grace: Duration::from_secs(2 * 3600),
            gc_interval: Duration::from_secs(600),
            stats_retention: Duration::from_secs(30 * 86_400),
            restore_records_retention: Duration::from_secs(90 * 86_400),
            max_restore_records_per_repository: None,
            max_restore_records: None,
            quarantine_retention: Duration::from_secs(30 * 86_400),
        }
    }
}

/// What the store holds against its global limits.
#[derive(Debug, Clone, Copy, Default)]
pub struct Occupancy {
    /// Bytes of all entries.
    pub stored: u64,
    /// Bytes removed whose deletion is still pending: they will be free soon.
    pub pending: u64,
    pub disk: Option<Capacity>,
}

/// How many bytes of entries must go for the store to be within its global limits.
pub fn global_excess(limits: &Limits, at: &Occupancy) -> u64 {
    let over_storage = limits
        .max_storage
        .map_or(0, |max| at.stored.saturating_sub(max));
    let short_of_space = match (limits.min_free_space, at.disk) {
        (Some(keep), Some(disk)) => keep
            .bytes(disk.total)
            .saturating_sub(disk.available.saturating_add(at.pending)),
        _ => 0,
    };
    over_storage.max(short_of_space)
}

/// The entries to evict to free `excess` bytes: least recently used first, from `candidates`
/// (already in that order), never one of `spare` (the entries whose finalizes asked).
pub fn choose_evictions(excess: u64, candidates: &[EntryUse], spare: &[EntryId]) -> Vec<EntryId> {
    let mut freed = 0u64;
    let mut chosen = Vec::new();
    for entry in candidates {
        if freed >= excess {
            break;
        }
        if spare.contains(&entry.id) {
            continue;
        }
        freed = freed.saturating_add(entry.size.max(1));
        chosen.push(entry.id);
    }
    chosen
}

/// The bound a [`QuotaStep`] brings a repository within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// All its entries within the quota.
    Quota,
    /// Its pull-request and tag entries within their share of the quota.
    PrShare,
}

/// One step of a quota check: evict the least recently used entries of class `from` (`None`:
/// of any class) until the repository is within `bound`, never the entries just written (those
/// whose finalizes asked for the check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaStep {
    pub bound: Bound,
    pub from: Option<ScopeClass>,
}

impl QuotaStep {
    /// How many bytes must go for the repository to be within the step's bound.
    /// `spared_pr` is the bytes of pull-request and tag entries just written: spared, but
    /// counted in the repository's bytes, so a branch step leaves them over rather than evict
    /// branch entries to make room for them.
    pub fn excess(&self, quota: u64, share: Share, used: QuotaUsage, spared_pr: u64) -> u64 {
        let over = match self.bound {
            Bound::Quota => used.bytes.saturating_sub(quota),
            Bound::PrShare => used.pr_bytes.saturating_sub(share.of(quota)),
        };
        if self.from == Some(ScopeClass::Branch) {
            over.saturating_sub(spared_pr)
        } else {
            over
        }
    }
}

/// The steps of a quota check after finalizes of entries of the `written` classes, in order;
/// each runs until its bound holds or it has nothing left to evict.
///
/// With the whole quota as the share, plain LRU over the repository (GitHub's rule). Otherwise:
/// 1. pull-request and tag entries over their share: the least recently used of them go;
/// 2. the repository over its quota: pull-request and tag entries go first, least recently
///    used first;
/// 3. still over, and a branch's entry was just written: the least recently used branch
///    entries go.
///
/// So a branch's entry is never evicted to make room for a pull request's or tag's. As with
/// the plain quota, the entries just written are never evicted by their own finalize: a pull
/// request's entry that fits only by evicting a branch's (or is larger than the share alone)
/// stays until the repository's next save, which evicts it first, so the repository is over by
/// at most its latest entries meanwhile.
pub fn quota_steps(share: Share, written: &[ScopeClass]) -> Vec<QuotaStep> {
    if share.is_whole() {
        return vec![QuotaStep {
            bound: Bound::Quota,
            from: None,
        }];
    }
    let step = |bound, from| QuotaStep {
        bound,
        from: Some(from),
    };
    let pr = ScopeClass::PullRequestOrTag;
    let mut steps = vec![step(Bound::PrShare, pr), step(Bound::Quota, pr)];
    if written.contains(&ScopeClass::Branch) {
        steps.push(step(Bound::Quota, ScopeClass::Branch));
    }
    steps
}

/// One thing a maintenance pass did, or would do in a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    AbortUpload(UploadId),
    Expire(EntryUse),
    Evict(EntryUse),
    /// A chunk of a removed entry whose grace period ended.
    DeleteChunk(BlobName),
    /// A chunk no metadata refers to.
    DeleteOrphan(BlobName),
}

/// Sees each [`Action`] of a pass as it happens: the pass itself keeps only counts, so its
/// memory does not grow with the work it does.
pub type Observer<'a> = &'a mut (dyn FnMut(Action) + Send);

/// How much one maintenance pass did, or would do with `dry_run`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    pub aborted_uploads: u64,
    pub pruned_uploads: u64,
    pub expired: u64,
    pub evicted: u64,
    pub deleted_chunks: u64,
    pub orphans: u64,
}

impl PassReport {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    fn count(&mut self, action: &Action) {
        match action {
            Action::AbortUpload(_) => self.aborted_uploads += 1,
            Action::Expire(_) => self.expired += 1,
            Action::Evict(_) => self.evicted += 1,
            Action::DeleteChunk(_) => self.deleted_chunks += 1,
            Action::DeleteOrphan(_) => self.orphans += 1,
        }
    }
}

/// Counts each action and passes it on.
struct Tally<'a, 'b> {
    report: PassReport,
    observer: &'a mut Observer<'b>,
}

impl Tally<'_, '_> {
    fn saw(&mut self, action: Action) {
        self.report.count(&action);
        (self.observer)(action);
    }
}

/// An entry just written: its id, class and size.
#[derive(Debug, Clone, Copy)]
pub(super) struct Written {
    pub id: EntryId,
    pub class: ScopeClass,
    pub size: u64,
}

/// Repositories whose quota is being enforced in this process, with the entries of the
/// finalizes that asked for one more check meanwhile.
pub(super) type Evicting = std::sync::Mutex<std::collections::HashMap<RepoId, Vec<Written>>>;

/// The right to evict for one repository, given back when dropped (also when the finalize
/// request is cancelled).
struct EvictionTurn<'a> {
    evicting: &'a Evicting,
    repository: RepoId,
}

impl<'a> EvictionTurn<'a> {
    /// The turn, or `None` (and a request for one more check, sparing `made`) if another
    /// finalize has it.
    fn take(evicting: &'a Evicting, repository: &RepoId, made: Written) -> Option<Self> {
        let mut map = evicting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(asking) = map.get_mut(repository) {
            asking.push(made);
            return None;
        }
        map.insert(repository.clone(), Vec::new());
        Some(Self {
            evicting,
            repository: repository.clone(),
        })
    }

    /// The entries of the finalizes that asked for a check since the last one (empty: none).
    fn asked_again(evicting: &Evicting, repository: &RepoId) -> Vec<Written> {
        let mut map = evicting.lock().unwrap_or_else(|p| p.into_inner());
        map.get_mut(repository)
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

impl Drop for EvictionTurn<'_> {
    fn drop(&mut self) {
        let mut map = self.evicting.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(&self.repository);
    }
}

pub(super) fn millis(d: Duration) -> Millis {
    d.as_millis().min(i64::MAX as u128) as Millis
}

impl Cache {
    /// How entries kept where `from` says leave now for `cause`: their chunks are deleted once
    /// the deletion grace is over.
    pub(super) fn removal<'a>(&self, from: EntryState, cause: &'a RemovalCause) -> Removal<'a> {
        let now = self.clock.now();
        Removal {
            from,
            cause,
            now,
            delete_at: now.saturating_add(millis(self.policy.lifecycle.deletion_grace)),
        }
    }

    /// Removes entries and schedules their chunks' deletion; forgets them in this process's
    /// reuse caches. Returns what was removed here (not by another process first).
    pub(super) async fn remove(
        &self,
        ids: &[EntryId],
        cause: RemovalCause,
    ) -> Result<Vec<EntryUse>, CacheError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let removal = self.removal(EntryState::Live, &cause);
        let now = removal.now;
        let forget = super::ForgetIfDropped::new(self);
        let removed = self
            .meta
            .move_entries(ids, EntryMove::Remove(removal))
            .await?;
        forget.disarm();
        self.metrics.removed(cause.as_str(), removed.len() as u64);
        self.stats.removed(&removed, &cause, now);
        // Any lookup answer may name a removed entry; other entries' chunk lists still hold.
        self.lookups.invalidate();
        self.entries.forget(removed.iter().map(|e| e.id));
        for entry in &removed {
            tracing::info!(
                target: "hoard::lifecycle",
                cause = cause.as_str(),
                entry = entry.id.get(),
                repository = %LogSafe(entry.repository.as_str()),
                size = entry.size,
                "entry removed"
            );
        }
        Ok(removed)
    }

    /// Quarantines an entry whose bytes failed a check: it is never served again, the next
    /// lookup misses, and its chunks are deleted after the grace period. The entries that
    /// share its chunks (a promotion's copies, or the entry a copy was promoted from) go with
    /// it: their bytes are the same.
    pub async fn quarantine(&self, id: EntryId, reason: String) -> Result<bool, CacheError> {
        tracing::error!(target: "hoard::integrity", entry = id.get(), %reason, "entry quarantined");
        let mut ids = vec![id];
        if let Some((_, chunks)) = self.meta.entry(id, EntryState::Live).await? {
            for placed in &chunks {
                let filter = crate::model::EntryFilter {
                    chunk: Some(placed.chunk.blob.as_str().to_owned()),
                    ..Default::default()
                };
                let page = crate::model::EntryPage::by_creation(&filter, 1000);
                for sharing in self.meta.select_entries(&page).await?.entries {
                    if !ids.contains(&sharing.entry.id) {
                        tracing::error!(target: "hoard::integrity", entry = sharing.entry.id.get(), shares_with = id.get(), "entry quarantined: it shares a damaged entry's chunks");
                        ids.push(sharing.entry.id);
                    }
                }
            }
        }
        let removed = self.remove(&ids, RemovalCause::Quarantined(reason)).await?;
        self.quarantined
            .fetch_add(removed.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(removed.iter().any(|e| e.id == id))
    }

    /// Entries quarantined by this process since it started.
    pub fn quarantined_count(&self) -> u64 {
        self.quarantined.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// After a finalize of `spare` (of `class`): evicts the repository's least recently used
    /// entries until it is within its quota and its pull-request and tag entries within their
    /// share, as [`quota_steps`] orders it; never `spare` itself.
    ///
    /// One finalize at a time evicts for a repository in this process: finalizes that arrive
    /// meanwhile only ask it to check once more, so a burst of saves is evicted for in a few
    /// transactions instead of one each.
    pub async fn enforce_quota(
        &self,
        repository: &RepoId,
        spare: EntryId,
        class: ScopeClass,
        size: u64,
    ) -> Result<(), CacheError> {
        let Some(quota) = self.policy.lifecycle.repo_quota else {
            return Ok(());
        };
        let made = Written {
            id: spare,
            class,
            size,
        };
        let Some(_turn) = EvictionTurn::take(&self.evicting, repository, made) else {
            return Ok(()); // the finalize evicting now will check again
        };
        let mut spared = vec![made];
        loop {
            self.evict_over_quota(repository, quota, &spared).await?;
            let more = EvictionTurn::asked_again(&self.evicting, repository);
            if more.is_empty() {
                return Ok(());
            }
            spared = more;
        }
    }

    /// Runs the [`quota_steps`] for the entries just `written`. Within its limits (the usual
    /// case), this costs one read of the repository's usage row.
    pub(super) async fn evict_over_quota(
        &self,
        repository: &RepoId,
        quota: u64,
        written: &[Written],
    ) -> Result<(), CacheError> {
        let share = self.policy.lifecycle.pr_scope_share;
        let classes: Vec<ScopeClass> = written.iter().map(|w| w.class).collect();
        let ids: Vec<EntryId> = written.iter().map(|w| w.id).collect();
        // A burst of finalizes of both classes is checked in one round (see `excess`).
        let spared_pr: u64 = written
            .iter()
            .filter(|w| w.class == ScopeClass::PullRequestOrTag)
            .map(|w| w.size)
            .sum();
        let mut used = self.meta.usage(UsageOf::Repository(repository)).await?;
        for step in quota_steps(share, &classes) {
            let mut wanted = FIRST_CANDIDATES;
            loop {
                let excess = step.excess(quota, share, used, spared_pr);
                if excess == 0 {
                    break;
                }
                let mut candidates = match step.from {
                    None => {
                        self.meta
                            .walk_entries(EntryWalk::LeastRecentlyUsed(Some(repository)), wanted)
                            .await?
                    }
                    Some(class) => {
                        self.meta
                            .walk_entries(
                                EntryWalk::LeastRecentlyUsedOfClass(repository, class),
                                wanted,
                            )
                            .await?
                    }
                };
                self.count_pending_uses(&mut candidates);
                let chosen = choose_evictions(excess, &candidates, &ids);
                if chosen.is_empty() {
                    // Only spared entries among the first few: look further before giving up.
                    if candidates.len() >= wanted && wanted < BATCH {
                        wanted = BATCH;
                        continue;
                    }
                    break; // nothing left for this step: the next one
                }
                wanted = BATCH;
                let removed = self.remove(&chosen, RemovalCause::Evicted).await?;
                // Another process removes the same entries: stop here rather than spin; the
                // next finalize continues.
                if removed.is_empty() {
                    return Ok(());
                }
                used = self.meta.usage(UsageOf::Repository(repository)).await?;
            }
        }
        Ok(())
    }

    /// Reorders eviction candidates by their use, counting restores this process has not
    /// written yet (they are written in batches, every second).
    fn count_pending_uses(&self, candidates: &mut [EntryUse]) {
        for entry in candidates.iter_mut() {
            if let Some(used) = self.usage.pending_use(entry.id) {
                entry.last_used_at = entry.last_used_at.max(used);
            }
        }
        candidates.sort_by_key(|e| (e.last_used_at, e.id));
    }

    /// The store against its global limits. Pending deletions are counted only when the disk
    /// is short of space, and usage only under a byte limit: a reservation on a store within
    /// its limits costs one `statvfs`.
    async fn occupancy(&self) -> Result<Occupancy, CacheError> {
        let limits = &self.policy.lifecycle;
        let stored = match limits.max_storage {
            Some(_) => self.meta.usage(UsageOf::Everything).await?.bytes,
            None => 0,
        };
        let mut at = Occupancy {
            stored,
            ..Occupancy::default()
        };
        if let Some(keep) = limits.min_free_space {
            at.disk = self.blobs.capacity().await?;
            if at.disk.is_some_and(|d| d.available < keep.bytes(d.total)) {
                at.pending = self.meta.usage(UsageOf::PendingDeletions).await?.bytes;
            }
        }
        Ok(at)
    }

    /// Evicts across repositories, least recently used first, until the store is within its
    /// global limits or nothing is left. With `dry_run`, says what it would evict. Returns the
    /// bytes still over the limits (0: within them).
    pub async fn enforce_global_limits(
        &self,
        dry_run: bool,
        saw: &mut (dyn FnMut(Action) + Send),
    ) -> Result<u64, CacheError> {
        let limits = &self.policy.lifecycle;
        if limits.max_storage.is_none() && limits.min_free_space.is_none() {
            return Ok(0);
        }
        let mut excess = global_excess(limits, &self.occupancy().await?);
        while excess > 0 {
            let mut candidates = self
                .meta
                .walk_entries(EntryWalk::LeastRecentlyUsed(None), BATCH)
                .await?;
            self.count_pending_uses(&mut candidates);
            let chosen = choose_evictions(excess, &candidates, &[]);
            if dry_run {
                for entry in candidates.into_iter().filter(|c| chosen.contains(&c.id)) {
                    saw(Action::Evict(entry));
                }
                break;
            }
            let removed = self.remove(&chosen, RemovalCause::Evicted).await?;
            if removed.is_empty() {
                break;
            }
            for entry in removed {
                saw(Action::Evict(entry));
            }
            excess = global_excess(limits, &self.occupancy().await?);
        }
        Ok(excess)
    }

    /// Before a reservation: the store must be within its global limits, evicting if need be.
    /// When nothing more can be evicted, the reservation is refused.
    pub(super) async fn make_room(&self) -> Result<(), CacheError> {
        if self.enforce_global_limits(false, &mut |_| {}).await? > 0 {
            return Err(CacheError::StorageFull);
        }
        Ok(())
    }

    /// Aborts uploads open for longer than the reservation TTL and deletes their chunks, then
    /// prunes the records of closed uploads as old. Returns how many records were pruned.
    async fn sweep_uploads(
        &self,
        dry_run: bool,
        tally: &mut Tally<'_, '_>,
    ) -> Result<u64, CacheError> {
        let before = self
            .clock
            .now()
            .saturating_sub(millis(self.policy.reservation_ttl));
        // Every sweep prunes the closed uploads as old (they hold no blocks), those the last
        // round aborted among them: the round that finds nothing left to abort prunes last.
        let sweep = UploadSweep {
            open_before: before,
            limit: BATCH,
            prune_before: (!dry_run).then_some(before),
        };
        let mut pruned = 0;
        loop {
            let swept = self.meta.sweep_uploads(sweep).await?;
            pruned += swept.pruned;
            let stale = swept.open;
            if dry_run || stale.is_empty() {
                for id in stale {
                    tally.saw(Action::AbortUpload(id));
                }
                break;
            }
            let mut progressed = false;
            for id in stale {
                match self.abandon(id).await {
                    Ok(true) => {
                        progressed = true;
                        tally.saw(Action::AbortUpload(id));
                    }
                    // Closed meanwhile (finalized, taken over, aborted by another process), or
                    // changing too fast to abort now: the next pass looks again.
                    Ok(false) | Err(CacheError::Busy) => {}
                    Err(e) => return Err(e),
                }
            }
            if !progressed {
                break;
            }
        }
        Ok(pruned)
    }

    /// Removes entries unused for longer than the unused TTL, or older than the maximum age.
    async fn expire(&self, dry_run: bool, tally: &mut Tally<'_, '_>) -> Result<(), CacheError> {
        let limits = &self.policy.lifecycle;
        if limits.unused_ttl.is_none() && limits.max_age.is_none() {
            return Ok(());
        }
        let now = self.clock.now();
        let unused_before = limits
            .unused_ttl
            .map_or(Millis::MIN, |ttl| now.saturating_sub(millis(ttl)));
        let created_before = limits.max_age.map(|age| now.saturating_sub(millis(age)));
        loop {
            let expired = EntryWalk::Expired {
                unused_before,
                created_before,
            };
            let batch = self.meta.walk_entries(expired, BATCH).await?;
            if dry_run || batch.is_empty() {
                for entry in batch {
                    tally.saw(Action::Expire(entry));
                }
                return Ok(());
            }
            let ids: Vec<EntryId> = batch.iter().map(|e| e.id).collect();
            let removed = self.remove(&ids, RemovalCause::Expired).await?;
            if removed.is_empty() {
                return Ok(());
            }
            for entry in removed {
                tally.saw(Action::Expire(entry));
            }
        }
    }

    /// Deletes the chunks whose grace period is over.
    async fn delete_due(&self, dry_run: bool, tally: &mut Tally<'_, '_>) -> Result<(), CacheError> {
        let now = self.clock.now();
        // Each round acknowledges the deletions the last one carried out.
        let mut done: Vec<BlobName> = Vec::new();
        loop {
            let due = self.meta.take_deletions(&done, now, BATCH).await?;
            if !done.is_empty() {
                self.metrics.chunks_deleted("grace_over", done.len() as u64);
                for name in done.drain(..) {
                    tally.saw(Action::DeleteChunk(name));
                }
            }
            if dry_run || due.is_empty() {
                for name in due {
                    tally.saw(Action::DeleteChunk(name));
                }
                return Ok(());
            }
            for name in due {
                match self.blobs.delete(&name).await {
                    Ok(()) => done.push(name),
                    Err(e) => {
                        tracing::warn!(blob = %name, error = %e, "could not delete a chunk; will retry")
                    }
                }
            }
            if done.is_empty() {
                return Ok(());
            }
        }
    }

    /// Deletes chunks that no metadata refers to and that are older than the grace period:
    /// leftovers of crashes and of publishes whose metadata change was refused.
    async fn collect_orphans(
        &self,
        dry_run: bool,
        tally: &mut Tally<'_, '_>,
    ) -> Result<(), CacheError> {
        let old_before = self
            .clock
            .now()
            .saturating_sub(millis(self.policy.lifecycle.deletion_grace));
        let mut listing = self.blobs.list().await?;
        let mut batch: Vec<BlobName> = Vec::with_capacity(BATCH);
        loop {
            let next = listing.next().await.transpose()?;
            if let Some(listed) = next.as_ref().filter(|l| l.modified < old_before) {
                batch.push(listed.name.clone());
            }
            if batch.len() >= BATCH || (next.is_none() && !batch.is_empty()) {
                let referenced = self.meta.referenced(&batch).await?;
                for name in std::mem::take(&mut batch) {
                    if referenced.contains(&name) {
                        continue;
                    }
                    if !dry_run {
                        self.collect(vec![name.clone()]).await;
                        self.metrics.chunks_deleted("orphan", 1);
                    }
                    tally.saw(Action::DeleteOrphan(name));
                }
            }
            if next.is_none() {
                return Ok(());
            }
        }
    }

    /// One maintenance pass (what `hoard gc` runs, and the background loop every
    /// `--gc-interval`), telling `observer` each thing it does. With `dry_run`, changes nothing
    /// and reports what it would do (expiry and eviction: the first batch of each).
    pub async fn maintenance_pass(
        &self,
        dry_run: bool,
        mut observer: Observer<'_>,
    ) -> Result<PassReport, CacheError> {
        let mut tally = Tally {
            report: PassReport::default(),
            observer: &mut observer,
        };
        let pruned = self.sweep_uploads(dry_run, &mut tally).await?;
        self.expire(dry_run, &mut tally).await?;
        self.enforce_global_limits(dry_run, &mut |action| tally.saw(action))
            .await?;
        self.delete_due(dry_run, &mut tally).await?;
        self.collect_orphans(dry_run, &mut tally).await?;
        if !dry_run {
            self.fold_stats().await?;
            self.prune_restore_records().await?;
            self.end_quarantines().await?;
        }
        Ok(PassReport {
            pruned_uploads: pruned,
            ..tally.report
        })
    }

    /// Deletes the quarantined entries kept longer than `--quarantine-retention`: their rows
    /// go, and their chunks after the deletion grace.
    pub async fn end_quarantines(&self) -> Result<(), CacheError> {
        let now = self.clock.now();
        let before = now.saturating_sub(millis(self.policy.lifecycle.quarantine_retention));
        loop {
            let walk = EntryWalk::QuarantinedBefore {
                before,
                after: EntryId::new(0),
            };
            let due = self.meta.walk_entries(walk, BATCH).await?;
            if due.is_empty() {
                return Ok(());
            }
            let ids: Vec<EntryId> = due.iter().map(|e| e.id).collect();
            let removal = self.removal(EntryState::Quarantined, &RemovalCause::Expired);
            let ended = self
                .meta
                .move_entries(&ids, EntryMove::Remove(removal))
                .await?;
            for gone in &ended {
                tracing::info!(target: "hoard::lifecycle", entry = gone.id.get(), "quarantine over: entry deleted");
            }
            if ended.is_empty() {
                return Ok(());
            }
        }
    }

    /// Forgets restore records whose latest restore is older than
    /// `--restore-records-retention`, then the oldest past `--max-restore-records-per-repository`
    /// in each repository and past `--max-restore-records` in all. Restores never wait for
    /// this: it runs here, in rounds of [`BATCH_RESTORES`] records, not where they are written.
    pub async fn prune_restore_records(&self) -> Result<(), CacheError> {
        let limits = &self.policy.lifecycle;
        let retention = millis(limits.restore_records_retention);
        let before = self.clock.now().saturating_sub(retention);
        let pruned = self
            .meta
            .drop_restores(RestoreDrop::LastRestoredBefore(before))
            .await?;
        if pruned > 0 {
            tracing::info!(target: "hoard::lifecycle", pruned, "restore records past their retention forgotten");
        }
        if let Some(keep) = limits.max_restore_records_per_repository {
            let dropped = self
                .drop_oldest_restores(RestoreBound::EachRepository, keep)
                .await?;
            if dropped > 0 {
                tracing::info!(target: "hoard::lifecycle", dropped, "oldest restore records of repositories over --max-restore-records-per-repository forgotten");
            }
        }
        if let Some(keep) = limits.max_restore_records {
            let dropped = self.drop_oldest_restores(RestoreBound::All, keep).await?;
            if dropped > 0 {
                tracing::info!(target: "hoard::lifecycle", dropped, "oldest restore records over --max-restore-records forgotten");
            }
        }
        Ok(())
    }

    /// Drops the restore records past the `keep` most recent of what `of` bounds, in rounds,
    /// so that no one statement holds the database for long. A round that drops fewer than its
    /// limit (from each repository, for a bound on each) left nothing past the bound.
    async fn drop_oldest_restores(
        &self,
        of: RestoreBound<'_>,
        keep: u64,
    ) -> Result<u64, CacheError> {
        let mut dropped = 0;
        loop {
            let oldest = RestoreDrop::Oldest {
                of,
                keep,
                limit: BATCH_RESTORES,
            };
            let round = self.meta.drop_restores(oldest).await?;
            dropped += round;
            if round < BATCH_RESTORES as u64 {
                return Ok(dropped);
            }
        }
    }

    /// Folds hourly statistics older than `--stats-retention` into days, drops days older than
    /// a year, and forgets families no row names any more.
    pub async fn fold_stats(&self) -> Result<(), CacheError> {
        const YEAR: Millis = 365 * 86_400_000;
        let now = self.clock.now();
        let retention = millis(self.policy.lifecycle.stats_retention);
        let hours_before = crate::model::Bucket::Day.floor(now.saturating_sub(retention));
        let (folded, dropped) = self
            .meta
            .fold_stats(
                hours_before,
                now.saturating_sub(YEAR),
                now.saturating_sub(retention),
            )
            .await?;
        if folded + dropped > 0 {
            tracing::info!(target: "hoard::lifecycle", folded_hours = folded, dropped_days = dropped, "statistics folded");
        }
        Ok(())
    }

    /// Runs [`Cache::maintenance_pass`] every `--gc-interval` until `stop`. A pass that fails
    /// (the database or the store is away) is tried again sooner, after [`RETRY_FIRST`] and
    /// then twice as long each time up to the interval, so the work it left catches up soon
    /// after the outage; the outage is logged when it starts and when it ends.
    pub(super) async fn run_maintenance(self, stop: tokio_util::sync::CancellationToken) {
        // The first pass one interval after start-up: a restart costs no walk of the store.
        let every = self.policy.lifecycle.gc_interval;
        let mut backoff = Backoff::new(RETRY_FIRST.min(every), every);
        loop {
            let wait = backoff.retry_in().unwrap_or(every);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => return,
            }
            match self.maintenance_pass(false, &mut |_| {}).await {
                Ok(report) => {
                    if let Some(failed) = backoff.succeeded() {
                        tracing::info!(target: "hoard::lifecycle", failed_passes = failed, "maintenance pass done again");
                    }
                    if !report.is_empty() {
                        tracing::info!(
                            target: "hoard::lifecycle",
                            aborted_uploads = report.aborted_uploads,
                            pruned_uploads = report.pruned_uploads,
                            expired = report.expired,
                            evicted = report.evicted,
                            deleted_chunks = report.deleted_chunks,
                            orphans = report.orphans,
                            "maintenance pass"
                        );
                    }
                }
                Err(e) if backoff.failed() => tracing::warn!(
                    target: "hoard::lifecycle",
                    error = %e,
                    "maintenance pass failed; retried sooner, then less often until it succeeds"
                ),
                Err(e) => {
                    tracing::debug!(target: "hoard::lifecycle", error = %e, "maintenance pass failed again")
                }
            }
        }
    }
}

/// The first retry of a failed maintenance pass.
const RETRY_FIRST: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    fn used(id: i64, size: u64, last_used_at: Millis) -> EntryUse {
        EntryUse {
            id: EntryId::new(id),
            repository: RepoId::new("1"),
            size,
            created_at: 0,
            last_used_at,
            family: String::new(),
            ref_class: crate::model::RefClass::OtherBranch,
        }
    }

    fn ids(raw: &[i64]) -> Vec<EntryId> {
        raw.iter().copied().map(EntryId::new).collect()
    }

    #[test]
    fn evictions_take_the_least_recently_used_until_enough_is_freed() {
        let lru = [used(1, 10, 1), used(2, 10, 2), used(3, 10, 3)];
        assert_eq!(choose_evictions(0, &lru, &[]), ids(&[]));
        assert_eq!(choose_evictions(1, &lru, &[]), ids(&[1]));
        assert_eq!(choose_evictions(11, &lru, &[]), ids(&[1, 2]));
        assert_eq!(choose_evictions(100, &lru, &[]), ids(&[1, 2, 3]));
        assert_eq!(
            choose_evictions(11, &lru, &ids(&[1])),
            ids(&[2, 3]),
            "spare is kept"
        );
        assert_eq!(
            choose_evictions(11, &lru, &ids(&[1, 3])),
            ids(&[2]),
            "however many are spared"
        );
    }

    #[test]
    fn quota_steps_take_pull_requests_and_tags_first_and_branches_only_for_a_branch() {
        use ScopeClass::{Branch, PullRequestOrTag as Pr};
        let step = |bound, from| QuotaStep { bound, from };
        assert_eq!(
            quota_steps(Share::WHOLE, &[Pr]),
            [step(Bound::Quota, None)],
            "the whole quota: plain LRU"
        );
        let for_pr = [step(Bound::PrShare, Some(Pr)), step(Bound::Quota, Some(Pr))];
        let half = Share::default();
        assert_eq!(quota_steps(half, &[Pr]), for_pr, "never a branch's entry");
        let mut for_branch = for_pr.to_vec();
        for_branch.push(step(Bound::Quota, Some(Branch)));
        assert_eq!(quota_steps(half, &[Branch]), for_branch);
        assert_eq!(
            quota_steps(half, &[Pr, Branch, Pr]),
            for_branch,
            "a burst with a branch's entry in it"
        );
        assert!(
            quota_steps(half, &[]).iter().all(|s| s.from == Some(Pr)),
            "nothing written: pull requests and tags only"
        );
    }

    #[test]
    fn quota_steps_measure_their_own_bound() {
        let used = QuotaUsage {
            bytes: 130,
            pr_bytes: 70,
        };
        let share = Share::parse("50%").unwrap();
        let over = |bound| QuotaStep { bound, from: None }.excess(100, share, used, 0);
        assert_eq!(over(Bound::Quota), 30);
        assert_eq!(over(Bound::PrShare), 20);
        let of = |from| QuotaStep {
            bound: Bound::Quota,
            from: Some(from),
        };
        assert_eq!(
            of(ScopeClass::Branch).excess(100, share, used, 20),
            10,
            "a branch step does not make room for pull requests' spared bytes"
        );
        assert_eq!(
            of(ScopeClass::PullRequestOrTag).excess(100, share, used, 20),
            30
        );
        let within = QuotaUsage {
            bytes: 90,
            pr_bytes: 50,
        };
        for bound in [Bound::Quota, Bound::PrShare] {
            let step = QuotaStep { bound, from: None };
            assert_eq!(step.excess(100, share, within, 0), 0);
        }
    }

    #[test]
    fn global_excess_is_the_larger_of_the_two_limits() {
        let limits = Limits {
            max_storage: Some(100),
            min_free_space: Some(FreeSpace::Percent(10.0)),
            ..Limits::default()
        };
        let at = |stored, pending, available| Occupancy {
            stored,
            pending,
            disk: Some(Capacity {
                total: 1000,
                available,
            }),
        };
        assert_eq!(global_excess(&limits, &at(50, 0, 500)), 0);
        assert_eq!(global_excess(&limits, &at(130, 0, 500)), 30);
        assert_eq!(global_excess(&limits, &at(50, 0, 60)), 40);
        assert_eq!(
            global_excess(&limits, &at(50, 40, 60)),
            0,
            "pending deletions count as free"
        );
        assert_eq!(global_excess(&Limits::default(), &at(1 << 40, 0, 0)), 0);
    }
}
