//! PostgreSQL: strings compare byte-wise (`COLLATE "C"`), so lookups answer exactly as on
//! SQLite. Each change to an upload is one statement: a data-modifying CTE first bumps the
//! upload's revision where it still has the loaded one (`claim`), and the rest of the statement
//! only acts on the row it claimed. Under READ COMMITTED a concurrent change to the same row
//! waits, then finds the revision moved on and claims nothing: `Stale`. One statement is one
//! round trip and atomic, with no BEGIN and COMMIT around it: a save costs a handful of round
//! trips. One open upload and one entry per slot are unique indexes. Migrations run at start-up
//! under an advisory lock, so processes starting together apply each one once.

use std::str::FromStr;
use std::sync::LazyLock;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgRow};
use sqlx::{AssertSqlSafe, Column, Row, TypeInfo};

use super::{bind_all, from_sqlx, pool_options, usage_additions, Connections, Dialect, Done, Step};
use crate::meta::dialect::{Backend, Shared};
use crate::meta::row::{stored_count, Kind, Row as _, Table};
use crate::meta::schema::{
    entries, entry_chunks, staged_blocks, upload_parts, uploads, EntryChunkRow, EntryRow,
    StagedBlockRow, UploadPartRow, UploadRow,
};
use crate::meta::sql::{migrations_after, pr_counts, use_from_row, Param, SqlRow};
use crate::meta::{MetaError, NewEntry, NewUpload, PoolSettings, Removal, Uses};
use crate::model::{BlockId, Chunk, EntryId, EntryUse, Millis, RemovalCause, Upload, UploadId};

const POSTGRES: Backend = Backend::Postgres;

/// Migrations compiled into the binary, applied in order; `hoard_schema` records the last one.
const MIGRATIONS: &[(i64, &str)] = crate::meta::migrations::POSTGRES;
/// Key of the advisory lock that serializes migrations across processes ("hoard" in ASCII).
const MIGRATION_LOCK: i64 = 0x68_6f61_7264;

#[derive(Debug, Clone)]
pub struct PostgresDialect {
    pool: PgPool,
}

