//! Who is calling: runtime tokens, Forgejo proxies and namespaces turned into an [`Identity`],
//! and signed blob URLs.

pub mod callers;
pub mod forgejo;
pub mod namespaces;
pub mod scope;
pub mod signing;
pub mod token;
pub mod verify;

pub use callers::{Caller, CallerError, Callers};
pub use signing::{LinkTarget, Purpose, UrlSigner};
pub use token::{Identity, TokenError};
pub use verify::{TokenSettings, Verifier};

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
