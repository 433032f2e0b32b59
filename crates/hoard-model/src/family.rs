//! Key families: what stays the same between runs of one cache, so that statistics can say
//! "`node-cache-Linux-x64-npm-` misses on pull requests" rather than list thousands of keys.
//!
//! A family is the longest restore key the client sent that the key starts with (compared as
//! keys are matched, case-insensitively), taking along the separator that follows it in the key;
//! without one, the key up to the separator before its last hash-like part. Shard directories
//! left in front of that hash (`sccache/f/c/b/fcb…`) are dropped too, so tools whose keys have no
//! stable prefix fall into one family per tool prefix. Pure: no I/O, no state.

/// The longest family kept, in bytes: longer ones are cut at a character boundary. Keys may be
/// 512 characters; a family is a label for people, and the stores index it.
pub const MAX_FAMILY_BYTES: usize = 200;

/// The family of keys that have no stable part at all (a bare hash).
pub const NO_PREFIX: &str = "(no prefix)";

/// The family of `key`, looked up or saved with `restore_keys` (none for a save), whose keys
/// are already folded (`folded_key`, `folded_restore_keys`: lower case, as lookups match them),
/// as a part of `key` (or [`NO_PREFIX`]): nothing is copied on the lookup path.
pub fn family_folded<'k>(
    key: &'k str,
    folded_key: &str,
    folded_restore_keys: &[String],
) -> &'k str {
    let prefix =
        by_restore_key(key, folded_key, folded_restore_keys).unwrap_or_else(|| by_hash(key));
    if prefix.is_empty() {
        return NO_PREFIX;
    }
    clip(prefix)
}

/// The longest of the (folded) restore keys that the (folded) key starts with, as `key` spells
/// it, with the separator after it if the key goes on with one.
fn by_restore_key<'k>(
    key: &'k str,
    folded_key: &str,
    folded_restore_keys: &[String],
) -> Option<&'k str> {
    let longest = folded_restore_keys
        .iter()
        .filter(|r| !r.is_empty() && folded_key.starts_with(r.as_str()))
        .max_by_key(|r| r.len())?;
    // The end of the same prefix in the key's own spelling: folding may change byte lengths.
    let end =
        if key.len() == folded_key.len() && key.is_char_boundary(longest.len()) && key.is_ascii() {
            longest.len()
        } else {
            let mut folded_len = 0;
            key.char_indices()
                .find_map(|(i, c)| {
                    if folded_len == longest.len() {
                        return Some(i);
                    }
                    folded_len += c.to_lowercase().map(char::len_utf8).sum::<usize>();
                    None
                })
                .or((folded_len == longest.len()).then_some(key.len()))?
        };
    let end = match key[end..].chars().next() {
        Some(c) if is_separator(c) && !key[..end].ends_with(is_separator) => end + c.len_utf8(),
        _ => end,
    };
    Some(&key[..end])
}

/// `key` up to the separator before its last hash-like part, less shard directories; the whole
/// key if no part looks like a hash.
fn by_hash(key: &str) -> &str {
    let Some(start) = parts(key)
        .filter(|(_, part)| is_hash_like(part))
        .map(|(start, _)| start)
        .last()
    else {
        return key;
    };
    let mut prefix = &key[..start];
    // Shard directories: `f/c/b/` in front of `fcb…` (sccache), `ab/` (git-style stores).
    while let Some(rest) = prefix.strip_suffix('/') {
        let dir_start = rest.rfind('/').map_or(0, |i| i + 1);
        let dir = &rest[dir_start..];
        if dir.is_empty() || dir.len() > 2 || !dir.bytes().all(|b| b.is_ascii_hexdigit()) {
            break;
        }
        prefix = &rest[..dir_start];
    }
    prefix
}

/// The maximal runs of ASCII letters and digits in `key`, with their byte offsets.
fn parts(key: &str) -> impl Iterator<Item = (usize, &str)> {
    let base = key.as_ptr() as usize;
    key.split(is_separator)
        .filter(|part| !part.is_empty())
        // A piece of `key`: its offset is its distance from the start.
        .map(move |part| (part.as_ptr() as usize - base, part))
}

/// Any character that is not an ASCII letter or digit separates parts.
fn is_separator(c: char) -> bool {
    !c.is_ascii_alphanumeric()
}

/// Eight or more hex digits with a digit among them (a hash, a truncated hash, a date stamp),
/// or eight or more base64url letters and digits that look random: letters and digits mixed,
/// in both cases or changing between letters and digits at least three times. Words with a
/// number (`ubuntu22`, `windows2022`) are not hashes.
fn is_hash_like(part: &str) -> bool {
    if part.len() < 8 {
        return false;
    }
    let bytes = part.as_bytes();
    let has_digit = bytes.iter().any(u8::is_ascii_digit);
    if has_digit && bytes.iter().all(u8::is_ascii_hexdigit) {
        return true;
    }
    let has_upper = bytes.iter().any(u8::is_ascii_uppercase);
    let has_lower = bytes.iter().any(u8::is_ascii_lowercase);
    let changes = bytes
        .windows(2)
        .filter(|w| w[0].is_ascii_digit() != w[1].is_ascii_digit())
        .count();
    has_digit && (has_upper || has_lower) && ((has_upper && has_lower) || changes >= 3)
}

