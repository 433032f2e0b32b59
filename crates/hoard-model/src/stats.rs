//! The vocabulary of cache statistics: the counters kept per repository × key family × ref class
//! × hour (then day), the classes of refs, the time buckets and the questions the stores answer.

use std::str::FromStr;

use super::{Millis, RemovalCause, RepoId, Scope};

/// The family counted in place of new ones once a repository has the most families kept.
pub const OTHER_FAMILY: &str = "other";

/// Which kind of ref a lookup or save came from (the caller's), or an entry was saved in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RefClass {
    DefaultBranch,
    OtherBranch,
    PullRequest,
    Tag,
}

impl RefClass {
    pub const ALL: [RefClass; 4] = [
        Self::DefaultBranch,
        Self::OtherBranch,
        Self::PullRequest,
        Self::Tag,
    ];

    /// The class of a caller who writes to `own` (else reads it first) and may read `readable`.
    /// A branch whose token reads no other branch is the default branch: GitHub's tokens for
    /// any other branch, pull request or tag also list the default branch, read-only.
    pub fn of_caller(own: Option<&Scope>, readable: &[Scope]) -> Self {
        let own = own.or(readable.first());
        let s = own.map_or("", Scope::as_str);
        if s.starts_with("refs/pull/") {
            Self::PullRequest
        } else if s.starts_with("refs/tags/") {
            Self::Tag
        } else if readable.iter().any(|r| Some(r) != own) {
            Self::OtherBranch
        } else {
            Self::DefaultBranch
        }
    }

    /// The small integer stores keep.
    pub fn code(self) -> i64 {
        match self {
            Self::DefaultBranch => 0,
            Self::OtherBranch => 1,
            Self::PullRequest => 2,
            Self::Tag => 3,
        }
    }

    /// A stored code back; unknown codes read as another branch.
    pub fn from_code(code: i64) -> Self {
        match code {
            0 => Self::DefaultBranch,
            2 => Self::PullRequest,
            3 => Self::Tag,
            _ => Self::OtherBranch,
        }
    }

    /// The name the API, the CLI and the dashboard use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DefaultBranch => "default_branch",
            Self::OtherBranch => "other_branch",
            Self::PullRequest => "pull_request",
            Self::Tag => "tag",
        }
    }
}

impl FromStr for RefClass {
    type Err = String;

    /// The API names, and the spellings people reach for first.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default_branch" | "default" => Ok(Self::DefaultBranch),
            "other_branch" | "other_branches" | "branch" | "branches" => Ok(Self::OtherBranch),
            "pull_request" | "pull_requests" | "pr" => Ok(Self::PullRequest),
            "tag" | "tags" => Ok(Self::Tag),
            _ => Err(format!(
                "scope_class must be one of default_branch, other_branch, pull_request, tag (not {s:?})"
            )),
        }
    }
}

/// How a lookup ended, as statistics count it: an exact hit is the primary key itself; a hit on
/// any other key (a prefix of the primary key or a restore key) is a restore-key hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupResult {
    ExactHit,
    RestoreKeyHit,
    Miss,
}

impl LookupResult {
    /// The `outcome` label of `hoard_family_lookups_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::ExactHit => "exact_hit",
            Self::RestoreKeyHit => "restore_key_hit",
            Self::Miss => "miss",
        }
    }
}

/// What happened to one family in one bucket. Every field only grows; adding two is folding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub lookups: u64,
    pub exact_hits: u64,
    pub restore_key_hits: u64,
    pub misses: u64,
    /// Sizes of the entries the hits named.
    pub bytes_restored: u64,
    pub saves: u64,
    pub bytes_saved: u64,
    pub evictions: Evictions,
    /// Writes (reservations and finalizes) the write policy refused.
    pub refused_writes: u64,
    /// Lookups the write policy refused: every scope the caller could read was denied. Not
    /// counted in `lookups`, which are the lookups answered.
    pub refused_reads: u64,
    /// Hits (exact or by restore key, counted there too) served by an entry promoted from
    /// another ref: what promotion saved.
    pub promoted_hits: u64,
}

/// Entries removed, by cause (see [`RemovalCause`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evictions {
    pub evicted: u64,
    pub expired: u64,
    pub quarantined: u64,
    pub deleted: u64,
}

impl Evictions {
    pub fn total(&self) -> u64 {
        self.evicted + self.expired + self.quarantined + self.deleted
    }

    fn add(&mut self, other: &Evictions) {
        self.evicted += other.evicted;
        self.expired += other.expired;
        self.quarantined += other.quarantined;
        self.deleted += other.deleted;
    }
}

