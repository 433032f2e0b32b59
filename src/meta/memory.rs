//! An in-memory [`super::MetaStore`]: the fake the domain's unit tests run against. It keeps the same
//! contract as the SQL stores (the conformance suite checks it), in one mutex-guarded state, so
//! every method is trivially atomic.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::sync::Mutex;

use async_trait::async_trait;

use super::schema::EntryRow;
use super::sql;
use super::{
    AdminStore, BlockState, EntryChunk, EntryFilter, EntryPage, FinalizeState, Health,
    LifecycleStore, ListedEntry, MetaError, NewEntry, NewUpload, Removal, RepositoryUsage,
    RestoreStore, SaveStore, SlotState, StatsStore, Totals,
};
use super::{NewRestore, RestoreQuery};
use crate::model::RestoreRecord;
use crate::model::{
    BlobName, BlockId, Candidate, Chunk, Entry, EntryId, EntryUse, Millis, Provenance, Quarantine,
    QuotaUsage, RemovalCause, RepoId, Scope, ScopeClass, Slot, Upload, UploadBlocks, UploadId,
    UploadState, Version,
};
use crate::model::{Bucket, Counters, RefClass, StatsFilter, StatsKey, StatsRow, StoredFamily};

#[derive(Debug, Default)]
pub struct MemoryStore(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    next_id: i64,
    uploads: BTreeMap<UploadId, StoredUpload>,
    entries: BTreeMap<EntryId, StoredEntry>,
    /// Chunks to delete: name → (size, when).
    doomed: BTreeMap<BlobName, (u64, Millis)>,
    /// Entries in quarantine, with why and since when.
    quarantined: BTreeMap<EntryId, (StoredEntry, Quarantine)>,
    /// Every repository seen by a finalize or a miss: its name, hits and misses.
    repositories: HashMap<RepoId, Seen>,
    /// Statistics rows by (repository, family, class, bucket, start), and the server's by
    /// (class, bucket, start).
    family_stats: BTreeMap<(RepoId, String, RefClass, Bucket, Millis), Counters>,
    server_stats: BTreeMap<(RefClass, Bucket, Millis), Counters>,
    /// Families kept per repository, with when.
    kept_families: BTreeMap<(RepoId, String), Millis>,
    /// Restore records, by a number that orders them as the SQL stores' ids do.
    restores: Vec<(i64, RestoreRecord)>,
}

#[derive(Debug, Clone, Default)]
struct Seen {
    name: String,
    hits: u64,
    misses: u64,
}

impl Seen {
    fn named(&mut self, name: &str) -> &mut Self {
        if !name.is_empty() {
            self.name = name.to_owned();
        }
        self
    }
}

#[derive(Debug, Clone)]
struct StoredUpload {
    upload: Upload,
    folded: String,
    blocks: UploadBlocks,
    /// The bytes of `blocks.staged`, kept with it (as the SQL stores keep theirs).
    staged_bytes: u64,
    entry: Option<EntryId>,
}

/// An entry as the SQL stores keep it: the declared row a finalize writes (`schema.rs`), read
/// back by the same decoders, and its chunks.
#[derive(Debug, Clone)]
struct StoredEntry {
    row: EntryRow,
    chunks: Vec<Chunk>,
}

/// Whether a row's repository, scope, version and folded key are the slot's.
fn in_slot(slot: &Slot, repository: &RepoId, scope: &Scope, version: &str, folded: &str) -> bool {
    *repository == slot.repository
        && *scope == slot.scope
        && version == slot.version.as_str()
        && folded == slot.key.folded()
}

impl StoredUpload {
    fn set_blocks(&mut self, blocks: UploadBlocks) {
        self.staged_bytes = blocks.staged.values().map(|c| c.size).sum();
        self.blocks = blocks;
    }

    fn holds(&self, slot: &Slot) -> bool {
        let u = &self.upload;
        in_slot(slot, &u.repository, &u.scope, &u.version, &self.folded)
    }
}

impl StoredEntry {
    fn entry(&self) -> Entry {
        sql::entry_from_row(&self.row).expect("the fake reads the rows it wrote")
    }

    fn usage(&self) -> EntryUse {
        sql::use_from_row(&self.row).expect("the fake reads the rows it wrote")
    }

    fn written_by(&self) -> Option<Provenance> {
        sql::entry_writer(&self.row).expect("the fake reads the rows it wrote")
    }

    /// As the finalize gave it (the fake, like the SQL stores, keeps what it is told).
    fn class(&self) -> ScopeClass {
        ScopeClass::from_code(self.row.scope_class)
    }

    fn ref_class(&self) -> RefClass {
        RefClass::from_code(self.row.ref_class)
    }

    fn holds(&self, slot: &Slot) -> bool {
        let e = self.entry();
        in_slot(
            slot,
            &e.repository,
            &e.scope,
            &e.version,
            &self.row.key_folded,
        )
    }
}

impl State {
    fn name_of(&self, repository: &RepoId) -> String {
        self.repositories
            .get(repository)
            .map(|seen| seen.name.clone())
            .unwrap_or_default()
    }

    /// Up to `limit` of the entries `select` picks, least recently used first (then oldest id).
    fn least_used(&self, limit: usize, select: impl Fn(&StoredEntry) -> bool) -> Vec<EntryUse> {
        let mut found: Vec<EntryUse> = self
            .entries
            .values()
            .filter(|e| select(e))
            .map(StoredEntry::usage)
            .collect();
        found.sort_by_key(|e| (e.last_used_at, e.id));
        found.truncate(limit);
        found
    }

