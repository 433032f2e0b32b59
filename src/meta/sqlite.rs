//! SQLite metadata store: WAL, one writer connection and a pool of readers.
//!
//! All writes go through a single connection, so writers queue in-process instead of failing
//! with `SQLITE_BUSY`; readers use their own connections and never wait for the writer (WAL).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, Transaction};

use super::{
    Committed, EntryChunk, FinalizeRequest, Finalized, MetaError, MetaStore, NewUpload, Reserved,
    Staged,
};
use crate::cache::matching::Candidate;
use crate::cache::model::{
    BlobName, BlockId, Chunk, Entry, EntryId, Millis, RepoId, Scope, Upload, UploadId, UploadState,
    Version,
};
use crate::cache::upload::{assemble, BlockRef};

/// Migrations compiled into the binary and run at start-up, oldest first.
const MIGRATIONS: &[(i64, &str, &str)] =
    &[(1, "init", include_str!("migrations/sqlite/0001_init.sql"))];

#[derive(Debug)]
struct Embedded(&'static [(i64, &'static str, &'static str)]);

impl<'s> MigrationSource<'s> for Embedded {
    fn resolve(self) -> BoxFuture<'s, Result<Vec<Migration>, sqlx::error::BoxDynError>> {
        Box::pin(async move {
            Ok(self
                .0
                .iter()
                .map(|(version, name, sql)| {
                    Migration::new(
                        *version,
                        Cow::Borrowed(*name),
                        MigrationType::Simple,
                        Cow::Borrowed(*sql),
                        false,
                    )
                })
                .collect())
        })
    }
}

#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    readers: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `url` (`sqlite://PATH` or a plain path) and
    /// brings its schema up to date.
    pub async fn open(url: &str) -> Result<Self, MetaError> {
        let options = if url.starts_with("sqlite:") {
            SqliteConnectOptions::from_str(url)?
        } else {
            SqliteConnectOptions::new().filename(Path::new(url))
        };
        let options = options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true)
            .statement_cache_capacity(256);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options.clone())
            .await?;
        Migrator::new(Embedded(MIGRATIONS))
            .await?
            .run(&writer)
            .await?;
        let readers = SqlitePoolOptions::new()
            .max_connections(8)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options.read_only(true))
            .await?;
        Ok(Self { writer, readers })
    }
}

fn chunk_from_row(row: &SqliteRow) -> Result<Chunk, MetaError> {
    let name: String = row.try_get("blob_name")?;
    let blob =
        BlobName::parse(&name).ok_or_else(|| MetaError::Corrupt(format!("blob name {name:?}")))?;
    let digest: Vec<u8> = row.try_get("sha256")?;
    let sha256 = digest
        .try_into()
        .map_err(|_| MetaError::Corrupt("sha256 is not 32 bytes".into()))?;
    let size: i64 = row.try_get("size")?;
    Ok(Chunk {
        blob,
        size: size as u64,
        sha256,
    })
}

fn upload_from_row(row: &SqliteRow) -> Result<Upload, MetaError> {
    let state: String = row.try_get("state")?;
    Ok(Upload {
        id: row.try_get("id")?,
        repository: RepoId::new(row.try_get::<String, _>("repository")?),
        scope: Scope::new(row.try_get::<String, _>("scope")?),
        key: row.try_get("key")?,
        version: row.try_get("version")?,
        state: UploadState::parse(&state)
            .ok_or_else(|| MetaError::Corrupt(format!("upload state {state:?}")))?,
        created_at: row.try_get("created_at")?,
    })
}

/// Staged blocks and committed parts of an upload, read inside the writer's transaction.
async fn upload_blocks(
    tx: &mut Transaction<'_, Sqlite>,
    upload: UploadId,
) -> Result<(HashMap<BlockId, Chunk>, Vec<(BlockId, Chunk)>), MetaError> {
    let staged_rows = sqlx::query(
        "SELECT block_id, blob_name, size, sha256 FROM staged_blocks WHERE upload_id = ?",
    )
    .bind(upload)
    .fetch_all(&mut **tx)
    .await?;
    let mut staged = HashMap::with_capacity(staged_rows.len());
    for row in &staged_rows {
        staged.insert(
            BlockId::from_stored(row.try_get("block_id")?),
            chunk_from_row(row)?,
        );
    }
    let part_rows = sqlx::query(
        "SELECT block_id, blob_name, size, sha256 FROM upload_parts WHERE upload_id = ? ORDER BY ordinal",
    )
    .bind(upload)
    .fetch_all(&mut **tx)
    .await?;
    let mut parts = Vec::with_capacity(part_rows.len());
    for row in &part_rows {
        parts.push((
            BlockId::from_stored(row.try_get("block_id")?),
            chunk_from_row(row)?,
        ));
    }
    Ok((staged, parts))
}

