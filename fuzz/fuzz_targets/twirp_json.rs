//! Twirp JSON request bodies: decoding never panics, whatever the bytes.
#![no_main]

use hoard::api::proto::{CreateCacheEntryRequest, FinalizeCacheEntryUploadRequest, GetCacheEntryDownloadUrlRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<CreateCacheEntryRequest>(data);
    let _ = serde_json::from_slice::<FinalizeCacheEntryUploadRequest>(data);
    if let Ok(req) = serde_json::from_slice::<GetCacheEntryDownloadUrlRequest>(data) {
        // What the handler does next with a decoded lookup.
        let _ = hoard::model::Lookup::parse(&req.key, &req.restore_keys, &req.version);
    }
});
