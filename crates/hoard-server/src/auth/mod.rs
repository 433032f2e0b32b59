//! Who is calling: runtime tokens, Forgejo proxies and namespaces turned into an [`Identity`],
//! and signed blob URLs.

pub mod callers;
pub mod forgejo;
pub mod namespaces;
pub mod scope;
pub mod signing;
pub mod token;
pub mod tool_token;
pub mod verify;

pub use callers::{Caller, CallerError, Callers};
pub use signing::{LinkId, LinkTarget, Purpose, UrlSigner};
pub use token::{Identity, TokenError};
pub use verify::{TokenSettings, Verifier};

use crate::model::Clock;

/// Seconds since the Unix epoch on `clock`: the unit tokens (`exp`, `nbf`) and links (`se`)
/// carry.
pub fn unix_seconds(clock: &dyn Clock) -> u64 {
    u64::try_from(clock.now() / 1000).unwrap_or(0)
}
