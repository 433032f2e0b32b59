//! Answers from the family statistics (see [`super::family_stats`]): a dense time series of
//! counters, and a table of families with their totals, a trend and what they store now.

use std::collections::HashMap;

use super::{Cache, CacheError};
use crate::model::stats::OTHER_FAMILY;
use crate::model::{
    Bucket, Counters, InvalidInput, Millis, RefClass, RepoId, StatsFilter, StatsQuery, StatsRows,
};

/// Most points a series may have.
pub const MAX_POINTS: usize = 10_000;
// The bounds of a family table, which `hoard caches stats` keeps to as well.
pub use crate::model::stats::{trend_bucket, MAX_FAMILY_ROWS, MAX_TREND_POINTS};

/// Which statistics, over which period.
#[derive(Debug, Clone)]
pub struct Period {
    /// A repository id or owner/name; `None`: the whole server.
    pub repository: Option<String>,
    pub class: Option<RefClass>,
    /// From the start of the bucket holding `since`, to `until` (exclusive).
    pub since: Millis,
    pub until: Millis,
    pub bucket: Bucket,
}

/// Counters per bucket, oldest first, one point per bucket whether anything happened or not.
#[derive(Debug, Clone)]
pub struct Series {
    pub repository: Option<RepoId>,
    pub since: Millis,
    pub points: Vec<(Millis, Counters)>,
    pub totals: Counters,
}

/// How a family table is ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyOrder {
    Misses,
    Bytes,
    Lookups,
}

/// One family of one repository, for one class of refs.
#[derive(Debug, Clone)]
pub struct FamilyLine {
    pub repository: RepoId,
    pub repository_name: String,
    pub family: String,
    pub class: RefClass,
    pub totals: Counters,
    /// Counters per bucket of the period, oldest first.
    pub trend: Vec<Counters>,
    pub bytes_stored: u64,
    pub entries: u64,
}

#[derive(Debug, Clone)]
pub struct FamilyTable {
    pub since: Millis,
    pub families: Vec<FamilyLine>,
    /// Bytes of every entry the table's filter covers (not only the rows shown).
    pub stored_bytes: u64,
    /// The repository's quota, or for the whole server its storage limit.
    pub quota_bytes: Option<u64>,
}

impl Period {
    /// The bucket starts of the period, oldest first; refused if too many.
    fn starts(&self) -> Result<Vec<Millis>, CacheError> {
        let width = self.bucket.millis();
        let first = self.bucket.floor(self.since);
        if self.until <= self.since {
            return Err(invalid("since must be before until"));
        }
        let count = (self.until - first + width - 1) / width;
        if count as usize > MAX_POINTS {
            return Err(invalid(format!(
                "the period holds {count} {}s; at most {MAX_POINTS} points are answered",
                self.bucket.as_str()
            )));
        }
        Ok((0..count).map(|i| first + i * width).collect())
    }
}

fn invalid(message: impl Into<String>) -> CacheError {
    CacheError::Invalid(InvalidInput(message.into()))
}

/// Where `start` falls among `starts` (equally spaced by `width`).
fn slot(starts: &[Millis], width: Millis, start: Millis) -> Option<usize> {
    let first = *starts.first()?;
    let i = (start - first).div_euclid(width);
    (0..starts.len() as i64).contains(&i).then_some(i as usize)
}

impl Cache {
    /// The repository an operator named (id, or a name only one repository carries):
    /// [`CacheError::UnknownRepository`] if the store has never seen it.
    async fn named_repository(&self, named: &str) -> Result<(RepoId, String), CacheError> {
        let repo = self
            .one_repository(named)
            .await?
            .ok_or_else(|| CacheError::UnknownRepository(named.to_owned()))?;
        Ok((repo.repository, repo.name))
    }

    /// Counters per bucket of `period`, of one family (`family`) or all.
    pub async fn stats_series(
        &self,
        period: &Period,
        family: Option<&str>,
    ) -> Result<Series, CacheError> {
        self.write_usage().await?;
        let starts = period.starts()?;
        let repository = match &period.repository {
            Some(named) => Some(self.named_repository(named).await?.0),
            None => None,
        };
        let filter = StatsFilter {
            repository: repository.clone(),
            family: family.map(str::to_owned),
            class: period.class,
            since: starts[0],
            until: period.until,
        };
        let series = StatsQuery {
            filter: &filter,
            rows: if filter.repository.is_none() && filter.family.is_none() {
                StatsRows::Server(period.bucket)
            } else {
                StatsRows::Families(period.bucket)
            },
        };
        let rows = self.meta.stats(&series).await?;
        let width = period.bucket.millis();
        let mut points: Vec<(Millis, Counters)> =
            starts.iter().map(|s| (*s, Counters::default())).collect();
        let mut totals = Counters::default();
        for row in rows {
            if let Some(i) = slot(&starts, width, row.start) {
                points[i].1.add(&row.counters);
                totals.add(&row.counters);
            }
        }
        Ok(Series {
            repository,
            since: starts[0],
            points,
            totals,
        })
    }

