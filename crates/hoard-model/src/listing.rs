//! The records an operator's listing and the metrics read: which entries to list and in what
//! order, a listed entry, a repository's usage, and the store's totals. Shared by `meta`, which
//! fills them, and `cache`, `api` and `metrics`, which read them.

use super::{CallerKind, Entry, EntryId, Millis, Provenance, RepoId, Scope};

/// Which entries an operator asks for. Every part that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryFilter {
    /// A repository's id or its name (owner/name). Names are not unique: a forge's and
    /// GitHub's `owner/x` share one, and a repository keeps its old name until it saves again.
    pub repository: Option<String>,
    /// Exactly this repository id (what deletions use).
    pub repository_id: Option<String>,
    pub scope: Option<Scope>,
    /// A prefix of the key, folded as keys are matched (case-insensitively).
    pub folded_key_prefix: Option<String>,
    /// Exactly this key, folded (what the v1 listing `GET caches?key=` asks).
    pub folded_key: Option<String>,
    pub version: Option<String>,
    /// Exactly this entry.
    pub id: Option<EntryId>,
    /// Written by this run (`written_by.run_id`).
    pub run_id: Option<String>,
    /// Written by a caller with this subject (`written_by.subject`).
    pub subject: Option<String>,
    /// Written by this kind of caller.
    pub kind: Option<CallerKind>,
    /// Written at or after this time.
    pub written_after: Option<Millis>,
    /// Written before this time.
    pub written_before: Option<Millis>,
    /// Exactly this archive digest (`sha256:…` or `sha256-chunks:…`, see
    /// [`crate::entry_digest`]): the same bytes saved under any key, by any run.
    pub digest: Option<String>,
    /// Entries in quarantine instead of live ones (`state=quarantined`).
    pub quarantined: bool,
    /// Promoted by this (`promoted_by`, see [`crate::Promotion::by`]): what one promotion made.
    pub promoted_by: Option<String>,
    /// Made of this chunk (a blob name): an entry and the promoted copies that share it.
    pub chunk: Option<String>,
}

impl EntryFilter {
    /// Selects every entry.
    pub fn is_everything(&self) -> bool {
        *self == Self::default()
    }
}

/// Which restore records to answer ([`crate::RestoreRecord`]), most recent first.
#[derive(Debug, Clone, Default)]
pub struct RestoreQuery {
    /// These entries' records; when empty, those `written_under` selects.
    pub entries: Vec<EntryId>,
    /// Of the filter, the parts a record keeps of its entry: `repository` (id or name),
    /// `repository_id`, `scope`, `run_id`, `subject`, `kind`, `written_after` and
    /// `written_before`: the blast radius of a writer.
    pub written_under: EntryFilter,
    pub limit: usize,
}

/// The order of a listing; ties are broken by entry id in the same direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EntryOrder {
    /// By last restore (or creation, if never restored).
    #[default]
    LastUsed,
    Size,
    Created,
}

impl EntryOrder {
    /// The value an entry sorts by.
    pub fn value_of(self, entry: &Entry) -> i64 {
        match self {
            Self::LastUsed => entry.last_used_at,
            Self::Size => entry.size as i64,
            Self::Created => entry.created_at,
        }
    }
}

/// One page of a listing: the entries after `after` (the sort value and id of the last entry
/// of the previous page), at most `limit`; with `count`, also how many the filter selects in
/// all.
#[derive(Debug, Clone)]
pub struct EntryPage<'a> {
    pub filter: &'a EntryFilter,
    pub order: EntryOrder,
    pub descending: bool,
    pub after: Option<(i64, EntryId)>,
    pub limit: usize,
    pub count: bool,
}

impl<'a> EntryPage<'a> {
    /// The first `limit` entries `filter` selects, oldest first, without a total. Callers set
    /// what they need on top (`EntryPage { descending: true, ..EntryPage::by_creation(f, n) }`),
    /// so a new field touches them only where they care.
    pub fn by_creation(filter: &'a EntryFilter, limit: usize) -> Self {
        Self {
            filter,
            order: EntryOrder::Created,
            descending: false,
            after: None,
            limit,
            count: false,
        }
    }
}

/// What an [`EntryPage`] selects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntrySelection {
    pub entries: Vec<ListedEntry>,
    /// How many entries the filter selects in all, when the page asked (`count`).
    pub total: Option<u64>,
}

/// An entry as an operator sees it: with its repository's name (empty if none is known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedEntry {
    pub entry: Entry,
    pub repository_name: String,
    pub record: EntryRecord,
    /// Set while the entry is in quarantine.
    pub quarantine: Option<Quarantine>,
}

