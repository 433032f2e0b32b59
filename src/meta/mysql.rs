//! MySQL 8 and MariaDB 10.11+ metadata store (sqlx): several hoard processes may share one
//! database.
//!
//! The traps of the dialect and how they are met: default collations fold case and accents and
//! ignore trailing spaces, so every compared string is VARBINARY or BLOB (byte-wise, as on
//! SQLite); index entries may not exceed 3072 bytes, so slots and lookup ranges are indexed
//! through fixed-size hashes (`sql::bucket`, `sql::slot_hash`); there are no partial unique
//! indexes, so "one open upload per slot" is a unique index on a generated column that is NULL
//! unless the upload is open; `KEY` is reserved; there is no `RETURNING`. Sessions run at READ
//! COMMITTED, and changes to an upload first bump its revision where it still has the loaded one
//! (`claim`), as on PostgreSQL. Migrations run under `GET_LOCK`.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Executor, MySql, Row, Transaction};

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
/// MySQL runs one statement per call: statements are separated by lines holding only `;`.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("migrations/mysql/0001_init.sql")),
    (2, include_str!("migrations/mysql/0002_lifecycle.sql")),
    (3, include_str!("migrations/mysql/0003_repositories.sql")),
];
const MIGRATION_LOCK: &str = "hoard_migrations";
/// Rows per multi-row INSERT, well under the 65,535 parameters a statement may have.
const ROWS_PER_INSERT: usize = 1000;

#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
}

impl MySqlStore {
    /// Connects (at most `pool_size` connections) and brings the schema up to date.
    pub async fn open(url: &str, pool_size: u32) -> Result<Self, MetaError> {
        let options = MySqlConnectOptions::from_str(url)
            .map_err(|e| MetaError::Unavailable(format!("bad MySQL URL: {e}")))?;
        // One connection first: its error names the cause (refused, bad password, no such
        // database) where the pool's would only say it timed out.
        let probe = <sqlx::mysql::MySqlConnection as sqlx::Connection>::connect_with(&options)
            .await
            .map_err(from_sqlx)?;
        let _ = sqlx::Connection::close(probe).await;
        let pool = MySqlPoolOptions::new()
            .max_connections(pool_size)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(from_sqlx)?;
        let store = Self { pool };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<(), MetaError> {
        let mut conn = self.pool.acquire().await.map_err(from_sqlx)?;
        let locked: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 60)")
            .bind(MIGRATION_LOCK)
            .fetch_one(&mut *conn)
            .await
            .map_err(from_sqlx)?;
        if locked != Some(1) {
            return Err(MetaError::Unavailable(
                "another hoard process held the migration lock for 60 s".into(),
            ));
        }
        let applied = async {
            sqlx::raw_sql(
                "CREATE TABLE IF NOT EXISTS hoard_schema (version BIGINT NOT NULL PRIMARY KEY) ENGINE = InnoDB",
            )
            .execute(&mut *conn)
            .await?;
            let current: i64 = sqlx::query_scalar(
                "SELECT CAST(COALESCE(MAX(version), 0) AS SIGNED) FROM hoard_schema",
            )
            .fetch_one(&mut *conn)
            .await?;
            let newest = MIGRATIONS.last().map_or(0, |m| m.0);
            if current > newest {
                return Ok(Err(MetaError::Corrupt(format!(
                    "the database schema is version {current}, newer than this server's {newest}"
                ))));
            }
            // DDL commits implicitly in MySQL: a migration is recorded after its last statement,
            // and each is written to be applied once, under the lock.
            for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
                for statement in sql.split("\n;\n").map(str::trim).filter(|s| !s.is_empty()) {
                    sqlx::raw_sql(AssertSqlSafe(statement.to_owned()))
                        .execute(&mut *conn)
                        .await?;
                }
                sqlx::query("INSERT INTO hoard_schema (version) VALUES (?)")
                    .bind(version)
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(Ok(()))
        }
        .await;
        let unlocked = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await;
        applied.map_err(from_sqlx)??;
        unlocked.map_err(from_sqlx)?;
        Ok(())
    }