    /// The families of `period`, ranked by `order`, at most `limit`, each with its trend per
    /// bucket and what its entries store now. Lines are ranked on their totals and cut to
    /// `limit` before any trend is built, so an answer costs what it returns: at most
    /// [`MAX_TREND_POINTS`] points, or the request is refused.
    pub async fn family_table(
        &self,
        period: &Period,
        order: FamilyOrder,
        limit: usize,
    ) -> Result<FamilyTable, CacheError> {
        let starts = period.starts()?;
        let limit = limit.min(MAX_FAMILY_ROWS);
        if limit.saturating_mul(starts.len()) > MAX_TREND_POINTS {
            return Err(invalid(format!(
                "{limit} families × {} {}s is more than the {MAX_TREND_POINTS} trend points one answer holds; ask for fewer families (limit), a shorter period (since) or days (bucket=day)",
                starts.len(),
                period.bucket.as_str()
            )));
        }
        self.write_usage().await?;
        let repository = match &period.repository {
            Some(named) => Some(self.named_repository(named).await?),
            None => None,
        };
        let repo_id = repository.as_ref().map(|r| r.0.clone());
        let filter = StatsFilter {
            repository: repo_id.clone(),
            family: None,
            class: period.class,
            since: starts[0],
            until: period.until,
        };
        // Totals, bytes and entries per line: one row per line, never per bucket.
        type Key = (RepoId, String, RefClass);
        let mut lines = HashMap::<Key, (Counters, u64, u64)>::new();
        let totals = StatsQuery {
            filter: &filter,
            rows: StatsRows::FamilyTotals,
        };
        for row in self.meta.stats(&totals).await? {
            lines
                .entry((row.repository, row.family, row.class))
                .or_default()
                .0
                .add(&row.counters);
        }
        let mut stored_bytes = 0;
        for stored in self.meta.stored_by_family(repo_id.as_ref()).await? {
            if period.class.is_some_and(|c| c != stored.class) {
                continue;
            }
            stored_bytes += stored.bytes;
            let line = lines
                .entry((stored.repository, stored.family, stored.class))
                .or_default();
            line.1 += stored.bytes;
            line.2 += stored.entries;
        }
        let mut ranked: Vec<(Key, (Counters, u64, u64))> = lines.into_iter().collect();
        let rank = |(_, (totals, bytes, _)): &(Key, (Counters, u64, u64))| match order {
            FamilyOrder::Misses => (totals.misses, totals.lookups),
            FamilyOrder::Bytes => (*bytes, totals.bytes_restored + totals.bytes_saved),
            FamilyOrder::Lookups => (totals.lookups, totals.misses),
        };
        // Highest first; `other` after the families it stands for, then by name.
        ranked.sort_by(|a, b| {
            rank(b)
                .cmp(&rank(a))
                .then_with(|| (a.0 .1 == OTHER_FAMILY).cmp(&(b.0 .1 == OTHER_FAMILY)))
                .then_with(|| a.0.cmp(&b.0))
        });
        ranked.truncate(limit);

        // The trends of the lines kept, and of no other.
        let kept: Vec<Key> = ranked.iter().map(|(key, _)| key.clone()).collect();
        let place: HashMap<&Key, usize> = kept.iter().enumerate().map(|(i, k)| (k, i)).collect();
        let width = period.bucket.millis();
        let mut trends = vec![vec![Counters::default(); starts.len()]; kept.len()];
        let trends_of_kept = StatsQuery {
            filter: &filter,
            rows: StatsRows::Lines(period.bucket, &kept),
        };
        for row in self.meta.stats(&trends_of_kept).await? {
            let key = (row.repository, row.family, row.class);
            if let (Some(line), Some(i)) = (place.get(&key), slot(&starts, width, row.start)) {
                trends[*line][i].add(&row.counters);
            }
        }
        // Names: the one repository asked for, else every repository's in one query.
        let names: HashMap<RepoId, String> = match &repository {
            Some((id, name)) => HashMap::from([(id.clone(), name.clone())]),
            None => self
                .meta
                .repositories(None, usize::MAX >> 1)
                .await?
                .listed
                .into_iter()
                .map(|r| (r.repository, r.name))
                .collect(),
        };
        let families = ranked
            .into_iter()
            .zip(trends)
            .map(
                |(((repository, family, class), (totals, bytes, entries)), trend)| FamilyLine {
                    repository_name: names.get(&repository).cloned().unwrap_or_default(),
                    repository,
                    family,
                    class,
                    totals,
                    trend,
                    bytes_stored: bytes,
                    entries,
                },
            )
            .collect();
        let limits = &self.policy.lifecycle;
        Ok(FamilyTable {
            since: starts[0],
            families,
            stored_bytes,
            quota_bytes: if repository.is_some() {
                limits.repo_quota
            } else {
                limits.max_storage
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_count_whole_buckets_and_refuse_too_many() {
        let hour = Bucket::Hour.millis();
        let period = |since, until, bucket| Period {
            repository: None,
            class: None,
            since,
            until,
            bucket,
        };
        let now = 100 * hour + 17;
        assert_eq!(
            period(now - 23 * hour, now, Bucket::Hour)
                .starts()
                .unwrap()
                .len(),
            24
        );
        assert_eq!(
            period(now - 23 * hour, now, Bucket::Hour).starts().unwrap()[23],
            100 * hour
        );
        assert!(period(now, now - 1, Bucket::Hour).starts().is_err());
        assert!(period(0, (MAX_POINTS as i64 + 1) * hour, Bucket::Hour)
            .starts()
            .is_err());
        let starts = [0, hour, 2 * hour];
        assert_eq!(slot(&starts, hour, hour + 5), Some(1));
        assert_eq!(slot(&starts, hour, 3 * hour), None);
        assert_eq!(slot(&starts, hour, -1), None);
    }
}
