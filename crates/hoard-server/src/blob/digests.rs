//! What a put computes over the bytes it stores: XXH3-64 always (the cheap check every download
//! makes), and SHA-256 (the record the entry's digest is made of) where the store computes it
//! while writing.

use std::hash::Hasher as _;

use sha2::{Digest, Sha256};

/// A fresh XXH3-64 state (seed 0, as every recorded `xxh3` is).
pub(crate) fn new_xxh3() -> Box<twox_hash::XxHash3_64> {
    Box::new(twox_hash::XxHash3_64::with_seed(0))
}

/// The XXH3-64 of `data` (seed 0).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn xxh3_64(data: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(data)
}

pub(crate) struct Digests {
    sha256: Option<Sha256>,
    // Boxed: the hasher state is 600 bytes, moved in and out of blocking tasks.
    xxh3: Box<twox_hash::XxHash3_64>,
}

impl Digests {
    /// Both digests.
    pub(crate) fn with_sha256() -> Self {
        Self {
            sha256: Some(Sha256::new()),
            xxh3: new_xxh3(),
        }
    }

    /// XXH3 only: the SHA-256 is left to the digest pass.
    pub(crate) fn xxh3_only() -> Self {
        Self {
            sha256: None,
            xxh3: new_xxh3(),
        }
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        if let Some(sha256) = self.sha256.as_mut() {
            sha256.update(bytes);
        }
        self.xxh3.write(bytes);
    }

    /// The SHA-256 (if computed) and XXH3-64 of everything given to [`Digests::update`].
    pub(crate) fn finish(self) -> (Option<[u8; 32]>, u64) {
        (self.sha256.map(|h| h.finalize().into()), self.xxh3.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values stored chunks carry were computed by an earlier XXH3 implementation: the
    /// one in use must give the same, whether fed whole or in pieces.
    #[test]
    fn xxh3_matches_the_values_recorded_by_earlier_releases() {
        let data: Vec<u8> = (0..(1usize << 20) + 7)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        assert_eq!(xxh3_64(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(xxh3_64(&data), 0x0e28_8da8_f2c2_8366);
        let mut digests = Digests::xxh3_only();
        for piece in data.chunks(100_003) {
            digests.update(piece);
        }
        assert_eq!(digests.finish(), (None, 0x0e28_8da8_f2c2_8366));
    }
}
