//! The networked stores, PostgreSQL and MySQL/MariaDB, through sqlx: every statement the two
//! dialects share is written here once, and each [`Dialect`] holds what differs (connecting,
//! migrations, parameter spelling, and the changes whose SQL cannot be the same: PostgreSQL does
//! each in one statement with data-modifying CTEs, MySQL in a short transaction).
//!
//! Shared statements are written with `?` parameters and `{bigint}` for a cast to a 64-bit
//! integer, as [`Shared`] statements spelled once per dialect ([`crate::meta::dialect`]); rows
//! are written from the declared rows of [`crate::meta::schema`]. Strings compare byte-wise in both
//! (PostgreSQL `COLLATE "C"`, MySQL binary columns), and the index keys of slots and lookups are
//! fixed-size hashes ([`hashes::bucket`](super::hashes::bucket), [`hashes::slot_hash`](super::hashes::slot_hash)), so both answer exactly as SQLite does.

/// [`Connections`] for a dialect with a sqlx `pool` whose rows are `$row`: the same code for
/// both drivers, whose types differ.
macro_rules! impl_connections {
    ($dialect:ty, $db:ty, $row:ty) => {
        #[async_trait]
        impl Connections for $dialect {
            type Row = $row;

            async fn fetch(&self, sql: &str, params: Vec<Param>) -> Result<Vec<$row>, MetaError> {
                bind_all(sqlx::query(AssertSqlSafe(sql.to_owned())), params)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(from_sqlx)
            }

            async fn execute(&self, sql: &str, params: Vec<Param>) -> Result<u64, MetaError> {
                let done = bind_all(sqlx::query(AssertSqlSafe(sql.to_owned())), params)
                    .execute(&self.pool)
                    .await
                    .map_err(from_sqlx)?;
                Ok(done.rows_affected())
            }

            async fn in_transaction(
                &self,
                mut steps: Vec<Step>,
            ) -> Result<Vec<Done<$row>>, MetaError> {
                // One statement is atomic on its own: no BEGIN and COMMIT round trips for it.
                if steps.len() == 1 {
                    return Ok(vec![match steps.remove(0) {
                        Step::Fetch(sql, params) => Done::Rows(self.fetch(&sql, params).await?),
                        Step::Execute(sql, params) => {
                            Done::Changed(self.execute(&sql, params).await?)
                        }
                    }]);
                }
                let mut tx = self.pool.begin().await.map_err(from_sqlx)?;
                let done = Self::run_steps(&mut tx, steps).await?;
                tx.commit().await.map_err(from_sqlx)?;
                Ok(done)
            }
        }

        impl $dialect {
            /// Runs `steps` in order inside `tx`.
            async fn run_steps(
                tx: &mut sqlx::Transaction<'static, $db>,
                steps: Vec<Step>,
            ) -> Result<Vec<Done<$row>>, MetaError> {
                let mut done = Vec::with_capacity(steps.len());
                for step in steps {
                    let (sql, params, rows_wanted) = match step {
                        Step::Fetch(sql, params) => (sql, params, true),
                        Step::Execute(sql, params) => (sql, params, false),
                    };
                    let query = bind_all(sqlx::query(AssertSqlSafe(sql)), params);
                    done.push(if rows_wanted {
                        Done::Rows(query.fetch_all(&mut **tx).await.map_err(from_sqlx)?)
                    } else {
                        let changed = query.execute(&mut **tx).await.map_err(from_sqlx)?;
                        Done::Changed(changed.rows_affected())
                    });
                }
                Ok(done)
            }
        }
    };
}

mod mysql;
mod postgres;
mod stats;

use async_trait::async_trait;

use super::dialect::{shared, Backend, Shared};
use super::hashes::{bucket, slot_hash};
use super::quarantine;
use super::row::{stored_count, Renamed};
use super::schema::{entries, uploads};
use super::sql::{
    block_state_from_row, candidate_from_row, candidates_sql, collect_blocks, columns,
    count_entries_sql, entry_chunk_from_row, entry_from_row, listed_from_row, names_from_rows,
    prefix_end, quota_usage_from_row, record_restores_sql, repositories_sql, repository_from_row,
    restore_from_row, restores_sql, select_entries_sql, upload_from_row, upload_with_blocks_sql,
    use_from_row, Param, SqlRow, BLOCK_STATE_SQL, CHUNK, ENTRY, UPLOAD, USE_COLS,
};
use super::sql::{
    drop_restores_sql, each_repository_keeps, walk_entries_sql, DUE_DELETIONS,
    FORGET_SHARED_DELETIONS, RESTORE_HEAVY_REPOSITORIES,
};
use super::sql::{totals_from_row, usage_sql, TOTALS};
use super::{
    AdminStore, BlockState, EntryChunk, EntryMove, EntryPage, EntrySelection, EntryState,
    EntryWalk, Health, LifecycleStore, MetaError, NewEntry, NewUpload, PoolSettings, Removal,
    Repositories, RestoreDrop, RestoreQuery, RestoreStore, SaveStore, SlotRead, SlotState,
    SweptUploads, UploadChange, UploadRead, UploadSweep, UploadView, UsageOf, Uses,
};
use super::{Delivered, Delivery, WebhookStore};
use crate::model::{
    BlobName, BlockId, Candidate, Chunk, Entry, EntryId, EntryUse, Millis, QuotaUsage, RepoId,
    RestoreRecord, Scope, Slot, Upload, UploadBlocks, UploadId, Version,
};