    /// Whether `filter` selects `e`, as the SQL stores decide it.
    /// The live entries, or those in quarantine if `filter` asks for them.
    fn in_state<'s>(
        &'s self,
        filter: &EntryFilter,
    ) -> Box<dyn Iterator<Item = (&'s StoredEntry, Option<&'s Quarantine>)> + 's> {
        if filter.quarantined {
            Box::new(self.quarantined.values().map(|(e, why)| (e, Some(why))))
        } else {
            Box::new(self.entries.values().map(|e| (e, None)))
        }
    }

    fn selects(&self, filter: &EntryFilter, e: &StoredEntry) -> bool {
        let entry = &e.entry();
        filter
            .repository
            .as_ref()
            .is_none_or(|r| entry.repository.as_str() == r || self.name_of(&entry.repository) == *r)
            && filter
                .repository_id
                .as_ref()
                .is_none_or(|id| entry.repository.as_str() == id)
            && filter.scope.as_ref().is_none_or(|s| &entry.scope == s)
            && filter
                .folded_key_prefix
                .as_ref()
                .is_none_or(|p| e.row.key_folded.starts_with(p.as_str()))
            && filter.version.as_ref().is_none_or(|v| &entry.version == v)
            && filter.id.is_none_or(|id| entry.id == id)
            && self.written_by_selects(filter, e.written_by().as_ref())
            && filter.written_after.is_none_or(|t| entry.created_at >= t)
            && filter.written_before.is_none_or(|t| entry.created_at < t)
            && filter.digest.as_ref().is_none_or(|d| *d == e.row.digest)
    }

    /// The writer's part of [`State::selects`]: an entry without a record has empty fields.
    fn written_by_selects(&self, filter: &EntryFilter, by: Option<&Provenance>) -> bool {
        let (run, subject) = by.map_or(("", ""), |p| (p.run_id.as_str(), p.subject.as_str()));
        filter.run_id.as_deref().is_none_or(|r| run == r)
            && filter.subject.as_deref().is_none_or(|s| subject == s)
            && filter.kind.is_none_or(|k| by.is_some_and(|p| p.kind == k))
    }

    /// The next row id, positive and increasing (uploads and entries share the counter).
    fn next_id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }

    /// `Stale` unless the upload is still open at the loaded revision.
    fn check(&self, upload: &Upload) -> Result<(), MetaError> {
        match self.uploads.get(&upload.id) {
            Some(s) if s.upload.is_open() && s.upload.revision == upload.revision => Ok(()),
            _ => Err(MetaError::Stale),
        }
    }

    /// The upload, if it is still open at the loaded revision; the revision is bumped.
    fn claim(&mut self, upload: &Upload) -> Result<&mut StoredUpload, MetaError> {
        self.check(upload)?;
        let stored = self.uploads.get_mut(&upload.id).ok_or(MetaError::Stale)?;
        stored.upload.revision += 1;
        Ok(stored)
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Health for MemoryStore {
    async fn ping(&self) -> Result<(), MetaError> {
        Ok(())
    }

    async fn checkpoint(&self) -> Result<(), MetaError> {
        Ok(())
    }
}

#[async_trait]
impl SaveStore for MemoryStore {
    async fn slot_state(&self, slot: &Slot, live_since: Millis) -> Result<SlotState, MetaError> {
        let state = self.state();
        Ok(SlotState {
            entry_exists: state.entries.values().any(|e| e.holds(slot)),
            open: state
                .uploads
                .values()
                .find(|u| u.upload.is_open() && u.holds(slot))
                .map(|u| u.upload.clone()),
            live_open_uploads: state
                .uploads
                .values()
                .filter(|u| {
                    u.upload.is_open()
                        && u.upload.repository == slot.repository
                        && u.upload.created_at >= live_since
                })
                .count() as u64,
        })
    }

    async fn upload_with_blocks(
        &self,
        id: UploadId,
    ) -> Result<Option<(Upload, UploadBlocks)>, MetaError> {
        Ok(self
            .state()
            .uploads
            .get(&id)
            .map(|u| (u.upload.clone(), u.blocks.clone())))
    }

    async fn block_state(
        &self,
        id: UploadId,
        block: &BlockId,
    ) -> Result<Option<(Upload, BlockState)>, MetaError> {
        let state = self.state();
        let Some(u) = state.uploads.get(&id) else {
            return Ok(None);
        };
        let copy = u.blocks.staged.get(block).cloned();
        let copy_committed = copy
            .as_ref()
            .is_some_and(|c| u.blocks.parts.iter().any(|(_, p)| p.blob == c.blob));
        let blocks = BlockState {
            staged_count: u.blocks.staged.len() as u64,
            staged_bytes: u.staged_bytes,
            copy,
            copy_committed,
        };
        Ok(Some((u.upload.clone(), blocks)))
    }

    async fn finalize_state(&self, slot: &Slot) -> Result<FinalizeState, MetaError> {
        let state = self.state();
        let open = state
            .uploads
            .values()
            .find(|u| u.upload.is_open() && u.holds(slot))
            .map(|u| (u.upload.clone(), u.blocks.clone()));
        let finalized = state
            .uploads
            .values()
            .rev()
            .find(|u| u.upload.state == UploadState::Finalized && u.holds(slot))
            .and_then(|u| u.entry)
            .and_then(|id| state.entries.get(&id))
            .map(|e| (e.entry().id, e.entry().size));
        Ok(FinalizeState { open, finalized })
    }

    async fn create_upload(
        &self,
        new: NewUpload<'_>,
        replacing: Option<&Upload>,
    ) -> Result<UploadId, MetaError> {
        let mut state = self.state();
        // Check everything before changing anything: a refused change leaves no trace.
        if let Some(old) = replacing {
            state.check(old)?;
        }
        let taken = state.uploads.values().any(|u| {
            u.upload.is_open() && u.holds(new.slot) && replacing.is_none_or(|r| r.id != u.upload.id)
        });
        if taken {
            return Err(MetaError::Conflict);
        }
        if let Some(old) = replacing {
            let s = state.claim(old)?;
            s.upload.state = UploadState::Aborted;
            s.set_blocks(UploadBlocks::default());
        }
        let id = UploadId::new(state.next_id());
        let slot = new.slot;
        state.uploads.insert(
            id,
            StoredUpload {
                upload: Upload {
                    id,
                    repository: slot.repository.clone(),
                    scope: slot.scope.clone(),
                    key: slot.key.as_str().to_owned(),
                    version: slot.version.as_str().to_owned(),
                    state: UploadState::Open,
                    created_at: new.now,
                    revision: 0,
                    written_by: Some(new.written_by.clone()),
                },
                folded: slot.key.folded(),
                blocks: UploadBlocks::default(),
                staged_bytes: 0,
                entry: None,
            },
        );
        Ok(id)
    }

    async fn stage_block(
        &self,
        upload: &Upload,
        block: &BlockId,
        chunk: &Chunk,
        _now: Millis,
    ) -> Result<(), MetaError> {
        let mut state = self.state();
        let s = state.claim(upload)?;
        if let Some(replaced) = s.blocks.staged.insert(block.clone(), chunk.clone()) {
            s.staged_bytes -= replaced.size;
        }
        s.staged_bytes += chunk.size;
        Ok(())
    }

    async fn commit_parts(
        &self,
        upload: &Upload,
        parts: &[(BlockId, Chunk)],
        _now: Millis,
    ) -> Result<(), MetaError> {
        let mut state = self.state();
        let s = state.claim(upload)?;
        s.set_blocks(UploadBlocks {
            staged: HashMap::new(),
            parts: parts.to_vec(),
        });
        Ok(())
    }

    async fn abort_upload(&self, upload: &Upload, _now: Millis) -> Result<(), MetaError> {
        let mut state = self.state();
        let s = state.claim(upload)?;
        s.upload.state = UploadState::Aborted;
        s.set_blocks(UploadBlocks::default());
        Ok(())
    }

    async fn finalize(&self, upload: &Upload, new: NewEntry<'_>) -> Result<EntryId, MetaError> {
        let mut state = self.state();
        state.check(upload)?;
        if state.entries.values().any(|e| e.holds(new.slot)) {
            return Err(MetaError::Conflict);
        }
        let id = EntryId::new(state.next_id());
        let slot = new.slot;
        state.entries.insert(
            id,
            StoredEntry {
                row: EntryRow {
                    id: id.get(),
                    // The fake keeps what SQLite keeps.
                    ..EntryRow::from_new(&new, super::dialect::Backend::Sqlite)
                },
                chunks: new.chunks.to_vec(),
            },
        );
        state
            .repositories
            .entry(slot.repository.clone())
            .or_default()
            .named(new.repository_name);
        let s = state.claim(upload)?;
        s.upload.state = UploadState::Finalized;
        s.set_blocks(UploadBlocks::default());
        s.entry = Some(id);
        Ok(id)
    }
}

#[async_trait]
impl RestoreStore for MemoryStore {
    async fn find_candidates(
        &self,
        repository: &RepoId,
        version: &Version,
        scopes: &[Scope],
        folded_keys: &[String],
    ) -> Result<Vec<Candidate>, MetaError> {
        let state = self.state();
        let candidate = |e: &StoredEntry| Candidate {
            id: e.entry().id,
            scope: e.entry().scope.clone(),
            key: e.entry().key.clone(),
            key_folded: e.row.key_folded.clone(),
            created_at: e.entry().created_at,
            size: e.entry().size,
        };
        let mut out = Vec::new();
        for scope in scopes {
            for key in folded_keys {
                let in_slot = || {
                    state.entries.values().filter(|e| {
                        &e.entry().repository == repository
                            && e.entry().version == version.as_str()
                            && &e.entry().scope == scope
                    })
                };
                out.extend(in_slot().find(|e| &e.row.key_folded == key).map(candidate));
                // The same byte range the SQL stores scan.
                let end = super::sql::prefix_end(key);
                out.extend(
                    in_slot()
                        .filter(|e| {
                            e.row.key_folded.as_str() >= key.as_str() && e.row.key_folded < end
                        })
                        .max_by_key(|e| (e.entry().created_at, e.entry().id))
                        .map(candidate),
                );
            }
        }
        Ok(out)
    }

    async fn entries_with_key(
        &self,
        repository: &RepoId,
        scope: &Scope,
        folded_key: &str,
        limit: usize,
    ) -> Result<Vec<Entry>, MetaError> {
        let state = self.state();
        let mut found: Vec<Entry> = state
            .entries
            .values()
            .filter(|e| {
                &e.entry().repository == repository
                    && &e.entry().scope == scope
                    && e.row.key_folded == folded_key
            })
            .map(|e| e.entry())
            .collect();
        found.sort_by_key(|e| std::cmp::Reverse((e.created_at, e.id)));
        found.truncate(limit);
        Ok(found)
    }

    async fn entry(&self, id: EntryId) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        let state = self.state();
        Ok(state
            .entries
            .get(&id)
            .map(|e| (e.entry(), EntryChunk::place(&e.chunks))))
    }

    async fn record_hits(&self, hits: &[(EntryId, u64, Millis)]) -> Result<(), MetaError> {
        let mut state = self.state();
        for (id, count, last_used) in hits {
            if let Some(e) = state.entries.get_mut(id) {
                e.row.hits += *count as i64;
                e.row.last_used_at = e.row.last_used_at.max(*last_used);
                let repository = RepoId::new(e.row.repository.clone());
                if let Some(seen) = state.repositories.get_mut(&repository) {
                    seen.hits += count;
                }
            }
        }
        Ok(())
    }

    async fn record_misses(&self, misses: &[(RepoId, String, u64)]) -> Result<(), MetaError> {
        let mut state = self.state();
        for (repository, name, count) in misses {
            let seen = state.repositories.entry(repository.clone()).or_default();
            seen.named(name).misses += count;
        }
        Ok(())
    }

    async fn record_restores(&self, restores: &[NewRestore]) -> Result<(), MetaError> {
        let mut state = self.state();
        for new in restores {
            let Some(stored) = state.entries.get(&new.entry) else {
                continue; // gone: nothing is recorded
            };
            let (entry, written_by) = (stored.entry(), stored.written_by());
            let same = |r: &RestoreRecord| r.entry_id == new.entry && r.reader == new.reader;
            if let Some(record) = state.restores.iter_mut().find(|(_, r)| same(r)) {
                let r = &mut record.1;
                r.count += new.count;
                r.first_at = r.first_at.min(new.first_at);
                r.last_at = r.last_at.max(new.last_at);
                continue;
            }
            let id = state.next_id();
            state.restores.push((
                id,
                RestoreRecord {
                    entry_id: new.entry,
                    repository: entry.repository,
                    scope: entry.scope,
                    key: entry.key,
                    written_by,
                    written_at: entry.created_at,
                    reader: new.reader.clone(),
                    first_at: new.first_at,
                    last_at: new.last_at,
                    count: new.count,
                },
            ));
            // The entry's most recent readers are kept.
            let mut of_entry: Vec<(Millis, i64)> = state
                .restores
                .iter()
                .filter(|(_, r)| r.entry_id == new.entry)
                .map(|(id, r)| (r.last_at, *id))
                .collect();
            of_entry.sort_unstable_by(|a, b| b.cmp(a));
            let dropped: Vec<i64> = of_entry
                .iter()
                .skip(super::MAX_READERS_PER_ENTRY)
                .map(|(_, id)| *id)
                .collect();
            state.restores.retain(|(id, _)| !dropped.contains(id));
        }
        Ok(())
    }
}

