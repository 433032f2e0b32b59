//! MySQL 8 and MariaDB 10.11+. The traps of the dialect and how they are met: default collations fold case and accents and
//! ignore trailing spaces, so every compared string is VARBINARY or BLOB (byte-wise, as on
//! SQLite); index entries may not exceed 3072 bytes, so slots and lookup ranges are indexed
//! through fixed-size hashes (`hashes::bucket`, `hashes::slot_hash`); there are no partial unique
//! indexes, so "one open upload per slot" is a unique index on a generated column that is NULL
//! unless the upload is open; `KEY` is reserved; there is no `RETURNING`. Sessions run at READ
//! COMMITTED, and changes to an upload first bump its revision where it still has the loaded one
//! (`claim`), as on PostgreSQL. Migrations run under `GET_LOCK`.

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlRow};
use sqlx::{AssertSqlSafe, Executor, MySql, Row, Transaction};

use super::{bind_all, from_sqlx, pool_options, usage_additions, Connections, Dialect, Done, Step};
use crate::meta::dialect::Backend;
use crate::meta::quarantine;
use crate::meta::row::{stored_count, Row as _, Table};
use crate::meta::schema::{
    entries, entry_chunks, staged_blocks, upload_parts, uploads, EntryChunkRow, EntryRow,
    StagedBlockRow, UploadPartRow, UploadRow,
};
use crate::meta::sql::{migrations_after, pr_counts, use_from_row, Param, SqlRow};
use crate::meta::{MetaError, NewEntry, NewUpload, PoolSettings, Removal, Uses};
use crate::model::{
    BlockId, Chunk, EntryId, EntryUse, Millis, RemovalCause, ScopeClass, Upload, UploadId,
};

const MYSQL: Backend = Backend::MySql;

/// Migrations compiled into the binary, applied in order; `hoard_schema` records the last one.
/// MySQL runs one statement per call: statements are separated by lines holding only `;`.
const MIGRATIONS: &[(i64, &str)] = crate::meta::migrations::MYSQL;
const MIGRATION_LOCK: &str = "hoard_migrations";
/// Rows per multi-row INSERT, well under the 65,535 parameters a statement may have.
const ROWS_PER_INSERT: usize = 1000;

#[derive(Debug, Clone)]
pub struct MySqlDialect {
    pool: MySqlPool,
}