/// The PostgreSQL store: several hoard processes may share one database.
pub type PostgresStore = SqlxStore<postgres::PostgresDialect>;
/// The MySQL 8 / MariaDB 10.11+ store: several hoard processes may share one database.
pub type MySqlStore = SqlxStore<mysql::MySqlDialect>;

/// Names per statement where a list of them is bound (`IN (…)`), well under the 65,535
/// parameters either database takes.
const NAMES_PER_STATEMENT: usize = 1000;

/// A store on a networked database: the shared statements over a dialect.
#[derive(Debug, Clone)]
pub struct SqlxStore<D> {
    db: D,
}

/// One statement of a transaction run by [`Connections::in_transaction`], in the dialect's
/// spelling ([`Shared::on`]).
pub enum Step {
    /// Rows wanted.
    Fetch(Sql, Vec<Param>),
    /// Only the count of rows changed.
    Execute(Sql, Vec<Param>),
}

impl Step {
    pub fn fetch(sql: impl Into<Sql>, params: Vec<Param>) -> Self {
        Self::Fetch(sql.into(), params)
    }

    pub fn execute(sql: impl Into<Sql>, params: Vec<Param>) -> Self {
        Self::Execute(sql.into(), params)
    }
}

/// A step's statement: one written in the code, or one built for the call (a list of names, an
/// operator's filter).
pub type Sql = std::borrow::Cow<'static, str>;

/// What a [`Step`] gave.
pub enum Done<R> {
    Rows(Vec<R>),
    Changed(u64),
}

/// Running statements on a dialect's connections ([`impl_connections!`]).
#[async_trait]
pub trait Connections: Send + Sync + std::fmt::Debug + 'static {
    type Row: SqlRow + Send + Sync;

    async fn fetch(&self, sql: &str, params: Vec<Param>) -> Result<Vec<Self::Row>, MetaError>;

    /// Runs a statement; returns how many rows it changed.
    async fn execute(&self, sql: &str, params: Vec<Param>) -> Result<u64, MetaError>;

    /// Runs statements in order, in one transaction.
    async fn in_transaction(&self, steps: Vec<Step>) -> Result<Vec<Done<Self::Row>>, MetaError>;
}

/// What differs between PostgreSQL and MySQL.
#[async_trait]
pub trait Dialect: Connections + Sized {
    /// Connects (a pool as `pool` says) and brings the schema up to date.
    async fn open(url: &str, pool: PoolSettings) -> Result<Self, MetaError>;

    /// Which backend this is: how its statements are spelled ([`crate::meta::dialect`]).
    const BACKEND: Backend;

    /// The n-th (1-based) parameter of a statement built at run time.
    fn placeholder(n: usize) -> String {
        Self::BACKEND.placeholder(n)
    }

    // The changes whose SQL differs; each has the contract of the store method of its name, or
    // of the [`UploadChange`] of its name.

    async fn create_upload(
        &self,
        new: NewUpload<'_>,
        replacing: Option<&Upload>,
    ) -> Result<UploadId, MetaError>;
    async fn stage_block(
        &self,
        upload: &Upload,
        block: &BlockId,
        chunk: &Chunk,
        now: Millis,
    ) -> Result<(), MetaError>;
    async fn commit_parts(
        &self,
        upload: &Upload,
        parts: &[(BlockId, Chunk)],
        now: Millis,
    ) -> Result<(), MetaError>;
    async fn abort_upload(&self, upload: &Upload, now: Millis) -> Result<(), MetaError>;
    async fn finalize(
        &self,
        upload: Option<&Upload>,
        new: NewEntry<'_>,
    ) -> Result<EntryId, MetaError>;
    /// [`RestoreStore::record_uses`], with the restore records' statements written once
    /// (`restores`) run in the same transaction.
    async fn record_uses(&self, uses: &Uses, restores: Vec<Step>) -> Result<(), MetaError>;
    async fn remove_entries(
        &self,
        ids: &[EntryId],
        removal: Removal<'_>,
    ) -> Result<Vec<EntryUse>, MetaError>;
}

