//! What a domain call answers when it does not succeed ([`CacheError`]), and how the stores'
//! failures become domain outcomes.

use super::upload;
use crate::blob::BlobError;
use crate::meta::MetaError;
#[cfg(test)]
use crate::model::BlobName;

/// Every outcome of a domain call that is not a success, in the domain's words: the protocols
/// map these (one `From<CacheError>` each) and never look inside the stores' errors.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{0}")]
    Invalid(#[from] crate::model::InvalidInput),
    #[error("cache write denied: token has no writable scopes")]
    WriteDenied,
    #[error("cache read denied: token has no readable scopes")]
    ReadDenied,
    /// The write policy makes the write scope read-only or denies it (`--policy-file`).
    #[error("cache write denied: {0}")]
    WriteDeniedByPolicy(super::policy::Refusal),
    /// The write policy denies every scope the token may read (`--policy-file`).
    #[error("cache read denied: {0}")]
    ReadDeniedByPolicy(super::policy::Refusal),
    #[error("cache entry with the same key, version, and scope already exists")]
    Conflict,
    #[error("no such upload")]
    UploadNotFound,
    #[error("the upload is already finalized or was abandoned")]
    UploadClosed,
    #[error("the block list names a block that was not uploaded")]
    UnknownBlock,
    #[error("no reservation for this key and version")]
    NoReservation,
    #[error("nothing was uploaded for this key and version")]
    NothingUploaded,
    #[error("uploaded {stored} bytes but the client declared {declared}")]
    SizeMismatch { stored: u64, declared: u64 },
    #[error("{0}")]
    BadRanges(upload::RangeProblem),
    #[error("no such entry")]
    EntryNotFound,
    /// The entry's stored bytes do not match what was recorded when they were written (found
    /// before an answer's headers went); the entry is quarantined. Says how, naming the chunk.
    #[error("the entry is damaged: {0}; it is quarantined")]
    Damaged(String),
    /// A quarantined entry cannot be released: a live entry holds its key and version now.
    #[error(
        "a live entry holds this entry's key and version now; delete it first to release this one"
    )]
    SlotTaken,
    /// The operation is for quarantined entries only, or for live ones only.
    #[error("{0}")]
    WrongState(&'static str),
    /// An operator named a repository (id or owner/name) the store has never seen.
    #[error("no repository {0:?} is known to this server")]
    UnknownRepository(String),
    /// An operator named repositories by a name several of them carry (names are not unique:
    /// a forge's `octo/app` and GitHub's). The message lists their ids.
    #[error("{0}")]
    AmbiguousRepository(String),
    #[error("too many uploads are open for this repository; retry later")]
    TooManyUploads,
    #[error("entries are limited to {0} bytes")]
    TooLarge(u64),
    #[error("the upload is being changed by too many requests at once; retry")]
    Busy,
    #[error("the cache storage is full and nothing more can be evicted; retry later")]
    StorageFull,
    #[error(
        "an upload may have at most {} uncommitted blocks",
        upload::MAX_STAGED_BLOCKS
    )]
    TooManyBlocks,
    /// A signed link whose row is gone, or was replaced by a later row with the same id: the
    /// link cannot have been signed for what the id names now.
    #[error("the link names no upload or entry")]
    NoSuchLink,
    /// The request body was longer or shorter than its declared length; nothing was stored.
    #[error("the body's SHA-256 is {actual}, not the {expected} it is stored under")]
    ContentMismatch { expected: String, actual: String },
    #[error("body length {actual} does not match the declared {declared}")]
    BodyLengthMismatch { declared: u64, actual: u64 },
    /// The request body ended early or failed (the client hung up, or went idle); nothing was
    /// stored.
    #[error("request body: {0}")]
    BodyFailed(#[source] std::io::Error),
    /// The chunk store failed (I/O, or a chunk the metadata names is missing), or could not
    /// serve now ([`BlobError::Unavailable`], a transient failure).
    #[error(transparent)]
    Storage(BlobError),
    #[error(transparent)]
    Meta(#[from] MetaError),
}

impl CacheError {
    /// A failure that a retry may not meet: the database or the chunk store is unreachable,
    /// or the upload is contended. Protocols answer 503 so that clients retry.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Busy
                | Self::Meta(MetaError::Unavailable(_))
                | Self::Storage(BlobError::Unavailable { .. })
        )
    }

    /// The chunk store being unreachable, for the protocols' tests of how they answer it.
    #[cfg(test)]
    pub fn storage_unavailable(cause: &str) -> Self {
        Self::Storage(BlobError::Unavailable {
            what: "chunk 0123".into(),
            source: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, cause.to_owned()),
        })
    }

    /// The database being unreachable, for the protocols' tests of how they answer it (they
    /// do not import `meta`).
    #[cfg(test)]
    pub fn database_unavailable(cause: &str) -> Self {
        Self::Meta(MetaError::Unavailable(cause.into()))
    }

    /// What `/readyz` says of a failure that is not the chunk store's, in words an operator
    /// can act on; the cause is in the log.
    pub fn database_readiness(&self) -> &'static str {
        match self {
            // The wait is `DATABASE_READINESS_DEADLINE` at most.
            Self::Meta(MetaError::Unavailable(_)) => {
                "the metadata database does not answer within 2.5 s"
            }
            _ => "the metadata database answers with an error",
        }
    }

    /// What a client is told of a transient failure: the database's own words (which may name
    /// a host or quote a statement) stay in the log.
    pub fn client_message(&self) -> String {
        match self {
            Self::Meta(MetaError::Unavailable(_)) => {
                "the cache's database is unavailable; retry later".to_owned()
            }
            Self::Storage(BlobError::Unavailable { .. }) => {
                "the cache's storage is unavailable; retry later".to_owned()
            }
            other => other.to_string(),
        }
    }
}

/// The one place a chunk store's failure becomes a domain outcome: what the client's body did
/// wrong is told apart from what the store did.
impl From<BlobError> for CacheError {
    fn from(e: BlobError) -> Self {
        match e {
            BlobError::Body(e) => Self::BodyFailed(e),
            BlobError::LengthMismatch { declared, actual } => {
                Self::BodyLengthMismatch { declared, actual }
            }
            e @ (BlobError::NotFound(_) | BlobError::Io { .. } | BlobError::Unavailable { .. }) => {
                Self::Storage(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_failure_is_the_clients_and_a_store_failure_the_servers() {
        let short = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "hung up");
        assert!(matches!(
            CacheError::from(BlobError::Body(short)),
            CacheError::BodyFailed(_)
        ));
        let long = CacheError::from(BlobError::LengthMismatch {
            declared: 3,
            actual: 4,
        });
        assert_eq!(
            long.to_string(),
            "body length 4 does not match the declared 3"
        );
        let missing = CacheError::from(BlobError::NotFound(BlobName::random()));
        assert!(matches!(missing, CacheError::Storage(_)));
        assert!(!missing.is_transient());
        let refused = CacheError::from(BlobError::Io {
            what: "chunk 0123".into(),
            source: std::io::Error::other("403 Forbidden"),
        });
        assert!(!refused.is_transient());
    }

    #[test]
    fn a_store_that_cannot_serve_now_is_transient_and_its_cause_stays_in_the_log() {
        let down = CacheError::storage_unavailable("connection refused at 10.1.2.3:9000");
        assert!(down.is_transient());
        let told = down.client_message();
        assert_eq!(told, "the cache's storage is unavailable; retry later");
        assert!(!told.contains("10.1.2.3"));
    }
}
