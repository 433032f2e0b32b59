//! Statistics on the networked stores: the shared statements of [`crate::meta::stats_sql`];
//! each change runs in one transaction.

use async_trait::async_trait;

use super::{text, Dialect, SqlxStore, Step};
use crate::meta::sql::Param;
use crate::meta::stats_sql::{
    adding, family_params, kept_families_sql, server_counts, server_params, stats_row, stats_sql,
    stored_by_family_sql, stored_row, COUNT_FAMILIES, DROP_FOLDED, DROP_OLD, FORGET_FAMILIES,
};
use crate::meta::{MetaError, StatsStore};
use crate::model::{Counters, Millis, RepoId, StatsKey, StatsQuery, StatsRow, StoredFamily};

use super::super::sql::SqlRow;
use super::Done;
use crate::meta::schema::stats_families;

#[async_trait]
impl<D: Dialect> StatsStore for SqlxStore<D> {
    async fn families(
        &self,
        repository: &RepoId,
        keep: &[String],
        asked: &[String],
        now: Millis,
    ) -> Result<(Vec<String>, u64), MetaError> {
        let repository = text(repository.as_str());
        let adding = adding(D::BACKEND).keep_family.as_str();
        let mut steps: Vec<Step> = keep
            .iter()
            .map(|family| {
                let family = Param::Text(family.clone());
                Step::execute(adding, vec![repository.clone(), family, Param::Int(now)])
            })
            .collect();
        if !asked.is_empty() {
            let mut params = vec![repository.clone()];
            params.extend(asked.iter().map(|f| Param::Text(f.clone())));
            let sql = D::BACKEND.spell(&kept_families_sql(asked.len()));
            steps.push(Step::fetch(sql, params));
        }
        steps.push(Step::fetch(COUNT_FAMILIES.on(D::BACKEND), vec![repository]));
        let mut done = self.db.in_transaction(steps).await?;
        let count = match done.pop() {
            Some(Done::Rows(rows)) => super::number_of(&rows)?,
            _ => return Err(MetaError::Internal("the families gave no count".into())),
        };
        let kept = match (asked.is_empty(), done.pop()) {
            (false, Some(Done::Rows(rows))) => rows
                .iter()
                .map(|r| r.read(stats_families::family))
                .collect::<Result<_, _>>()?,
            _ => Vec::new(),
        };
        Ok((kept, count))
    }

    async fn record_stats(&self, counts: &[(StatsKey, Counters)]) -> Result<(), MetaError> {
        let sql = adding(D::BACKEND);
        let mut steps: Vec<Step> = counts
            .iter()
            .map(|(key, counters)| {
                Step::execute(sql.record_family.as_str(), family_params(key, counters))
            })
            .collect();
        steps.extend(server_counts(counts).iter().map(|(class, hour, counters)| {
            Step::execute(
                sql.record_server.as_str(),
                server_params(*class, *hour, counters),
            )
        }));
        self.db.in_transaction(steps).await.map(drop)
    }

    async fn stats(&self, query: &StatsQuery<'_>) -> Result<Vec<StatsRow>, MetaError> {
        let (sql, params, shape) = stats_sql(query);
        let rows = self.built_rows(&sql, params).await?;
        rows.iter().map(|r| stats_row(r, shape)).collect()
    }

    async fn stored_by_family(
        &self,
        repository: Option<&RepoId>,
    ) -> Result<Vec<StoredFamily>, MetaError> {
        let sql = stored_by_family_sql(repository.is_some());
        let params = repository.map(|r| text(r.as_str())).into_iter().collect();
        let rows = self.built_rows(&sql, params).await?;
        rows.iter().map(stored_row).collect()
    }

    async fn fold_stats(
        &self,
        hours_before: Millis,
        days_before: Millis,
        families_before: Millis,
    ) -> Result<(u64, u64), MetaError> {
        let sql = adding(D::BACKEND);
        let at = |t: Millis| vec![Param::Int(t)];
        let on = |statement: &'static crate::meta::dialect::Shared| statement.on(D::BACKEND);
        let steps = vec![
            Step::execute(sql.fold_family.as_str(), at(hours_before)),
            Step::execute(on(&DROP_FOLDED[0]), at(hours_before)),
            Step::execute(sql.fold_server.as_str(), at(hours_before)),
            Step::execute(on(&DROP_FOLDED[1]), at(hours_before)),
            Step::execute(on(&DROP_OLD[0]), at(days_before)),
            Step::execute(on(&DROP_OLD[1]), at(days_before)),
            Step::execute(on(&FORGET_FAMILIES), at(families_before)),
        ];
        let done = self.db.in_transaction(steps).await?;
        let changed = |i: usize| match done.get(i) {
            Some(Done::Changed(n)) => *n,
            _ => 0,
        };
        Ok((changed(1) + changed(3), changed(4) + changed(5)))
    }
}
