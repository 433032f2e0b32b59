//! SQLite metadata store: WAL, one writer connection and a pool of reader connections.
//!
//! Every write method runs as one closure on the writer connection, inside one transaction
//! (shared with the writes that queued meanwhile, each in its own savepoint: `group_commit.rs`),
//! behind an async mutex: writers queue in-process instead of meeting `SQLITE_BUSY`, and never
//! block readers (WAL). Reads use pooled read-only connections. Statements run in place on the
//! calling task's thread: commits do not fsync (see `checkpoint`), so a statement takes tens of
//! microseconds, less than the two thread switches of a hop to another thread
//! (docs/benchmarks-history.md has the measurements). Statements are prepared once per
//! connection (`prepare_cached`).
//!
//! A change to an upload first claims it (`claim`): it bumps the revision where the upload is
//! still open at the one the domain loaded, and otherwise refuses the whole change as stale.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{
    params, Connection, ErrorCode, OpenFlags, OptionalExtension, Row, TransactionBehavior,
};

mod group_commit;
#[cfg(test)]
mod plan_tests;
#[cfg(test)]
pub(crate) use plan_tests::vm_steps as count_vm_steps;
mod stats;
mod wal;

use crate::meta::dialect::Backend;
use crate::meta::quarantine;
use crate::meta::row::{stored_count, Row as _};
use crate::meta::schema::{
    entries, entry_chunks, pending_deletions, staged_blocks, upload_parts, uploads, EntryChunkRow,
    EntryRow, StagedBlockRow, UploadPartRow, UploadRow,
};
use crate::meta::sql::{
    block_state_from_row, candidate_from_row, chunk_from_row, columns, count_entries_sql,
    entry_chunk_from_row, entry_from_row, listed_from_row, migrations_after, pr_counts,
    quota_usage_from_row, record_restores_sql, repositories_sql, repository_from_row,
    restore_from_row, restores_sql, select_entries_sql, totals_from_row, upload_from_row,
    usage_sql, use_from_row, Param, SqlRow, BLOCK_STATE_SQL, CANDIDATE, CHUNK, ENTRY, TOTALS,
    UPLOAD, USE_COLS,
};
use crate::meta::sql::{
    drop_restores_sql, each_repository_keeps, walk_entries_sql, DUE_DELETIONS,
    FORGET_SHARED_DELETIONS, RESTORE_HEAVY_REPOSITORIES,
};
use crate::meta::webhook_sql;
use crate::meta::{
    AdminStore, BlockState, EntryChunk, EntryMove, EntryPage, EntrySelection, EntryState,
    EntryWalk, Health, LifecycleStore, MetaError, NewEntry, NewUpload, Repositories, RestoreDrop,
    RestoreQuery, RestoreStore, SaveStore, SlotRead, SlotState, SweptUploads, UploadChange,
    UploadRead, UploadSweep, UploadView, UsageOf, Uses,
};
use crate::meta::{Delivered, Delivery, WebhookStore};
use crate::model::{
    BlobName, BlockId, Candidate, Chunk, Entry, EntryId, EntryUse, Millis, QuotaUsage,
    RemovalCause, RepoId, RestoreRecord, Scope, ScopeClass, Slot, Upload, UploadBlocks, UploadId,
    UploadState, Version,
};
use group_commit::GroupCommit;
use wal::{checkpoint_now, WalBound, WAL_SOFT_LIMIT};

/// Migrations compiled into the binary, applied in order at start-up; `PRAGMA user_version`
/// records the last one applied.
const MIGRATIONS: &[(i64, &str)] = crate::meta::migrations::SQLITE;
const MAX_READERS: usize = 8;

#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: Arc<GroupCommit>,
    readers: Arc<ReaderPool>,
    wal: Arc<WalBound>,
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
    #[cfg(test)]
    conn.trace_v2(
        rusqlite::trace::TraceEventCodes::SQLITE_TRACE_STMT
            | rusqlite::trace::TraceEventCodes::SQLITE_TRACE_PROFILE,
        Some(plan_tests::record_statement),
    );
    Ok(())
}

