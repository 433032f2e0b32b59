//! Who wrote an entry: how its writer was identified, by whom, in which run and job, and from
//! where. Recorded when the upload is reserved and kept with the entry it becomes, so that an
//! operator can tell what one run wrote and remove exactly that after a poisoning.

use std::fmt;
use std::str::FromStr;

use super::LogSafe;

/// How a caller was identified: what provenance records and what write policies name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallerKind {
    /// A runtime token signed by GitHub's issuer (`token.actions.githubusercontent.com`).
    Github,
    /// A runtime token of another trusted issuer (GitHub Enterprise Server, or any issuer
    /// given with `--token-issuer`).
    Ghes,
    /// A token signed with the shared HS256 secret (forges, tests).
    Hs256,
    /// A request through a Forgejo runner's cache proxy.
    Forgejo,
    /// A request under a namespace's secret path prefix.
    Namespace,
    /// A request without credentials, with anonymous access on.
    Anonymous,
    /// A token the admin API issued for one repository (`POST tokens`): a developer's machine
    /// or another system outside Actions.
    Developer,
}

impl CallerKind {
    pub const ALL: [CallerKind; 7] = [
        Self::Github,
        Self::Ghes,
        Self::Hs256,
        Self::Forgejo,
        Self::Namespace,
        Self::Anonymous,
        Self::Developer,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Github => "github",
            Self::Ghes => "ghes",
            Self::Hs256 => "hs256",
            Self::Forgejo => "forgejo",
            Self::Namespace => "namespace",
            Self::Anonymous => "anonymous",
            Self::Developer => "developer",
        }
    }
}

impl fmt::Display for CallerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CallerKind {
    type Err = super::InvalidInput;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                super::InvalidInput(format!(
                    "{:?} is no caller kind (github, ghes, hs256, forgejo, namespace, anonymous or developer)",
                    LogSafe(s).to_string()
                ))
            })
    }
}

/// Who wrote an entry. Every text is the caller's and is kept clipped ([`Provenance::clip`]),
/// so a record is bounded whatever a token carries; an empty text means the caller had none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    pub kind: CallerKind,
    /// The token's `iss`, for tokens that have one.
    pub issuer: String,
    /// The token's `sub`, or the forge repository or namespace the caller stands for.
    pub subject: String,
    /// The workflow run (GitHub's `Actions.Results:<run>:<job>`, act and Gitea's `RunID`, the
    /// Forgejo proxy's run number).
    pub run_id: String,
    pub job_id: String,
    /// The client's address: the peer's, or the first untrusted hop of `X-Forwarded-For`
    /// when the peer is a trusted proxy.
    pub address: String,
}

impl Provenance {
    /// The longest text kept of each field, in bytes (clipped at a character boundary).
    pub const MAX_FIELD: usize = 255;

    /// `text` cut to [`Provenance::MAX_FIELD`] bytes at a character boundary, control
    /// characters replaced: what a record may hold of a caller's text.
    pub fn clip(text: &str) -> String {
        // Replaced first, then cut: a replacement is longer than the character it replaces.
        let clean: String = text
            .chars()
            .map(|c| if c.is_control() { '\u{FFFD}' } else { c })
            .collect();
        let mut end = clean.len().min(Self::MAX_FIELD);
        while !clean.is_char_boundary(end) {
            end -= 1;
        }
        clean[..end].to_owned()
    }

    /// An anonymous record with no detail: what tests start from.
    pub fn anonymous() -> Self {
        Self {
            kind: CallerKind::Anonymous,
            issuer: String::new(),
            subject: String::new(),
            run_id: String::new(),
            job_id: String::new(),
            address: String::new(),
        }
    }
}

/// Where a promoted entry came from: an entry of another scope of the same repository (a merge
/// queue's branch, a merged pull request's merge ref) made readable in this one, as an entry of
/// its own over the same chunks (no byte copied). Kept with the entry beside its writer, who
/// stays the writer of the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promotion {
    /// The scope of the entry it copies.
    pub from_scope: super::Scope,
    /// What promoted it: the id of GitHub's webhook delivery (`X-GitHub-Delivery`), or
    /// `admin:<operator>` for a promotion by hand. The purge and quarantine filter
    /// `promoted_by` names it, to undo one promotion.
    pub by: String,
    /// Why: `merge_group:<head ref>`, `pull_request:<number>`, or empty by hand.
    pub cause: String,
}

impl Promotion {
    /// `by` for a promotion an operator asked for: `admin:` and an id of its own, so that the
    /// `promoted_by` filter names this promotion and no other.
    pub fn by_hand() -> String {
        format!("admin:{}", super::random_uuid())
    }
}

