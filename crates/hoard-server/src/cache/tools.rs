//! Build tools' objects (issue #60): the tools' own cache protocols (Turborepo, Nx, WebDAV for
//! sccache and ccache, Bazel, Go's through `hoard gocache`; `api/objects.rs` and one module per
//! protocol) on hoard's entries. An object is an entry of the caller's repository under the key
//! `<tool>/<name>` and a version of the tool's own, so it takes GitHub's isolation as an
//! Actions cache does: it is written in the job's scope and found in the scopes the job's token
//! reads (its own, then its base branch's), and a pull request never writes what `main` reads.
//! Quotas, eviction, expiry, purges, quarantine, provenance and statistics treat it as any entry;
//! its record names the tool ([`ToolObject`]) and keeps the headers the tool reads back.

use std::sync::Arc;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use super::restore::OpenEntry;
use super::save::Commit;
use super::{Cache, CacheError};
use crate::auth::Identity;
use crate::meta::SlotRead;
use crate::model::{
    BlobName, ByteStream, EntryFilter, EntryId, EntryPage, Lookup, Tool, ToolObject,
};

/// An object found: its bytes, and what it keeps of its tool.
#[derive(Debug, Clone)]
pub struct ToolHit {
    pub open: Arc<OpenEntry>,
    /// `None` for an entry of the key written by something else than the tool.
    pub object: Option<ToolObject>,
}

/// What a save did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSave {
    Saved(EntryId),
    /// The job's scope holds the object already: objects are named by their content's hash,
    /// so the one there is as good.
    Present,
}

/// The key an object `name` of `tool` is kept under.
fn object_key(tool: Tool, name: &str) -> String {
    format!("{}/{name}", tool.as_str())
}

/// The version every object of `tool` is kept under: no Actions cache version (a 64-digit
/// hash) looks like it.
fn object_version(tool: Tool) -> &'static str {
    match tool {
        Tool::Turbo => "hoard-tool-turbo",
        Tool::Nx => "hoard-tool-nx",
        Tool::WebDav => "hoard-tool-webdav",
        Tool::BazelAc => "hoard-tool-bazel-ac",
        Tool::BazelCas => "hoard-tool-bazel-cas",
        Tool::Go => "hoard-tool-go",
    }
}

impl Cache {
    /// Object `name` of `tool` as `who` may read it (its scopes in order, as a lookup's), and
    /// counted as a lookup is: a hit or a miss in the statistics, a restore record by `who`.
    pub async fn find_tool_object(
        &self,
        who: &Identity,
        address: Option<std::net::IpAddr>,
        tool: Tool,
        name: &str,
    ) -> Result<Option<ToolHit>, CacheError> {
        let key = object_key(tool, name);
        let lookup = Lookup::parse(&key, &[], object_version(tool))?;
        let Some(hit) = self.lookup(who, address, &lookup).await? else {
            return Ok(None);
        };
        // A lookup also matches a longer key that starts with this one: not this object.
        if !hit.matched_key.eq_ignore_ascii_case(&key) {
            return Ok(None);
        }
        let open = match self.readable_entry(who, hit.entry.id).await {
            Err(CacheError::EntryNotFound) => return Ok(None), // Removed meanwhile.
            other => other?,
        };
        if !tool.keeps_headers() {
            return Ok(Some(ToolHit {
                open,
                object: Some(ToolObject::bare(tool)),
            }));
        }
        let filter = EntryFilter {
            id: Some(hit.entry.id),
            ..EntryFilter::default()
        };
        let object = self
            .meta
            .select_entries(&EntryPage::by_creation(&filter, 1))
            .await?
            .entries
            .into_iter()
            .next()
            .and_then(|listed| listed.record.tool);
        Ok(Some(ToolHit { open, object }))
    }

    /// Saves `body` (`len` bytes) as object `name` of `object.tool` in `who`'s write scope,
    /// under the same rules as an Actions cache save (write policy, quotas, entry size). With
    /// `sha256`, only a body of that SHA-256 is kept (a content-addressed object).
    ///
    /// An object arrives whole in one request, so it needs no reservation: its bytes are
    /// stored, then made an entry in one write (two concurrent writers of one object both
    /// store, the first commit wins and the other's copy goes). A crash in between leaves an
    /// unreferenced young chunk, which garbage collection removes, as for any upload.
    #[allow(clippy::too_many_arguments)]
    pub async fn save_tool_object(
        &self,
        who: &Identity,
        address: Option<std::net::IpAddr>,
        object: &ToolObject,
        name: &str,
        body: ByteStream,
        len: u64,
        sha256: Option<[u8; 32]>,
    ) -> Result<ToolSave, CacheError> {
        let key = object_key(object.tool, name);
        let version = object_version(object.tool);
        if len > self.policy.max_entry_size {
            return Err(CacheError::TooLarge(self.policy.max_entry_size));
        }
        let slot = self.write_slot(who, &key, version)?;
        // A large object the scope has already is not stored again: asked first. A small one
        // costs less to store and drop than a question costs every new one.
        if len > ASK_FIRST {
            let read = SlotRead::Reserve {
                live_since: self.clock.now(),
            };
            if self.meta.slot_state(&slot, read).await?.entry_exists {
                // The client is sending the body all the same: read to its end, it keeps its
                // connection (tools put what they have without asking first).
                if len <= MAX_DRAINED {
                    drain(body).await;
                }
                return Ok(ToolSave::Present);
            }
        }
        self.make_room().await?;
        let hashed = Arc::new(std::sync::Mutex::new(Sha256::new()));
        let body = match sha256 {
            None => body,
            Some(_) => hashing(body, hashed.clone()),
        };
        let blob = BlobName::random();
        let mut chunk = self.put_chunk(&blob, body, Some(len)).await?;
        if let Some(expected) = sha256 {
            let actual: [u8; 32] = hashed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .finalize()
                .into();
            // The chunk's digest, known now: the digest pass need not read it back.
            chunk.sha256.get_or_insert(actual);
            if actual != expected {
                self.collect(vec![blob]).await;
                return Err(CacheError::ContentMismatch {
                    expected: hex::encode(expected),
                    actual: hex::encode(actual),
                });
            }
        }
        let commit = Commit {
            who,
            slot: &slot,
            key: &key,
            written_by: Some(who.provenance(address)),
            chunks: std::slice::from_ref(&chunk),
            size: len,
            tool: Some(object),
            read_through: None,
        };
        match self.commit_entry(commit, None, Vec::new()).await {
            Ok(id) => Ok(ToolSave::Saved(id)),
            // The scope holds the object (another request's copy): this copy goes.
            Err(CacheError::Conflict) => {
                self.collect(vec![blob]).await;
                Ok(ToolSave::Present)
            }
            // Whether the write happened is not known: the chunk stays for garbage collection
            // to decide on.
            Err(e) => Err(e),
        }
    }
}

/// Objects above this size are looked for before they are stored.
const ASK_FIRST: u64 = 1 << 20;

/// The largest body of an object already there that is read and dropped rather than left
/// unread (which closes the client's connection as it sends).
const MAX_DRAINED: u64 = 64 << 20;

/// Reads `body` to its end (or its first error), keeping nothing.
async fn drain(mut body: ByteStream) {
    while let Some(Ok(_)) = body.next().await {}
}

/// `body`, each piece added to `hasher` as it passes.
fn hashing(body: ByteStream, hasher: Arc<std::sync::Mutex<Sha256>>) -> ByteStream {
    Box::pin(body.map(move |piece| {
        if let Ok(bytes) = &piece {
            hasher
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .update(bytes);
        }
        piece
    }))
}
