//! What operators do with the cache: list and inspect entries, delete them, and see what each
//! repository holds and how its lookups go. The admin API and `hoard caches` come here; runtime
//! tokens never do.

use crate::meta::{EntryMove, EntryState, MetaError, UploadRead, UploadSweep};
use crate::model::{EntryFilter, EntryOrder, EntryPage, ListedEntry, RepositoryUsage, Totals};
use crate::model::{EntryId, LogSafe, Millis, Provenance, RemovalCause, RepoId, Upload, UploadId};

use super::{Cache, CacheError};

/// The most entries one page lists.
pub const MAX_PAGE: usize = 1000;

/// Entries removed per round of a deletion by filter.
const DELETE_BATCH: usize = 500;

/// A page of entries.
#[derive(Debug, Clone)]
pub struct Listing {
    /// How many entries the filter selects, on every page.
    pub total: u64,
    pub entries: Vec<ListedEntry>,
    /// Where the next page starts (the last entry's sort value and id); `None` on the last page.
    pub next: Option<(i64, EntryId)>,
}

/// A listing request.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub filter: EntryFilter,
    pub order: EntryOrder,
    pub descending: bool,
    pub after: Option<(i64, EntryId)>,
    /// Clamped to 1..=[`MAX_PAGE`].
    pub limit: usize,
}

/// The most ids a purge names: its count and bytes are always whole, but a purge of millions
/// of entries must not hold (or answer) millions of ids.
pub const MAX_PURGE_IDS: usize = 10_000;

/// Restore records one answer holds at most.
pub const MAX_RESTORES: usize = 1000;

/// What an operator's removal does with the live entries it selects. Entries already in
/// quarantine can only be deleted: that ends their quarantine early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposal {
    /// Out of every lookup, and their bytes go after the deletion grace.
    Delete,
    /// As [`Disposal::Delete`], and their restore records go at once: the operator reclaims
    /// them with the entries, and gives up knowing who restored them.
    DeleteWithRestoreRecords,
    /// Out of every lookup at once, as a deletion; their rows, bytes and restore records are
    /// kept for `--quarantine-retention`, for examination, or until released.
    Quarantine,
}

/// What a deletion removed (or, on a dry run, would remove).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Purge {
    /// How many entries, and their bytes.
    pub count: u64,
    pub bytes: u64,
    /// The first [`MAX_PURGE_IDS`] of their ids, oldest first.
    pub ids: Vec<EntryId>,
    /// Open uploads the filter selects, ended with the entries (on a dry run, to be ended).
    pub uploads: u64,
    /// Restore records of the entries forgotten with them
    /// ([`Disposal::DeleteWithRestoreRecords`]; none on a dry run).
    pub restore_records: u64,
}

/// Restore records, most recent first, and whether more matched than they are.
#[derive(Debug, Clone, Default)]
pub struct Restores {
    pub records: Vec<crate::model::RestoreRecord>,
    /// Records were left out: more matched than the query's limit.
    pub truncated: bool,
}

impl Purge {
    pub fn add(&mut self, entry: &crate::model::Entry) {
        self.count += 1;
        self.bytes += entry.size;
        if self.ids.len() < MAX_PURGE_IDS {
            self.ids.push(entry.id);
        }
    }

    fn extend(&mut self, other: Purge) {
        self.count += other.count;
        self.bytes += other.bytes;
        self.restore_records += other.restore_records;
        let room = MAX_PURGE_IDS.saturating_sub(self.ids.len());
        self.ids.extend(other.ids.into_iter().take(room));
    }
}