impl Counters {
    pub fn add(&mut self, other: &Counters) {
        self.lookups += other.lookups;
        self.exact_hits += other.exact_hits;
        self.restore_key_hits += other.restore_key_hits;
        self.misses += other.misses;
        self.bytes_restored += other.bytes_restored;
        self.saves += other.saves;
        self.bytes_saved += other.bytes_saved;
        self.evictions.add(&other.evictions);
        self.refused_writes += other.refused_writes;
        self.refused_reads += other.refused_reads;
        self.promoted_hits += other.promoted_hits;
    }

    /// One lookup that ended as `result`, naming an entry of `size` bytes if it hit, which was
    /// `promoted` from another ref or not.
    pub fn lookup(result: LookupResult, size: u64, promoted: bool) -> Self {
        let mut c = Self {
            lookups: 1,
            ..Self::default()
        };
        match result {
            LookupResult::ExactHit => c.exact_hits = 1,
            LookupResult::RestoreKeyHit => c.restore_key_hits = 1,
            LookupResult::Miss => c.misses = 1,
        }
        if result != LookupResult::Miss {
            c.bytes_restored = size;
            c.promoted_hits = u64::from(promoted);
        }
        c
    }

    /// One entry of `size` bytes saved.
    pub fn save(size: u64) -> Self {
        Self {
            saves: 1,
            bytes_saved: size,
            ..Self::default()
        }
    }

    /// One write the write policy refused.
    pub fn refused_write() -> Self {
        Self {
            refused_writes: 1,
            ..Self::default()
        }
    }

    /// One lookup the write policy refused.
    pub fn refused_read() -> Self {
        Self {
            refused_reads: 1,
            ..Self::default()
        }
    }

    /// One entry removed for `cause`.
    pub fn removal(cause: &RemovalCause) -> Self {
        let mut evictions = Evictions::default();
        match cause {
            RemovalCause::Evicted => evictions.evicted = 1,
            RemovalCause::Expired => evictions.expired = 1,
            RemovalCause::Quarantined(_) => evictions.quarantined = 1,
            RemovalCause::Deleted => evictions.deleted = 1,
        }
        Self {
            evictions,
            ..Self::default()
        }
    }

    /// Hits over lookups, if there were lookups.
    pub fn hit_ratio(&self) -> Option<f64> {
        (self.lookups > 0)
            .then(|| (self.exact_hits + self.restore_key_hits) as f64 / self.lookups as f64)
    }
}

/// The width of a statistics row: hours while they are recent, days once folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bucket {
    Hour,
    Day,
}

impl Bucket {
    pub const fn millis(self) -> Millis {
        match self {
            Self::Hour => 3_600_000,
            Self::Day => 86_400_000,
        }
    }

    /// The start of the bucket holding `t` (UTC).
    pub fn floor(self, t: Millis) -> Millis {
        t - t.rem_euclid(self.millis())
    }

    pub fn code(self) -> i64 {
        match self {
            Self::Hour => 0,
            Self::Day => 1,
        }
    }

    pub fn from_code(code: i64) -> Self {
        if code == 1 {
            Self::Day
        } else {
            Self::Hour
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hour => "hour",
            Self::Day => "day",
        }
    }
}

impl FromStr for Bucket {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hour" | "hourly" => Ok(Self::Hour),
            "day" | "daily" => Ok(Self::Day),
            _ => Err(format!("bucket must be hour or day (not {s:?})")),
        }
    }
}

/// Where counts go: one family of one repository, for one class of refs, in one hour.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StatsKey {
    pub repository: RepoId,
    pub family: String,
    pub class: RefClass,
    /// The start of the hour.
    pub hour: Millis,
}

/// A stored statistics row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsRow {
    pub repository: RepoId,
    pub family: String,
    pub class: RefClass,
    pub bucket: Bucket,
    pub start: Millis,
    pub counters: Counters,
}

/// Which rows a question is about: all of them, or one repository, family or class, from
/// `since` (inclusive) to `until` (exclusive) by the rows' start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsFilter {
    pub repository: Option<RepoId>,
    pub family: Option<String>,
    pub class: Option<RefClass>,
    pub since: Millis,
    pub until: Millis,
}

/// A question about the statistics: the rows `filter` selects, summed as `rows` says.
#[derive(Debug, Clone, Copy)]
pub struct StatsQuery<'a> {
    pub filter: &'a StatsFilter,
    pub rows: StatsRows<'a>,
}