#[async_trait]
impl LifecycleStore for MemoryStore {
    async fn repository_usage(&self, repository: &RepoId) -> Result<QuotaUsage, MetaError> {
        let state = self.state();
        let held = state
            .entries
            .values()
            .filter(|e| &e.entry().repository == repository);
        Ok(QuotaUsage {
            bytes: held.clone().map(|e| e.entry().size).sum(),
            pr_bytes: held
                .filter(|e| e.class() == ScopeClass::PullRequestOrTag)
                .map(|e| e.entry().size)
                .sum(),
        })
    }

    async fn total_usage(&self) -> Result<u64, MetaError> {
        Ok(self.state().entries.values().map(|e| e.entry().size).sum())
    }

    async fn prune_restores(&self, before: Millis) -> Result<u64, MetaError> {
        let mut state = self.state();
        let count = state.restores.len();
        state.restores.retain(|(_, r)| r.last_at >= before);
        Ok((count - state.restores.len()) as u64)
    }

    async fn repositories_over_restores(&self, keep: u64) -> Result<Vec<RepoId>, MetaError> {
        let mut held: BTreeMap<&RepoId, u64> = BTreeMap::new();
        let state = self.state();
        for (_, r) in &state.restores {
            *held.entry(&r.repository).or_default() += 1;
        }
        Ok(held
            .into_iter()
            .filter(|(_, n)| *n > keep)
            .map(|(repository, _)| repository.clone())
            .collect())
    }