impl MySqlDialect {
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
            let pending = match migrations_after(MIGRATIONS, current) {
                Ok(pending) => pending,
                Err(newer) => return Ok(Err(newer)),
            };
            // DDL commits implicitly in MySQL: a migration is recorded after its last statement,
            // and each is written to be applied once, under the lock.
            for (version, sql) in pending {
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

/// Bumps the upload's revision if it is still open at the loaded one, else `Stale`; `closing`
/// also sets its state (`aborted`).
async fn claim(
    tx: &mut Transaction<'_, MySql>,
    upload: &Upload,
    now: Millis,
    closing: Option<&str>,
) -> Result<(), MetaError> {
    let changed = sqlx::query(
        "UPDATE uploads SET revision = revision + 1, updated_at = ?, state = COALESCE(?, state)
         WHERE id = ? AND revision = ? AND state = 'open'",
    )
    .bind(now)
    .bind(closing)
    .bind(upload.id.get())
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
    .bind(upload.get())
    .execute(&mut **tx)
    .await
    .map_err(from_sqlx)?;
    sqlx::query("UPDATE uploads SET staged_count = 0, staged_bytes = 0 WHERE id = ?")
        .bind(upload.get())
        .execute(&mut **tx)
        .await
        .map_err(from_sqlx)?;
    Ok(())
}

/// Inserts declared rows of `table` in multi-row statements.
async fn insert_rows<R: crate::meta::row::Row>(
    tx: &mut Transaction<'_, MySql>,
    table: &Table,
    rows: Vec<R>,
) -> Result<(), MetaError> {
    let width = table.inserted(MYSQL).count();
    let tuple = format!("({})", vec!["?"; width].join(", "));
    let mut rows = rows.into_iter().peekable();
    while rows.peek().is_some() {
        let batch: Vec<R> = rows.by_ref().take(ROWS_PER_INSERT).collect();
        let sql = format!(
            "INSERT INTO {} ({}) VALUES {}",
            table.name,
            table.inserted_list(MYSQL),
            vec![tuple.as_str(); batch.len()].join(", ")
        );
        let values = batch
            .into_iter()
            .flat_map(|row| row.inserted_values(MYSQL))
            .collect();
        bind_all(sqlx::query(AssertSqlSafe(sql)), values)
            .execute(&mut **tx)
            .await
            .map_err(from_sqlx)?;
    }
    Ok(())
}

impl SqlRow for MySqlRow {
    fn opt_int(&self, name: &str) -> Result<Option<i64>, MetaError> {
        self.try_get(name).map_err(from_sqlx)
    }

    /// Strings are stored as bytes (binary columns compare byte-wise): back as UTF-8.
    fn opt_text(&self, name: &str) -> Result<Option<String>, MetaError> {
        let Some(bytes) = self.opt_bytes(name)? else {
            return Ok(None);
        };
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| MetaError::Corrupt("a stored string is not UTF-8".into()))
    }

    fn opt_bytes(&self, name: &str) -> Result<Option<Vec<u8>>, MetaError> {
        self.try_get(name).map_err(from_sqlx)
    }
}

impl_connections!(MySqlDialect, MySql, MySqlRow);

#[async_trait]
impl Dialect for MySqlDialect {
    async fn open(url: &str, pool: PoolSettings) -> Result<Self, MetaError> {
        let options = MySqlConnectOptions::from_str(url)
            .map_err(|e| MetaError::Unavailable(format!("bad MySQL URL: {e}")))?;
        // One connection first: its error names the cause (refused, bad password, no such
        // database) where the pool's would only say it timed out.
        let probe = <sqlx::mysql::MySqlConnection as sqlx::Connection>::connect_with(&options)
            .await
            .map_err(from_sqlx)?;
        let _ = sqlx::Connection::close(probe).await;
        let pool = pool_options::<sqlx::MySql>(pool)
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

    const BACKEND: Backend = MYSQL;

    async fn create_upload(
        &self,
        new: NewUpload<'_>,
        replacing: Option<&Upload>,
    ) -> Result<UploadId, MetaError> {
        let values = UploadRow::from_new(&new, MYSQL).inserted_values(MYSQL);
        let insert = bind_all(sqlx::query(uploads::TABLE.insert(MYSQL)), values);
        let Some(old) = replacing else {
            let inserted = insert.execute(&self.pool).await.map_err(from_sqlx)?;
            return Ok(UploadId::new(inserted.last_insert_id() as i64));
        };
        // Taking over an abandoned upload: abort it and insert the new one together.
        let mut tx = self.begin().await?;
        claim(&mut tx, old, new.now, Some("aborted")).await?;
        drop_blocks(&mut tx, old.id).await?;
        let inserted = insert.execute(&mut *tx).await.map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)?;
        Ok(UploadId::new(inserted.last_insert_id() as i64))
    }

