//! Restore bookkeeping (last-used time and hit count, who received each entry, and each
//! repository's misses) kept in memory and written in batches, with the family statistics
//! (`super::family_stats`).
//!
//! Every hit used to be one write transaction on the lookup path; a restore-heavy workload then
//! queued on the database writer. Hits are now folded per entry and flushed every second (and at
//! shutdown), so a lookup does no write at all. The cost: after a crash, up to one second of hit
//! counts is lost, which only makes eviction slightly less precise. While the database is
//! away, what is pending stays in memory (one slot per entry and per repository) and is written
//! when it answers again.

// A fast, randomly seeded hasher: every restore or miss is counted here (see `family_stats`).
use foldhash::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;
use super::family_stats::FamilyStats;
use crate::auth::Identity;
use crate::meta::{MetaError, MetaStore, NewRestore, RestoreStore, Uses, MAX_READERS_PER_ENTRY};
use crate::model::{CallerKind, Clock, EntryId, Millis, Provenance, RepoId};
use std::net::IpAddr;

pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// The longest wait between tries while the database is away: what is kept is written at
/// most this long after the database is back.
pub const MAX_RETRY: Duration = Duration::from_secs(16);

/// Restores and misses not yet written.
#[derive(Debug, Default, Clone)]
pub struct UsageBuffer(Arc<Mutex<Pending>>);

#[derive(Debug, Default)]
struct Pending {
    /// Entry → (hits, latest use).
    hits: HashMap<EntryId, (u64, Millis)>,
    /// Entry → who received it: at most [`MAX_READERS_PER_ENTRY`] readers, the most recent.
    readers: HashMap<EntryId, Vec<Reading>>,
    /// Repository → (its name, lookups that found nothing).
    misses: HashMap<RepoId, (String, u64)>,
}

/// One reader's restores of one entry, not yet written. The caller's texts are copied once,
/// at its first restore: a lookup by a known reader compares and counts. The address is kept
/// as an address (`reader.address` stays empty), so that comparing it formats nothing.
#[derive(Debug, Clone)]
struct Reading {
    reader: Provenance,
    address: Option<IpAddr>,
    count: u64,
    first: Millis,
    last: Millis,
}

impl Reading {
    /// Whether this is the reader of `kind`, `[run, job, subject, issuer]`, from `address`.
    fn is(&self, kind: CallerKind, texts: [&str; 4], address: Option<IpAddr>) -> bool {
        let r = &self.reader;
        self.address == address
            && r.kind == kind
            && [&r.run_id, &r.job_id, &r.subject, &r.issuer] == texts
    }

    /// Adds `count` restores from `first` to `last`.
    fn add(&mut self, count: u64, first: Millis, last: Millis) {
        self.count += count;
        self.first = self.first.min(first);
        self.last = self.last.max(last);
    }
}

/// Adds `new` to an entry's pending readers: to the record of the same reader, else as a new
/// one, the least recent making room past [`MAX_READERS_PER_ENTRY`] (the entry's hit count
/// still counts it).
fn add_reading(readers: &mut Vec<Reading>, new: Reading) {
    let w = &new.reader;
    let texts = [w.run_id.as_str(), &w.job_id, &w.subject, &w.issuer];
    if let Some(known) = readers
        .iter_mut()
        .find(|r| r.is(w.kind, texts, new.address))
    {
        known.add(new.count, new.first, new.last);
        return;
    }
    if readers.len() >= MAX_READERS_PER_ENTRY {
        if let Some(oldest) = (0..readers.len()).min_by_key(|&i| readers[i].last) {
            readers.swap_remove(oldest);
        }
    }
    readers.push(new);
}

