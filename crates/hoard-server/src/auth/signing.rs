//! Signed blob URLs: HMAC-SHA256 over (purpose, id, expiry), compared in constant time.
//!
//! Blob endpoints get no `Authorization` header (PROTOCOL.md §1.4), so each URL carries its own
//! authority: `se` (expiry) and `sig` (the client masks `sig` in its logs, §3.2). `se` is written
//! as Azure's shared-access signatures write it, an ISO-8601 time to the second
//! ([`expiry_text`]), so that an Azure SDK that parses and re-encodes the link keeps it; links of
//! earlier releases carry Unix seconds, still read until they expire ([`parse_expiry`]).
//! The purpose is part of the MAC, so an upload signature never opens a download and vice versa;
//! so is the target's creation time, so a link can never open a later row that reused its id
//! (SQLite may reuse the ids of deleted rows).

use std::fs;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

use crate::model::{Clock, EntryId, SystemClock, UploadId};
use crate::secret::Secret;

pub(super) type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Upload,
    Download,
}

impl Purpose {
    fn label(self) -> &'static str {
        match self {
            Self::Upload => "upload",
            Self::Download => "download",
        }
    }
}

/// An id a link may carry; its type decides what the link is signed for, so an upload's id
/// can never be signed (or checked) as a download.
pub trait LinkId: Copy + std::fmt::Display {
    const PURPOSE: Purpose;
}

impl LinkId for UploadId {
    const PURPOSE: Purpose = Purpose::Upload;
}

impl LinkId for EntryId {
    const PURPOSE: Purpose = Purpose::Download;
}

/// What a link opens: an upload ([`UploadId`]) or an entry ([`EntryId`]), by id and creation
/// time (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkTarget<Id> {
    pub id: Id,
    pub created_at: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the link's signature is missing or malformed")]
    Malformed,
    #[error("the link's signature does not match")]
    Forged,
    #[error("the link has expired")]
    Expired,
}

/// Signs and checks links with one key, on one clock.
#[derive(Clone)]
pub struct UrlSigner {
    /// The HMAC with the key already absorbed: each link then costs the message's blocks only,
    /// not the key schedule's two more. Derived from the key, so as secret as the key.
    keyed: HmacSha256,
    /// Where links' expiry is measured: the machine's clock unless [`UrlSigner::with_clock`].
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for UrlSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UrlSigner(***)")
    }
}

/// Fsyncs the directory that holds `path`, so that a name just linked there survives a crash.
fn sync_directory_of(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    fs::File::open(dir)?.sync_all()
}

impl UrlSigner {
    pub fn new(key: Secret) -> Self {
        Self {
            keyed: HmacSha256::new_from_slice(key.expose()).expect("HMAC takes keys of any length"),
            clock: Arc::new(SystemClock),
        }
    }

    /// The keyed MAC, for the other things signed with this key (`tool_token.rs`).
    pub(super) fn keyed(&self) -> HmacSha256 {
        self.keyed.clone()
    }