    async fn stage_block(
        &self,
        upload: &Upload,
        block: &BlockId,
        chunk: &Chunk,
        now: Millis,
    ) -> Result<(), MetaError> {
        let mut tx = self.begin().await?;
        claim(&mut tx, upload, now, None).await?;
        // The totals, before the copy this block replaces (if any) is gone; the claim holds
        // the upload's row, so no other change to its blocks runs meanwhile.
        sqlx::query(
            "UPDATE uploads u LEFT JOIN staged_blocks s ON s.upload_id = u.id AND s.block_id = ?
             SET u.staged_count = u.staged_count + (s.upload_id IS NULL),
                 u.staged_bytes = u.staged_bytes + ? - COALESCE(s.size, 0)
             WHERE u.id = ?",
        )
        .bind(block.as_bytes())
        .bind(chunk.size as i64)
        .bind(upload.id.get())
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        let row = StagedBlockRow::new(upload.id.get(), block, chunk);
        bind_all(
            sqlx::query(staged_blocks::TABLE.replace(MYSQL, 2)),
            row.inserted_values(MYSQL),
        )
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
        claim(&mut tx, upload, now, None).await?;
        drop_blocks(&mut tx, upload.id).await?;
        let rows = UploadPartRow::of_list(upload.id.get(), parts);
        insert_rows(&mut tx, &upload_parts::TABLE, rows).await?;
        tx.commit().await.map_err(from_sqlx)
    }

    async fn abort_upload(&self, upload: &Upload, now: Millis) -> Result<(), MetaError> {
        let mut tx = self.begin().await?;
        claim(&mut tx, upload, now, Some("aborted")).await?;
        drop_blocks(&mut tx, upload.id).await?;
        tx.commit().await.map_err(from_sqlx)
    }

    async fn finalize(
        &self,
        upload: Option<&Upload>,
        new: NewEntry<'_>,
    ) -> Result<EntryId, MetaError> {
        let row = EntryRow::from_new(&new, MYSQL);
        let (repository, size) = (row.repository.clone(), row.size);
        let mut tx = self.begin().await?;
        // The entry first, for its id; if the upload turns out stale, the transaction is
        // rolled back with it.
        let inserted = bind_all(
            sqlx::query(entries::TABLE.insert(MYSQL)),
            row.inserted_values(MYSQL),
        )
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        let entry = inserted.last_insert_id() as i64;
        if let Some(upload) = upload {
            let claimed = sqlx::query(
                "UPDATE uploads SET revision = revision + 1, updated_at = ?, state = 'finalized', entry_id = ?
                 WHERE id = ? AND revision = ? AND state = 'open'",
            )
            .bind(new.now)
            .bind(entry)
            .bind(upload.id.get())
            .bind(upload.revision)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
            if claimed.rows_affected() == 0 {
                return Err(MetaError::Stale);
            }
        }
        let chunks = EntryChunkRow::of_entry(entry, new.chunks);
        insert_rows(&mut tx, &entry_chunks::TABLE, chunks).await?;
        if let Some(upload) = upload {
            drop_blocks(&mut tx, upload.id).await?;
        }
        sqlx::query(
            "INSERT INTO repository_usage (repository, bytes, entries, name, pr_bytes, pr_entries) VALUES (?, ?, 1, ?, ?, ?)
             ON DUPLICATE KEY UPDATE bytes = bytes + VALUES(bytes), entries = entries + 1,
                 name = IF(VALUES(name) = '', name, VALUES(name)),
                 pr_bytes = pr_bytes + VALUES(pr_bytes), pr_entries = pr_entries + VALUES(pr_entries)",
        )
        .bind(repository.as_bytes())
        .bind(size)
        .bind(new.repository_name.as_bytes())
        .bind(pr_counts(new.scope_class, size as u64).0)
        .bind(pr_counts(new.scope_class, size as u64).1)
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)?;
        Ok(EntryId::new(entry))
    }