impl PostgresDialect {
    async fn migrate(&self) -> Result<(), MetaError> {
        let mut conn = self.pool.acquire().await.map_err(from_sqlx)?;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await
            .map_err(from_sqlx)?;
        let applied = async {
            sqlx::raw_sql(
                "CREATE TABLE IF NOT EXISTS hoard_schema (version BIGINT NOT NULL PRIMARY KEY)",
            )
            .execute(&mut *conn)
            .await?;
            let current: i64 =
                sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM hoard_schema")
                    .fetch_one(&mut *conn)
                    .await?;
            let pending = match migrations_after(MIGRATIONS, current) {
                Ok(pending) => pending,
                Err(newer) => return Ok(Err(newer)),
            };
            for (version, sql) in pending {
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                sqlx::raw_sql(*sql).execute(&mut *tx).await?;
                sqlx::query("INSERT INTO hoard_schema (version) VALUES ($1)")
                    .bind(version)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
            Ok(Ok(()))
        }
        .await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await;
        applied.map_err(from_sqlx)??;
        unlocked.map_err(from_sqlx)?;
        Ok(())
    }
}

/// The statement of a finalize: the entry, its chunks and its repository's usage written by one
/// statement, the entry's id taken from its sequence. With an upload, the claim of the upload
/// too (parameters: $1 upload, $2 revision, $3 now, then the rest); without, the entry of
/// chunks stored already (a promotion). Then the entry's row, its chunks' columns, the
/// repository's name and its pull-request and tag bytes and entries.
fn finalize_sql(of_upload: bool) -> String {
    let (entry, chunk) = (&entries::TABLE, &entry_chunks::TABLE);
    let first = if of_upload { 4 } else { 1 };
    let entry_width = entry.inserted(POSTGRES).count();
    let chunks_from = first + entry_width;
    let after = chunks_from + chunk.inserted(POSTGRES).count() - 1;
    let (name, pr_bytes, pr_entries) = (after, after + 1, after + 2);
    let repository = row_param(entry, first, entries::repository.name);
    let size = row_param(entry, first, entries::size.name);
    let claimed = if of_upload {
        claim(", state = 'finalized', entry_id = nextval(pg_get_serial_sequence('entries', 'id'))")
    } else {
        "claimed AS (SELECT nextval(pg_get_serial_sequence('entries', 'id')) AS entry_id)".into()
    };
    format!(
        "WITH {claimed},
         entry AS (
             INSERT INTO entries (id, {}) SELECT entry_id, {} FROM claimed RETURNING id),
         chunks AS (
             INSERT INTO entry_chunks ({}) SELECT entry.id, c.* FROM entry, {}),
         usage AS (
             INSERT INTO repository_usage (repository, bytes, entries, name, pr_bytes, pr_entries)
             SELECT {repository}, {size}, 1, ${name}, ${pr_bytes}, ${pr_entries} FROM entry
             ON CONFLICT (repository) DO UPDATE
             SET bytes = repository_usage.bytes + EXCLUDED.bytes, entries = repository_usage.entries + 1,
                 name = CASE WHEN EXCLUDED.name = '' THEN repository_usage.name ELSE EXCLUDED.name END,
                 pr_bytes = repository_usage.pr_bytes + EXCLUDED.pr_bytes,
                 pr_entries = repository_usage.pr_entries + EXCLUDED.pr_entries)
         SELECT id FROM entry",
        entry.inserted_list(POSTGRES),
        row_values(entry, first, &[]),
        chunk.inserted_list(POSTGRES),
        unnest(chunk, 1, chunks_from, "c"),
    )
}

/// The first CTE of every change to an upload: bumps its revision if it is still open at the
/// loaded one ($1 id, $2 revision, $3 now), and yields its id; nothing otherwise. `{set}` adds
/// assignments made in the same update. Every such change drops the upload's blocks, and with
/// them its staged totals.
fn claim(set: &str) -> String {
    format!(
        "claimed AS (UPDATE uploads SET revision = revision + 1, updated_at = $3,
                         staged_count = 0, staged_bytes = 0{set}
                     WHERE id = $1 AND revision = $2 AND state = 'open' RETURNING id, entry_id),
         dropped_staged AS (DELETE FROM staged_blocks WHERE upload_id IN (SELECT id FROM claimed)),
         dropped_parts AS (DELETE FROM upload_parts WHERE upload_id IN (SELECT id FROM claimed))"
    )
}

/// The values of a declared row bound from `$first` on, in the order of its INSERT's columns:
/// the statement's text for each, where `from` names the ones taken from elsewhere (a column of
/// a CTE) instead of a parameter.
fn row_values(table: &Table, first: usize, from: &[(&str, &str)]) -> String {
    table
        .inserted(POSTGRES)
        .enumerate()
        .map(
            |(i, c)| match from.iter().find(|(name, _)| *name == c.name) {
                Some((_, expression)) => (*expression).to_owned(),
                None => format!("${}", first + i),
            },
        )
        .collect::<Vec<_>>()
        .join(", ")
}

/// The parameter that carries column `name` of a declared row bound from `$first` on.
fn row_param(table: &Table, first: usize, name: &str) -> String {
    let i = table
        .inserted(POSTGRES)
        .position(|c| c.name == name)
        .expect("a declared column");
    format!("${}", first + i)
}

/// `UNNEST($first::…[], …) AS alias` over the columns of many declared rows, each column one
/// array parameter, all but the first `skip` (taken from a CTE instead).
fn unnest(table: &Table, skip: usize, first: usize, alias: &str) -> String {
    let arrays: Vec<String> = table
        .inserted(POSTGRES)
        .skip(skip)
        .enumerate()
        .map(|(i, c)| {
            let kind = match c.kind {
                Kind::Int => "bigint",
                Kind::Text => "text",
                Kind::Bytes => "bytea",
            };
            format!("${}::{kind}[]", first + i)
        })
        .collect();
    format!("UNNEST({}) AS {alias}", arrays.join(", "))
}

