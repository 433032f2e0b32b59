//! Promotion: the entries of one scope made readable in another scope of their repository, as
//! entries of their own over the same chunks (no byte copied). A merge queue's entries become
//! its base branch's once the queue's commit is the branch's head; a merged pull request's,
//! once it merged (issue #58).
//!
//! The rules hold whatever asks (a webhook, an operator): the target scope's write policy wins
//! (nothing goes into a frozen or denied scope), an entry the target scope holds already with
//! the same key and version wins (entries are immutable), and what is promoted counts against
//! the repository's quota like any save. Each promoted entry records where it came from
//! ([`Promotion`]), so that one promotion can be listed, purged or quarantined by its
//! `promoted_by`.

use futures_util::StreamExt;

use crate::auth::Identity;
use crate::meta::{EntryState, MetaError, NewEntry};
use crate::model::{
    CacheKey, CallerKind, EntryFilter, EntryId, EntryPage, EntryRecord, ListedEntry, LogSafe,
    Millis, Promotion, RefClass, RepoId, Scope, ScopeClass, Slot, Version,
};

use super::{Cache, CacheError};

/// Entries read per round.
const PAGE: usize = 500;
/// Entries promoted at once.
const CONCURRENCY: usize = 8;

/// What became of one entry.
enum One {
    Promoted(Promoted),
    /// The target scope holds its key and version.
    Present,
    /// The write policy refuses it in the target scope.
    Refused,
    /// Removed meanwhile, or stored before today's rules on keys.
    Gone,
}

/// What to promote, from where to where, and on whose word.
#[derive(Debug, Clone)]
pub struct PromotionRequest<'a> {
    pub repository: &'a RepoId,
    pub from_scope: &'a Scope,
    pub to_scope: &'a Scope,
    /// Only the entries written at or after this (a pull request's, after its last push).
    pub written_after: Option<Millis>,
    /// What promotes ([`Promotion::by`]) and why ([`Promotion::cause`]).
    pub by: &'a str,
    pub cause: &'a str,
    /// Decide everything, change nothing.
    pub dry_run: bool,
}

/// One entry promoted, or that a dry run would promote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promoted {
    /// The new entry in the target scope (`None` on a dry run).
    pub id: Option<EntryId>,
    /// The entry it copies.
    pub from: EntryId,
    pub key: String,
    pub version: String,
    pub size: u64,
}

/// What a promotion did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromotionReport {
    pub promoted: Vec<Promoted>,
    /// Entries whose key and version the target scope holds already: the entry there stays.
    pub present: u64,
    /// Entries the write policy refuses in the target scope (a freeze, a denial).
    pub refused: u64,
}

impl Cache {
    /// Promotes the entries of `request.from_scope` into `request.to_scope` (see the module).
    pub async fn promote(
        &self,
        request: &PromotionRequest<'_>,
    ) -> Result<PromotionReport, CacheError> {
        if request.from_scope == request.to_scope {
            return Err(crate::model::InvalidInput(
                "a promotion needs two different scopes".into(),
            )
            .into());
        }
        let promotion = Promotion {
            from_scope: request.from_scope.clone(),
            by: request.by.to_owned(),
            cause: request.cause.to_owned(),
        };
        let filter = EntryFilter {
            repository_id: Some(request.repository.as_str().to_owned()),
            scope: Some(request.from_scope.clone()),
            written_after: request.written_after,
            ..EntryFilter::default()
        };
        let started = std::time::Instant::now();
        let mut report = PromotionReport::default();
        let walked = async {
            let mut after = None;
            loop {
                let page = EntryPage {
                    after,
                    ..EntryPage::by_creation(&filter, PAGE)
                };
                let batch = self.meta.select_entries(&page).await?.entries;
                let Some(last) = batch.last() else {
                    return Ok::<_, CacheError>(());
                };
                after = Some((last.entry.created_at, last.entry.id));
                // A few at a time: each is a read and a transaction, which a networked
                // database answers in a round trip or two.
                let promotions: Vec<_> = batch
                    .iter()
                    .map(|source| self.promote_one(request, &promotion, source))
                    .collect();
                let outcomes: Vec<_> = futures_util::stream::iter(promotions)
                    .buffered(CONCURRENCY)
                    .collect()
                    .await;
                for outcome in outcomes {
                    match outcome? {
                        One::Promoted(promoted) => report.promoted.push(promoted),
                        One::Present => report.present += 1,
                        One::Refused => report.refused += 1,
                        One::Gone => {}
                    }
                }
            }
        }
        .await;
        // What was promoted stands even if a later entry failed: lookups see it, and the quota
        // counts it.
        if let Some(last) = report.promoted.last().and_then(|p| p.id) {
            self.lookups.invalidate();
            let size = report.promoted.iter().map(|p| p.size).sum();
            let class = ScopeClass::of(request.to_scope);
            // The promotion stands whatever happens here; the next save retries an eviction.
            if let Err(e) = self
                .enforce_quota(request.repository, last, class, size)
                .await
            {
                tracing::warn!(repository = %LogSafe(request.repository.as_str()), error = %e, "could not enforce the repository quota after a promotion");
            }
        }
        walked?;
        tracing::info!(
            target: "hoard::audit",
            action = if request.dry_run { "promote_dry_run" } else { "promote" },
            by = %LogSafe(request.by),
            cause = %LogSafe(request.cause),
            repository = %LogSafe(request.repository.as_str()),
            from_scope = %LogSafe(request.from_scope.as_str()),
            to_scope = %LogSafe(request.to_scope.as_str()),
            promoted = report.promoted.len(),
            present = report.present,
            refused = report.refused,
            elapsed_ms = started.elapsed().as_millis() as u64,
        );
        Ok(report)
    }