    /// The same signer measuring expiry on `clock` (tests move a `ManualClock`).
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        Self { clock, ..self }
    }

    /// Now, in the Unix seconds of links' `se`: what a link's expiry is set from and checked
    /// against.
    pub fn now(&self) -> u64 {
        super::unix_seconds(self.clock.as_ref())
    }

    /// Loads the key kept in `path`, or makes one and keeps it there with mode 0600 so that
    /// links survive restarts (and replicas sharing the file accept each other's links).
    pub fn load_or_create(path: &Path) -> io::Result<Self> {
        match fs::read(path) {
            Ok(key) if key.len() >= 32 => return Ok(Self::new(Secret::new(key))),
            Ok(_) => {
                return Err(io::Error::other(format!(
                    "signing key {} is shorter than 32 bytes",
                    path.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut key = vec![0u8; 32];
        rand::rng().fill_bytes(&mut key);
        // Written whole under a private name, then linked into place: a process starting at
        // the same moment sees either no key or a complete one, and the first link wins.
        let staging = path.with_extension(format!("new-{}", std::process::id()));
        let mut options = fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let written = options.open(&staging).and_then(|mut file| {
            file.write_all(&key)?;
            file.sync_all()
        });
        let linked = written.and_then(|()| fs::hard_link(&staging, path));
        let _ = fs::remove_file(&staging);
        // The link made durable too: a machine crash must not take the key back once links
        // signed with it have been handed out.
        let linked = linked.and_then(|()| sync_directory_of(path));
        match linked {
            Ok(()) => Ok(Self::new(Secret::new(key))),
            // Another process made it first: use theirs.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Self::load_or_create(path),
            Err(e) => Err(e),
        }
    }

    fn mac<Id: LinkId>(&self, target: LinkTarget<Id>, expires: u64) -> HmacSha256 {
        /// Formats straight into the MAC: the same bytes as a `format!`, without its buffer.
        struct Into<'a>(&'a mut HmacSha256);
        impl std::fmt::Write for Into<'_> {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                self.0.update(s.as_bytes());
                Ok(())
            }
        }
        let mut mac = self.keyed.clone();
        let LinkTarget { id, created_at } = target;
        let purpose = Id::PURPOSE.label();
        std::fmt::Write::write_fmt(
            &mut Into(&mut mac),
            format_args!("{purpose}\n{id}\n{created_at}\n{expires}"),
        )
        .expect("writing into a MAC cannot fail");
        mac
    }

    /// The `sig` value for a link.
    pub fn sign<Id: LinkId>(&self, target: LinkTarget<Id>, expires: u64) -> String {
        let mut sig = String::with_capacity(43);
        self.sign_into(target, expires, &mut sig);
        sig
    }

    /// Appends the `sig` value for a link to `out`.
    pub fn sign_into<Id: LinkId>(&self, target: LinkTarget<Id>, expires: u64, out: &mut String) {
        let mac = self.mac(target, expires).finalize().into_bytes();
        URL_SAFE_NO_PAD.encode_string(mac, out);
    }

    /// Checks a link's `se` and `sig` now, on the clock links are signed on.
    pub fn verify<Id: LinkId>(
        &self,
        target: LinkTarget<Id>,
        expires: Option<&str>,
        sig: Option<&str>,
    ) -> Result<(), SignatureError> {
        self.verify_at(target, expires, sig, self.now())
    }

    /// [`UrlSigner::verify`] at time `now` (Unix seconds).
    fn verify_at<Id: LinkId>(
        &self,
        target: LinkTarget<Id>,
        expires: Option<&str>,
        sig: Option<&str>,
        now: u64,
    ) -> Result<(), SignatureError> {
        let expires = expires
            .and_then(parse_expiry)
            .ok_or(SignatureError::Malformed)?;
        let sig = sig
            .and_then(|s| URL_SAFE_NO_PAD.decode(s).ok())
            .ok_or(SignatureError::Malformed)?;
        self.mac(target, expires)
            .verify_slice(&sig)
            .map_err(|_| SignatureError::Forged)?;
        if now >= expires {
            return Err(SignatureError::Expired);
        }
        Ok(())
    }
}

/// A link's expiry (Unix seconds) as its `se` carries it: `2026-12-03T15:04:05Z`, the format
/// every Azure SAS parser reads and writes back unchanged (the Go SDK keeps the format it read;
/// the others keep the text or write seconds in this form).
pub fn expiry_text(expires: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(expires);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// An `se` value: an ISO-8601 UTC time ([`expiry_text`], also with a fraction of a second, as
/// SAS parsers accept), or the Unix seconds of links made before that format.
pub fn parse_expiry(raw: &str) -> Option<u64> {
    if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
        return raw.parse().ok();
    }
    let at = humantime::parse_rfc3339(raw).ok()?;
    Some(at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATED: i64 = 1_700_000_000_000;

    fn upload(id: i64) -> LinkTarget<UploadId> {
        LinkTarget {
            id: UploadId::new(id),
            created_at: CREATED,
        }
    }

    fn entry(id: i64) -> LinkTarget<EntryId> {
        LinkTarget {
            id: EntryId::new(id),
            created_at: CREATED,
        }
    }

    /// Links made by an earlier version (or a replica not yet upgraded) keep verifying: the
    /// signed message is exactly `purpose\nid\ncreated_at\nexpires`.
    #[test]
    fn the_signed_message_is_the_one_links_have_always_carried() {
        let s = signer();
        let mut plain = s.keyed.clone();
        plain.update(format!("download\n5\n{CREATED}\n1000").as_bytes());
        assert_eq!(
            s.sign(entry(5), 1000),
            URL_SAFE_NO_PAD.encode(plain.finalize().into_bytes())
        );
    }

    #[test]
    fn a_signature_never_opens_a_later_row_with_the_same_id() {
        let s = signer();
        let sig = s.sign(entry(5), 1000);
        let reused = LinkTarget {
            id: EntryId::new(5),
            created_at: CREATED + 1,
        };
        assert_eq!(
            s.verify_at(reused, Some("1000"), Some(&sig), 0),
            Err(SignatureError::Forged)
        );
    }

    fn signer() -> UrlSigner {
        UrlSigner::new(Secret::new(vec![7; 32]))
    }

    #[test]
    fn a_signed_link_verifies_until_it_expires() {
        let s = signer();
        let sig = s.sign(upload(5), 1000);
        assert_eq!(
            s.verify_at(upload(5), Some("1000"), Some(&sig), 999),
            Ok(())
        );
        assert_eq!(
            s.verify_at(upload(5), Some("1000"), Some(&sig), 1000),
            Err(SignatureError::Expired)
        );
    }

    #[test]
    fn signatures_bind_purpose_id_and_expiry() {
        let s = signer();
        let sig = s.sign(upload(5), 1000);
        let forged = Err(SignatureError::Forged);
        assert_eq!(s.verify_at(entry(5), Some("1000"), Some(&sig), 0), forged);
        assert_eq!(s.verify_at(upload(6), Some("1000"), Some(&sig), 0), forged);
        assert_eq!(s.verify_at(upload(5), Some("2000"), Some(&sig), 0), forged);
        let other = UrlSigner::new(Secret::new(vec![8; 32]));
        assert_eq!(
            other.verify_at(upload(5), Some("1000"), Some(&sig), 0),
            forged
        );
    }

    #[test]
    fn missing_or_garbled_parameters_are_malformed() {
        let s = signer();
        let m = Err(SignatureError::Malformed);
        assert_eq!(s.verify_at(upload(5), None, Some("x"), 0), m);
        assert_eq!(s.verify_at(upload(5), Some("soon"), Some("x"), 0), m);
        assert_eq!(s.verify_at(upload(5), Some("1000"), None, 0), m);
        assert_eq!(s.verify_at(upload(5), Some("1000"), Some("%%%"), 0), m);
    }

    #[test]
    fn expiry_reads_as_iso_time_and_as_the_unix_seconds_of_earlier_links() {
        let at = 1_796_310_245; // 2026-12-03T15:04:05Z
        assert_eq!(expiry_text(at), "2026-12-03T15:04:05Z");
        assert_eq!(parse_expiry("2026-12-03T15:04:05Z"), Some(at));
        assert_eq!(parse_expiry("2026-12-03T15:04:05.0000000Z"), Some(at));
        assert_eq!(parse_expiry(&at.to_string()), Some(at));
        for bad in ["", "soon", "-5", "2026-12-03", "2026-12-03T15:04:05+01:00"] {
            assert_eq!(parse_expiry(bad), None, "{bad}");
        }
        let s = signer();
        let sig = s.sign(upload(5), at);
        for se in [expiry_text(at), at.to_string()] {
            assert_eq!(
                s.verify_at(upload(5), Some(&se), Some(&sig), at - 1),
                Ok(())
            );
        }
        assert_eq!(
            s.verify_at(upload(5), Some(&expiry_text(at + 1)), Some(&sig), 0),
            Err(SignatureError::Forged)
        );
    }

    #[test]
    fn expiry_is_measured_on_the_signers_clock() {
        let clock = Arc::new(crate::model::ManualClock::starting_at(1_000_000));
        let s = signer().with_clock(clock.clone());
        assert_eq!(s.now(), 1000);
        let expires = s.now() + 5;
        let sig = s.sign(entry(5), expires);
        let se = expires.to_string();
        let check = |s: &UrlSigner| s.verify_at(entry(5), Some(&se), Some(&sig), s.now());
        assert_eq!(check(&s), Ok(()));
        clock.advance(std::time::Duration::from_millis(4_999));
        assert_eq!(check(&s), Ok(()));
        clock.advance(std::time::Duration::from_millis(1));
        assert_eq!(check(&s), Err(SignatureError::Expired));
    }

    #[test]
    fn the_key_is_kept_with_owner_only_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signing.key");
        let a = UrlSigner::load_or_create(&path).unwrap();
        let b = UrlSigner::load_or_create(&path).unwrap();
        assert_eq!(a.sign(entry(1), 2), b.sign(entry(1), 2));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
