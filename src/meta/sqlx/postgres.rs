//! PostgreSQL: strings compare byte-wise (`COLLATE "C"`), so lookups answer exactly as on
//! SQLite. Each change to an upload is one statement: a data-modifying CTE first bumps the
//! upload's revision where it still has the loaded one (`claim`), and the rest of the statement
//! only acts on the row it claimed. Under READ COMMITTED a concurrent change to the same row
//! waits, then finds the revision moved on and claims nothing: `Stale`. One statement is one
//! round trip and atomic, with no BEGIN and COMMIT around it: a save costs a handful of round
//! trips. One open upload and one entry per slot are unique indexes. Migrations run at start-up
//! under an advisory lock, so processes starting together apply each one once.

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgRow};
use sqlx::{AssertSqlSafe, Column, Row, TypeInfo};

use super::{bind_all, from_sqlx, pool_options, Connections, Dialect, Done, Step};
use crate::meta::sql::{
    bucket, migrations_after, pr_counts, provenance_columns, sha256_column, slot_hash,
    use_from_row, xxh3_column, Param, SqlRow,
};
use crate::meta::{EntryChunk, MetaError, NewEntry, NewUpload, PoolSettings, Removal};
use crate::model::{
    BlockId, Chunk, EntryId, EntryUse, Millis, RemovalCause, RepoId, Upload, UploadId,
};

/// Migrations compiled into the binary, applied in order; `hoard_schema` records the last one.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/postgres/0001_init.sql")),
    (2, include_str!("../migrations/postgres/0002_lifecycle.sql")),
    (
        3,
        include_str!("../migrations/postgres/0003_repositories.sql"),
    ),
    (
        4,
        include_str!("../migrations/postgres/0004_provenance.sql"),
    ),
    (
        5,
        include_str!("../migrations/postgres/0005_scope_class.sql"),
    ),
    (
        6,
        include_str!("../migrations/postgres/0006_family_stats.sql"),
    ),
    (
        7,
        include_str!("../migrations/postgres/0007_upload_totals.sql"),
    ),
    (
        8,
        include_str!("../migrations/postgres/0008_deferred_digests.sql"),
    ),
];
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

/// `Stale` unless the statement claimed the upload.
fn claimed(count: i64) -> Result<(), MetaError> {
    if count == 0 {
        return Err(MetaError::Stale);
    }
    Ok(())
}

impl SqlRow for PgRow {
    fn opt_int(&self, col: usize) -> Result<Option<i64>, MetaError> {
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

    fn opt_text(&self, col: usize) -> Result<Option<String>, MetaError> {
        self.try_get(col).map_err(from_sqlx)
    }

    fn opt_bytes(&self, col: usize) -> Result<Option<Vec<u8>>, MetaError> {
        self.try_get(col).map_err(from_sqlx)
    }
}

impl_connections!(PostgresDialect, PgRow);

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

    const BIGINT: &'static str = "BIGINT";
    const UPSERT: crate::meta::stats_sql::Upsert = crate::meta::stats_sql::Upsert::OnConflict;

    fn placeholder(n: usize) -> String {
        format!("${n}")
    }

