//! PostgreSQL metadata store (sqlx): several hoard processes may share one database.
//!
//! Strings compare byte-wise (`COLLATE "C"`), so lookups answer exactly as on SQLite. Changes to
//! an upload are one transaction that first bumps the upload's revision where it still has the
//! loaded one (`claim`): under READ COMMITTED a concurrent change to the same row waits, then
//! finds the revision moved on and gives way with `Stale`. One open upload and one entry per slot
//! are unique indexes. Migrations run at start-up under an advisory lock, so processes starting
//! together apply each one once.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};

use super::sql::{
    bucket, candidates_sql, chunk_from_parts, from_sqlx, prefix_end, slot_hash, upload_from_parts,
    UploadRow,
};
use super::{EntryChunk, FinalizeState, MetaError, MetaStore, NewEntry, NewUpload, SlotState};
use crate::model::{
    BlobName, BlockId, Candidate, Chunk, Entry, EntryId, Millis, RepoId, Scope, Slot, Upload,
    UploadBlocks, UploadId, Version,
};

/// Migrations compiled into the binary, applied in order; `hoard_schema` records the last one.
const MIGRATIONS: &[(i64, &str)] = &[(1, include_str!("migrations/postgres/0001_init.sql"))];
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
            sqlx::raw_sql("CREATE TABLE IF NOT EXISTS hoard_schema (version BIGINT NOT NULL)")
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

    async fn begin(&self) -> Result<Transaction<'static, Postgres>, MetaError> {
        self.pool.begin().await.map_err(from_sqlx)
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
    )
}

/// Bumps the upload's revision if it is still open at the loaded one, else `Stale`.
async fn claim(
    tx: &mut Transaction<'_, Postgres>,
    upload: &Upload,
    now: Millis,
) -> Result<(), MetaError> {
    let changed = sqlx::query(
        "UPDATE uploads SET revision = revision + 1, updated_at = $1
         WHERE id = $2 AND revision = $3 AND state = 'open'",
    )
    .bind(now)
    .bind(upload.id)
    .bind(upload.revision)
    .execute(&mut **tx)
    .await
    .map_err(from_sqlx)?;
    if changed.rows_affected() == 0 {
        return Err(MetaError::Stale);
    }
    Ok(())
}

