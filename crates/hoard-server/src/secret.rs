//! Secrets held in memory (the link signing key, token and Forgejo secrets, database
//! passwords): a type whose `Debug` and `Display` print nothing of them, so that no log line,
//! panic message or `{:?}` of a configuration can leak one.

use std::fmt;

/// Bytes that must never be printed. [`Secret::expose`] is the one way to them.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// The secret itself, for the code that signs or verifies with it.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `presented` is this secret, compared in constant time: both are hashed first,
    /// so neither their lengths nor a common prefix shows in the time taken.
    pub fn matches(&self, presented: &[u8]) -> bool {
        use sha2::{Digest, Sha256};
        let (a, b) = (Sha256::digest(presented), Sha256::digest(&self.0));
        a.iter()
            .zip(b.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(redacted)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// A secret as given on the command line or in the environment (`--signing-key`,
/// `--admin-token`, `--database-url` with its password), before it is checked: the parsed
/// flags print nothing of it either.
#[derive(Clone)]
pub struct SecretText(String);

impl SecretText {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for SecretText {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretText(redacted)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_of_a_secret_is_printed() {
        let s = Secret::new(b"hunter2-hunter2".to_vec());
        for shown in [format!("{s:?}"), format!("{s}"), format!("{s:#?}")] {
            assert!(!shown.contains("hunter"), "{shown}");
        }
        assert_eq!(s.expose(), b"hunter2-hunter2");
        let t: SecretText = "hunter2-hunter2".parse().unwrap();
        assert!(!format!("{t:?}").contains("hunter"));
        assert_eq!(t.expose(), "hunter2-hunter2");
    }

    #[test]
    fn a_secret_matches_only_itself() {
        let s = Secret::new(b"hunter2".to_vec());
        assert!(s.matches(b"hunter2"));
        for other in [&b"hunter"[..], b"hunter22", b"Hunter2", b""] {
            assert!(!s.matches(other), "{other:?}");
        }
    }
}
