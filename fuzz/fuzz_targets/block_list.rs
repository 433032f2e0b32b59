//! Put Block List XML: parsing never panics, and never yields an empty or oversized list entry.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(list) = hoard::api::blocklist::parse(data) {
        assert!(list.len() <= hoard::api::blocklist::MAX_BLOCKS);
        assert!(list.iter().all(|b| !b.id.as_bytes().is_empty()));
    }
});