async fn drop_blocks(
    tx: &mut Transaction<'_, Postgres>,
    upload: UploadId,
) -> Result<(), MetaError> {
    sqlx::query("DELETE FROM staged_blocks WHERE upload_id = $1")
        .bind(upload)
        .execute(&mut **tx)
        .await
        .map_err(from_sqlx)?;
    sqlx::query("DELETE FROM upload_parts WHERE upload_id = $1")
        .bind(upload)
        .execute(&mut **tx)
        .await
        .map_err(from_sqlx)?;
    Ok(())
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

    /// Read after the upload row: a change made in between bumped the revision, so a decision
    /// on the pair is refused as stale rather than applied to blocks it did not see.
    async fn load_blocks(&self, upload: UploadId) -> Result<UploadBlocks, MetaError> {
        let rows = sqlx::query(
            "SELECT 0 AS part, 0 AS ordinal, block_id, blob_name, size, sha256 FROM staged_blocks WHERE upload_id = $1
             UNION ALL
             SELECT 1, ordinal, block_id, blob_name, size, sha256 FROM upload_parts WHERE upload_id = $1
             ORDER BY 1, 2",
        )
        .bind(upload)
        .fetch_all(&self.pool)
        .await
        .map_err(from_sqlx)?;
        let mut blocks = UploadBlocks::default();
        for row in &rows {
            let part: i32 = row.try_get(0).map_err(from_sqlx)?;
            let id = BlockId::from_stored(row.try_get(2).map_err(from_sqlx)?);
            let chunk = chunk_from_row(row, 3)?;
            if part == 1 {
                blocks.parts.push((id, chunk));
            } else {
                blocks.staged.insert(id, chunk);
            }
        }
        Ok(blocks)
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
        let hash = slot_hash(slot);
        let counts = sqlx::query(
            "SELECT EXISTS (SELECT 1 FROM entries WHERE slot_hash = $1),
                    (SELECT COUNT(*) FROM uploads WHERE repository = $2 AND state = 'open' AND created_at >= $3)",
        )
        .bind(&hash)
        .bind(slot.repository.as_str())
        .bind(live_since)
        .fetch_one(&self.pool)
        .await
        .map_err(from_sqlx)?;
        let open = sqlx::query(AssertSqlSafe(format!(
            "{UPLOAD_COLS} WHERE slot_hash = $1 AND state = 'open'"
        )))
        .bind(&hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(from_sqlx)?;
        let live: i64 = counts.try_get(1).map_err(from_sqlx)?;
        Ok(SlotState {
            entry_exists: counts.try_get(0).map_err(from_sqlx)?,
            open: open.as_ref().map(upload_from_row).transpose()?,
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
        let Some(upload) = self.load_upload(id).await? else {
            return Ok(None);
        };
        Ok(Some((upload, self.load_blocks(id).await?)))
    }

    async fn finalize_state(&self, slot: &Slot) -> Result<FinalizeState, MetaError> {
        let hash = slot_hash(slot);
        let open = sqlx::query(AssertSqlSafe(format!(
            "{UPLOAD_COLS} WHERE slot_hash = $1 AND state = 'open'"
        )))
        .bind(&hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(from_sqlx)?;
        let open = match open.as_ref().map(upload_from_row).transpose()? {
            Some(upload) => {
                let blocks = self.load_blocks(upload.id).await?;
                Some((upload, blocks))
            }
            None => None,
        };
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

    async fn entry(&self, id: EntryId) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        // One statement, one snapshot: an entry deleted meanwhile is gone whole.
        let rows = sqlx::query(
            "SELECT e.repository, e.scope, e.key, e.version, e.size, e.created_at, e.last_used_at, e.hits,
                    c.start, c.blob_name, c.size, c.sha256
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
        let mut tx = self.begin().await?;
        if let Some(old) = replacing {
            claim(&mut tx, old, new.now).await?;
            drop_blocks(&mut tx, old.id).await?;
            sqlx::query("UPDATE uploads SET state = 'aborted' WHERE id = $1")
                .bind(old.id)
                .execute(&mut *tx)
                .await
                .map_err(from_sqlx)?;
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO uploads (repository, scope, key, key_folded, version, slot_hash, state, created_by, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, 'open', $7, $8, $8) RETURNING id",
        )
        .bind(slot.repository.as_str())
        .bind(slot.scope.as_str())
        .bind(slot.key.as_str())
        .bind(slot.key.folded())
        .bind(slot.version.as_str())
        .bind(slot_hash(slot))
        .bind(new.created_by)
        .bind(new.now)
        .fetch_one(&mut *tx)
        .await
        .map_err(from_sqlx)?;
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
        let mut tx = self.begin().await?;
        claim(&mut tx, upload, now).await?;
        sqlx::query(
            "INSERT INTO staged_blocks (upload_id, block_id, blob_name, size, sha256) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (upload_id, block_id) DO UPDATE
             SET blob_name = EXCLUDED.blob_name, size = EXCLUDED.size, sha256 = EXCLUDED.sha256",
        )
        .bind(upload.id)
        .bind(block.as_bytes())
        .bind(chunk.blob.as_str())
        .bind(chunk.size as i64)
        .bind(&chunk.sha256[..])
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)
    }

    async fn commit_parts(
        &self,
        upload: &Upload,
        parts: &[(BlockId, Chunk)],
        now: Millis,
    ) -> Result<(), MetaError> {
        let mut tx = self.begin().await?;
        claim(&mut tx, upload, now).await?;
        drop_blocks(&mut tx, upload.id).await?;
        // All parts in one statement: one round trip however long the block list.
        let (mut ordinals, mut ids, mut names, mut sizes, mut digests) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (ordinal, (block, chunk)) in parts.iter().enumerate() {
            ordinals.push(ordinal as i32);
            ids.push(block.as_bytes().to_vec());
            names.push(chunk.blob.as_str().to_owned());
            sizes.push(chunk.size as i64);
            digests.push(chunk.sha256.to_vec());
        }
        sqlx::query(
            "INSERT INTO upload_parts (upload_id, ordinal, block_id, blob_name, size, sha256)
             SELECT $1, * FROM UNNEST($2::int[], $3::bytea[], $4::text[], $5::bigint[], $6::bytea[])",
        )
        .bind(upload.id)
        .bind(ordinals)
        .bind(ids)
        .bind(names)
        .bind(sizes)
        .bind(digests)
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)
    }

    async fn abort_upload(&self, upload: &Upload, now: Millis) -> Result<(), MetaError> {
        let mut tx = self.begin().await?;
        claim(&mut tx, upload, now).await?;
        drop_blocks(&mut tx, upload.id).await?;
        sqlx::query("UPDATE uploads SET state = 'aborted' WHERE id = $1")
            .bind(upload.id)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)
    }

    async fn finalize(&self, upload: &Upload, new: NewEntry<'_>) -> Result<EntryId, MetaError> {
        let slot = new.slot;
        let size: u64 = new.chunks.iter().map(|c| c.size).sum();
        let mut tx = self.begin().await?;
        claim(&mut tx, upload, new.now).await?;
        let entry: i64 = sqlx::query_scalar(
            "INSERT INTO entries (repository, scope, key, key_folded, version, bucket, slot_hash, size, chunk_count, created_at, last_used_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10) RETURNING id",
        )
        .bind(slot.repository.as_str())
        .bind(slot.scope.as_str())
        .bind(new.key)
        .bind(slot.key.folded())
        .bind(slot.version.as_str())
        .bind(bucket(&slot.repository, &slot.version, &slot.scope))
        .bind(slot_hash(slot))
        .bind(size as i64)
        .bind(new.chunks.len() as i32)
        .bind(new.now)
        .fetch_one(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        let (mut ordinals, mut starts, mut names, mut sizes, mut digests) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut start = 0u64;
        for (ordinal, chunk) in new.chunks.iter().enumerate() {
            ordinals.push(ordinal as i32);
            starts.push(start as i64);
            names.push(chunk.blob.as_str().to_owned());
            sizes.push(chunk.size as i64);
            digests.push(chunk.sha256.to_vec());
            start += chunk.size;
        }
        sqlx::query(
            "INSERT INTO entry_chunks (entry_id, ordinal, start, blob_name, size, sha256)
             SELECT $1, * FROM UNNEST($2::int[], $3::bigint[], $4::text[], $5::bigint[], $6::bytea[])",
        )
        .bind(entry)
        .bind(ordinals)
        .bind(starts)
        .bind(names)
        .bind(sizes)
        .bind(digests)
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        drop_blocks(&mut tx, upload.id).await?;
        sqlx::query("UPDATE uploads SET state = 'finalized', entry_id = $1 WHERE id = $2")
            .bind(entry)
            .bind(upload.id)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)?;
        Ok(entry)
    }

    async fn record_hits(&self, hits: &[(EntryId, u64, Millis)]) -> Result<(), MetaError> {
        let ids: Vec<i64> = hits.iter().map(|h| h.0).collect();
        let counts: Vec<i64> = hits.iter().map(|h| h.1 as i64).collect();
        let last: Vec<i64> = hits.iter().map(|h| h.2).collect();
        sqlx::query(
            "UPDATE entries e SET hits = e.hits + h.count, last_used_at = GREATEST(e.last_used_at, h.last)
             FROM (SELECT id, SUM(count) AS count, MAX(last) AS last
                   FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[]) AS u(id, count, last) GROUP BY id) AS h
             WHERE e.id = h.id",
        )
        .bind(ids)
        .bind(counts)
        .bind(last)
        .execute(&self.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(())
    }

    async fn forget_after(
        &self,
        since: Millis,
        now: Millis,
    ) -> Result<(usize, Vec<BlobName>), MetaError> {
        let mut tx = self.begin().await?;
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT blob_name FROM entry_chunks WHERE entry_id IN (SELECT id FROM entries WHERE created_at > $1)
             UNION SELECT blob_name FROM staged_blocks WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')
             UNION SELECT blob_name FROM upload_parts WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')",
        )
        .bind(since)
        .fetch_all(&mut *tx)
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
        let mut garbage: Vec<BlobName> = names.iter().filter_map(|n| BlobName::parse(n)).collect();
        garbage.sort();
        garbage.dedup();
        Ok((forgotten as usize, garbage))
    }
}
