//! Which owner/name goes with which repository id, as verified tokens and the store have told
//! hoard (issue #43). A write policy rule may name a repository by owner/name; a token may
//! carry only its `repository_id`. Paired here, a rule by name applies to every token of that
//! id, whether or not the token carries the name. The first pairing of an id wins: a later
//! token that names the id otherwise is logged, not believed.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, RwLock};

use crate::auth::Identity;
use crate::model::{LogSafe, RepoId};

/// The most ids paired: the pairing of a hostile issuer's made-up ids cannot grow without
/// bound. Past it, ids not yet paired keep being decided by their token's own name.
const MAX_PAIRS: usize = 1_000_000;
/// The most disagreements remembered so as to be logged once each.
const MAX_LOGGED: usize = 10_000;

#[derive(Debug, Default)]
pub struct RepositoryNames {
    pairs: RwLock<Pairs>,
    logged: Mutex<HashSet<(RepoId, String)>>,
}

#[derive(Debug, Default)]
struct Pairs {
    by_id: HashMap<RepoId, String>,
    /// Lower-cased names (GitHub compares names case-insensitively) to the id first paired.
    by_name: HashMap<String, RepoId>,
}

impl Pairs {
    fn pair(&mut self, id: &RepoId, name: &str) {
        if self.by_id.len() >= MAX_PAIRS || self.by_id.contains_key(id) {
            return;
        }
        self.by_id.insert(id.clone(), name.to_owned());
        self.by_name
            .entry(name.to_ascii_lowercase())
            .or_insert_with(|| id.clone());
    }
}

impl RepositoryNames {
    /// Pairs what the store recorded (repositories with their names), without replacing a
    /// pairing already made.
    pub fn seed(&self, known: impl IntoIterator<Item = (RepoId, String)>) {
        let mut pairs = self.pairs.write().unwrap_or_else(|e| e.into_inner());
        for (id, name) in known {
            if !id.as_str().is_empty() && !name.is_empty() {
                pairs.pair(&id, &name);
            }
        }
    }

    /// `f` on the owner/name of `who`'s repository: the one paired with its id, else the
    /// token's (which is then paired), else empty. A token whose name differs from the one
    /// paired is logged once per id and name.
    pub fn with_name<T>(&self, who: &Identity, f: impl FnOnce(&str) -> T) -> T {
        let claimed = who.repository_name.as_str();
        {
            let pairs = self.pairs.read().unwrap_or_else(|e| e.into_inner());
            match pairs.by_id.get(&who.repository) {
                Some(known) => {
                    if !claimed.is_empty() && !known.eq_ignore_ascii_case(claimed) {
                        self.log_disagreement(who, known);
                    }
                    return f(known);
                }
                None if claimed.is_empty() || who.repository.as_str().is_empty() => {
                    return f(claimed)
                }
                None => {}
            }
        }
        let mut pairs = self.pairs.write().unwrap_or_else(|e| e.into_inner());
        pairs.pair(&who.repository, claimed);
        // Another request may have paired the id meanwhile; past MAX_PAIRS none is.
        let paired = pairs.by_id.get(&who.repository).cloned();
        drop(pairs);
        f(paired.as_deref().unwrap_or(claimed))
    }

    /// Whether some id is paired with `name` (case-insensitively).
    pub fn knows_name(&self, name: &str) -> bool {
        let pairs = self.pairs.read().unwrap_or_else(|e| e.into_inner());
        pairs.by_name.contains_key(&name.to_ascii_lowercase())
    }

    fn log_disagreement(&self, who: &Identity, known: &str) {
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        if logged.len() >= MAX_LOGGED
            || !logged.insert((who.repository.clone(), who.repository_name.clone()))
        {
            return;
        }
        tracing::warn!(
            target: "hoard::audit",
            action = "name_disagrees",
            repository = %LogSafe(who.repository.as_str()),
            known = %LogSafe(known),
            claimed = %LogSafe(&who.repository_name),
            kind = %who.kind,
            subject = %LogSafe(&who.subject),
            "a token names its repository otherwise than the name paired with its id; policy rules follow the id's name"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CallerKind, Scope};

    fn token(id: &str, name: &str) -> Identity {
        Identity {
            repository: RepoId::new(id),
            repository_name: name.into(),
            read_scopes: vec![Scope::new("refs/heads/main")],
            write_scope: None,
            kind: CallerKind::Github,
            issuer: String::new(),
            subject: String::new(),
            run_id: String::new(),
            job_id: String::new(),
        }
    }

    fn name_of(names: &RepositoryNames, who: &Identity) -> String {
        names.with_name(who, str::to_owned)
    }

    #[test]
    fn a_token_with_only_an_id_gets_the_name_paired_with_it() {
        let names = RepositoryNames::default();
        assert_eq!(name_of(&names, &token("42", "")), "");
        assert!(!names.knows_name("octo/app"));
        assert_eq!(name_of(&names, &token("42", "octo/app")), "octo/app");
        assert_eq!(name_of(&names, &token("42", "")), "octo/app");
        assert!(names.knows_name("Octo/App"));
    }

    #[test]
    fn the_id_wins_over_a_token_that_names_it_otherwise() {
        let names = RepositoryNames::default();
        names.seed([(RepoId::new("42"), "octo/app".to_owned())]);
        assert_eq!(name_of(&names, &token("42", "evil/other")), "octo/app");
        assert_eq!(name_of(&names, &token("42", "OCTO/APP")), "octo/app");
        // Another id claiming the name is paired with it, but the name stays the first id's.
        assert_eq!(name_of(&names, &token("43", "octo/app")), "octo/app");
        assert!(!names.knows_name("evil/other"));
    }

    #[test]
    fn seeding_never_replaces_a_pairing() {
        let names = RepositoryNames::default();
        assert_eq!(name_of(&names, &token("7", "a/b")), "a/b");
        names.seed([
            (RepoId::new("7"), "c/d".to_owned()),
            (RepoId::new(""), "e/f".to_owned()),
            (RepoId::new("8"), String::new()),
        ]);
        assert_eq!(name_of(&names, &token("7", "")), "a/b");
        assert!(!names.knows_name("e/f"));
        assert_eq!(name_of(&names, &token("8", "")), "");
    }
}