/// Whether `filter` selects `upload` as it would the entry the upload becomes; `named` are the
/// ids of the repository the filter names, when it names one.
fn upload_selected(filter: &EntryFilter, named: Option<&[RepoId]>, upload: &Upload) -> bool {
    let by = upload.written_by.as_ref();
    let writer = |wanted: &Option<String>, field: fn(&Provenance) -> &str| {
        wanted
            .as_deref()
            .is_none_or(|w| by.is_some_and(|p| field(p) == w))
    };
    named.is_none_or(|ids| ids.contains(&upload.repository))
        && filter
            .repository_id
            .as_deref()
            .is_none_or(|id| upload.repository.as_str() == id)
        && filter.scope.as_ref().is_none_or(|s| &upload.scope == s)
        && filter
            .folded_key_prefix
            .as_deref()
            .is_none_or(|p| upload.key.to_lowercase().starts_with(p))
        && filter
            .folded_key
            .as_deref()
            .is_none_or(|k| upload.key.to_lowercase() == k)
        && filter
            .version
            .as_deref()
            .is_none_or(|v| upload.version == v)
        && writer(&filter.run_id, |p| &p.run_id)
        && writer(&filter.subject, |p| &p.subject)
        && filter.kind.is_none_or(|k| by.is_some_and(|p| p.kind == k))
        && filter.written_after.is_none_or(|t| upload.created_at >= t)
        && filter.written_before.is_none_or(|t| upload.created_at < t)
        // An open upload's bytes have no digest yet, and were never promoted.
        && filter.digest.is_none()
        && filter.promoted_by.is_none()
        && filter.chunk.is_none()
}

/// A filter as the audit log shows it: each part that is set, as `name=value`.
fn describe(filter: &EntryFilter) -> String {
    let EntryFilter {
        repository,
        repository_id,
        scope,
        folded_key_prefix,
        folded_key,
        version,
        id,
        run_id,
        subject,
        kind,
        written_after,
        written_before,
        digest,
        quarantined,
        promoted_by,
        chunk,
    } = filter;
    let parts: [(&str, Option<String>); 16] = [
        ("state", quarantined.then(|| "quarantined".to_owned())),
        ("repository", repository.clone()),
        ("repository_id", repository_id.clone()),
        ("scope", scope.as_ref().map(|s| s.as_str().to_owned())),
        ("key", folded_key_prefix.clone()),
        ("exact_key", folded_key.clone()),
        ("version", version.clone()),
        ("id", id.map(|i| i.get().to_string())),
        ("run_id", run_id.clone()),
        ("subject", subject.clone()),
        ("kind", kind.map(|k| k.as_str().to_owned())),
        ("written_after", written_after.map(|t| t.to_string())),
        ("written_before", written_before.map(|t| t.to_string())),
        ("digest", digest.clone()),
        ("promoted_by", promoted_by.clone()),
        ("chunk", chunk.clone()),
    ];
    let set: Vec<String> = parts
        .into_iter()
        .filter_map(|(name, value)| Some(format!("{name}={:?}", value?)))
        .collect();
    if set.is_empty() {
        "all".into()
    } else {
        set.join(" ")
    }
}

/// What the server holds and how it is set, for `status`.
#[derive(Debug, Clone)]
pub struct CacheStatus {
    pub totals: Totals,
    pub limits: super::lifecycle::Limits,
    pub max_entry_size: u64,
    /// Entries quarantined by this process since it started.
    pub quarantined: u64,
    /// Conditions an operator should act on, each one sentence.
    pub warnings: Vec<String>,
}

impl Cache {
    /// A page of the entries `query` selects.
    pub async fn select_entries(&self, query: &ListQuery) -> Result<Listing, CacheError> {
        self.write_usage().await?;
        let limit = query.limit.clamp(1, MAX_PAGE);
        let page = EntryPage {
            filter: &query.filter,
            order: query.order,
            descending: query.descending,
            after: query.after,
            // One more than asked tells whether another page follows.
            limit: limit + 1,
            count: true,
        };
        let selected = self.meta.select_entries(&page).await?;
        let mut entries = selected.entries;
        let next = if entries.len() > limit {
            entries.truncate(limit);
            entries
                .last()
                .map(|l| (query.order.value_of(&l.entry), l.entry.id))
        } else {
            None
        };
        Ok(Listing {
            total: selected.total.unwrap_or_default(),
            entries,
            next,
        })
    }

    /// One visible entry, with its repository's name.
    pub async fn listed_entry(&self, id: EntryId) -> Result<Option<ListedEntry>, CacheError> {
        self.write_usage().await?;
        self.listed_entry_as_written(id).await
    }

    /// One visible entry and its restore records (see [`Cache::restores`]), after one write of
    /// the pending bookkeeping.
    pub async fn entry_with_readers(
        &self,
        id: EntryId,
    ) -> Result<Option<(ListedEntry, Vec<crate::model::RestoreRecord>)>, CacheError> {
        self.write_usage().await?;
        let Some(listed) = self.listed_entry_as_written(id).await? else {
            return Ok(None);
        };
        let query = crate::model::RestoreQuery {
            entries: vec![id],
            limit: MAX_RESTORES,
            ..Default::default()
        };
        Ok(Some((listed, self.meta.restores(&query).await?)))
    }