/// Applies the migrations this database still needs, each in its own transaction. Foreign keys
/// are off meanwhile (a migration that makes a table anew drops the one rows refer to; SQLite
/// ignores the setting inside a transaction) and each migration must leave every reference
/// whole before it commits.
fn migrate(conn: &mut Connection) -> Result<(), MetaError> {
    let current: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    let migrated = (|| {
        for (version, sql) in migrations_after(MIGRATIONS, current)? {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute_batch(sql)?;
            let broken = tx
                .prepare("PRAGMA foreign_key_check")?
                .query([])?
                .next()?
                .is_some();
            if broken {
                return Err(MetaError::Corrupt(format!(
                    "migration {version} would leave rows referring to missing ones"
                )));
            }
            tx.pragma_update(None, "user_version", version)?;
            tx.commit()?;
        }
        Ok(())
    })();
    conn.pragma_update(None, "foreign_keys", "ON")?;
    migrated
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path` and brings its schema up to date.
    /// The file's directory is created if missing.
    pub async fn open(path: &Path) -> Result<Self, MetaError> {
        let path = path.to_owned();
        let writer_path = path.clone();
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection, MetaError> {
            if let Some(dir) = writer_path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    MetaError::Unavailable(format!("cannot create {}: {e}", dir.display()))
                })?;
            }
            let mut conn = Connection::open(&writer_path)?;
            configure(&conn)?;
            // Before the switch to WAL, which a new database then makes with fewer fsyncs.
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            // Commits never fsync (NORMAL in WAL mode); checkpoints do, so they run only from
            // `checkpoint`, right after the blob store's syncfs, instead of in the middle of a
            // request where ext4 would make them wait for every dirty chunk.
            conn.pragma_update(None, "wal_autocheckpoint", 0)?;
            conn.pragma_update(None, "journal_size_limit", WAL_SOFT_LIMIT as i64)?;
            // A batch's savepoints keep the pages they change in a sub-journal: in memory (a few
            // pages per change, freed at its release), not in a temporary file written page by
            // page.
            conn.pragma_update(None, "temp_store", "MEMORY")?;
            let version_found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
            migrate(&mut conn)?;
            // A log left large by a crash or a long reader is emptied now, not carried on. A
            // database created just now (no schema version yet) has only its tables in the
            // log: the first sync checkpoints them, and start-up saves the fsyncs.
            if version_found != 0 {
                checkpoint_now(&conn, Duration::from_secs(1))?;
            }
            Ok(conn)
        })
        .await
        .map_err(|e| MetaError::Internal(e.to_string()))??;

        let mut wal_path = path.clone().into_os_string();
        wal_path.push("-wal");
        let store = Self {
            writer: Arc::new(GroupCommit::new(conn)),
            readers: Arc::new(ReaderPool {
                path,
                idle: Mutex::new(Vec::new()),
            }),
            wal: Arc::new(WalBound {
                path: wal_path.into(),
                writes: Default::default(),
                large: Default::default(),
                wanted: tokio::sync::Notify::new(),
            }),
        };
        store.ping().await?;
        Ok(store)
    }

    /// Stores entries as finalizes would leave them, many per transaction: a bulk load for
    /// benchmarks and tests that need a large database (`hoard bench --preload`). The chunks are
    /// recorded, not written: downloading these entries fails.
    pub async fn import(&self, entries: Vec<(Slot, Vec<Chunk>, Millis)>) -> Result<(), MetaError> {
        self.write(move |tx| {
            let mut usage = tx.prepare_cached(
                "INSERT INTO repository_usage (repository, bytes, entries, pr_bytes, pr_entries) VALUES (?, ?, 1, ?, ?)
                 ON CONFLICT (repository) DO UPDATE SET bytes = bytes + excluded.bytes, entries = entries + 1,
                     pr_bytes = pr_bytes + excluded.pr_bytes, pr_entries = pr_entries + excluded.pr_entries",
            )?;
            for (slot, chunks, at) in entries {
                let row = EntryRow::imported(&slot, &chunks, at, Backend::Sqlite);
                let (repository, size) = (row.repository.clone(), row.size);
                let class = ScopeClass::of(&slot.scope);
                let id = insert_entry(tx, row)?;
                insert_chunks(tx, id, &chunks)?;
                let (pr_bytes, pr_entries) = pr_counts(class, size as u64);
                usage.execute(params![repository, size, pr_bytes, pr_entries])?;
            }
            Ok(())
        })
        .await
    }

    /// Runs `f` in a write transaction on the writer connection, together with the changes
    /// that queued meanwhile, each in its own savepoint (group commit: `group_commit.rs`).
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, MetaError> + Send + 'static,
    ) -> Result<T, MetaError> {
        self.writer
            .write(f, |conn| self.wal.wait_for_room(conn))
            .await
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

    /// Like [`Self::read`], with every statement of `f` in one read transaction: one snapshot.
    async fn read_consistent<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, MetaError> + Send + 'static,
    ) -> Result<T, MetaError> {
        self.read(move |conn| {
            conn.prepare_cached("BEGIN")?.execute([])?;
            let result = f(conn);
            conn.prepare_cached("COMMIT")?.execute([])?;
            result
        })
        .await
    }
}

impl From<rusqlite::Error> for MetaError {
    fn from(e: rusqlite::Error) -> Self {
        const UNIQUE: i32 = 2067; // SQLITE_CONSTRAINT_UNIQUE
        if let rusqlite::Error::SqliteFailure(inner, _) = &e {
            if inner.extended_code == UNIQUE {
                return MetaError::Conflict;
            }
        }
        match e.sqlite_error_code() {
            Some(
                ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::CannotOpen
                | ErrorCode::DiskFull
                | ErrorCode::ReadOnly,
            ) => MetaError::Unavailable(crate::meta::bounded(e.to_string())),
            _ => MetaError::Internal(crate::meta::bounded(e.to_string())),
        }
    }
}

impl SqlRow for Row<'_> {
    fn opt_int(&self, name: &str) -> Result<Option<i64>, MetaError> {
        Ok(self.get(name)?)
    }

    fn opt_text(&self, name: &str) -> Result<Option<String>, MetaError> {
        Ok(self.get(name)?)
    }

    fn opt_bytes(&self, name: &str) -> Result<Option<Vec<u8>>, MetaError> {
        Ok(self.get(name)?)
    }
}

/// The result column names of a statement whose columns never change, taken from SQLite the
/// first time it runs. Its rows are then read by name at about the cost of a position:
/// rusqlite's own lookup asks SQLite for the name of every column before the one read, on every
/// read, which made a small save cost 5% more than reading by position did.
struct ResultNames(OnceLock<Box<[Box<str>]>>);

impl ResultNames {
    const fn new() -> Self {
        Self(OnceLock::new())
    }

    fn of(&'static self, statement: &rusqlite::Statement<'_>) -> &'static [Box<str>] {
        let names = self.0.get_or_init(|| {
            let names = statement.column_names();
            names.into_iter().map(Box::from).collect()
        });
        debug_assert_eq!(names.len(), statement.column_count());
        names
    }
}

/// A fixed SELECT and its [`ResultNames`].
struct Select {
    sql: LazyLock<String>,
    names: ResultNames,
}

impl Select {
    const fn new(build: fn() -> String) -> Self {
        Self {
            sql: LazyLock::new(build),
            names: ResultNames::new(),
        }
    }

    /// Every row the statement answers to `params`, each read by `read`.
    fn rows<T>(
        &'static self,
        conn: &Connection,
        params: impl rusqlite::Params,
        read: impl Fn(&Named<'_, '_>) -> Result<T, MetaError>,
    ) -> Result<Vec<T>, MetaError> {
        let mut statement = conn.prepare_cached(&self.sql)?;
        named_rows(&mut statement, &self.names, params, read)
    }

    /// The first row the statement answers to `params`, if any, read by `read`.
    fn first<T>(
        &'static self,
        conn: &Connection,
        params: impl rusqlite::Params,
        read: impl Fn(&Named<'_, '_>) -> Result<T, MetaError>,
    ) -> Result<Option<T>, MetaError> {
        let mut statement = conn.prepare_cached(&self.sql)?;
        named_first(&mut statement, &self.names, params, read)
    }
}

/// The first row `statement` answers to `params`, if any, read by `read`; `names` are the
/// statement's.
fn named_first<T>(
    statement: &mut rusqlite::Statement<'_>,
    names: &'static ResultNames,
    params: impl rusqlite::Params,
    read: impl Fn(&Named<'_, '_>) -> Result<T, MetaError>,
) -> Result<Option<T>, MetaError> {
    let names = names.of(statement);
    let mut rows = statement.query(params)?;
    rows.next()?
        .map(|row| read(&Named::new(row, names)))
        .transpose()
}

/// Every row `statement` answers to `params`, each read by `read`; `names` are the statement's.
fn named_rows<T>(
    statement: &mut rusqlite::Statement<'_>,
    names: &'static ResultNames,
    params: impl rusqlite::Params,
    read: impl Fn(&Named<'_, '_>) -> Result<T, MetaError>,
) -> Result<Vec<T>, MetaError> {
    let names = names.of(statement);
    let mut rows = statement.query(params)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(read(&Named::new(row, names))?);
    }
    Ok(out)
}

/// A row of a statement whose [`ResultNames`] are known. Decoders mostly read columns in the
/// order their statement selects them, so a lookup first tries the column after the one read
/// last.
struct Named<'r, 's> {
    row: &'r Row<'s>,
    names: &'static [Box<str>],
    next: Cell<usize>,
}

impl<'r, 's> Named<'r, 's> {
    fn new(row: &'r Row<'s>, names: &'static [Box<str>]) -> Self {
        Self {
            row,
            names,
            next: Cell::new(0),
        }
    }

    fn index(&self, name: &str) -> Result<usize, MetaError> {
        let start = self.next.get().min(self.names.len());
        let after = self.names[start..]
            .iter()
            .position(|n| n.eq_ignore_ascii_case(name));
        let found = after.map(|i| start + i).or_else(|| {
            self.names[..start]
                .iter()
                .position(|n| n.eq_ignore_ascii_case(name))
        });
        let i = found.ok_or_else(|| crate::meta::row::not_selected(name))?;
        self.next.set(i + 1);
        Ok(i)
    }
}

impl SqlRow for Named<'_, '_> {
    fn opt_int(&self, name: &str) -> Result<Option<i64>, MetaError> {
        Ok(self.row.get(self.index(name)?)?)
    }

    fn opt_text(&self, name: &str) -> Result<Option<String>, MetaError> {
        Ok(self.row.get(self.index(name)?)?)
    }

    fn opt_bytes(&self, name: &str) -> Result<Option<Vec<u8>>, MetaError> {
        Ok(self.row.get(self.index(name)?)?)
    }
}

/// Every row of `rows`, each read by `read`.
fn rows_of<T>(
    mut rows: rusqlite::Rows<'_>,
    read: impl Fn(&Row<'_>) -> Result<T, MetaError>,
) -> Result<Vec<T>, MetaError> {
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(read(row)?);
    }
    Ok(out)
}

/// The first row of `rows`, if any, read by `read`.
fn first_of<T>(
    mut rows: rusqlite::Rows<'_>,
    read: impl Fn(&Row<'_>) -> Result<T, MetaError>,
) -> Result<Option<T>, MetaError> {
    rows.next()?.map(read).transpose()
}

/// An upload by id.
static UPLOAD_BY_ID: Select = Select::new(|| {
    format!(
        "SELECT {} FROM uploads u WHERE id = ?",
        columns("u", UPLOAD)
    )
});

/// The open upload of a slot (repository, scope, folded key, version).
static OPEN_UPLOAD_OF_SLOT: Select = Select::new(|| {
    format!(
        "SELECT {} FROM uploads u
         WHERE repository = ? AND scope = ? AND key_folded = ? AND version = ? AND state = 'open'",
        columns("u", UPLOAD)
    )
});

/// An INSERT of a declared row that returns the new row's id.
fn returning_id(table: &crate::meta::row::Table) -> String {
    format!("{} RETURNING id", table.insert(Backend::Sqlite))
}

fn insert_entry(tx: &Connection, row: EntryRow) -> Result<i64, MetaError> {
    static INSERT: LazyLock<String> = LazyLock::new(|| returning_id(&entries::TABLE));
    let values = row.inserted_values(Backend::Sqlite);
    Ok(tx
        .prepare_cached(&INSERT)?
        .query_row(rusqlite::params_from_iter(values), |r| r.get("id"))?)
}

fn insert_chunks(tx: &Connection, entry: i64, chunks: &[Chunk]) -> Result<(), MetaError> {
    let mut insert = tx.prepare_cached(entry_chunks::TABLE.insert(Backend::Sqlite))?;
    for row in EntryChunkRow::of_entry(entry, chunks) {
        insert.execute(rusqlite::params_from_iter(
            row.inserted_values(Backend::Sqlite),
        ))?;
    }
    Ok(())
}

fn load_upload(conn: &Connection, id: UploadId) -> Result<Option<Upload>, MetaError> {
    UPLOAD_BY_ID.first(conn, [id.get()], |r| upload_from_row(r))
}

fn load_blocks(conn: &Connection, upload: UploadId) -> Result<UploadBlocks, MetaError> {
    static STAGED: Select = Select::new(|| {
        format!(
            "SELECT block_id, {} FROM staged_blocks WHERE upload_id = ?",
            CHUNK.join(", ")
        )
    });
    static PARTS: Select = Select::new(|| {
        format!(
            "SELECT block_id, {} FROM upload_parts WHERE upload_id = ? ORDER BY ordinal",
            CHUNK.join(", ")
        )
    });
    let mut blocks = UploadBlocks::default();
    let staged = STAGED.rows(conn, [upload.get()], |row| {
        let id = BlockId::from_stored(row.read(staged_blocks::block_id)?);
        Ok((id, chunk_from_row(row)?))
    })?;
    blocks.staged.extend(staged);
    blocks.parts = PARTS.rows(conn, [upload.get()], |row| {
        let id = BlockId::from_stored(row.read(upload_parts::block_id)?);
        Ok((id, chunk_from_row(row)?))
    })?;
    Ok(blocks)
}

/// Claims the upload for a change: bumps its revision if it is still open at the loaded one.
fn claim(tx: &Connection, upload: &Upload, now: Millis) -> Result<(), MetaError> {
    let changed = tx
        .prepare_cached(
            "UPDATE uploads SET revision = revision + 1, updated_at = ?
             WHERE id = ? AND revision = ? AND state = 'open'",
        )?
        .execute(params![now, upload.id.get(), upload.revision])?;
    if changed == 0 {
        return Err(MetaError::Stale);
    }
    Ok(())
}

fn drop_blocks(tx: &Connection, upload: UploadId) -> Result<(), MetaError> {
    tx.prepare_cached("DELETE FROM staged_blocks WHERE upload_id = ?")?
        .execute([upload.get()])?;
    // Only a row with blocks staged is written: a Put Blob save has none, and a finalize
    // after Put Block List finds them reset by it.
    tx.prepare_cached(
        "UPDATE uploads SET staged_count = 0, staged_bytes = 0
         WHERE id = ? AND (staged_count <> 0 OR staged_bytes <> 0)",
    )?
    .execute([upload.get()])?;
    tx.prepare_cached("DELETE FROM upload_parts WHERE upload_id = ?")?
        .execute([upload.get()])?;
    Ok(())
}

fn set_state(tx: &Connection, upload: UploadId, state: UploadState) -> Result<(), MetaError> {
    tx.prepare_cached("UPDATE uploads SET state = ? WHERE id = ?")?
        .execute(params![state.as_str(), upload.get()])?;
    Ok(())
}

#[async_trait]
impl Health for SqliteStore {
    async fn ping(&self) -> Result<(), MetaError> {
        self.read(|conn| Ok(conn.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }

    async fn checkpoint(&self) -> Result<(), MetaError> {
        let path = self.readers.path.clone();
        let wal = self.wal.clone();
        tokio::task::spawn_blocking(move || -> Result<(), MetaError> {
            let conn = Connection::open(&path)?;
            configure(&conn)?;
            conn.pragma_update(None, "journal_size_limit", WAL_SOFT_LIMIT as i64)?;
            // A passive checkpoint copies the log into the database without holding writers
            // back (a truncating one makes every write wait until it is done, and a write waits
            // on a runtime thread). Once it is all copied, the next write starts the log over
            // in the same file, cut back to `journal_size_limit`; its pages are reused instead
            // of allocated anew. Only a log left past the soft limit is truncated here, waiting
            // a moment for readers to leave it.
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
            if wal.size() > WAL_SOFT_LIMIT {
                checkpoint_now(&conn, Duration::from_secs(1))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| MetaError::Internal(e.to_string()))?
    }

    async fn wants_checkpoint(&self) {
        self.wal.wanted.notified().await;
    }
}

#[async_trait]
impl SaveStore for SqliteStore {
    async fn slot_state(&self, slot: &Slot, read: SlotRead) -> Result<SlotState, MetaError> {
        let (repo, scope, folded, version) = slot_params(slot);
        // One read transaction for the statements: one snapshot, and one take of the log's
        // read lock instead of three.
        self.read_consistent(move |conn| {
            let slot = params![repo, scope, folded, version];
            let open = OPEN_UPLOAD_OF_SLOT.first(conn, slot, |r| upload_from_row(r))?;
            match read {
                SlotRead::Reserve { live_since } => {
                    let entry_exists = conn
                        .prepare_cached("SELECT 1 FROM entries WHERE repository = ? AND version = ? AND scope = ? AND key_folded = ?")?
                        .exists(params![repo, version, scope, folded])?;
                    let live: i64 = conn
                        .prepare_cached(
                            "SELECT COUNT(*) AS n FROM uploads WHERE repository = ? AND state = 'open' AND created_at >= ?",
                        )?
                        .query_row(params![repo, live_since], |r| r.get("n"))?;
                    Ok(SlotState {
                        open,
                        entry_exists,
                        live_open_uploads: live as u64,
                        ..SlotState::default()
                    })
                }
                SlotRead::Finalize => {
                    if let Some(upload) = open {
                        let blocks = load_blocks(conn, upload.id)?;
                        return Ok(SlotState {
                            open: Some(upload),
                            blocks,
                            ..SlotState::default()
                        });
                    }
                    // No open upload: perhaps a retry of a finalize that succeeded.
                    let finalized: Option<(i64, i64)> = conn
                        .prepare_cached(
                            "SELECT e.id, e.size FROM uploads u JOIN entries e ON e.id = u.entry_id
                             WHERE u.repository = ? AND u.scope = ? AND u.key_folded = ? AND u.version = ? AND u.state = 'finalized'
                             ORDER BY u.id DESC LIMIT 1",
                        )?
                        .query_row(slot, |r| Ok((r.get("id")?, r.get("size")?)))
                        .optional()?;
                    Ok(SlotState {
                        finalized: finalized.map(|(id, size)| (EntryId::new(id), size as u64)),
                        ..SlotState::default()
                    })
                }
            }
        })
        .await
    }

    async fn upload(
        &self,
        id: UploadId,
        read: UploadRead<'_>,
    ) -> Result<Option<UploadView>, MetaError> {
        let block = match read {
            UploadRead::Blocks => None,
            UploadRead::Block(block) => Some(block.clone()),
        };
        let Some(block) = block else {
            return self
                .read_consistent(move |conn| {
                    let Some(upload) = load_upload(conn, id)? else {
                        return Ok(None);
                    };
                    let blocks = load_blocks(conn, id)?;
                    Ok(Some(UploadView {
                        upload,
                        blocks,
                        block: BlockState::default(),
                    }))
                })
                .await;
        };
        self.read(move |conn| {
            static NAMES: ResultNames = ResultNames::new();
            let mut stmt = conn.prepare_cached(BLOCK_STATE_SQL.on(Backend::Sqlite))?;
            let params = params![block.as_bytes(), id.get()];
            let found = named_first(&mut stmt, &NAMES, params, |r| block_state_from_row(r))?;
            Ok(found.map(|(upload, block)| UploadView {
                upload,
                blocks: UploadBlocks::default(),
                block,
            }))
        })
        .await
    }

    async fn create_upload(
        &self,
        new: NewUpload<'_>,
        replacing: Option<&Upload>,
    ) -> Result<UploadId, MetaError> {
        let row = UploadRow::from_new(&new, Backend::Sqlite);
        let now = new.now;
        let replacing = replacing.cloned();
        self.write(move |tx| {
            static INSERT: LazyLock<String> = LazyLock::new(|| returning_id(&uploads::TABLE));
            if let Some(old) = &replacing {
                claim(tx, old, now)?;
                drop_blocks(tx, old.id)?;
                set_state(tx, old.id, UploadState::Aborted)?;
            }
            let values = row.inserted_values(Backend::Sqlite);
            let id = tx
                .prepare_cached(&INSERT)?
                .query_row(rusqlite::params_from_iter(values), |r| r.get("id"))?;
            Ok(UploadId::new(id))
        })
        .await
    }

    async fn change_upload(
        &self,
        upload: &Upload,
        change: UploadChange<'_>,
        now: Millis,
    ) -> Result<(), MetaError> {
        match change {
            UploadChange::Stage { block, chunk } => {
                self.stage_block(upload, block, chunk, now).await
            }
            UploadChange::Commit(parts) => self.commit_parts(upload, parts, now).await,
            UploadChange::Abort => self.abort_upload(upload, now).await,
        }
    }

    async fn finalize(
        &self,
        upload: Option<&Upload>,
        entry: NewEntry<'_>,
    ) -> Result<EntryId, MetaError> {
        let row = EntryRow::from_new(&entry, Backend::Sqlite);
        let (upload, chunks, now) = (upload.cloned(), entry.chunks.to_vec(), entry.now);
        let name = entry.repository_name.to_owned();
        let (pr_bytes, pr_entries) = pr_counts(entry.scope_class, row.size as u64);
        self.write(move |tx| {
            if let Some(upload) = &upload {
                claim(tx, upload, now)?;
            }
            let (repository, size) = (row.repository.clone(), row.size);
            let entry = insert_entry(tx, row)?;
            insert_chunks(tx, entry, &chunks)?;
            if let Some(upload) = &upload {
                drop_blocks(tx, upload.id)?;
                tx.prepare_cached(
                    "UPDATE uploads SET state = 'finalized', entry_id = ? WHERE id = ?",
                )?
                .execute(params![entry, upload.id.get()])?;
            }
            tx.prepare_cached(
                "INSERT INTO repository_usage (repository, bytes, entries, name, pr_bytes, pr_entries) VALUES (?, ?, 1, ?, ?, ?)
                 ON CONFLICT (repository) DO UPDATE SET bytes = bytes + excluded.bytes, entries = entries + 1,
                     name = CASE WHEN excluded.name = '' THEN name ELSE excluded.name END,
                     pr_bytes = pr_bytes + excluded.pr_bytes, pr_entries = pr_entries + excluded.pr_entries",
            )?
            .execute(params![repository, size, name, pr_bytes, pr_entries])?;
            Ok(EntryId::new(entry))
        })
        .await
    }
}

/// The upload changes of [`SqliteStore::change_upload`], one each.
impl SqliteStore {
    /// [`UploadChange::Stage`].
    async fn stage_block(
        &self,
        upload: &Upload,
        block: &BlockId,
        chunk: &Chunk,
        now: Millis,
    ) -> Result<(), MetaError> {
        let (upload, block, chunk) = (upload.clone(), block.clone(), chunk.clone());
        self.write(move |tx| {
            claim(tx, &upload, now)?;
            // The upload's totals, before the copy this block replaces (if any) is gone.
            tx.prepare_cached(
                "UPDATE uploads SET
                     staged_count = staged_count
                         + NOT EXISTS (SELECT 1 FROM staged_blocks WHERE upload_id = ?1 AND block_id = ?2),
                     staged_bytes = staged_bytes + ?3
                         - COALESCE((SELECT size FROM staged_blocks WHERE upload_id = ?1 AND block_id = ?2), 0)
                 WHERE id = ?1",
            )?
            .execute(params![upload.id.get(), block.as_bytes(), chunk.size as i64])?;
            let row = StagedBlockRow::new(upload.id.get(), &block, &chunk);
            tx.prepare_cached(staged_blocks::TABLE.replace(Backend::Sqlite, 2))?
                .execute(rusqlite::params_from_iter(row.inserted_values(Backend::Sqlite)))?;
            Ok(())
        })
        .await
    }

    /// [`UploadChange::Commit`].
    async fn commit_parts(
        &self,
        upload: &Upload,
        parts: &[(BlockId, Chunk)],
        now: Millis,
    ) -> Result<(), MetaError> {
        let (upload, parts) = (upload.clone(), parts.to_vec());
        self.write(move |tx| {
            claim(tx, &upload, now)?;
            drop_blocks(tx, upload.id)?;
            let mut insert = tx.prepare_cached(upload_parts::TABLE.insert(Backend::Sqlite))?;
            for row in UploadPartRow::of_list(upload.id.get(), &parts) {
                insert.execute(rusqlite::params_from_iter(
                    row.inserted_values(Backend::Sqlite),
                ))?;
            }
            Ok(())
        })
        .await
    }

    /// [`UploadChange::Abort`].
    async fn abort_upload(&self, upload: &Upload, now: Millis) -> Result<(), MetaError> {
        let upload = upload.clone();
        self.write(move |tx| {
            claim(tx, &upload, now)?;
            drop_blocks(tx, upload.id)?;
            set_state(tx, upload.id, UploadState::Aborted)
        })
        .await
    }

    /// [`EntryMove::Release`] of `ids`.
    async fn release(&self, ids: Vec<EntryId>) -> Result<Vec<EntryUse>, MetaError> {
        self.write(move |tx| {
            let mut moved = Vec::new();
            for id in ids {
                let id = id.get();
                let released = tx
                    .prepare_cached(quarantine::RELEASE_ENTRY.on(Backend::Sqlite))?
                    .execute([id])?;
                if released == 0 {
                    continue;
                }
                tx.prepare_cached(quarantine::RELEASE_CHUNKS.on(Backend::Sqlite))?
                    .execute([id])?;
                tx.prepare_cached(quarantine::RELEASE_USAGE.on(Backend::Sqlite))?
                    .execute([id, id, id, id])?;
                tx.prepare_cached(quarantine::FORGET_CHUNKS.on(Backend::Sqlite))?
                    .execute([id])?;
                tx.prepare_cached(quarantine::FORGET_ENTRY.on(Backend::Sqlite))?
                    .execute([id])?;
                let released = tx
                    .prepare_cached(&format!("{} WHERE id = ?", *USE_COLS))?
                    .query_row([id], |r| Ok(use_from_row(r)))??;
                moved.push(released);
            }
            Ok(moved)
        })
        .await
    }
}

#[async_trait]
impl RestoreStore for SqliteStore {
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
        static COLS: LazyLock<String> =
            LazyLock::new(|| format!("SELECT {} FROM entries", CANDIDATE.join(", ")));
        let pairs = scopes.len() * folded_keys.len();
        let mut sql = String::with_capacity(pairs * 400);
        for i in 0..pairs {
            if i > 0 {
                sql.push_str(" UNION ALL ");
            }
            sql.push_str("SELECT * FROM (");
            sql.push_str(&COLS);
            sql.push_str(" WHERE repository = ?1 AND version = ?2 AND scope = ? AND key_folded = ? LIMIT 1) UNION ALL SELECT * FROM (");
            sql.push_str(&COLS);
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
                values.push(crate::meta::sql::prefix_end(key));
            }
        }
        // Every statement of this shape selects the same columns.
        static NAMES: ResultNames = ResultNames::new();
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&sql)?;
            let values = rusqlite::params_from_iter(values.iter());
            named_rows(&mut stmt, &NAMES, values, |r| candidate_from_row(r))
        })
        .await
    }

    async fn entry(
        &self,
        id: EntryId,
        state: EntryState,
    ) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        self.read_consistent(move |conn| {
            static LIVE: [Select; 2] = [
                Select::new(|| {
                    format!(
                        "SELECT {} FROM entries e WHERE e.id = ?",
                        columns("e", ENTRY)
                    )
                }),
                Select::new(|| {
                    format!(
                        "SELECT start, {} FROM entry_chunks WHERE entry_id = ? ORDER BY ordinal",
                        CHUNK.join(", ")
                    )
                }),
            ];
            static QUARANTINED: [Select; 2] = [
                Select::new(|| quarantine::ENTRY.on(Backend::Sqlite).to_owned()),
                Select::new(|| quarantine::CHUNKS.on(Backend::Sqlite).to_owned()),
            ];
            let [head, chunks] = match state {
                EntryState::Live => &LIVE,
                EntryState::Quarantined => &QUARANTINED,
            };
            let Some(entry) = head.first(conn, [id.get()], |r| entry_from_row(r))? else {
                return Ok(None);
            };
            let chunks = chunks.rows(conn, [id.get()], |row| entry_chunk_from_row(row))?;
            Ok(Some((entry, chunks)))
        })
        .await
    }

    async fn record_uses(&self, uses: &Uses) -> Result<(), MetaError> {
        let uses = uses.clone();
        self.write(move |tx| {
            let mut update =
                tx.prepare_cached("UPDATE entries SET last_used_at = MAX(last_used_at, ?), hits = hits + ? WHERE id = ?")?;
            let mut per_repository = tx.prepare_cached(
                "UPDATE repository_usage SET hits = hits + ? WHERE repository = (SELECT repository FROM entries WHERE id = ?)",
            )?;
            for (entry, count, last_used) in &uses.hits {
                update.execute(params![last_used, stored_count(*count), entry.get()])?;
                per_repository.execute(params![stored_count(*count), entry.get()])?;
            }
            for (sql, params) in record_restores_sql(&uses.restores, Backend::Sqlite) {
                tx.prepare_cached(sql)?
                    .execute(rusqlite::params_from_iter(params))?;
            }
            let mut upsert = tx.prepare_cached(
                "INSERT INTO repository_usage (repository, bytes, entries, name, misses) VALUES (?, 0, 0, ?, ?)
                 ON CONFLICT (repository) DO UPDATE SET misses = misses + excluded.misses,
                     name = CASE WHEN excluded.name = '' THEN name ELSE excluded.name END",
            )?;
            for (repository, name, count) in &uses.misses {
                upsert.execute(params![repository.as_str(), name, stored_count(*count)])?;
            }
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl LifecycleStore for SqliteStore {
    async fn usage(&self, of: UsageOf<'_>) -> Result<QuotaUsage, MetaError> {
        let (sql, params) = usage_sql(of);
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(sql.on(Backend::Sqlite))?;
            let rows = stmt.query(rusqlite::params_from_iter(params))?;
            Ok(first_of(rows, |r| quota_usage_from_row(Some(r)))?.unwrap_or_default())
        })
        .await
    }

    async fn drop_restores(&self, which: RestoreDrop<'_>) -> Result<u64, MetaError> {
        // Read apart from the deletes: the scan does not hold the writer.
        let over = match each_repository_keeps(&which) {
            Some(keep) => {
                self.read(move |conn| {
                    let mut stmt =
                        conn.prepare_cached(RESTORE_HEAVY_REPOSITORIES.on(Backend::Sqlite))?;
                    let rows = stmt.query([Param::count(keep)])?;
                    rows_of(rows, |r| Ok(RepoId::new(r.text("repository")?)))
                })
                .await?
            }
            None => Vec::new(),
        };
        let mut dropped = 0;
        for statements in drop_restores_sql(&which, &over) {
            dropped += self
                .write(move |tx| {
                    let mut dropped = 0;
                    for (sql, params) in statements {
                        dropped += tx
                            .prepare_cached(sql.on(Backend::Sqlite))?
                            .execute(rusqlite::params_from_iter(params))?;
                    }
                    Ok(dropped as u64)
                })
                .await?;
        }
        Ok(dropped)
    }

    async fn walk_entries(
        &self,
        walk: EntryWalk<'_>,
        limit: usize,
    ) -> Result<Vec<EntryUse>, MetaError> {
        let (sql, params) = walk_entries_sql(&walk, limit);
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(sql.on(Backend::Sqlite))?;
            let rows = stmt.query(rusqlite::params_from_iter(params))?;
            rows_of(rows, |r| use_from_row(r))
        })
        .await
    }

    async fn move_entries(
        &self,
        ids: &[EntryId],
        change: EntryMove<'_>,
    ) -> Result<Vec<EntryUse>, MetaError> {
        let ids = ids.to_vec();
        let removal = match change {
            EntryMove::Remove(removal) => removal,
            EntryMove::Release => return self.release(ids).await,
        };
        let (cause, now, delete_at) = (removal.cause.clone(), removal.now, removal.delete_at);
        if removal.from == EntryState::Quarantined {
            return self
                .write(move |tx| {
                    let mut ended = Vec::new();
                    for id in ids {
                        let [(read, id_only), drop_chunks, forget_chunks, forget_entry] =
                            quarantine::end(id.get(), delete_at);
                        let mut stmt = tx.prepare_cached(read.on(Backend::Sqlite))?;
                        let entry =
                            first_of(stmt.query(rusqlite::params_from_iter(id_only))?, |r| {
                                use_from_row(r)
                            })?;
                        for (sql, params) in [drop_chunks, forget_chunks] {
                            tx.prepare_cached(sql.on(Backend::Sqlite))?
                                .execute(rusqlite::params_from_iter(params))?;
                        }
                        let (sql, params) = forget_entry;
                        let forgotten = tx
                            .prepare_cached(sql.on(Backend::Sqlite))?
                            .execute(rusqlite::params_from_iter(params))?;
                        ended.extend(entry.filter(|_| forgotten > 0));
                    }
                    Ok(ended)
                })
                .await;
        }
        self.write(move |tx| {
            let mut removed = Vec::new();
            for id in ids {
                // Chunks first, while the entry's rows still name them; an entry already gone
                // has none, and its DELETE returns nothing.
                if let RemovalCause::Quarantined(reason) = &cause {
                    tx.prepare_cached(quarantine::KEEP_ENTRY.on(Backend::Sqlite))?
                        .execute(params![reason, now, id.get()])?;
                    tx.prepare_cached(quarantine::KEEP_CHUNKS.on(Backend::Sqlite))?
                        .execute([id.get()])?;
                } else {
                    tx.prepare_cached(
                        "INSERT OR REPLACE INTO pending_deletions (blob_name, size, delete_at)
                         SELECT blob_name, size, ? FROM entry_chunks WHERE entry_id = ?",
                    )?
                    .execute(params![delete_at, id.get()])?;
                }
                tx.prepare_cached("DELETE FROM entry_chunks WHERE entry_id = ?")?
                    .execute([id.get()])?;
                let mut delete = tx.prepare_cached(
                    "DELETE FROM entries WHERE id = ?
                     RETURNING id, repository, size, created_at, last_used_at, family, ref_class, scope_class",
                )?;
                let gone = first_of(delete.query([id.get()])?, |r| {
                    let class = ScopeClass::from_code(r.read(entries::scope_class)?);
                    Ok((use_from_row(r)?, class))
                })?;
                let Some((entry, class)) = gone else { continue };
                let (pr_bytes, pr_entries) = pr_counts(class, entry.size);
                tx.prepare_cached(
                    "UPDATE repository_usage SET bytes = bytes - ?, entries = entries - 1,
                         pr_bytes = pr_bytes - ?, pr_entries = pr_entries - ?
                     WHERE repository = ?",
                )?
                .execute(params![entry.size as i64, pr_bytes, pr_entries, entry.repository.as_str()])?;
                removed.push(entry);
            }
            Ok(removed)
        })
        .await
    }

    async fn take_deletions(
        &self,
        done: &[BlobName],
        now: Millis,
        limit: usize,
    ) -> Result<Vec<BlobName>, MetaError> {
        let done: Vec<String> = done.iter().map(|n| n.as_str().to_owned()).collect();
        let due = move |conn: &Connection| {
            let mut stmt = conn.prepare_cached(DUE_DELETIONS.on(Backend::Sqlite))?;
            let names = rows_of(stmt.query(params![now, limit as i64])?, |r| {
                r.read(pending_deletions::blob_name)
            })?;
            Ok(names.iter().filter_map(|n| BlobName::parse(n)).collect())
        };
        if done.is_empty() {
            // Nothing carried out (a dry run's only call): a read, which changes nothing.
            return self.read(due).await;
        }
        self.write(move |tx| {
            let mut delete =
                tx.prepare_cached("DELETE FROM pending_deletions WHERE blob_name = ?")?;
            for name in done {
                delete.execute([name])?;
            }
            tx.prepare_cached(FORGET_SHARED_DELETIONS.on(Backend::Sqlite))?
                .execute(params![now, limit as i64])?;
            due(tx)
        })
        .await
    }

    async fn referenced(&self, names: &[BlobName]) -> Result<Vec<BlobName>, MetaError> {
        let names = names.to_vec();
        self.read_consistent(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM entry_chunks WHERE blob_name = ?1)
                     OR EXISTS (SELECT 1 FROM quarantined_chunks WHERE blob_name = ?1)
                     OR EXISTS (SELECT 1 FROM staged_blocks WHERE blob_name = ?1)
                     OR EXISTS (SELECT 1 FROM upload_parts WHERE blob_name = ?1)
                     OR EXISTS (SELECT 1 FROM pending_deletions WHERE blob_name = ?1) AS referenced",
            )?;
            let mut out = Vec::new();
            for name in names {
                if stmt.query_row([name.as_str()], |r| r.get::<_, bool>("referenced"))? {
                    out.push(name);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn sweep_uploads(&self, sweep: UploadSweep) -> Result<SweptUploads, MetaError> {
        let open = move |conn: &Connection| {
            let mut stmt = conn.prepare_cached(
                "SELECT id FROM uploads WHERE state = 'open' AND created_at < ? ORDER BY created_at LIMIT ?",
            )?;
            let params = params![sweep.open_before, sweep.limit as i64];
            let ids = rows_of(stmt.query(params)?, |r| {
                r.read(uploads::id).map(UploadId::new)
            });
            ids
        };
        let Some(before) = sweep.prune_before else {
            let open = self.read(open).await?;
            return Ok(SweptUploads { open, pruned: 0 });
        };
        self.write(move |tx| {
            let mut pruned = 0;
            for state in ["finalized", "aborted"] {
                pruned += tx
                    .prepare_cached("DELETE FROM uploads WHERE state = ? AND created_at < ?")?
                    .execute(params![state, before])?;
            }
            let open = open(tx)?;
            Ok(SweptUploads {
                open,
                pruned: pruned as u64,
            })
        })
        .await
    }

    async fn record_digest(
        &self,
        entry: EntryId,
        sha256: &[[u8; 32]],
        digest: &str,
    ) -> Result<bool, MetaError> {
        let (sha256, digest) = (sha256.to_vec(), digest.to_owned());
        self.write(move |tx| {
            let recorded = tx
                .prepare_cached("UPDATE entries SET digest = ? WHERE id = ? AND digest = ''")?
                .execute(params![digest, entry.get()])?;
            if recorded == 1 {
                let mut chunk = tx.prepare_cached(
                    "UPDATE entry_chunks SET sha256 = ? WHERE entry_id = ? AND ordinal = ?",
                )?;
                for (ordinal, sha256) in sha256.iter().enumerate() {
                    chunk.execute(params![&sha256[..], entry.get(), ordinal as i64])?;
                }
            }
            Ok(recorded == 1)
        })
        .await
    }

    async fn forget_after(
        &self,
        since: Millis,
        now: Millis,
    ) -> Result<(usize, Vec<BlobName>), MetaError> {
        self.write(move |tx| {
            let mut names = tx.prepare_cached(
                "SELECT blob_name FROM entry_chunks WHERE entry_id IN (SELECT id FROM entries WHERE created_at > ?)
                 UNION ALL SELECT blob_name FROM staged_blocks WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')
                 UNION ALL SELECT blob_name FROM upload_parts WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')",
            )?;
            let names = rows_of(names.query([since])?, |r| r.read(entry_chunks::blob_name))?;
            let mut garbage: Vec<BlobName> = names.iter().filter_map(|n| BlobName::parse(n)).collect();
            // Usage drops by what is forgotten: work in proportion to it, not to the database.
            tx.prepare_cached(
                "UPDATE repository_usage SET bytes = repository_usage.bytes - f.gone,
                                            entries = repository_usage.entries - f.n,
                                            pr_bytes = repository_usage.pr_bytes - f.pr_gone,
                                            pr_entries = repository_usage.pr_entries - f.pr_n
                 FROM (SELECT repository, SUM(size) AS gone, COUNT(*) AS n,
                              SUM(CASE WHEN scope_class = 1 THEN size ELSE 0 END) AS pr_gone,
                              SUM(CASE WHEN scope_class = 1 THEN 1 ELSE 0 END) AS pr_n
                       FROM entries WHERE created_at > ? GROUP BY repository) AS f
                 WHERE repository_usage.repository = f.repository",
            )?
            .execute([since])?;
            tx.prepare_cached("DELETE FROM entry_chunks WHERE entry_id IN (SELECT id FROM entries WHERE created_at > ?)")?
                .execute([since])?;
            let forgotten = tx.prepare_cached("DELETE FROM entries WHERE created_at > ?")?.execute([since])?;
            tx.prepare_cached("DELETE FROM staged_blocks WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')")?
                .execute([])?;
            tx.prepare_cached("DELETE FROM upload_parts WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')")?
                .execute([])?;
            tx.prepare_cached("UPDATE uploads SET state = 'aborted', revision = revision + 1, updated_at = ?,
                                   staged_count = 0, staged_bytes = 0 WHERE state = 'open'")?
                .execute([now])?;
            garbage.sort();
            garbage.dedup();
            Ok((forgotten, garbage))
        })
        .await
    }
}

#[async_trait]
impl AdminStore for SqliteStore {
    async fn select_entries(&self, page: &EntryPage<'_>) -> Result<EntrySelection, MetaError> {
        let (sql, params) = select_entries_sql(page, |_| "?".into());
        let count = page
            .count
            .then(|| count_entries_sql(page.filter, |_| "?".into()));
        self.read_consistent(move |conn| {
            // Not cached: operators' statements vary and would push the hot ones out.
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query(rusqlite::params_from_iter(params))?;
            let entries = rows_of(rows, |r| listed_from_row(r))?;
            let total = match count {
                Some((sql, params)) => {
                    let n: i64 = conn
                        .prepare(&sql)?
                        .query_row(rusqlite::params_from_iter(params), |r| r.get("n"))?;
                    Some(n.max(0) as u64)
                }
                None => None,
            };
            Ok(EntrySelection { entries, total })
        })
        .await
    }

    async fn repositories(
        &self,
        only: Option<&str>,
        limit: usize,
    ) -> Result<Repositories, MetaError> {
        let page = (limit > 0).then(|| repositories_sql(only, limit, |_| "?".into()));
        self.read_consistent(move |conn| {
            let listed = match page {
                Some((sql, params)) => {
                    // Not cached: operators' statements vary and would push the hot ones out.
                    let mut stmt = conn.prepare(&sql)?;
                    let rows = stmt.query(rusqlite::params_from_iter(params))?;
                    rows_of(rows, |r| repository_from_row(r))?
                }
                None => Vec::new(),
            };
            let mut stmt = conn.prepare_cached(TOTALS.on(Backend::Sqlite))?;
            let totals = first_of(stmt.query([])?, |r| totals_from_row(r))?
                .ok_or_else(|| MetaError::Internal("the totals have no row".into()))?;
            Ok(Repositories { listed, totals })
        })
        .await
    }

    async fn restores(&self, query: &RestoreQuery) -> Result<Vec<RestoreRecord>, MetaError> {
        let (sql, params) = restores_sql(query, |_| "?".into());
        self.read(move |conn| {
            // Not cached: operators' statements vary and would push the hot ones out.
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query(rusqlite::params_from_iter(params))?;
            rows_of(rows, |r| restore_from_row(r))
        })
        .await
    }
}

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn deliver(&self, delivery: &Delivery<'_>) -> Result<Delivered, MetaError> {
        use webhook_sql::Part;
        let statements = webhook_sql::delivery_statements(delivery);
        let record = delivery.record;
        self.write(move |tx| {
            // Recorded before under a key: a key it records changes nothing, or a key it checks
            // finds a row.
            let mut recorded = false;
            let mut seen = false;
            let mut known = Vec::new();
            for (sql, params, part) in statements {
                let mut stmt = tx.prepare_cached(sql.on(Backend::Sqlite))?;
                let params = rusqlite::params_from_iter(params);
                match part {
                    Part::Check => seen |= stmt.exists(params)?,
                    Part::About => {
                        known = rows_of(stmt.query(params)?, |r| webhook_sql::ref_from_row(r))?
                    }
                    Part::Record => recorded |= stmt.execute(params)? > 0,
                    Part::Forget | Part::Fact => {
                        stmt.execute(params)?;
                    }
                }
            }
            let new = if record { recorded } else { !seen };
            Ok(if new {
                Delivered::New(known)
            } else {
                Delivered::Seen
            })
        })
        .await
    }
}

/// A built statement's parameter, as SQLite binds it.
impl rusqlite::ToSql for Param {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(match self {
            Param::Text(text) => text.as_str().into(),
            Param::Int(n) => (*n).into(),
            Param::Bytes(bytes) => bytes.as_slice().into(),
            Param::Null => rusqlite::types::ToSqlOutput::Owned(rusqlite::types::Value::Null),
        })
    }
}

/// A slot as bound parameters: repository, scope, folded key, version.
fn slot_params(slot: &Slot) -> (String, String, String, String) {
    (
        slot.repository.as_str().to_owned(),
        slot.scope.as_str().to_owned(),
        slot.key.folded(),
        slot.version.as_str().to_owned(),
    )
}

#[cfg(test)]
mod migration_tests {
    use super::*;

    /// Entries stored before scope classes existed are classified, and their repository's
    /// pull-request and tag bytes counted, when the database is upgraded.
    #[tokio::test]
    async fn the_scope_class_migration_classifies_stored_entries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        {
            let conn = Connection::open(&path).unwrap();
            for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 <= 5) {
                conn.execute_batch(sql).unwrap();
                conn.pragma_update(None, "user_version", version).unwrap();
            }
            let mut insert = conn
                .prepare(
                    "INSERT INTO entries (repository, scope, key, key_folded, version, size, chunk_count, created_at, last_used_at)
                     VALUES ('r', ?, ?, ?, 'v', ?, 1, ?, ?)",
                )
                .unwrap();
            for (i, (scope, size)) in [
                ("refs/heads/main", 100),
                ("refs/pull/3/merge", 20),
                ("refs/tags/v1", 5),
                ("REFS/PULL/3/merge", 1),
                ("", 2),
            ]
            .iter()
            .enumerate()
            {
                let key = format!("k{i}");
                insert
                    .execute(params![scope, key, key, size, i as i64, i as i64])
                    .unwrap();
            }
            conn.execute_batch(
                "INSERT INTO repository_usage (repository, bytes, entries) VALUES ('r', 128, 5)",
            )
            .unwrap();
        }
        let store = SqliteStore::open(&path).await.unwrap();
        let repo = RepoId::new("r");
        assert_eq!(
            store.usage(UsageOf::Repository(&repo)).await.unwrap(),
            QuotaUsage {
                bytes: 128,
                pr_bytes: 25
            }
        );
        let pr = store
            .walk_entries(
                EntryWalk::LeastRecentlyUsedOfClass(&repo, ScopeClass::PullRequestOrTag),
                10,
            )
            .await
            .unwrap();
        assert_eq!(pr.iter().map(|e| e.size).collect::<Vec<_>>(), [20, 5]);
        let listed = store.repositories(Some("r"), 1).await.unwrap().listed;
        assert_eq!((listed[0].pr_bytes, listed[0].pr_entries), (25, 2));
    }

    /// A database from before ids were kept for good: the upgrade keeps every entry and its
    /// chunks, and the next entry's id is past every id an upload or the quarantine still names
    /// (the newest entry was deleted before the upgrade, its id recorded by its upload).
    #[tokio::test]
    async fn the_entry_id_migration_keeps_entries_and_never_reuses_a_named_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        {
            let conn = Connection::open(&path).unwrap();
            for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 < 10) {
                conn.execute_batch(sql).unwrap();
                conn.pragma_update(None, "user_version", version).unwrap();
            }
            conn.execute_batch(
                "INSERT INTO entries (id, repository, scope, key, key_folded, version, size, chunk_count, created_at, last_used_at, digest)
                     VALUES (3, 'r', '', 'k', 'k', 'v', 1, 1, 0, 0, 'd');
                 INSERT INTO uploads (repository, scope, key, key_folded, version, state, created_by, created_at, updated_at, entry_id)
                     VALUES ('r', '', 'gone', 'gone', 'v', 'finalized', '', 0, 0, 9);",
            )
            .unwrap();
            conn.execute(
                "INSERT INTO entry_chunks (entry_id, ordinal, start, blob_name, size, sha256) VALUES (3, 0, 0, ?, 1, ?)",
                params![BlobName::random().as_str(), &[7u8; 32][..]],
            )
            .unwrap();
        }
        let store = SqliteStore::open(&path).await.unwrap();
        let (kept, chunks) = store
            .entry(EntryId::new(3), EntryState::Live)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((kept.key.as_str(), chunks.len()), ("k", 1));
        let id = store
            .import(vec![(
                Slot {
                    repository: RepoId::new("r"),
                    scope: Scope::new(""),
                    key: crate::model::CacheKey::parse("new").unwrap(),
                    version: Version::parse("v").unwrap(),
                },
                vec![Chunk {
                    blob: BlobName::random(),
                    size: 1,
                    sha256: Some([1; 32]),
                    xxh3: None,
                }],
                1,
            )])
            .await;
        id.unwrap();
        let walk = EntryWalk::All {
            after: EntryId::new(0),
        };
        let ids: Vec<EntryId> = store
            .walk_entries(walk, 10)
            .await
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, [EntryId::new(3), EntryId::new(10)]);
    }

    /// Uploads staged before their totals were kept get them counted when the database is
    /// upgraded, so a Put Block after the upgrade enforces the same limits.
    #[tokio::test]
    async fn the_upload_totals_migration_counts_staged_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        {
            let conn = Connection::open(&path).unwrap();
            for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 < 8) {
                conn.execute_batch(sql).unwrap();
                conn.pragma_update(None, "user_version", version).unwrap();
            }
            conn.execute_batch(
                "INSERT INTO uploads (id, repository, scope, key, key_folded, version, state, created_by, created_at, updated_at)
                     VALUES (1, 'r', '', 'k', 'k', 'v', 'open', '', 0, 0), (2, 'r', '', 'j', 'j', 'v', 'open', '', 0, 0);",
            )
            .unwrap();
            let mut insert = conn
                .prepare("INSERT INTO staged_blocks (upload_id, block_id, blob_name, size, sha256) VALUES (1, ?, ?, ?, ?)")
                .unwrap();
            for (id, size) in [(&b"a"[..], 3i64), (b"b", 4)] {
                let name = BlobName::random();
                insert
                    .execute(params![id, name.as_str(), size, &[1u8; 32][..]])
                    .unwrap();
            }
        }
        let store = SqliteStore::open(&path).await.unwrap();
        let totals = |id: i64| {
            let store = store.clone();
            async move {
                let state = store
                    .upload(
                        UploadId::new(id),
                        UploadRead::Block(&BlockId::parse(b"a").unwrap()),
                    )
                    .await
                    .unwrap()
                    .unwrap()
                    .block;
                (state.staged_count, state.staged_bytes)
            }
        };
        assert_eq!(totals(1).await, (2, 7));
        assert_eq!(totals(2).await, (0, 0));
    }
}