/// Drops every block and part of an upload and returns their blobs.
async fn drop_upload_blocks(
    tx: &mut Transaction<'_, Sqlite>,
    upload: UploadId,
) -> Result<Vec<BlobName>, MetaError> {
    let (staged, parts) = upload_blocks(tx, upload).await?;
    sqlx::query("DELETE FROM staged_blocks WHERE upload_id = ?")
        .bind(upload)
        .execute(&mut **tx)
        .await?;
    sqlx::query("DELETE FROM upload_parts WHERE upload_id = ?")
        .bind(upload)
        .execute(&mut **tx)
        .await?;
    let mut names: Vec<BlobName> = staged
        .into_values()
        .chain(parts.into_iter().map(|(_, c)| c))
        .map(|c| c.blob)
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

async fn open_upload_state(
    tx: &mut Transaction<'_, Sqlite>,
    upload: UploadId,
) -> Result<bool, MetaError> {
    let state: Option<String> = sqlx::query_scalar("SELECT state FROM uploads WHERE id = ?")
        .bind(upload)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(state.as_deref() == Some(UploadState::Open.as_str()))
}

#[async_trait]
impl MetaStore for SqliteStore {
    async fn ping(&self) -> Result<(), MetaError> {
        sqlx::query("SELECT 1").execute(&self.readers).await?;
        Ok(())
    }

    async fn reserve(&self, new: NewUpload<'_>) -> Result<Reserved, MetaError> {
        let folded = new.key.folded();
        let mut tx = self.writer.begin().await?;
        let exists: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM entries WHERE repository = ? AND version = ? AND scope = ? AND key_folded = ?",
        )
        .bind(new.repository.as_str())
        .bind(new.version.as_str())
        .bind(new.scope.as_str())
        .bind(&folded)
        .fetch_optional(&mut *tx)
        .await?;
        if exists.is_some() {
            return Ok(Reserved::Conflict);
        }
        let open: Option<(i64, i64)> = sqlx::query_as(
            "SELECT id, created_at FROM uploads
             WHERE repository = ? AND scope = ? AND key_folded = ? AND version = ? AND state = 'open'",
        )
        .bind(new.repository.as_str())
        .bind(new.scope.as_str())
        .bind(&folded)
        .bind(new.version.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let mut garbage = Vec::new();
        if let Some((id, created_at)) = open {
            if created_at >= new.stale_before {
                return Ok(Reserved::Conflict);
            }
            // Abandoned (PROTOCOL.md §9: GitHub releases reservations after 24 h).
            garbage = drop_upload_blocks(&mut tx, id).await?;
            sqlx::query("UPDATE uploads SET state = 'aborted', updated_at = ? WHERE id = ?")
                .bind(new.now)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO uploads (repository, scope, key, key_folded, version, state, created_by, created_at, updated_at)
             VALUES (?, ?, ?, ?, ?, 'open', ?, ?, ?) RETURNING id",
        )
        .bind(new.repository.as_str())
        .bind(new.scope.as_str())
        .bind(new.key.as_str())
        .bind(&folded)
        .bind(new.version.as_str())
        .bind(new.created_by)
        .bind(new.now)
        .bind(new.now)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Reserved::Created {
            upload: id,
            garbage,
        })
    }

    async fn upload(&self, id: UploadId) -> Result<Option<Upload>, MetaError> {
        let row = sqlx::query(
            "SELECT id, repository, scope, key, version, state, created_at FROM uploads WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(&self.readers)
        .await?;
        row.as_ref().map(upload_from_row).transpose()
    }

    async fn stage_block(
        &self,
        upload: UploadId,
        block: &BlockId,
        chunk: &Chunk,
        now: Millis,
    ) -> Result<Staged, MetaError> {
        let mut tx = self.writer.begin().await?;
        if !open_upload_state(&mut tx, upload).await? {
            return Ok(Staged::UploadClosed);
        }
        let previous: Option<String> = sqlx::query_scalar(
            "DELETE FROM staged_blocks WHERE upload_id = ? AND block_id = ? RETURNING blob_name",
        )
        .bind(upload)
        .bind(block.as_bytes())
        .fetch_optional(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO staged_blocks (upload_id, block_id, blob_name, size, sha256) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(upload)
        .bind(block.as_bytes())
        .bind(chunk.blob.as_str())
        .bind(chunk.size as i64)
        .bind(&chunk.sha256[..])
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE uploads SET updated_at = ? WHERE id = ?")
            .bind(now)
            .bind(upload)
            .execute(&mut *tx)
            .await?;
        // A replaced copy may still be a committed part (Azure keeps the committed list).
        let mut garbage = Vec::new();
        if let Some(name) = previous {
            let in_parts: Option<i64> = sqlx::query_scalar(
                "SELECT 1 FROM upload_parts WHERE upload_id = ? AND blob_name = ? LIMIT 1",
            )
            .bind(upload)
            .bind(&name)
            .fetch_optional(&mut *tx)
            .await?;
            if in_parts.is_none() {
                garbage.extend(BlobName::parse(&name));
            }
        }
        tx.commit().await?;
        Ok(Staged::Recorded { garbage })
    }

    async fn commit_block_list(
        &self,
        upload: UploadId,
        list: &[BlockRef],
        now: Millis,
    ) -> Result<Committed, MetaError> {
        let mut tx = self.writer.begin().await?;
        if !open_upload_state(&mut tx, upload).await? {
            return Ok(Committed::UploadClosed);
        }
        let (staged, parts) = upload_blocks(&mut tx, upload).await?;
        let assembly = match assemble(list, &staged, &parts) {
            Ok(assembly) => assembly,
            Err(unknown) => return Ok(Committed::UnknownBlock(unknown)),
        };
        sqlx::query("DELETE FROM staged_blocks WHERE upload_id = ?")
            .bind(upload)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM upload_parts WHERE upload_id = ?")
            .bind(upload)
            .execute(&mut *tx)
            .await?;
        for (ordinal, (block, chunk)) in assembly.parts.iter().enumerate() {
            sqlx::query(
                "INSERT INTO upload_parts (upload_id, ordinal, block_id, blob_name, size, sha256) VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(upload)
            .bind(ordinal as i64)
            .bind(block.as_bytes())
            .bind(chunk.blob.as_str())
            .bind(chunk.size as i64)
            .bind(&chunk.sha256[..])
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("UPDATE uploads SET updated_at = ? WHERE id = ?")
            .bind(now)
            .bind(upload)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Committed::Done {
            garbage: assembly.garbage,
        })
    }

    async fn finalize(&self, req: FinalizeRequest<'_>) -> Result<Finalized, MetaError> {
        let folded = req.key.folded();
        let mut tx = self.writer.begin().await?;
        // The open upload, or else the newest finalized one (a retry after a lost response).
        let found: Option<(i64, String, Option<i64>)> = sqlx::query_as(
            "SELECT id, state, entry_id FROM uploads
             WHERE repository = ? AND scope = ? AND key_folded = ? AND version = ? AND state IN ('open', 'finalized')
             ORDER BY state = 'open' DESC, id DESC LIMIT 1",
        )
        .bind(req.repository.as_str())
        .bind(req.scope.as_str())
        .bind(&folded)
        .bind(req.version.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let Some((upload, state, entry_id)) = found else {
            return Ok(Finalized::NoUpload);
        };
        if state == UploadState::Finalized.as_str() {
            let size: Option<i64> = sqlx::query_scalar("SELECT size FROM entries WHERE id = ?")
                .bind(entry_id)
                .fetch_optional(&mut *tx)
                .await?;
            return Ok(match (entry_id, size) {
                (Some(entry), Some(size)) if size as u64 == req.size => Finalized::Done {
                    entry,
                    garbage: Vec::new(),
                },
                _ => Finalized::NoUpload,
            });
        }
        let (_, parts) = upload_blocks(&mut tx, upload).await?;
        if parts.is_empty() {
            return Ok(Finalized::NothingUploaded);
        }
        let stored: u64 = parts.iter().map(|(_, c)| c.size).sum();
        if stored != req.size {
            let garbage = drop_upload_blocks(&mut tx, upload).await?;
            sqlx::query("UPDATE uploads SET state = 'aborted', updated_at = ? WHERE id = ?")
                .bind(req.now)
                .bind(upload)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            return Ok(Finalized::SizeMismatch { stored, garbage });
        }
        let key: String = sqlx::query_scalar("SELECT key FROM uploads WHERE id = ?")
            .bind(upload)
            .fetch_one(&mut *tx)
            .await?;
        let entry: i64 = sqlx::query_scalar(
            "INSERT INTO entries (repository, scope, key, key_folded, version, size, chunk_count, created_at, last_used_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(req.repository.as_str())
        .bind(req.scope.as_str())
        .bind(&key)
        .bind(&folded)
        .bind(req.version.as_str())
        .bind(stored as i64)
        .bind(parts.len() as i64)
        .bind(req.now)
        .bind(req.now)
        .fetch_one(&mut *tx)
        .await?;
        let mut start = 0u64;
        for (ordinal, (_, chunk)) in parts.iter().enumerate() {
            sqlx::query(
                "INSERT INTO entry_chunks (entry_id, ordinal, start, blob_name, size, sha256) VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(entry)
            .bind(ordinal as i64)
            .bind(start as i64)
            .bind(chunk.blob.as_str())
            .bind(chunk.size as i64)
            .bind(&chunk.sha256[..])
            .execute(&mut *tx)
            .await?;
            start += chunk.size;
        }
        // Blocks staged after the last block list are not part of the entry.
        let leftover: Vec<String> =
            sqlx::query_scalar("DELETE FROM staged_blocks WHERE upload_id = ? RETURNING blob_name")
                .bind(upload)
                .fetch_all(&mut *tx)
                .await?;
        sqlx::query("DELETE FROM upload_parts WHERE upload_id = ?")
            .bind(upload)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE uploads SET state = 'finalized', entry_id = ?, updated_at = ? WHERE id = ?",
        )
        .bind(entry)
        .bind(req.now)
        .bind(upload)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        let in_entry: Vec<&BlobName> = parts.iter().map(|(_, c)| &c.blob).collect();
        let garbage = leftover
            .iter()
            .filter_map(|n| BlobName::parse(n))
            .filter(|n| !in_entry.contains(&n))
            .collect();
        Ok(Finalized::Done { entry, garbage })
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
        // One statement: for each (scope, key), the exact match and the newest prefix match.
        // Prefixes are ranges on the index: every string that starts with `k` sorts in
        // [k, k || U+10FFFF) under SQLite's byte-wise comparison of UTF-8.
        const COLS: &str = "SELECT id, scope, key, key_folded, created_at FROM entries";
        let mut sql = String::new();
        for _ in 0..scopes.len() * folded_keys.len() {
            if !sql.is_empty() {
                sql.push_str(" UNION ALL ");
            }
            sql.push_str("SELECT * FROM (");
            sql.push_str(COLS);
            sql.push_str(
                " WHERE repository = ? AND version = ? AND scope = ? AND key_folded = ? LIMIT 1)",
            );
            sql.push_str(" UNION ALL SELECT * FROM (");
            sql.push_str(COLS);
            sql.push_str(
                " WHERE repository = ? AND version = ? AND scope = ? AND key_folded >= ? AND key_folded < ? \
                 ORDER BY created_at DESC, id DESC LIMIT 1)",
            );
        }
        let mut query = sqlx::query(&sql);
        let uppers: Vec<String> = folded_keys
            .iter()
            .map(|k| format!("{k}\u{10FFFF}"))
            .collect();
        for scope in scopes {
            for (key, upper) in folded_keys.iter().zip(&uppers) {
                query = query
                    .bind(repository.as_str())
                    .bind(version.as_str())
                    .bind(scope.as_str())
                    .bind(key.as_str())
                    .bind(repository.as_str())
                    .bind(version.as_str())
                    .bind(scope.as_str())
                    .bind(key.as_str())
                    .bind(upper.as_str());
            }
        }
        let rows = query.fetch_all(&self.readers).await?;
        rows.iter()
            .map(|row| {
                Ok(Candidate {
                    id: row.try_get("id")?,
                    scope: Scope::new(row.try_get::<String, _>("scope")?),
                    key: row.try_get("key")?,
                    key_folded: row.try_get("key_folded")?,
                    created_at: row.try_get("created_at")?,
                })
            })
            .collect()
    }

    async fn record_hits(&self, hits: &[(EntryId, u64, Millis)]) -> Result<(), MetaError> {
        let mut tx = self.writer.begin().await?;
        for (entry, count, last_used) in hits {
            sqlx::query("UPDATE entries SET last_used_at = MAX(last_used_at, ?), hits = hits + ? WHERE id = ?")
                .bind(last_used)
                .bind(*count as i64)
                .bind(entry)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn entry(&self, id: EntryId) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        let Some(row) = sqlx::query(
            "SELECT id, repository, scope, key, version, size, created_at FROM entries WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(&self.readers)
        .await?
        else {
            return Ok(None);
        };
        let size: i64 = row.try_get("size")?;
        let entry = Entry {
            id: row.try_get("id")?,
            repository: RepoId::new(row.try_get::<String, _>("repository")?),
            scope: Scope::new(row.try_get::<String, _>("scope")?),
            key: row.try_get("key")?,
            version: row.try_get("version")?,
            size: size as u64,
            created_at: row.try_get("created_at")?,
        };
        let rows = sqlx::query(
            "SELECT start, blob_name, size, sha256 FROM entry_chunks WHERE entry_id = ? ORDER BY ordinal",
        )
        .bind(id)
        .fetch_all(&self.readers)
        .await?;
        let chunks = rows
            .iter()
            .map(|row| {
                let start: i64 = row.try_get("start")?;
                Ok(EntryChunk {
                    start: start as u64,
                    chunk: chunk_from_row(row)?,
                })
            })
            .collect::<Result<Vec<_>, MetaError>>()?;
        Ok(Some((entry, chunks)))
    }
}
