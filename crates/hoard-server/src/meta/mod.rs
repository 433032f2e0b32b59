//! Metadata: entries, upload reservations and their blocks, on SQLite, PostgreSQL or
//! MySQL/MariaDB.
//!
//! A store loads state and applies changes that the domain (`cache`) decided; it decides
//! nothing itself: no conflict rule, cap or size check lives in SQL.
//!
//! # Contract
//! Every method is atomic (one transaction inside); callers never see transactions.
//! - Loads return a consistent snapshot.
//! - A change to an upload is applied only if the upload is still open at the revision the
//!   caller loaded ([`Upload::revision`]); otherwise nothing changes and the method returns
//!   [`MetaError::Stale`], and the caller decides again on fresh state. Every applied change
//!   bumps the revision.
//! - At most one open upload and at most one entry exist per [`Slot`] (repository, scope,
//!   folded key, version). A change that would make a second one returns
//!   [`MetaError::Conflict`] and changes nothing, whichever process or replica raced it.
//! - An entry becomes visible to [`RestoreStore::find_candidates`] only through
//!   [`SaveStore::finalize`], and then with all its chunks.
//! - Keys compare byte-wise on their folded form, identically on every backend, so prefix
//!   matching gives the same answer everywhere.
//! - Errors are backend-neutral kinds; no driver type crosses this module's boundary.

#[macro_use]
mod timed;
mod dialect;
mod hashes;
/// Each database's migrations, listed by `build.rs` from its folder.
mod migrations {
    include!(concat!(env!("OUT_DIR"), "/migrations.rs"));
}
mod quarantine;
mod row;
mod schema;
#[cfg(any(test, feature = "test-util"))]
mod schema_check;
mod sql;
mod sqlite;
mod sqlx;
mod stats_sql;
mod webhook_sql;

use async_trait::async_trait;

pub use self::sqlx::{MySqlStore, PostgresStore};
#[cfg(any(test, feature = "test-util"))]
pub use schema_check::schema_disagreements;
/// SQLite's virtual-machine steps for some work on this thread (tests of how work grows).
#[cfg(test)]
pub(crate) use sqlite::count_vm_steps;
pub use sqlite::SqliteStore;
pub use timed::Timed;

pub use crate::model::RestoreQuery;
use crate::model::RestoreRecord;
use crate::model::{
    BlobName, BlockId, Candidate, Chunk, Entry, EntryId, EntryUse, Millis, Provenance, QuotaUsage,
    RefClass, RemovalCause, RepoId, Scope, ScopeClass, Slot, Upload, UploadBlocks, UploadId,
    Version,
};
use crate::model::{Counters, StatsKey, StatsQuery, StatsRow, StoredFamily};
use crate::model::{
    EntryFilter, EntryOrder, EntryPage, EntryRecord, EntrySelection, RepositoryUsage, Totals,
};

#[derive(Debug, Clone, thiserror::Error)]
pub enum MetaError {
    /// Another writer holds the slot: an open upload or an entry already exists.
    #[error("another upload or entry already holds this key and version")]
    Conflict,
    /// The upload changed (or closed) since it was loaded; decide again on fresh state.
    #[error("the upload changed since it was read")]
    Stale,
    /// The database could not be reached or refused to work.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    #[error("the database holds a value this server cannot read: {0}")]
    Corrupt(String),
    /// Any other failure of the database, described.
    #[error("database error: {0}")]
    Internal(String),
}

/// A driver's error message, cut to a length fit for a log line and an error value: some
/// drivers quote the whole statement, which a large lookup makes long.
pub(crate) fn bounded(message: String) -> String {
    if message.len() <= crate::model::LogSafe::MAX {
        return message;
    }
    crate::model::LogSafe(&message).to_string()
}

/// A new reservation.
#[derive(Debug, Clone)]
pub struct NewUpload<'a> {
    pub slot: &'a Slot,
    /// Who reserved it: kept, and copied to the entry it becomes.
    pub written_by: &'a Provenance,
    pub now: Millis,
}