    async fn drop_oldest_restores(
        &self,
        repository: Option<&RepoId>,
        keep: u64,
        limit: usize,
    ) -> Result<u64, MetaError> {
        let mut state = self.state();
        let mut newest_first: Vec<(Millis, i64)> = state
            .restores
            .iter()
            .filter(|(_, r)| repository.is_none_or(|repo| &r.repository == repo))
            .map(|(id, r)| (r.last_at, *id))
            .collect();
        newest_first.sort_unstable_by(|a, b| b.cmp(a));
        let dropped: HashSet<i64> = newest_first
            .iter()
            .skip(usize::try_from(keep).unwrap_or(usize::MAX))
            .take(limit)
            .map(|(_, id)| *id)
            .collect();
        state.restores.retain(|(id, _)| !dropped.contains(id));
        Ok(dropped.len() as u64)
    }

    async fn forget_restores(&self, entries: &[EntryId]) -> Result<u64, MetaError> {
        let mut state = self.state();
        let count = state.restores.len();
        state
            .restores
            .retain(|(_, r)| !entries.contains(&r.entry_id));
        Ok((count - state.restores.len()) as u64)
    }

    async fn pending_deletions(&self) -> Result<u64, MetaError> {
        Ok(self.state().doomed.values().map(|(size, _)| size).sum())
    }

