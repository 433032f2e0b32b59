//! Recent answers of the metadata store, kept for a moment: a burst of jobs restoring the same
//! keys (a matrix build starting, a fleet warming up) costs one database query instead of one
//! each, and a download right after a save needs no query at all. With a networked database a
//! query is a round trip to another process; this is where most of the difference to SQLite went.
//!
//! Exact within this process: every change this process makes that an answer could depend on
//! starts a new generation, and answers from an older generation are never used, including
//! answers to queries that were in flight when the change happened. What another process
//! sharing the database changes becomes visible here within the TTL (`--lookup-cache-ttl`); a
//! TTL of zero turns the cache off. Memory is bounded by [`MAX_ANSWERS`].

// A fast, randomly seeded hasher: every lookup hashes its key here (see `family_stats`).
use foldhash::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::model::{Candidate, Clock, Millis, RepoId, Scope, Version};

/// Most answers kept; past this, expired answers go, and if none has expired, all of them.
pub const MAX_ANSWERS: usize = 4096;

/// Answers by question.
#[derive(Debug)]
pub struct Recent<K, V> {
    ttl: Millis,
    inner: Mutex<Inner<K, V>>,
}

/// Lookup answers: the candidates for (repository, version, scopes, keys).
pub type RecentLookups = Recent<String, Vec<Candidate>>;

#[derive(Debug)]
struct Inner<K, V> {
    generation: u64,
    answers: HashMap<K, Answer<V>>,
}

#[derive(Debug)]
struct Answer<V> {
    at: Millis,
    value: Arc<V>,
}

/// What a query started at: compare it when storing the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation(u64);

impl RecentLookups {
    /// The cache key of one lookup: every input of the query, separated by NUL (which no key,
    /// version or scope contains).
    pub fn key(
        repository: &RepoId,
        version: &Version,
        scopes: &[Scope],
        folded: &[String],
    ) -> String {
        let mut key = String::with_capacity(128);
        for part in [repository.as_str(), version.as_str()]
            .into_iter()
            .chain(scopes.iter().map(Scope::as_str))
            .chain(std::iter::once("\u{1}"))
            .chain(folded.iter().map(String::as_str))
        {
            key.push_str(part);
            key.push('\0');
        }
        key
    }
}