    async fn record_uses(&self, uses: &Uses, restores: Vec<Step>) -> Result<(), MetaError> {
        let mut tx = self.begin().await?;
        // The entries first (in id order, as the hits come), then the restore records, then the
        // repositories' rows in repository order (see `usage_additions`).
        let mut hit_repositories = Vec::new();
        for (entry, count, last_used) in &uses.hits {
            let used = sqlx::query(
                "UPDATE entries SET hits = hits + ?, last_used_at = GREATEST(last_used_at, ?) WHERE id = ?",
            )
            .bind(stored_count(*count))
            .bind(*last_used)
            .bind(entry.get())
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
            if used.rows_affected() == 0 {
                continue; // Removed meanwhile.
            }
            let row = sqlx::query("SELECT repository FROM entries WHERE id = ?")
                .bind(entry.get())
                .fetch_optional(&mut *tx)
                .await
                .map_err(from_sqlx)?;
            if let Some(row) = row {
                hit_repositories.push((row.text("repository")?, stored_count(*count)));
            }
        }
        Self::run_steps(&mut tx, restores).await?;
        for (repository, name, hits, misses) in usage_additions(hit_repositories, &uses.misses) {
            sqlx::query(
                "INSERT INTO repository_usage (repository, bytes, entries, name, hits, misses) VALUES (?, 0, 0, ?, ?, ?)
                 ON DUPLICATE KEY UPDATE hits = hits + VALUES(hits), misses = misses + VALUES(misses),
                     name = IF(VALUES(name) = '', name, VALUES(name))",
            )
            .bind(repository.as_bytes())
            .bind(name.as_bytes())
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
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        // Locks the entries that still exist: a process removing the same ones waits, then
        // finds them gone and reports nothing.
        let list = vec!["?"; ids.len()].join(", ");
        let mut locking = sqlx::query(AssertSqlSafe(format!(
            "SELECT id, repository, size, created_at, last_used_at, family, ref_class, scope_class FROM entries
             WHERE id IN ({list}) ORDER BY id FOR UPDATE"
        )));
        for id in ids {
            locking = locking.bind(id.get());
        }
        let rows = locking.fetch_all(&mut *tx).await.map_err(from_sqlx)?;
        let removed: Vec<EntryUse> = rows.iter().map(use_from_row).collect::<Result<_, _>>()?;
        let classes: Vec<ScopeClass> = rows
            .iter()
            .map(|r| r.read(entries::scope_class).map(ScopeClass::from_code))
            .collect::<Result<_, _>>()?;
        for (entry, class) in removed.iter().zip(classes) {
            if let RemovalCause::Quarantined(reason) = removal.cause {
                sqlx::query(AssertSqlSafe(quarantine::KEEP_ENTRY.on(Backend::MySql)))
                    .bind(reason.as_str())
                    .bind(removal.now)
                    .bind(entry.id.get())
                    .execute(&mut *tx)
                    .await
                    .map_err(from_sqlx)?;
                sqlx::query(AssertSqlSafe(quarantine::KEEP_CHUNKS.on(Backend::MySql)))
                    .bind(entry.id.get())
                    .execute(&mut *tx)
                    .await
                    .map_err(from_sqlx)?;
            } else {
                sqlx::query(
                    "INSERT INTO pending_deletions (blob_name, size, delete_at)
                     SELECT blob_name, size, ? FROM entry_chunks WHERE entry_id = ?
                     ON DUPLICATE KEY UPDATE delete_at = VALUES(delete_at)",
                )
                .bind(removal.delete_at)
                .bind(entry.id.get())
                .execute(&mut *tx)
                .await
                .map_err(from_sqlx)?;
            }
            sqlx::query("DELETE FROM entries WHERE id = ?")
                .bind(entry.id.get())
                .execute(&mut *tx)
                .await
                .map_err(from_sqlx)?;
            let (pr_bytes, pr_entries) = pr_counts(class, entry.size);
            sqlx::query(
                "UPDATE repository_usage SET bytes = bytes - ?, entries = entries - 1,
                     pr_bytes = pr_bytes - ?, pr_entries = pr_entries - ?
                 WHERE repository = ?",
            )
            .bind(entry.size as i64)
            .bind(pr_bytes)
            .bind(pr_entries)
            .bind(entry.repository.as_str().as_bytes())
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        }
        tx.commit().await.map_err(from_sqlx)?;
        Ok(removed)
    }
}