/// Binds the columns of `rows` as arrays, one per column past the first `skip` ([`unnest`]).
fn bind_columns<'q, R: crate::meta::row::Row>(
    mut query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    rows: Vec<R>,
    skip: usize,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let columns: Vec<Kind> = R::table().inserted(POSTGRES).map(|c| c.kind).collect();
    let mut values: Vec<Vec<Param>> = vec![Vec::with_capacity(rows.len()); columns.len()];
    for row in rows {
        for (i, value) in row.inserted_values(POSTGRES).into_iter().enumerate() {
            values[i].push(value);
        }
    }
    for (kind, column) in columns.into_iter().zip(values).skip(skip) {
        query = match kind {
            Kind::Int => query.bind(
                column
                    .into_iter()
                    .map(|v| match v {
                        Param::Int(n) => Some(n),
                        _ => None,
                    })
                    .collect::<Vec<Option<i64>>>(),
            ),
            Kind::Text => query.bind(
                column
                    .into_iter()
                    .map(|v| match v {
                        Param::Text(t) => t,
                        _ => String::new(),
                    })
                    .collect::<Vec<String>>(),
            ),
            Kind::Bytes => query.bind(
                column
                    .into_iter()
                    .map(|v| match v {
                        Param::Bytes(b) => b,
                        _ => Vec::new(),
                    })
                    .collect::<Vec<Vec<u8>>>(),
            ),
        };
    }
    query
}

/// `Stale` unless the statement claimed the upload.
fn claimed(count: i64) -> Result<(), MetaError> {
    if count == 0 {
        return Err(MetaError::Stale);
    }
    Ok(())
}

impl SqlRow for PgRow {
    fn opt_int(&self, col: &str) -> Result<Option<i64>, MetaError> {
        // PostgreSQL decodes each integer width as its own type.
        let kind = self.try_column(col).map_err(from_sqlx)?.type_info().name();
        Ok(match kind {
            "INT4" => self
                .try_get::<Option<i32>, _>(col)
                .map_err(from_sqlx)?
                .map(i64::from),
            "INT2" => self
                .try_get::<Option<i16>, _>(col)
                .map_err(from_sqlx)?
                .map(i64::from),
            "BOOL" => self
                .try_get::<Option<bool>, _>(col)
                .map_err(from_sqlx)?
                .map(i64::from),
            _ => self.try_get(col).map_err(from_sqlx)?,
        })
    }

    fn opt_text(&self, col: &str) -> Result<Option<String>, MetaError> {
        self.try_get(col).map_err(from_sqlx)
    }

    fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>, MetaError> {
        self.try_get(col).map_err(from_sqlx)
    }
}

impl_connections!(PostgresDialect, sqlx::Postgres, PgRow);