impl<D: Dialect> SqlxStore<D> {
    /// A live entry and its chunks, in one statement (one snapshot: an entry deleted meanwhile
    /// is gone whole).
    async fn live_entry(&self, id: EntryId) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        // The chunk's size is selected as `chunk_size`, beside the entry's.
        static ENTRY_AND_CHUNKS: Shared = Shared::built(|| {
            let chunk: Vec<String> = CHUNK
                .iter()
                .map(|c| match *c {
                    "size" => "c.size AS chunk_size".to_owned(),
                    c => format!("c.{c}"),
                })
                .collect();
            format!(
                "SELECT {}, c.start, {}
                 FROM entries e JOIN entry_chunks c ON c.entry_id = e.id
                 WHERE e.id = ? ORDER BY c.ordinal",
                columns("e", ENTRY),
                chunk.join(", ")
            )
        });
        let rows = self
            .rows(&ENTRY_AND_CHUNKS, vec![Param::Int(id.get())])
            .await?;
        let Some(head) = rows.first() else {
            return Ok(None);
        };
        let entry = entry_from_row(head)?;
        let chunks = rows
            .iter()
            .map(|row| entry_chunk_from_row(&Renamed(row, "size", "chunk_size")))
            .collect::<Result<_, MetaError>>()?;
        Ok(Some((entry, chunks)))
    }

    /// A quarantined entry and its chunks.
    async fn quarantined_entry(
        &self,
        id: EntryId,
    ) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        let id = Param::Int(id.get());
        let on = |sql: &'static Shared| sql.on(D::BACKEND);
        // One transaction: an entry released or dropped meanwhile is seen whole or not at all.
        let done = self
            .db
            .in_transaction(vec![
                Step::fetch(on(&quarantine::ENTRY), vec![id.clone()]),
                Step::fetch(on(&quarantine::CHUNKS), vec![id]),
            ])
            .await?;
        let [Done::Rows(head), Done::Rows(chunks)] = &done[..] else {
            return Err(MetaError::Internal("a fetch answered no rows".into()));
        };
        let Some(head) = head.first() else {
            return Ok(None);
        };
        let chunks = chunks
            .iter()
            .map(entry_chunk_from_row)
            .collect::<Result<_, MetaError>>()?;
        Ok(Some((entry_from_row(head)?, chunks)))
    }

    /// Connects (a pool as `pool` says) and brings the schema up to date.
    pub async fn open(url: &str, pool: PoolSettings) -> Result<Self, MetaError> {
        Ok(Self {
            db: D::open(url, pool).await?,
        })
    }

    /// Runs a shared statement and returns its rows.
    async fn rows(
        &self,
        sql: &'static Shared,
        params: Vec<Param>,
    ) -> Result<Vec<D::Row>, MetaError> {
        self.db.fetch(sql.on(D::BACKEND), params).await
    }

    /// Runs a statement built at run time with `?` parameters and returns its rows.
    async fn built_rows(
        &self,
        template: &str,
        params: Vec<Param>,
    ) -> Result<Vec<D::Row>, MetaError> {
        self.db.fetch(&D::BACKEND.spell(template), params).await
    }

    /// An upload and its blocks by a statement of [`upload_with_blocks_sql`], the upload named
    /// by `key` in each of the statement's three places.
    async fn upload_and_blocks(
        &self,
        sql: &'static Shared,
        key: Param,
    ) -> Result<Option<(Upload, UploadBlocks)>, MetaError> {
        let rows = self.rows(sql, vec![key.clone(), key.clone(), key]).await?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        Ok(Some((upload_from_row(first)?, collect_blocks(&rows)?)))
    }

    /// [`SlotRead::Finalize`]: the open upload and its blocks in one statement, else the
    /// newest finalized upload's entry.
    async fn finalize_state(&self, slot: &Slot) -> Result<SlotState, MetaError> {
        let hash = Param::Bytes(slot_hash(slot));
        static OPEN_OF_SLOT: Shared = Shared::built(|| {
            upload_with_blocks_sql(
                "(SELECT id FROM uploads WHERE slot_hash = ? AND state = 'open')",
                "u.slot_hash = ? AND u.state = 'open'",
            )
        });
        let open = self.upload_and_blocks(&OPEN_OF_SLOT, hash.clone()).await?;
        if let Some((upload, blocks)) = open {
            return Ok(SlotState {
                open: Some(upload),
                blocks,
                ..SlotState::default()
            });
        }
        // No open upload: perhaps a retry of a finalize that succeeded.
        let rows = self
            .rows(
                shared!(
                    "SELECT e.id, e.size FROM uploads u JOIN entries e ON e.id = u.entry_id
                     WHERE u.slot_hash = ? AND u.state = 'finalized' ORDER BY u.id DESC LIMIT 1"
                ),
                vec![hash],
            )
            .await?;
        let finalized = rows
            .first()
            .map(|row| {
                let id = EntryId::new(row.read(entries::id)?);
                Ok::<_, MetaError>((id, row.count(entries::size.name)?))
            })
            .transpose()?;
        Ok(SlotState {
            finalized,
            ..SlotState::default()
        })
    }

    /// [`EntryMove::Release`] of `ids`: per entry, its row back, its chunks, its repository's
    /// usage, the quarantine's rows forgotten, and the released entry read.
    async fn release(&self, ids: &[EntryId]) -> Result<Vec<EntryUse>, MetaError> {
        static RELEASED: Shared = Shared::built(|| format!("{} WHERE id = ?", *USE_COLS));
        let on = |sql: &'static Shared| sql.on(D::BACKEND);
        let steps = ids.iter().flat_map(|id| {
            let id = Param::Int(id.get());
            [
                Step::execute(on(&quarantine::RELEASE_ENTRY), vec![id.clone()]),
                Step::execute(on(&quarantine::RELEASE_CHUNKS), vec![id.clone()]),
                Step::execute(on(&quarantine::RELEASE_USAGE), vec![id.clone(); 4]),
                Step::execute(on(&quarantine::FORGET_CHUNKS), vec![id.clone()]),
                Step::execute(on(&quarantine::FORGET_ENTRY), vec![id.clone()]),
                Step::fetch(on(&RELEASED), vec![id]),
            ]
        });
        let done = self.db.in_transaction(steps.collect()).await?;
        let mut moved = Vec::new();
        for steps in done.chunks(6) {
            if let [Done::Changed(1..), .., Done::Rows(rows)] = steps {
                if let Some(row) = rows.first() {
                    moved.push(use_from_row(row)?);
                }
            }
        }
        Ok(moved)
    }

    /// `template` with `{names}` replaced by a list of `names`, bound `times` over, in
    /// statements of at most [`NAMES_PER_STATEMENT`] names: the rows of every one.
    async fn per_names(
        &self,
        template: &str,
        names: &[BlobName],
        times: usize,
    ) -> Result<Vec<D::Row>, MetaError> {
        let mut found = Vec::new();
        for batch in names.chunks(NAMES_PER_STATEMENT) {
            let list = vec!["?"; batch.len()].join(", ");
            let params: Vec<Param> = (0..times)
                .flat_map(|_| batch.iter().map(|n| text(n.as_str())))
                .collect();
            found.extend(
                self.built_rows(&template.replace("{names}", &list), params)
                    .await?,
            );
        }
        Ok(found)
    }
}

