//! Statistics by key family: lookups, hits, misses, saves, removals and the writes and lookups
//! the write policy refused, counted per repository × family × ref class × hour, folded in
//! memory and written with the restore bookkeeping (once a second, in key order, see
//! [`super::usage`]), so a lookup does no write.
//!
//! Families are capped per repository (`--stats-max-families`): a family the store does not keep
//! yet is kept while its repository has room, and counted as `other` after, so no client can
//! grow the tables without bound. The domain decides this here; the store only loads and adds.
//! What is pending in memory is bounded too ([`MAX_PENDING`]).
//!
//! A save carries no restore keys, so the family a lookup gave its primary key is remembered for
//! a while ([`MAX_REMEMBERED`]): the save that follows a miss lands in the lookup's family.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

// Every lookup hashes a key into these maps: foldhash (randomly seeded) costs a fraction of
// SipHash there, and the maps are bounded, so no client can grow a long collision chain.
use foldhash::HashMap;

use crate::meta::{MetaError, StatsStore};
use crate::model::family::family_folded;
use crate::model::stats::OTHER_FAMILY;
use crate::model::{
    Bucket, CacheKey, Counters, EntryUse, Millis, RefClass, RemovalCause, RepoId, StatsKey,
};

/// Most pending rows: past this, new rows count under `other` until the next flush.
pub const MAX_PENDING: usize = 50_000;
/// Most remembered lookup families and known family decisions; past this, they start over.
pub const MAX_REMEMBERED: usize = 4096;

/// Pending counts, shared by every clone.
#[derive(Debug, Clone)]
pub struct FamilyStats {
    inner: Arc<Mutex<Pending>>,
    /// Held while a flush writes: a flush waits for the one under way, so that what an operator
    /// reads after flushing includes everything counted before.
    flushing: Arc<tokio::sync::Mutex<()>>,
    max_families: usize,
}

#[derive(Debug, Default)]
struct Pending {
    counts: HashMap<StatsKey, Counters>,
    /// The row counted last, not yet in `counts`: a run of lookups of one family (a matrix
    /// build, a fleet restoring one cache) adds to it without hashing or copying a key.
    last: Option<(StatsKey, Counters)>,
    /// Repository → folded primary key → the family its latest lookup gave it; looked up by
    /// borrowed keys, so a lookup of a key already here copies nothing.
    lookup_families: HashMap<RepoId, HashMap<String, String>>,
    /// How many keys `lookup_families` holds.
    remembered: usize,
    /// (repository, family) → whether the store keeps it (else it counts as `other`).
    decided: HashMap<(RepoId, String), bool>,
}

impl Default for FamilyStats {
    fn default() -> Self {
        Self::new(100)
    }
}

