//! The fixed-size keys the networked stores index slots and lookups by: SHA-256 over
//! length-prefixed fields, because the columns themselves together are longer than MySQL's and
//! PostgreSQL's index entries may be. SQLite indexes the columns themselves.

use crate::model::{RepoId, Scope};

/// SHA-256 over length-prefixed fields: equal exactly when every field is equal.
pub(super) fn digest(fields: &[&[u8]]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for field in fields {
        hasher.update((field.len() as u64).to_le_bytes());
        hasher.update(field);
    }
    hasher.finalize().to_vec()
}

/// The networked stores' index key for one (repository, version, scope): a fixed 32 bytes,
/// because the columns themselves together are longer than MySQL's and PostgreSQL's index
/// entries may be. Lookups scan `(bucket, key_folded)` ranges, and also compare the columns.
pub(super) fn bucket(
    repository: &RepoId,
    version: &crate::model::Version,
    scope: &Scope,
) -> Vec<u8> {
    digest(&[
        repository.as_str().as_bytes(),
        version.as_str().as_bytes(),
        scope.as_str().as_bytes(),
    ])
}

/// The networked stores' unique key for a slot: its bucket and folded key.
pub(super) fn slot_hash(slot: &crate::model::Slot) -> Vec<u8> {
    let bucket = bucket(&slot.repository, &slot.version, &slot.scope);
    digest(&[&bucket, slot.key.folded().as_bytes()])
}