/// How a [`StatsQuery`] sums the rows it selects.
#[derive(Debug, Clone, Copy)]
pub enum StatsRows<'a> {
    /// Family rows summed per repository, family, class and bucket of this width (a day row
    /// stays one row when hours are asked for).
    Families(Bucket),
    /// [`StatsRows::Families`] of only these lines (repository, family, class): the trends of
    /// the lines a family table kept. None for no lines.
    Lines(Bucket, &'a [(RepoId, String, RefClass)]),
    /// One row per repository, family and class, summed over its whole period (`start`: the
    /// earliest row's): what a family table ranks, before any trend.
    FamilyTotals,
    /// The server's rows (`repository` and `family` empty), summed per class and bucket of
    /// this width; `filter.class` and the times apply.
    Server(Bucket),
}

/// What one family of one repository holds now, per class of the refs its entries were saved
/// from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFamily {
    pub repository: RepoId,
    pub family: String,
    pub class: RefClass,
    pub bytes: u64,
    pub entries: u64,
}

/// Most rows a family table may have.
pub const MAX_FAMILY_ROWS: usize = 1000;
/// Most trend points one family table holds (rows asked for × buckets of the period): what
/// bounds the work and memory of an answer, whatever the clients made the store hold. The
/// dashboard (1,000 rows over 30 days) and `hoard caches stats` stay under it.
pub const MAX_TREND_POINTS: usize = 100_000;

/// Periods up to this long get an hourly trend in a family table unless a bucket is asked
/// for; longer ones a daily one.
const HOURLY_TREND_UP_TO: Millis = 48 * 3_600_000;

/// The bucket of a family table's trend over a period of `length`, unless one is asked for.
pub fn trend_bucket(length: Millis) -> Bucket {
    if length <= HOURLY_TREND_UP_TO {
        Bucket::Hour
    } else {
        Bucket::Day
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scopes(s: &[&str]) -> Vec<Scope> {
        s.iter().map(|s| Scope::new(*s)).collect()
    }

    #[test]
    fn callers_are_classed_by_their_ref_and_what_else_they_read() {
        let main = scopes(&["refs/heads/main"]);
        assert_eq!(
            RefClass::of_caller(main.first(), &main),
            RefClass::DefaultBranch
        );
        let feature = scopes(&["refs/heads/feature", "refs/heads/main"]);
        assert_eq!(
            RefClass::of_caller(feature.first(), &feature),
            RefClass::OtherBranch
        );
        let pr = scopes(&["refs/pull/7/merge", "refs/heads/main"]);
        assert_eq!(RefClass::of_caller(pr.first(), &pr), RefClass::PullRequest);
        let tag = scopes(&["refs/tags/v1", "refs/heads/main"]);
        assert_eq!(RefClass::of_caller(tag.first(), &tag), RefClass::Tag);
        // A read-only token of one scope reads as its first scope.
        assert_eq!(RefClass::of_caller(None, &main), RefClass::DefaultBranch);
        for class in RefClass::ALL {
            assert_eq!(RefClass::from_code(class.code()), class);
            assert_eq!(class.as_str().parse::<RefClass>(), Ok(class));
        }
    }

    #[test]
    fn buckets_floor_to_utc_hours_and_days() {
        let t = 1_764_619_200_000 + 3 * 3_600_000 + 17; // 2025-12-01T23:00:00.017Z - 20 h
        assert_eq!(Bucket::Hour.floor(t), t - 17);
        assert_eq!(Bucket::Day.floor(t) % 86_400_000, 0);
        assert!(Bucket::Day.floor(t) <= t && t - Bucket::Day.floor(t) < 86_400_000);
    }

    #[test]
    fn counters_fold_and_give_a_hit_ratio() {
        let mut c = Counters::lookup(LookupResult::ExactHit, 10, false);
        c.add(&Counters::lookup(LookupResult::RestoreKeyHit, 5, true));
        // A miss names no entry, promoted or not.
        c.add(&Counters::lookup(LookupResult::Miss, 99, true));
        c.add(&Counters::lookup(LookupResult::Miss, 0, false));
        c.add(&Counters::save(7));
        c.add(&Counters::removal(&RemovalCause::Evicted));
        c.add(&Counters::refused_write());
        c.add(&Counters::refused_write());
        c.add(&Counters::refused_read());
        assert_eq!((c.refused_writes, c.refused_reads), (2, 1));
        assert_eq!(c.promoted_hits, 1);
        assert_eq!(
            (c.lookups, c.exact_hits, c.restore_key_hits, c.misses),
            (4, 1, 1, 2)
        );
        assert_eq!((c.bytes_restored, c.saves, c.bytes_saved), (15, 1, 7));
        assert_eq!(c.evictions.total(), 1);
        assert_eq!(c.hit_ratio(), Some(0.5));
        assert_eq!(Counters::default().hit_ratio(), None);
    }
}
