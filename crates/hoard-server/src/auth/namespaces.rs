//! Namespaces by secret path prefix (`--namespaces-file`), for clients whose tokens hoard cannot
//! verify: nektos/act and Gitea's `cache.external_server` put a secret in the path of
//! `ACTIONS_CACHE_URL` (`http://hoard:3000/<secret>/`), and the secret alone names the caller.
//!
//! The file has one namespace per line: a name, a secret prefix, and `read-only` or
//! `read-write`, separated by white space. `#` starts a comment. Each namespace is a repository
//! of its own (`namespace:<name>`) with one scope shared by all its jobs.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::token::Identity;
use crate::model::{CallerKind, Provenance, RepoId, Scope};

/// Shortest secret prefix accepted: guessing one must be out of reach.
pub const MIN_SECRET_CHARS: usize = 16;

/// What a namespace's jobs may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

impl Access {
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "read-only" | "ro" | "read" => Some(Self::ReadOnly),
            "read-write" | "rw" => Some(Self::ReadWrite),
            _ => None,
        }
    }
}

/// The identity of every job that shares one scope under `repository` with `access`: what a
/// namespace, Forgejo's shared namespace and anonymous access grant.
pub fn shared_identity(repository: String, access: Access, kind: CallerKind) -> Identity {
    let scope = Scope::new("");
    Identity {
        kind,
        issuer: String::new(),
        job_id: String::new(),
        subject: Provenance::clip(&repository),
        repository_name: repository.clone(),
        repository: RepoId::new(repository),
        read_scopes: vec![scope.clone()],
        write_scope: (access == Access::ReadWrite).then_some(scope),
        run_id: String::new(),
    }
}

#[derive(Debug, Clone)]
struct Namespace {
    name: String,
    access: Access,
}

/// The namespaces of the file, found by a hash of their secret so that a lookup's time does not
/// depend on how much of a guessed secret is right. `Debug` shows their names only.
#[derive(Clone, Default)]
pub struct Namespaces {
    by_secret: HashMap<[u8; 32], Namespace>,
    /// The lengths of the secrets, for [`Namespaces::guards`].
    lengths: BTreeSet<usize>,
}

impl std::fmt::Debug for Namespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&str> = self.by_secret.values().map(|n| n.name.as_str()).collect();
        names.sort_unstable();
        f.debug_struct("Namespaces").field("names", &names).finish()
    }
}

impl Namespaces {
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let mut namespaces = Self::default();
        let mut names = std::collections::HashSet::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, secret, access] = fields[..] else {
                return Err(format!(
                    "line {}: expected a name, a secret prefix and read-only or read-write",
                    n + 1
                ));
            };
            let valid_name = name.len() <= 128
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !valid_name {
                return Err(format!(
                    "line {}: a namespace name is letters, digits, '-', '_' and '.' only",
                    n + 1
                ));
            }
            let secret = secret.trim_matches('/');
            if secret.len() < MIN_SECRET_CHARS || !secret.bytes().all(is_secret_byte) {
                return Err(format!(
                    "line {}: the secret prefix of {name} must be at least {MIN_SECRET_CHARS} letters, digits, '-' or '_'",
                    n + 1
                ));
            }
            let access = Access::parse(access).ok_or_else(|| {
                format!(
                    "line {}: access must be read-only or read-write, not {access:?}",
                    n + 1
                )
            })?;
            if !names.insert(name.to_owned()) {
                return Err(format!("line {}: namespace {name} is listed twice", n + 1));
            }
            let previous = namespaces.by_secret.insert(
                digest(secret),
                Namespace {
                    name: name.to_owned(),
                    access,
                },
            );
            if previous.is_some() {
                return Err(format!(
                    "line {}: two namespaces share one secret prefix",
                    n + 1
                ));
            }
            namespaces.lengths.insert(secret.len());
        }
        Ok(namespaces)
    }

    pub fn is_empty(&self) -> bool {
        self.by_secret.is_empty()
    }

    /// Whether `segment`, a path's first segment as sent, is or starts with a namespace's
    /// secret (percent-decoded, as the server it would be forwarded to reads it): such a path
    /// is a namespace's, even misspelled (`ACTIONS_CACHE_URL` without its trailing slash puts
    /// the secret right before `_apis`), and never leaves hoard.
    pub fn guards(&self, segment: &str) -> bool {
        let decoded: Vec<u8> = percent_encoding::percent_decode_str(segment).collect();
        self.lengths.iter().any(|&n| {
            decoded
                .get(..n)
                .is_some_and(|head| self.by_secret.contains_key(&digest_bytes(head)))
        })
    }

    /// The identity a request under `/<prefix>/` has, if the prefix is a namespace's secret.
    pub fn identify(&self, prefix: &str) -> Option<Identity> {
        let ns = self.by_secret.get(&digest(prefix.trim_matches('/')))?;
        Some(shared_identity(
            format!("namespace:{}", ns.name),
            ns.access,
            CallerKind::Namespace,
        ))
    }
}

fn is_secret_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_')
}

fn digest(secret: &str) -> [u8; 32] {
    digest_bytes(secret.as_bytes())
}

fn digest_bytes(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# act on the build hosts
act-builds   0123456789abcdef0123  read-write
gitea-ci     /fedcba9876543210fedc/ ro   # trailing comment
";

    #[test]
    fn prefixes_name_their_namespace() {
        let ns = Namespaces::parse(FILE).unwrap();
        let id = ns.identify("0123456789abcdef0123").unwrap();
        assert_eq!(id.repository.as_str(), "namespace:act-builds");
        assert_eq!(id.write_scope, Some(Scope::new("")));
        assert_eq!(id.read_scopes, [Scope::new("")]);
        let ro = ns.identify("/fedcba9876543210fedc/").unwrap();
        assert_eq!(ro.repository.as_str(), "namespace:gitea-ci");
        assert_eq!(ro.write_scope, None);
        assert!(ns.identify("0123456789abcdef012").is_none());
        assert!(ns.identify("").is_none());
    }

    #[test]
    fn a_segment_that_is_or_starts_with_a_secret_is_guarded() {
        let ns = Namespaces::parse(FILE).unwrap();
        for guarded in [
            "0123456789abcdef0123",
            "0123456789abcdef0123_apis",
            "fedcba9876543210fedcx",
            "%30123456789abcdef0123_apis",
        ] {
            assert!(ns.guards(guarded), "{guarded}");
        }
        for free in ["0123456789abcdef012", "x0123456789abcdef0123", "_apis", ""] {
            assert!(!ns.guards(free), "{free}");
        }
        assert!(!Namespaces::default().guards("0123456789abcdef0123"));
    }

    #[test]
    fn bad_files_are_refused_with_the_line() {
        for (text, needle) in [
            ("a short rw", "at least 16"),
            ("a 0123456789abcdef0123", "expected a name"),
            ("a 0123456789abcdef0123 maybe", "read-only or read-write"),
            ("a/b 0123456789abcdef0123 rw", "namespace name"),
            ("a 0123456789abcdef0123/x rw", "at least 16"),
            (
                "a 0123456789abcdef0123 rw\na 1123456789abcdef0123 rw",
                "listed twice",
            ),
            (
                "a 0123456789abcdef0123 rw\nb 0123456789abcdef0123 ro",
                "share one secret",
            ),
        ] {
            let err = Namespaces::parse(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        assert!(Namespaces::parse("# nothing\n\n").unwrap().is_empty());
    }
}
