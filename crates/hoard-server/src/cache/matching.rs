//! GitHub's lookup order (PROTOCOL.md §9, DESIGN.md §4), as a pure function.
//!
//! For each readable scope in token order: the exact primary key, then the newest entry whose key
//! starts with the primary key, then each restore key in turn (exact, then newest prefix). Keys
//! compare case-insensitively; only entries of the requested version are ever candidates.

use crate::model::{Candidate, Scope};

/// Picks the entry GitHub would restore. `scopes` are the readable scopes in token order and
/// `folded_keys` the primary then restore keys, already folded to lower case. Candidates may
/// contain anything; those of other scopes or unrelated keys are ignored.
pub fn best_match<'a>(
    scopes: &[Scope],
    folded_keys: &[String],
    candidates: &'a [Candidate],
) -> Option<&'a Candidate> {
    for scope in scopes {
        let in_scope = || candidates.iter().filter(move |c| &c.scope == scope);
        for key in folded_keys {
            if let Some(exact) = in_scope().find(|c| &c.key_folded == key) {
                return Some(exact);
            }
            // Newest first; the larger id breaks ties within one millisecond.
            let newest_prefix = in_scope()
                .filter(|c| c.key_folded.starts_with(key.as_str()))
                .max_by_key(|c| (c.created_at, c.id));
            if newest_prefix.is_some() {
                return newest_prefix;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EntryId, Millis};

    fn cand(id: i64, scope: &str, key: &str, created_at: Millis) -> Candidate {
        Candidate {
            id: EntryId::new(id),
            scope: Scope::new(scope),
            key: key.to_owned(),
            key_folded: key.to_lowercase(),
            created_at,
            size: 0,
            promoted: false,
        }
    }

    fn keys(list: &[&str]) -> Vec<String> {
        list.iter().map(|k| k.to_lowercase()).collect()
    }

    fn scopes(list: &[&str]) -> Vec<Scope> {
        list.iter().map(|s| Scope::new(*s)).collect()
    }

    const MAIN: &str = "refs/heads/main";
    const FEATURE: &str = "refs/heads/feature";

    #[test]
    fn exact_key_beats_a_newer_prefix_match() {
        let c = [
            cand(1, MAIN, "npm-abc", 10),
            cand(2, MAIN, "npm-abcdef", 20),
        ];
        let hit = best_match(&scopes(&[MAIN]), &keys(&["npm-abc"]), &c).unwrap();
        assert_eq!(hit.id, EntryId::new(1));
    }

    #[test]
    fn newest_prefix_match_wins_among_several() {
        let c = [
            cand(1, MAIN, "npm-1", 10),
            cand(2, MAIN, "npm-3", 30),
            cand(3, MAIN, "npm-2", 20),
        ];
        let hit = best_match(&scopes(&[MAIN]), &keys(&["npm-"]), &c).unwrap();
        assert_eq!(hit.key, "npm-3");
    }

    #[test]
    fn same_millisecond_prefers_the_later_entry() {
        let c = [cand(4, MAIN, "npm-a", 10), cand(9, MAIN, "npm-b", 10)];
        assert_eq!(
            best_match(&scopes(&[MAIN]), &keys(&["npm-"]), &c)
                .unwrap()
                .id,
            EntryId::new(9)
        );
    }

    #[test]
    fn primary_prefix_comes_before_restore_keys() {
        let c = [
            cand(1, MAIN, "npm-linux-old", 10),
            cand(2, MAIN, "npm-linux-abc-extra", 5),
        ];
        let hit = best_match(
            &scopes(&[MAIN]),
            &keys(&["npm-linux-abc", "npm-linux-"]),
            &c,
        )
        .unwrap();
        assert_eq!(hit.id, EntryId::new(2));
    }

    #[test]
    fn restore_keys_are_tried_in_order() {
        let c = [cand(1, MAIN, "b-1", 50), cand(2, MAIN, "a-1", 10)];
        let hit = best_match(&scopes(&[MAIN]), &keys(&["zzz", "a-", "b-"]), &c).unwrap();
        assert_eq!(hit.id, EntryId::new(2));
    }

    #[test]
    fn scopes_are_tried_in_token_order_before_keys() {
        // A restore-key hit in the current branch beats an exact hit on the default branch.
        let c = [cand(1, MAIN, "k", 10), cand(2, FEATURE, "k-partial", 5)];
        let hit = best_match(&scopes(&[FEATURE, MAIN]), &keys(&["k", "k-"]), &c).unwrap();
        assert_eq!(hit.id, EntryId::new(2));
        // Nothing in the feature branch: fall back to main.
        let c = [cand(1, MAIN, "k", 10)];
        let hit = best_match(&scopes(&[FEATURE, MAIN]), &keys(&["k"]), &c).unwrap();
        assert_eq!(hit.id, EntryId::new(1));
    }

    #[test]
    fn unreadable_scopes_never_match() {
        let c = [cand(1, "refs/heads/sibling", "k", 10)];
        assert!(best_match(&scopes(&[FEATURE, MAIN]), &keys(&["k"]), &c).is_none());
    }

    #[test]
    fn matching_ignores_case_and_returns_the_stored_key() {
        let c = [cand(1, MAIN, "Linux-NPM-Abc", 10)];
        let hit = best_match(&scopes(&[MAIN]), &keys(&["linux-npm-"]), &c).unwrap();
        assert_eq!(hit.key, "Linux-NPM-Abc");
        let hit = best_match(&scopes(&[MAIN]), &keys(&["LINUX-npm-abc"]), &c).unwrap();
        assert_eq!(hit.id, EntryId::new(1));
    }

    #[test]
    fn nothing_matches_an_empty_candidate_list() {
        assert!(best_match(&scopes(&[MAIN]), &keys(&["k"]), &[]).is_none());
    }
}