    async fn least_recently_used(
        &self,
        repository: Option<&RepoId>,
        limit: usize,
    ) -> Result<Vec<EntryUse>, MetaError> {
        Ok(self.state().least_used(limit, |e| {
            repository.is_none_or(|r| &e.entry().repository == r)
        }))
    }

    async fn least_recently_used_of_class(
        &self,
        repository: &RepoId,
        class: ScopeClass,
        limit: usize,
    ) -> Result<Vec<EntryUse>, MetaError> {
        Ok(self.state().least_used(limit, |e| {
            &e.entry().repository == repository && e.class() == class
        }))
    }

    async fn expired(
        &self,
        unused_before: Millis,
        created_before: Option<Millis>,
        limit: usize,
    ) -> Result<Vec<EntryUse>, MetaError> {
        let state = self.state();
        Ok(state
            .entries
            .values()
            .filter(|e| {
                e.entry().last_used_at < unused_before
                    || created_before.is_some_and(|t| e.entry().created_at < t)
            })
            .take(limit)
            .map(StoredEntry::usage)
            .collect())
    }

    async fn remove_entries(
        &self,
        ids: &[EntryId],
        removal: Removal<'_>,
    ) -> Result<Vec<EntryUse>, MetaError> {
        let mut state = self.state();
        let mut removed = Vec::new();
        for id in ids {
            let Some(gone) = state.entries.remove(id) else {
                continue;
            };
            removed.push(gone.usage());
            if let RemovalCause::Quarantined(reason) = removal.cause {
                let why = Quarantine {
                    reason: reason.clone(),
                    at: removal.now,
                };
                state.quarantined.insert(*id, (gone, why));
                continue;
            }
            for chunk in &gone.chunks {
                state
                    .doomed
                    .insert(chunk.blob.clone(), (chunk.size, removal.delete_at));
            }
        }
        Ok(removed)
    }

    async fn release_quarantined(&self, id: EntryId) -> Result<Option<EntryUse>, MetaError> {
        let mut state = self.state();
        let Some((kept, _)) = state.quarantined.get(&id) else {
            return Ok(None);
        };
        let r = &kept.row;
        let taken = state.entries.values().any(|e| {
            (
                &e.row.repository,
                &e.row.scope,
                &e.row.key_folded,
                &e.row.version,
            ) == (&r.repository, &r.scope, &r.key_folded, &r.version)
        });
        if taken {
            return Err(MetaError::Conflict);
        }
        let (kept, _) = state.quarantined.remove(&id).expect("found above");
        let usage = kept.usage();
        state.entries.insert(id, kept);
        Ok(Some(usage))
    }

    async fn drop_quarantined(
        &self,
        ids: &[EntryId],
        delete_at: Millis,
    ) -> Result<Vec<EntryId>, MetaError> {
        let mut state = self.state();
        let mut dropped = Vec::new();
        for id in ids {
            let Some((gone, _)) = state.quarantined.remove(id) else {
                continue;
            };
            for chunk in &gone.chunks {
                state
                    .doomed
                    .insert(chunk.blob.clone(), (chunk.size, delete_at));
            }
            dropped.push(*id);
        }
        Ok(dropped)
    }

    async fn quarantined_before(
        &self,
        before: Millis,
        limit: usize,
    ) -> Result<Vec<EntryId>, MetaError> {
        let state = self.state();
        let mut due: Vec<(Millis, EntryId)> = state
            .quarantined
            .iter()
            .filter(|(_, (_, why))| why.at < before)
            .map(|(id, (_, why))| (why.at, *id))
            .collect();
        due.sort();
        Ok(due.into_iter().take(limit).map(|(_, id)| id).collect())
    }

    async fn quarantined_entry(
        &self,
        id: EntryId,
    ) -> Result<Option<(Entry, Vec<EntryChunk>)>, MetaError> {
        let state = self.state();
        Ok(state
            .quarantined
            .get(&id)
            .map(|(e, _)| (e.entry(), EntryChunk::place(&e.chunks))))
    }

    async fn due_deletions(&self, now: Millis, limit: usize) -> Result<Vec<BlobName>, MetaError> {
        let state = self.state();
        Ok(state
            .doomed
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .take(limit)
            .map(|(name, _)| name.clone())
            .collect())
    }

    async fn deletions_done(&self, names: &[BlobName]) -> Result<(), MetaError> {
        let mut state = self.state();
        for name in names {
            state.doomed.remove(name);
        }
        Ok(())
    }

    async fn referenced(&self, names: &[BlobName]) -> Result<Vec<BlobName>, MetaError> {
        let state = self.state();
        let mut all: std::collections::HashSet<&BlobName> = state.doomed.keys().collect();
        for e in state.entries.values() {
            all.extend(e.chunks.iter().map(|c| &c.blob));
        }
        for (e, _) in state.quarantined.values() {
            all.extend(e.chunks.iter().map(|c| &c.blob));
        }
        for u in state.uploads.values() {
            all.extend(u.blocks.chunks().map(|c| &c.blob));
        }
        Ok(names.iter().filter(|n| all.contains(n)).cloned().collect())
    }