impl FamilyStats {
    /// Keeps at most `max_families` families per repository.
    pub fn new(max_families: usize) -> Self {
        Self {
            inner: Arc::default(),
            flushing: Arc::default(),
            max_families,
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A lookup of `keys` (the primary key first, then restore keys; `folded` the same, folded)
    /// by a caller of `class`, which ended as `counted` says ([`Counters::lookup`]). `seen` is
    /// shown the lookup's family (for metrics) before it is counted.
    #[allow(clippy::too_many_arguments)]
    pub fn lookup(
        &self,
        repository: &RepoId,
        keys: &[CacheKey],
        folded: &[String],
        class: RefClass,
        counted: &Counters,
        now: Millis,
        seen: impl FnOnce(&str),
    ) {
        let (Some(primary), Some((primary_folded, restore))) = (keys.first(), folded.split_first())
        else {
            return;
        };
        let family = family_folded(primary.as_str(), primary_folded, restore);
        seen(family);
        let mut pending = self.pending();
        // Only a lookup whose primary key missed is followed by a save of that key.
        if !restore.is_empty() && counted.exact_hits == 0 {
            pending.remember(repository, primary_folded, family);
        }
        pending.add(repository, family, class, now, counted);
    }

    /// The family of a save of `key` (`folded`): the one its latest lookup here gave it, else
    /// the key's own.
    pub fn family_of_save(&self, repository: &RepoId, key: &str, folded: &str) -> String {
        let pending = self.pending();
        pending
            .lookup_families
            .get(repository)
            .and_then(|keys| keys.get(folded))
            .cloned()
            .unwrap_or_else(|| family_folded(key, folded, &[]).to_owned())
    }

    /// An entry of `size` bytes saved in `family` by a caller of `class`.
    pub fn saved(
        &self,
        repository: &RepoId,
        family: &str,
        class: RefClass,
        size: u64,
        now: Millis,
    ) {
        self.pending()
            .add(repository, family, class, now, &Counters::save(size));
    }

    /// A write or lookup the write policy refused, counted in `family` (see
    /// [`Counters::refused_write`], [`Counters::refused_read`]).
    pub fn refused(
        &self,
        repository: &RepoId,
        family: &str,
        class: RefClass,
        now: Millis,
        counters: &Counters,
    ) {
        self.pending().add(repository, family, class, now, counters);
    }

    /// Entries removed for `cause`, each counted in its own family and class.
    pub fn removed(&self, removed: &[EntryUse], cause: &RemovalCause, now: Millis) {
        let counters = Counters::removal(cause);
        let mut pending = self.pending();
        for entry in removed {
            pending.add(
                &entry.repository,
                &entry.family,
                entry.ref_class,
                now,
                &counters,
            );
        }
    }

    /// Writes what is pending; on failure it is kept for the next try.
    pub async fn flush(&self, meta: &dyn StatsStore, now: Millis) -> Result<(), MetaError> {
        let _one_at_a_time = self.flushing.lock().await;
        let counts = self.pending().take();
        if counts.is_empty() {
            return Ok(());
        }
        let written = match self.capped(meta, counts.clone(), now).await {
            Ok(capped) => meta.record_stats(&capped).await,
            Err(e) => Err(e),
        };
        if written.is_err() {
            let mut pending = self.pending();
            for (key, counters) in counts {
                pending.counts.entry(key).or_default().add(&counters);
            }
        }
        written
    }

    /// `counts` with the families the store may not keep counted as `other`, summed and sorted.
    /// New families are kept, in name order, while their repository has room.
    async fn capped(
        &self,
        meta: &dyn StatsStore,
        counts: Vec<(StatsKey, Counters)>,
        now: Millis,
    ) -> Result<Vec<(StatsKey, Counters)>, MetaError> {
        let mut undecided = BTreeMap::<RepoId, BTreeSet<String>>::new();
        {
            let pending = self.pending();
            for (key, _) in &counts {
                let known = (key.repository.clone(), key.family.clone());
                if key.family != OTHER_FAMILY && !pending.decided.contains_key(&known) {
                    undecided
                        .entry(key.repository.clone())
                        .or_default()
                        .insert(key.family.clone());
                }
            }
        }
        let mut decisions = Vec::new();
        for (repository, families) in undecided {
            let families: Vec<String> = families.into_iter().collect();
            let mut kept = BTreeSet::new();
            let mut count = 0;
            for batch in families.chunks(500) {
                let (found, total) = meta.families(&repository, &[], batch, now).await?;
                kept.extend(found);
                count = total;
            }
            let room = self.max_families.saturating_sub(count as usize);
            let admitted: Vec<String> = families
                .iter()
                .filter(|f| !kept.contains(*f))
                .take(room)
                .cloned()
                .collect();
            if !admitted.is_empty() {
                meta.families(&repository, &admitted, &[], now).await?;
            }
            kept.extend(admitted);
            for f in families {
                let keep = kept.contains(&f);
                decisions.push(((repository.clone(), f), keep));
            }
        }
        let mut pending = self.pending();
        let mut batch: HashMap<(RepoId, String), bool> = decisions.iter().cloned().collect();
        for (key, _) in &counts {
            let known = (key.repository.clone(), key.family.clone());
            if let Some(keep) = pending.decided.get(&known) {
                batch.insert(known, *keep);
            }
        }
        if pending.decided.len() + decisions.len() > MAX_REMEMBERED {
            pending.decided.clear();
        }
        pending.decided.extend(decisions);
        drop(pending);
        let mut summed = BTreeMap::<StatsKey, Counters>::new();
        for (mut key, counters) in counts {
            let known = (key.repository.clone(), key.family.clone());
            if key.family != OTHER_FAMILY && batch.get(&known) != Some(&true) {
                key.family = OTHER_FAMILY.to_owned();
            }
            summed.entry(key).or_default().add(&counters);
        }
        Ok(summed.into_iter().collect())
    }
}

impl Pending {
    /// Remembers that a lookup of `key` gave `family`, for the save that may follow.
    fn remember(&mut self, repository: &RepoId, key: &str, family: &str) {
        if let Some(known) = self
            .lookup_families
            .get_mut(repository)
            .and_then(|keys| keys.get_mut(key))
        {
            if known != family {
                family.clone_into(known);
            }
            return;
        }
        if self.remembered >= MAX_REMEMBERED {
            self.lookup_families.clear();
            self.remembered = 0;
        }
        self.lookup_families
            .entry(repository.clone())
            .or_default()
            .insert(key.to_owned(), family.to_owned());
        self.remembered += 1;
    }

    fn add(
        &mut self,
        repository: &RepoId,
        family: &str,
        class: RefClass,
        now: Millis,
        counters: &Counters,
    ) {
        let hour = Bucket::Hour.floor(now);
        if let Some((key, sum)) = &mut self.last {
            if key.hour == hour
                && key.class == class
                && key.family == family
                && key.repository == *repository
            {
                sum.add(counters);
                return;
            }
        }
        self.settle();
        let family = if self.counts.len() >= MAX_PENDING {
            OTHER_FAMILY
        } else {
            family
        };
        let key = StatsKey {
            repository: repository.clone(),
            family: family.to_owned(),
            class,
            hour,
        };
        self.last = Some((key, *counters));
    }

    /// Moves the last row into `counts`.
    fn settle(&mut self) {
        if let Some((key, sum)) = self.last.take() {
            self.counts.entry(key).or_default().add(&sum);
        }
    }

    /// Every pending row, leaving none.
    fn take(&mut self) -> Vec<(StatsKey, Counters)> {
        self.settle();
        self.counts.drain().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::SqliteStore;
    use crate::model::LookupResult;
    use crate::model::{StatsFilter, StatsQuery, StatsRows};

    const HOUR: Millis = 3_600_000;

    fn keys(k: &[&str]) -> (Vec<CacheKey>, Vec<String>) {
        let keys: Vec<CacheKey> = k.iter().map(|k| CacheKey::parse(k).unwrap()).collect();
        let folded = keys.iter().map(CacheKey::folded).collect();
        (keys, folded)
    }

    async fn stored(meta: &SqliteStore) -> Vec<(String, Counters)> {
        let filter = StatsFilter {
            since: 0,
            until: Millis::MAX,
            ..StatsFilter::default()
        };
        let rows = meta
            .stats(&StatsQuery {
                filter: &filter,
                rows: StatsRows::Families(Bucket::Day),
            })
            .await
            .unwrap();
        rows.into_iter().map(|r| (r.family, r.counters)).collect()
    }

    #[tokio::test]
    async fn a_save_after_a_lookup_lands_in_the_lookups_family() {
        let stats = FamilyStats::new(10);
        let repo = RepoId::new("1");
        let (k, f) = keys(&["Linux-cargo-abc123def456", "Linux-"]);
        let mut family = String::new();
        let miss = Counters::lookup(LookupResult::Miss, 0, false);
        stats.lookup(&repo, &k, &f, RefClass::DefaultBranch, &miss, 5, |f| {
            family = f.to_owned();
        });
        assert_eq!(family, "Linux-");
        assert_eq!(stats.family_of_save(&repo, k[0].as_str(), &f[0]), "Linux-");
        // Another repository's save of the same key has no lookup to follow.
        assert_eq!(
            stats.family_of_save(&RepoId::new("2"), k[0].as_str(), &f[0]),
            "Linux-cargo-"
        );
        // The latest lookup of the key wins.
        let (k2, f2) = keys(&["Linux-cargo-abc123def456", "Linux-cargo-"]);
        stats.lookup(&repo, &k2, &f2, RefClass::DefaultBranch, &miss, 6, |_| {});
        assert_eq!(
            stats.family_of_save(&repo, k[0].as_str(), &f[0]),
            "Linux-cargo-"
        );
        // What is remembered is bounded: past the bound it starts over.
        for i in 0..MAX_REMEMBERED {
            let (k, f) = keys(&[&format!("other-{i}-abc123def456"), "other-"]);
            stats.lookup(&repo, &k, &f, RefClass::DefaultBranch, &miss, 7, |_| {});
        }
        assert_eq!(stats.pending().remembered, 1);
        let (last, last_folded) = keys(&[&format!("other-{}-abc123def456", MAX_REMEMBERED - 1)]);
        assert_eq!(
            stats.family_of_save(&repo, last[0].as_str(), &last_folded[0]),
            "other-"
        );
        let (first, first_folded) = keys(&["other-0-abc123def456"]);
        assert_eq!(
            stats.family_of_save(&repo, first[0].as_str(), &first_folded[0]),
            "other-0-",
            "forgotten: the key's own family"
        );
    }

    #[tokio::test]
    async fn counts_fold_per_family_class_and_hour_and_are_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let meta = SqliteStore::open(&dir.path().join("hoard.db"))
            .await
            .unwrap();
        let stats = FamilyStats::new(10);
        let repo = RepoId::new("1");
        let (k, f) = keys(&["deps-0123456789abcdef"]);
        stats.lookup(
            &repo,
            &k,
            &f,
            RefClass::PullRequest,
            &Counters::lookup(LookupResult::Miss, 0, false),
            10,
            |_| {},
        );
        stats.lookup(
            &repo,
            &k,
            &f,
            RefClass::PullRequest,
            &Counters::lookup(LookupResult::ExactHit, 7, false),
            HOUR + 1,
            |_| {},
        );
        stats.saved(&repo, "deps-", RefClass::PullRequest, 9, HOUR + 2);
        stats.flush(&meta, 0).await.unwrap();
        stats.flush(&meta, 0).await.unwrap(); // nothing left to write twice
        let filter = StatsFilter {
            since: 0,
            until: Millis::MAX,
            ..StatsFilter::default()
        };
        let rows = meta
            .stats(&StatsQuery {
                filter: &filter,
                rows: StatsRows::Families(Bucket::Hour),
            })
            .await
            .unwrap();
        let per_hour: Vec<(Millis, u64, u64, u64)> = rows
            .iter()
            .map(|r| {
                (
                    r.start,
                    r.counters.lookups,
                    r.counters.misses,
                    r.counters.saves,
                )
            })
            .collect();
        assert_eq!(per_hour, [(0, 1, 1, 0), (HOUR, 1, 0, 1)]);
        assert!(rows
            .iter()
            .all(|r| r.family == "deps-" && r.class == RefClass::PullRequest));
    }

    #[tokio::test]
    async fn families_past_the_cap_count_as_other() {
        let dir = tempfile::tempdir().unwrap();
        let meta = SqliteStore::open(&dir.path().join("hoard.db"))
            .await
            .unwrap();
        let stats = FamilyStats::new(3);
        let repo = RepoId::new("1");
        for i in 0..50 {
            stats.saved(
                &repo,
                &format!("family-{i:02}-"),
                RefClass::OtherBranch,
                1,
                0,
            );
        }
        stats.flush(&meta, 0).await.unwrap();
        // Later flushes: known families stay theirs, new ones still go to `other`.
        stats.saved(&repo, "family-00-", RefClass::OtherBranch, 1, 0);
        stats.saved(&repo, "family-99-", RefClass::OtherBranch, 1, 0);
        stats.flush(&meta, 0).await.unwrap();
        let rows = stored(&meta).await;
        let families: Vec<&str> = rows.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            families,
            ["family-00-", "family-01-", "family-02-", OTHER_FAMILY]
        );
        let saves: u64 = rows.iter().map(|(_, c)| c.saves).sum();
        assert_eq!(saves, 52, "nothing is lost, only relabelled");
        assert_eq!(rows[0].1.saves, 2);
        // The store keeps exactly the cap.
        let (_, kept) = meta.families(&repo, &[], &[], 0).await.unwrap();
        assert_eq!(kept, 3);
    }

    #[tokio::test]
    async fn pending_rows_are_bounded() {
        let stats = FamilyStats::new(MAX_PENDING * 2);
        let repo = RepoId::new("1");
        for i in 0..MAX_PENDING + 100 {
            stats.saved(&repo, &format!("f{i}-"), RefClass::Tag, 1, 0);
        }
        let rows = stats.pending().take();
        assert_eq!(rows.len(), MAX_PENDING + 1, "the rest went to `other`");
    }
}
