//! Write policies (`--policy-file`, issue #23): rules by repository and scope that make a scope
//! read-write, read-only (a freeze) or denied, optionally only for some caller kinds.
//!
//! Pure: parsing a policy file's text and deciding what a caller may do with a scope. `Cache`
//! holds the policy in force ([`PolicyCell`]) and consults it on every reserve, finalize,
//! v1 upload and lookup.
//!
//! The rules, in the file's order:
//!
//! ```toml
//! [[rule]]
//! repository = "octo/app"     # an id, owner/name, or "*"
//! scope = "refs/heads/main"   # a glob over the scope (git ref)
//! access = "read-only"        # read-write | read-only | deny
//! callers = ["github"]        # optional: the caller kinds the rule applies to
//! ```
//!
//! - A rule applies to a caller and a scope when its `repository` matches the caller's
//!   repository id, or its owner/name (names case-insensitively, as GitHub compares them), its
//!   `scope` matches the scope, and `callers` (when given) lists the caller's kind. Both
//!   `repository` and `scope` are globs: `*` stands for any run of characters, `/` included
//!   (`refs/pull/*` matches `refs/pull/7/merge`), `?` for one character.
//! - The first rule that applies decides; a scope no rule applies to is read-write. No file,
//!   or a file without rules, is today's behaviour.
//! - A policy only takes away: the token's own permissions still hold, so `read-write` never
//!   lets a read-only token write.
//! - Writes are checked against the caller's write scope: `read-only` and `deny` refuse them.
//! - Reads: a scope whose rule is `deny` is left out of the caller's lookups, as if the token
//!   did not grant it, so its entries are invisible to that caller while the other scopes
//!   (the base and default branches) still serve. When every readable scope is denied, the
//!   lookup is refused as read-denied, which clients treat as a miss with a warning.
//!
//! Which promotions GitHub's webhooks make (issue #58), per repository; the first
//! `[[promotion]]` whose `repository` matches decides, and without one a merge queue's entries
//! are promoted and a merged pull request's are not:
//!
//! ```toml
//! [[promotion]]
//! repository = "octo/app"
//! merged_pull_requests = true   # a merged pull request's entries into its base branch
//! forks = false                 # ... also from a fork's pull request (default false)
//! merge_queues = true           # a merge queue's entries into its base branch (default true)
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use serde::Deserialize;

use crate::auth::Identity;
use crate::model::{rfc3339_seconds, CallerKind, Millis, Scope};

/// What a rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    ReadWrite,
    ReadOnly,
    Deny,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadWrite => "read-write",
            Self::ReadOnly => "read-only",
            Self::Deny => "deny",
        }
    }

    fn may_write(self) -> bool {
        self == Self::ReadWrite
    }

    fn may_read(self) -> bool {
        self != Self::Deny
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `[[rule]]` of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// A glob over the repository id and its owner/name; `*` for every repository.
    pub repository: String,
    /// The line of the file the rule starts on.
    pub line: usize,
    /// A glob over the scope (git ref).
    pub scope: String,
    pub access: Access,
    /// The caller kinds the rule applies to; `None`: every caller.
    pub callers: Option<Vec<CallerKind>>,
}

impl Rule {
    /// Whether the rule applies to `who` using `scope`, `name` being the owner/name of `who`'s
    /// repository (the one hoard paired with its id, else the token's; empty: none known).
    pub fn applies(&self, who: &Identity, name: &str, scope: &Scope) -> bool {
        if let Some(kinds) = &self.callers {
            if !kinds.contains(&who.kind) {
                return false;
            }
        }
        let repository = glob(&self.repository, who.repository.as_str(), false)
            || (!name.is_empty() && glob(&self.repository, name, true));
        repository && glob(&self.scope, scope.as_str(), false)
    }

    /// The owner/name this rule names exactly (no glob, not an id), which only a pairing of
    /// an id with that name can tie to a repository.
    pub fn exact_name(&self) -> Option<&str> {
        let r = self.repository.as_str();
        let is_id = r.bytes().all(|b| b.is_ascii_digit());
        (!is_id && !r.contains(['*', '?'])).then_some(r)
    }
}

/// One `[[promotion]]` of the file: which promotions the webhooks make for the repositories
/// it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromotionRule {
    /// A glob over the repository id and its owner/name.
    pub repository: String,
    pub line: usize,
    pub promotions: Promotions,
}

/// Which promotions a repository gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Promotions {
    /// A merge queue's entries, into its base branch once the queue's commit lands.
    pub merge_queues: bool,
    /// A merged pull request's entries, into its base branch.
    pub merged_pull_requests: bool,
    /// ... of a pull request from a fork too.
    pub forks: bool,
}

impl Default for Promotions {
    /// Without a rule: merge queues yes (nothing but the queue's own runs wrote those entries),
    /// pull requests no.
    fn default() -> Self {
        Self {
            merge_queues: true,
            merged_pull_requests: false,
            forks: false,
        }
    }
}

/// A policy: the rules of one file, in its order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// The file the rules were read from.
    pub source: Option<PathBuf>,
    pub rules: Vec<Rule>,
    /// The `[[promotion]]`s, in the file's order.
    pub promotions: Vec<PromotionRule>,
    /// What the file held when it was read ([`Policy::load`]); `None` for a policy parsed
    /// from text.
    pub stamp: Option<FileStamp>,
}

/// What was read of a policy file: enough to tell later, cheaply, whether the file on disk
/// still holds the policy in force (size and modification time first, then the bytes' hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp {
    pub len: u64,
    pub modified: Option<SystemTime>,
    pub sha256: [u8; 32],
}

impl FileStamp {
    /// `sha256:<hex>` of the bytes read.
    pub fn digest(&self) -> String {
        format!("sha256:{}", hex::encode(self.sha256))
    }
}

/// The rule that decided, and what it decided: the reason a refusal gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The rule's place in the file, from 1.
    pub rule: usize,
    pub access: Access,
}

/// A write or read the policy refuses: the scope, the repository as people know it and the
/// rule, for the client's message and the audit line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub scope: Scope,
    pub repository: String,
    pub rule: usize,
    pub access: Access,
}