    async fn create_upload(
        &self,
        new: NewUpload<'_>,
        replacing: Option<&Upload>,
    ) -> Result<UploadId, MetaError> {
        let slot = new.slot;
        const INSERT: &str = "INSERT INTO uploads (repository, scope, key, key_folded, version, slot_hash, state, created_at, updated_at,
                 writer_kind, writer_issuer, created_by, writer_run_id, writer_job_id, writer_address)
             VALUES ($1, $2, $3, $4, $5, $6, 'open', $7, $7, $8, $9, $10, $11, $12, $13) RETURNING id";
        let mut insert = sqlx::query_scalar::<_, i64>(INSERT)
            .bind(slot.repository.as_str())
            .bind(slot.scope.as_str())
            .bind(slot.key.as_str())
            .bind(slot.key.folded())
            .bind(slot.version.as_str())
            .bind(slot_hash(slot))
            .bind(new.now);
        for column in provenance_columns(Some(new.written_by)) {
            insert = insert.bind(column);
        }
        let Some(old) = replacing else {
            let id = insert.fetch_one(&self.pool).await.map_err(from_sqlx)?;
            return Ok(UploadId::new(id));
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
        let id = insert.fetch_one(&mut *tx).await.map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)?;
        Ok(UploadId::new(id))
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
        const SQL: &str = "WITH replaced AS (
                 SELECT size FROM staged_blocks WHERE upload_id = $1 AND block_id = $4),
             claimed AS (
                 UPDATE uploads SET revision = revision + 1, updated_at = $3,
                     staged_count = staged_count + CASE WHEN EXISTS (SELECT 1 FROM replaced) THEN 0 ELSE 1 END,
                     staged_bytes = staged_bytes + $6 - COALESCE((SELECT size FROM replaced), 0)
                 WHERE id = $1 AND revision = $2 AND state = 'open' RETURNING id)
             INSERT INTO staged_blocks (upload_id, block_id, blob_name, size, sha256, xxh3)
             SELECT id, $4, $5, $6, $7, $8 FROM claimed
             ON CONFLICT (upload_id, block_id) DO UPDATE
             SET blob_name = EXCLUDED.blob_name, size = EXCLUDED.size, sha256 = EXCLUDED.sha256,
                 xxh3 = EXCLUDED.xxh3";
        let done = sqlx::query(SQL)
            .bind(upload.id.get())
            .bind(upload.revision)
            .bind(now)
            .bind(block.as_bytes())
            .bind(chunk.blob.as_str())
            .bind(chunk.size as i64)
            .bind(sha256_column(chunk))
            .bind(xxh3_column(chunk))
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
        let (mut ordinals, mut ids, mut names, mut sizes, mut digests, mut checks) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        for (ordinal, (block, chunk)) in parts.iter().enumerate() {
            ordinals.push(ordinal as i32);
            ids.push(block.as_bytes().to_vec());
            names.push(chunk.blob.as_str().to_owned());
            sizes.push(chunk.size as i64);
            digests.push(sha256_column(chunk).to_vec());
            checks.push(xxh3_column(chunk));
        }
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "WITH {},
             inserted AS (
                 INSERT INTO upload_parts (upload_id, ordinal, block_id, blob_name, size, sha256, xxh3)
                 SELECT claimed.id, p.* FROM claimed,
                     UNNEST($4::int[], $5::bytea[], $6::text[], $7::bigint[], $8::bytea[], $9::bigint[]) AS p)
             SELECT COUNT(*) FROM claimed",
            claim("")
        )))
        .bind(upload.id.get())
        .bind(upload.revision)
        .bind(now)
        .bind(ordinals)
        .bind(ids)
        .bind(names)
        .bind(sizes)
        .bind(digests)
        .bind(checks)
        .fetch_one(&self.pool)
        .await
        .map_err(from_sqlx)?;
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

    async fn finalize(&self, upload: &Upload, new: NewEntry<'_>) -> Result<EntryId, MetaError> {
        let slot = new.slot;
        let size: u64 = new.chunks.iter().map(|c| c.size).sum();
        let (mut ordinals, mut starts, mut names, mut sizes, mut digests, mut checks) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        for (ordinal, EntryChunk { start, chunk }) in
            EntryChunk::place(new.chunks).iter().enumerate()
        {
            ordinals.push(ordinal as i32);
            starts.push(*start as i64);
            names.push(chunk.blob.as_str().to_owned());
            sizes.push(chunk.size as i64);
            digests.push(sha256_column(chunk).to_vec());
            checks.push(xxh3_column(chunk));
        }
        // The claim takes the entry's id from its sequence, so that the upload, the entry and
        // its chunks are written by one statement.
        let sql = format!(
            "WITH {},
             entry AS (
                 INSERT INTO entries (id, repository, scope, key, key_folded, version, bucket, slot_hash,
                                      size, chunk_count, created_at, last_used_at,
                                      writer_kind, writer_issuer, writer_subject, writer_run_id, writer_job_id,
                                      writer_address, digest,
                                      scope_class, family, ref_class)
                 SELECT entry_id, $4, $5, $6, $7, $8, $9, $10, $11, $12, $3, $3,
                        $20, $21, $22, $23, $24, $25, $26,
                        $27, $30, $31 FROM claimed
                 RETURNING id),
             chunks AS (
                 INSERT INTO entry_chunks (entry_id, ordinal, start, blob_name, size, sha256, xxh3)
                 SELECT entry.id, c.* FROM entry,
                     UNNEST($13::int[], $14::bigint[], $15::text[], $16::bigint[], $17::bytea[], $18::bigint[]) AS c),
             usage AS (
                 INSERT INTO repository_usage (repository, bytes, entries, name, pr_bytes, pr_entries)
                 SELECT $4, $11, 1, $19, $28, $29 FROM entry
                 ON CONFLICT (repository) DO UPDATE
                 SET bytes = repository_usage.bytes + EXCLUDED.bytes, entries = repository_usage.entries + 1,
                     name = CASE WHEN EXCLUDED.name = '' THEN repository_usage.name ELSE EXCLUDED.name END,
                     pr_bytes = repository_usage.pr_bytes + EXCLUDED.pr_bytes,
                     pr_entries = repository_usage.pr_entries + EXCLUDED.pr_entries)
             SELECT id FROM entry",
            claim(", state = 'finalized', entry_id = nextval(pg_get_serial_sequence('entries', 'id'))")
        );
        let mut statement = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(upload.id.get())
            .bind(upload.revision)
            .bind(new.now)
            .bind(slot.repository.as_str())
            .bind(slot.scope.as_str())
            .bind(new.key)
            .bind(slot.key.folded())
            .bind(slot.version.as_str())
            .bind(bucket(&slot.repository, &slot.version, &slot.scope))
            .bind(slot_hash(slot))
            .bind(size as i64)
            .bind(new.chunks.len() as i32)
            .bind(ordinals)
            .bind(starts)
            .bind(names)
            .bind(sizes)
            .bind(digests)
            .bind(checks)
            .bind(new.repository_name);
        for column in provenance_columns(new.written_by) {
            statement = statement.bind(column);
        }
        let (pr_bytes, pr_entries) = pr_counts(new.scope_class, size);
        let entry: Option<i64> = statement
            .bind(new.digest)
            .bind(new.scope_class.code() as i16)
            .bind(pr_bytes)
            .bind(pr_entries)
            .bind(new.family)
            .bind(new.ref_class.code() as i16)
            .fetch_optional(&self.pool)
            .await
            .map_err(from_sqlx)?;
        entry.map(EntryId::new).ok_or(MetaError::Stale)
    }

    async fn record_hits(&self, hits: &[(EntryId, u64, Millis)]) -> Result<(), MetaError> {
        let ids: Vec<i64> = hits.iter().map(|h| h.0.get()).collect();
        let counts: Vec<i64> = hits.iter().map(|h| h.1 as i64).collect();
        let last: Vec<i64> = hits.iter().map(|h| h.2).collect();
        sqlx::query(
            "WITH h AS (SELECT id, SUM(count) AS count, MAX(last) AS last
                        FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[]) AS u(id, count, last) GROUP BY id),
             used AS (
                 UPDATE entries e SET hits = e.hits + h.count, last_used_at = GREATEST(e.last_used_at, h.last)
                 FROM h WHERE e.id = h.id
                 RETURNING e.repository, h.count)
             UPDATE repository_usage r SET hits = r.hits + per.count
             FROM (SELECT repository, SUM(count)::bigint AS count FROM used GROUP BY repository) AS per
             WHERE r.repository = per.repository",
        )
        .bind(ids)
        .bind(counts)
        .bind(last)
        .execute(&self.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(())
    }

    async fn record_misses(&self, misses: &[(RepoId, String, u64)]) -> Result<(), MetaError> {
        let repositories: Vec<&str> = misses.iter().map(|m| m.0.as_str()).collect();
        let names: Vec<&str> = misses.iter().map(|m| m.1.as_str()).collect();
        let counts: Vec<i64> = misses.iter().map(|m| m.2 as i64).collect();
        sqlx::query(
            "INSERT INTO repository_usage (repository, bytes, entries, name, misses)
             SELECT repository, 0, 0, MAX(name), SUM(count)::bigint
             FROM UNNEST($1::text[], $2::text[], $3::bigint[]) AS m(repository, name, count)
             GROUP BY repository
             ORDER BY repository
             ON CONFLICT (repository) DO UPDATE
             SET misses = repository_usage.misses + EXCLUDED.misses,
                 name = CASE WHEN EXCLUDED.name = '' THEN repository_usage.name ELSE EXCLUDED.name END",
        )
        .bind(repositories)
        .bind(names)
        .bind(counts)
        .execute(&self.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(())
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
        // One statement: every part sees the entries before the delete, and an entry another
        // process removed first is simply not returned (its row is gone once the lock frees).
        let rows = sqlx::query(
            "WITH gone AS (
                 DELETE FROM entries WHERE id = ANY($1)
                 RETURNING id, repository, scope, key, version, size, created_at, last_used_at, scope_class,
                           family, ref_class),
             pending AS (
                 INSERT INTO pending_deletions (blob_name, size, delete_at)
                 SELECT c.blob_name, c.size, $2 FROM entry_chunks c JOIN gone ON c.entry_id = gone.id
                 ON CONFLICT (blob_name) DO UPDATE SET delete_at = EXCLUDED.delete_at),
             quarantined AS (
                 INSERT INTO quarantine (entry_id, repository, scope, key, version, size, reason, quarantined_at)
                 SELECT id, repository, scope, key, version, size, $3, $4 FROM gone WHERE $3::text IS NOT NULL),
             usage AS (
                 UPDATE repository_usage u SET bytes = u.bytes - g.bytes, entries = u.entries - g.n,
                     pr_bytes = u.pr_bytes - g.pr_bytes, pr_entries = u.pr_entries - g.pr_n
                 FROM (SELECT repository, SUM(size)::bigint AS bytes, COUNT(*) AS n,
                              SUM(CASE WHEN scope_class = 1 THEN size ELSE 0 END)::bigint AS pr_bytes,
                              COUNT(*) FILTER (WHERE scope_class = 1) AS pr_n
                       FROM gone GROUP BY repository) g
                 WHERE u.repository = g.repository)
             SELECT id, repository, size, created_at, last_used_at, family, ref_class FROM gone ORDER BY id",
        )
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