    /// [`Cache::listed_entry`] as the store has it now.
    async fn listed_entry_as_written(
        &self,
        id: EntryId,
    ) -> Result<Option<ListedEntry>, CacheError> {
        // Live, or else in quarantine (an id is never in both).
        for quarantined in [false, true] {
            let filter = EntryFilter {
                id: Some(id),
                quarantined,
                ..EntryFilter::default()
            };
            let page = EntryPage::by_creation(&filter, 1);
            let selected = self.meta.select_entries(&page).await?;
            if let Some(found) = selected.entries.into_iter().next() {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// The entry `id`, live or in quarantine, opened for reading: what an operator downloads
    /// to examine it. [`CacheError::EntryNotFound`] if it is neither.
    pub async fn archive(&self, id: EntryId) -> Result<super::OpenEntry, CacheError> {
        let found = match self.meta.entry(id, EntryState::Live).await? {
            Some(live) => Some(live),
            None => self.meta.entry(id, EntryState::Quarantined).await?,
        };
        let (entry, chunks) = found.ok_or(CacheError::EntryNotFound)?;
        Ok(super::OpenEntry { entry, chunks })
    }

    /// How long an entry stays in quarantine (`--quarantine-retention`).
    pub fn quarantine_retention(&self) -> std::time::Duration {
        self.policy.lifecycle.quarantine_retention
    }

    /// Puts a quarantined entry back: lookups find it again, with its id, bytes and records.
    /// [`CacheError::EntryNotFound`] if it is not in quarantine, [`CacheError::SlotTaken`] if a
    /// live entry holds its key and version now.
    pub async fn release(&self, id: EntryId, by: &str) -> Result<(), CacheError> {
        let released = match self.meta.move_entries(&[id], EntryMove::Release).await {
            Err(MetaError::Conflict) => return Err(CacheError::SlotTaken),
            other => other?,
        };
        let entry = released
            .into_iter()
            .next()
            .ok_or(CacheError::EntryNotFound)?;
        // A lookup answered from memory may have missed it while it was away.
        self.lookups.invalidate();
        tracing::info!(
            target: "hoard::audit",
            action = "release",
            by = %LogSafe(by),
            id = id.get(),
            repository = %LogSafe(entry.repository.as_str()),
            size = entry.size,
        );
        Ok(())
    }

    /// Restore records, most recent first: of the entries `query` names, or of every entry
    /// written under its filter (the blast radius of a writer), whether or not the entries
    /// still exist; at most `query.limit`, itself at most [`MAX_RESTORES`], and whether more
    /// matched. The restores not yet written are written first.
    pub async fn restores(
        &self,
        query: &crate::model::RestoreQuery,
    ) -> Result<Restores, CacheError> {
        self.write_usage().await?;
        let limit = query.limit.clamp(1, MAX_RESTORES);
        // One more than answered tells whether the answer is whole.
        let query = crate::model::RestoreQuery {
            limit: limit + 1,
            ..query.clone()
        };
        let mut records = self.meta.restores(&query).await?;
        let truncated = records.len() > limit;
        records.truncate(limit);
        Ok(Restores { records, truncated })
    }

    /// Writes the restores and misses not yet written (see [`super::usage`]), so that what an
    /// operator sees, and how it sorts, includes the latest. Operators ask rarely; lookups never
    /// wait for this. What it cannot write stays pending. A database that is away fails the
    /// operator's call at once (the reads that follow would wait as long again); another
    /// failure is logged and the read goes on.
    pub(super) async fn write_usage(&self) -> Result<(), CacheError> {
        let written = self
            .usage
            .round(self.meta.as_ref(), &self.stats, self.clock.as_ref())
            .await;
        match written {
            Err(e @ MetaError::Unavailable(_)) => Err(e.into()),
            Err(e) => {
                tracing::warn!(error = %e, "could not write the restore bookkeeping before an operator's read; kept for the next try");
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    /// Deletes or quarantines entries for an operator (`by`, for the audit log): the next
    /// lookup misses; deleted entries' chunks go after the deletion grace, so downloads under
    /// way finish. Entries in quarantine are deleted whatever `disposal` says. Returns the
    /// entries removed here (not already gone, nor already in quarantine), in the order given.
    pub async fn delete_entries(
        &self,
        entries: &[ListedEntry],
        by: &str,
        disposal: Disposal,
    ) -> Result<Purge, CacheError> {
        let (kept, live): (Vec<&ListedEntry>, Vec<&ListedEntry>) =
            entries.iter().partition(|l| l.quarantine.is_some());
        let ids = |listed: &[&ListedEntry]| listed.iter().map(|l| l.entry.id).collect::<Vec<_>>();
        let cause = match disposal {
            Disposal::Delete | Disposal::DeleteWithRestoreRecords => RemovalCause::Deleted,
            Disposal::Quarantine => RemovalCause::Quarantined(format!("quarantined by {by}")),
        };
        let mut removed: std::collections::HashSet<EntryId> = self
            .remove(&ids(&live), cause)
            .await?
            .iter()
            .map(|gone| gone.id)
            .collect();
        if disposal != Disposal::Quarantine && !kept.is_empty() {
            let removal = self.removal(EntryState::Quarantined, &RemovalCause::Deleted);
            let ended = self
                .meta
                .move_entries(&ids(&kept), EntryMove::Remove(removal))
                .await?;
            removed.extend(ended.iter().map(|gone| gone.id));
        }
        let mut purge = Purge::default();
        if disposal == Disposal::DeleteWithRestoreRecords {
            let gone: Vec<EntryId> = removed.iter().copied().collect();
            purge.restore_records = self
                .meta
                .drop_restores(crate::meta::RestoreDrop::OfEntries(&gone))
                .await?;
        }
        for listed in entries.iter().filter(|l| removed.contains(&l.entry.id)) {
            let e = &listed.entry;
            let action = match (disposal, listed.quarantine.is_some()) {
                (_, true) => "end_quarantine",
                (Disposal::Delete | Disposal::DeleteWithRestoreRecords, false) => "delete",
                (Disposal::Quarantine, false) => "quarantine",
            };
            tracing::info!(
                target: "hoard::audit",
                action,
                by = %LogSafe(by),
                id = e.id.get(),
                repository = %LogSafe(e.repository.as_str()),
                repository_name = %LogSafe(&listed.repository_name),
                scope = %LogSafe(e.scope.as_str()),
                key = %LogSafe(e.key.as_str()),
                version = %LogSafe(e.version.as_str()),
                size = e.size,
                run_id = %listed.record.written_by.as_ref().map_or("", |p| p.run_id.as_str()),
                restore_records_deleted = disposal == Disposal::DeleteWithRestoreRecords,
            );
            purge.add(e);
        }
        Ok(purge)
    }

    /// Deletes every entry `filter` selects, in rounds, oldest first; on a `dry_run`, deletes
    /// nothing and answers what would have gone. Each purge is audited with its filter and
    /// count.
    pub async fn delete_matching(
        &self,
        filter: &EntryFilter,
        by: &str,
        dry_run: bool,
        disposal: Disposal,
    ) -> Result<Purge, CacheError> {
        if filter.quarantined && disposal == Disposal::Quarantine {
            return Err(CacheError::WrongState(
                "these entries are in quarantine already",
            ));
        }
        let mut purge = Purge::default();
        let mut after = None;
        loop {
            let page = EntryPage {
                after,
                ..EntryPage::by_creation(filter, DELETE_BATCH)
            };
            let batch = self.meta.select_entries(&page).await?.entries;
            let Some(last) = batch.last() else {
                break;
            };
            after = Some((last.entry.created_at, last.entry.id));
            if dry_run {
                batch.iter().for_each(|l| purge.add(&l.entry));
            } else {
                purge.extend(self.delete_entries(&batch, by, disposal).await?);
            }
        }
        // The writer's uploads still open go too: what it staged must not become an entry
        // after the purge (or the quarantine).
        let open = match filter.quarantined {
            true => Vec::new(),
            false => self.open_uploads_matching(filter).await?,
        };
        purge.uploads = open.len() as u64;
        if !dry_run {
            for id in open {
                self.abandon(id).await?;
            }
        }
        tracing::info!(
            target: "hoard::audit",
            action = match (dry_run, disposal) {
                (true, _) => "purge_dry_run",
                (false, Disposal::Delete | Disposal::DeleteWithRestoreRecords) => "purge",
                (false, Disposal::Quarantine) => "purge_to_quarantine",
            },
            by = %LogSafe(by),
            filter = %LogSafe(&describe(filter)),
            count = purge.count,
            size = purge.bytes,
            uploads = purge.uploads,
            restore_records = purge.restore_records,
        );
        Ok(purge)
    }

    /// The open uploads `filter` selects, by what their reservation recorded (repository,
    /// scope, key, version, writer and time). Open uploads are at most `--max-open-uploads`,
    /// so they are read whole and matched here.
    async fn open_uploads_matching(
        &self,
        filter: &EntryFilter,
    ) -> Result<Vec<UploadId>, CacheError> {
        if filter.id.is_some() {
            return Ok(Vec::new());
        }
        // A repository named by owner/name: the ids that carry it.
        let named = match &filter.repository {
            Some(named) => Some(
                self.meta
                    .repositories(Some(named), usize::MAX >> 1)
                    .await?
                    .listed
                    .into_iter()
                    .map(|r| r.repository)
                    .collect::<Vec<_>>(),
            ),
            None => None,
        };
        let most = self.policy.max_open_uploads as usize + 1000;
        let mut selected = Vec::new();
        let open = UploadSweep {
            open_before: Millis::MAX,
            limit: most,
            prune_before: None,
        };
        for id in self.meta.sweep_uploads(open).await?.open {
            let Some(view) = self.meta.upload(id, UploadRead::Blocks).await? else {
                continue;
            };
            let upload = view.upload;
            if upload.is_open() && upload_selected(filter, named.as_deref(), &upload) {
                selected.push(id);
            }
        }
        Ok(selected)
    }

    /// Repositories by bytes held, at most `limit`, or only the one `only` names (id or name);
    /// with the number of repositories known.
    /// The one repository `wanted` names: the repository with that id, else the only one with
    /// that name; `None` if there is none; [`CacheError::AmbiguousRepository`] if several share
    /// the name (never a guess).
    pub async fn one_repository(
        &self,
        wanted: &str,
    ) -> Result<Option<RepositoryUsage>, CacheError> {
        // Written first: a repository known only by its misses so far must count too. The
        // listing's count of every repository is not needed here.
        self.write_usage().await?;
        let mut found = self.meta.repositories(Some(wanted), 100).await?.listed;
        if let Some(at) = found.iter().position(|r| r.repository.as_str() == wanted) {
            return Ok(Some(found.swap_remove(at)));
        }
        match found.len() {
            0 | 1 => Ok(found.pop()),
            n => Err(CacheError::AmbiguousRepository(format!(
                "{n} repositories are named {wanted:?} (ids {}); name one by its repository id",
                found
                    .iter()
                    .map(|r| format!("{:?}", r.repository.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    pub async fn repositories(
        &self,
        only: Option<&str>,
        limit: usize,
    ) -> Result<(u64, Vec<RepositoryUsage>), CacheError> {
        self.write_usage().await?;
        let page = self
            .meta
            .repositories(only, limit.clamp(1, MAX_PAGE))
            .await?;
        Ok((page.totals.repositories, page.listed))
    }

    /// What the server holds, its limits, and what an operator should look at.
    pub async fn status(&self) -> Result<CacheStatus, CacheError> {
        let totals = self.meta.repositories(None, 0).await?.totals;
        let limits = self.policy.lifecycle.clone();
        let quarantined = self.quarantined_count();
        let mut warnings = Vec::new();
        if let Some(max) = limits.max_storage {
            if totals.bytes.saturating_mul(10) >= max.saturating_mul(9) {
                warnings.push(format!(
                    "Entries hold {} of the {} --max-storage allows: the least recently used are being evicted.",
                    totals.bytes, max
                ));
            }
        }
        if quarantined > 0 {
            warnings.push(format!(
                "{quarantined} entries failed an integrity check since start-up and were quarantined: check the storage (the log names them)."
            ));
        }
        if let Err(e) = self.blobs.ping().await {
            warnings.push(format!("The chunk store does not answer: {e}."));
        }
        Ok(CacheStatus {
            totals,
            limits,
            max_entry_size: self.policy.max_entry_size,
            quarantined,
            warnings,
        })
    }
}
