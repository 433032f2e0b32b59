//! The vocabulary every layer shares (the bottom of the module graph: it imports no other part of
//! hoard): validated newtypes for what clients send and what the server makes, and the records
//! of entries, uploads and chunks that the stores load and the domain decides on.
//!
//! Every value that crosses the HTTP boundary is parsed into one of these before the domain sees
//! it, so the rules (PROTOCOL.md §2.5, §9 "Key constraints") live in one place.

pub mod admin_wire;
pub mod family;
pub mod listing;
pub mod provenance;
pub mod scope_class;
pub mod stats;
pub mod units;

pub use listing::{
    EntryFilter, EntryOrder, EntryPage, EntryRecord, EntrySelection, ListedEntry, Quarantine,
    RepositoryUsage, RestoreQuery, Tool, ToolObject, Totals,
};
pub use provenance::{
    entry_digest, CallerKind, Promotion, Provenance, RestoreRecord, RestoringJob,
};
pub use scope_class::{QuotaUsage, ScopeClass, Share};
pub use stats::{
    Bucket, Counters, Evictions, LookupResult, RefClass, StatsFilter, StatsKey, StatsQuery,
    StatsRow, StatsRows, StoredFamily,
};

use std::fmt;
use std::pin::Pin;

use rand::RngCore;

/// A stream of body bytes, in either direction: a request body on its way to the chunk store,
/// or an entry's bytes on their way to the client. Shared by `api`, `cache` and `blob`.
pub type ByteStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send>>;

/// The most keys a lookup may carry: the primary key plus restore keys (PROTOCOL.md §2.7).
pub const MAX_LOOKUP_KEYS: usize = 10;
/// The most readable scopes a lookup searches. GitHub's tokens carry one to three (the ref, its
/// base, the default branch); a lookup's work grows with scopes × keys, so more are refused.
pub const MAX_READ_SCOPES: usize = 16;
/// The longest key `@actions/cache` accepts (PROTOCOL.md §9).
pub const MAX_KEY_CHARS: usize = 512;
/// Versions are opaque strings (buildx sends its own); this only bounds their size.
pub const MAX_VERSION_CHARS: usize = 512;

/// Why a client-supplied value was refused. The message is safe to send back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidInput(pub String);

/// A cache key as the client gave it: 1 to 512 characters, no commas, no control characters.
/// Stored as given; matched through [`CacheKey::folded`] (case-insensitive, PROTOCOL.md §9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKey(String);