    async fn stale_uploads(
        &self,
        created_before: Millis,
        limit: usize,
    ) -> Result<Vec<UploadId>, MetaError> {
        let state = self.state();
        Ok(state
            .uploads
            .values()
            .filter(|u| u.upload.is_open() && u.upload.created_at < created_before)
            .take(limit)
            .map(|u| u.upload.id)
            .collect())
    }

    async fn prune_uploads(&self, created_before: Millis) -> Result<u64, MetaError> {
        let mut state = self.state();
        let before = state.uploads.len();
        state
            .uploads
            .retain(|_, u| u.upload.is_open() || u.upload.created_at >= created_before);
        Ok((before - state.uploads.len()) as u64)
    }

    async fn entry_ids(&self, after: EntryId, limit: usize) -> Result<Vec<EntryId>, MetaError> {
        let state = self.state();
        Ok(state
            .entries
            .range((Bound::Excluded(after), Bound::Unbounded))
            .take(limit)
            .map(|(id, _)| *id)
            .collect())
    }

    async fn entries_awaiting_digest(
        &self,
        after: EntryId,
        limit: usize,
    ) -> Result<Vec<EntryId>, MetaError> {
        let state = self.state();
        Ok(state
            .entries
            .range((Bound::Excluded(after), Bound::Unbounded))
            .filter(|(_, e)| e.row.digest.is_empty())
            .take(limit)
            .map(|(id, _)| *id)
            .collect())
    }

    async fn record_digest(
        &self,
        entry: EntryId,
        sha256: &[[u8; 32]],
        digest: &str,
    ) -> Result<bool, MetaError> {
        let mut state = self.state();
        let Some(e) = state
            .entries
            .get_mut(&entry)
            .filter(|e| e.row.digest.is_empty())
        else {
            return Ok(false);
        };
        for (chunk, sha256) in e.chunks.iter_mut().zip(sha256) {
            chunk.sha256 = Some(*sha256);
        }
        e.row.digest = digest.to_owned();
        Ok(true)
    }

    async fn forget_after(
        &self,
        since: Millis,
        _now: Millis,
    ) -> Result<(usize, Vec<BlobName>), MetaError> {
        let mut state = self.state();
        let mut garbage = Vec::new();
        let before = state.entries.len();
        state.entries.retain(|_, e| {
            let keep = e.entry().created_at <= since;
            if !keep {
                garbage.extend(e.chunks.iter().map(|c| c.blob.clone()));
            }
            keep
        });
        let forgotten = before - state.entries.len();
        for u in state.uploads.values_mut().filter(|u| u.upload.is_open()) {
            garbage.extend(u.blocks.blobs());
            u.upload.state = UploadState::Aborted;
            u.upload.revision += 1;
            u.set_blocks(UploadBlocks::default());
        }
        garbage.sort();
        garbage.dedup();
        Ok((forgotten, garbage))
    }
}

#[async_trait]
impl AdminStore for MemoryStore {
    async fn list_entries(&self, page: &EntryPage<'_>) -> Result<Vec<ListedEntry>, MetaError> {
        let state = self.state();
        let sort_key = |e: &Entry| (page.order.value_of(e), e.id);
        let mut found: Vec<(&StoredEntry, Option<&Quarantine>)> = state
            .in_state(page.filter)
            .filter(|(e, _)| state.selects(page.filter, e))
            .filter(|(e, _)| match page.after {
                None => true,
                Some(after) if page.descending => sort_key(&e.entry()) < after,
                Some(after) => sort_key(&e.entry()) > after,
            })
            .collect();
        found.sort_by_key(|(e, _)| sort_key(&e.entry()));
        if page.descending {
            found.reverse();
        }
        Ok(found
            .into_iter()
            .take(page.limit)
            .map(|(e, why)| ListedEntry {
                entry: e.entry(),
                repository_name: state.name_of(&e.entry().repository),
                written_by: e.written_by(),
                digest: e.row.digest.clone(),
                quarantine: why.cloned(),
            })
            .collect())
    }

    async fn count_entries(&self, filter: &EntryFilter) -> Result<u64, MetaError> {
        let state = self.state();
        Ok(state
            .in_state(filter)
            .filter(|(e, _)| state.selects(filter, e))
            .count() as u64)
    }

