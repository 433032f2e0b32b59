//! Read-through (issue #59, `--upstream-cache`): an entry the upstream cache (GitHub's) has and
//! hoard had not is stored as the entry of the key the upstream matched and the version asked
//! for, in the job's own write scope, never a wider one (a read-only job stores nothing), under
//! the rules of any save (write policy, quotas, entry size), and its record names where it was
//! read from. Asking the upstream and fetching the bytes is `api/read_through.rs`.

use super::save::Commit;
use super::{Cache, CacheError};
use crate::auth::Identity;
use crate::model::{BlobName, ByteStream, CacheKey, EntryId, Version};

impl Cache {
    /// Whether `who` may store an entry of `key` and `version` (its token writes a scope, and
    /// the write policy allows it). A question asked on a lookup: a refusal is neither audited
    /// nor counted as a refused save, as [`Cache::write_slot`]'s is.
    pub fn may_store(&self, who: &Identity, key: &str, version: &str) -> bool {
        CacheKey::parse(key).is_ok()
            && Version::parse(version).is_ok()
            && who
                .write_scope
                .as_ref()
                .is_some_and(|scope| self.write_policy_refusal(who, scope).is_none())
    }

    /// Stores `body` (`len` bytes) as the entry `key`/`version` of `who`'s write scope, read
    /// through from `from`; `Ok(None)` when the scope has that entry already (another request
    /// stored it first).
    #[allow(clippy::too_many_arguments)]
    pub async fn save_read_through(
        &self,
        who: &Identity,
        address: Option<std::net::IpAddr>,
        key: &str,
        version: &str,
        body: ByteStream,
        len: u64,
        from: &str,
    ) -> Result<Option<EntryId>, CacheError> {
        if len > self.policy.max_entry_size {
            return Err(CacheError::TooLarge(self.policy.max_entry_size));
        }
        let slot = self.write_slot(who, key, version)?;
        self.make_room().await?;
        let blob = BlobName::random();
        let chunk = self.put_chunk(&blob, body, Some(len)).await?;
        let commit = Commit {
            who,
            slot: &slot,
            key,
            written_by: Some(who.provenance(address)),
            chunks: std::slice::from_ref(&chunk),
            size: len,
            tool: None,
            read_through: Some(from),
        };
        match self.commit_entry(commit, None, Vec::new()).await {
            Ok(id) => Ok(Some(id)),
            Err(CacheError::Conflict) => {
                self.collect(vec![blob]).await;
                Ok(None)
            }
            // Whether the write happened is not known: the chunk stays for garbage collection.
            Err(e) => Err(e),
        }
    }
}
