//! PostgreSQL metadata store (sqlx): several hoard processes may share one database.
//!
//! Strings compare byte-wise (`COLLATE "C"`), so lookups answer exactly as on SQLite. Each
//! change to an upload is one statement: a data-modifying CTE first bumps the upload's revision
//! where it still has the loaded one (`CLAIM`), and the rest of the statement only acts on the
//! row it claimed. Under READ COMMITTED a concurrent change to the same row waits, then finds the
//! revision moved on and claims nothing: `Stale`. One statement is one round trip and atomic,
//! with no BEGIN and COMMIT around it: a save costs a handful of round trips. One open upload and
//! one entry per slot are unique indexes. Migrations run at start-up under an advisory lock, so
//! processes starting together apply each one once.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Row};

use super::sql::{
    bind_all, bucket, candidates_sql, chunk_from_parts, collect_blocks, count_entries_sql,
    from_sqlx, list_entries_sql, prefix_end, repositories_sql, repository_from_parts, slot_hash,
    upload_from_parts, upload_with_blocks_sql, xxh3_column, BlockRow, ListedRow, UploadRow,
};
use super::{
    EntryChunk, EntryFilter, EntryPage, FinalizeState, ListedEntry, MetaError, MetaStore, NewEntry,
    NewUpload, Removal, RepositoryUsage, SlotState,
};
use crate::model::{
    BlobName, BlockId, Candidate, Chunk, Entry, EntryId, EntryUse, Millis, RemovalCause, RepoId,
    Scope, Slot, Upload, UploadBlocks, UploadId, Version,
};

/// Migrations compiled into the binary, applied in order; `hoard_schema` records the last one.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("migrations/postgres/0001_init.sql")),
    (2, include_str!("migrations/postgres/0002_lifecycle.sql")),
    (3, include_str!("migrations/postgres/0003_repositories.sql")),
];
/// Key of the advisory lock that serializes migrations across processes ("hoard" in ASCII).
const MIGRATION_LOCK: i64 = 0x68_6f61_7264;

#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects (at most `pool_size` connections) and brings the schema up to date.
    pub async fn open(url: &str, pool_size: u32) -> Result<Self, MetaError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| MetaError::Unavailable(format!("bad PostgreSQL URL: {e}")))?
            .application_name("hoard");
        // One connection first: its error names the cause (refused, bad password, no such
        // database) where the pool's would only say it timed out.
        let probe = <sqlx::postgres::PgConnection as sqlx::Connection>::connect_with(&options)
            .await
            .map_err(from_sqlx)?;
        let _ = sqlx::Connection::close(probe).await;
        let pool = PgPoolOptions::new()
            .max_connections(pool_size)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(from_sqlx)?;
        let store = Self { pool };
        store.migrate().await?;
        Ok(store)
    }

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
            let newest = MIGRATIONS.last().map_or(0, |m| m.0);
            if current > newest {
                return Ok(Err(MetaError::Corrupt(format!(
                    "the database schema is version {current}, newer than this server's {newest}"
                ))));
            }
            for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
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

const UPLOAD_COLS: &str =
    "SELECT id, repository, scope, key, version, state, created_at, revision FROM uploads";

fn upload_from_row(r: &PgRow) -> Result<Upload, MetaError> {
    upload_from_parts(UploadRow {
        id: r.try_get(0).map_err(from_sqlx)?,
        repository: r.try_get(1).map_err(from_sqlx)?,
        scope: r.try_get(2).map_err(from_sqlx)?,
        key: r.try_get(3).map_err(from_sqlx)?,
        version: r.try_get(4).map_err(from_sqlx)?,
        state: r.try_get(5).map_err(from_sqlx)?,
        created_at: r.try_get(6).map_err(from_sqlx)?,
        revision: r.try_get(7).map_err(from_sqlx)?,
    })
}

fn chunk_from_row(r: &PgRow, first: usize) -> Result<Chunk, MetaError> {
    chunk_from_parts(
        r.try_get(first).map_err(from_sqlx)?,
        r.try_get(first + 1).map_err(from_sqlx)?,
        r.try_get(first + 2).map_err(from_sqlx)?,
        r.try_get(first + 3).map_err(from_sqlx)?,
    )
}

