//! The statistics statements the three SQL stores share (`?` parameters, `{bigint}` for a cast
//! to a 64-bit integer), and their rows turned back into counters. Only adding to a row that
//! exists differs between dialects ([`Upsert`]).

use std::sync::OnceLock;

use super::dialect::{Backend, Shared, Upsert};
use super::schema::family_stats as f;
use super::sql::{Param, SqlRow};
use super::MetaError;
use crate::model::{
    Bucket, Counters, Evictions, RefClass, RepoId, StatsFilter, StatsKey, StatsQuery, StatsRow,
    StatsRows, StoredFamily,
};

/// The counter columns of `family_stats` and `server_stats`, in [`counter_params`]' order.
const COUNTER_COLUMNS: [&str; 14] = [
    f::lookups.name,
    f::exact_hits.name,
    f::restore_key_hits.name,
    f::misses.name,
    f::bytes_restored.name,
    f::saves.name,
    f::bytes_saved.name,
    f::evicted.name,
    f::expired.name,
    f::quarantined.name,
    f::deleted.name,
    f::refused_writes.name,
    f::refused_reads.name,
    f::promoted_hits.name,
];

/// The statements that add to rows, spelled for one [`Upsert`].
#[derive(Debug)]
pub(super) struct Adding {
    /// Parameters: repository, family, class, hour, then the counters.
    pub record_family: String,
    /// Parameters: class, hour, then the counters.
    pub record_server: String,
    /// Folds hour rows before the parameter into day rows.
    pub fold_family: String,
    pub fold_server: String,
    /// Parameters: repository, family, now.
    pub keep_family: String,
}

/// The adding statements of a backend, built and spelled once.
pub(super) fn adding(backend: Backend) -> &'static Adding {
    static BUILT: [OnceLock<Adding>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    BUILT[backend as usize].get_or_init(|| Adding::new(backend))
}