/// What [`RestoreStore::record_uses`] adds to each repository's row: per repository, in
/// repository order, its name (empty: keep the known one), hits and misses. Every process then
/// takes the rows' locks in the same order, whatever mix of hits and misses its flush holds, so
/// two flushes never wait on each other in a cycle.
fn usage_additions(
    hits: impl IntoIterator<Item = (String, i64)>,
    misses: &[(RepoId, String, u64)],
) -> Vec<(String, String, i64, i64)> {
    let mut per: std::collections::BTreeMap<String, (String, i64, i64)> = Default::default();
    for (repository, count) in hits {
        per.entry(repository).or_default().1 += count;
    }
    for (repository, name, count) in misses {
        let added = per.entry(repository.as_str().to_owned()).or_default();
        if !name.is_empty() {
            added.0 = name.clone();
        }
        added.2 += stored_count(*count);
    }
    per.into_iter()
        .map(|(repository, (name, hits, misses))| (repository, name, hits, misses))
        .collect()
}

/// A string parameter.
fn text(value: &str) -> Param {
    Param::Text(value.to_owned())
}

/// The integer `n` of a statement's first row (a count or a sum); 0 without a row.
fn number_of(rows: &[impl SqlRow]) -> Result<u64, MetaError> {
    let n = rows.first().map(|r| r.opt_int("n")).transpose()?.flatten();
    Ok(n.unwrap_or(0).max(0) as u64)
}

#[async_trait]
impl<D: Dialect> Health for SqlxStore<D> {
    async fn ping(&self) -> Result<(), MetaError> {
        self.rows(shared!("SELECT 1 AS n"), Vec::new())
            .await
            .map(drop)
    }

    async fn checkpoint(&self) -> Result<(), MetaError> {
        // Commits are durable when they return.
        Ok(())
    }
}

#[async_trait]
impl<D: Dialect> SaveStore for SqlxStore<D> {
    async fn slot_state(&self, slot: &Slot, read: SlotRead) -> Result<SlotState, MetaError> {
        let live_since = match read {
            SlotRead::Reserve { live_since } => live_since,
            SlotRead::Finalize => return self.finalize_state(slot).await,
        };
        let hash = Param::Bytes(slot_hash(slot));
        static SLOT_STATE: Shared = Shared::built(|| {
            format!(
                "SELECT {},
                        CASE WHEN EXISTS (SELECT 1 FROM entries WHERE slot_hash = ?) THEN 1 ELSE 0 END AS entry_exists,
                        (SELECT COUNT(*) FROM uploads WHERE repository = ? AND state = 'open' AND created_at >= ?) AS live_open_uploads
                 FROM (SELECT 1 AS one) AS one LEFT JOIN uploads u ON u.slot_hash = ? AND u.state = 'open'",
                columns("u", UPLOAD)
            )
        });
        let rows = self
            .rows(
                &SLOT_STATE,
                vec![
                    hash.clone(),
                    text(slot.repository.as_str()),
                    Param::Int(live_since),
                    hash,
                ],
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| MetaError::Internal("the slot's state has no row".into()))?;
        let open = row
            .opt_int(uploads::id.name)?
            .map(|_| upload_from_row(row))
            .transpose()?;
        Ok(SlotState {
            open,
            entry_exists: row.int("entry_exists")? != 0,
            live_open_uploads: row.count("live_open_uploads")?,
            ..SlotState::default()
        })
    }