    async fn begin(&self) -> Result<Transaction<'static, MySql>, MetaError> {
        self.pool.begin().await.map_err(from_sqlx)
    }
}

/// A string column (stored as bytes), back as UTF-8.
fn text(row: &MySqlRow, col: usize) -> Result<String, MetaError> {
    let bytes: Vec<u8> = row.try_get(col).map_err(from_sqlx)?;
    String::from_utf8(bytes).map_err(|_| MetaError::Corrupt("a stored string is not UTF-8".into()))
}

fn int(row: &MySqlRow, col: usize) -> Result<i64, MetaError> {
    row.try_get(col).map_err(from_sqlx)
}

const UPLOAD_COLS: &str =
    "SELECT id, repository, scope, `key`, version, state, created_at, revision FROM uploads";

fn upload_from_row(r: &MySqlRow) -> Result<Upload, MetaError> {
    upload_from_parts(UploadRow {
        id: int(r, 0)?,
        repository: text(r, 1)?,
        scope: text(r, 2)?,
        key: text(r, 3)?,
        version: text(r, 4)?,
        state: r.try_get(5).map_err(from_sqlx)?,
        created_at: int(r, 6)?,
        revision: int(r, 7)?,
    })
}

fn chunk_from_row(r: &MySqlRow, first: usize) -> Result<Chunk, MetaError> {
    chunk_from_parts(
        r.try_get(first).map_err(from_sqlx)?,
        int(r, first + 1)?,
        r.try_get(first + 2).map_err(from_sqlx)?,
        r.try_get(first + 3).map_err(from_sqlx)?,
    )
}

