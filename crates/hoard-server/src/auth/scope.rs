//! Cache scopes from the runtime token's `ac` claim (PROTOCOL.md §8).
//!
//! `ac` is a JSON string holding `[{"Scope": "<ref>", "Permission": <bits>}]` with Read = 1 and
//! Write = 2. The current ref comes first; base and default branches follow, read-only.

use serde::Deserialize;

use crate::model::Scope;

const READ: u64 = 1;
const WRITE: u64 = 2;

/// One element of the `ac` claim.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct AccessGrant {
    #[serde(rename = "Scope", alias = "scope", default)]
    pub scope: String,
    #[serde(rename = "Permission", alias = "permission", default)]
    pub permission: u64,
}

/// What a token may do, derived from its grants.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scopes {
    /// Every readable scope, in token order, without repeats.
    pub read: Vec<Scope>,
    /// The first writable scope; writes never go anywhere else.
    pub write: Option<Scope>,
}

/// One exception to "write is not read": Gitea's tokens grant `[{"Scope":"","Permission":2}]`,
/// writing to the empty scope, which is no git ref and so never in a GitHub token. A forge
/// identity that may write the empty scope may read it too, or Gitea jobs could never restore
/// what they saved; every token naming a ref keeps GitHub's rule.
pub fn derive_scopes(grants: &[AccessGrant]) -> Scopes {
    let mut scopes = Scopes::default();
    for grant in grants {
        let readable = grant.permission & READ != 0
            || (grant.scope.is_empty() && grant.permission & WRITE != 0);
        if readable && !scopes.read.iter().any(|s| s.as_str() == grant.scope) {
            scopes.read.push(Scope::new(grant.scope.clone()));
        }
        if grant.permission & WRITE != 0 && scopes.write.is_none() {
            scopes.write = Some(Scope::new(grant.scope.clone()));
        }
    }
    scopes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(json: &str) -> Vec<AccessGrant> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_push_reads_and_writes_its_branch() {
        let s = derive_scopes(&grants(r#"[{"Scope":"refs/heads/master","Permission":3}]"#));
        assert_eq!(s.read, [Scope::new("refs/heads/master")]);
        assert_eq!(s.write, Some(Scope::new("refs/heads/master")));
    }

    #[test]
    fn a_pull_request_writes_its_merge_ref_and_reads_the_base() {
        let s = derive_scopes(&grants(
            r#"[{"Scope":"refs/pull/707/merge","Permission":3},{"Scope":"refs/heads/master","Permission":1}]"#,
        ));
        assert_eq!(
            s.read,
            [
                Scope::new("refs/pull/707/merge"),
                Scope::new("refs/heads/master")
            ]
        );
        assert_eq!(s.write, Some(Scope::new("refs/pull/707/merge")));
    }

    #[test]
    fn read_only_tokens_have_no_write_scope() {
        let s = derive_scopes(&grants(r#"[{"Scope":"refs/heads/main","Permission":1}]"#));
        assert_eq!(s.write, None);
        assert_eq!(s.read.len(), 1);
    }

    #[test]
    fn write_only_grants_are_not_readable_and_first_writer_wins() {
        let s = derive_scopes(&grants(
            r#"[{"Scope":"a","Permission":2},{"Scope":"b","Permission":3},{"Scope":"b","Permission":1}]"#,
        ));
        assert_eq!(s.read, [Scope::new("b")]);
        assert_eq!(s.write, Some(Scope::new("a")));
    }

    #[test]
    fn giteas_write_grant_on_the_empty_scope_reads_it_too() {
        let s = derive_scopes(&grants(r#"[{"Scope":"","Permission":2}]"#));
        assert_eq!(s.read, [Scope::new("")]);
        assert_eq!(s.write, Some(Scope::new("")));
        // A ref is never widened that way.
        let s = derive_scopes(&grants(r#"[{"Scope":"refs/heads/main","Permission":2}]"#));
        assert!(s.read.is_empty());
    }

    #[test]
    fn no_grants_means_no_access() {
        let s = derive_scopes(&[]);
        assert!(s.read.is_empty());
        assert!(s.write.is_none());
        let s = derive_scopes(&grants(r#"[{"Scope":"x","Permission":0}]"#));
        assert_eq!(s, Scopes::default());
    }
}