impl fmt::Display for Refusal {
    /// `refs/heads/main of octo/app is read-only by policy rule 1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scope = match self.scope.as_str() {
            "" => "the shared scope",
            s => s,
        };
        let access = match self.access {
            Access::Deny => "denied",
            other => other.as_str(),
        };
        write!(
            f,
            "{scope} of {} is {access} by policy rule {}",
            self.repository, self.rule
        )
    }
}

/// The most rules a file may hold: each request walks them in order.
pub const MAX_RULES: usize = 10_000;
/// The largest policy file read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// The longest `repository` or `scope` pattern.
const MAX_PATTERN: usize = 1024;

/// Why a policy file cannot be used: one sentence naming the file and, where it can, the line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(String);

impl Policy {
    /// Reads and parses the policy file at `path`.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let shown = path.display();
        let (bytes, stamp) = read_stamped(path)
            .map_err(|e| PolicyError(format!("cannot read the policy file {shown}: {e}")))?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(PolicyError(format!(
                "the policy file {shown} is larger than {MAX_FILE_BYTES} bytes"
            )));
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            PolicyError(format!(
                "cannot read the policy file {shown}: not UTF-8 text (byte {})",
                e.utf8_error().valid_up_to()
            ))
        })?;
        let mut policy = Self::parse(&text, path)?;
        policy.stamp = Some(stamp);
        Ok(policy)
    }

    /// Parses a policy file's text; `path` names it in errors and becomes the source.
    pub fn parse(text: &str, path: &Path) -> Result<Self, PolicyError> {
        let at = |span: Option<std::ops::Range<usize>>| match span {
            Some(span) => format!(
                "the policy file {}, line {}",
                path.display(),
                line_of(text, span.start)
            ),
            None => format!("the policy file {}", path.display()),
        };
        let file: File = toml::from_str(text).map_err(|e| {
            PolicyError(format!(
                "{}: {}",
                at(e.span()),
                e.message().trim_end().trim_end_matches('.')
            ))
        })?;
        if file.rule.len() > MAX_RULES {
            return Err(PolicyError(format!(
                "{} has {} rules; at most {MAX_RULES} are allowed",
                at(None),
                file.rule.len()
            )));
        }
        let rules = file
            .rule
            .into_iter()
            .enumerate()
            .map(|(i, spanned)| {
                let span = spanned.span();
                let raw = spanned.into_inner();
                let bad = |what: &str| {
                    PolicyError(format!("{} (rule {}): {what}", at(Some(span.clone())), i + 1))
                };
                if raw.repository.0.is_empty() {
                    return Err(bad(
                        "repository must be an id, owner/name or \"*\", not empty",
                    ));
                }
                if raw.repository.0.len() > MAX_PATTERN || raw.scope.len() > MAX_PATTERN {
                    return Err(bad(&format!(
                        "repository and scope are at most {MAX_PATTERN} bytes"
                    )));
                }
                let callers = match raw.callers {
                    Some(kinds) if kinds.is_empty() => {
                        return Err(bad(
                            "callers must name at least one caller kind, or be left out to mean every caller",
                        ))
                    }
                    Some(kinds) => Some(kinds.into_iter().map(|k| k.0).collect()),
                    None => None,
                };
                Ok(Rule {
                    repository: raw.repository.0,
                    line: line_of(text, span.start),
                    scope: raw.scope,
                    access: raw.access,
                    callers,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let promotions = file
            .promotion
            .into_iter()
            .enumerate()
            .map(|(i, spanned)| {
                let span = spanned.span();
                let raw = spanned.into_inner();
                if raw.repository.0.is_empty() || raw.repository.0.len() > MAX_PATTERN {
                    return Err(PolicyError(format!(
                        "{} (promotion {}): repository must be an id, owner/name or \"*\", of at most {MAX_PATTERN} bytes",
                        at(Some(span.clone())),
                        i + 1
                    )));
                }
                let default = Promotions::default();
                Ok(PromotionRule {
                    repository: raw.repository.0,
                    line: line_of(text, span.start),
                    promotions: Promotions {
                        merge_queues: raw.merge_queues.unwrap_or(default.merge_queues),
                        merged_pull_requests: raw
                            .merged_pull_requests
                            .unwrap_or(default.merged_pull_requests),
                        forks: raw.forks.unwrap_or(default.forks),
                    },
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            source: Some(path.to_owned()),
            rules,
            promotions,
            stamp: None,
        })
    }

    /// The promotions the webhooks make for the repository `id` named `name` (empty: no name
    /// known): the first `[[promotion]]` that matches, else the defaults.
    pub fn promotions_for(&self, id: &str, name: &str) -> Promotions {
        self.promotions
            .iter()
            .find(|p| {
                glob(&p.repository, id, false)
                    || (!name.is_empty() && glob(&p.repository, name, true))
            })
            .map_or_else(Promotions::default, |p| p.promotions)
    }

    /// The first rule that applies to `who` using `scope`, by the token's own name; `None`:
    /// no rule does (read-write).
    pub fn decide(&self, who: &Identity, scope: &Scope) -> Option<Decision> {
        self.decide_as(who, &who.repository_name, scope)
    }

    /// [`Policy::decide`], `name` being the owner/name hoard knows for `who`'s repository id.
    pub fn decide_as(&self, who: &Identity, name: &str, scope: &Scope) -> Option<Decision> {
        self.rules
            .iter()
            .position(|r| r.applies(who, name, scope))
            .map(|i| Decision {
                rule: i + 1,
                access: self.rules[i].access,
            })
    }

    /// Whether `who` may write to `scope`: the refusal if a rule makes it read-only or denies it.
    pub fn check_write(&self, who: &Identity, scope: &Scope) -> Result<(), Refusal> {
        self.check_write_as(who, &who.repository_name, scope)
    }

    /// [`Policy::check_write`] with the name hoard knows for the repository (see [`Policy::decide_as`]).
    pub fn check_write_as(&self, who: &Identity, name: &str, scope: &Scope) -> Result<(), Refusal> {
        match self.decide_as(who, name, scope) {
            Some(d) if !d.access.may_write() => Err(refusal(who, name, scope, d)),
            _ => Ok(()),
        }
    }

    /// The scopes of `scopes` that `who` may read, in order; `Err` with the first scope's
    /// refusal when the policy denies every one. An empty `scopes` is returned as it is.
    pub fn readable(&self, who: &Identity, scopes: &[Scope]) -> Result<Vec<Scope>, Refusal> {
        self.readable_as(who, &who.repository_name, scopes)
    }

    /// [`Policy::readable`] with the name hoard knows for the repository.
    pub fn readable_as(
        &self,
        who: &Identity,
        name: &str,
        scopes: &[Scope],
    ) -> Result<Vec<Scope>, Refusal> {
        let mut first_refusal = None;
        let mut kept = Vec::with_capacity(scopes.len());
        for scope in scopes {
            match self.decide_as(who, name, scope) {
                Some(d) if !d.access.may_read() => {
                    first_refusal.get_or_insert_with(|| refusal(who, name, scope, d));
                }
                _ => kept.push(scope.clone()),
            }
        }
        match first_refusal {
            Some(refused) if kept.is_empty() => Err(refused),
            _ => Ok(kept),
        }
    }
}

impl Policy {
    /// A sentence for each rule that names an owner/name no token has paired with a
    /// repository id yet (`known` says whether one has): such a rule applies to nothing until
    /// one does, so a freeze written that way may not be in force.
    pub fn unresolved_names(&self, known: impl Fn(&str) -> bool) -> Vec<String> {
        self.rules
            .iter()
            .enumerate()
            .filter_map(|(i, rule)| {
                let name = rule.exact_name()?;
                (!known(name)).then(|| {
                    format!(
                        "policy rule {} (line {}) names {}, which no token has named yet; it applies to no repository until one does: name it by id",
                        i + 1,
                        rule.line,
                        crate::model::LogSafe(name)
                    )
                })
            })
            .collect()
    }
}

/// The refusal of `d`, naming the repository as people know it: the name paired with its id
/// (`name`), else its id.
fn refusal(who: &Identity, name: &str, scope: &Scope, d: Decision) -> Refusal {
    Refusal {
        scope: scope.clone(),
        repository: if name.is_empty() {
            who.repository.as_str().to_owned()
        } else {
            name.to_owned()
        },
        rule: d.rule,
        access: d.access,
    }
}

/// The line (from 1) of byte `offset` of `text`.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    rule: Vec<toml::Spanned<RawRule>>,
    #[serde(default)]
    promotion: Vec<toml::Spanned<RawPromotion>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPromotion {
    repository: Repository,
    #[serde(default)]
    merge_queues: Option<bool>,
    #[serde(default)]
    merged_pull_requests: Option<bool>,
    #[serde(default)]
    forks: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    repository: Repository,
    scope: String,
    access: Access,
    #[serde(default)]
    callers: Option<Vec<Kind>>,
}

/// A rule's `repository`: owner/name, a glob, or an id written as a string or an integer
/// (`repository = 123456`).
struct Repository(String);

impl<'de> Deserialize<'de> for Repository {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Id(u64),
            Text(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::Id(id)) => Ok(Self(id.to_string())),
            Ok(Raw::Text(text)) => Ok(Self(text)),
            Err(_) => Err(serde::de::Error::custom(
                "repository must be an id (a number or a string of digits), owner/name or \"*\"",
            )),
        }
    }
}

/// A caller kind by its name; an unknown name fails where it is written.
struct Kind(CallerKind);

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map(Kind).map_err(serde::de::Error::custom)
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters (`/`
/// included) and `?` for one; `fold` compares case-insensitively. Backtracks only to the last
/// `*`, so no pattern takes more than pattern × text steps. ASCII (every ref and GitHub name)
/// is matched on the bytes as they are, without copying.
pub fn glob(pattern: &str, text: &str, fold: bool) -> bool {
    if pattern.is_ascii() && text.is_ascii() {
        let same = |a: u8, b: u8| a == b || (fold && a.eq_ignore_ascii_case(&b));
        return wildcard(pattern.as_bytes(), text.as_bytes(), b'*', b'?', same);
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let same = |a: char, b: char| a == b || (fold && a.to_lowercase().eq(b.to_lowercase()));
    wildcard(&p, &t, '*', '?', same)
}

fn wildcard<T: Copy + PartialEq>(
    p: &[T],
    t: &[T],
    any: T,
    one: T,
    same: impl Fn(T, T) -> bool,
) -> bool {
    let (mut pi, mut ti) = (0, 0);
    // Where the last `*` was, and the text position it currently stands up to.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == any {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && (p[pi] == one || same(p[pi], t[ti])) {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            // Let the last `*` take one more character and try again after it.
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == any)
}

/// Reads at most [`MAX_FILE_BYTES`] + 1 bytes of `path` with its stamp (size and modification
/// time as opened, SHA-256 of the bytes read).
fn read_stamped(path: &Path) -> std::io::Result<(Vec<u8>, FileStamp)> {
    use sha2::Digest;
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    let stamp = FileStamp {
        len: meta.len(),
        modified: meta.modified().ok(),
        sha256: sha2::Sha256::digest(&bytes).into(),
    };
    Ok((bytes, stamp))
}

/// The policy in force, swapped whole on reload, and how its file's loads went. `None` (no
/// `--policy-file`) costs a request one uncontended read lock.
#[derive(Debug, Default)]
pub struct PolicyCell {
    in_force: RwLock<Option<Arc<Installed>>>,
    /// The last attempt to load the file (start-up or reload).
    last_attempt: Mutex<Option<Attempt>>,
    /// The latest comparison of the file on disk with the policy in force, so that a file
    /// touched but not changed is hashed once, not on every `/readyz`.
    compared: Mutex<Option<Compared>>,
    /// Whether a comparison is under way (see [`PolicyCell::start_check`]).
    checking: AtomicBool,
    /// The reload that put a policy without rules in force where the one before had some, while
    /// that policy without rules stays in force.
    lifted: Mutex<Option<Lifted>>,
}

/// A reload that lifted every rule at once: a policy without rules (an empty file, or one of
/// comments only) put in force where the one before had rules. Accepted, since a file without
/// rules is a valid policy (and today's behaviour at start-up), but never silently: a freeze
/// emptied by mistake would otherwise lift without a word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifted {
    /// When the policy without rules was put in force.
    pub at: Millis,
    /// How many rules the policy before it had.
    pub rules: usize,
}

impl Lifted {
    /// The warning `/readyz`, `hoard status`, the admin API and the log give, `file` being
    /// the policy file (log-safe).
    pub fn warning(&self, file: &str) -> String {
        format!(
            "the policy file {file} has no rules since its reload at {}: the {} rules in force before are lifted, so no scope is read-only or denied; restore the rules and send SIGHUP if that was not meant",
            rfc3339_seconds(self.at),
            self.rules
        )
    }
}

/// The one comparison of the policy file under way; the next may start once it is dropped.
#[derive(Debug)]
pub struct Checking(Arc<PolicyCell>);

impl Checking {
    /// See [`PolicyCell::compare_file`].
    pub fn compare(&self, installed: &Installed) -> OnDisk {
        self.0.compare_file(installed)
    }
}

impl Drop for Checking {
    fn drop(&mut self) {
        self.0.checking.store(false, Ordering::Release);
    }
}

/// A policy and when it was put in force.
#[derive(Debug)]
pub struct Installed {
    pub policy: Policy,
    pub loaded_at: Millis,
}

/// One attempt to load the policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub at: Millis,
    /// Why it failed: one log-safe sentence of at most [`LogSafe::MAX`] bytes (and a length
    /// note); `None`: the file was put in force.
    ///
    /// [`LogSafe::MAX`]: crate::model::LogSafe::MAX
    pub error: Option<String>,
}

/// What the policy file on disk holds, against the policy in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnDisk {
    /// The bytes in force.
    Same,
    /// Other bytes, written at `modified` (when the file system says).
    Changed { modified: Option<Millis> },
    /// The file cannot be read now: a reload would fail.
    Unreadable { error: String },
    /// Not known: the policy was not read from a file, or the file system did not answer in
    /// time.
    Unknown,
}

/// A comparison made: of the file at this size and time with the bytes of this hash.
#[derive(Debug, Clone)]
struct Compared {
    len: u64,
    modified: Option<SystemTime>,
    in_force: [u8; 32],
    on_disk: OnDisk,
}

/// The policy's health: what is in force, the last attempt to load the file, and whether the
/// file on disk still holds what is in force.
#[derive(Debug, Clone)]
pub struct Health {
    pub installed: Arc<Installed>,
    pub last_attempt: Attempt,
    pub on_disk: OnDisk,
    /// The reload that lifted every rule, while the policy without rules it loaded is in force.
    pub lifted: Option<Lifted>,
}

impl Health {
    /// Whether the last attempt to load the file failed (the policy before it stays in force).
    pub fn reload_failed(&self) -> bool {
        self.last_attempt.error.is_some()
    }

    /// Whether the file on disk holds other bytes than the policy in force, or cannot be read.
    pub fn differs_from_file(&self) -> bool {
        matches!(
            self.on_disk,
            OnDisk::Changed { .. } | OnDisk::Unreadable { .. }
        )
    }

    /// A sentence for each thing an operator must know: a reload that lifted every rule, a
    /// failed reload (when, why, and what stays in force), and a file on disk that is not the
    /// policy in force (since when).
    pub fn warnings(&self) -> Vec<String> {
        let file = self
            .installed
            .policy
            .source
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let file = crate::model::LogSafe(&file);
        let loaded = rfc3339_seconds(self.installed.loaded_at);
        let mut out = Vec::new();
        if let Some(lifted) = &self.lifted {
            out.push(lifted.warning(&file.to_string()));
        }
        if let Some(error) = &self.last_attempt.error {
            out.push(format!(
                "the policy file {file} failed to reload at {}: {error}; the policy loaded at {loaded} stays in force",
                rfc3339_seconds(self.last_attempt.at)
            ));
        }
        match &self.on_disk {
            OnDisk::Changed { modified } => {
                // After a failed reload the file differs anyway; say so again only if it was
                // changed after that attempt.
                let after_failure = match (self.reload_failed(), modified) {
                    (false, _) => true,
                    (true, Some(m)) => *m > self.last_attempt.at,
                    (true, None) => false,
                };
                if after_failure {
                    let since = modified.map_or_else(|| "an unknown time".to_owned(), rfc3339_seconds);
                    out.push(format!(
                        "the policy file {file} differs from the policy in force (loaded at {loaded}): changed on disk at {since} and not reloaded; send SIGHUP to load it"
                    ));
                }
            }
            OnDisk::Unreadable { error } if !self.reload_failed() => out.push(format!(
                "the policy file {file} differs from the policy in force (loaded at {loaded}): it cannot be read now ({error}), so a reload would fail"
            )),
            _ => {}
        }
        out
    }
}

impl PolicyCell {
    /// Puts `policy` in force at `loaded_at`: a successful attempt. Returns the lift when
    /// `policy` has no rules and the policy it replaces had some (see [`Lifted`]); a policy
    /// without rules replacing another without rules keeps the lift before it, if any, and a
    /// policy with rules ends it.
    pub fn set(&self, policy: Policy, loaded_at: Millis) -> Option<Lifted> {
        let empty = policy.rules.is_empty();
        let installed = Arc::new(Installed { policy, loaded_at });
        // Held across the swap: the policy in force and its lift change together.
        let mut kept = self.lifted.lock().unwrap_or_else(|e| e.into_inner());
        let before = self
            .in_force
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .replace(installed);
        let rules_before = before.map_or(0, |b| b.policy.rules.len());
        let lifted = (empty && rules_before > 0).then_some(Lifted {
            at: loaded_at,
            rules: rules_before,
        });
        if !empty {
            *kept = None;
        } else if lifted.is_some() {
            kept.clone_from(&lifted);
        }
        drop(kept);
        *self.last_attempt.lock().unwrap_or_else(|e| e.into_inner()) = Some(Attempt {
            at: loaded_at,
            error: None,
        });
        lifted
    }

    /// The reload that lifted every rule, while the policy without rules it loaded is in force.
    pub fn lifted(&self) -> Option<Lifted> {
        self.lifted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records an attempt at `at` that failed with `error`; the policy in force stays.
    pub fn failed(&self, error: &PolicyError, at: Millis) {
        let error = crate::model::LogSafe(&error.0).to_string();
        *self.last_attempt.lock().unwrap_or_else(|e| e.into_inner()) = Some(Attempt {
            at,
            error: Some(error),
        });
    }

    /// The policy in force, if any.
    pub fn current(&self) -> Option<Arc<Installed>> {
        self.in_force
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The last attempt to load the file, if any.
    pub fn last_attempt(&self) -> Option<Attempt> {
        self.last_attempt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `f` on the policy in force, under the read lock (no copy); `None` without one.
    pub fn with<T>(&self, f: impl FnOnce(&Policy) -> T) -> Option<T> {
        let guard = self.in_force.read().unwrap_or_else(|e| e.into_inner());
        guard.as_deref().map(|installed| f(&installed.policy))
    }

    /// The right to compare the file now, unless a comparison is under way: a file system
    /// that hangs then holds one blocking thread, not one more per probe.
    pub fn start_check(self: &Arc<Self>) -> Option<Checking> {
        self.checking
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Checking(self.clone()))
    }

    /// Whether the file the policy in force was read from still holds its bytes: the size and
    /// modification time first, the bytes' hash only when those changed (and once per change).
    /// Blocking file I/O: callers on the runtime run it on a blocking thread.
    pub fn compare_file(&self, installed: &Installed) -> OnDisk {
        let (Some(path), Some(stamp)) = (&installed.policy.source, &installed.policy.stamp) else {
            return OnDisk::Unknown;
        };
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) => {
                return OnDisk::Unreadable {
                    error: crate::model::LogSafe(&e.to_string()).to_string(),
                }
            }
        };
        let (len, modified) = (meta.len(), meta.modified().ok());
        if len == stamp.len && modified == stamp.modified {
            return OnDisk::Same;
        }
        let mut compared = self.compared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = compared.as_ref() {
            if (c.len, c.modified, c.in_force) == (len, modified, stamp.sha256) {
                return c.on_disk.clone();
            }
        }
        let on_disk = match read_stamped(path) {
            Ok((_, now)) if now.sha256 == stamp.sha256 => OnDisk::Same,
            Ok(_) => OnDisk::Changed {
                modified: modified.and_then(crate::model::millis_of),
            },
            Err(e) => OnDisk::Unreadable {
                error: crate::model::LogSafe(&e.to_string()).to_string(),
            },
        };
        *compared = Some(Compared {
            len,
            modified,
            in_force: stamp.sha256,
            on_disk: on_disk.clone(),
        });
        on_disk
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RepoId;

    fn parse(text: &str) -> Result<Policy, PolicyError> {
        Policy::parse(text, Path::new("/etc/hoard/policy.toml"))
    }

    #[test]
    fn promotions_are_decided_per_repository_by_the_first_that_matches() {
        let policy = parse(
            "[[promotion]]\nrepository = \"octo/app\"\nmerged_pull_requests = true\n\n\
             [[promotion]]\nrepository = 42\nmerge_queues = false\n\n\
             [[promotion]]\nrepository = \"octo/*\"\nmerged_pull_requests = true\nforks = true\n",
        )
        .unwrap();
        let app = policy.promotions_for("7", "Octo/App");
        assert_eq!(
            app,
            Promotions {
                merge_queues: true,
                merged_pull_requests: true,
                forks: false
            },
            "by name, case-insensitively; the first rule wins; unset keys keep their defaults"
        );
        assert!(!policy.promotions_for("42", "").merge_queues, "by id");
        assert!(policy.promotions_for("9", "octo/lib").forks, "by glob");
        assert_eq!(
            policy.promotions_for("9", "other/x"),
            Promotions::default(),
            "no rule: merge queues only"
        );
        assert_eq!(policy.promotions[1].line, 5);
        for bad in [
            "[[promotion]]\nrepository = \"\"\n",
            "[[promotion]]\nrepository = \"x\"\nmerged_pull_request = true\n",
            "[[promotion]]\nrepository = \"x\"\nforks = \"yes\"\n",
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(
                e.starts_with("the policy file /etc/hoard/policy.toml"),
                "{e}"
            );
        }
    }

    fn caller(id: &str, name: &str, kind: CallerKind) -> Identity {
        Identity {
            repository: RepoId::new(id),
            repository_name: name.into(),
            read_scopes: vec![Scope::new("refs/heads/main")],
            write_scope: Some(Scope::new("refs/heads/main")),
            kind,
            issuer: String::new(),
            subject: String::new(),
            run_id: String::new(),
            job_id: String::new(),
        }
    }

    fn octo() -> Identity {
        caller("42", "octo/app", CallerKind::Github)
    }

    fn scope(s: &str) -> Scope {
        Scope::new(s)
    }

    #[test]
    fn globs_match_any_run_including_slashes_and_single_characters() {
        assert!(glob("*", "", false));
        assert!(glob("*", "refs/heads/main", false));
        assert!(glob("refs/pull/*", "refs/pull/7/merge", false));
        assert!(!glob("refs/pull/*", "refs/heads/main", false));
        assert!(glob("refs/heads/main", "refs/heads/main", false));
        assert!(!glob("refs/heads/main", "refs/heads/main2", false));
        assert!(!glob("refs/heads/main", "refs/heads/mai", false));
        assert!(glob("refs/*/main", "refs/heads/main", false));
        assert!(glob("refs/pull/?/merge", "refs/pull/7/merge", false));
        assert!(!glob("refs/pull/?/merge", "refs/pull/17/merge", false));
        assert!(glob("*/*/*", "a/b/c", false));
        assert!(glob("a*b*c", "axxbyyc", false));
        assert!(!glob("a*b*c", "axxbyy", false));
        assert!(glob("**", "x", false));
        assert!(!glob("", "x", false));
        assert!(glob("", "", false));
        assert!(glob("Octo/*", "octo/app", true));
        assert!(!glob("Octo/*", "octo/app", false));
        // Beyond ASCII, `?` is one character and folding is Unicode's.
        assert!(glob("refs/heads/?", "refs/heads/é", false));
        assert!(glob("ÉQUIPE/*", "équipe/app", true));
        assert!(!glob("ÉQUIPE/*", "équipe/app", false));
        // Adversarial patterns stay quick (pattern × text at worst).
        let long = "a".repeat(5000);
        assert!(!glob(&format!("{}b", "*a".repeat(500)), &long, false));
        assert!(glob(&"*a".repeat(500), &long, false));
    }

    #[test]
    fn a_repository_by_id_is_a_number_or_a_string_and_a_rule_by_name_follows_the_paired_name() {
        let p = parse(
            "[[rule]]\nrepository = 123456\nscope = \"refs/heads/main\"\naccess = \"read-only\"\n\n[[rule]]\nrepository = \"octo/app\"\nscope = \"*\"\naccess = \"deny\"\n",
        )
        .unwrap();
        assert_eq!(p.rules[0].repository, "123456");
        assert_eq!((p.rules[0].line, p.rules[1].line), (1, 6));
        let main = scope("refs/heads/main");
        // A token with only its id: the id rule holds; the name rule holds through the name
        // hoard paired with the id, and not without it.
        let by_id = caller("123456", "", CallerKind::Github);
        assert!(p.check_write(&by_id, &main).is_err());
        let nameless = caller("99", "", CallerKind::Github);
        assert!(p.readable(&nameless, std::slice::from_ref(&main)).is_ok());
        assert!(p
            .readable_as(&nameless, "Octo/App", std::slice::from_ref(&main))
            .is_err());
        // The paired name wins over the token's own.
        let claims_other = caller("99", "evil/x", CallerKind::Github);
        assert!(p
            .readable_as(&claims_other, "octo/app", std::slice::from_ref(&main))
            .is_err());
        let claims_octo = caller("100", "octo/app", CallerKind::Github);
        assert!(p.readable_as(&claims_octo, "other/repo", &[main]).is_ok());
        // A rule by an exact name no token has paired is reported with its line; ids and globs
        // are not.
        let warnings = p.unresolved_names(|_| false);
        assert_eq!(
            warnings,
            ["policy rule 2 (line 6) names octo/app, which no token has named yet; it applies to no repository until one does: name it by id"]
        );
        assert!(p.unresolved_names(|name| name == "octo/app").is_empty());
        let globs =
            parse("[[rule]]\nrepository = \"octo/*\"\nscope = \"*\"\naccess = \"deny\"\n").unwrap();
        assert!(globs.unresolved_names(|_| false).is_empty());
    }

    #[test]
    fn the_format_of_the_issue_parses() {
        let policy = parse(
            r#"
# Freeze main during the incident.
[[rule]]
repository = "octo/app"     # an id, owner/name, or "*"
scope = "refs/heads/main"   # a glob over the scope (git ref)
access = "read-only"        # read-write | read-only | deny
callers = ["github"]        # optional: the caller kinds the rule applies to

[[rule]]
repository = "*"
scope = "refs/pull/*"
access = "deny"
"#,
        )
        .unwrap();
        assert_eq!(
            policy.source.as_deref(),
            Some(Path::new("/etc/hoard/policy.toml"))
        );
        assert_eq!(
            policy.rules,
            vec![
                Rule {
                    repository: "octo/app".into(),
                    line: 3,
                    scope: "refs/heads/main".into(),
                    access: Access::ReadOnly,
                    callers: Some(vec![CallerKind::Github]),
                },
                Rule {
                    repository: "*".into(),
                    line: 9,
                    scope: "refs/pull/*".into(),
                    access: Access::Deny,
                    callers: None,
                },
            ]
        );
        assert_eq!(parse("").unwrap().rules, vec![]);
        assert_eq!(parse("# nothing yet\n").unwrap().rules, vec![]);
    }

    #[test]
    fn bad_files_are_one_sentence_naming_the_file_and_line() {
        for (text, line, needle) in [
            ("[[rule]]\nrepository = \"*\"\nscope = \"*\"\naccess = \"readonly\"\n", 4, "read-only"),
            ("[[rule]]\nrepository = \"*\"\nscope = \"*\"\nacess = \"deny\"\n", 4, "acess"),
            ("[[rule]]\nrepository = \"*\"\naccess = \"deny\"\n", 1, "scope"),
            ("[[rule]]\nrepository = \"*\"\nscope = \"*\"\naccess = \"deny\"\ncallers = [\"gthub\"]\n", 5, "gthub"),
            ("[[rule]]\nrepository = \"*\"\nscope = \"*\"\naccess = \"deny\"\ncallers = []\n", 1, "at least one"),
            ("[[rule]]\nrepository = \"\"\nscope = \"*\"\naccess = \"deny\"\n", 1, "repository"),
            ("[[rules]]\nrepository = \"*\"\n", 1, "rules"),
            ("[[rule]]\nrepository = -7\nscope = \"*\"\naccess = \"deny\"\n", 2, "an id"),
            ("[[rule]]\nrepository = true\nscope = \"*\"\naccess = \"deny\"\n", 2, "an id"),
            ("[[rule]\n", 1, ""),
            ("\n\n[[rule]]\nrepository = \"*\"\nscope = \"*\"\naccess = \"read-write\"\n\n[[rule]]\nrepository = \"*\"\nscope = \"*\"\naccess = \"nope\"\n", 11, "nope"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("the policy file /etc/hoard/policy.toml, line {line}")),
                "{text:?}: {e}"
            );
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e:?}");
        }
        let e =
            parse("[[rule]]\nrepository = \"*\"\nscope = \"*\"\naccess = \"deny\"\ncallers = []\n")
                .unwrap_err()
                .to_string();
        assert!(e.contains("(rule 1)"), "{e}");
    }

    #[test]
    fn unreadable_and_oversized_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.toml");
        let e = Policy::load(&missing).unwrap_err().to_string();
        assert!(
            e.contains("cannot read the policy file") && e.contains("missing.toml"),
            "{e}"
        );
        let big = dir.path().join("big.toml");
        std::fs::write(&big, "#".repeat(MAX_FILE_BYTES as usize + 1)).unwrap();
        let e = Policy::load(&big).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        let ok = dir.path().join("ok.toml");
        std::fs::write(
            &ok,
            "[[rule]]\nrepository = \"*\"\nscope = \"*\"\naccess = \"deny\"\n",
        )
        .unwrap();
        assert_eq!(Policy::load(&ok).unwrap().rules.len(), 1);
    }

    fn policy(rules: &[(&str, &str, Access, Option<Vec<CallerKind>>)]) -> Policy {
        Policy {
            source: None,
            stamp: None,
            promotions: Vec::new(),
            rules: rules
                .iter()
                .map(|(repository, scope, access, callers)| Rule {
                    line: 1,
                    repository: (*repository).into(),
                    scope: (*scope).into(),
                    access: *access,
                    callers: callers.clone(),
                })
                .collect(),
        }
    }

    #[test]
    fn the_first_matching_rule_wins_and_no_rule_means_read_write() {
        let p = policy(&[
            ("octo/app", "refs/heads/main", Access::ReadWrite, None),
            ("*", "refs/heads/*", Access::ReadOnly, None),
            ("*", "*", Access::Deny, None),
        ]);
        let who = octo();
        assert_eq!(
            p.decide(&who, &scope("refs/heads/main")),
            Some(Decision {
                rule: 1,
                access: Access::ReadWrite
            })
        );
        assert_eq!(
            p.decide(&who, &scope("refs/heads/dev")),
            Some(Decision {
                rule: 2,
                access: Access::ReadOnly
            })
        );
        assert_eq!(
            p.decide(&who, &scope("refs/tags/v1")),
            Some(Decision {
                rule: 3,
                access: Access::Deny
            })
        );
        assert_eq!(
            Policy::default().decide(&who, &scope("refs/heads/main")),
            None
        );
        assert!(Policy::default().check_write(&who, &scope("x")).is_ok());
    }

    #[test]
    fn repositories_match_by_id_or_name_case_insensitively() {
        let who = octo();
        let main = scope("refs/heads/main");
        for pattern in ["42", "octo/app", "Octo/App", "octo/*", "*"] {
            let p = policy(&[(pattern, "*", Access::Deny, None)]);
            assert!(p.decide(&who, &main).is_some(), "{pattern}");
        }
        for pattern in ["43", "octo/other", "4", "octo"] {
            let p = policy(&[(pattern, "*", Access::Deny, None)]);
            assert!(p.decide(&who, &main).is_none(), "{pattern}");
        }
        // A caller without a name matches by id only.
        let nameless = caller("42", "", CallerKind::Github);
        assert!(policy(&[("42", "*", Access::Deny, None)])
            .decide(&nameless, &main)
            .is_some());
        assert!(policy(&[("octo/app", "*", Access::Deny, None)])
            .decide(&nameless, &main)
            .is_none());
    }

    #[test]
    fn callers_limit_a_rule_to_their_kinds() {
        let p = policy(&[(
            "*",
            "*",
            Access::ReadOnly,
            Some(vec![CallerKind::Forgejo, CallerKind::Namespace]),
        )]);
        let main = scope("refs/heads/main");
        assert!(p.check_write(&octo(), &main).is_ok());
        let forge = caller("forgejo:octo/app", "octo/app", CallerKind::Forgejo);
        assert!(p.check_write(&forge, &scope("")).is_err());
        let ns = caller("namespace:ci", "namespace:ci", CallerKind::Namespace);
        assert!(p.check_write(&ns, &scope("")).is_err());
    }

    #[test]
    fn read_only_and_deny_refuse_writes_with_a_reason_naming_the_rule() {
        let p = policy(&[
            ("*", "refs/pull/*", Access::Deny, None),
            ("octo/app", "refs/heads/main", Access::ReadOnly, None),
        ]);
        let who = octo();
        let refused = p.check_write(&who, &scope("refs/heads/main")).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "refs/heads/main of octo/app is read-only by policy rule 2"
        );
        let refused = p
            .check_write(&who, &scope("refs/pull/7/merge"))
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "refs/pull/7/merge of octo/app is denied by policy rule 1"
        );
        assert!(p.check_write(&who, &scope("refs/heads/dev")).is_ok());
        let shared = Refusal {
            scope: scope(""),
            ..refused
        };
        assert!(
            shared
                .to_string()
                .starts_with("the shared scope of octo/app"),
            "{shared}"
        );
    }

    #[test]
    fn denied_scopes_are_left_out_of_reads_and_all_denied_is_a_refusal() {
        let p = policy(&[
            ("*", "refs/pull/*", Access::Deny, None),
            ("*", "refs/heads/main", Access::ReadOnly, None),
            ("*", "refs/heads/secret", Access::Deny, None),
        ]);
        let who = octo();
        let pr = [scope("refs/pull/7/merge"), scope("refs/heads/main")];
        assert_eq!(
            p.readable(&who, &pr).unwrap(),
            vec![scope("refs/heads/main")]
        );
        let only_pr = [scope("refs/pull/7/merge")];
        let refused = p.readable(&who, &only_pr).unwrap_err();
        assert_eq!(refused.rule, 1);
        let both = [scope("refs/heads/secret"), scope("refs/pull/7/merge")];
        assert_eq!(
            p.readable(&who, &both).unwrap_err().rule,
            3,
            "the first scope's rule"
        );
        // Read-only still reads; no scopes stay no scopes (the token's own refusal).
        assert_eq!(
            p.readable(&who, &[scope("refs/heads/main")]).unwrap().len(),
            1
        );
        assert!(p.readable(&who, &[]).unwrap().is_empty());
    }

    #[test]
    fn the_cell_keeps_the_last_attempt_and_compares_the_file_by_its_bytes() {
        use sha2::Digest;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.toml");
        let text = "[[rule]]\nrepository = \"*\"\nscope = \"*\"\naccess = \"deny\"\n";
        std::fs::write(&path, text).unwrap();
        let loaded = Policy::load(&path).unwrap();
        let stamp = loaded.stamp.clone().unwrap();
        assert_eq!(
            stamp.digest(),
            format!("sha256:{}", hex::encode(sha2::Sha256::digest(text)))
        );
        assert_eq!(stamp.len, text.len() as u64);
        let cell = PolicyCell::default();
        assert_eq!(cell.last_attempt(), None);
        cell.set(loaded, 1_000);
        let installed = cell.current().unwrap();
        assert_eq!(
            cell.last_attempt(),
            Some(Attempt {
                at: 1_000,
                error: None
            })
        );
        assert_eq!(cell.compare_file(&installed), OnDisk::Same);

        // Edited and not reloaded: other bytes, with the time they were written.
        std::fs::write(&path, format!("{text}# more\n")).unwrap();
        let OnDisk::Changed { modified: Some(_) } = cell.compare_file(&installed) else {
            panic!("an edit differs: {:?}", cell.compare_file(&installed));
        };
        // The same bytes at another time do not differ (the hash decides); other bytes of the
        // same size do, once their time differs from the stamp's.
        std::fs::write(&path, text).unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(10);
        let touch = |at| {
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(at)
                .unwrap()
        };
        touch(later);
        assert_eq!(cell.compare_file(&installed), OnDisk::Same);
        std::fs::write(&path, text.replace("deny", "DENY")).unwrap();
        touch(later + std::time::Duration::from_secs(1));
        assert!(
            matches!(cell.compare_file(&installed), OnDisk::Changed { .. }),
            "same size, other bytes"
        );

        // Gone: a reload would fail.
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            cell.compare_file(&installed),
            OnDisk::Unreadable { .. }
        ));
        // A failed load is kept, log-safe; the policy in force stays.
        cell.failed(&PolicyError("line 1\nforged=line".into()), 2_000);
        assert_eq!(cell.current().unwrap().loaded_at, 1_000);
        assert_eq!(
            cell.last_attempt(),
            Some(Attempt {
                at: 2_000,
                error: Some("line 1\\nforged=line".into())
            })
        );
        // A policy parsed from text has no file to compare.
        cell.set(policy(&[]), 3_000);
        assert_eq!(cell.compare_file(&cell.current().unwrap()), OnDisk::Unknown);

        // One comparison at a time.
        let cell = Arc::new(cell);
        let first = cell.start_check().unwrap();
        assert!(cell.start_check().is_none());
        assert_eq!(first.compare(&cell.current().unwrap()), OnDisk::Unknown);
        drop(first);
        assert!(cell.start_check().is_some());
    }

    #[test]
    fn warnings_say_what_failed_or_differs_and_since_when() {
        const T: Millis = 1_764_619_200_000; // 2025-12-01T20:00:00Z
        let installed = Arc::new(Installed {
            policy: Policy {
                source: Some(PathBuf::from("/etc/hoard/policy.toml")),
                ..policy(&[])
            },
            loaded_at: T,
        });
        let health = |error: Option<&str>, on_disk: OnDisk| Health {
            installed: installed.clone(),
            last_attempt: Attempt {
                at: if error.is_some() { T + 60_000 } else { T },
                error: error.map(str::to_owned),
            },
            on_disk,
            lifted: None,
        };
        let failed = "the policy file /etc/hoard/policy.toml failed to reload at 2025-12-01T20:01:00Z: line 4: bad; the policy loaded at 2025-12-01T20:00:00Z stays in force";
        let differs = |at: &str| {
            format!("the policy file /etc/hoard/policy.toml differs from the policy in force (loaded at 2025-12-01T20:00:00Z): changed on disk at {at} and not reloaded; send SIGHUP to load it")
        };

        let ok = health(None, OnDisk::Same);
        assert!(ok.warnings().is_empty());
        assert!(!ok.reload_failed() && !ok.differs_from_file());
        assert!(health(None, OnDisk::Unknown).warnings().is_empty());

        let edited = health(
            None,
            OnDisk::Changed {
                modified: Some(T + 30_000),
            },
        );
        assert_eq!(edited.warnings(), [differs("2025-12-01T20:00:30Z")]);
        assert!(edited.differs_from_file());

        // The broken file that failed is the one on disk: one warning, the failure.
        let broken = health(
            Some("line 4: bad"),
            OnDisk::Changed {
                modified: Some(T + 50_000),
            },
        );
        assert_eq!(broken.warnings(), [failed]);
        assert!(broken.reload_failed() && broken.differs_from_file());
        // Edited again after the failure: both.
        let again = health(
            Some("line 4: bad"),
            OnDisk::Changed {
                modified: Some(T + 90_000),
            },
        );
        assert_eq!(
            again.warnings(),
            [failed.to_owned(), differs("2025-12-01T20:01:30Z")]
        );
        let gone = health(
            None,
            OnDisk::Unreadable {
                error: "No such file or directory (os error 2)".into(),
            },
        );
        assert_eq!(
            gone.warnings(),
            ["the policy file /etc/hoard/policy.toml differs from the policy in force (loaded at 2025-12-01T20:00:00Z): it cannot be read now (No such file or directory (os error 2)), so a reload would fail"]
        );
    }

    #[test]
    fn the_cell_swaps_whole_policies() {
        let cell = PolicyCell::default();
        assert!(cell.current().is_none());
        assert_eq!(cell.with(|p| p.rules.len()), None);
        cell.set(policy(&[("*", "*", Access::Deny, None)]), 7);
        assert_eq!(cell.with(|p| p.rules.len()), Some(1));
        cell.set(Policy::default(), 8);
        let now = cell.current().unwrap();
        assert_eq!((now.policy.rules.len(), now.loaded_at), (0, 8));
    }

    #[test]
    fn a_policy_without_rules_after_one_with_rules_is_a_lift_kept_until_rules_return() {
        const T: Millis = 1_764_619_200_000; // 2025-12-01T20:00:00Z
        let cell = PolicyCell::default();
        let two = || {
            policy(&[
                ("octo/app", "refs/heads/main", Access::ReadOnly, None),
                ("*", "refs/pull/*", Access::Deny, None),
            ])
        };
        // At start-up a file without rules is no lift: nothing was in force.
        assert_eq!(cell.set(Policy::default(), T), None);
        assert_eq!(cell.set(two(), T + 1), None);
        let lifted = Lifted {
            at: T + 2,
            rules: 2,
        };
        assert_eq!(cell.set(Policy::default(), T + 2), Some(lifted.clone()));
        assert_eq!(cell.lifted(), Some(lifted.clone()));
        // Reloaded again without rules: no new lift, the one before stays.
        assert_eq!(cell.set(Policy::default(), T + 3), None);
        assert_eq!(cell.lifted(), Some(lifted.clone()));
        assert_eq!(
            lifted.warning("/etc/hoard/policy.toml"),
            "the policy file /etc/hoard/policy.toml has no rules since its reload at 2025-12-01T20:00:00Z: the 2 rules in force before are lifted, so no scope is read-only or denied; restore the rules and send SIGHUP if that was not meant"
        );
        // A failed reload changes nothing; rules back end it.
        cell.failed(&PolicyError("bad".into()), T + 4);
        assert_eq!(cell.lifted(), Some(lifted));
        assert_eq!(cell.set(two(), T + 5), None);
        assert_eq!(cell.lifted(), None);
    }
}