/// Bumps the upload's revision if it is still open at the loaded one, else `Stale`.
async fn claim(
    tx: &mut Transaction<'_, MySql>,
    upload: &Upload,
    now: Millis,
) -> Result<(), MetaError> {
    let changed = sqlx::query(
        "UPDATE uploads SET revision = revision + 1, updated_at = ?
         WHERE id = ? AND revision = ? AND state = 'open'",
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

async fn drop_blocks(tx: &mut Transaction<'_, MySql>, upload: UploadId) -> Result<(), MetaError> {
    sqlx::query(
        "DELETE s, p FROM uploads u
         LEFT JOIN staged_blocks s ON s.upload_id = u.id
         LEFT JOIN upload_parts p ON p.upload_id = u.id
         WHERE u.id = ?",
    )
    .bind(upload)
    .execute(&mut **tx)
    .await
    .map_err(from_sqlx)?;
    Ok(())
}

async fn set_state(
    tx: &mut Transaction<'_, MySql>,
    upload: UploadId,
    state: &str,
) -> Result<(), MetaError> {
    sqlx::query("UPDATE uploads SET state = ? WHERE id = ?")
        .bind(state)
        .bind(upload)
        .execute(&mut **tx)
        .await
        .map_err(from_sqlx)?;
    Ok(())
}

/// Inserts `rows` (each `width` values, bound by `bind`) in multi-row statements.
async fn insert_rows<T>(
    tx: &mut Transaction<'_, MySql>,
    head: &str,
    width: usize,
    rows: &[T],
    bind: impl for<'q> Fn(
        sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments>,
        &'q T,
    ) -> sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments>,
) -> Result<(), MetaError> {
    let tuple = format!("({})", vec!["?"; width].join(", "));
    for batch in rows.chunks(ROWS_PER_INSERT) {
        let sql = format!(
            "{head} VALUES {}",
            vec![tuple.as_str(); batch.len()].join(", ")
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for row in batch {
            query = bind(query, row);
        }
        query.execute(&mut **tx).await.map_err(from_sqlx)?;
    }
    Ok(())
}

impl MySqlStore {
    async fn load_upload(&self, id: UploadId) -> Result<Option<Upload>, MetaError> {
        let row = sqlx::query(AssertSqlSafe(format!("{UPLOAD_COLS} WHERE id = ?")))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(from_sqlx)?;
        row.as_ref().map(upload_from_row).transpose()
    }

    /// An upload and its blocks, in one statement.
    async fn upload_and_blocks(
        &self,
        upload_id: &str,
        which: &str,
        key: impl Fn(
            sqlx::query::Query<'_, MySql, sqlx::mysql::MySqlArguments>,
        ) -> sqlx::query::Query<'_, MySql, sqlx::mysql::MySqlArguments>,
    ) -> Result<Option<(Upload, UploadBlocks)>, MetaError> {
        let sql = upload_with_blocks_sql(upload_id, which);
        let mut query = sqlx::query(AssertSqlSafe(sql));
        // The key is bound once per place it appears: both block branches, then `which`.
        for _ in 0..3 {
            query = key(query);
        }
        let rows = query.fetch_all(&self.pool).await.map_err(from_sqlx)?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let upload = upload_from_row(first)?;
        let blocks = collect_blocks(rows.iter().map(block_row).collect::<Result<Vec<_>, _>>()?)?;
        Ok(Some((upload, blocks)))
    }
}

fn block_row(row: &MySqlRow) -> Result<BlockRow, MetaError> {
    Ok(BlockRow {
        kind: row.try_get(8).map_err(from_sqlx)?,
        block_id: row.try_get(10).map_err(from_sqlx)?,
        blob_name: row.try_get(11).map_err(from_sqlx)?,
        size: row.try_get(12).map_err(from_sqlx)?,
        sha256: row.try_get(13).map_err(from_sqlx)?,
        xxh3: row.try_get(14).map_err(from_sqlx)?,
    })
}

#[async_trait]
impl MetaStore for MySqlStore {
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
        let row = sqlx::query(
            "SELECT u.id, u.repository, u.scope, u.key, u.version, u.state, u.created_at, u.revision,
                    CAST(EXISTS (SELECT 1 FROM entries WHERE slot_hash = ?) AS SIGNED),
                    CAST((SELECT COUNT(*) FROM uploads WHERE repository = ? AND state = 'open' AND created_at >= ?) AS SIGNED)
             FROM (SELECT 1 AS one) AS one LEFT JOIN uploads u ON u.open_slot = ?",
        )
        .bind(&hash)
        .bind(slot.repository.as_str().as_bytes())
        .bind(live_since)
        .bind(&hash)
        .fetch_one(&self.pool)
        .await
        .map_err(from_sqlx)?;
        let open = match row.try_get::<Option<i64>, _>(0).map_err(from_sqlx)? {
            Some(_) => Some(upload_from_row(&row)?),
            None => None,
        };
        Ok(SlotState {
            entry_exists: int(&row, 8)? != 0,
            open,
            live_open_uploads: int(&row, 9)? as u64,
        })
    }

    async fn upload(&self, id: UploadId) -> Result<Option<Upload>, MetaError> {
        self.load_upload(id).await
    }

    async fn upload_with_blocks(
        &self,
        id: UploadId,
    ) -> Result<Option<(Upload, UploadBlocks)>, MetaError> {
        self.upload_and_blocks("?", "u.id = ?", |q| q.bind(id))
            .await
    }

    async fn finalize_state(&self, slot: &Slot) -> Result<FinalizeState, MetaError> {
        let hash = slot_hash(slot);
        let open = self
            .upload_and_blocks(
                "(SELECT id FROM uploads WHERE open_slot = ?)",
                "u.open_slot = ?",
                |q| q.bind(hash.clone()),
            )
            .await?;
        if open.is_some() {
            return Ok(FinalizeState {
                open,
                finalized: None,
            });
        }
        // No open upload: perhaps a retry of a finalize that succeeded.
        let finalized = sqlx::query(
            "SELECT e.id, e.size FROM uploads u JOIN entries e ON e.id = u.entry_id
             WHERE u.slot_hash = ? AND u.state = 'finalized' ORDER BY u.id DESC LIMIT 1",
        )
        .bind(&hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(from_sqlx)?;
        let finalized = match finalized {
            Some(row) => Some((int(&row, 0)?, int(&row, 1)? as u64)),
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
        let sql = candidates_sql(scopes.len() * folded_keys.len(), |_| "?".to_owned());
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for scope in scopes {
            let bucket = bucket(repository, version, scope);
            for key in folded_keys {
                for prefix in [false, true] {
                    query = query
                        .bind(bucket.clone())
                        .bind(repository.as_str().as_bytes().to_vec())
                        .bind(version.as_str().as_bytes().to_vec())
                        .bind(scope.as_str().as_bytes().to_vec())
                        .bind(key.as_bytes().to_vec());
                    if prefix {
                        query = query.bind(prefix_end(key).into_bytes());
                    }
                }
            }
        }
        let rows = query.fetch_all(&self.pool).await.map_err(from_sqlx)?;
        rows.iter()
            .map(|row| {
                Ok(Candidate {
                    id: int(row, 0)?,
                    scope: Scope::new(text(row, 1)?),
                    key: text(row, 2)?,
                    key_folded: text(row, 3)?,
                    created_at: int(row, 4)?,
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
            "SELECT id, repository, scope, `key`, version, size, created_at, last_used_at, hits FROM entries
             WHERE repository = ? AND scope = ? AND key_folded = ? ORDER BY created_at DESC, id DESC LIMIT ?",
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
                Ok(Entry {
                    id: int(r, 0)?,
                    repository: RepoId::new(text(r, 1)?),
                    scope: Scope::new(text(r, 2)?),
                    key: text(r, 3)?,
                    version: text(r, 4)?,
                    size: int(r, 5)?.max(0) as u64,
                    created_at: int(r, 6)?,
                    last_used_at: int(r, 7)?,
                    hits: int(r, 8)?.max(0) as u64,
                })
            })
            .collect()
    }

    async fn entry(&self, id: EntryId) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        // One statement, one snapshot: an entry deleted meanwhile is gone whole.
        let rows = sqlx::query(
            "SELECT e.repository, e.scope, e.`key`, e.version, e.size, e.created_at, e.last_used_at, e.hits,
                    c.start, c.blob_name, c.size, c.sha256, c.xxh3
             FROM entries e JOIN entry_chunks c ON c.entry_id = e.id
             WHERE e.id = ? ORDER BY c.ordinal",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(from_sqlx)?;
        let Some(head) = rows.first() else {
            return Ok(None);
        };
        let entry = Entry {
            id,
            repository: RepoId::new(text(head, 0)?),
            scope: Scope::new(text(head, 1)?),
            key: text(head, 2)?,
            version: text(head, 3)?,
            size: int(head, 4)? as u64,
            created_at: int(head, 5)?,
            last_used_at: int(head, 6)?,
            hits: int(head, 7)? as u64,
        };
        let chunks = rows
            .iter()
            .map(|row| {
                Ok(EntryChunk {
                    start: int(row, 8)? as u64,
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
        let insert = sqlx::query(
            "INSERT INTO uploads (repository, scope, `key`, key_folded, version, slot_hash, state, created_by, created_at, updated_at)
             VALUES (?, ?, ?, ?, ?, ?, 'open', ?, ?, ?)",
        )
        .bind(slot.repository.as_str().as_bytes())
        .bind(slot.scope.as_str().as_bytes())
        .bind(slot.key.as_str().as_bytes())
        .bind(slot.key.folded().into_bytes())
        .bind(slot.version.as_str().as_bytes())
        .bind(slot_hash(slot))
        .bind(new.created_by.as_bytes())
        .bind(new.now)
        .bind(new.now);
        let Some(old) = replacing else {
            let inserted = insert.execute(&self.pool).await.map_err(from_sqlx)?;
            return Ok(inserted.last_insert_id() as i64);
        };
        // Taking over an abandoned upload: abort it and insert the new one together.
        let mut tx = self.begin().await?;
        claim(&mut tx, old, new.now).await?;
        drop_blocks(&mut tx, old.id).await?;
        set_state(&mut tx, old.id, "aborted").await?;
        let inserted = insert.execute(&mut *tx).await.map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)?;
        Ok(inserted.last_insert_id() as i64)
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
            "INSERT INTO staged_blocks (upload_id, block_id, blob_name, size, sha256, xxh3) VALUES (?, ?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE blob_name = VALUES(blob_name), size = VALUES(size), sha256 = VALUES(sha256),
                                     xxh3 = VALUES(xxh3)",
        )
        .bind(upload.id)
        .bind(block.as_bytes())
        .bind(chunk.blob.as_str())
        .bind(chunk.size as i64)
        .bind(&chunk.sha256[..])
        .bind(xxh3_column(chunk))
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
        let rows: Vec<(i64, usize, &BlockId, &Chunk)> = parts
            .iter()
            .enumerate()
            .map(|(ordinal, (block, chunk))| (upload.id, ordinal, block, chunk))
            .collect();
        insert_rows(
            &mut tx,
            "INSERT INTO upload_parts (upload_id, ordinal, block_id, blob_name, size, sha256, xxh3)",
            7,
            &rows,
            |q, (upload, ordinal, block, chunk)| {
                q.bind(*upload)
                    .bind(*ordinal as i64)
                    .bind(block.as_bytes())
                    .bind(chunk.blob.as_str())
                    .bind(chunk.size as i64)
                    .bind(&chunk.sha256[..])
                    .bind(xxh3_column(chunk))
            },
        )
        .await?;
        tx.commit().await.map_err(from_sqlx)
    }

    async fn abort_upload(&self, upload: &Upload, now: Millis) -> Result<(), MetaError> {
        let mut tx = self.begin().await?;
        claim(&mut tx, upload, now).await?;
        drop_blocks(&mut tx, upload.id).await?;
        set_state(&mut tx, upload.id, "aborted").await?;
        tx.commit().await.map_err(from_sqlx)
    }

    async fn finalize(&self, upload: &Upload, new: NewEntry<'_>) -> Result<EntryId, MetaError> {
        let slot = new.slot;
        let size: u64 = new.chunks.iter().map(|c| c.size).sum();
        let mut tx = self.begin().await?;
        // The entry first, for its id; if the upload turns out stale, the transaction is
        // rolled back with it.
        let inserted = sqlx::query(
            "INSERT INTO entries (repository, scope, `key`, key_folded, version, bucket, slot_hash, size, chunk_count, created_at, last_used_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(slot.repository.as_str().as_bytes())
        .bind(slot.scope.as_str().as_bytes())
        .bind(new.key.as_bytes())
        .bind(slot.key.folded().into_bytes())
        .bind(slot.version.as_str().as_bytes())
        .bind(bucket(&slot.repository, &slot.version, &slot.scope))
        .bind(slot_hash(slot))
        .bind(size as i64)
        .bind(new.chunks.len() as i64)
        .bind(new.now)
        .bind(new.now)
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        let entry = inserted.last_insert_id() as i64;
        let claimed = sqlx::query(
            "UPDATE uploads SET revision = revision + 1, updated_at = ?, state = 'finalized', entry_id = ?
             WHERE id = ? AND revision = ? AND state = 'open'",
        )
        .bind(new.now)
        .bind(entry)
        .bind(upload.id)
        .bind(upload.revision)
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        if claimed.rows_affected() == 0 {
            return Err(MetaError::Stale);
        }
        let placed = EntryChunk::place(new.chunks);
        let rows: Vec<(i64, usize, u64, &Chunk)> = placed
            .iter()
            .enumerate()
            .map(|(ordinal, c)| (entry, ordinal, c.start, &c.chunk))
            .collect();
        insert_rows(
            &mut tx,
            "INSERT INTO entry_chunks (entry_id, ordinal, start, blob_name, size, sha256, xxh3)",
            7,
            &rows,
            |q, (entry, ordinal, start, chunk)| {
                q.bind(*entry)
                    .bind(*ordinal as i64)
                    .bind(*start as i64)
                    .bind(chunk.blob.as_str())
                    .bind(chunk.size as i64)
                    .bind(&chunk.sha256[..])
                    .bind(xxh3_column(chunk))
            },
        )
        .await?;
        drop_blocks(&mut tx, upload.id).await?;
        sqlx::query(
            "INSERT INTO repository_usage (repository, bytes, entries, name) VALUES (?, ?, 1, ?)
             ON DUPLICATE KEY UPDATE bytes = bytes + VALUES(bytes), entries = entries + 1,
                 name = IF(VALUES(name) = '', name, VALUES(name))",
        )
        .bind(slot.repository.as_str().as_bytes())
        .bind(size as i64)
        .bind(new.repository_name.as_bytes())
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)?;
        Ok(entry)
    }

    async fn record_hits(&self, hits: &[(EntryId, u64, Millis)]) -> Result<(), MetaError> {
        let mut tx = self.begin().await?;
        for (entry, count, last_used) in hits {
            sqlx::query(
                "UPDATE entries SET hits = hits + ?, last_used_at = GREATEST(last_used_at, ?) WHERE id = ?",
            )
            .bind(*count as i64)
            .bind(*last_used)
            .bind(*entry)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
            sqlx::query(
                "UPDATE repository_usage u JOIN entries e ON e.repository = u.repository
                 SET u.hits = u.hits + ? WHERE e.id = ?",
            )
            .bind(*count as i64)
            .bind(*entry)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        }
        tx.commit().await.map_err(from_sqlx)
    }

    async fn record_misses(&self, misses: &[(RepoId, String, u64)]) -> Result<(), MetaError> {
        let mut tx = self.begin().await?;
        for (repository, name, count) in misses {
            sqlx::query(
                "INSERT INTO repository_usage (repository, bytes, entries, name, misses) VALUES (?, 0, 0, ?, ?)
                 ON DUPLICATE KEY UPDATE misses = misses + VALUES(misses),
                     name = IF(VALUES(name) = '', name, VALUES(name))",
            )
            .bind(repository.as_str().as_bytes())
            .bind(name.as_bytes())
            .bind(*count as i64)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        }
        tx.commit().await.map_err(from_sqlx)
    }

    async fn list_entries(&self, page: &EntryPage<'_>) -> Result<Vec<ListedEntry>, MetaError> {
        let (sql, params) = list_entries_sql(page, |_| "?".into());
        let rows = bind_all(sqlx::query(AssertSqlSafe(sql)), params)
            .fetch_all(&self.pool)
            .await
            .map_err(from_sqlx)?;
        rows.iter()
            .map(|r| {
                Ok(ListedRow {
                    id: int(r, 0)?,
                    repository: text(r, 1)?,
                    scope: text(r, 2)?,
                    key: text(r, 3)?,
                    version: text(r, 4)?,
                    size: int(r, 5)?,
                    created_at: int(r, 6)?,
                    last_used_at: int(r, 7)?,
                    hits: int(r, 8)?,
                    repository_name: text(r, 9)?,
                }
                .into_listed())
            })
            .collect()
    }

    async fn count_entries(&self, filter: &EntryFilter) -> Result<u64, MetaError> {
        let (sql, params) = count_entries_sql(filter, |_| "?".into());
        let row = bind_all(sqlx::query(AssertSqlSafe(sql)), params)
            .fetch_one(&self.pool)
            .await
            .map_err(from_sqlx)?;
        Ok(int(&row, 0)?.max(0) as u64)
    }

    async fn repositories(
        &self,
        only: Option<&str>,
        limit: usize,
    ) -> Result<Vec<RepositoryUsage>, MetaError> {
        let (sql, params) = repositories_sql(only, limit, |_| "?".into());
        let rows = bind_all(sqlx::query(AssertSqlSafe(sql)), params)
            .fetch_all(&self.pool)
            .await
            .map_err(from_sqlx)?;
        rows.iter()
            .map(|r| {
                Ok(repository_from_parts(
                    text(r, 0)?,
                    text(r, 1)?,
                    [int(r, 2)?, int(r, 3)?, int(r, 4)?, int(r, 5)?],
                ))
            })
            .collect()
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
        let mut tx = self.begin().await?;
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT blob_name FROM entry_chunks WHERE entry_id IN (SELECT id FROM entries WHERE created_at > ?)
             UNION SELECT blob_name FROM staged_blocks WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')
             UNION SELECT blob_name FROM upload_parts WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')",
        )
        .bind(since)
        .fetch_all(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        // Usage drops by what is forgotten: work in proportion to it, not to the database.
        sqlx::query(
            "UPDATE repository_usage u JOIN
                 (SELECT repository, SUM(size) AS bytes, COUNT(*) AS n FROM entries
                  WHERE created_at > ? GROUP BY repository) f ON u.repository = f.repository
             SET u.bytes = u.bytes - f.bytes, u.entries = u.entries - f.n",
        )
        .bind(since)
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        let forgotten = sqlx::query("DELETE FROM entries WHERE created_at > ?")
            .bind(since)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?
            .rows_affected();
        for sql in [
            "DELETE s FROM staged_blocks s JOIN uploads u ON u.id = s.upload_id WHERE u.state = 'open'",
            "DELETE p FROM upload_parts p JOIN uploads u ON u.id = p.upload_id WHERE u.state = 'open'",
        ] {
            sqlx::query(sql).execute(&mut *tx).await.map_err(from_sqlx)?;
        }
        sqlx::query("UPDATE uploads SET state = 'aborted', revision = revision + 1, updated_at = ? WHERE state = 'open'")
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
            sqlx::query_scalar("SELECT bytes FROM repository_usage WHERE repository = ?")
                .bind(repository.as_str().as_bytes())
                .fetch_optional(&self.pool)
                .await
                .map_err(from_sqlx)?;
        Ok(bytes.unwrap_or(0).max(0) as u64)
    }

    async fn total_usage(&self) -> Result<u64, MetaError> {
        let bytes: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(bytes), 0) AS SIGNED) FROM repository_usage",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(bytes.max(0) as u64)
    }

    async fn totals(&self) -> Result<super::Totals, MetaError> {
        let (bytes, entries, open): (i64, i64, i64) = sqlx::query_as(
            "SELECT CAST(COALESCE(SUM(bytes), 0) AS SIGNED), CAST(COALESCE(SUM(entries), 0) AS SIGNED),
                    (SELECT COUNT(*) FROM uploads WHERE state = 'open')
             FROM repository_usage",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(super::Totals::from_counts(bytes, entries, open))
    }

    async fn pending_deletions(&self) -> Result<u64, MetaError> {
        let bytes: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(size), 0) AS SIGNED) FROM pending_deletions",
        )
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
                    "{USE_COLS} WHERE repository = ? ORDER BY last_used_at, id LIMIT ?"
                )))
                .bind(repo.as_str().as_bytes())
                .bind(limit as i64)
                .fetch_all(&self.pool)
                .await
            }
            None => {
                sqlx::query(AssertSqlSafe(format!(
                    "{USE_COLS} ORDER BY last_used_at, id LIMIT ?"
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
            "SELECT * FROM (({USE_COLS} WHERE last_used_at < ? LIMIT ?)
              UNION ({USE_COLS} WHERE created_at < ? LIMIT ?)) AS expired LIMIT ?"
        )))
        .bind(unused_before)
        .bind(limit as i64)
        .bind(created_before.unwrap_or(Millis::MIN))
        .bind(limit as i64)
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
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        // Locks the entries that still exist: a process removing the same ones waits, then
        // finds them gone and reports nothing.
        let list = vec!["?"; ids.len()].join(", ");
        let mut locking = sqlx::query(AssertSqlSafe(format!(
            "{USE_COLS} WHERE id IN ({list}) ORDER BY id FOR UPDATE"
        )));
        for id in ids {
            locking = locking.bind(*id);
        }
        let rows = locking.fetch_all(&mut *tx).await.map_err(from_sqlx)?;
        let removed: Vec<EntryUse> = rows.iter().map(use_from_row).collect::<Result<_, _>>()?;
        for entry in &removed {
            sqlx::query(
                "INSERT INTO pending_deletions (blob_name, size, delete_at)
                 SELECT blob_name, size, ? FROM entry_chunks WHERE entry_id = ?
                 ON DUPLICATE KEY UPDATE delete_at = VALUES(delete_at)",
            )
            .bind(removal.delete_at)
            .bind(entry.id)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
            if let RemovalCause::Quarantined(reason) = removal.cause {
                sqlx::query(
                    "INSERT INTO quarantine (entry_id, repository, scope, `key`, version, size, reason, quarantined_at)
                     SELECT id, repository, scope, `key`, version, size, ?, ? FROM entries WHERE id = ?",
                )
                .bind(reason.as_str())
                .bind(removal.now)
                .bind(entry.id)
                .execute(&mut *tx)
                .await
                .map_err(from_sqlx)?;
            }
            sqlx::query("DELETE FROM entries WHERE id = ?")
                .bind(entry.id)
                .execute(&mut *tx)
                .await
                .map_err(from_sqlx)?;
            sqlx::query(
                "UPDATE repository_usage SET bytes = bytes - ?, entries = entries - 1 WHERE repository = ?",
            )
            .bind(entry.size as i64)
            .bind(entry.repository.as_str().as_bytes())
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        }
        tx.commit().await.map_err(from_sqlx)?;
        Ok(removed)
    }

    async fn due_deletions(&self, now: Millis, limit: usize) -> Result<Vec<BlobName>, MetaError> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT blob_name FROM pending_deletions WHERE delete_at <= ? ORDER BY delete_at LIMIT ?",
        )
        .bind(now)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(names.iter().filter_map(|n| BlobName::parse(n)).collect())
    }

    async fn deletions_done(&self, names: &[BlobName]) -> Result<(), MetaError> {
        for batch in names.chunks(ROWS_PER_INSERT) {
            let list = vec!["?"; batch.len()].join(", ");
            let mut delete = sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM pending_deletions WHERE blob_name IN ({list})"
            )));
            for name in batch {
                delete = delete.bind(name.as_str());
            }
            delete.execute(&self.pool).await.map_err(from_sqlx)?;
        }
        Ok(())
    }

    async fn referenced(&self, names: &[BlobName]) -> Result<Vec<BlobName>, MetaError> {
        let mut found = Vec::new();
        for batch in names.chunks(ROWS_PER_INSERT) {
            let list = vec!["?"; batch.len()].join(", ");
            let sql = [
                "entry_chunks",
                "staged_blocks",
                "upload_parts",
                "pending_deletions",
            ]
            .map(|table| format!("SELECT blob_name FROM {table} WHERE blob_name IN ({list})"))
            .join(" UNION ");
            let mut query = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql));
            for _ in 0..4 {
                for name in batch {
                    query = query.bind(name.as_str());
                }
            }
            let names: Vec<String> = query.fetch_all(&self.pool).await.map_err(from_sqlx)?;
            found.extend(names.iter().filter_map(|n| BlobName::parse(n)));
        }
        Ok(found)
    }

    async fn stale_uploads(
        &self,
        created_before: Millis,
        limit: usize,
    ) -> Result<Vec<UploadId>, MetaError> {
        sqlx::query_scalar(
            "SELECT id FROM uploads WHERE state = 'open' AND created_at < ? ORDER BY created_at LIMIT ?",
        )
        .bind(created_before)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(from_sqlx)
    }

    async fn prune_uploads(&self, created_before: Millis) -> Result<u64, MetaError> {
        let pruned = sqlx::query(
            "DELETE FROM uploads WHERE state IN ('finalized', 'aborted') AND created_at < ?",
        )
        .bind(created_before)
        .execute(&self.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(pruned.rows_affected())
    }

    async fn entry_ids(&self, after: EntryId, limit: usize) -> Result<Vec<EntryId>, MetaError> {
        sqlx::query_scalar("SELECT id FROM entries WHERE id > ? ORDER BY id LIMIT ?")
            .bind(after)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(from_sqlx)
    }
}

const USE_COLS: &str = "SELECT id, repository, size, created_at, last_used_at FROM entries";

fn use_from_row(r: &MySqlRow) -> Result<EntryUse, MetaError> {
    Ok(EntryUse {
        id: r.try_get(0).map_err(from_sqlx)?,
        repository: RepoId::new(text(r, 1)?),
        size: r.try_get::<i64, _>(2).map_err(from_sqlx)?.max(0) as u64,
        created_at: r.try_get(3).map_err(from_sqlx)?,
        last_used_at: r.try_get(4).map_err(from_sqlx)?,
    })
}