/// Who received an entry: one reader's restores of it (every lookup that matched it, v1 or v2,
/// by exact key or restore key), kept with what the entry's writer was, so the record outlives
/// the entry (a purge, a quarantine) and answers "which jobs restored what that run wrote".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreRecord {
    pub entry_id: super::EntryId,
    pub repository: super::RepoId,
    pub scope: super::Scope,
    pub key: String,
    /// The entry's writer, as the entry recorded it (`None`: not recorded).
    pub written_by: Option<Provenance>,
    /// When the entry was written.
    pub written_at: super::Millis,
    pub reader: Provenance,
    /// The first and latest restores by this reader, and how many.
    pub first_at: super::Millis,
    pub last_at: super::Millis,
    pub count: u64,
}

/// A job that restored entries: what an incident asks first ("which jobs restored it").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoringJob {
    pub kind: CallerKind,
    pub subject: String,
    pub run_id: String,
    pub job_id: String,
    /// How many of the entries it restored, how often in all, and when last.
    pub entries: u64,
    pub restores: u64,
    pub last_at: super::Millis,
}

impl RestoringJob {
    /// The jobs of `records`, the most recent first: one per reader kind, subject, run and job
    /// (whatever address it came from).
    pub fn of(records: &[RestoreRecord]) -> Vec<RestoringJob> {
        let mut jobs: Vec<(RestoringJob, Vec<super::EntryId>)> = Vec::new();
        for r in records {
            let who = &r.reader;
            let found = jobs.iter_mut().find(|(j, _)| {
                j.kind == who.kind
                    && j.subject == who.subject
                    && j.run_id == who.run_id
                    && j.job_id == who.job_id
            });
            let (job, entries) = match found {
                Some(found) => found,
                None => {
                    jobs.push((
                        RestoringJob {
                            kind: who.kind,
                            subject: who.subject.clone(),
                            run_id: who.run_id.clone(),
                            job_id: who.job_id.clone(),
                            entries: 0,
                            restores: 0,
                            last_at: r.last_at,
                        },
                        Vec::new(),
                    ));
                    jobs.last_mut().expect("just pushed")
                }
            };
            if !entries.contains(&r.entry_id) {
                entries.push(r.entry_id);
                job.entries += 1;
            }
            job.restores += r.count;
            job.last_at = job.last_at.max(r.last_at);
        }
        let mut jobs: Vec<RestoringJob> = jobs.into_iter().map(|(j, _)| j).collect();
        jobs.sort_by_key(|j| std::cmp::Reverse(j.last_at));
        jobs
    }
}

/// The digest an entry is known by: `sha256:<hex>` of its bytes when it is one chunk (every
/// entry the clients upload in one request); for an entry assembled from blocks,
/// `sha256-chunks:<hex>`, the SHA-256 of its chunks' SHA-256s in order, which changes whenever
/// any byte does and is computed without reading the entry back. `None` while a chunk's
/// SHA-256 is not known yet.
pub fn entry_digest(chunks: &[super::Chunk]) -> Option<String> {
    use sha2::{Digest, Sha256};
    match chunks {
        [one] => Some(format!("sha256:{}", hex::encode(one.sha256?))),
        many => {
            let mut hasher = Sha256::new();
            for chunk in many {
                hasher.update(chunk.sha256?);
            }
            Some(format!("sha256-chunks:{}", hex::encode(hasher.finalize())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_unknown_ones_are_named() {
        for kind in CallerKind::ALL {
            assert_eq!(kind.as_str().parse::<CallerKind>().unwrap(), kind);
        }
        let e = "token".parse::<CallerKind>().unwrap_err();
        assert!(e.0.contains("\"token\" is no caller kind"), "{}", e.0);
    }

    #[test]
    fn clipping_keeps_characters_whole_and_drops_control_characters() {
        assert_eq!(Provenance::clip("a\nb"), "a\u{FFFD}b");
        // Replacements count against the limit too.
        let controls = Provenance::clip(&"\u{1}".repeat(255));
        assert!(
            controls.len() <= Provenance::MAX_FIELD,
            "{}",
            controls.len()
        );
        let long = "é".repeat(200); // 400 bytes
        let clipped = Provenance::clip(&long);
        assert!(clipped.len() <= Provenance::MAX_FIELD);
        assert_eq!(clipped.len(), 254);
        assert!(clipped.chars().all(|c| c == 'é'));
    }

    #[test]
    fn one_chunk_is_known_by_its_sha256_and_many_by_their_list() {
        let chunk = |byte| super::super::Chunk {
            blob: super::super::BlobName::random(),
            size: 1,
            sha256: Some([byte; 32]),
            xxh3: None,
        };
        assert_eq!(
            entry_digest(&[chunk(0xab)]).unwrap(),
            format!("sha256:{}", "ab".repeat(32))
        );
        let two = entry_digest(&[chunk(1), chunk(2)]).unwrap();
        assert!(two.starts_with("sha256-chunks:"), "{two}");
        assert_ne!(Some(two), entry_digest(&[chunk(2), chunk(1)]));
        let pending = super::super::Chunk {
            sha256: None,
            ..chunk(3)
        };
        assert_eq!(entry_digest(std::slice::from_ref(&pending)), None);
        assert_eq!(entry_digest(&[chunk(1), pending]), None);
    }
}
