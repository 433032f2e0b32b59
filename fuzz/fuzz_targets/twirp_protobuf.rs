//! Binary protobuf request bodies (sccache): decoding never panics.
#![no_main]

use hoard::api::proto::{CreateCacheEntryRequest, FinalizeCacheEntryUploadRequest, GetCacheEntryDownloadUrlRequest};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let _ = CreateCacheEntryRequest::decode(data);
    let _ = FinalizeCacheEntryUploadRequest::decode(data);
    let _ = GetCacheEntryDownloadUrlRequest::decode(data);
});
