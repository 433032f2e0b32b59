//! `GET stats` and `GET stats/families`: the statistics by key family (see
//! [`crate::cache::insight`]), over a period the query names.
//!
//! `since` and `until` are RFC 3339 times or seconds since 1970; `since` may also be a duration
//! (`24h`, `7d`), which counts whole buckets back from the one holding `until`, that one
//! included: `since=24h&bucket=hour` is 24 points.

use std::time::Duration;

use super::query::Query;
use super::{wire, AdminError};
use crate::api::AppState;
use crate::cache::insight::{trend_bucket, FamilyOrder, Period, MAX_FAMILY_ROWS};
use crate::model::{Bucket, Millis, RefClass};

/// The longest `since` duration: with times up to the year 9999, no period arithmetic wraps.
const LONGEST_SINCE: Duration = Duration::from_secs(100 * 366 * 86_400);

/// Rows a family table has unless asked otherwise.
const DEFAULT_FAMILIES: usize = 100;

/// `GET stats`.
pub async fn series(app: &AppState, query: &Query) -> Result<wire::Stats, AdminError> {
    let bucket = bucket(query)?.unwrap_or(Bucket::Hour);
    let default_since = match bucket {
        Bucket::Hour => Duration::from_secs(24 * 3600),
        Bucket::Day => Duration::from_secs(30 * 86_400),
    };
    let period = period(app, query, default_since, |_| bucket)?;
    let family = bounded(query, "family")?;
    let series = app.cache().stats_series(&period, family.as_deref()).await?;
    Ok(wire::Stats {
        bucket: bucket.as_str().to_owned(),
        since: wire::bucket_time(series.since),
        until: wire::bucket_time(period.until),
        repository: series.repository.map(|r| r.as_str().to_owned()),
        family,
        scope_class: period.class.map(|c| c.as_str().to_owned()),
        totals: (&series.totals).into(),
        series: series
            .points
            .iter()
            .map(|(start, counters)| wire::StatsPoint {
                start: wire::bucket_time(*start),
                counters: counters.into(),
            })
            .collect(),
    })
}

/// `GET stats/families`.
pub async fn families(app: &AppState, query: &Query) -> Result<wire::Families, AdminError> {
    let chosen = bucket(query)?;
    let period = period(app, query, Duration::from_secs(7 * 86_400), |length| {
        chosen.unwrap_or(trend_bucket(length))
    })?;
    let order = match query.param("sort") {
        None | Some("misses") => FamilyOrder::Misses,
        Some("bytes") => FamilyOrder::Bytes,
        Some("lookups") => FamilyOrder::Lookups,
        Some(_) => return Err(AdminError::bad("sort must be misses, bytes or lookups")),
    };
    let limit = match query.param("limit") {
        None => DEFAULT_FAMILIES,
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_FAMILY_ROWS).contains(n))
            .ok_or_else(|| AdminError::bad(format!("limit must be from 1 to {MAX_FAMILY_ROWS}")))?,
    };
    let table = app.cache().family_table(&period, order, limit).await?;
    Ok(wire::Families {
        since: wire::bucket_time(table.since),
        until: wire::bucket_time(period.until),
        bucket: period.bucket.as_str().to_owned(),
        quota_bytes: table.quota_bytes,
        stored_bytes: table.stored_bytes,
        families: table
            .families
            .into_iter()
            .map(|line| wire::FamilyStats {
                repository: line.repository.as_str().to_owned(),
                repository_name: line.repository_name,
                family: line.family,
                scope_class: line.class.as_str().to_owned(),
                counters: (&line.totals).into(),
                hit_ratio: line.totals.hit_ratio(),
                bytes_stored: line.bytes_stored,
                entries: line.entries,
                trend: wire::FamilyTrend {
                    lookups: line.trend.iter().map(|c| c.lookups).collect(),
                    hits: line
                        .trend
                        .iter()
                        .map(|c| c.exact_hits + c.restore_key_hits)
                        .collect(),
                    misses: line.trend.iter().map(|c| c.misses).collect(),
                },
            })
            .collect(),
    })
}

fn bucket(query: &Query) -> Result<Option<Bucket>, AdminError> {
    query
        .param("bucket")
        .map(|b| b.parse::<Bucket>().map_err(AdminError::bad))
        .transpose()
}

fn bounded(query: &Query, name: &str) -> Result<Option<String>, AdminError> {
    match query.param(name) {
        Some(v) if v.len() > 1024 || v.chars().any(char::is_control) => Err(AdminError::bad(
            format!("{name} must be at most 1024 bytes without control characters"),
        )),
        other => Ok(other.map(str::to_owned)),
    }
}

/// The period a query names; `bucket_for` picks the bucket from the period's length.
fn period(
    app: &AppState,
    query: &Query,
    default_since: Duration,
    bucket_for: impl Fn(Millis) -> Bucket,
) -> Result<Period, AdminError> {
    let now = app.cache().now();
    let until = query.time("until")?.unwrap_or(now);
    let since = match query.param("since") {
        None => Since::Back(default_since),
        Some(raw) => match humantime::parse_duration(raw) {
            Ok(back) if back > LONGEST_SINCE => {
                return Err(AdminError::bad(
                    "since is longer than 100 years; name a shorter period",
                ))
            }
            Ok(back) if !back.is_zero() => Since::Back(back),
            Ok(_) => return Err(AdminError::bad("since must not be a zero duration")),
            Err(_) => Since::At(query.time("since")?.unwrap_or(until)),
        },
    };
    let length = match since {
        Since::Back(back) => millis(back),
        Since::At(at) => until.saturating_sub(at),
    };
    let bucket = bucket_for(length);
    let since = match since {
        // Whole buckets back, the one holding `until` included.
        Since::Back(back) => {
            let last = bucket.floor(until.saturating_sub(1));
            (last + bucket.millis()).saturating_sub(millis(back))
        }
        Since::At(at) => at,
    };
    if since >= until {
        return Err(AdminError::bad("since must be earlier than until"));
    }
    let class = query
        .param("scope_class")
        .map(|c| c.parse::<RefClass>().map_err(AdminError::bad))
        .transpose()?;
    Ok(Period {
        repository: bounded(query, "repository")?,
        class,
        since,
        until,
        bucket,
    })
}

enum Since {
    /// A duration back from `until`.
    Back(Duration),
    At(Millis),
}

fn millis(d: Duration) -> Millis {
    d.as_millis().min(i64::MAX as u128 / 2) as Millis
}