impl<K: Hash + Eq, V> Recent<K, V> {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl: ttl.as_millis() as Millis,
            inner: Mutex::new(Inner {
                generation: 0,
                answers: HashMap::default(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K, V>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh answer of the current generation, if there is one.
    pub fn get<Q>(&self, key: &Q, now: Millis) -> Option<Arc<V>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.ttl <= 0 {
            return None;
        }
        let inner = self.lock();
        let answer = inner.answers.get(key)?;
        (now.saturating_sub(answer.at) < self.ttl).then(|| answer.value.clone())
    }

    /// The fresh answer to `key`, or else the one `load` gives, kept for the next caller unless
    /// what it depends on changed while it was loading.
    pub async fn get_or_load<E, Fut>(
        &self,
        key: K,
        clock: &dyn Clock,
        load: impl FnOnce() -> Fut,
    ) -> Result<Arc<V>, E>
    where
        Fut: std::future::Future<Output = Result<V, E>>,
    {
        if let Some(known) = self.get(&key, clock.now()) {
            return Ok(known);
        }
        let started = self.generation();
        let value = Arc::new(load().await?);
        self.put(key, started, clock.now(), value.clone());
        Ok(value)
    }

    /// Call before querying; hand the result to [`Self::put`].
    pub fn generation(&self) -> Generation {
        Generation(self.lock().generation)
    }

    /// Keeps an answer, unless the entries changed since its query started.
    pub fn put(&self, key: K, started: Generation, now: Millis, value: Arc<V>) {
        if self.ttl <= 0 {
            return;
        }
        let mut inner = self.lock();
        if inner.generation != started.0 {
            return;
        }
        if inner.answers.len() >= MAX_ANSWERS {
            let ttl = self.ttl;
            inner.answers.retain(|_, a| now.saturating_sub(a.at) < ttl);
            if inner.answers.len() >= MAX_ANSWERS {
                inner.answers.clear();
            }
        }
        inner.answers.insert(key, Answer { at: now, value });
    }

    /// Some answers became wrong (their entries were removed): forget those, and refuse the
    /// answers of queries in flight, which may have read them.
    pub fn forget(&self, keys: impl IntoIterator<Item = K>) {
        let mut inner = self.lock();
        inner.generation += 1;
        for key in keys {
            inner.answers.remove(&key);
        }
    }

    /// What the answers depend on changed: forget every answer, and refuse those of queries in
    /// flight.
    pub fn invalidate(&self) {
        let mut inner = self.lock();
        inner.generation += 1;
        inner.answers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::EntryId;

    fn answer(id: i64) -> Arc<Vec<Candidate>> {
        Arc::new(vec![Candidate {
            id: EntryId::new(id),
            scope: Scope::new("refs/heads/main"),
            key: "k".into(),
            key_folded: "k".into(),
            created_at: 0,
            size: 0,
            promoted: false,
        }])
    }

    #[test]
    fn answers_last_for_the_ttl() {
        let recent = RecentLookups::new(Duration::from_millis(1000));
        let g = recent.generation();
        recent.put("k".into(), g, 10_000, answer(1));
        assert_eq!(recent.get("k", 10_999).unwrap()[0].id, EntryId::new(1));
        assert!(recent.get("k", 11_000).is_none());
        assert!(recent.get("other", 10_000).is_none());
    }

    #[test]
    fn a_change_drops_answers_and_refuses_queries_in_flight() {
        let recent = RecentLookups::new(Duration::from_secs(60));
        let before = recent.generation();
        recent.put("a".into(), before, 0, answer(1));
        recent.invalidate();
        assert!(
            recent.get("a", 0).is_none(),
            "answers from before the change are gone"
        );
        // A query that started before the change finishes after it: its answer is not kept.
        recent.put("b".into(), before, 0, answer(2));
        assert!(recent.get("b", 0).is_none());
        recent.put("b".into(), recent.generation(), 0, answer(3));
        assert_eq!(recent.get("b", 0).unwrap()[0].id, EntryId::new(3));
    }

    #[test]
    fn forgetting_some_answers_keeps_the_others_and_refuses_queries_in_flight() {
        let recent = RecentLookups::new(Duration::from_secs(60));
        let before = recent.generation();
        recent.put("a".into(), before, 0, answer(1));
        recent.put("b".into(), before, 0, answer(2));
        recent.forget(["a".to_owned()]);
        assert!(recent.get("a", 0).is_none());
        assert_eq!(recent.get("b", 0).unwrap()[0].id, EntryId::new(2));
        recent.put("a".into(), before, 0, answer(1));
        assert!(
            recent.get("a", 0).is_none(),
            "a load from before is refused"
        );
    }

    #[test]
    fn a_zero_ttl_keeps_nothing() {
        let recent = RecentLookups::new(Duration::ZERO);
        recent.put("k".into(), recent.generation(), 0, answer(1));
        assert!(recent.get("k", 0).is_none());
    }

    #[test]
    fn memory_is_bounded() {
        let recent = RecentLookups::new(Duration::from_secs(60));
        for i in 0..(MAX_ANSWERS * 3) {
            recent.put(format!("k{i}"), recent.generation(), i as i64, answer(1));
        }
        assert!(recent.lock().answers.len() <= MAX_ANSWERS);
    }

    #[test]
    fn keys_separate_every_input() {
        let repo = RepoId::new("1");
        let v = Version::parse("v").unwrap();
        let main = [Scope::new("refs/heads/main")];
        let k = |scopes: &[Scope], keys: &[&str]| {
            let keys: Vec<String> = keys.iter().map(|s| s.to_string()).collect();
            RecentLookups::key(&repo, &v, scopes, &keys)
        };
        assert_ne!(k(&main, &["ab"]), k(&main, &["a", "b"]));
        assert_ne!(k(&main, &["a"]), k(&[], &["a"]));
        assert_ne!(
            RecentLookups::key(&RepoId::new("2"), &v, &main, &["a".into()]),
            k(&main, &["a"])
        );
    }
}