/// What an entry keeps beyond its slot and bytes, as it is saved and as it is listed: the one
/// record a save hands the store and a listing reads back. A column of `entries` that operators
/// see is a field here (the recipe in docs/architecture.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryRecord {
    /// Who wrote it; `None` for entries saved before hoard recorded it.
    pub written_by: Option<Provenance>,
    /// See [`super::entry_digest`]; empty for entries saved before hoard recorded it.
    pub digest: String,
    /// Where it came from, if it was promoted from another scope.
    pub promotion: Option<crate::Promotion>,
    /// Set for an object a build tool wrote through its own protocol.
    pub tool: Option<ToolObject>,
    /// Where an entry stored on a local miss was read from (the upstream cache's host,
    /// `--upstream-cache`); `None` for every other.
    pub read_through: Option<String>,
}

/// A build tool whose own cache protocol hoard speaks (issue #60), or the protocol several
/// tools share (WebDAV: sccache's and ccache's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tool {
    /// Turborepo's remote cache API (`/v8/artifacts`).
    Turbo,
    /// Nx's self-hosted remote cache API (`/v1/cache`).
    Nx,
    /// Files over WebDAV (`/_dav/`): sccache's `webdav` backend, ccache's `http` storage.
    WebDav,
    /// Bazel's HTTP cache, action results (`/_bazel/ac/`).
    BazelAc,
    /// Bazel's HTTP cache, content-addressed blobs checked on write (`/_bazel/cas/`).
    BazelCas,
    /// Go's build cache through `hoard gocache` (`GOCACHEPROG`).
    Go,
}

impl Tool {
    pub const ALL: [Tool; 6] = [
        Tool::Turbo,
        Tool::Nx,
        Tool::WebDav,
        Tool::BazelAc,
        Tool::BazelCas,
        Tool::Go,
    ];

    /// The name stored, listed and filtered by.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Turbo => "turbo",
            Self::Nx => "nx",
            Self::WebDav => "webdav",
            Self::BazelAc => "bazel-ac",
            Self::BazelCas => "bazel-cas",
            Self::Go => "go",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// Whether its objects keep headers to send back (Turborepo's `x-artifact-*`): only then
    /// does a hit read them.
    pub fn keeps_headers(self) -> bool {
        matches!(self, Self::Turbo)
    }
}

/// What an entry written by a build tool keeps of it: the tool, and the headers the tool sent
/// with the object and reads back with it (`name: value` lines, such as Turborepo's
/// `x-artifact-duration`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolObject {
    pub tool: Tool,
    pub headers: String,
}

impl ToolObject {
    /// The longest `headers` kept (the columns' width on MySQL).
    pub const MAX_HEADERS: usize = 2048;

    /// `headers` (names and values) as stored; `None` if they would not fit, or hold a line
    /// break or a name with a colon, which could not be read back as they were.
    pub fn new<'h>(
        tool: Tool,
        headers: impl IntoIterator<Item = (&'h str, &'h str)>,
    ) -> Option<Self> {
        let mut stored = String::new();
        for (name, value) in headers {
            if name.contains([':', '\n', '\r']) || value.contains(['\n', '\r']) {
                return None;
            }
            stored.push_str(&format!("{name}: {value}\n"));
        }
        (stored.len() <= Self::MAX_HEADERS).then_some(Self {
            tool,
            headers: stored,
        })
    }

    /// An object of `tool` that keeps no headers.
    pub fn bare(tool: Tool) -> Self {
        Self {
            tool,
            headers: String::new(),
        }
    }

    /// The object as its two columns hold it: `None` for an Actions entry (no tool), or one of
    /// a tool this version does not know.
    pub fn stored(tool: String, headers: String) -> Option<Self> {
        Some(Self {
            tool: Tool::from_name(&tool)?,
            headers,
        })
    }

    /// The headers, in the order the tool sent them.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.headers
            .lines()
            .filter_map(|line| line.split_once(": "))
    }
}

/// Why and since when an entry is in quarantine: out of every lookup, kept for examination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantine {
    pub reason: String,
    pub at: Millis,
}

/// What one repository holds and how its lookups went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepositoryUsage {
    pub repository: RepoId,
    /// Owner/name, empty if no caller named it.
    pub name: String,
    pub bytes: u64,
    pub entries: u64,
    /// Bytes and entries of pull requests and tags among them ([`super::ScopeClass`]).
    pub pr_bytes: u64,
    pub pr_entries: u64,
    /// Restores and lookups that found nothing, since the repository was first seen.
    pub hits: u64,
    pub misses: u64,
}

/// What a store holds (see [`MetaStore::totals`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub bytes: u64,
    pub entries: u64,
    /// Repositories the store has seen (one whose entries all went still counts).
    pub repositories: u64,
    pub open_uploads: u64,
}

impl Totals {
    /// From the signed counts SQL answers with.
    pub fn from_counts(bytes: i64, entries: i64, repositories: i64, open_uploads: i64) -> Self {
        Self {
            bytes: bytes.max(0) as u64,
            entries: entries.max(0) as u64,
            repositories: repositories.max(0) as u64,
            open_uploads: open_uploads.max(0) as u64,
        }
    }
}
