//! Chunk bytes: put a chunk from a stream, read it (or a byte range of it) as a stream, delete.
//!
//! # Contract
//! - `put` is all-or-nothing: after an error or a dropped future no reader can see a partial
//!   chunk under that name, and the staging space is released.
//! - `put` counts and hashes what it stores; the returned [`Chunk`] is the truth about the bytes.
//! - A chunk is immutable once put; names are made by the server ([`BlobName`]) and never reused.
//! - A reader that opened a chunk keeps reading the same bytes even if it is deleted meanwhile.
//! - A completed `put` survives a crash of the process. It survives a crash of the machine once
//!   a later [`BlobStore::sync`] has returned; [`BlobStore::lost_since`] reports, at start-up,
//!   from which instant puts may have been lost to such a crash.

mod bounded;
mod bursts;
#[cfg(any(test, feature = "test-util"))]
pub mod conformance;
mod digests;
mod fs;
mod object;
mod timed;
pub mod transfer_memory;

use std::io;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::Stream;

pub(crate) use digests::new_xxh3;
#[cfg(any(test, feature = "test-util"))]
pub(crate) use digests::xxh3_64;
use digests::Digests;
pub use fs::FsStore;
pub use object::{ObjectStorage, ObjectStorageUrl};
pub use timed::Timed;
pub use transfer_memory::TransferMemory;

/// Defined in `model` (the shared vocabulary); re-exported for the stores' own users.
pub use crate::model::ByteStream;
use crate::model::{BlobName, Chunk, Millis};

/// A stored chunk as [`BlobStore::list`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: BlobName,
    /// When the chunk was last written: garbage collection leaves young chunks alone, since
    /// their metadata may still be on its way.
    pub modified: Millis,
}

/// Stored chunks, as [`BlobStore::list`] finds them.
pub type NameStream = Pin<Box<dyn Stream<Item = Result<Listed, BlobError>> + Send>>;

/// The size of the file system a store writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub total: u64,
    /// Bytes this process may still write.
    pub available: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("chunk {0} does not exist")]
    NotFound(BlobName),
    /// The body ended early, failed, or was longer than declared; nothing was stored.
    #[error("request body: {0}")]
    Body(io::Error),
    #[error("body length {actual} does not match the declared {declared}")]
    LengthMismatch { declared: u64, actual: u64 },
    #[error("storage I/O on {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// The store could not serve now: it refused or dropped the connection, stayed silent, or
    /// answered 5xx, after the client library's retries. A retry later may succeed.
    #[error("the chunk store is unavailable ({what}): {source}")]
    Unavailable {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl BlobError {
    /// What a failed [`BlobStore::ping`] means, in words an operator can act on (the readiness
    /// answer); the cause itself goes to the log.
    pub fn readiness(&self) -> &'static str {
        let (Self::Io { source, .. } | Self::Unavailable { source, .. }) = self else {
            return "the chunk store does not answer";
        };
        match source.kind() {
            io::ErrorKind::TimedOut => "the chunk store does not answer within 5 s",
            io::ErrorKind::PermissionDenied
            | io::ErrorKind::ReadOnlyFilesystem
            | io::ErrorKind::StorageFull
            | io::ErrorKind::QuotaExceeded => "the chunk store answers but refuses writes",
            io::ErrorKind::InvalidData => {
                "the chunk store's layout marker (VERSION) is of another version: this hoard cannot use that data"
            }
            _ => "the chunk store does not answer",
        }
    }

    /// The storage ran out of space (ENOSPC, or a disk quota).
    pub fn is_storage_full(&self) -> bool {
        let source = match self {
            Self::Io { source, .. } => source,
            _ => return false,
        };
        matches!(
            source.kind(),
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
        ) || matches!(source.raw_os_error(), Some(28 | 122)) // ENOSPC, EDQUOT
    }
}

#[async_trait]
pub trait BlobStore: Send + Sync + std::fmt::Debug + 'static {
    /// Stores `body` as `name`. With `declared_len`, a body of any other length is refused.
    async fn put(
        &self,
        name: &BlobName,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<Chunk, BlobError>;

    /// Streams `len` bytes of `name` from `offset`. The chunk is opened before this returns, so
    /// a missing chunk is an error here rather than mid-stream.
    async fn get(&self, name: &BlobName, offset: u64, len: u64) -> Result<ByteStream, BlobError>;

    /// Deletes `name`; deleting a missing chunk is not an error.
    async fn delete(&self, name: &BlobName) -> Result<(), BlobError>;

    /// Every stored chunk's name, for garbage collection. Chunks put or deleted while the
    /// listing runs may or may not appear; memory stays bounded however many there are.
    async fn list(&self) -> Result<NameStream, BlobError>;

    /// The file system's size and free space, for stores on local disk; `None` for stores
    /// without a fixed size (object storage).
    async fn capacity(&self) -> Result<Option<Capacity>, BlobError>;

    /// Checks that the store can be written. Its error's [`BlobError::readiness`] says what
    /// is wrong.
    async fn ping(&self) -> Result<(), BlobError>;

    /// Makes every put completed so far durable against a machine crash, and records so. Skipped
    /// when nothing was put or committed ([`BlobStore::note_committed`]) since the last call,
    /// unless `force`; a no-op for stores whose puts are durable on return.
    async fn sync(&self, force: bool) -> Result<(), BlobError>;

    /// Says that metadata naming chunks put so far (an entry) was just committed: the next
    /// [`BlobStore::sync`] records an instant after it even if no chunk was put since, so that
    /// [`BlobStore::lost_since`] after a later crash does not take that entry for one that may
    /// have lost bytes. A no-op for stores whose puts are durable on return.
    fn note_committed(&self);

    /// Set when the machine crashed since the last run: puts completed after this instant may
    /// be gone or incomplete.
    fn lost_since(&self) -> Option<Millis>;

    /// A link that lets anyone holding it `GET` the whole of `name` (with or without a `Range`)
    /// straight from the store for `ttl`, so the bytes need not pass through this server.
    /// `None` for stores that cannot presign (local disk).
    async fn presigned_get(
        &self,
        name: &BlobName,
        ttl: Duration,
    ) -> Result<Option<url::Url>, BlobError>;

    /// What kind of store this is, for the admin API's status: `file`, `s3`, `gcs`, `azure`.
    fn kind(&self) -> &'static str;

    /// The file that holds `name`, for a store of local files: the digest pass reads it on its
    /// own idle thread rather than through [`BlobStore::get`]'s tasks, which run at the
    /// requests' priority. `None` for object storage.
    fn local_path(&self, _name: &BlobName) -> Option<std::path::PathBuf> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_ping_says_in_words_what_is_wrong() {
        let failed = |kind| BlobError::Io {
            what: "s3://b/p/VERSION".into(),
            source: io::Error::new(kind, "cause"),
        };
        assert!(failed(io::ErrorKind::TimedOut)
            .readiness()
            .contains("within 5 s"));
        assert!(failed(io::ErrorKind::PermissionDenied)
            .readiness()
            .contains("refuses writes"));
        assert!(failed(io::ErrorKind::InvalidData)
            .readiness()
            .contains("of another version"));
        assert_eq!(
            failed(io::ErrorKind::ConnectionRefused).readiness(),
            "the chunk store does not answer"
        );
    }
}