    /// Promotes `source` into the target scope unless the policy refuses it or the scope holds
    /// its key and version already.
    async fn promote_one(
        &self,
        request: &PromotionRequest<'_>,
        promotion: &Promotion,
        source: &ListedEntry,
    ) -> Result<One, CacheError> {
        let entry = &source.entry;
        let (Ok(key), Ok(version)) = (CacheKey::parse(&entry.key), Version::parse(&entry.version))
        else {
            return Ok(One::Gone); // Stored before today's rules on keys: never promoted.
        };
        let slot = Slot {
            repository: request.repository.clone(),
            scope: request.to_scope.clone(),
            key,
            version,
        };
        // The target scope's policy, as it would judge the source's writer saving there.
        let writer = writer_in(source, request.to_scope);
        if self.check_write_policy(&writer, request.to_scope).is_err() {
            return Ok(One::Refused);
        }
        let promoted = |id| Promoted {
            id,
            from: entry.id,
            key: entry.key.clone(),
            version: entry.version.clone(),
            size: entry.size,
        };
        if request.dry_run {
            let read = crate::meta::SlotRead::Reserve {
                live_since: Millis::MAX,
            };
            return Ok(
                match self.meta.slot_state(&slot, read).await?.entry_exists {
                    true => One::Present,
                    false => One::Promoted(promoted(None)),
                },
            );
        }
        let Some((_, chunks)) = self.meta.entry(entry.id, EntryState::Live).await? else {
            return Ok(One::Gone); // Removed meanwhile.
        };
        let chunks: Vec<_> = chunks.into_iter().map(|c| c.chunk).collect();
        let folded = slot.key.folded();
        let family = self
            .stats
            .family_of_save(request.repository, &entry.key, &folded);
        let new = NewEntry {
            key: &entry.key,
            repository_name: &source.repository_name,
            record: EntryRecord {
                promotion: Some(promotion.clone()),
                ..source.record.clone()
            },
            family: &family,
            ref_class: RefClass::of_caller(Some(request.to_scope), &[]),
            ..NewEntry::new(&slot, &chunks, self.clock.now())
        };
        match self.meta.finalize(None, new).await {
            Ok(id) => {
                tracing::info!(
                    target: "hoard::audit",
                    action = "promote_entry",
                    by = %LogSafe(&promotion.by),
                    id = id.get(),
                    from = entry.id.get(),
                    key = %LogSafe(&entry.key),
                    to_scope = %LogSafe(request.to_scope.as_str()),
                );
                Ok(One::Promoted(promoted(Some(id))))
            }
            Err(MetaError::Conflict) => Ok(One::Present),
            Err(e) => Err(e.into()),
        }
    }
}

/// The source entry's writer as a caller writing to `scope`: what the write policy judges (a
/// rule for some kinds of caller applies as it would to that writer's own save).
fn writer_in(source: &ListedEntry, scope: &Scope) -> Identity {
    let writer = source.record.written_by.as_ref();
    Identity {
        repository: source.entry.repository.clone(),
        repository_name: source.repository_name.clone(),
        read_scopes: vec![scope.clone()],
        write_scope: Some(scope.clone()),
        kind: writer.map_or(CallerKind::Anonymous, |w| w.kind),
        issuer: writer.map(|w| w.issuer.clone()).unwrap_or_default(),
        subject: writer.map(|w| w.subject.clone()).unwrap_or_default(),
        run_id: writer.map(|w| w.run_id.clone()).unwrap_or_default(),
        job_id: writer.map(|w| w.job_id.clone()).unwrap_or_default(),
    }
}