impl Adding {
    fn new(backend: Backend) -> Self {
        let upsert = backend.upsert();
        let spell = |template: String| backend.spell(&template);
        let counters = COUNTER_COLUMNS.join(", ");
        let values = vec!["?"; COUNTER_COLUMNS.len()].join(", ");
        let sums = COUNTER_COLUMNS
            .iter()
            .map(|c| format!("SUM({c})"))
            .collect::<Vec<_>>()
            .join(", ");
        let on_existing = |table: &str, keys: &str| match upsert {
            Upsert::OnConflict => format!(
                " ON CONFLICT ({keys}) DO UPDATE SET {}",
                COUNTER_COLUMNS
                    .iter()
                    .map(|c| format!("{c} = {table}.{c} + excluded.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Upsert::OnDuplicateKey => format!(
                " ON DUPLICATE KEY UPDATE {}",
                COUNTER_COLUMNS
                    .iter()
                    .map(|c| format!("{c} = {c} + VALUES({c})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        const FAMILY_KEYS: &str = "repository, family, ref_class, bucket, start_at";
        const SERVER_KEYS: &str = "ref_class, bucket, start_at";
        let day = Bucket::Day.millis();
        Self {
            record_family: spell(format!(
                "INSERT INTO family_stats ({FAMILY_KEYS}, {counters}) VALUES (?, ?, ?, 0, ?, {values}){}",
                on_existing("family_stats", FAMILY_KEYS)
            )),
            record_server: spell(format!(
                "INSERT INTO server_stats ({SERVER_KEYS}, {counters}) VALUES (?, 0, ?, {values}){}",
                on_existing("server_stats", SERVER_KEYS)
            )),
            fold_family: spell(format!(
                "INSERT INTO family_stats ({FAMILY_KEYS}, {counters})
                 SELECT repository, family, ref_class, 1, start_at - (start_at % {day}), {sums}
                 FROM family_stats WHERE bucket = 0 AND start_at < ?
                 GROUP BY repository, family, ref_class, start_at - (start_at % {day}){}",
                on_existing("family_stats", FAMILY_KEYS)
            )),
            fold_server: spell(format!(
                "INSERT INTO server_stats ({SERVER_KEYS}, {counters})
                 SELECT ref_class, 1, start_at - (start_at % {day}), {sums}
                 FROM server_stats WHERE bucket = 0 AND start_at < ?
                 GROUP BY ref_class, start_at - (start_at % {day}){}",
                on_existing("server_stats", SERVER_KEYS)
            )),
            keep_family: spell(match upsert {
                Upsert::OnConflict => "INSERT INTO stats_families (repository, family, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING".into(),
                Upsert::OnDuplicateKey => "INSERT IGNORE INTO stats_families (repository, family, created_at) VALUES (?, ?, ?)".into(),
            }),
        }
    }
}

/// Drops the hour rows folded by `fold_*` (same parameter), then day rows past keeping.
pub(super) static DROP_FOLDED: [Shared; 2] = [
    Shared::new("DELETE FROM family_stats WHERE bucket = 0 AND start_at < ?"),
    Shared::new("DELETE FROM server_stats WHERE bucket = 0 AND start_at < ?"),
];
pub(super) static DROP_OLD: [Shared; 2] = [
    Shared::new("DELETE FROM family_stats WHERE bucket = 1 AND start_at < ?"),
    Shared::new("DELETE FROM server_stats WHERE bucket = 1 AND start_at < ?"),
];
/// Forgets families kept since before the parameter that no row names any more.
pub(super) static FORGET_FAMILIES: Shared = Shared::new(
    "DELETE FROM stats_families WHERE created_at < ? AND NOT EXISTS
     (SELECT 1 FROM family_stats f WHERE f.repository = stats_families.repository AND f.family = stats_families.family)",
);

pub(super) static COUNT_FAMILIES: Shared =
    Shared::new("SELECT COUNT(*) AS n FROM stats_families WHERE repository = ?");

/// Which of `n` families (parameters after the repository) are kept.
pub(super) fn kept_families_sql(n: usize) -> String {
    format!(
        "SELECT family FROM stats_families WHERE repository = ? AND family IN ({})",
        vec!["?"; n].join(", ")
    )
}

/// The parameters of `record_family`.
pub(super) fn family_params(key: &StatsKey, counters: &Counters) -> Vec<Param> {
    let mut params = vec![
        Param::Text(key.repository.as_str().to_owned()),
        Param::Text(key.family.clone()),
        Param::Int(key.class.code()),
        Param::Int(key.hour),
    ];
    params.extend(counter_params(counters).map(Param::Int));
    params
}

/// The parameters of `record_server`.
pub(super) fn server_params(class: RefClass, hour: i64, counters: &Counters) -> Vec<Param> {
    let mut params = vec![Param::Int(class.code()), Param::Int(hour)];
    params.extend(counter_params(counters).map(Param::Int));
    params
}

/// `counts` summed per class and hour, in that order: the server rows a batch adds to.
pub(super) fn server_counts(counts: &[(StatsKey, Counters)]) -> Vec<(RefClass, i64, Counters)> {
    let mut sums = std::collections::BTreeMap::<(RefClass, i64), Counters>::new();
    for (key, counters) in counts {
        sums.entry((key.class, key.hour)).or_default().add(counters);
    }
    sums.into_iter().map(|((c, h), n)| (c, h, n)).collect()
}

fn counter_params(c: &Counters) -> [i64; 14] {
    [
        c.lookups,
        c.exact_hits,
        c.restore_key_hits,
        c.misses,
        c.bytes_restored,
        c.saves,
        c.bytes_saved,
        c.evictions.evicted,
        c.evictions.expired,
        c.evictions.quarantined,
        c.evictions.deleted,
        c.refused_writes,
        c.refused_reads,
        c.promoted_hits,
    ]
    .map(|n| n.min(i64::MAX as u64) as i64)
}

/// The counters of a row that sums them under their own names ([`summed`]).
fn counters_from_row(r: &impl SqlRow) -> Result<Counters, MetaError> {
    let n = |col: crate::meta::row::Col<i64>| {
        Ok::<_, MetaError>(r.opt_int(col.name)?.unwrap_or(0).max(0) as u64)
    };
    Ok(Counters {
        lookups: n(f::lookups)?,
        exact_hits: n(f::exact_hits)?,
        restore_key_hits: n(f::restore_key_hits)?,
        misses: n(f::misses)?,
        bytes_restored: n(f::bytes_restored)?,
        saves: n(f::saves)?,
        bytes_saved: n(f::bytes_saved)?,
        evictions: Evictions {
            evicted: n(f::evicted)?,
            expired: n(f::expired)?,
            quarantined: n(f::quarantined)?,
            deleted: n(f::deleted)?,
        },
        refused_writes: n(f::refused_writes)?,
        refused_reads: n(f::refused_reads)?,
        promoted_hits: n(f::promoted_hits)?,
    })
}

/// `CAST(SUM(c) AS {bigint}) AS c` for every counter.
fn summed() -> String {
    COUNTER_COLUMNS
        .iter()
        .map(|c| format!("CAST(SUM({c}) AS {{bigint}}) AS {c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The time range of `filter` and its other conditions, on `table`'s columns.
fn conditions(filter: &StatsFilter, params: &mut Vec<Param>, with_families: bool) -> String {
    params.push(Param::Int(filter.since));
    params.push(Param::Int(filter.until));
    let mut sql = String::from(" WHERE start_at >= ? AND start_at < ?");
    if with_families {
        if let Some(repository) = &filter.repository {
            params.push(Param::Text(repository.as_str().to_owned()));
            sql.push_str(" AND repository = ?");
        }
        if let Some(family) = &filter.family {
            params.push(Param::Text(family.clone()));
            sql.push_str(" AND family = ?");
        }
    }
    if let Some(class) = filter.class {
        params.push(Param::Int(class.code()));
        sql.push_str(" AND ref_class = ?");
    }
    sql
}

/// What the rows of a [`stats_sql`] statement hold: buckets of this width, and whether they are
/// the server's (no repository or family).
#[derive(Debug, Clone, Copy)]
pub(super) struct RowShape {
    bucket: Bucket,
    server: bool,
}

/// The statement of `stats`, its parameters, and what [`stats_row`] reads from its rows.
pub(super) fn stats_sql(query: &StatsQuery<'_>) -> (String, Vec<Param>, RowShape) {
    let (bucket, server) = match query.rows {
        StatsRows::Families(width) | StatsRows::Lines(width, _) => (width, false),
        StatsRows::FamilyTotals => (Bucket::Day, false),
        StatsRows::Server(width) => (width, true),
    };
    let (sql, params) = stats_statement(query);
    (sql, params, RowShape { bucket, server })
}

fn stats_statement(query: &StatsQuery<'_>) -> (String, Vec<Param>) {
    let filter = query.filter;
    match query.rows {
        StatsRows::Families(width) => family_rows_sql(filter, width, None),
        StatsRows::Lines(width, lines) => family_rows_sql(filter, width, Some(lines)),
        StatsRows::FamilyTotals => {
            let mut params = Vec::new();
            let sql = format!(
                "SELECT repository, family, ref_class, MIN(start_at) AS start_at, {} FROM family_stats{} GROUP BY 1, 2, 3",
                summed(),
                conditions(filter, &mut params, true)
            );
            (sql, params)
        }
        StatsRows::Server(width) => {
            let mut params = vec![Param::Int(width.millis())];
            let sql = format!(
                "SELECT ref_class, start_at - (start_at % ?) AS start_at, {} FROM server_stats{} GROUP BY 1, 2 ORDER BY 2",
                summed(),
                conditions(filter, &mut params, false)
            );
            (sql, params)
        }
    }
}

/// Family rows summed per `width` bucket, of every line or only of `lines`; rows: repository,
/// family, class, start, counters.
fn family_rows_sql(
    filter: &StatsFilter,
    width: Bucket,
    lines: Option<&[(RepoId, String, RefClass)]>,
) -> (String, Vec<Param>) {
    let mut params = vec![Param::Int(width.millis())];
    let mut chosen = conditions(filter, &mut params, true);
    if let Some(lines) = lines {
        chosen.push_str(&lines_condition(lines, &mut params));
    }
    let sql = format!(
        "SELECT repository, family, ref_class, start_at - (start_at % ?) AS start_at, {} FROM family_stats{chosen} GROUP BY 1, 2, 3, 4 ORDER BY 4",
        summed(),
    );
    (sql, params)
}

/// ` AND (repository, family, ref_class) IN ((?, ?, ?), …)`; no lines select no row. Row
/// values in IN are read alike by SQLite, PostgreSQL and MySQL/MariaDB.
fn lines_condition(lines: &[(RepoId, String, RefClass)], params: &mut Vec<Param>) -> String {
    if lines.is_empty() {
        return " AND 1 = 0".to_owned();
    }
    for (repository, family, class) in lines {
        params.push(Param::Text(repository.as_str().to_owned()));
        params.push(Param::Text(family.clone()));
        params.push(Param::Int(class.code()));
    }
    format!(
        " AND (repository, family, ref_class) IN ({})",
        vec!["(?, ?, ?)"; lines.len()].join(", ")
    )
}

/// A row of a [`stats_sql`] statement.
pub(super) fn stats_row(r: &impl SqlRow, shape: RowShape) -> Result<StatsRow, MetaError> {
    let RowShape { bucket, server } = shape;
    let (repository, family) = if server {
        (RepoId::new(""), String::new())
    } else {
        (RepoId::new(r.read(f::repository)?), r.read(f::family)?)
    };
    Ok(StatsRow {
        repository,
        family,
        class: RefClass::from_code(r.read(f::ref_class)?),
        bucket,
        start: r.read(f::start_at)?,
        counters: counters_from_row(r)?,
    })
}

/// The statement of `stored_by_family` (one repository's parameter when `only`); rows:
/// repository, family, class, bytes, entries.
pub(super) fn stored_by_family_sql(only: bool) -> String {
    format!(
        "SELECT e.repository, COALESCE(f.family, '{other}') AS family, e.ref_class,
                CAST(SUM(e.size) AS {{bigint}}) AS bytes, COUNT(*) AS entries
         FROM entries e LEFT JOIN stats_families f ON f.repository = e.repository AND f.family = e.family{}
         GROUP BY 1, 2, 3",
        if only { " WHERE e.repository = ?" } else { "" },
        other = crate::model::stats::OTHER_FAMILY,
    )
}

pub(super) fn stored_row(r: &impl SqlRow) -> Result<StoredFamily, MetaError> {
    Ok(StoredFamily {
        repository: RepoId::new(r.text("repository")?),
        family: r.text("family")?,
        class: RefClass::from_code(r.int("ref_class")?),
        bytes: r.opt_int("bytes")?.unwrap_or(0).max(0) as u64,
        entries: r.count("entries")?,
    })
}
