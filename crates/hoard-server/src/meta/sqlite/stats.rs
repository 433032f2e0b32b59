//! Statistics on SQLite: the shared statements of [`crate::meta::stats_sql`], each change in one
//! write transaction.

use async_trait::async_trait;
use rusqlite::params_from_iter;

use super::{rows_of, SqliteStore};
use crate::meta::dialect::Backend;
use crate::meta::sql::{Param, SqlRow as _};
use crate::meta::stats_sql::{
    adding, family_params, kept_families_sql, server_counts, server_params, stats_row, stats_sql,
    stored_by_family_sql, stored_row, COUNT_FAMILIES, DROP_FOLDED, DROP_OLD, FORGET_FAMILIES,
};
use crate::meta::{MetaError, StatsStore};
use crate::model::{Counters, Millis, RepoId, StatsKey, StatsQuery, StatsRow, StoredFamily};

const SQLITE: Backend = Backend::Sqlite;

/// A statement built at run time, in SQLite's spelling.
fn spell(template: &str) -> String {
    SQLITE.spell(template)
}

#[async_trait]
impl StatsStore for SqliteStore {
    async fn families(
        &self,
        repository: &RepoId,
        keep: &[String],
        asked: &[String],
        now: Millis,
    ) -> Result<(Vec<String>, u64), MetaError> {
        let mut params = vec![repository.as_str().to_owned()];
        params.extend(asked.iter().cloned());
        let keep = keep.to_vec();
        let answer = move |conn: &rusqlite::Connection| {
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
        };
        if keep.is_empty() {
            return self.read(answer).await;
        }
        let repository = repository.as_str().to_owned();
        self.write(move |tx| {
            let mut adding = tx.prepare_cached(&adding(SQLITE).keep_family)?;
            for family in keep {
                adding.execute(rusqlite::params![repository, family, now])?;
            }
            answer(tx)
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

    async fn stats(&self, query: &StatsQuery<'_>) -> Result<Vec<StatsRow>, MetaError> {
        let (sql, params, shape) = stats_sql(query);
        let sql = spell(&sql);
        self.read(move |conn| {
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query(params_from_iter(params))?;
            rows_of(rows, |r| stats_row(r, shape))
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