/// The first CTE of every change to an upload: bumps its revision if it is still open at the
/// loaded one ($1 id, $2 revision, $3 now), and yields its id; nothing otherwise. `{set}` adds
/// assignments made in the same update.
fn claim(set: &str) -> String {
    format!(
        "claimed AS (UPDATE uploads SET revision = revision + 1, updated_at = $3{set}
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

fn block_row(row: &PgRow) -> Result<BlockRow, MetaError> {
    Ok(BlockRow {
        kind: row
            .try_get::<Option<i32>, _>(8)
            .map_err(from_sqlx)?
            .map(i64::from),
        block_id: row.try_get(10).map_err(from_sqlx)?,
        blob_name: row.try_get(11).map_err(from_sqlx)?,
        size: row.try_get(12).map_err(from_sqlx)?,
        sha256: row.try_get(13).map_err(from_sqlx)?,
        xxh3: row.try_get(14).map_err(from_sqlx)?,
    })
}

/// The upload and its blocks from [`upload_with_blocks_sql`] rows.
fn upload_and_blocks(rows: &[PgRow]) -> Result<Option<(Upload, UploadBlocks)>, MetaError> {
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let upload = upload_from_row(first)?;
    let blocks = collect_blocks(rows.iter().map(block_row).collect::<Result<Vec<_>, _>>()?)?;
    Ok(Some((upload, blocks)))
}

impl PostgresStore {
    async fn load_upload(&self, id: UploadId) -> Result<Option<Upload>, MetaError> {
        let row = sqlx::query(AssertSqlSafe(format!("{UPLOAD_COLS} WHERE id = $1")))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(from_sqlx)?;
        row.as_ref().map(upload_from_row).transpose()
    }
}

#[async_trait]
impl MetaStore for PostgresStore {
    async fn ping(&self) -> Result<(), MetaError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(from_sqlx)?;
        Ok(())
    }

    async fn checkpoint(&self) -> Result<(), MetaError> {
        // Commits are durable when they return.
        Ok(())
    }

    async fn slot_state(&self, slot: &Slot, live_since: Millis) -> Result<SlotState, MetaError> {
        let row = sqlx::query(
            "SELECT u.id, u.repository, u.scope, u.key, u.version, u.state, u.created_at, u.revision,
                    EXISTS (SELECT 1 FROM entries WHERE slot_hash = $1),
                    (SELECT COUNT(*) FROM uploads WHERE repository = $2 AND state = 'open' AND created_at >= $3)
             FROM (SELECT 1) AS one LEFT JOIN uploads u ON u.slot_hash = $1 AND u.state = 'open'",
        )
        .bind(slot_hash(slot))
        .bind(slot.repository.as_str())
        .bind(live_since)
        .fetch_one(&self.pool)
        .await
        .map_err(from_sqlx)?;
        let open = match row.try_get::<Option<i64>, _>(0).map_err(from_sqlx)? {
            Some(_) => Some(upload_from_row(&row)?),
            None => None,
        };
        let live: i64 = row.try_get(9).map_err(from_sqlx)?;
        Ok(SlotState {
            entry_exists: row.try_get(8).map_err(from_sqlx)?,
            open,
            live_open_uploads: live as u64,
        })
    }

    async fn upload(&self, id: UploadId) -> Result<Option<Upload>, MetaError> {
        self.load_upload(id).await
    }

    async fn upload_with_blocks(
        &self,
        id: UploadId,
    ) -> Result<Option<(Upload, UploadBlocks)>, MetaError> {
        let rows = sqlx::query(AssertSqlSafe(upload_with_blocks_sql("$1", "u.id = $1")))
            .bind(id)
            .fetch_all(&self.pool)
            .await
            .map_err(from_sqlx)?;
        upload_and_blocks(&rows)
    }

    async fn finalize_state(&self, slot: &Slot) -> Result<FinalizeState, MetaError> {
        let hash = slot_hash(slot);
        let rows = sqlx::query(AssertSqlSafe(upload_with_blocks_sql(
            "(SELECT id FROM uploads WHERE slot_hash = $1 AND state = 'open')",
            "u.slot_hash = $1 AND u.state = 'open'",
        )))
        .bind(&hash)
        .fetch_all(&self.pool)
        .await
        .map_err(from_sqlx)?;
        let open = upload_and_blocks(&rows)?;
        if open.is_some() {
            return Ok(FinalizeState {
                open,
                finalized: None,
            });
        }
        // No open upload: perhaps a retry of a finalize that succeeded.
        let finalized = sqlx::query(
            "SELECT e.id, e.size FROM uploads u JOIN entries e ON e.id = u.entry_id
             WHERE u.slot_hash = $1 AND u.state = 'finalized' ORDER BY u.id DESC LIMIT 1",
        )
        .bind(&hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(from_sqlx)?;
        let finalized = match finalized {
            Some(row) => {
                let size: i64 = row.try_get(1).map_err(from_sqlx)?;
                Some((row.try_get(0).map_err(from_sqlx)?, size as u64))
            }
            None => None,
        };
        Ok(FinalizeState { open, finalized })
    }

    async fn find_candidates(
        &self,
        repository: &RepoId,
        version: &Version,
        scopes: &[Scope],
        folded_keys: &[String],
    ) -> Result<Vec<Candidate>, MetaError> {
        if scopes.is_empty() || folded_keys.is_empty() {
            return Ok(Vec::new());
        }
        let sql = candidates_sql(scopes.len() * folded_keys.len(), |n| format!("${n}"));
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for scope in scopes {
            let bucket = bucket(repository, version, scope);
            for key in folded_keys {
                for prefix in [false, true] {
                    query = query
                        .bind(bucket.clone())
                        .bind(repository.as_str().to_owned())
                        .bind(version.as_str().to_owned())
                        .bind(scope.as_str().to_owned())
                        .bind(key.clone());
                    if prefix {
                        query = query.bind(prefix_end(key));
                    }
                }
            }
        }
        let rows = query.fetch_all(&self.pool).await.map_err(from_sqlx)?;
        rows.iter()
            .map(|row| {
                Ok(Candidate {
                    id: row.try_get(0).map_err(from_sqlx)?,
                    scope: Scope::new(row.try_get::<String, _>(1).map_err(from_sqlx)?),
                    key: row.try_get(2).map_err(from_sqlx)?,
                    key_folded: row.try_get(3).map_err(from_sqlx)?,
                    created_at: row.try_get(4).map_err(from_sqlx)?,
                })
            })
            .collect()
    }

    async fn entries_with_key(
        &self,
        repository: &RepoId,
        scope: &Scope,
        folded_key: &str,
        limit: usize,
    ) -> Result<Vec<Entry>, MetaError> {
        let rows = sqlx::query(
            "SELECT id, repository, scope, key, version, size, created_at, last_used_at, hits FROM entries
             WHERE repository = $1 AND scope = $2 AND key_folded = $3 ORDER BY created_at DESC, id DESC LIMIT $4",
        )
        .bind(repository.as_str())
        .bind(scope.as_str())
        .bind(folded_key)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(from_sqlx)?;
        rows.iter()
            .map(|r| {
                let get_i64 = |col: usize| r.try_get::<i64, _>(col).map_err(from_sqlx);
                Ok(Entry {
                    id: get_i64(0)?,
                    repository: RepoId::new(r.try_get::<String, _>(1).map_err(from_sqlx)?),
                    scope: Scope::new(r.try_get::<String, _>(2).map_err(from_sqlx)?),
                    key: r.try_get(3).map_err(from_sqlx)?,
                    version: r.try_get(4).map_err(from_sqlx)?,
                    size: get_i64(5)?.max(0) as u64,
                    created_at: get_i64(6)?,
                    last_used_at: get_i64(7)?,
                    hits: get_i64(8)?.max(0) as u64,
                })
            })
            .collect()
    }

    async fn entry(&self, id: EntryId) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        // One statement, one snapshot: an entry deleted meanwhile is gone whole.
        let rows = sqlx::query(
            "SELECT e.repository, e.scope, e.key, e.version, e.size, e.created_at, e.last_used_at, e.hits,
                    c.start, c.blob_name, c.size, c.sha256, c.xxh3
             FROM entries e JOIN entry_chunks c ON c.entry_id = e.id
             WHERE e.id = $1 ORDER BY c.ordinal",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(from_sqlx)?;
        let Some(head) = rows.first() else {
            return Ok(None);
        };
        let get_i64 = |col: usize| head.try_get::<i64, _>(col).map_err(from_sqlx);
        let entry = Entry {
            id,
            repository: RepoId::new(head.try_get::<String, _>(0).map_err(from_sqlx)?),
            scope: Scope::new(head.try_get::<String, _>(1).map_err(from_sqlx)?),
            key: head.try_get(2).map_err(from_sqlx)?,
            version: head.try_get(3).map_err(from_sqlx)?,
            size: get_i64(4)? as u64,
            created_at: get_i64(5)?,
            last_used_at: get_i64(6)?,
            hits: get_i64(7)? as u64,
        };
        let chunks = rows
            .iter()
            .map(|row| {
                Ok(EntryChunk {
                    start: row.try_get::<i64, _>(8).map_err(from_sqlx)? as u64,
                    chunk: chunk_from_row(row, 9)?,
                })
            })
            .collect::<Result<_, MetaError>>()?;
        Ok(Some((entry, chunks)))
    }

    async fn create_upload(
        &self,
        new: NewUpload<'_>,
        replacing: Option<&Upload>,
    ) -> Result<UploadId, MetaError> {
        let slot = new.slot;
        const INSERT: &str = "INSERT INTO uploads (repository, scope, key, key_folded, version, slot_hash, state, created_by, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, 'open', $7, $8, $8) RETURNING id";
        let insert = sqlx::query_scalar(INSERT)
            .bind(slot.repository.as_str())
            .bind(slot.scope.as_str())
            .bind(slot.key.as_str())
            .bind(slot.key.folded())
            .bind(slot.version.as_str())
            .bind(slot_hash(slot))
            .bind(new.created_by)
            .bind(new.now);
        let Some(old) = replacing else {
            return insert.fetch_one(&self.pool).await.map_err(from_sqlx);
        };
        // Taking over an abandoned upload: abort it and insert the new one together.
        let mut tx = self.pool.begin().await.map_err(from_sqlx)?;
        let aborted: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "WITH {} SELECT COUNT(*) FROM claimed",
            claim(", state = 'aborted'")
        )))
        .bind(old.id)
        .bind(old.revision)
        .bind(new.now)
        .fetch_one(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        claimed(aborted)?;
        let id = insert.fetch_one(&mut *tx).await.map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)?;
        Ok(id)
    }

    async fn stage_block(
        &self,
        upload: &Upload,
        block: &BlockId,
        chunk: &Chunk,
        now: Millis,
    ) -> Result<(), MetaError> {
        const SQL: &str = "WITH claimed AS (
                 UPDATE uploads SET revision = revision + 1, updated_at = $3
                 WHERE id = $1 AND revision = $2 AND state = 'open' RETURNING id)
             INSERT INTO staged_blocks (upload_id, block_id, blob_name, size, sha256, xxh3)
             SELECT id, $4, $5, $6, $7, $8 FROM claimed
             ON CONFLICT (upload_id, block_id) DO UPDATE
             SET blob_name = EXCLUDED.blob_name, size = EXCLUDED.size, sha256 = EXCLUDED.sha256,
                 xxh3 = EXCLUDED.xxh3";
        let done = sqlx::query(SQL)
            .bind(upload.id)
            .bind(upload.revision)
            .bind(now)
            .bind(block.as_bytes())
            .bind(chunk.blob.as_str())
            .bind(chunk.size as i64)
            .bind(&chunk.sha256[..])
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
            digests.push(chunk.sha256.to_vec());
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
        .bind(upload.id)
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
        .bind(upload.id)
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
            digests.push(chunk.sha256.to_vec());
            checks.push(xxh3_column(chunk));
        }
        // The claim takes the entry's id from its sequence, so that the upload, the entry and
        // its chunks are written by one statement.
        let entry: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "WITH {},
             entry AS (
                 INSERT INTO entries (id, repository, scope, key, key_folded, version, bucket, slot_hash,
                                      size, chunk_count, created_at, last_used_at)
                 SELECT entry_id, $4, $5, $6, $7, $8, $9, $10, $11, $12, $3, $3 FROM claimed
                 RETURNING id),
             chunks AS (
                 INSERT INTO entry_chunks (entry_id, ordinal, start, blob_name, size, sha256, xxh3)
                 SELECT entry.id, c.* FROM entry,
                     UNNEST($13::int[], $14::bigint[], $15::text[], $16::bigint[], $17::bytea[], $18::bigint[]) AS c),
             usage AS (
                 INSERT INTO repository_usage (repository, bytes, entries, name)
                 SELECT $4, $11, 1, $19 FROM entry
                 ON CONFLICT (repository) DO UPDATE
                 SET bytes = repository_usage.bytes + EXCLUDED.bytes, entries = repository_usage.entries + 1,
                     name = CASE WHEN EXCLUDED.name = '' THEN repository_usage.name ELSE EXCLUDED.name END)
             SELECT id FROM entry",
            claim(", state = 'finalized', entry_id = nextval(pg_get_serial_sequence('entries', 'id'))")
        )))
        .bind(upload.id)
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
        .bind(new.repository_name)
        .fetch_optional(&self.pool)
        .await
        .map_err(from_sqlx)?;
        entry.ok_or(MetaError::Stale)
    }

    async fn record_hits(&self, hits: &[(EntryId, u64, Millis)]) -> Result<(), MetaError> {
        let ids: Vec<i64> = hits.iter().map(|h| h.0).collect();
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

    async fn list_entries(&self, page: &EntryPage<'_>) -> Result<Vec<ListedEntry>, MetaError> {
        let (sql, params) = list_entries_sql(page, |n| format!("${n}"));
        let rows = bind_all(sqlx::query(AssertSqlSafe(sql)), params)
            .fetch_all(&self.pool)
            .await
            .map_err(from_sqlx)?;
        rows.iter()
            .map(|r| {
                Ok(ListedRow {
                    id: r.try_get(0)?,
                    repository: r.try_get(1)?,
                    scope: r.try_get(2)?,
                    key: r.try_get(3)?,
                    version: r.try_get(4)?,
                    size: r.try_get(5)?,
                    created_at: r.try_get(6)?,
                    last_used_at: r.try_get(7)?,
                    hits: r.try_get(8)?,
                    repository_name: r.try_get(9)?,
                }
                .into_listed())
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(from_sqlx)
    }

    async fn count_entries(&self, filter: &EntryFilter) -> Result<u64, MetaError> {
        let (sql, params) = count_entries_sql(filter, |n| format!("${n}"));
        let row = bind_all(sqlx::query(AssertSqlSafe(sql)), params)
            .fetch_one(&self.pool)
            .await
            .map_err(from_sqlx)?;
        let n: i64 = row.try_get(0).map_err(from_sqlx)?;
        Ok(n.max(0) as u64)
    }

    async fn repositories(
        &self,
        only: Option<&str>,
        limit: usize,
    ) -> Result<Vec<RepositoryUsage>, MetaError> {
        let (sql, params) = repositories_sql(only, limit, |n| format!("${n}"));
        let rows = bind_all(sqlx::query(AssertSqlSafe(sql)), params)
            .fetch_all(&self.pool)
            .await
            .map_err(from_sqlx)?;
        rows.iter()
            .map(|r| {
                Ok(repository_from_parts(
                    r.try_get(0)?,
                    r.try_get(1)?,
                    [r.try_get(2)?, r.try_get(3)?, r.try_get(4)?, r.try_get(5)?],
                ))
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(from_sqlx)
    }

    async fn count_repositories(&self) -> Result<u64, MetaError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM repository_usage")
            .fetch_one(&self.pool)
            .await
            .map_err(from_sqlx)?;
        Ok(n.max(0) as u64)
    }

    async fn forget_after(
        &self,
        since: Millis,
        now: Millis,
    ) -> Result<(usize, Vec<BlobName>), MetaError> {
        let mut tx = self.pool.begin().await.map_err(from_sqlx)?;
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT blob_name FROM entry_chunks WHERE entry_id IN (SELECT id FROM entries WHERE created_at > $1)
             UNION SELECT blob_name FROM staged_blocks WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')
             UNION SELECT blob_name FROM upload_parts WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')",
        )
        .bind(since)
        .fetch_all(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        // Usage drops by what is forgotten: work in proportion to it, not to the database.
        sqlx::query(
            "UPDATE repository_usage u SET bytes = u.bytes - f.bytes, entries = u.entries - f.n
             FROM (SELECT repository, SUM(size)::bigint AS bytes, COUNT(*) AS n FROM entries
                   WHERE created_at > $1 GROUP BY repository) AS f
             WHERE u.repository = f.repository",
        )
        .bind(since)
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        let forgotten = sqlx::query("DELETE FROM entries WHERE created_at > $1")
            .bind(since)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?
            .rows_affected();
        for sql in [
            "DELETE FROM staged_blocks WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')",
            "DELETE FROM upload_parts WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')",
        ] {
            sqlx::query(sql).execute(&mut *tx).await.map_err(from_sqlx)?;
        }
        sqlx::query("UPDATE uploads SET state = 'aborted', revision = revision + 1, updated_at = $1 WHERE state = 'open'")
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)?;
        // UNION already made the names distinct.
        let garbage = names.iter().filter_map(|n| BlobName::parse(n)).collect();
        Ok((forgotten as usize, garbage))
    }

    async fn repository_usage(&self, repository: &RepoId) -> Result<u64, MetaError> {
        let bytes: Option<i64> =
            sqlx::query_scalar("SELECT bytes FROM repository_usage WHERE repository = $1")
                .bind(repository.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(from_sqlx)?;
        Ok(bytes.unwrap_or(0).max(0) as u64)
    }

    async fn total_usage(&self) -> Result<u64, MetaError> {
        let bytes: i64 =
            sqlx::query_scalar("SELECT COALESCE(SUM(bytes), 0)::bigint FROM repository_usage")
                .fetch_one(&self.pool)
                .await
                .map_err(from_sqlx)?;
        Ok(bytes.max(0) as u64)
    }

    async fn totals(&self) -> Result<super::Totals, MetaError> {
        let (bytes, entries, open): (i64, i64, i64) = sqlx::query_as(
            "SELECT COALESCE(SUM(bytes), 0)::bigint, COALESCE(SUM(entries), 0)::bigint,
                    (SELECT COUNT(*) FROM uploads WHERE state = 'open')
             FROM repository_usage",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(super::Totals::from_counts(bytes, entries, open))
    }

    async fn pending_deletions(&self) -> Result<u64, MetaError> {
        let bytes: i64 =
            sqlx::query_scalar("SELECT COALESCE(SUM(size), 0)::bigint FROM pending_deletions")
                .fetch_one(&self.pool)
                .await
                .map_err(from_sqlx)?;
        Ok(bytes.max(0) as u64)
    }

    async fn least_recently_used(
        &self,
        repository: Option<&RepoId>,
        limit: usize,
    ) -> Result<Vec<EntryUse>, MetaError> {
        let rows = match repository {
            Some(repo) => {
                sqlx::query(AssertSqlSafe(format!(
                    "{USE_COLS} WHERE repository = $1 ORDER BY last_used_at, id LIMIT $2"
                )))
                .bind(repo.as_str())
                .bind(limit as i64)
                .fetch_all(&self.pool)
                .await
            }
            None => {
                sqlx::query(AssertSqlSafe(format!(
                    "{USE_COLS} ORDER BY last_used_at, id LIMIT $1"
                )))
                .bind(limit as i64)
                .fetch_all(&self.pool)
                .await
            }
        }
        .map_err(from_sqlx)?;
        rows.iter().map(use_from_row).collect()
    }

    async fn expired(
        &self,
        unused_before: Millis,
        created_before: Option<Millis>,
        limit: usize,
    ) -> Result<Vec<EntryUse>, MetaError> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "(({USE_COLS} WHERE last_used_at < $1 LIMIT $3)
              UNION ({USE_COLS} WHERE created_at < $2 LIMIT $3)) LIMIT $3"
        )))
        .bind(unused_before)
        .bind(created_before.unwrap_or(Millis::MIN))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(from_sqlx)?;
        rows.iter().map(use_from_row).collect()
    }

    async fn remove_entries(
        &self,
        ids: &[EntryId],
        removal: Removal<'_>,
    ) -> Result<Vec<EntryUse>, MetaError> {
        let reason = match removal.cause {
            RemovalCause::Quarantined(reason) => Some(reason.as_str()),
            _ => None,
        };
        // One statement: every part sees the entries before the delete, and an entry another
        // process removed first is simply not returned (its row is gone once the lock frees).
        let rows = sqlx::query(
            "WITH gone AS (
                 DELETE FROM entries WHERE id = ANY($1)
                 RETURNING id, repository, scope, key, version, size, created_at, last_used_at),
             pending AS (
                 INSERT INTO pending_deletions (blob_name, size, delete_at)
                 SELECT c.blob_name, c.size, $2 FROM entry_chunks c JOIN gone ON c.entry_id = gone.id
                 ON CONFLICT (blob_name) DO UPDATE SET delete_at = EXCLUDED.delete_at),
             quarantined AS (
                 INSERT INTO quarantine (entry_id, repository, scope, key, version, size, reason, quarantined_at)
                 SELECT id, repository, scope, key, version, size, $3, $4 FROM gone WHERE $3::text IS NOT NULL),
             usage AS (
                 UPDATE repository_usage u SET bytes = u.bytes - g.bytes, entries = u.entries - g.n
                 FROM (SELECT repository, SUM(size)::bigint AS bytes, COUNT(*) AS n FROM gone GROUP BY repository) g
                 WHERE u.repository = g.repository)
             SELECT id, repository, size, created_at, last_used_at FROM gone ORDER BY id",
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

    async fn due_deletions(&self, now: Millis, limit: usize) -> Result<Vec<BlobName>, MetaError> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT blob_name FROM pending_deletions WHERE delete_at <= $1 ORDER BY delete_at LIMIT $2",
        )
        .bind(now)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(names.iter().filter_map(|n| BlobName::parse(n)).collect())
    }

    async fn deletions_done(&self, names: &[BlobName]) -> Result<(), MetaError> {
        let names: Vec<&str> = names.iter().map(BlobName::as_str).collect();
        sqlx::query("DELETE FROM pending_deletions WHERE blob_name = ANY($1)")
            .bind(names)
            .execute(&self.pool)
            .await
            .map_err(from_sqlx)?;
        Ok(())
    }

    async fn referenced(&self, names: &[BlobName]) -> Result<Vec<BlobName>, MetaError> {
        let list: Vec<&str> = names.iter().map(BlobName::as_str).collect();
        let found: Vec<String> = sqlx::query_scalar(
            "SELECT n FROM UNNEST($1::text[]) AS n
             WHERE EXISTS (SELECT 1 FROM entry_chunks WHERE blob_name = n)
                OR EXISTS (SELECT 1 FROM staged_blocks WHERE blob_name = n)
                OR EXISTS (SELECT 1 FROM upload_parts WHERE blob_name = n)
                OR EXISTS (SELECT 1 FROM pending_deletions WHERE blob_name = n)",
        )
        .bind(list)
        .fetch_all(&self.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(found.iter().filter_map(|n| BlobName::parse(n)).collect())
    }

    async fn stale_uploads(
        &self,
        created_before: Millis,
        limit: usize,
    ) -> Result<Vec<UploadId>, MetaError> {
        sqlx::query_scalar(
            "SELECT id FROM uploads WHERE state = 'open' AND created_at < $1 ORDER BY created_at LIMIT $2",
        )
        .bind(created_before)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(from_sqlx)
    }

    async fn prune_uploads(&self, created_before: Millis) -> Result<u64, MetaError> {
        let pruned = sqlx::query(
            "DELETE FROM uploads WHERE state IN ('finalized', 'aborted') AND created_at < $1",
        )
        .bind(created_before)
        .execute(&self.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(pruned.rows_affected())
    }

    async fn entry_ids(&self, after: EntryId, limit: usize) -> Result<Vec<EntryId>, MetaError> {
        sqlx::query_scalar("SELECT id FROM entries WHERE id > $1 ORDER BY id LIMIT $2")
            .bind(after)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(from_sqlx)
    }
}

const USE_COLS: &str = "SELECT id, repository, size, created_at, last_used_at FROM entries";

fn use_from_row(r: &PgRow) -> Result<EntryUse, MetaError> {
    Ok(EntryUse {
        id: r.try_get(0).map_err(from_sqlx)?,
        repository: RepoId::new(r.try_get::<String, _>(1).map_err(from_sqlx)?),
        size: r.try_get::<i64, _>(2).map_err(from_sqlx)?.max(0) as u64,
        created_at: r.try_get(3).map_err(from_sqlx)?,
        last_used_at: r.try_get(4).map_err(from_sqlx)?,
    })
}