impl CacheKey {
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        if raw.is_empty() {
            return Err(InvalidInput("key must not be empty".into()));
        }
        if raw.chars().count() > MAX_KEY_CHARS {
            return Err(InvalidInput(format!(
                "key is longer than {MAX_KEY_CHARS} characters"
            )));
        }
        if raw.contains(',') {
            return Err(InvalidInput("key must not contain commas".into()));
        }
        if raw.chars().any(char::is_control) {
            return Err(InvalidInput(
                "key must not contain control characters".into(),
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The form keys are compared in: lower case, so `Linux-x` matches `linux-X`.
    pub fn folded(&self) -> String {
        self.0.to_lowercase()
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The client's version hash: opaque, compared exactly (PROTOCOL.md §2.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version(String);

impl Version {
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        if raw.is_empty() {
            return Err(InvalidInput("version must not be empty".into()));
        }
        if raw.len() > MAX_VERSION_CHARS || raw.chars().any(char::is_control) {
            return Err(InvalidInput(
                "version must be at most 512 printable characters".into(),
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a lookup asks for: the primary key first, then restore keys, all for one version.
#[derive(Debug, Clone)]
pub struct Lookup {
    pub keys: Vec<CacheKey>,
    pub version: Version,
}

impl Lookup {
    /// Builds a lookup, dropping repeats of a key (go-actions-cache repeats the primary key among
    /// its restore keys) and enforcing the 10-key limit.
    pub fn parse(primary: &str, restore: &[String], version: &str) -> Result<Self, InvalidInput> {
        let version = Version::parse(version)?;
        if 1 + restore.len() > MAX_LOOKUP_KEYS * 2 {
            return Err(InvalidInput(format!(
                "at most {MAX_LOOKUP_KEYS} keys may be looked up at once"
            )));
        }
        let mut keys: Vec<CacheKey> = Vec::with_capacity(1 + restore.len());
        for raw in std::iter::once(primary).chain(restore.iter().map(String::as_str)) {
            let key = CacheKey::parse(raw)?;
            if !keys.iter().any(|k| k.as_str() == key.as_str()) {
                keys.push(key);
            }
        }
        if keys.len() > MAX_LOOKUP_KEYS {
            return Err(InvalidInput(format!(
                "at most {MAX_LOOKUP_KEYS} keys may be looked up at once"
            )));
        }
        Ok(Self { keys, version })
    }
}

/// Repository identity from the runtime token's `repository_id` claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoId(String);

impl RepoId {
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RepoId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A cache scope: the git ref an entry belongs to (`refs/heads/main`, `refs/pull/7/merge`, or ""
/// for forge tokens that carry no ref).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope(String);

impl Scope {
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

const RANGE_TAG: &[u8] = b"\0v1-range:";

/// A block id from Put Block, after URL decoding: opaque bytes, ordered only by the block list
/// (PROTOCOL.md §3.4, §12). Never empty: the empty id is reserved for single-shot Put Blob.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockId(Vec<u8>);

impl BlockId {
    /// Longest block id Azure accepts once base64-decoded is 64 bytes; encoded forms are longer.
    const MAX_LEN: usize = 1024;

    pub fn parse(raw: &[u8]) -> Result<Self, InvalidInput> {
        if raw.is_empty() || raw.len() > Self::MAX_LEN {
            return Err(InvalidInput("blockid must be 1 to 1024 bytes".into()));
        }
        Ok(Self(raw.to_vec()))
    }

    /// The id under which a single-shot Put Blob stages its one chunk.
    pub fn whole_blob() -> Self {
        Self(Vec::new())
    }

    /// The id under which a v1 upload stages the byte range starting at `start`: a retried
    /// range replaces its earlier copy, as a retried block does. (A client could stage such an
    /// id through its own upload link; that only shapes its own upload.)
    pub fn range(start: u64) -> Self {
        let mut id = RANGE_TAG.to_vec();
        id.extend_from_slice(&start.to_be_bytes());
        Self(id)
    }

    /// The start offset of a range id made by [`BlockId::range`].
    pub fn range_start(&self) -> Option<u64> {
        let offset = self.0.strip_prefix(RANGE_TAG)?;
        Some(u64::from_be_bytes(offset.try_into().ok()?))
    }

    pub fn from_stored(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Name of a stored chunk: 32 lowercase hex characters made by the server, so it never contains
/// `/`, `.` or NUL and no client string ever becomes a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobName(String);

impl BlobName {
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        rand::rng().fill_bytes(&mut bytes);
        Self(hex::encode(bytes))
    }

    /// Re-validates a name read back from the metadata store.
    pub fn parse(raw: &str) -> Option<Self> {
        let ok = raw.len() == 32
            && raw
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BlobName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Text a client chose (a token's claims, a path, a key, a driver's message quoting a
/// statement), made safe for a log line or an error message: control characters (newlines,
/// ESC and the rest of C0 and C1) are written as escapes, so one value can neither start a
/// forged line nor drive a terminal, and at most [`LogSafe::MAX`] bytes of it are shown, so
/// what one request can make the server write is bounded whatever it sends. Every token- or
/// request-derived value in a log line goes through this.
#[derive(Debug, Clone, Copy)]
pub struct LogSafe<'a>(pub &'a str);

impl LogSafe<'_> {
    pub const MAX: usize = 300;
}

impl fmt::Display for LogSafe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        let mut end = text.len().min(Self::MAX);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        write_escaped(f, &text[..end])?;
        if end < text.len() {
            write!(f, "… ({} bytes)", text.len())?;
        }
        Ok(())
    }
}

/// Text a client chose, shown whole on an operator's terminal (the CLI's tables and
/// listings): escaped as [`LogSafe`] escapes it, but never shortened, since the operator may
/// need all of a key or a subject to act on it. JSON output does not need it: JSON escapes.
#[derive(Debug, Clone, Copy)]
pub struct TermSafe<'a>(pub &'a str);

impl fmt::Display for TermSafe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0)
    }
}

/// `text` with every character [`needs_escape`] names written as an escape (`\n`, `\r`,
/// `\t`, else `\u{…}`), the rest as it is.
fn write_escaped(f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
    if !text.chars().any(needs_escape) {
        return f.write_str(text);
    }
    for c in text.chars() {
        match c {
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            c if needs_escape(c) => write!(f, "\\u{{{:x}}}", u32::from(c))?,
            c => fmt::Write::write_char(f, c)?,
        }
    }
    Ok(())
}

/// Control characters, the Unicode line and paragraph separators some viewers break lines at,
/// and the bidirectional overrides that make text read differently from what it is.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A random RFC 4122-shaped id (`8-4-4-4-12` hex), for request ids and block-id prefixes.
pub fn random_uuid() -> String {
    let name = BlobName::random();
    let h = name.as_str();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// One stored chunk: its name, length and digests, as recorded when it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub blob: BlobName,
    pub size: u64,
    /// SHA-256 of the bytes: what the entry's digest is made of, and what `hoard verify`
    /// checks where it is known. `None` until the digest pass has hashed a chunk the local
    /// disk store wrote without it (see `cache::digest_pass`).
    pub sha256: Option<[u8; 32]>,
    /// XXH3-64 of the bytes: the check every download makes, an order of magnitude cheaper
    /// than SHA-256. `None` for chunks recorded before it was (they all have a SHA-256).
    pub xxh3: Option<u64>,
}

/// Declares an id the metadata store makes: a type of its own, so that one kind of id is never
/// passed where another is due, shown as the bare integer (links, JSON and logs read as they
/// always did).
macro_rules! store_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(i64);

        impl $name {
            /// Wraps an id read from a row, a URL or a test.
            pub const fn new(id: i64) -> Self {
                Self(id)
            }

            /// The integer the database stores (for binding and wire formats).
            pub const fn get(self) -> i64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

store_id! {
    /// Identifies one upload (an open or closed reservation); made when it is created.
    UploadId
}

store_id! {
    /// Identifies one entry; made when an upload is finalized.
    EntryId
}

/// Milliseconds since the Unix epoch: the one clock unit stored in metadata.
pub type Millis = i64;

pub fn now_millis() -> Millis {
    millis_of(std::time::SystemTime::now()).unwrap_or(0)
}

/// A system time as [`Millis`]; `None` before 1970.
pub fn millis_of(t: std::time::SystemTime) -> Option<Millis> {
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis().min(i64::MAX as u128) as Millis)
}

/// The last millisecond of year 9999: RFC 3339 has four-digit years, so a later stored time (a
/// bad clock) is shown as this rather than failing.
const LAST_RFC3339: Millis = 253_402_300_799_999;

fn system_time(millis: Millis) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_millis(millis.clamp(0, LAST_RFC3339) as u64)
}

/// `millis` as RFC 3339 UTC with milliseconds (`2026-12-03T17:05:41.123Z`), clamped to 1970–9999.
pub fn rfc3339_millis(millis: Millis) -> String {
    humantime::format_rfc3339_millis(system_time(millis)).to_string()
}

/// [`rfc3339_millis`] to the second.
pub fn rfc3339_seconds(millis: Millis) -> String {
    humantime::format_rfc3339_seconds(system_time(millis)).to_string()
}

/// The place one entry may occupy: at most one visible entry and one open upload exist per
/// (repository, scope, folded key, version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub repository: RepoId,
    pub scope: Scope,
    pub key: CacheKey,
    pub version: Version,
}

/// An upload's blocks: staged ones by id (Put Block, not yet listed) and the committed parts in
/// order (the last block list, or the one Put Blob chunk).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UploadBlocks {
    pub staged: std::collections::HashMap<BlockId, Chunk>,
    pub parts: Vec<(BlockId, Chunk)>,
}

impl UploadBlocks {
    /// Every chunk the upload refers to, staged or committed (a chunk may be both).
    pub fn chunks(&self) -> impl Iterator<Item = &Chunk> {
        self.staged
            .values()
            .chain(self.parts.iter().map(|(_, c)| c))
    }

    /// Every blob the upload refers to, each once.
    pub fn blobs(&self) -> Vec<BlobName> {
        let mut names: Vec<BlobName> = self.chunks().map(|c| c.blob.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// Bytes the committed parts add up to.
    pub fn committed_size(&self) -> u64 {
        self.parts.iter().map(|(_, c)| c.size).sum()
    }
}

/// Where the domain reads the time, so that tests control expiry rules instead of sleeping.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn now(&self) -> Millis;
}

/// The machine's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        now_millis()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug, Default)]
pub struct ManualClock(std::sync::atomic::AtomicI64);

impl ManualClock {
    pub fn starting_at(now: Millis) -> Self {
        Self(std::sync::atomic::AtomicI64::new(now))
    }
    pub fn advance(&self, by: std::time::Duration) {
        self.0
            .fetch_add(by.as_millis() as i64, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A finalized, visible entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: EntryId,
    pub repository: RepoId,
    pub scope: Scope,
    pub key: String,
    pub version: String,
    pub size: u64,
    pub created_at: Millis,
    /// The latest restore, or the creation time.
    pub last_used_at: Millis,
    pub hits: u64,
}

/// An entry as eviction and expiry weigh it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryUse {
    pub id: EntryId,
    pub repository: RepoId,
    pub size: u64,
    pub created_at: Millis,
    pub last_used_at: Millis,
    /// The key family and ref class of the save that made it (statistics count its removal).
    pub family: String,
    pub ref_class: RefClass,
}

/// Why an entry was removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemovalCause {
    /// Its repository went over its quota, or the store over its global limit.
    Evicted,
    /// Unused for longer than the unused TTL, or older than the maximum age.
    Expired,
    /// A chunk failed its integrity check or is missing: never to be served again.
    Quarantined(String),
    /// An operator deleted it.
    Deleted,
}

impl RemovalCause {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::Expired => "expired",
            Self::Quarantined(_) => "quarantined",
            Self::Deleted => "deleted",
        }
    }
}

/// An open or closed reservation for one (repository, scope, key, version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub id: UploadId,
    pub repository: RepoId,
    pub scope: Scope,
    pub key: String,
    pub version: String,
    pub state: UploadState,
    pub created_at: Millis,
    /// Bumped by every change to the upload or its blocks: a change decided on a loaded
    /// `Upload` is applied only if the revision is still the same (compare-and-set).
    pub revision: i64,
    /// Who reserved it, kept by the entry it becomes; `None` for uploads reserved before
    /// hoard recorded it.
    pub written_by: Option<Provenance>,
}

impl Upload {
    pub fn is_open(&self) -> bool {
        self.state == UploadState::Open
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadState {
    Open,
    Finalized,
    Aborted,
}

impl UploadState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Finalized => "finalized",
            Self::Aborted => "aborted",
        }
    }
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "open" => Some(Self::Open),
            "finalized" => Some(Self::Finalized),
            "aborted" => Some(Self::Aborted),
            _ => None,
        }
    }
}