    async fn upload(
        &self,
        id: UploadId,
        read: UploadRead<'_>,
    ) -> Result<Option<UploadView>, MetaError> {
        static BY_ID: Shared = Shared::built(|| upload_with_blocks_sql("?", "u.id = ?"));
        let block = match read {
            UploadRead::Blocks => {
                let found = self.upload_and_blocks(&BY_ID, Param::Int(id.get())).await?;
                return Ok(found.map(|(upload, blocks)| UploadView {
                    upload,
                    blocks,
                    block: BlockState::default(),
                }));
            }
            UploadRead::Block(block) => block,
        };
        let params = vec![
            Param::Bytes(block.as_bytes().to_vec()),
            Param::Int(id.get()),
        ];
        let rows = self.rows(&BLOCK_STATE_SQL, params).await?;
        let found = rows.first().map(block_state_from_row).transpose()?;
        Ok(found.map(|(upload, block)| UploadView {
            upload,
            blocks: UploadBlocks::default(),
            block,
        }))
    }

    async fn create_upload(
        &self,
        new: NewUpload<'_>,
        replacing: Option<&Upload>,
    ) -> Result<UploadId, MetaError> {
        self.db.create_upload(new, replacing).await
    }

    async fn change_upload(
        &self,
        upload: &Upload,
        change: UploadChange<'_>,
        now: Millis,
    ) -> Result<(), MetaError> {
        match change {
            UploadChange::Stage { block, chunk } => {
                self.db.stage_block(upload, block, chunk, now).await
            }
            UploadChange::Commit(parts) => self.db.commit_parts(upload, parts, now).await,
            UploadChange::Abort => self.db.abort_upload(upload, now).await,
        }
    }

    async fn finalize(
        &self,
        upload: Option<&Upload>,
        new: NewEntry<'_>,
    ) -> Result<EntryId, MetaError> {
        self.db.finalize(upload, new).await
    }
}

#[async_trait]
impl<D: Dialect> RestoreStore for SqlxStore<D> {
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
        let sql = candidates_sql(scopes.len() * folded_keys.len(), D::placeholder);
        let mut params = Vec::with_capacity(scopes.len() * folded_keys.len() * 11);
        for scope in scopes {
            let bucket = bucket(repository, version, scope);
            for key in folded_keys {
                for prefix in [false, true] {
                    params.extend([
                        Param::Bytes(bucket.clone()),
                        text(repository.as_str()),
                        text(version.as_str()),
                        text(scope.as_str()),
                        text(key),
                    ]);
                    if prefix {
                        params.push(Param::Text(prefix_end(key)));
                    }
                }
            }
        }
        let rows = self.db.fetch(&sql, params).await?;
        rows.iter().map(candidate_from_row).collect()
    }

    async fn entry(
        &self,
        id: EntryId,
        state: EntryState,
    ) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        match state {
            EntryState::Live => self.live_entry(id).await,
            EntryState::Quarantined => self.quarantined_entry(id).await,
        }
    }

    async fn record_uses(&self, uses: &Uses) -> Result<(), MetaError> {
        let steps = record_restores_sql(&uses.restores, D::BACKEND)
            .into_iter()
            .map(|(sql, params)| Step::execute(sql, params))
            .collect();
        self.db.record_uses(uses, steps).await
    }
}

#[async_trait]
impl<D: Dialect> LifecycleStore for SqlxStore<D> {
    async fn usage(&self, of: UsageOf<'_>) -> Result<QuotaUsage, MetaError> {
        let (sql, params) = usage_sql(of);
        let rows = self.rows(sql, params).await?;
        quota_usage_from_row(rows.first())
    }

    async fn drop_restores(&self, which: RestoreDrop<'_>) -> Result<u64, MetaError> {
        let over = match each_repository_keeps(&which) {
            Some(keep) => {
                let rows = self
                    .rows(&RESTORE_HEAVY_REPOSITORIES, vec![Param::count(keep)])
                    .await?;
                rows.iter()
                    .map(|r| Ok(RepoId::new(r.text("repository")?)))
                    .collect::<Result<Vec<_>, MetaError>>()?
            }
            None => Vec::new(),
        };
        let mut dropped = 0;
        for statements in drop_restores_sql(&which, &over) {
            let steps = statements
                .into_iter()
                .map(|(sql, params)| Step::execute(sql.on(D::BACKEND), params))
                .collect();
            let done = self.db.in_transaction(steps).await?;
            dropped += done
                .iter()
                .map(|d| match d {
                    Done::Changed(n) => *n,
                    Done::Rows(_) => 0,
                })
                .sum::<u64>();
        }
        Ok(dropped)
    }

    async fn walk_entries(
        &self,
        walk: EntryWalk<'_>,
        limit: usize,
    ) -> Result<Vec<EntryUse>, MetaError> {
        let (sql, params) = walk_entries_sql(&walk, limit);
        let rows = self.rows(sql, params).await?;
        rows.iter().map(use_from_row).collect()
    }

