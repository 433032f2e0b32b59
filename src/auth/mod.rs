//! Who is calling: runtime tokens turned into an [`Identity`], and signed blob URLs.

pub mod scope;
pub mod signing;
pub mod token;
pub mod verify;

pub use signing::{LinkTarget, Purpose, UrlSigner};
pub use token::{Identity, TokenError};
pub use verify::{TokenSettings, Verifier};