/// What [`SaveStore::slot_state`] reads about a slot: what the decision at hand needs, and
/// nothing more (a reservation is on the hot path of every save).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRead {
    /// Deciding a reservation: whether an entry holds the slot, its open upload, and how many
    /// uploads of its repository are open and were created at or after `live_since`.
    Reserve { live_since: Millis },
    /// Deciding a finalize: the open upload with its blocks, else the entry that the slot's
    /// newest finalized upload made (for an idempotent retry).
    Finalize,
}

/// A slot's state as a [`SlotRead`] asked for it; what it did not ask for is left empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotState {
    /// The open upload holding the slot, if any.
    pub open: Option<Upload>,
    /// [`SlotRead::Finalize`]: the open upload's blocks.
    pub blocks: UploadBlocks,
    /// [`SlotRead::Reserve`]: a visible entry holds the slot.
    pub entry_exists: bool,
    /// [`SlotRead::Reserve`]: open uploads of the repository created at or after `live_since`.
    pub live_open_uploads: u64,
    /// [`SlotRead::Finalize`], when no upload is open: the entry of the newest finalized upload
    /// of the slot and its size, if it still exists.
    pub finalized: Option<(EntryId, u64)>,
}

/// What [`SaveStore::upload`] reads with an upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadRead<'a> {
    /// Its blocks, staged and committed, whole.
    Blocks,
    /// The [`BlockState`] of one block, in work independent of how many blocks the upload has
    /// (a Put Block costs the same at its ten-thousandth block as at its first).
    Block(&'a BlockId),
}

/// An upload as an [`UploadRead`] asked for it; what it did not ask for is left empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadView {
    pub upload: Upload,
    /// [`UploadRead::Blocks`]: its blocks.
    pub blocks: UploadBlocks,
    /// [`UploadRead::Block`]: the block's state.
    pub block: BlockState,
}

/// What staging one block is decided on, read without the upload's other blocks (so a Put Block
/// costs the same at its ten-thousandth block as at its first): how many blocks are staged and
/// their bytes, kept with the upload by every change to its blocks, and the staged copy of the
/// block being put, if any (a retry replaces it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockState {
    pub staged_count: u64,
    pub staged_bytes: u64,
    pub copy: Option<Chunk>,
    /// Whether a committed part refers to the same blob as `copy` (then replacing the copy
    /// frees nothing).
    pub copy_committed: bool,
}

impl BlockState {
    /// The state of `block` in blocks loaded whole: what [`UploadRead::Block`] answers.
    pub fn of(blocks: &UploadBlocks, block: &BlockId) -> Self {
        let copy = blocks.staged.get(block).cloned();
        let copy_committed = copy
            .as_ref()
            .is_some_and(|c| blocks.parts.iter().any(|(_, p)| p.blob == c.blob));
        Self {
            staged_count: blocks.staged.len() as u64,
            staged_bytes: blocks.staged.values().map(|c| c.size).sum(),
            copy,
            copy_committed,
        }
    }
}

/// A change to an open upload's blocks or state.
#[derive(Debug, Clone, Copy)]
pub enum UploadChange<'a> {
    /// Records `chunk` as the staged copy of `block`, replacing an earlier copy.
    Stage {
        block: &'a BlockId,
        chunk: &'a Chunk,
    },
    /// Makes these the upload's committed parts, in order, and drops every staged block.
    Commit(&'a [(BlockId, Chunk)]),
    /// Aborts the upload and drops its blocks.
    Abort,
}

/// An entry to insert: the slot's open upload becomes it.
#[derive(Debug, Clone)]
pub struct NewEntry<'a> {
    pub slot: &'a Slot,
    /// The key as the client spelled it at reservation.
    pub key: &'a str,
    /// The repository's name (owner/name) if the caller's identity carries one: kept so that
    /// operators see names, not numbers. An empty name leaves a known one alone.
    pub repository_name: &'a str,
    pub chunks: &'a [Chunk],
    /// What the entry keeps of its writer, digest and origin, as a listing shows it again.
    pub record: EntryRecord,
    /// The entry's class, as the domain decided it ([`ScopeClass::of`] its scope): kept with
    /// the entry and counted in its repository's usage.
    pub scope_class: ScopeClass,
    /// Its key family and the class of the saver's ref (see [`crate::model::family`]).
    pub family: &'a str,
    pub ref_class: RefClass,
    pub now: Millis,
}

