//! What a put computes over the bytes it stores: XXH3-64 always (the cheap check every download
//! makes), and SHA-256 (the record the entry's digest is made of) where the store computes it
//! while writing.

use sha2::{Digest, Sha256};

pub(crate) struct Digests {
    sha256: Option<Sha256>,
    // Boxed: the hasher state is 600 bytes, moved in and out of blocking tasks.
    xxh3: Box<xxhash_rust::xxh3::Xxh3>,
}

impl Digests {
    /// Both digests.
    pub(crate) fn with_sha256() -> Self {
        Self {
            sha256: Some(Sha256::new()),
            xxh3: Box::new(xxhash_rust::xxh3::Xxh3::new()),
        }
    }

    /// XXH3 only: the SHA-256 is left to the digest pass.
    pub(crate) fn xxh3_only() -> Self {
        Self {
            sha256: None,
            xxh3: Box::new(xxhash_rust::xxh3::Xxh3::new()),
        }
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        if let Some(sha256) = self.sha256.as_mut() {
            sha256.update(bytes);
        }
        self.xxh3.update(bytes);
    }

    /// The SHA-256 (if computed) and XXH3-64 of everything given to [`Digests::update`].
    pub(crate) fn finish(self) -> (Option<[u8; 32]>, u64) {
        (self.sha256.map(|h| h.finalize().into()), self.xxh3.digest())
    }
}
