//! Metadata: entries, upload reservations and their chunks.
//!
//! # Contract
//! Every method is one atomic change (one transaction inside); callers never see transactions.
//! - An entry becomes visible to [`MetaStore::find_candidates`] only through
//!   [`MetaStore::finalize`], and then with all its chunks.
//! - At most one open upload and at most one entry exist per (repository, scope, folded key,
//!   version); [`MetaStore::reserve`] checks and inserts atomically, so concurrent reservations of
//!   the same identity see exactly one winner.
//! - Methods that drop chunk references return the blob names no row refers to any more; the
//!   caller deletes those blobs after the method returned (the change is durable by then).

mod sqlite;

use async_trait::async_trait;

pub use sqlite::SqliteStore;

use crate::cache::matching::Candidate;
use crate::cache::model::{
    BlobName, BlockId, CacheKey, Chunk, Entry, EntryId, Millis, RepoId, Scope, Upload, UploadId,
    Version,
};
use crate::cache::upload::{BlockRef, UnknownBlock};

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("database error: {0}")]
    Database(#[from] rusqlite::Error),
    #[error("database worker: {0}")]
    Worker(String),
    #[error("the database holds a value this server cannot read: {0}")]
    Corrupt(String),
}

/// A new reservation.
#[derive(Debug, Clone)]
pub struct NewUpload<'a> {
    pub repository: &'a RepoId,
    pub scope: &'a Scope,
    pub key: &'a CacheKey,
    pub version: &'a Version,
    /// Who reserved it (token subject), kept for audit.
    pub created_by: &'a str,
    pub now: Millis,
    /// Open reservations created before this instant are abandoned and give way.
    pub stale_before: Millis,
    /// Live open uploads the repository may have; at this many, the reservation is refused.
    pub max_open: u32,
}

#[derive(Debug)]
pub enum Reserved {
    /// Reserved; blobs of an abandoned reservation it replaced are returned for deletion.
    Created {
        upload: UploadId,
        garbage: Vec<BlobName>,
    },
    /// An entry or a live reservation already holds this identity.
    Conflict,
    /// The repository already has `max_open` live open uploads.
    TooManyOpen,
}

/// What staging a block did.
#[derive(Debug)]
pub enum Staged {
    /// Recorded; blobs of earlier copies of the same block id are returned for deletion.
    Recorded { garbage: Vec<BlobName> },
    /// The upload is unknown or no longer open; the caller must delete the new blob.
    UploadClosed,
    /// The upload's staged blocks would exceed `max_staged` bytes; nothing was recorded and the
    /// caller must delete the new blob.
    TooLarge,
}

#[derive(Debug)]
pub enum Committed {
    Done { garbage: Vec<BlobName> },
    UnknownBlock(UnknownBlock),
    UploadClosed,
}

/// Identity of the upload being finalized, as the client names it.
#[derive(Debug, Clone)]
pub struct FinalizeRequest<'a> {
    pub repository: &'a RepoId,
    pub scope: &'a Scope,
    pub key: &'a CacheKey,
    pub version: &'a Version,
    pub size: u64,
    pub now: Millis,
}

#[derive(Debug)]
pub enum Finalized {
    /// The entry is visible. Also returned for a retry of an already finalized upload.
    Done {
        entry: EntryId,
        garbage: Vec<BlobName>,
    },
    /// No open or finalized upload matches.
    NoUpload,
    /// Nothing was committed through Put Blob or Put Block List yet.
    NothingUploaded,
    /// The committed bytes do not add up to the size the client declared; the upload was
    /// aborted and its blobs are returned for deletion.
    SizeMismatch { stored: u64, garbage: Vec<BlobName> },
}

/// A stored chunk of an entry, with its byte offset in the entry.
#[derive(Debug, Clone)]
pub struct EntryChunk {
    pub start: u64,
    pub chunk: Chunk,
}

#[async_trait]
pub trait MetaStore: Send + Sync + std::fmt::Debug + 'static {
    /// Checks that the database answers.
    async fn ping(&self) -> Result<(), MetaError>;

    /// Reserves (repository, scope, key, version) unless an entry or a live open upload holds it.
    /// An open upload older than `stale_before` is aborted first and its blobs returned.
    async fn reserve(&self, new: NewUpload<'_>) -> Result<Reserved, MetaError>;

    async fn upload(&self, id: UploadId) -> Result<Option<Upload>, MetaError>;

    /// Makes recent changes durable and compact (SQLite: a WAL checkpoint). Called by the
    /// durability loop right after the blob store synced.
    async fn checkpoint(&self) -> Result<(), MetaError>;

    /// Records `chunk` as the staged copy of `block` (the last copy of a block id wins).
    /// Refused if the upload's staged blocks (other copies of this id aside) would then hold more
    /// than `max_staged` bytes: an upload can never use more disk than an entry may.
    async fn stage_block(
        &self,
        upload: UploadId,
        block: &BlockId,
        chunk: &Chunk,
        max_staged: u64,
        now: Millis,
    ) -> Result<Staged, MetaError>;

    /// Put Blob: `chunk` becomes the upload's only committed part, replacing whatever was
    /// staged or committed before.
    async fn commit_whole(
        &self,
        upload: UploadId,
        chunk: &Chunk,
        now: Millis,
    ) -> Result<Committed, MetaError>;

    /// Applies a block list: the listed blocks become the upload's committed parts, in order.
    async fn commit_block_list(
        &self,
        upload: UploadId,
        list: &[BlockRef],
        now: Millis,
    ) -> Result<Committed, MetaError>;

    /// Turns the open upload for this identity into a visible entry if its committed parts add
    /// up to `size`.
    async fn finalize(&self, req: FinalizeRequest<'_>) -> Result<Finalized, MetaError>;

    /// For each (scope, key) pair, the exact match and the newest prefix match of `version` in
    /// `repository`: a bounded superset of what `matching::best_match` needs.
    async fn find_candidates(
        &self,
        repository: &RepoId,
        version: &Version,
        scopes: &[Scope],
        folded_keys: &[String],
    ) -> Result<Vec<Candidate>, MetaError>;

    /// Records restores: for each entry, hits to add and the latest use. Entries that no
    /// longer exist are skipped.
    async fn record_hits(&self, hits: &[(EntryId, u64, Millis)]) -> Result<(), MetaError>;

    /// After a machine crash: deletes the entries finalized after `since` and aborts every open
    /// upload. Returns how many entries went and the blobs no row refers to any more.
    async fn forget_after(&self, since: Millis) -> Result<(usize, Vec<BlobName>), MetaError>;

    /// A visible entry and its chunks in order.
    async fn entry(&self, id: EntryId) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError>;
}