impl<'a> NewEntry<'a> {
    /// The entry of `chunks` in `slot` at `now`, with nothing known beyond them: the key as the
    /// slot folds it, no repository name, an empty record, no family, the slot's class, saved
    /// from the default branch. Tests and imports set what they need on top
    /// (`NewEntry { family, ..NewEntry::new(slot, chunks, now) }`), so a new field touches them
    /// only where they care.
    pub fn new(slot: &'a Slot, chunks: &'a [Chunk], now: Millis) -> Self {
        Self {
            slot,
            key: slot.key.as_str(),
            repository_name: "",
            chunks,
            record: EntryRecord::default(),
            scope_class: ScopeClass::of(&slot.scope),
            family: "",
            ref_class: RefClass::DefaultBranch,
            now,
        }
    }
}

/// A stored chunk of an entry, with its byte offset in the entry.
#[derive(Debug, Clone)]
pub struct EntryChunk {
    pub start: u64,
    pub chunk: Chunk,
}

impl EntryChunk {
    /// `chunks` laid end to end, in order: each with the offset at which it starts.
    pub fn place(chunks: &[Chunk]) -> Vec<EntryChunk> {
        Self::starts(chunks)
            .map(|(start, chunk)| EntryChunk {
                start,
                chunk: chunk.clone(),
            })
            .collect()
    }

    /// [`EntryChunk::place`] without copying the chunks: each with its offset.
    pub fn starts(chunks: &[Chunk]) -> impl Iterator<Item = (u64, &Chunk)> {
        chunks.iter().scan(0, |start, chunk| {
            let at = *start;
            *start += chunk.size;
            Some((at, chunk))
        })
    }
}

/// Readers kept per entry in its restore records: the most recent ones (the entry's hit count
/// counts every restore).
pub const MAX_READERS_PER_ENTRY: usize = 50;

/// Restores of one entry by one reader, as the bookkeeping folded them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRestore {
    pub entry: EntryId,
    pub reader: Provenance,
    pub count: u64,
    pub first_at: Millis,
    pub last_at: Millis,
}

/// Where an entry is kept: among the live entries that lookups see, or in quarantine (out of
/// every lookup, kept for examination).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    Live,
    Quarantined,
}

/// Restores and lookups to record, as the bookkeeping folded them since its last write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uses {
    /// Per entry: restores to add to its hits and its latest use, also counted for the entry's
    /// repository. Entries that no longer exist are skipped.
    pub hits: Vec<(EntryId, u64, Millis)>,
    /// Per entry and reader: restores and when, added to what the reader's record holds; each
    /// entry keeps its [`MAX_READERS_PER_ENTRY`] most recent readers. Entries that no longer
    /// exist are skipped.
    pub restores: Vec<NewRestore>,
    /// Per repository: its name (as in [`NewEntry`]) and lookups that found nothing.
    pub misses: Vec<(RepoId, String, u64)>,
}

impl Uses {
    pub fn is_empty(&self) -> bool {
        self.hits.is_empty() && self.restores.is_empty() && self.misses.is_empty()
    }
}

/// Whose bytes [`LifecycleStore::usage`] counts.
#[derive(Debug, Clone, Copy)]
pub enum UsageOf<'a> {
    /// One repository's entries: what its quota weighs.
    Repository(&'a RepoId),
    /// Every entry: what `--max-storage` weighs.
    Everything,
    /// Chunks whose deletion is scheduled but not yet done: space about to come back (no
    /// pull-request share).
    PendingDeletions,
}

