//! Scope classes: which entries count against a repository's pull-request and tag share
//! (`--pr-scope-share`). Entries of a pull request (`refs/pull/*`) or a tag (`refs/tags/*`) are
//! readable only by that pull request or tag, yet GitHub lets them share the repository's quota
//! with the default branch under one LRU; hoard gives them a share of their own.
//!
//! The class is decided here, once, when an entry is made (`cache` passes it to the store,
//! which keeps it with the entry and in the repository's usage); no store decides it.

use super::Scope;

/// An entry's class, by its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScopeClass {
    /// Branches, and the empty scope of forge tokens that carry no ref: what the default
    /// branch's entries are (and what a branch may read from).
    Branch,
    /// `refs/pull/*` and `refs/tags/*`: readable only by that pull request or tag.
    PullRequestOrTag,
}

impl ScopeClass {
    /// The class of entries saved in `scope`. Refs compare byte-wise, as git spells them.
    pub fn of(scope: &Scope) -> Self {
        let s = scope.as_str();
        if s.starts_with("refs/pull/") || s.starts_with("refs/tags/") {
            Self::PullRequestOrTag
        } else {
            Self::Branch
        }
    }

    /// The small integer stores keep (`entries.scope_class`).
    pub fn code(self) -> i64 {
        match self {
            Self::Branch => 0,
            Self::PullRequestOrTag => 1,
        }
    }

    /// A stored code back; any other value is read as a branch (the column's default).
    pub fn from_code(code: i64) -> Self {
        if code == 1 {
            Self::PullRequestOrTag
        } else {
            Self::Branch
        }
    }
}

/// What a repository holds against its quota: all its entries, and those of pull requests and
/// tags among them. One row of the store, kept by the statements that add and remove entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaUsage {
    /// Bytes of every entry.
    pub bytes: u64,
    /// Bytes of its [`ScopeClass::PullRequestOrTag`] entries.
    pub pr_bytes: u64,
}

/// A share of the repository quota (`--pr-scope-share`): a whole percentage from 1 to 100.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share(u8);

impl Share {
    /// The whole quota: plain LRU over the repository, as GitHub does.
    pub const WHOLE: Share = Share(100);

    /// Parses `50%` or `50` (1 to 100).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let trimmed = raw.trim();
        let number = trimmed.strip_suffix('%').unwrap_or(trimmed).trim();
        match number.parse::<u8>() {
            Ok(n @ 1..=100) => Ok(Self(n)),
            _ => Err(format!(
                "{raw:?} is not a share from 1% to 100% (such as 50%)"
            )),
        }
    }

    pub fn percent(self) -> u8 {
        self.0
    }

    /// Whether this is the whole quota (no share of its own for pull requests and tags).
    pub fn is_whole(self) -> bool {
        self.0 >= 100
    }

    /// The share of `quota`, in bytes (rounded down).
    pub fn of(self, quota: u64) -> u64 {
        (u128::from(quota) * u128::from(self.0) / 100) as u64
    }
}

impl Default for Share {
    fn default() -> Self {
        Self(50)
    }
}

impl std::fmt::Display for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}%", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_requests_and_tags_are_their_own_class() {
        for pr in ["refs/pull/7/merge", "refs/pull/7/head", "refs/tags/v1.0"] {
            assert_eq!(
                ScopeClass::of(&Scope::new(pr)),
                ScopeClass::PullRequestOrTag
            );
        }
        for branch in [
            "refs/heads/main",
            "refs/heads/refs/pull/1",
            "",
            "REFS/PULL/1/merge",
            "refs/pull",
            "refs/tagsx/v1",
        ] {
            assert_eq!(
                ScopeClass::of(&Scope::new(branch)),
                ScopeClass::Branch,
                "{branch:?}"
            );
        }
        for class in [ScopeClass::Branch, ScopeClass::PullRequestOrTag] {
            assert_eq!(ScopeClass::from_code(class.code()), class);
        }
    }

    #[test]
    fn shares_parse_as_whole_percentages() {
        assert_eq!(Share::parse("50%").unwrap().percent(), 50);
        assert_eq!(Share::parse(" 25 ").unwrap().percent(), 25);
        assert!(Share::parse("100%").unwrap().is_whole());
        for bad in ["0", "0%", "101%", "-5", "50.5%", "half", "", "%"] {
            let err = Share::parse(bad).unwrap_err();
            assert!(err.contains("1% to 100%"), "{bad:?}: {err}");
        }
        assert_eq!(Share::default().of(10 << 30), 5 << 30);
        assert_eq!(Share::parse("33").unwrap().of(100), 33);
        assert_eq!(Share::WHOLE.of(u64::MAX), u64::MAX);
    }
}