/// An entry the metadata store offered for a lookup: enough to pick the winner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: EntryId,
    pub scope: Scope,
    /// The key as stored (returned to the client as `matched_key`).
    pub key: String,
    /// The key folded to lower case (see `CacheKey::folded`).
    pub key_folded: String,
    pub created_at: Millis,
    /// Its size: what a restore of it moves (statistics count it).
    pub size: u64,
    /// Whether it was promoted from another ref (statistics count the hits it serves).
    pub promoted: bool,
}

/// Where a block-list element looks for its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockSource {
    Latest,
    Committed,
    Uncommitted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRef {
    pub id: BlockId,
    pub source: BlockSource,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_safe_text_is_one_line_without_control_characters_and_bounded() {
        let hostile = "octo/app\naction=\"delete\" id=1\r\x1b[31mred\u{85}\u{2028}\u{202e}\t";
        let shown = LogSafe(hostile).to_string();
        assert_eq!(
            shown,
            "octo/app\\naction=\"delete\" id=1\\r\\u{1b}[31mred\\u{85}\\u{2028}\\u{202e}\\t"
        );
        assert!(!shown.chars().any(needs_escape), "{shown:?}");
        assert_eq!(LogSafe("plain text").to_string(), "plain text");
        let long = format!("{}\n", "é".repeat(400));
        let shown = LogSafe(&long).to_string();
        assert!(
            shown.ends_with(&format!("… ({} bytes)", long.len())),
            "{shown}"
        );
        assert!(shown.len() <= LogSafe::MAX + 20, "{}", shown.len());
        assert!(!shown.contains('\n'));
    }

    #[test]
    fn keys_follow_the_client_rules() {
        assert!(CacheKey::parse("npm-Linux-abc").is_ok());
        assert!(CacheKey::parse("").is_err());
        assert!(CacheKey::parse("a,b").is_err());
        assert!(CacheKey::parse("a\nb").is_err());
        assert!(CacheKey::parse(&"x".repeat(512)).is_ok());
        assert!(CacheKey::parse(&"x".repeat(513)).is_err());
        // Path-like keys are plain data.
        assert!(CacheKey::parse("../../etc/passwd").is_ok());
    }

    #[test]
    fn keys_fold_case() {
        let key = CacheKey::parse("Linux-NPM-Ä").unwrap();
        assert_eq!(key.as_str(), "Linux-NPM-Ä");
        assert_eq!(key.folded(), "linux-npm-ä");
    }

    #[test]
    fn lookups_deduplicate_and_limit_keys() {
        let restore: Vec<String> = vec!["p".into(), "p-".into(), "p".into()];
        let lookup = Lookup::parse("p", &restore, "v").unwrap();
        let keys: Vec<&str> = lookup.keys.iter().map(CacheKey::as_str).collect();
        assert_eq!(keys, ["p", "p-"]);

        let many: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        assert!(Lookup::parse("primary", &many, "v").is_err());
        assert!(Lookup::parse("primary", &many[..9], "v").is_ok());
    }

    #[test]
    fn blob_names_are_server_made_hex() {
        let name = BlobName::random();
        assert_eq!(BlobName::parse(name.as_str()), Some(name));
        assert_eq!(BlobName::parse("../../../../etc/passwd"), None);
        assert_eq!(BlobName::parse("ABCDEF00112233445566778899aabbcc"), None);
    }
}