/// Which restore records to forget.
#[derive(Debug, Clone, Copy)]
pub enum RestoreDrop<'a> {
    /// Those whose latest restore is before this instant.
    LastRestoredBefore(Millis),
    /// Up to `limit` of those past the `keep` most recent (by latest restore, then id: the
    /// oldest go first), of what `of` bounds.
    Oldest {
        of: RestoreBound<'a>,
        keep: u64,
        limit: usize,
    },
    /// Every record of these entries, whether or not the entries still exist.
    OfEntries(&'a [EntryId]),
}

/// Which restore records a bound on their number ([`RestoreDrop::Oldest`]) counts together.
#[derive(Debug, Clone, Copy)]
pub enum RestoreBound<'a> {
    /// One repository's.
    Repository(&'a RepoId),
    /// Each repository's on its own (`--max-restore-records-per-repository`): up to the limit
    /// from each.
    EachRepository,
    /// Every record (`--max-restore-records`).
    All,
}

/// Which entries a lifecycle pass visits, and in what order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryWalk<'a> {
    /// Least recently used first (then oldest id), of one repository or of all: eviction.
    LeastRecentlyUsed(Option<&'a RepoId>),
    /// Least recently used first (then oldest id), of one class of a repository.
    LeastRecentlyUsedOfClass(&'a RepoId, ScopeClass),
    /// Last used before `unused_before`, or created before `created_before`: expiry.
    Expired {
        unused_before: Millis,
        created_before: Option<Millis>,
    },
    /// Every entry with an id above `after`, by id: the integrity pass.
    All { after: EntryId },
    /// Entries whose digest is not recorded yet, with an id above `after`, by id: the digest
    /// pass.
    AwaitingDigest { after: EntryId },
    /// Entries in quarantine since before `before`, with an id above `after`, by id: those
    /// whose quarantine is over.
    QuarantinedBefore { before: Millis, after: EntryId },
}

/// How entries leave: why, when, and when their chunks may be deleted (after every reader that
/// could have started has finished).
#[derive(Debug, Clone)]
pub struct Removal<'a> {
    /// Where the entries are kept now. Live entries leave every lookup: into quarantine if the
    /// cause is one, else their chunks are scheduled for deletion. Quarantined entries leave
    /// for good, whatever the cause: their chunks are scheduled for deletion.
    pub from: EntryState,
    pub cause: &'a RemovalCause,
    pub now: Millis,
    pub delete_at: Millis,
}

/// How [`LifecycleStore::move_entries`] moves entries.
#[derive(Debug, Clone)]
pub enum EntryMove<'a> {
    /// Out of where `from` says: live entries leave every lookup (into quarantine with its
    /// chunks if the cause is one, else their chunks are scheduled for deletion at
    /// `delete_at`); quarantined entries leave for good.
    Remove(Removal<'a>),
    /// Back from quarantine among the live entries, with their ids, chunks and counts.
    /// [`MetaError::Conflict`] (and nothing moves) if a live entry holds the slot of one.
    Release,
}

/// What [`LifecycleStore::sweep_uploads`] prunes and lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadSweep {
    /// Open uploads created before this are listed.
    pub open_before: Millis,
    pub limit: usize,
    /// Finalized and aborted uploads created before this are deleted first.
    pub prune_before: Option<Millis>,
}

/// What a sweep of the uploads found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweptUploads {
    /// The open uploads listed, oldest first.
    pub open: Vec<UploadId>,
    /// How many closed uploads were deleted.
    pub pruned: u64,
}

/// A page of the repositories, and the totals of all (see [`AdminStore::repositories`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Repositories {
    pub listed: Vec<RepositoryUsage>,
    pub totals: Totals,
}

/// What a webhook delivery says about a commit ([`RefFact`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefKind {
    /// A merge group's head: `git_ref` is the group's branch, `base_ref` the branch it merges
    /// into.
    MergeGroup,
    /// A push: `sha` is the branch `git_ref`'s new head.
    Push,
    /// A pull request's head: `git_ref` is its merge ref (`refs/pull/N/merge`).
    PullHead,
}

