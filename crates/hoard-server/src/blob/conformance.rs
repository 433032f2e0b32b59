//! The [`BlobStore`] contract as executable checks, run against every implementation: each
//! backend's test opens a fresh store and calls [`run_all`]. A check panics with a sentence
//! naming the broken promise.
#![allow(clippy::unwrap_used, clippy::panic)] // Test code: failing loudly is the point.

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};

use super::{BlobError, BlobStore, ByteStream};
use crate::model::BlobName;

/// Runs every check on `store`, which must be empty.
pub async fn run_all(store: &dyn BlobStore) {
    store.ping().await.unwrap();
    put_then_read_whole_and_ranges(store).await;
    large_chunks_round_trip_while_others_are_stored(store).await;
    a_body_of_the_wrong_length_stores_nothing(store).await;
    a_failing_body_stores_nothing(store).await;
    empty_chunks_are_chunks(store).await;
    missing_chunks_are_not_found_and_deletes_are_idempotent(store).await;
    a_reader_keeps_its_bytes_when_the_chunk_is_deleted(store).await;
    listing_names_exactly_the_stored_chunks(store).await;
    store.sync(true).await.unwrap();
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// `data` as a body arriving in frames of `frame` bytes.
fn body(data: &[u8], frame: usize) -> ByteStream {
    let frames: Vec<Result<Bytes, std::io::Error>> = data
        .chunks(frame.max(1))
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    Box::pin(futures_util::stream::iter(frames))
}

/// Reads as a server's consumer does: each block is let go once copied out (a store may bound
/// the blocks it has handed out and not yet had back).
async fn read(store: &dyn BlobStore, name: &BlobName, offset: u64, len: u64) -> Vec<u8> {
    let mut stream = store.get(name, offset, len).await.unwrap();
    let mut read = Vec::new();
    while let Some(block) = stream.try_next().await.unwrap() {
        read.extend_from_slice(&block);
    }
    read
}

async fn names(store: &dyn BlobStore) -> Vec<BlobName> {
    let listed: Vec<super::Listed> = store.list().await.unwrap().try_collect().await.unwrap();
    let now = crate::model::now_millis();
    for item in &listed {
        // Modification times are the store's clock: recent, never in the future by much.
        assert!(
            item.modified > now - 86_400_000 && item.modified < now + 60_000,
            "{item:?} has an implausible modification time"
        );
    }
    let mut all: Vec<BlobName> = listed.into_iter().map(|l| l.name).collect();
    all.sort();
    all
}

async fn put_then_read_whole_and_ranges(store: &dyn BlobStore) {
    // Larger than any I/O block, in uneven frames.
    let data = bytes(3 << 20 | 12_345, 1);
    let name = BlobName::random();
    let chunk = store
        .put(&name, body(&data, 65_537), Some(data.len() as u64))
        .await
        .unwrap();
    assert_eq!(chunk.blob, name);
    assert_eq!(chunk.size, data.len() as u64, "put counts what it stored");
    assert_eq!(chunk.xxh3, Some(super::xxh3_64(&data)), "and hashes it");
    if let Some(sha256) = chunk.sha256 {
        assert_eq!(
            sha256,
            <[u8; 32]>::from(Sha256::digest(&data)),
            "and its SHA-256, where the store computes it while writing, is right"
        );
    }
    assert_eq!(read(store, &name, 0, data.len() as u64).await, data);
    for (offset, len) in [
        (0, 1),
        (1, 10),
        (262_143, 2),
        (1 << 20, 5 << 18),
        (data.len() - 1, 1),
    ] {
        assert_eq!(
            read(store, &name, offset as u64, len as u64).await,
            &data[offset..offset + len],
            "range {offset}+{len}"
        );
    }
    // Without a declared length, the body is taken as it comes.
    let small = BlobName::random();
    let chunk = store.put(&small, body(b"abc", 1), None).await.unwrap();
    assert_eq!(chunk.size, 3);
    assert_eq!(read(store, &small, 0, 3).await, b"abc");
}

/// Chunks larger than any buffer a store keeps (object stores send them in parts), several at
/// once (more than an object store's part budget holds), each read back whole and in ranges.
async fn large_chunks_round_trip_while_others_are_stored(store: &dyn BlobStore) {
    let data: Vec<Vec<u8>> = (0..8u8)
        .map(|i| bytes((20 << 20) + 4099 * i as usize, 10 + i))
        .collect();
    let names: Vec<BlobName> = data.iter().map(|_| BlobName::random()).collect();
    // Half with a declared length, half without (v1's chunked uploads): stores may treat the
    // two differently.
    let puts = data.iter().zip(&names).enumerate().map(|(i, (d, name))| {
        let declared = (i % 2 == 0).then_some(d.len() as u64);
        store.put(name, body(d, 200_003), declared)
    });
    let chunks = futures_util::future::try_join_all(puts).await.unwrap();
    for ((chunk, d), name) in chunks.iter().zip(&data).zip(&names) {
        assert_eq!(chunk.size, d.len() as u64);
        assert_eq!(chunk.xxh3, Some(super::xxh3_64(d)));
        if let Some(sha256) = chunk.sha256 {
            assert_eq!(sha256, <[u8; 32]>::from(Sha256::digest(d)));
        }
        assert_eq!(
            read(store, name, 0, d.len() as u64).await,
            *d,
            "a large chunk reads back whole"
        );
        let (offset, len) = ((8 << 20) - 3, (8 << 20) + 7);
        assert_eq!(
            read(store, name, offset, len).await,
            &d[offset as usize..(offset + len) as usize]
        );
        store.delete(name).await.unwrap();
    }
}

async fn a_body_of_the_wrong_length_stores_nothing(store: &dyn BlobStore) {
    for (declared, actual) in [
        (10, 9),
        (10, 11),
        (5 << 20, (5 << 20) - 1),
        (18 << 20, 17 << 20),
        (17 << 20, 18 << 20),
    ] {
        let name = BlobName::random();
        let result = store
            .put(&name, body(&bytes(actual, 2), 4096), Some(declared))
            .await;
        assert!(
            matches!(
                result,
                Err(BlobError::LengthMismatch { .. }) | Err(BlobError::Body(_))
            ),
            "{declared} declared, {actual} sent: {result:?}"
        );
        assert!(
            matches!(store.get(&name, 0, 1).await, Err(BlobError::NotFound(_))),
            "a refused put leaves no chunk"
        );
    }
}

/// A body of `mib` 1 MiB frames, then a failure: a client hanging up.
fn failing_body(mib: u8) -> ByteStream {
    let frames: Vec<Result<Bytes, std::io::Error>> = (0..mib)
        .map(|i| Ok(Bytes::from(bytes(1 << 20, i))))
        .chain([Err(std::io::Error::other("client hung up"))])
        .collect();
    Box::pin(futures_util::stream::iter(frames))
}

async fn a_failing_body_stores_nothing(store: &dyn BlobStore) {
    // Early, with a declared length, and after more than one part was sent without one.
    for (mib, declared) in [(1, None), (12, Some(20 << 20)), (20, None)] {
        let name = BlobName::random();
        let result = store.put(&name, failing_body(mib), declared).await;
        assert!(matches!(result, Err(BlobError::Body(_))), "{result:?}");
        assert!(
            !names(store).await.contains(&name),
            "nothing of a failed put is listed"
        );
        assert!(matches!(
            store.get(&name, 0, 1).await,
            Err(BlobError::NotFound(_))
        ));
    }
}

async fn empty_chunks_are_chunks(store: &dyn BlobStore) {
    let name = BlobName::random();
    let chunk = store.put(&name, body(&[], 1), Some(0)).await.unwrap();
    assert_eq!(chunk.size, 0);
    assert!(read(store, &name, 0, 0).await.is_empty());
}

async fn missing_chunks_are_not_found_and_deletes_are_idempotent(store: &dyn BlobStore) {
    let name = BlobName::random();
    assert!(matches!(
        store.get(&name, 0, 1).await,
        Err(BlobError::NotFound(_))
    ));
    store.delete(&name).await.unwrap();
    store.put(&name, body(b"x", 1), Some(1)).await.unwrap();
    store.delete(&name).await.unwrap();
    store.delete(&name).await.unwrap();
    assert!(matches!(
        store.get(&name, 0, 1).await,
        Err(BlobError::NotFound(_))
    ));
}

async fn a_reader_keeps_its_bytes_when_the_chunk_is_deleted(store: &dyn BlobStore) {
    let data = bytes(2 << 20, 4);
    let name = BlobName::random();
    store
        .put(&name, body(&data, 1 << 20), Some(data.len() as u64))
        .await
        .unwrap();
    let mut stream = store.get(&name, 0, data.len() as u64).await.unwrap();
    let mut got = stream.next().await.unwrap().unwrap().to_vec();
    store.delete(&name).await.unwrap();
    while let Some(frame) = stream.next().await {
        got.extend_from_slice(&frame.unwrap());
    }
    assert_eq!(got, data, "an opened chunk reads to the end after a delete");
}

async fn listing_names_exactly_the_stored_chunks(store: &dyn BlobStore) {
    let before = names(store).await;
    let added: Vec<BlobName> = (0..300).map(|_| BlobName::random()).collect();
    for name in &added {
        store.put(name, body(b"z", 1), Some(1)).await.unwrap();
    }
    let listed = names(store).await;
    assert_eq!(listed.len(), before.len() + added.len());
    assert!(added.iter().all(|n| listed.binary_search(n).is_ok()));
    for name in &added {
        store.delete(name).await.unwrap();
    }
    assert_eq!(names(store).await, before, "deleted chunks are not listed");
}
