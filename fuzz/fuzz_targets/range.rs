//! Range / x-ms-range headers: any header and size give a range inside the entry, or none.
#![no_main]

use hoard::api::range::{resolve, RangeRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, u64)| {
    let (header, size) = input;
    if let RangeRequest::Partial { start, len } = resolve(Some(header), size) {
        assert!(len > 0);
        assert!(start.checked_add(len).is_some_and(|end| end <= size));
    }
});