impl RefKind {
    pub fn code(self) -> i64 {
        match self {
            Self::MergeGroup => 1,
            Self::Push => 2,
            Self::PullHead => 3,
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(Self::MergeGroup),
            2 => Some(Self::Push),
            3 => Some(Self::PullHead),
            _ => None,
        }
    }
}

/// A commit of a repository as a webhook delivery named it, and when it was first heard of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefFact {
    pub repository: RepoId,
    pub sha: String,
    pub kind: RefKind,
    pub git_ref: String,
    /// [`RefKind::MergeGroup`]: the branch it merges into; empty otherwise.
    pub base_ref: String,
    pub received_at: Millis,
}

/// A webhook delivery to record ([`WebhookStore::deliver`]).
#[derive(Debug, Clone)]
pub struct Delivery<'a> {
    /// What it is known by: GitHub's id for it (`X-GitHub-Delivery`, which a redelivery keeps)
    /// and the digest of its signed body (the same delivery replayed under another id).
    pub keys: &'a [String],
    /// Record it as received (once what it asks is done); else only ask whether it was.
    pub record: bool,
    pub now: Millis,
    /// What it says, to keep (a fact known already keeps its first time).
    pub facts: &'a [RefFact],
    /// The commit (repository, sha) whose known facts to answer, if any.
    pub about: Option<(&'a RepoId, &'a str)>,
    /// Deliveries and facts received before this are forgotten (once per delivery is enough).
    pub forget_before: Option<Millis>,
}

/// What [`WebhookStore::deliver`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// Received before (recorded under one of its keys): nothing to apply.
    Seen,
    /// Not received before: what is known about the commit asked about (its own facts
    /// included), oldest first.
    New(Vec<RefFact>),
}

/// What every store answers: whether the database is there, and durability.
#[async_trait]
pub trait Health: Send + Sync + std::fmt::Debug + 'static {
    /// Checks that the database answers.
    async fn ping(&self) -> Result<(), MetaError>;

    /// Makes recent changes durable and compact (SQLite: a WAL checkpoint; a no-op for
    /// networked databases, whose commits are durable). Called by the durability loop right
    /// after the blob store synced.
    async fn checkpoint(&self) -> Result<(), MetaError>;

    /// Resolves when the store wants [`Health::checkpoint`] before the next interval
    /// (SQLite: its write-ahead log grew past its soft bound). Never, for the others.
    async fn wants_checkpoint(&self) {
        std::future::pending::<()>().await
    }
}