    async fn repositories(
        &self,
        only: Option<&str>,
        limit: usize,
    ) -> Result<Vec<RepositoryUsage>, MetaError> {
        let state = self.state();
        let mut out: Vec<RepositoryUsage> = state
            .repositories
            .iter()
            .filter(|(id, seen)| only.is_none_or(|o| id.as_str() == o || seen.name == o))
            .map(|(id, seen)| {
                let held = state
                    .entries
                    .values()
                    .filter(|e| &e.entry().repository == id);
                let pr = held
                    .clone()
                    .filter(|e| e.class() == ScopeClass::PullRequestOrTag);
                RepositoryUsage {
                    repository: id.clone(),
                    name: seen.name.clone(),
                    bytes: held.clone().map(|e| e.entry().size).sum(),
                    entries: held.count() as u64,
                    pr_bytes: pr.clone().map(|e| e.entry().size).sum(),
                    pr_entries: pr.count() as u64,
                    hits: seen.hits,
                    misses: seen.misses,
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then_with(|| a.repository.as_str().cmp(b.repository.as_str()))
        });
        out.truncate(limit);
        Ok(out)
    }

    async fn restores(&self, query: &RestoreQuery) -> Result<Vec<RestoreRecord>, MetaError> {
        let state = self.state();
        let f = &query.written_under;
        let writer = |r: &RestoreRecord, pick: fn(&Provenance) -> &str, wanted: &Option<String>| {
            let have = r.written_by.as_ref().map_or("", pick);
            wanted.as_deref().is_none_or(|w| w == have)
        };
        let mut found: Vec<&(i64, RestoreRecord)> = state
            .restores
            .iter()
            .filter(|(_, r)| query.entries.is_empty() || query.entries.contains(&r.entry_id))
            .filter(|(_, r)| {
                f.repository.as_ref().is_none_or(|name| {
                    r.repository.as_str() == name || state.name_of(&r.repository) == *name
                }) && f
                    .repository_id
                    .as_deref()
                    .is_none_or(|id| r.repository.as_str() == id)
                    && f.scope.as_ref().is_none_or(|s| &r.scope == s)
                    && writer(r, |p| &p.run_id, &f.run_id)
                    && writer(r, |p| &p.subject, &f.subject)
                    && writer(
                        r,
                        |p| p.kind.as_str(),
                        &f.kind.map(|k| k.as_str().to_owned()),
                    )
                    && f.written_after.is_none_or(|t| r.written_at >= t)
                    && f.written_before.is_none_or(|t| r.written_at < t)
            })
            .collect();
        found.sort_by(|(a_id, a), (b_id, b)| (b.last_at, b_id).cmp(&(a.last_at, a_id)));
        Ok(found
            .into_iter()
            .take(query.limit)
            .map(|(_, r)| r.clone())
            .collect())
    }

    async fn count_repositories(&self) -> Result<u64, MetaError> {
        Ok(self.state().repositories.len() as u64)
    }

    async fn totals(&self) -> Result<Totals, MetaError> {
        let state = self.state();
        Ok(Totals {
            bytes: state.entries.values().map(|e| e.entry().size).sum(),
            entries: state.entries.len() as u64,
            open_uploads: state
                .uploads
                .values()
                .filter(|u| u.upload.is_open())
                .count() as u64,
        })
    }
}

/// Whether a stored row's repository, family, class and start are what `filter` selects.
fn selects(
    filter: &StatsFilter,
    repository: &RepoId,
    family: &str,
    class: RefClass,
    start: Millis,
) -> bool {
    (filter.since..filter.until).contains(&start)
        && filter.repository.as_ref().is_none_or(|r| r == repository)
        && filter.family.as_deref().is_none_or(|f| f == family)
        && filter.class.is_none_or(|c| c == class)
}

/// `rows` summed per (key, start floored to `width`), in start order.
fn summed_by_width(
    rows: impl Iterator<Item = ((RepoId, String, RefClass), Millis, Counters)>,
    width: Bucket,
) -> Vec<StatsRow> {
    let mut sums = BTreeMap::<(Millis, RepoId, String, RefClass), Counters>::new();
    for ((repository, family, class), start, counters) in rows {
        let start = width.floor(start);
        sums.entry((start, repository, family, class))
            .or_default()
            .add(&counters);
    }
    sums.into_iter()
        .map(|((start, repository, family, class), counters)| StatsRow {
            repository,
            family,
            class,
            bucket: width,
            start,
            counters,
        })
        .collect()
}

impl MemoryStore {
    /// The family rows `filter` selects of the lines `keep` keeps, summed per `width` bucket.
    fn family_rows(
        &self,
        filter: &StatsFilter,
        width: Bucket,
        keep: impl Fn((&RepoId, &String, &RefClass)) -> bool,
    ) -> Vec<StatsRow> {
        let state = self.state();
        let rows = state
            .family_stats
            .iter()
            .filter(|((r, f, c, _, start), _)| selects(filter, r, f, *c, *start) && keep((r, f, c)))
            .map(|((r, f, c, _, start), n)| ((r.clone(), f.clone(), *c), *start, *n));
        summed_by_width(rows, width)
    }
}

#[async_trait]
impl StatsStore for MemoryStore {
    async fn kept_families(
        &self,
        repository: &RepoId,
        families: &[String],
    ) -> Result<(Vec<String>, u64), MetaError> {
        let state = self.state();
        let kept = families
            .iter()
            .filter(|f| {
                state
                    .kept_families
                    .contains_key(&(repository.clone(), (*f).clone()))
            })
            .cloned()
            .collect();
        let count = state
            .kept_families
            .keys()
            .filter(|(r, _)| r == repository)
            .count();
        Ok((kept, count as u64))
    }

    async fn keep_families(
        &self,
        repository: &RepoId,
        families: &[String],
        now: Millis,
    ) -> Result<(), MetaError> {
        let mut state = self.state();
        for family in families {
            state
                .kept_families
                .entry((repository.clone(), family.clone()))
                .or_insert(now);
        }
        Ok(())
    }

