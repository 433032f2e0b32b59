//! What every put computes over the bytes it stores: SHA-256 (the record, checked by
//! `hoard verify`) and XXH3-64 (the cheap check every download makes).

use sha2::{Digest, Sha256};

pub(crate) struct Digests {
    sha256: Sha256,
    // Boxed: the hasher state is 600 bytes, moved in and out of blocking tasks.
    xxh3: Box<xxhash_rust::xxh3::Xxh3>,
}

impl Digests {
    pub(crate) fn new() -> Self {
        Self {
            sha256: Sha256::new(),
            xxh3: Box::new(xxhash_rust::xxh3::Xxh3::new()),
        }
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.sha256.update(bytes);
        self.xxh3.update(bytes);
    }

    /// The SHA-256 and XXH3-64 of everything given to [`Digests::update`].
    pub(crate) fn finish(self) -> ([u8; 32], u64) {
        (self.sha256.finalize().into(), self.xxh3.digest())
    }
}
