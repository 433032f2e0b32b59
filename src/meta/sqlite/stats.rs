//! Statistics on SQLite: the shared statements of [`crate::meta::stats_sql`], each change in one
//! write transaction.

use async_trait::async_trait;
use rusqlite::params_from_iter;

use super::{rows_of, SqliteStore};
use crate::meta::dialect::Backend;
use crate::meta::sql::{Param, SqlRow as _};
use crate::meta::stats_sql::{
    adding, family_params, family_row, family_stats_sql, family_totals_sql, kept_families_sql,
    line_stats_sql, server_counts, server_params, server_row, server_stats_sql,
    stored_by_family_sql, stored_row, COUNT_FAMILIES, DROP_FOLDED, DROP_OLD, FORGET_FAMILIES,
};
use crate::meta::{MetaError, StatsStore};
use crate::model::{
    Bucket, Counters, Millis, RefClass, RepoId, StatsFilter, StatsKey, StatsRow, StoredFamily,
};

const SQLITE: Backend = Backend::Sqlite;

/// A statement built at run time, in SQLite's spelling.
fn spell(template: &str) -> String {
    SQLITE.spell(template)
}

impl SqliteStore {
    /// Runs a shared statement whose rows are family rows (repository, family, class, start,
    /// counters) of `width` buckets.
    async fn family_rows(
        &self,
        (sql, params): (String, Vec<Param>),
        width: Bucket,
    ) -> Result<Vec<StatsRow>, MetaError> {
        let sql = spell(&sql);
        self.read(move |conn| {
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query(params_from_iter(params))?;
            rows_of(rows, |r| family_row(r, width))
        })
        .await
    }
}

#[async_trait]
impl StatsStore for SqliteStore {
    async fn kept_families(
        &self,
        repository: &RepoId,
        families: &[String],
    ) -> Result<(Vec<String>, u64), MetaError> {
        let mut params = vec![repository.as_str().to_owned()];
        params.extend(families.iter().cloned());
        self.read(move |conn| {
            let kept = if params.len() > 1 {
                // Not cached: the statement's length follows the batch.
                let mut stmt = conn.prepare(&kept_families_sql(params.len() - 1))?;
                let rows = stmt.query(params_from_iter(params.iter()))?;
                rows_of(rows, |r| {
                    r.read(crate::meta::schema::stats_families::family)
                })?
            } else {
                Vec::new()
            };
            let count: i64 = conn
                .prepare_cached(COUNT_FAMILIES.on(SQLITE))?
                .query_row([&params[0]], |r| r.get("n"))?;
            Ok((kept, count.max(0) as u64))
        })
        .await
    }

    async fn keep_families(
        &self,
        repository: &RepoId,
        families: &[String],
        now: Millis,
    ) -> Result<(), MetaError> {
        let (repository, families) = (repository.as_str().to_owned(), families.to_vec());
        self.write(move |tx| {
            let mut keep = tx.prepare_cached(&adding(SQLITE).keep_family)?;
            for family in families {
                keep.execute(rusqlite::params![repository, family, now])?;
            }
            Ok(())
        })
        .await
    }

    async fn record_stats(&self, counts: &[(StatsKey, Counters)]) -> Result<(), MetaError> {
        let family_rows: Vec<Vec<Param>> = counts
            .iter()
            .map(|(key, counters)| family_params(key, counters))
            .collect();
        let server_rows: Vec<Vec<Param>> = server_counts(counts)
            .iter()
            .map(|(class, hour, counters)| server_params(*class, *hour, counters))
            .collect();
        self.write(move |tx| {
            let sql = adding(SQLITE);
            let mut family = tx.prepare_cached(&sql.record_family)?;
            for params in family_rows {
                family.execute(params_from_iter(params))?;
            }
            let mut server = tx.prepare_cached(&sql.record_server)?;
            for params in server_rows {
                server.execute(params_from_iter(params))?;
            }
            Ok(())
        })
        .await
    }

    async fn family_stats(
        &self,
        filter: &StatsFilter,
        width: Bucket,
    ) -> Result<Vec<StatsRow>, MetaError> {
        self.family_rows(family_stats_sql(filter, width), width)
            .await
    }

    async fn family_totals(&self, filter: &StatsFilter) -> Result<Vec<StatsRow>, MetaError> {
        self.family_rows(family_totals_sql(filter), Bucket::Day)
            .await
    }

    async fn line_stats(
        &self,
        filter: &StatsFilter,
        width: Bucket,
        lines: &[(RepoId, String, RefClass)],
    ) -> Result<Vec<StatsRow>, MetaError> {
        self.family_rows(line_stats_sql(filter, width, lines), width)
            .await
    }

    async fn server_stats(
        &self,
        filter: &StatsFilter,
        width: Bucket,
    ) -> Result<Vec<StatsRow>, MetaError> {
        let (sql, params) = server_stats_sql(filter, width);
        let sql = spell(&sql);
        self.read(move |conn| {
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query(params_from_iter(params))?;
            rows_of(rows, |r| server_row(r, width))
        })
        .await
    }

    async fn stored_by_family(
        &self,
        repository: Option<&RepoId>,
    ) -> Result<Vec<StoredFamily>, MetaError> {
        let sql = spell(&stored_by_family_sql(repository.is_some()));
        let params: Vec<String> = repository
            .map(|r| r.as_str().to_owned())
            .into_iter()
            .collect();
        self.read(move |conn| {
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query(params_from_iter(params))?;
            rows_of(rows, |r| stored_row(r))
        })
        .await
    }

    async fn fold_stats(
        &self,
        hours_before: Millis,
        days_before: Millis,
        families_before: Millis,
    ) -> Result<(u64, u64), MetaError> {
        self.write(move |tx| {
            let sql = adding(SQLITE);
            let mut folded = 0;
            for (fold, drop) in [
                (&sql.fold_family, &DROP_FOLDED[0]),
                (&sql.fold_server, &DROP_FOLDED[1]),
            ] {
                tx.prepare_cached(fold)?.execute([hours_before])?;
                folded += tx
                    .prepare_cached(drop.on(SQLITE))?
                    .execute([hours_before])? as u64;
            }
            let mut dropped = 0;
            for drop in &DROP_OLD {
                dropped += tx.prepare_cached(drop.on(SQLITE))?.execute([days_before])? as u64;
            }
            tx.prepare_cached(FORGET_FAMILIES.on(SQLITE))?
                .execute([families_before])?;
            Ok((folded, dropped))
        })
        .await
    }
}