/// `s` cut to at most [`MAX_FAMILY_BYTES`], at a character boundary.
fn clip(s: &str) -> &str {
    if s.len() <= MAX_FAMILY_BYTES {
        return s;
    }
    let mut end = MAX_FAMILY_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The family of `key` with `restore_keys` as given (folded here).
    fn family(key: &str, restore_keys: &[&str]) -> String {
        let folded: Vec<String> = restore_keys.iter().map(|r| r.to_lowercase()).collect();
        family_folded(key, &key.to_lowercase(), &folded).to_owned()
    }

    const SHA: &str = "3f2a9c4be1d07f6a5b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c";

    #[test]
    fn real_key_shapes_fall_into_their_families() {
        let cases: &[(&str, &[&str], &str)] = &[
            // actions/setup-node: node-cache-<platform>-<arch>-<manager>-<lockfile hash>.
            (
                &format!("node-cache-Linux-x64-npm-{SHA}"),
                &[],
                "node-cache-Linux-x64-npm-",
            ),
            (
                &format!("node-cache-Windows-x64-pnpm-{SHA}"),
                &[],
                "node-cache-Windows-x64-pnpm-",
            ),
            // actions/setup-python: versions and OS releases are not hashes.
            (
                &format!("setup-python-Linux-x64-22.04-Ubuntu-python-3.12.7-pip-{SHA}"),
                &[],
                "setup-python-Linux-x64-22.04-Ubuntu-python-3.12.7-pip-",
            ),
            // actions/setup-go: `ubuntu22` is a word with a number, not a hash.
            (
                &format!("setup-go-Linux-x64-ubuntu22-go-1.23.2-{SHA}"),
                &[],
                "setup-go-Linux-x64-ubuntu22-go-1.23.2-",
            ),
            // actions/setup-java.
            (
                &format!("setup-java-Linux-x64-gradle-{SHA}"),
                &[],
                "setup-java-Linux-x64-gradle-",
            ),
            // Swatinem/rust-cache: <prefix>-<job>-<os>-<arch>-<env hash>-<lock hash>, restored
            // with the key less its lock hash; the save (no restore keys) lands in the same family.
            (
                "v0-rust-build-Linux-x64-2d0e3c8b-a1b2c3d4",
                &["v0-rust-build-Linux-x64-2d0e3c8b"],
                "v0-rust-build-Linux-x64-2d0e3c8b-",
            ),
            (
                "v0-rust-build-Linux-x64-2d0e3c8b-a1b2c3d4",
                &[],
                "v0-rust-build-Linux-x64-2d0e3c8b-",
            ),
            // actions/cache with restore keys: the longest one the key starts with wins.
            (
                &format!("Linux-cargo-{SHA}"),
                &["Linux-", "Linux-cargo-", "macOS-cargo-"],
                "Linux-cargo-",
            ),
            // Restore keys compare as keys match: case-insensitively; the key's spelling stays.
            (
                &format!("Linux-Cargo-{SHA}"),
                &["linux-cargo-"],
                "Linux-Cargo-",
            ),
            // A restore key the key does not start with is no family.
            (&format!("deps-{SHA}"), &["other-"], "deps-"),
            // buildx `type=gha`: blobs by digest, one family for all of them.
            (
                &format!("buildkit-blob-1-sha256:{SHA}"),
                &[],
                "buildkit-blob-1-sha256:",
            ),
            // sccache: `sccache/<a>/<b>/<c>/<hash>`, one family for the tool.
            (&format!("sccache/f/c/b/fcb{}", &SHA[3..]), &[], "sccache/"),
            // Dates are hashes too: a nightly key's family is stable.
            ("nightly-cache-20261201", &[], "nightly-cache-"),
            // Base64url hashes.
            ("gradle-home-v1-Xk3pQ9vLm2Zr8T", &[], "gradle-home-v1-"),
            // No hash-like part: the key is its own family.
            ("my-static-cache", &[], "my-static-cache"),
            ("build-windows2022", &[], "build-windows2022"),
            // A bare hash has no stable part.
            (SHA, &[], NO_PREFIX),
        ];
        for (key, restore, expected) in cases {
            assert_eq!(
                family(key, restore),
                *expected,
                "key {key:?} restore {restore:?}"
            );
        }
    }

    #[test]
    fn the_last_hash_like_part_decides() {
        assert_eq!(
            family("cache-1a2b3c4d-linux-5e6f7a8b9c", &[]),
            "cache-1a2b3c4d-linux-"
        );
    }

    #[test]
    fn families_are_bounded_at_a_character_boundary() {
        let long = format!("{}-{SHA}", "é".repeat(300));
        let f = family(&long, &[]);
        assert!(
            f.len() <= MAX_FAMILY_BYTES && f.chars().all(|c| c == 'é'),
            "{f}"
        );
    }

    #[test]
    fn folding_that_changes_lengths_keeps_the_key_spelling() {
        // `İ` folds to two characters; the family still ends where the restore key does.
        let key = format!("İmage-{SHA}");
        assert_eq!(family(&key, &["i̇mage-"]), "İmage-");
    }
}