    async fn move_entries(
        &self,
        ids: &[EntryId],
        change: EntryMove<'_>,
    ) -> Result<Vec<EntryUse>, MetaError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let removal = match change {
            EntryMove::Remove(removal) => removal,
            EntryMove::Release => return self.release(ids).await,
        };
        if removal.from == EntryState::Live {
            return self.db.remove_entries(ids, removal).await;
        }
        let steps = ids.iter().flat_map(|id| {
            let [read, rest @ ..] = quarantine::end(id.get(), removal.delete_at);
            std::iter::once(Step::fetch(read.0.on(D::BACKEND), read.1))
                .chain(rest.map(|(sql, params)| Step::execute(sql.on(D::BACKEND), params)))
        });
        let done = self.db.in_transaction(steps.collect()).await?;
        // Per entry, four steps: its row first, whether its row was forgotten last.
        let mut ended = Vec::new();
        for steps in done.chunks(4) {
            if let [Done::Rows(rows), .., Done::Changed(1..)] = steps {
                if let Some(row) = rows.first() {
                    ended.push(use_from_row(row)?);
                }
            }
        }
        Ok(ended)
    }

    async fn take_deletions(
        &self,
        done: &[BlobName],
        now: Millis,
        limit: usize,
    ) -> Result<Vec<BlobName>, MetaError> {
        let bound = vec![Param::Int(now), Param::Int(limit as i64)];
        let mut steps: Vec<Step> = done
            .chunks(NAMES_PER_STATEMENT)
            .map(|names| {
                let sql = format!(
                    "DELETE FROM pending_deletions WHERE blob_name IN ({})",
                    vec!["?"; names.len()].join(", ")
                );
                let params = names.iter().map(|n| text(n.as_str())).collect();
                Step::execute(D::BACKEND.spell(&sql), params)
            })
            .collect();
        // Nothing carried out (a dry run's only call): nothing to tidy either.
        if !done.is_empty() {
            steps.push(Step::execute(
                FORGET_SHARED_DELETIONS.on(D::BACKEND),
                bound.clone(),
            ));
        }
        steps.push(Step::fetch(DUE_DELETIONS.on(D::BACKEND), bound));
        match self.db.in_transaction(steps).await?.pop() {
            Some(Done::Rows(rows)) => names_from_rows(&rows),
            _ => Err(MetaError::Internal("the due deletions gave no rows".into())),
        }
    }

    async fn referenced(&self, names: &[BlobName]) -> Result<Vec<BlobName>, MetaError> {
        let tables = [
            "entry_chunks",
            "quarantined_chunks",
            "staged_blocks",
            "upload_parts",
            "pending_deletions",
        ];
        let sql = tables
            .map(|table| format!("SELECT blob_name FROM {table} WHERE blob_name IN ({{names}})"))
            .join(" UNION ");
        let rows = self.per_names(&sql, names, tables.len()).await?;
        names_from_rows(&rows)
    }

    async fn sweep_uploads(&self, sweep: UploadSweep) -> Result<SweptUploads, MetaError> {
        static PRUNE: Shared = Shared::new(
            "DELETE FROM uploads WHERE state IN ('finalized', 'aborted') AND created_at < ?",
        );
        static OPEN: Shared = Shared::new(
            "SELECT id FROM uploads WHERE state = 'open' AND created_at < ? ORDER BY created_at LIMIT ?",
        );
        let list = Step::fetch(
            OPEN.on(D::BACKEND),
            vec![
                Param::Int(sweep.open_before),
                Param::Int(sweep.limit as i64),
            ],
        );
        let steps = match sweep.prune_before {
            Some(before) => vec![
                Step::execute(PRUNE.on(D::BACKEND), vec![Param::Int(before)]),
                list,
            ],
            None => vec![list],
        };
        let done = self.db.in_transaction(steps).await?;
        let (pruned, rows) = match done.as_slice() {
            [Done::Changed(pruned), Done::Rows(rows)] => (*pruned, rows),
            [Done::Rows(rows)] => (0, rows),
            _ => return Err(MetaError::Internal("the upload sweep gave no rows".into())),
        };
        let open = rows
            .iter()
            .map(|r| r.read(uploads::id).map(UploadId::new))
            .collect::<Result<_, _>>()?;
        Ok(SweptUploads { open, pruned })
    }

    async fn record_digest(
        &self,
        entry: EntryId,
        sha256: &[[u8; 32]],
        digest: &str,
    ) -> Result<bool, MetaError> {
        // The chunks first, each only while the entry still awaits its digest, then the
        // digest: one transaction, so a reader sees both or neither.
        let mut steps: Vec<Step> = sha256
            .iter()
            .enumerate()
            .map(|(ordinal, sha256)| {
                Step::execute(
                    shared!(
                        "UPDATE entry_chunks SET sha256 = ? WHERE entry_id = ? AND ordinal = ?
                         AND entry_id IN (SELECT id FROM entries WHERE id = ? AND digest = '')"
                    )
                    .on(D::BACKEND),
                    vec![
                        Param::Bytes(sha256.to_vec()),
                        Param::Int(entry.get()),
                        Param::Int(ordinal as i64),
                        Param::Int(entry.get()),
                    ],
                )
            })
            .collect();
        steps.push(Step::execute(
            shared!("UPDATE entries SET digest = ? WHERE id = ? AND digest = ''").on(D::BACKEND),
            vec![text(digest), Param::Int(entry.get())],
        ));
        let done = self.db.in_transaction(steps).await?;
        Ok(matches!(done.last(), Some(Done::Changed(1))))
    }

    async fn forget_after(
        &self,
        since: Millis,
        now: Millis,
    ) -> Result<(usize, Vec<BlobName>), MetaError> {
        let since = Param::Int(since);
        let done = self
            .db
            .in_transaction(vec![
                Step::fetch(
                    shared!("SELECT blob_name FROM entry_chunks WHERE entry_id IN (SELECT id FROM entries WHERE created_at > ?)
                     UNION SELECT blob_name FROM staged_blocks WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')
                     UNION SELECT blob_name FROM upload_parts WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')").on(D::BACKEND),
                    vec![since.clone()],
                ),
                // Usage drops by what is forgotten: work in proportion to it, not to the
                // database.
                Step::execute(
                    shared!("UPDATE repository_usage SET
                         bytes = bytes - (SELECT COALESCE(SUM(e.size), 0) FROM entries e
                                          WHERE e.repository = repository_usage.repository AND e.created_at > ?),
                         entries = entries - (SELECT COUNT(*) FROM entries e
                                              WHERE e.repository = repository_usage.repository AND e.created_at > ?),
                         pr_bytes = pr_bytes - (SELECT COALESCE(SUM(e.size), 0) FROM entries e
                                                WHERE e.repository = repository_usage.repository AND e.created_at > ?
                                                  AND e.scope_class = 1),
                         pr_entries = pr_entries - (SELECT COUNT(*) FROM entries e
                                                    WHERE e.repository = repository_usage.repository AND e.created_at > ?
                                                      AND e.scope_class = 1)
                     WHERE repository IN (SELECT repository FROM entries WHERE created_at > ?)").on(D::BACKEND),
                    vec![since.clone(), since.clone(), since.clone(), since.clone(), since.clone()],
                ),
                Step::execute(
                    shared!("DELETE FROM entries WHERE created_at > ?").on(D::BACKEND), vec![since]),
                Step::execute(
                    shared!("DELETE FROM staged_blocks WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')").on(D::BACKEND),
                    Vec::new(),
                ),
                Step::execute(
                    shared!("DELETE FROM upload_parts WHERE upload_id IN (SELECT id FROM uploads WHERE state = 'open')").on(D::BACKEND),
                    Vec::new(),
                ),
                Step::execute(
                    shared!("UPDATE uploads SET state = 'aborted', revision = revision + 1, updated_at = ?,
                         staged_count = 0, staged_bytes = 0 WHERE state = 'open'").on(D::BACKEND),
                    vec![Param::Int(now)],
                ),
            ])
            .await?;
        let (Some(Done::Rows(names)), Some(Done::Changed(forgotten))) = (done.first(), done.get(2))
        else {
            return Err(MetaError::Internal(
                "a step of the transaction gave no answer".into(),
            ));
        };
        // UNION already made the names distinct.
        Ok((*forgotten as usize, names_from_rows(names)?))
    }
}

#[async_trait]
impl<D: Dialect> AdminStore for SqlxStore<D> {
    async fn select_entries(&self, page: &EntryPage<'_>) -> Result<EntrySelection, MetaError> {
        let (sql, params) = select_entries_sql(page, D::placeholder);
        let rows = self.db.fetch(&sql, params).await?;
        let entries = rows.iter().map(listed_from_row).collect::<Result<_, _>>()?;
        let total = match page.count {
            true => {
                let (sql, params) = count_entries_sql(page.filter, D::placeholder);
                Some(number_of(&self.db.fetch(&sql, params).await?)?)
            }
            false => None,
        };
        Ok(EntrySelection { entries, total })
    }

    async fn repositories(
        &self,
        only: Option<&str>,
        limit: usize,
    ) -> Result<Repositories, MetaError> {
        let mut steps = Vec::new();
        if limit > 0 {
            let (sql, params) = repositories_sql(only, limit, D::placeholder);
            steps.push(Step::fetch(sql, params));
        }
        steps.push(Step::fetch(TOTALS.on(D::BACKEND), Vec::new()));
        // One transaction: the page and the totals from one snapshot.
        let mut done = self.db.in_transaction(steps).await?;
        let totals = match done.pop() {
            Some(Done::Rows(rows)) => rows.first().map(totals_from_row).transpose()?,
            _ => None,
        };
        let totals = totals.ok_or_else(|| MetaError::Internal("the totals have no row".into()))?;
        let listed = match done.pop() {
            Some(Done::Rows(rows)) => rows
                .iter()
                .map(repository_from_row)
                .collect::<Result<_, _>>()?,
            _ => Vec::new(),
        };
        Ok(Repositories { listed, totals })
    }

    async fn restores(&self, query: &RestoreQuery) -> Result<Vec<RestoreRecord>, MetaError> {
        let (sql, params) = restores_sql(query, D::placeholder);
        let rows = self.db.fetch(&sql, params).await?;
        rows.iter().map(restore_from_row).collect()
    }
}

#[async_trait]
impl<D: Dialect> WebhookStore for SqlxStore<D> {
    async fn deliver(&self, delivery: &Delivery<'_>) -> Result<Delivered, MetaError> {
        use super::webhook_sql::Part;
        let statements = super::webhook_sql::delivery_statements(delivery);
        let parts: Vec<Part> = statements.iter().map(|(_, _, part)| *part).collect();
        let steps = statements
            .into_iter()
            .map(|(sql, params, part)| match part {
                Part::Check | Part::About => Step::fetch(sql.on(D::BACKEND), params),
                Part::Forget | Part::Record | Part::Fact => {
                    Step::execute(sql.on(D::BACKEND), params)
                }
            })
            .collect();
        let done = self.db.in_transaction(steps).await?;
        let (mut recorded, mut seen, mut known) = (false, false, Vec::new());
        for (part, done) in parts.iter().zip(&done) {
            match (part, done) {
                (Part::Record, Done::Changed(n)) => recorded |= *n > 0,
                (Part::Check, Done::Rows(rows)) => seen |= !rows.is_empty(),
                (Part::About, Done::Rows(rows)) => {
                    known = rows
                        .iter()
                        .map(super::webhook_sql::ref_from_row)
                        .collect::<Result<_, _>>()?
                }
                _ => {}
            }
        }
        let new = if delivery.record { recorded } else { !seen };
        Ok(if new {
            Delivered::New(known)
        } else {
            Delivered::Seen
        })
    }
}

/// The pool both dialects build: at most `pool.size` connections, waited for at most
/// `pool.acquire_timeout` (the whole wait: a pooled connection, its check, or a new one).
///
/// A connection is checked before it is handed out (`test_before_acquire`, sqlx's default,
/// kept on purpose): after the database restarted, every pooled connection is dead, and the
/// check replaces each one on its first use instead of failing one request per connection.
/// Connections older than the lifetime are replaced too, so a pool settles on a database that
/// moved (a fail-over behind the same name).
pub(super) fn pool_options<DB: ::sqlx::Database>(
    pool: PoolSettings,
) -> ::sqlx::pool::PoolOptions<DB> {
    ::sqlx::pool::PoolOptions::new()
        .max_connections(pool.size)
        .min_connections(1)
        .acquire_timeout(pool.acquire_timeout)
        .test_before_acquire(true)
        .idle_timeout(std::time::Duration::from_secs(300))
        .max_lifetime(std::time::Duration::from_secs(1800))
}

/// SQLSTATEs that say the connection is gone or the server cannot work now, not that the
/// statement is wrong: connection exceptions (class 08; MySQL's lost connection is 08S01), the
/// server shutting down or restarting (57P01 admin shutdown, 57P02 crash shutdown, 57P03
/// cannot connect now) and too many connections (53300).
fn is_unavailable_state(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300")
}

/// A driver error as a backend-neutral kind: a unique index refused the change (`Conflict`), the
/// database gave up on a transaction that may succeed if decided again (serialization failure
/// or deadlock, SQLSTATE 40001 and 40P01: `Stale`), or the connection failed or the server is
/// going down (`Unavailable`).
pub(super) fn from_sqlx(e: ::sqlx::Error) -> MetaError {
    use ::sqlx::Error;
    match &e {
        Error::Database(db) if db.is_unique_violation() => MetaError::Conflict,
        Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01")) => {
            MetaError::Stale
        }
        Error::Database(db) if db.code().is_some_and(|c| is_unavailable_state(&c)) => {
            MetaError::Unavailable(super::bounded(e.to_string()))
        }
        Error::Io(_)
        | Error::Tls(_)
        | Error::PoolTimedOut
        | Error::PoolClosed
        | Error::WorkerCrashed => MetaError::Unavailable(super::bounded(e.to_string())),
        _ => MetaError::Internal(super::bounded(e.to_string())),
    }
}

/// Binds a statement's parameters in order.
pub(super) fn bind_all<DB>(
    mut query: ::sqlx::query::Query<'_, DB, DB::Arguments>,
    params: Vec<Param>,
) -> ::sqlx::query::Query<'_, DB, DB::Arguments>
where
    DB: ::sqlx::Database,
    String: for<'t> ::sqlx::Encode<'t, DB> + ::sqlx::Type<DB>,
    i64: for<'t> ::sqlx::Encode<'t, DB> + ::sqlx::Type<DB>,
    Vec<u8>: for<'t> ::sqlx::Encode<'t, DB> + ::sqlx::Type<DB>,
    Option<i64>: for<'t> ::sqlx::Encode<'t, DB> + ::sqlx::Type<DB>,
{
    for param in params {
        query = match param {
            Param::Text(text) => query.bind(text),
            Param::Int(n) => query.bind(n),
            Param::Bytes(bytes) => query.bind(bytes),
            Param::Null => query.bind(None::<i64>),
        };
    }
    query
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_server_going_away_is_unavailable_and_a_bad_statement_is_not() {
        for code in ["08006", "08S01", "57P01", "57P02", "57P03", "53300"] {
            assert!(super::is_unavailable_state(code), "{code}");
        }
        for code in ["42601", "23505", "40001", "57014", "22P02"] {
            assert!(!super::is_unavailable_state(code), "{code}");
        }
    }
}