store_trait! {
    /// Saving: reservations, their blocks, and the finalize that makes an entry.
    pub trait SaveStore {
        /// What `read` asks about the slot, read in one snapshot.
        async fn slot_state(&self, slot: &Slot, read: SlotRead) -> Result<SlotState, MetaError>;

        /// An upload, in whatever state, with what `read` asks of its blocks, read together.
        async fn upload(&self, id: UploadId, read: UploadRead<'_>) -> Result<Option<UploadView>, MetaError>;

        /// Inserts an open upload for the slot, first aborting `replacing` (an abandoned upload
        /// of the same slot, at the revision loaded) and dropping its blocks. `Conflict` if the
        /// slot already has an open upload; `Stale` if `replacing` changed.
        async fn create_upload(&self, new: NewUpload<'_>, replacing: Option<&Upload>)
            -> Result<UploadId, MetaError>;

        /// Applies `change` to the open upload, at the revision loaded (else `Stale`).
        async fn change_upload(&self, upload: &Upload, change: UploadChange<'_>, now: Millis)
            -> Result<(), MetaError>;

        /// Turns the open upload into a visible entry made of `entry.chunks`, and drops the
        /// upload's blocks; without an upload, makes the entry of chunks stored already (a
        /// promotion: the chunks of another entry, which both then name). `Conflict` if an
        /// entry already holds the slot.
        async fn finalize(&self, upload: Option<&Upload>, entry: NewEntry<'_>) -> Result<EntryId, MetaError>;
    }
}

store_trait! {
    /// Restoring: lookups, the entries they name, and the record of hits and misses.
    pub trait RestoreStore {
        /// For each (scope, key) pair, the exact match and the newest prefix match (by creation
        /// time, then id) of `version` in `repository`: a bounded superset of what
        /// `matching::best_match` needs. `folded_keys` are already folded.
        async fn find_candidates(&self, repository: &RepoId, version: &Version, scopes: &[Scope], folded_keys: &[String])
            -> Result<Vec<Candidate>, MetaError>;

        /// The entry `id` where `state` says it is kept, and its chunks in order, read together.
        async fn entry(&self, id: EntryId, state: EntryState) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError>;

        /// Records what the bookkeeping folded since its last write ([`Uses`]), all or
        /// nothing.
        async fn record_uses(&self, uses: &Uses) -> Result<(), MetaError>;
    }
}

store_trait! {
    /// The lifecycle: usage and limits, eviction and expiry, deferred deletions, references for
    /// garbage collection, abandoned uploads, integrity walks and crash recovery.
    pub trait LifecycleStore {
        /// The bytes `of` names, and of the pull-request and tag entries among them.
        async fn usage(&self, of: UsageOf<'_>) -> Result<QuotaUsage, MetaError>;

        /// Forgets the restore records `which` names, in one transaction (one per repository for
        /// [`RestoreBound::EachRepository`]); how many.
        async fn drop_restores(&self, which: RestoreDrop<'_>) -> Result<u64, MetaError>;

        /// Up to `limit` of the entries `walk` visits, in its order.
        async fn walk_entries(&self, walk: EntryWalk<'_>, limit: usize) -> Result<Vec<EntryUse>, MetaError>;

        /// Moves those of `ids` that are where `change` takes them from (see [`EntryMove`]), in
        /// one transaction. Returns the entries moved, so that two processes moving the same
        /// entry count it once.
        async fn move_entries(&self, ids: &[EntryId], change: EntryMove<'_>) -> Result<Vec<EntryUse>, MetaError>;

        /// Forgets the scheduled deletions in `done` (carried out), then returns up to `limit`
        /// chunks whose scheduled deletion is due at `now` and that no entry, live or
        /// quarantined, names (a promoted entry shares its source's chunks): the deletion
        /// queue, acknowledged and taken in one call. Without `done`, it changes nothing.
        async fn take_deletions(&self, done: &[BlobName], now: Millis, limit: usize) -> Result<Vec<BlobName>, MetaError>;

        /// Those of `names` that any upload, entry or scheduled deletion refers to.
        async fn referenced(&self, names: &[BlobName]) -> Result<Vec<BlobName>, MetaError>;

        /// First deletes the closed uploads `sweep` prunes (they hold no blocks), then lists up
        /// to `sweep.limit` of the open ones it names, oldest first.
        async fn sweep_uploads(&self, sweep: UploadSweep) -> Result<SweptUploads, MetaError>;

        /// Records the SHA-256 of each of the entry's chunks, in order, and the entry's digest,
        /// unless one is recorded already; an entry removed meanwhile is skipped. True if this
        /// call recorded it.
        async fn record_digest(&self, entry: EntryId, sha256: &[[u8; 32]], digest: &str) -> Result<bool, MetaError>;

        /// After a machine crash: deletes the entries finalized after `since` and aborts every
        /// open upload. Returns how many entries went and the blobs of the dropped rows.
        async fn forget_after(&self, since: Millis, now: Millis) -> Result<(usize, Vec<BlobName>), MetaError>;
    }
}

store_trait! {
    /// Administration: what operators list and count, and the totals metrics report.
    pub trait AdminStore {
        /// A page of the entries that `page.filter` selects (live or quarantined), in `page`'s
        /// order, and with `page.count` how many it selects in all: the operators' listings and
        /// counts, and the v1 listing of a key (`GET caches?key=`).
        async fn select_entries(&self, page: &EntryPage<'_>) -> Result<EntrySelection, MetaError>;

        /// Every repository the store has seen (one whose entries all went stays, with zero
        /// bytes), most bytes first, then by id; at most `limit` (none: only the totals), only
        /// the one `only` names (by id or name) if given. With them, what the store holds in
        /// all ([`Totals`]: bytes, entries and repositories, whatever `only` and `limit` say,
        /// and open uploads), read in one snapshot.
        async fn repositories(&self, only: Option<&str>, limit: usize) -> Result<Repositories, MetaError>;

        /// Restore records, most recent first, at most `query.limit`: of the entries named, or of
        /// every entry written under `query.written_under` (its repository, scope, writer and
        /// time window: the blast radius of a writer), whether or not the entry still exists.
        async fn restores(&self, query: &RestoreQuery) -> Result<Vec<RestoreRecord>, MetaError>;
    }
}

store_trait! {
    /// Statistics: counts per repository × key family × ref class × hour (then day), the
    /// families kept per repository, and the server's totals. The domain (`cache::stats`)
    /// decides which families are kept; the store only loads and adds.
    pub trait StatsStore {
        /// Keeps `keep` for `repository` (those already kept stay as they are), then answers
        /// which of `asked` it keeps and how many it keeps in all.
        async fn families(&self, repository: &RepoId, keep: &[String], asked: &[String], now: Millis)
            -> Result<(Vec<String>, u64), MetaError>;

        /// Adds `counts` (hour buckets, sorted, so that every process takes row locks in the
        /// same order) to the rows of their repository, family, class and hour, and to the
        /// server's rows of their class and hour. All or nothing.
        async fn record_stats(&self, counts: &[(StatsKey, Counters)]) -> Result<(), MetaError>;

        /// The rows `query.filter` selects, summed as `query.rows` says.
        async fn stats(&self, query: &StatsQuery<'_>) -> Result<Vec<StatsRow>, MetaError>;

        /// Bytes and entries stored now per repository (or only `repository`), family and class;
        /// entries whose family is not kept count as [`crate::model::stats::OTHER_FAMILY`].
        async fn stored_by_family(&self, repository: Option<&RepoId>) -> Result<Vec<StoredFamily>, MetaError>;

        /// Folds the hour rows of days before `hours_before` (a day's start) into day rows,
        /// drops day rows before `days_before`, and forgets families kept since before
        /// `families_before` that no row names any more. Returns the rows folded and dropped.
        async fn fold_stats(&self, hours_before: Millis, days_before: Millis, families_before: Millis)
            -> Result<(u64, u64), MetaError>;
    }
}

store_trait! {
    /// GitHub's webhooks: the deliveries received and what they said about commits.
    pub trait WebhookStore {
        /// In one transaction: forgets what was received before `delivery.forget_before` (if
        /// given),
        /// records the delivery's keys (with `delivery.record`; else reads whether one was),
        /// records its facts (a fact known already keeps its first time, so a redelivery,
        /// which says the same, changes nothing), then answers what is known about
        /// `delivery.about`. [`Delivered::Seen`] for a delivery recorded before under any of
        /// its keys.
        async fn deliver(&self, delivery: &Delivery<'_>) -> Result<Delivered, MetaError>;
    }
}

/// A whole metadata store: what `Cache` holds. Every backend is one, through the blanket
/// implementation; a caller that needs only a part takes that trait (`&dyn LifecycleStore`).
pub trait MetaStore:
    Health + SaveStore + RestoreStore + LifecycleStore + AdminStore + StatsStore + WebhookStore
{
}

impl<T> MetaStore for T where
    T: Health + SaveStore + RestoreStore + LifecycleStore + AdminStore + StatsStore + WebhookStore
{
}

/// How a networked database's connections are pooled (`--database-pool-size`,
/// `--database-acquire-timeout`); SQLite has no pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// Connections this process may hold.
    pub size: u32,
    /// How long an operation waits for a connection (one from the pool, checked, or a new
    /// one) before it fails as [`MetaError::Unavailable`]: a database that is down or hangs
    /// costs each request this long, not the driver's default of 10 s.
    pub acquire_timeout: std::time::Duration,
}

impl PoolSettings {
    /// `size` connections, waited for as long as `--database-acquire-timeout` does by default.
    pub fn of(size: u32) -> Self {
        Self {
            size,
            acquire_timeout: std::time::Duration::from_secs(2),
        }
    }
}

/// Opens the store a database URL names (`sqlite://PATH`, `postgres://…`, `mysql://…`) with
/// `pool_size` connections and brings its schema up to date.
pub async fn open(
    url: &DatabaseUrl,
    pool_size: u32,
) -> Result<std::sync::Arc<dyn MetaStore>, MetaError> {
    open_with(url, PoolSettings::of(pool_size)).await
}

/// [`open`], with the pool configured by `pool`.
pub async fn open_with(
    url: &DatabaseUrl,
    pool: PoolSettings,
) -> Result<std::sync::Arc<dyn MetaStore>, MetaError> {
    Ok(match url {
        DatabaseUrl::Sqlite(path) => std::sync::Arc::new(SqliteStore::open(path).await?),
        DatabaseUrl::Postgres(url) => std::sync::Arc::new(PostgresStore::open(url, pool).await?),
        DatabaseUrl::MySql(url) => std::sync::Arc::new(MySqlStore::open(url, pool).await?),
    })
}

/// A validated `--database-url`. Its `Debug` is [`DatabaseUrl::redacted`]: no password.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    Sqlite(std::path::PathBuf),
    /// `postgres://` or `postgresql://`, passed to the driver as given.
    Postgres(String),
    /// `mysql://` (MySQL 8 and MariaDB 10.11+), passed to the driver as given.
    MySql(String),
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl DatabaseUrl {
    /// Parses a URL; the error is a sentence fit for the operator.
    pub fn parse(url: &str) -> Result<Self, String> {
        let scheme = url.split(':').next().unwrap_or(url).to_ascii_lowercase();
        match scheme.as_str() {
            "sqlite" => {
                let path = url
                    .strip_prefix("sqlite://")
                    .or_else(|| url.strip_prefix("sqlite:"))
                    .unwrap_or("");
                let path = path.split('?').next().unwrap_or(path);
                if path.is_empty() {
                    return Err("names no database file".into());
                }
                Ok(Self::Sqlite(path.into()))
            }
            "postgres" | "postgresql" | "mysql" | "mariadb" => {
                let parsed = url::Url::parse(url).map_err(|e| format!("is not a URL ({e})"))?;
                if parsed.host_str().is_none_or(str::is_empty) {
                    return Err("names no host".into());
                }
                if parsed.path().trim_start_matches('/').is_empty() {
                    return Err("names no database (…/DBNAME)".into());
                }
                Ok(match scheme.as_str() {
                    "postgres" | "postgresql" => Self::Postgres(url.to_owned()),
                    // sqlx knows MariaDB by the MySQL scheme.
                    _ => Self::MySql(format!("mysql{}", &url[scheme.len()..])),
                })
            }
            other => Err(format!(
                "must be sqlite://PATH, postgres://… or mysql://…; {other:?} is not supported"
            )),
        }
    }

    /// The URL with any password replaced by `***`, for logs.
    pub fn redacted(&self) -> String {
        match self {
            Self::Sqlite(path) => format!("sqlite://{}", path.display()),
            Self::Postgres(url) | Self::MySql(url) => match url::Url::parse(url) {
                Ok(mut u) => {
                    if u.password().is_some() {
                        let _ = u.set_password(Some("***"));
                    }
                    u.to_string()
                }
                Err(_) => "(unparseable URL)".into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn driver_messages_are_bounded() {
        assert_eq!(super::bounded("short".into()), "short");
        let long = format!("near \"x\": syntax error in SELECT {}", "é".repeat(5000));
        let cut = super::bounded(long.clone());
        assert!(cut.len() < 400, "{}", cut.len());
        assert!(cut.ends_with(&format!("({} bytes)", long.len())), "{cut}");
    }
}