impl UsageBuffer {
    fn pending_batch(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A restore of `entry` by `who` from `address`.
    pub fn record(&self, entry: EntryId, who: &Identity, address: Option<IpAddr>, now: Millis) {
        let mut pending = self.pending_batch();
        let slot = pending.hits.entry(entry).or_insert((0, now));
        slot.0 += 1;
        slot.1 = slot.1.max(now);
        let readers = pending.readers.entry(entry).or_default();
        // A known reader is only compared: the caller's texts are copied at its first restore.
        let texts = [who.run_id.as_str(), &who.job_id, &who.subject, &who.issuer];
        let known = readers.iter_mut().find(|r| r.is(who.kind, texts, address));
        match known {
            Some(known) => known.add(1, now, now),
            None => add_reading(
                readers,
                Reading {
                    reader: who.provenance(None),
                    address,
                    count: 1,
                    first: now,
                    last: now,
                },
            ),
        }
    }

    /// A lookup of `repository` (called `name` by its caller, or "") that found nothing.
    pub fn record_miss(&self, repository: &RepoId, name: &str) {
        let mut pending = self.pending_batch();
        match pending.misses.get_mut(repository) {
            Some(slot) => {
                slot.1 += 1;
                if slot.0.is_empty() && !name.is_empty() {
                    slot.0 = name.to_owned();
                }
            }
            None => {
                pending
                    .misses
                    .insert(repository.clone(), (name.to_owned(), 1));
            }
        }
    }

    /// The latest restore of `entry` not yet written, if any.
    pub fn pending_use(&self, entry: EntryId) -> Option<Millis> {
        self.pending_batch().hits.get(&entry).map(|(_, last)| *last)
    }

    /// What is pending, sorted: every process then writes rows in the same order, so two
    /// flushes to a shared database never wait on each other in a cycle.
    fn take(&self) -> Uses {
        let mut pending = self.pending_batch();
        let mut hits: Vec<_> = pending
            .hits
            .drain()
            .map(|(id, (hits, last))| (id, hits, last))
            .collect();
        let mut misses: Vec<_> = pending
            .misses
            .drain()
            .map(|(repository, (name, n))| (repository, name, n))
            .collect();
        let mut restores: Vec<NewRestore> = pending
            .readers
            .drain()
            .flat_map(|(entry, readers)| {
                readers.into_iter().map(move |r| NewRestore {
                    entry,
                    reader: Provenance {
                        address: r.address.map(|a| a.to_string()).unwrap_or_default(),
                        ..r.reader
                    },
                    count: r.count,
                    first_at: r.first,
                    last_at: r.last,
                })
            })
            .collect();
        drop(pending);
        hits.sort_unstable();
        misses.sort_unstable();
        // Stable: one entry's readers stay in the order they came.
        restores.sort_by_key(|r| r.entry);
        Uses {
            hits,
            restores,
            misses,
        }
    }

    /// Puts back what a flush could not write, added to what came since.
    fn keep(&self, uses: Uses) {
        let mut pending = self.pending_batch();
        for r in uses.restores {
            let address = r.reader.address.parse().ok();
            let reading = Reading {
                reader: Provenance {
                    address: String::new(),
                    ..r.reader
                },
                address,
                count: r.count,
                first: r.first_at,
                last: r.last_at,
            };
            add_reading(pending.readers.entry(r.entry).or_default(), reading);
        }
        for (id, n, last) in uses.hits {
            let slot = pending.hits.entry(id).or_insert((0, last));
            slot.0 += n;
            slot.1 = slot.1.max(last);
        }
        for (repository, name, n) in uses.misses {
            pending.misses.entry(repository).or_insert((name, 0)).1 += n;
        }
    }

    /// Writes what is pending; what it could not write is kept for the next try.
    pub async fn flush(&self, meta: &dyn RestoreStore) -> Result<(), MetaError> {
        let uses = self.take();
        if uses.is_empty() {
            return Ok(());
        }
        if let Err(e) = meta.record_uses(&uses).await {
            self.keep(uses);
            return Err(e);
        }
        Ok(())
    }

    /// One round of [`UsageBuffer::run`] (and of an operator's read): the restores, then the
    /// statistics.
    pub(super) async fn round(
        &self,
        meta: &dyn MetaStore,
        stats: &FamilyStats,
        clock: &dyn Clock,
    ) -> Result<(), MetaError> {
        self.flush(meta).await?;
        stats.flush(meta, clock.now()).await
    }

    /// Flushes every [`FLUSH_EVERY`] until `stop`, then once more; the family statistics
    /// (`stats`) are written in the same round, after the restores. While the database is
    /// away, rounds back off (up to [`MAX_RETRY`]) and keep what they could not write.
    pub async fn run(
        self,
        meta: Arc<dyn MetaStore>,
        stats: FamilyStats,
        clock: Arc<dyn Clock>,
        stop: CancellationToken,
    ) {
        let mut backoff = Backoff::new(2 * FLUSH_EVERY, MAX_RETRY);
        loop {
            let wait = backoff.retry_in().unwrap_or(FLUSH_EVERY);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => break,
            }
            match self.round(meta.as_ref(), &stats, clock.as_ref()).await {
                Ok(()) => {
                    if let Some(failed) = backoff.succeeded() {
                        tracing::info!(failed_rounds = failed, "restore bookkeeping written again");
                    }
                }
                Err(e) if backoff.failed() => tracing::warn!(
                    error = %e,
                    "could not write the restore bookkeeping; kept, and retried less often until the database answers"
                ),
                Err(e) => tracing::debug!(error = %e, "restore bookkeeping still not written"),
            }
        }
        if let Err(e) = self.round(meta.as_ref(), &stats, clock.as_ref()).await {
            tracing::warn!(error = %e, "could not write the restore bookkeeping at shutdown");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller in run `run`.
    fn reader(run: &str) -> Identity {
        Identity {
            repository: RepoId::new("1"),
            repository_name: "octo/a".into(),
            read_scopes: Vec::new(),
            write_scope: None,
            kind: crate::model::CallerKind::Github,
            issuer: "iss".into(),
            subject: "repo:octo/a:ref:refs/heads/main".into(),
            run_id: run.into(),
            job_id: "build".into(),
        }
    }

    #[test]
    fn readers_fold_per_entry_and_address() {
        let buf = UsageBuffer::default();
        let one = EntryId::new(1);
        let here: Option<std::net::IpAddr> = Some([10, 0, 0, 1].into());
        buf.record(one, &reader("7"), here, 10);
        buf.record(one, &reader("7"), here, 30);
        buf.record(one, &reader("8"), here, 20);
        buf.record(one, &reader("7"), None, 40);
        let restores = buf.take().restores;
        let seen: Vec<(&str, &str, u64, Millis, Millis)> = restores
            .iter()
            .map(|r| {
                (
                    r.reader.run_id.as_str(),
                    r.reader.address.as_str(),
                    r.count,
                    r.first_at,
                    r.last_at,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("7", "10.0.0.1", 2, 10, 30),
                ("8", "10.0.0.1", 1, 20, 20),
                ("7", "", 1, 40, 40)
            ],
            "one record per reader and address, counted, with its first and latest restore"
        );
    }

    #[test]
    fn an_entry_keeps_its_most_recent_readers_in_memory() {
        let buf = UsageBuffer::default();
        let one = EntryId::new(1);
        for i in 0..(MAX_READERS_PER_ENTRY + 3) {
            buf.record(one, &reader(&i.to_string()), None, i as Millis);
        }
        let Uses { hits, restores, .. } = buf.take();
        assert_eq!(
            hits,
            [(
                one,
                (MAX_READERS_PER_ENTRY + 3) as u64,
                (MAX_READERS_PER_ENTRY + 2) as Millis
            )]
        );
        assert_eq!(restores.len(), MAX_READERS_PER_ENTRY, "bounded");
        assert!(
            restores.iter().all(|r| r.reader.run_id != "0"),
            "the oldest made room"
        );
    }

    #[test]
    fn hits_fold_per_entry() {
        let buf = UsageBuffer::default();
        let (one, two) = (EntryId::new(1), EntryId::new(2));
        buf.record(one, &reader("1"), None, 10);
        buf.record(one, &reader("1"), None, 30);
        buf.record(one, &reader("1"), None, 20);
        buf.record(two, &reader("1"), None, 5);
        let batch = buf.take().hits;
        assert_eq!(batch, [(one, 3, 30), (two, 1, 5)], "folded, in entry order");
        assert!(buf.take().hits.is_empty());
    }

    #[test]
    fn misses_fold_per_repository_and_keep_a_name() {
        let buf = UsageBuffer::default();
        let (a, b) = (RepoId::new("1"), RepoId::new("2"));
        buf.record_miss(&b, "");
        buf.record_miss(&a, "octo/a");
        buf.record_miss(&a, "");
        buf.record_miss(&b, "octo/b");
        let batch = buf.take().misses;
        assert_eq!(
            batch,
            [(a, "octo/a".into(), 2), (b, "octo/b".into(), 2)],
            "folded, named, in repository order"
        );
        assert!(buf.take().misses.is_empty());
    }

    /// A database that can be away: it refuses every write while `away`, and keeps what it
    /// was given otherwise.
    #[derive(Debug, Default)]
    struct Flaky {
        away: std::sync::atomic::AtomicBool,
        written: Mutex<Vec<Uses>>,
    }

    impl Flaky {
        fn set_away(&self, away: bool) {
            self.away.store(away, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[async_trait::async_trait]
    impl RestoreStore for Flaky {
        async fn find_candidates(
            &self,
            _: &RepoId,
            _: &crate::model::Version,
            _: &[crate::model::Scope],
            _: &[String],
        ) -> Result<Vec<crate::model::Candidate>, MetaError> {
            Ok(Vec::new())
        }

        async fn entry(
            &self,
            _: EntryId,
            _: crate::meta::EntryState,
        ) -> Result<Option<(crate::model::Entry, Vec<crate::meta::EntryChunk>)>, MetaError>
        {
            Ok(None)
        }

        async fn record_uses(&self, uses: &Uses) -> Result<(), MetaError> {
            if self.away.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(MetaError::Unavailable("connection refused".into()));
            }
            self.written.lock().unwrap().push(uses.clone());
            Ok(())
        }
    }

    #[tokio::test]
    async fn what_a_flush_cannot_write_is_kept_and_written_once_when_the_database_is_back() {
        let buf = UsageBuffer::default();
        let db = Flaky::default();
        let (one, two, repo) = (EntryId::new(1), EntryId::new(2), RepoId::new("1"));
        buf.record(one, &reader("1"), None, 10);
        buf.record_miss(&repo, "octo/a");
        db.set_away(true);
        for _ in 0..3 {
            let refused = buf.flush(&db).await;
            assert!(
                matches!(refused, Err(MetaError::Unavailable(_))),
                "{refused:?}"
            );
        }
        buf.record(one, &reader("1"), None, 30);
        buf.record(two, &reader("1"), None, 20);
        buf.record_miss(&repo, "");
        db.set_away(false);
        buf.flush(&db).await.unwrap();
        buf.flush(&db).await.unwrap();
        let written = db.written.lock().unwrap();
        assert_eq!(
            written.len(),
            1,
            "one write, nothing left for the second flush"
        );
        assert_eq!(
            written[0].hits,
            [(one, 2, 30), (two, 1, 20)],
            "each restore counted once, with the latest use"
        );
        assert_eq!(written[0].misses, [(repo, "octo/a".into(), 2)]);
        let restores: Vec<(EntryId, u64)> = written[0]
            .restores
            .iter()
            .map(|r| (r.entry, r.count))
            .collect();
        assert_eq!(
            restores,
            [(one, 2), (two, 1)],
            "who restored, kept until written"
        );
    }
}
