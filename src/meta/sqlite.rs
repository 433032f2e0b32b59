//! SQLite metadata store: WAL, one writer connection and a pool of reader connections.
//!
//! Every write method runs as one closure on the writer connection, inside one transaction,
//! behind an async mutex: writers queue in-process instead of meeting `SQLITE_BUSY`, and never
//! block readers (WAL). Reads use pooled read-only connections. Statements run in place on the
//! calling task's thread: commits do not fsync (see `checkpoint`), so a statement takes tens of
//! microseconds, less than the two thread switches of a hop to another thread (docs/benchmarks.md
//! has the measurements). Statements are prepared once per connection (`prepare_cached`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{
    params, Connection, OpenFlags, OptionalExtension, Row, Transaction, TransactionBehavior,
};

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

/// Migrations compiled into the binary, applied in order at start-up; `PRAGMA user_version`
/// records the last one applied.
const MIGRATIONS: &[(i64, &str)] = &[(1, include_str!("migrations/sqlite/0001_init.sql"))];
const MAX_READERS: usize = 8;

#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: Arc<tokio::sync::Mutex<Connection>>,
    readers: Arc<ReaderPool>,
}

#[derive(Debug)]
struct ReaderPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.set_prepared_statement_cache_capacity(64);
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

fn migrate(conn: &mut Connection) -> Result<(), MetaError> {
    let current: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let newest = MIGRATIONS.last().map_or(0, |m| m.0);
    if current > newest {
        return Err(MetaError::Corrupt(format!(
            "the database schema is version {current}, newer than this server's {newest}"
        )));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", version)?;
        tx.commit()?;
    }
    Ok(())
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path` and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<Self, MetaError> {
        let path = path.to_owned();
        let writer_path = path.clone();
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection, MetaError> {
            let mut conn = Connection::open(&writer_path)?;
            configure(&conn)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            // Commits never fsync (NORMAL in WAL mode); checkpoints do, so they run only from
            // `checkpoint`, right after the blob store's syncfs, instead of in the middle of a
            // request where ext4 would make them wait for every dirty chunk.
            conn.pragma_update(None, "wal_autocheckpoint", 0)?;
            migrate(&mut conn)?;
            Ok(conn)
        })
        .await
        .map_err(|e| MetaError::Worker(e.to_string()))??;

        let store = Self {
            writer: Arc::new(tokio::sync::Mutex::new(conn)),
            readers: Arc::new(ReaderPool {
                path,
                idle: Mutex::new(Vec::new()),
            }),
        };
        store.ping().await?;
        Ok(store)
    }

    /// Runs `f` in one immediate transaction on the writer connection.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, MetaError> + Send + 'static,
    ) -> Result<T, MetaError> {
        let mut conn = self.writer.lock().await;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let value = f(&tx)?;
        tx.commit()?;
        Ok(value)
    }

    /// Runs `f` on a pooled read-only connection, on the calling task's thread.
    ///
    /// Reads are short indexed lookups in a database that lives in the page cache (tens of
    /// microseconds), cheaper to run in place than the two thread switches a hop to a
    /// blocking thread costs (`hoard bench` lookups: about 55% of the null baseline's rate with
    /// the hop, 85-90% without).
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, MetaError> + Send + 'static,
    ) -> Result<T, MetaError> {
        let pool = &self.readers;
        let pooled = pool.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => {
                let conn = Connection::open_with_flags(
                    &pool.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                configure(&conn)?;
                conn
            }
        };
        let result = f(&conn);
        let mut idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_READERS {
            idle.push(conn);
        }
        result
    }
}

fn chunk_from_row(row: &Row<'_>, name_col: usize) -> Result<Chunk, MetaError> {
    let name: String = row.get(name_col)?;
    let blob =
        BlobName::parse(&name).ok_or_else(|| MetaError::Corrupt(format!("blob name {name:?}")))?;
    let size: i64 = row.get(name_col + 1)?;
    let digest: Vec<u8> = row.get(name_col + 2)?;
    let sha256 = digest
        .try_into()
        .map_err(|_| MetaError::Corrupt("sha256 is not 32 bytes".into()))?;
    Ok(Chunk {
        blob,
        size: size as u64,
        sha256,
    })
}

/// An upload's staged blocks by id, and its committed parts in order.
type UploadBlocks = (HashMap<BlockId, Chunk>, Vec<(BlockId, Chunk)>);

fn upload_blocks(tx: &Transaction<'_>, upload: UploadId) -> Result<UploadBlocks, MetaError> {
    let mut staged = HashMap::new();
    let mut stmt = tx.prepare_cached(
        "SELECT block_id, blob_name, size, sha256 FROM staged_blocks WHERE upload_id = ?",
    )?;
    let mut rows = stmt.query([upload])?;
    while let Some(row) = rows.next()? {
        staged.insert(BlockId::from_stored(row.get(0)?), chunk_from_row(row, 1)?);
    }
    let mut parts = Vec::new();
    let mut stmt = tx.prepare_cached(
        "SELECT block_id, blob_name, size, sha256 FROM upload_parts WHERE upload_id = ? ORDER BY ordinal",
    )?;
    let mut rows = stmt.query([upload])?;
    while let Some(row) = rows.next()? {
        parts.push((BlockId::from_stored(row.get(0)?), chunk_from_row(row, 1)?));
    }
    Ok((staged, parts))
}

/// Drops every block and part of an upload and returns their blobs.
fn drop_upload_blocks(tx: &Transaction<'_>, upload: UploadId) -> Result<Vec<BlobName>, MetaError> {
    let (staged, parts) = upload_blocks(tx, upload)?;
    tx.prepare_cached("DELETE FROM staged_blocks WHERE upload_id = ?")?
        .execute([upload])?;
    tx.prepare_cached("DELETE FROM upload_parts WHERE upload_id = ?")?
        .execute([upload])?;
    let mut names: Vec<BlobName> = staged
        .into_values()
        .chain(parts.into_iter().map(|(_, c)| c))
        .map(|c| c.blob)
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

fn is_open(tx: &Transaction<'_>, upload: UploadId) -> Result<bool, MetaError> {
    let state: Option<String> = tx
        .prepare_cached("SELECT state FROM uploads WHERE id = ?")?
        .query_row([upload], |r| r.get(0))
        .optional()?;
    Ok(state.as_deref() == Some(UploadState::Open.as_str()))
}

fn touch(tx: &Transaction<'_>, upload: UploadId, now: Millis) -> Result<(), MetaError> {
    tx.prepare_cached("UPDATE uploads SET updated_at = ? WHERE id = ?")?
        .execute(params![now, upload])?;
    Ok(())
}

fn set_state(
    tx: &Transaction<'_>,
    upload: UploadId,
    state: UploadState,
    now: Millis,
) -> Result<(), MetaError> {
    tx.prepare_cached("UPDATE uploads SET state = ?, updated_at = ? WHERE id = ?")?
        .execute(params![state.as_str(), now, upload])?;
    Ok(())
}

fn insert_parts(
    tx: &Transaction<'_>,
    upload: UploadId,
    parts: &[(BlockId, Chunk)],
) -> Result<(), MetaError> {
    tx.prepare_cached("DELETE FROM upload_parts WHERE upload_id = ?")?
        .execute([upload])?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO upload_parts (upload_id, ordinal, block_id, blob_name, size, sha256) VALUES (?, ?, ?, ?, ?, ?)",
    )?;
    for (ordinal, (block, chunk)) in parts.iter().enumerate() {
        insert.execute(params![
            upload,
            ordinal as i64,
            block.as_bytes(),
            chunk.blob.as_str(),
            chunk.size as i64,
            &chunk.sha256[..]
        ])?;
    }
    Ok(())
}

#[async_trait]
impl MetaStore for SqliteStore {
    async fn ping(&self) -> Result<(), MetaError> {
        self.read(|conn| Ok(conn.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }

    async fn reserve(&self, new: NewUpload<'_>) -> Result<Reserved, MetaError> {
        let (repo, scope, key, folded, version, by) = (
            new.repository.as_str().to_owned(),
            new.scope.as_str().to_owned(),
            new.key.as_str().to_owned(),
            new.key.folded(),
            new.version.as_str().to_owned(),
            new.created_by.to_owned(),
        );
        let (now, stale_before, max_open) = (new.now, new.stale_before, new.max_open);
        self.write(move |tx| {
            let exists: Option<i64> = tx
                .prepare_cached("SELECT id FROM entries WHERE repository = ? AND version = ? AND scope = ? AND key_folded = ?")?
                .query_row(params![repo, version, scope, folded], |r| r.get(0))
                .optional()?;
            if exists.is_some() {
                return Ok(Reserved::Conflict);
            }
            let open: Option<(i64, i64)> = tx
                .prepare_cached(
                    "SELECT id, created_at FROM uploads
                     WHERE repository = ? AND scope = ? AND key_folded = ? AND version = ? AND state = 'open'",
                )?
                .query_row(params![repo, scope, folded, version], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let open_count: i64 = tx
                .prepare_cached(
                    "SELECT COUNT(*) FROM uploads WHERE repository = ? AND state = 'open' AND created_at >= ?",
                )?
                .query_row(params![repo, stale_before], |r| r.get(0))?;
            if open.is_some_and(|(_, created)| created >= stale_before) {
                return Ok(Reserved::Conflict);
            }
            if open_count >= i64::from(max_open) {
                return Ok(Reserved::TooManyOpen);
            }
            let mut garbage = Vec::new();
            if let Some((id, _)) = open {
                // Abandoned (PROTOCOL.md §9: GitHub releases reservations after 24 h).
                garbage = drop_upload_blocks(tx, id)?;
                set_state(tx, id, UploadState::Aborted, now)?;
            }
            let upload: i64 = tx
                .prepare_cached(
                    "INSERT INTO uploads (repository, scope, key, key_folded, version, state, created_by, created_at, updated_at)
                     VALUES (?, ?, ?, ?, ?, 'open', ?, ?, ?) RETURNING id",
                )?
                .query_row(params![repo, scope, key, folded, version, by, now, now], |r| r.get(0))?;
            Ok(Reserved::Created { upload, garbage })
        })
        .await
    }

    async fn checkpoint(&self) -> Result<(), MetaError> {
        let path = self.readers.path.clone();
        tokio::task::spawn_blocking(move || -> Result<(), MetaError> {
            let conn = Connection::open(&path)?;
            configure(&conn)?;
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
            Ok(())
        })
        .await
        .map_err(|e| MetaError::Worker(e.to_string()))?
    }

    async fn upload(&self, id: UploadId) -> Result<Option<Upload>, MetaError> {
        self.read(move |conn| {
            let row = conn
                .prepare_cached("SELECT id, repository, scope, key, version, state, created_at FROM uploads WHERE id = ?")?
                .query_row([id], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, String>(5)?,
                        r.get::<_, i64>(6)?,
                    ))
                })
                .optional()?;
            row.map(|(id, repository, scope, key, version, state, created_at)| {
                Ok(Upload {
                    id,
                    repository: RepoId::new(repository),
                    scope: Scope::new(scope),
                    key,
                    version,
                    state: UploadState::parse(&state).ok_or_else(|| MetaError::Corrupt(format!("upload state {state:?}")))?,
                    created_at,
                })
            })
            .transpose()
        })
        .await
    }

    async fn stage_block(
        &self,
        upload: UploadId,
        block: &BlockId,
        chunk: &Chunk,
        max_staged: u64,
        now: Millis,
    ) -> Result<Staged, MetaError> {
        let (block, chunk) = (block.clone(), chunk.clone());
        self.write(move |tx| {
            if !is_open(tx, upload)? {
                return Ok(Staged::UploadClosed);
            }
            let others: i64 = tx
                .prepare_cached("SELECT COALESCE(SUM(size), 0) FROM staged_blocks WHERE upload_id = ? AND block_id != ?")?
                .query_row(params![upload, block.as_bytes()], |r| r.get(0))?;
            if others as u64 + chunk.size > max_staged {
                return Ok(Staged::TooLarge);
            }
            let previous: Option<String> = tx
                .prepare_cached("DELETE FROM staged_blocks WHERE upload_id = ? AND block_id = ? RETURNING blob_name")?
                .query_row(params![upload, block.as_bytes()], |r| r.get(0))
                .optional()?;
            tx.prepare_cached("INSERT INTO staged_blocks (upload_id, block_id, blob_name, size, sha256) VALUES (?, ?, ?, ?, ?)")?
                .execute(params![upload, block.as_bytes(), chunk.blob.as_str(), chunk.size as i64, &chunk.sha256[..]])?;
            touch(tx, upload, now)?;
            // A replaced copy may still be a committed part (Azure keeps the committed list).
            let mut garbage = Vec::new();
            if let Some(name) = previous {
                let in_parts = tx
                    .prepare_cached("SELECT 1 FROM upload_parts WHERE upload_id = ? AND blob_name = ? LIMIT 1")?
                    .exists(params![upload, name])?;
                if !in_parts {
                    garbage.extend(BlobName::parse(&name));
                }
            }
            Ok(Staged::Recorded { garbage })
        })
        .await
    }

    async fn commit_whole(
        &self,
        upload: UploadId,
        chunk: &Chunk,
        now: Millis,
    ) -> Result<Committed, MetaError> {
        let chunk = chunk.clone();
        self.write(move |tx| {
            if !is_open(tx, upload)? {
                return Ok(Committed::UploadClosed);
            }
            let mut garbage = drop_upload_blocks(tx, upload)?;
            garbage.retain(|b| b != &chunk.blob);
            insert_parts(tx, upload, &[(BlockId::whole_blob(), chunk)])?;
            touch(tx, upload, now)?;
            Ok(Committed::Done { garbage })
        })
        .await
    }

    async fn commit_block_list(
        &self,
        upload: UploadId,
        list: &[BlockRef],
        now: Millis,
    ) -> Result<Committed, MetaError> {
        let list = list.to_vec();
        self.write(move |tx| {
            if !is_open(tx, upload)? {
                return Ok(Committed::UploadClosed);
            }
            let (staged, parts) = upload_blocks(tx, upload)?;
            let assembly = match assemble(&list, &staged, &parts) {
                Ok(assembly) => assembly,
                Err(unknown) => return Ok(Committed::UnknownBlock(unknown)),
            };
            tx.prepare_cached("DELETE FROM staged_blocks WHERE upload_id = ?")?
                .execute([upload])?;
            insert_parts(tx, upload, &assembly.parts)?;
            touch(tx, upload, now)?;
            Ok(Committed::Done {
                garbage: assembly.garbage,
            })
        })
        .await
    }

    async fn finalize(&self, req: FinalizeRequest<'_>) -> Result<Finalized, MetaError> {
        let (repo, scope, folded, version) = (
            req.repository.as_str().to_owned(),
            req.scope.as_str().to_owned(),
            req.key.folded(),
            req.version.as_str().to_owned(),
        );
        let (size, now) = (req.size, req.now);
        self.write(move |tx| {
            // The open upload, or else the newest finalized one (a retry after a lost response).
            let found: Option<(i64, String, String, Option<i64>)> = tx
                .prepare_cached(
                    "SELECT id, key, state, entry_id FROM uploads
                     WHERE repository = ? AND scope = ? AND key_folded = ? AND version = ? AND state IN ('open', 'finalized')
                     ORDER BY state = 'open' DESC, id DESC LIMIT 1",
                )?
                .query_row(params![repo, scope, folded, version], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .optional()?;
            let Some((upload, key, state, entry_id)) = found else {
                return Ok(Finalized::NoUpload);
            };
            if state == UploadState::Finalized.as_str() {
                let stored: Option<i64> = tx
                    .prepare_cached("SELECT size FROM entries WHERE id = ?")?
                    .query_row([entry_id], |r| r.get(0))
                    .optional()?;
                return Ok(match (entry_id, stored) {
                    (Some(entry), Some(stored)) if stored as u64 == size => Finalized::Done { entry, garbage: Vec::new() },
                    _ => Finalized::NoUpload,
                });
            }
            let (staged, parts) = upload_blocks(tx, upload)?;
            if parts.is_empty() {
                return Ok(Finalized::NothingUploaded);
            }
            let stored: u64 = parts.iter().map(|(_, c)| c.size).sum();
            if stored != size {
                let garbage = drop_upload_blocks(tx, upload)?;
                set_state(tx, upload, UploadState::Aborted, now)?;
                return Ok(Finalized::SizeMismatch { stored, garbage });
            }
            let entry: i64 = tx
                .prepare_cached(
                    "INSERT INTO entries (repository, scope, key, key_folded, version, size, chunk_count, created_at, last_used_at)
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                )?
                .query_row(params![repo, scope, key, folded, version, stored as i64, parts.len() as i64, now, now], |r| r.get(0))?;
            let mut insert = tx.prepare_cached(
                "INSERT INTO entry_chunks (entry_id, ordinal, start, blob_name, size, sha256) VALUES (?, ?, ?, ?, ?, ?)",
            )?;
            let mut start = 0u64;
            for (ordinal, (_, chunk)) in parts.iter().enumerate() {
                insert.execute(params![entry, ordinal as i64, start as i64, chunk.blob.as_str(), chunk.size as i64, &chunk.sha256[..]])?;
                start += chunk.size;
            }
            tx.prepare_cached("DELETE FROM staged_blocks WHERE upload_id = ?")?.execute([upload])?;
            tx.prepare_cached("DELETE FROM upload_parts WHERE upload_id = ?")?.execute([upload])?;
            tx.prepare_cached("UPDATE uploads SET state = 'finalized', entry_id = ?, updated_at = ? WHERE id = ?")?
                .execute(params![entry, now, upload])?;
            // Blocks staged after the last block list are not part of the entry.
            let in_entry: Vec<&BlobName> = parts.iter().map(|(_, c)| &c.blob).collect();
            let garbage = staged.into_values().map(|c| c.blob).filter(|b| !in_entry.contains(&b)).collect();
            Ok(Finalized::Done { entry, garbage })
        })
        .await
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
        let pairs = scopes.len() * folded_keys.len();
        let mut sql = String::with_capacity(pairs * 400);
        for i in 0..pairs {
            if i > 0 {
                sql.push_str(" UNION ALL ");
            }
            sql.push_str("SELECT * FROM (");
            sql.push_str(COLS);
            sql.push_str(" WHERE repository = ?1 AND version = ?2 AND scope = ? AND key_folded = ? LIMIT 1) UNION ALL SELECT * FROM (");
            sql.push_str(COLS);
            sql.push_str(
                " WHERE repository = ?1 AND version = ?2 AND scope = ? AND key_folded >= ? AND key_folded < ? \
                 ORDER BY created_at DESC, id DESC LIMIT 1)",
            );
        }
        let mut values: Vec<String> =
            vec![repository.as_str().to_owned(), version.as_str().to_owned()];
        for scope in scopes {
            for key in folded_keys {
                values.push(scope.as_str().to_owned());
                values.push(key.clone());
                values.push(scope.as_str().to_owned());
                values.push(key.clone());
                values.push(format!("{key}\u{10FFFF}"));
            }
        }
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&sql)?;
            let mut rows = stmt.query(rusqlite::params_from_iter(values.iter()))?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                out.push(Candidate {
                    id: row.get(0)?,
                    scope: Scope::new(row.get::<_, String>(1)?),
                    key: row.get(2)?,
                    key_folded: row.get(3)?,
                    created_at: row.get(4)?,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn record_hits(&self, hits: &[(EntryId, u64, Millis)]) -> Result<(), MetaError> {
        let hits = hits.to_vec();
        self.write(move |tx| {
            let mut update =
                tx.prepare_cached("UPDATE entries SET last_used_at = MAX(last_used_at, ?), hits = hits + ? WHERE id = ?")?;
            for (entry, count, last_used) in hits {
                update.execute(params![last_used, count as i64, entry])?;
            }
            Ok(())
        })
        .await
    }

    async fn forget_after(&self, since: Millis) -> Result<(usize, Vec<BlobName>), MetaError> {
        self.write(move |tx| {
            let mut garbage = Vec::new();
            let mut names = tx.prepare_cached(
                "SELECT blob_name FROM entry_chunks WHERE entry_id IN (SELECT id FROM entries WHERE created_at > ?)",
            )?;
            let mut rows = names.query([since])?;
            while let Some(row) = rows.next()? {
                garbage.extend(BlobName::parse(&row.get::<_, String>(0)?));
            }
            tx.prepare_cached("DELETE FROM entry_chunks WHERE entry_id IN (SELECT id FROM entries WHERE created_at > ?)")?
                .execute([since])?;
            let forgotten = tx.prepare_cached("DELETE FROM entries WHERE created_at > ?")?.execute([since])?;
            let open: Vec<i64> = tx
                .prepare_cached("SELECT id FROM uploads WHERE state = 'open'")?
                .query_map([], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            for upload in open {
                garbage.extend(drop_upload_blocks(tx, upload)?);
                set_state(tx, upload, UploadState::Aborted, crate::cache::model::now_millis())?;
            }
            Ok((forgotten, garbage))
        })
        .await
    }

    async fn entry(&self, id: EntryId) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        self.read(move |conn| {
            let head = conn
                .prepare_cached("SELECT repository, scope, key, version, size, created_at FROM entries WHERE id = ?")?
                .query_row([id], |r| {
                    Ok(Entry {
                        id,
                        repository: RepoId::new(r.get::<_, String>(0)?),
                        scope: Scope::new(r.get::<_, String>(1)?),
                        key: r.get(2)?,
                        version: r.get(3)?,
                        size: r.get::<_, i64>(4)? as u64,
                        created_at: r.get(5)?,
                    })
                })
                .optional()?;
            let Some(entry) = head else { return Ok(None) };
            let mut stmt = conn.prepare_cached(
                "SELECT start, blob_name, size, sha256 FROM entry_chunks WHERE entry_id = ? ORDER BY ordinal",
            )?;
            let mut rows = stmt.query([id])?;
            let mut chunks = Vec::new();
            while let Some(row) = rows.next()? {
                chunks.push(EntryChunk { start: row.get::<_, i64>(0)? as u64, chunk: chunk_from_row(row, 1)? });
            }
            Ok(Some((entry, chunks)))
        })
        .await
    }
}