    async fn record_stats(&self, counts: &[(StatsKey, Counters)]) -> Result<(), MetaError> {
        let mut state = self.state();
        for (key, counters) in counts {
            state
                .family_stats
                .entry((
                    key.repository.clone(),
                    key.family.clone(),
                    key.class,
                    Bucket::Hour,
                    key.hour,
                ))
                .or_default()
                .add(counters);
            state
                .server_stats
                .entry((key.class, Bucket::Hour, key.hour))
                .or_default()
                .add(counters);
        }
        Ok(())
    }

    async fn family_stats(
        &self,
        filter: &StatsFilter,
        width: Bucket,
    ) -> Result<Vec<StatsRow>, MetaError> {
        Ok(self.family_rows(filter, width, |_| true))
    }

    async fn family_totals(&self, filter: &StatsFilter) -> Result<Vec<StatsRow>, MetaError> {
        let state = self.state();
        let mut lines = BTreeMap::<(RepoId, String, RefClass), (Millis, Counters)>::new();
        for ((r, f, c, _, start), n) in &state.family_stats {
            if selects(filter, r, f, *c, *start) {
                let line = lines
                    .entry((r.clone(), f.clone(), *c))
                    .or_insert((*start, Counters::default()));
                line.0 = line.0.min(*start);
                line.1.add(n);
            }
        }
        Ok(lines
            .into_iter()
            .map(
                |((repository, family, class), (start, counters))| StatsRow {
                    repository,
                    family,
                    class,
                    bucket: Bucket::Day,
                    start,
                    counters,
                },
            )
            .collect())
    }

    async fn line_stats(
        &self,
        filter: &StatsFilter,
        width: Bucket,
        lines: &[(RepoId, String, RefClass)],
    ) -> Result<Vec<StatsRow>, MetaError> {
        Ok(self.family_rows(filter, width, |(r, f, c)| {
            lines
                .iter()
                .any(|(lr, lf, lc)| lr == r && lf == f && lc == c)
        }))
    }

    async fn server_stats(
        &self,
        filter: &StatsFilter,
        width: Bucket,
    ) -> Result<Vec<StatsRow>, MetaError> {
        let state = self.state();
        let any = StatsFilter {
            repository: None,
            family: None,
            ..filter.clone()
        };
        let none = RepoId::new("");
        let rows = state
            .server_stats
            .iter()
            .filter(|((c, _, start), _)| selects(&any, &none, "", *c, *start))
            .map(|((c, _, start), n)| ((none.clone(), String::new(), *c), *start, *n));
        Ok(summed_by_width(rows, width))
    }

    async fn stored_by_family(
        &self,
        repository: Option<&RepoId>,
    ) -> Result<Vec<StoredFamily>, MetaError> {
        let state = self.state();
        let mut sums = BTreeMap::<(RepoId, String, RefClass), (u64, u64)>::new();
        for e in state.entries.values() {
            let repo = &e.entry().repository;
            if repository.is_some_and(|r| r != repo) {
                continue;
            }
            let family = if state
                .kept_families
                .contains_key(&(repo.clone(), e.row.family.clone()))
            {
                e.row.family.clone()
            } else {
                crate::model::stats::OTHER_FAMILY.to_owned()
            };
            let sum = sums
                .entry((repo.clone(), family, e.ref_class()))
                .or_default();
            sum.0 += e.entry().size;
            sum.1 += 1;
        }
        Ok(sums
            .into_iter()
            .map(
                |((repository, family, class), (bytes, entries))| StoredFamily {
                    repository,
                    family,
                    class,
                    bytes,
                    entries,
                },
            )
            .collect())
    }

    async fn fold_stats(
        &self,
        hours_before: Millis,
        days_before: Millis,
        families_before: Millis,
    ) -> Result<(u64, u64), MetaError> {
        let mut state = self.state();
        let state = &mut *state;
        let day = |start: Millis| start - start % Bucket::Day.millis();
        let mut folded = 0;
        let old_hours: Vec<_> = state
            .family_stats
            .keys()
            .filter(|k| k.3 == Bucket::Hour && k.4 < hours_before)
            .cloned()
            .collect();
        for key in old_hours {
            let n = state.family_stats.remove(&key).unwrap_or_default();
            let (r, f, c, _, start) = key;
            state
                .family_stats
                .entry((r, f, c, Bucket::Day, day(start)))
                .or_default()
                .add(&n);
            folded += 1;
        }
        let old_hours: Vec<_> = state
            .server_stats
            .keys()
            .filter(|k| k.1 == Bucket::Hour && k.2 < hours_before)
            .cloned()
            .collect();
        for key in old_hours {
            let n = state.server_stats.remove(&key).unwrap_or_default();
            let (c, _, start) = key;
            state
                .server_stats
                .entry((c, Bucket::Day, day(start)))
                .or_default()
                .add(&n);
            folded += 1;
        }
        let before = state.family_stats.len() + state.server_stats.len();
        state
            .family_stats
            .retain(|k, _| !(k.3 == Bucket::Day && k.4 < days_before));
        state
            .server_stats
            .retain(|k, _| !(k.1 == Bucket::Day && k.2 < days_before));
        let dropped = before - state.family_stats.len() - state.server_stats.len();
        let named: std::collections::HashSet<(RepoId, String)> = state
            .family_stats
            .keys()
            .map(|(r, f, ..)| (r.clone(), f.clone()))
            .collect();
        state
            .kept_families
            .retain(|key, since| *since >= families_before || named.contains(key));
        Ok((folded, dropped as u64))
    }
}