#[async_trait]
impl Dialect for PostgresDialect {
    async fn open(url: &str, pool: PoolSettings) -> Result<Self, MetaError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| MetaError::Unavailable(format!("bad PostgreSQL URL: {e}")))?
            .application_name("hoard");
        // One connection first: its error names the cause (refused, bad password, no such
        // database) where the pool's would only say it timed out.
        let probe = <sqlx::postgres::PgConnection as sqlx::Connection>::connect_with(&options)
            .await
            .map_err(from_sqlx)?;
        let _ = sqlx::Connection::close(probe).await;
        let pool = pool_options::<sqlx::Postgres>(pool)
            .connect_with(options)
            .await
            .map_err(from_sqlx)?;
        let store = Self { pool };
        store.migrate().await?;
        Ok(store)
    }

    const BACKEND: Backend = POSTGRES;

    async fn create_upload(
        &self,
        new: NewUpload<'_>,
        replacing: Option<&Upload>,
    ) -> Result<UploadId, MetaError> {
        static INSERT: Shared =
            Shared::built(|| format!("{} RETURNING id", uploads::TABLE.insert(POSTGRES)));
        let values = UploadRow::from_new(&new, POSTGRES).inserted_values(POSTGRES);
        let insert = bind_all(sqlx::query(INSERT.on(POSTGRES)), values);
        let Some(old) = replacing else {
            let row = insert.fetch_one(&self.pool).await.map_err(from_sqlx)?;
            return Ok(UploadId::new(row.read(uploads::id)?));
        };
        // Taking over an abandoned upload: abort it and insert the new one together.
        let mut tx = self.pool.begin().await.map_err(from_sqlx)?;
        let aborted: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "WITH {} SELECT COUNT(*) FROM claimed",
            claim(", state = 'aborted'")
        )))
        .bind(old.id.get())
        .bind(old.revision)
        .bind(new.now)
        .fetch_one(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        claimed(aborted)?;
        let row = insert.fetch_one(&mut *tx).await.map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)?;
        Ok(UploadId::new(row.read(uploads::id)?))
    }

    async fn stage_block(
        &self,
        upload: &Upload,
        block: &BlockId,
        chunk: &Chunk,
        now: Millis,
    ) -> Result<(), MetaError> {
        // The totals count the copy this block replaces as the statement's snapshot has it;
        // a change committed since then moved the revision on, so nothing is claimed.
        // Parameters: $1 upload, $2 revision, $3 now, then the block's row.
        static SQL: Shared = Shared::built(|| {
            let table = &staged_blocks::TABLE;
            let block = row_param(table, 4, staged_blocks::block_id.name);
            let size = row_param(table, 4, staged_blocks::size.name);
            format!(
                "WITH replaced AS (
                     SELECT size FROM staged_blocks WHERE upload_id = $1 AND block_id = {block}),
                 claimed AS (
                     UPDATE uploads SET revision = revision + 1, updated_at = $3,
                         staged_count = staged_count + CASE WHEN EXISTS (SELECT 1 FROM replaced) THEN 0 ELSE 1 END,
                         staged_bytes = staged_bytes + {size} - COALESCE((SELECT size FROM replaced), 0)
                     WHERE id = $1 AND revision = $2 AND state = 'open' RETURNING id)
                 INSERT INTO staged_blocks ({}) SELECT {} FROM claimed {}",
                table.inserted_list(POSTGRES),
                row_values(table, 4, &[(staged_blocks::upload_id.name, "id")]),
                table.on_existing_replace(POSTGRES, 2)
            )
        });
        let row = StagedBlockRow::new(upload.id.get(), block, chunk);
        let query = sqlx::query(SQL.on(POSTGRES))
            .bind(upload.id.get())
            .bind(upload.revision)
            .bind(now);
        let done = bind_all(query, row.inserted_values(POSTGRES))
            .execute(&self.pool)
            .await
            .map_err(from_sqlx)?;
        claimed(done.rows_affected() as i64)
    }

    async fn commit_parts(
        &self,
        upload: &Upload,
        parts: &[(BlockId, Chunk)],
        now: Millis,
    ) -> Result<(), MetaError> {
        // All parts in one statement, however long the block list. The old parts are deleted
        // by the same statement; a DELETE in a CTE does not see rows its statement inserts.
        static SQL: Shared = Shared::built(|| {
            let table = &upload_parts::TABLE;
            format!(
                "WITH {},
                 inserted AS (
                     INSERT INTO upload_parts ({}) SELECT claimed.id, p.* FROM claimed, {})
                 SELECT COUNT(*) AS n FROM claimed",
                claim(""),
                table.inserted_list(POSTGRES),
                unnest(table, 1, 4, "p")
            )
        });
        let rows = UploadPartRow::of_list(upload.id.get(), parts);
        let query = sqlx::query(SQL.on(POSTGRES))
            .bind(upload.id.get())
            .bind(upload.revision)
            .bind(now);
        let row = bind_columns(query, rows, 1)
            .fetch_one(&self.pool)
            .await
            .map_err(from_sqlx)?;
        let count = row.int("n")?;
        claimed(count)
    }

    async fn abort_upload(&self, upload: &Upload, now: Millis) -> Result<(), MetaError> {
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "WITH {} SELECT COUNT(*) FROM claimed",
            claim(", state = 'aborted'")
        )))
        .bind(upload.id.get())
        .bind(upload.revision)
        .bind(now)
        .fetch_one(&self.pool)
        .await
        .map_err(from_sqlx)?;
        claimed(count)
    }

    async fn finalize(
        &self,
        upload: Option<&Upload>,
        new: NewEntry<'_>,
    ) -> Result<EntryId, MetaError> {
        static OF_UPLOAD: Shared = Shared::built(|| finalize_sql(true));
        static OF_STORED_CHUNKS: Shared = Shared::built(|| finalize_sql(false));
        let row = EntryRow::from_new(&new, POSTGRES);
        let (pr_bytes, pr_entries) = pr_counts(new.scope_class, row.size as u64);
        // The chunks' entry id comes from the statement (skipped by `bind_columns`).
        let chunks = EntryChunkRow::of_entry(0, new.chunks);
        let query = match upload {
            Some(upload) => sqlx::query(OF_UPLOAD.on(POSTGRES))
                .bind(upload.id.get())
                .bind(upload.revision)
                .bind(new.now),
            None => sqlx::query(OF_STORED_CHUNKS.on(POSTGRES)),
        };
        let query = bind_all(query, row.inserted_values(POSTGRES));
        let entry = bind_columns(query, chunks, 1)
            .bind(new.repository_name)
            .bind(pr_bytes)
            .bind(pr_entries)
            .fetch_optional(&self.pool)
            .await
            .map_err(from_sqlx)?;
        match entry {
            Some(row) => Ok(EntryId::new(row.read(entries::id)?)),
            None => Err(MetaError::Stale),
        }
    }

    async fn record_uses(&self, uses: &Uses, restores: Vec<Step>) -> Result<(), MetaError> {
        let mut tx = self.pool.begin().await.map_err(from_sqlx)?;
        // The entries first (in id order, as the hits come), then the restore records, then the
        // repositories' rows in repository order (see `usage_additions`).
        let mut hit_repositories = Vec::new();
        if !uses.hits.is_empty() {
            let hits = &uses.hits;
            let ids: Vec<i64> = hits.iter().map(|h| h.0.get()).collect();
            let counts: Vec<i64> = hits.iter().map(|h| stored_count(h.1)).collect();
            let last: Vec<i64> = hits.iter().map(|h| h.2).collect();
            let used = sqlx::query(
                "WITH h AS (SELECT id, SUM(count)::bigint AS count, MAX(last) AS last
                            FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[]) AS u(id, count, last) GROUP BY id)
                 UPDATE entries e SET hits = e.hits + h.count, last_used_at = GREATEST(e.last_used_at, h.last)
                 FROM h WHERE e.id = h.id
                 RETURNING e.repository, h.count",
            )
            .bind(ids)
            .bind(counts)
            .bind(last)
            .fetch_all(&mut *tx)
            .await
            .map_err(from_sqlx)?;
            for row in &used {
                hit_repositories.push((row.text("repository")?, row.int("count")?));
            }
        }
        Self::run_steps(&mut tx, restores).await?;
        let added = usage_additions(hit_repositories, &uses.misses);
        if !added.is_empty() {
            let repositories: Vec<&str> = added.iter().map(|a| a.0.as_str()).collect();
            let names: Vec<&str> = added.iter().map(|a| a.1.as_str()).collect();
            let hits: Vec<i64> = added.iter().map(|a| a.2).collect();
            let misses: Vec<i64> = added.iter().map(|a| a.3).collect();
            sqlx::query(
                "INSERT INTO repository_usage (repository, bytes, entries, name, hits, misses)
                 SELECT repository, 0, 0, name, hits, misses
                 FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS a(repository, name, hits, misses)
                 ORDER BY repository
                 ON CONFLICT (repository) DO UPDATE
                 SET hits = repository_usage.hits + EXCLUDED.hits,
                     misses = repository_usage.misses + EXCLUDED.misses,
                     name = CASE WHEN EXCLUDED.name = '' THEN repository_usage.name ELSE EXCLUDED.name END",
            )
            .bind(repositories)
            .bind(names)
            .bind(hits)
            .bind(misses)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        }
        tx.commit().await.map_err(from_sqlx)
    }

    async fn remove_entries(
        &self,
        ids: &[EntryId],
        removal: Removal<'_>,
    ) -> Result<Vec<EntryUse>, MetaError> {
        let ids: Vec<i64> = ids.iter().map(|id| id.get()).collect();
        let reason = match removal.cause {
            RemovalCause::Quarantined(reason) => Some(reason.as_str()),
            _ => None,
        };
        // One statement: every part sees the entries before the delete (the chunks too, which
        // the delete cascades to), and an entry another process removed first is simply not
        // returned (its row is gone once the lock frees). A quarantine keeps the rows instead
        // of scheduling the chunks for deletion.
        static REMOVE: LazyLock<String> = LazyLock::new(|| {
            let entry = quarantine_columns(&entries::TABLE);
            let chunk = quarantine_columns(&entry_chunks::TABLE);
            let chunk_of_c = entry_chunks::TABLE
                .columns
                .iter()
                .map(|c| format!("c.{}", c.name))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "WITH gone AS (
                     DELETE FROM entries WHERE id = ANY($1) RETURNING {entry}),
                 pending AS (
                     INSERT INTO pending_deletions (blob_name, size, delete_at)
                     SELECT c.blob_name, c.size, $2 FROM entry_chunks c JOIN gone ON c.entry_id = gone.id
                     WHERE $3::text IS NULL
                     ON CONFLICT (blob_name) DO UPDATE SET delete_at = EXCLUDED.delete_at),
                 kept AS (
                     INSERT INTO quarantined_entries ({entry}, quarantine_reason, quarantined_at)
                     SELECT {entry}, $3, $4 FROM gone WHERE $3::text IS NOT NULL),
                 kept_chunks AS (
                     INSERT INTO quarantined_chunks ({chunk})
                     SELECT {chunk_of_c} FROM entry_chunks c JOIN gone ON c.entry_id = gone.id
                     WHERE $3::text IS NOT NULL),
                 usage AS (
                     UPDATE repository_usage u SET bytes = u.bytes - g.bytes, entries = u.entries - g.n,
                         pr_bytes = u.pr_bytes - g.pr_bytes, pr_entries = u.pr_entries - g.pr_n
                     FROM (SELECT repository, SUM(size)::bigint AS bytes, COUNT(*) AS n,
                                  SUM(CASE WHEN scope_class = 1 THEN size ELSE 0 END)::bigint AS pr_bytes,
                                  COUNT(*) FILTER (WHERE scope_class = 1) AS pr_n
                           FROM gone GROUP BY repository) g
                     WHERE u.repository = g.repository)
                 SELECT id, repository, size, created_at, last_used_at, family, ref_class FROM gone ORDER BY id"
            )
        });
        let rows = sqlx::query(AssertSqlSafe(REMOVE.as_str()))
            .bind(ids)
            .bind(removal.delete_at)
            .bind(reason)
            .bind(removal.now)
            .fetch_all(&self.pool)
            .await
            .map_err(from_sqlx)?;
        rows.iter().map(use_from_row).collect()
    }
}

/// The columns of `table` that PostgreSQL has, as quarantine copies them.
fn quarantine_columns(table: &Table) -> String {
    table
        .columns
        .iter()
        .filter(|c| c.exists_on(Backend::Postgres))
        .map(|c| c.name)
        .collect::<Vec<_>>()
        .join(", ")
}
