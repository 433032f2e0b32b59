//! Upload rules, as pure functions of loaded state: who may reserve a slot (and when an
//! abandoned reservation gives way), what staging a block or committing a block list changes,
//! and when an upload may become an entry. The domain loads state through `MetaStore`, decides
//! here, and has the store apply the decision only if the state is unchanged.
//!
//! Block lists
//! Azure's Put Block List semantics (PROTOCOL.md §3.4): each listed id names a staged
//! (uncommitted) block, a block of the currently committed list, or — for `Latest` — the staged
//! block if there is one and else the committed one. The blocks are concatenated in list order;
//! blocks not listed are discarded. There is no merge step: the parts stay separate chunks.

use std::collections::{HashMap, HashSet};

use crate::meta::{BlockState, SlotState};
use crate::model::{
    BlobName, BlockId, BlockRef, BlockSource, Chunk, EntryId, Millis, Upload, UploadBlocks,
};

/// What a reservation does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reservation<'a> {
    /// Reserve the slot, first aborting an abandoned upload that held it.
    Create { replacing: Option<&'a Upload> },
    /// An entry, or a live reservation, holds the slot.
    Conflict,
    /// The repository has as many live open uploads as it may.
    TooManyOpen,
}

/// Reservations older than `stale_before` are abandoned and give way (GitHub releases them
/// after 24 h, PROTOCOL.md §9); a repository may hold at most `max_open` live ones.
pub fn decide_reservation(
    state: &SlotState,
    stale_before: Millis,
    max_open: u32,
) -> Reservation<'_> {
    if state.entry_exists {
        return Reservation::Conflict;
    }
    if state
        .open
        .as_ref()
        .is_some_and(|u| u.created_at >= stale_before)
    {
        return Reservation::Conflict;
    }
    if state.live_open_uploads >= u64::from(max_open) {
        return Reservation::TooManyOpen;
    }
    Reservation::Create {
        replacing: state.open.as_ref(),
    }
}

/// What staging a block does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Staging {
    /// Record it; the blobs listed are no longer referenced once it is recorded.
    Record { garbage: Vec<BlobName> },
    /// The upload's staged blocks would hold more than an entry may.
    TooLarge,
    /// The upload already has as many uncommitted blocks as Azure allows.
    TooManyBlocks,
}

/// Most uncommitted blocks one blob may have (Azure's limit).
pub const MAX_STAGED_BLOCKS: u64 = 100_000;

/// A retried block id replaces the earlier copy (the last write wins until commit). The staged
/// blocks of an upload, other copies of this id aside, may hold at most `max_staged` bytes, so an
/// upload never uses more disk than an entry may. Decided on the upload's staged totals and the
/// block's own copy ([`BlockState`]): the same work however many blocks are staged.
pub fn decide_stage(blocks: &BlockState, chunk: &Chunk, max_staged: u64) -> Staging {
    if let Some(refused) = over_limits(blocks, chunk.size, max_staged) {
        return refused;
    }
    // The replaced copy may still be a committed part (Azure keeps the committed list).
    let garbage = match &blocks.copy {
        Some(copy) if !blocks.copy_committed => vec![copy.blob.clone()],
        _ => Vec::new(),
    };
    Staging::Record { garbage }
}

/// The limits of [`decide_stage`] for a block of `declared` bytes, decided on the state its link
/// loaded before its body is read, so that a block the upload cannot take costs no disk write.
/// (The change that records the block decides again, on the chunk as stored.)
pub fn refused_before_body(
    blocks: &BlockState,
    declared: Option<u64>,
    max_staged: u64,
) -> Option<Staging> {
    over_limits(blocks, declared.unwrap_or(0), max_staged)
}

fn over_limits(blocks: &BlockState, size: u64, max_staged: u64) -> Option<Staging> {
    let replaced = blocks.copy.as_ref().map_or(0, |c| c.size);
    let others = blocks.staged_bytes.saturating_sub(replaced);
    if others.saturating_add(size) > max_staged {
        return Some(Staging::TooLarge);
    }
    if blocks.copy.is_none() && blocks.staged_count >= MAX_STAGED_BLOCKS {
        return Some(Staging::TooManyBlocks);
    }
    None
}

/// Put Blob: `chunk` becomes the only committed part; everything staged or committed before
/// is garbage.
pub fn whole_blob(blocks: &UploadBlocks, chunk: &Chunk) -> Assembly {
    let garbage = unreferenced(blocks.chunks(), [chunk]);
    Assembly {
        parts: vec![(BlockId::whole_blob(), chunk.clone())],
        garbage,
    }
}

/// What a finalize does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finalizing<'a> {
    /// The upload becomes an entry of these chunks; staged blocks left out are garbage.
    Commit {
        upload: &'a Upload,
        chunks: Vec<Chunk>,
        garbage: Vec<BlobName>,
    },
    /// A retry of a finalize that already succeeded.
    AlreadyDone(EntryId),
    NoUpload,
    /// Nothing was committed through Put Blob or Put Block List yet.
    NothingUploaded,
    /// The committed bytes do not add up to the declared size: the upload is aborted.
    SizeMismatch {
        upload: &'a Upload,
        stored: u64,
        garbage: Vec<BlobName>,
    },
}

/// The slot's open upload is finalized if its committed parts add up to `size`; without one,
/// a finalize that already made an entry of that size is answered again (a retry after a lost
/// response).
pub fn decide_finalize(state: &SlotState, size: u64) -> Finalizing<'_> {
    let (Some(upload), blocks) = (&state.open, &state.blocks) else {
        return match state.finalized {
            Some((entry, stored)) if stored == size => Finalizing::AlreadyDone(entry),
            _ => Finalizing::NoUpload,
        };
    };
    if blocks.parts.is_empty() {
        return Finalizing::NothingUploaded;
    }
    let stored = blocks.committed_size();
    if stored != size {
        return Finalizing::SizeMismatch {
            upload,
            stored,
            garbage: blocks.blobs(),
        };
    }
    let chunks: Vec<Chunk> = blocks.parts.iter().map(|(_, c)| c.clone()).collect();
    let garbage = unreferenced(blocks.staged.values(), &chunks);
    Finalizing::Commit {
        upload,
        chunks,
        garbage,
    }
}

/// The result of applying a block list: the new committed parts, in order, and the blobs that
/// no part refers to any more (to delete once the change is durable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assembly {
    pub parts: Vec<(BlockId, Chunk)>,
    pub garbage: Vec<BlobName>,
}

/// A listed block that is neither staged nor committed: Azure's `InvalidBlockList`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the block list names a block that was not uploaded")]
pub struct UnknownBlock(pub BlockId);

pub fn assemble(
    list: &[BlockRef],
    staged: &HashMap<BlockId, Chunk>,
    committed: &[(BlockId, Chunk)],
) -> Result<Assembly, UnknownBlock> {
    let committed_by_id: HashMap<&BlockId, &Chunk> =
        committed.iter().map(|(id, c)| (id, c)).collect();
    let mut parts = Vec::with_capacity(list.len());
    for item in list {
        let found = match item.source {
            BlockSource::Uncommitted => staged.get(&item.id),
            BlockSource::Committed => committed_by_id.get(&item.id).copied(),
            BlockSource::Latest => staged
                .get(&item.id)
                .or_else(|| committed_by_id.get(&item.id).copied()),
        };
        let chunk = found.ok_or_else(|| UnknownBlock(item.id.clone()))?;
        parts.push((item.id.clone(), chunk.clone()));
    }
    let garbage = unreferenced(
        staged.values().chain(committed.iter().map(|(_, c)| c)),
        parts.iter().map(|(_, c)| c),
    );
    Ok(Assembly { parts, garbage })
}

/// Why the byte ranges of a v1 upload cannot become an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeProblem {
    #[error("no byte range was uploaded")]
    Empty,
    #[error("the uploaded ranges leave a gap at byte {0}")]
    Gap(u64),
    #[error("the uploaded ranges overlap at byte {0}")]
    Overlap(u64),
    #[error("uploaded {stored} bytes but the client declared {declared}")]
    Size { stored: u64, declared: u64 },
    #[error("the upload holds blocks that are not byte ranges")]
    NotRanges,
}

/// A v1 commit: the staged ranges, each a chunk at its offset (a retried range replaced its
/// earlier copy when it was staged), must tile `[0, size)` exactly, with no gap and no overlap.
/// They become the committed parts in offset order; earlier committed parts are garbage.
pub fn tile_ranges(blocks: &UploadBlocks, size: u64) -> Result<Assembly, RangeProblem> {
    let mut ranges = Vec::with_capacity(blocks.staged.len());
    for (id, chunk) in &blocks.staged {
        let start = id.range_start().ok_or(RangeProblem::NotRanges)?;
        ranges.push((start, id, chunk));
    }
    if ranges.is_empty() {
        return Err(RangeProblem::Empty);
    }
    ranges.sort_by_key(|(start, _, _)| *start);
    let mut end = 0u64;
    for (start, _, chunk) in &ranges {
        if *start > end {
            return Err(RangeProblem::Gap(end));
        }
        if *start < end {
            return Err(RangeProblem::Overlap(*start));
        }
        end = start.saturating_add(chunk.size);
    }
    if end != size {
        return Err(RangeProblem::Size {
            stored: end,
            declared: size,
        });
    }
    let parts: Vec<(BlockId, Chunk)> = ranges
        .into_iter()
        .map(|(_, id, chunk)| (id.clone(), chunk.clone()))
        .collect();
    let garbage = unreferenced(
        blocks.parts.iter().map(|(_, c)| c),
        parts.iter().map(|(_, c)| c),
    );
    Ok(Assembly { parts, garbage })
}

/// The blobs of `dropped` that no chunk of `kept` refers to, sorted, each once: what a change
/// leaves unreferenced, to delete once it is applied.
fn unreferenced<'a>(
    dropped: impl IntoIterator<Item = &'a Chunk>,
    kept: impl IntoIterator<Item = &'a Chunk>,
) -> Vec<BlobName> {
    let kept: HashSet<&BlobName> = kept.into_iter().map(|c| &c.blob).collect();
    let mut garbage: Vec<BlobName> = dropped
        .into_iter()
        .map(|c| &c.blob)
        .filter(|b| !kept.contains(b))
        .cloned()
        .collect();
    garbage.sort();
    garbage.dedup();
    garbage
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> BlockId {
        BlockId::parse(s.as_bytes()).unwrap()
    }

    fn chunk(size: u64) -> Chunk {
        Chunk {
            blob: BlobName::random(),
            size,
            sha256: Some([1; 32]),
            xxh3: None,
        }
    }

    fn latest(s: &str) -> BlockRef {
        BlockRef {
            id: id(s),
            source: BlockSource::Latest,
        }
    }

    #[test]
    fn blocks_are_ordered_by_the_list_not_by_arrival() {
        let (a, b, c) = (chunk(1), chunk(2), chunk(3));
        // Staged out of order: the short tail first, as the JS SDK does.
        let staged = HashMap::from([
            (id("c"), c.clone()),
            (id("a"), a.clone()),
            (id("b"), b.clone()),
        ]);
        let out = assemble(&[latest("a"), latest("b"), latest("c")], &staged, &[]).unwrap();
        let sizes: Vec<u64> = out.parts.iter().map(|(_, c)| c.size).collect();
        assert_eq!(sizes, [1, 2, 3]);
        assert!(out.garbage.is_empty());
    }

    #[test]
    fn an_upload_holds_at_most_azures_count_of_uncommitted_blocks() {
        let mut blocks = UploadBlocks::default();
        for i in 0..MAX_STAGED_BLOCKS {
            blocks.staged.insert(id(&format!("b{i}")), chunk(1));
        }
        let state = |block: &str| BlockState::of(&blocks, &id(block));
        let refused = decide_stage(&state("one-more"), &chunk(1), u64::MAX);
        assert!(matches!(refused, Staging::TooManyBlocks));
        // A retried block replaces its copy: still allowed at the limit.
        let retried = decide_stage(&state("b7"), &chunk(1), u64::MAX);
        assert!(matches!(retried, Staging::Record { .. }));
        // The same answers before any body is read.
        assert_eq!(
            refused_before_body(&state("one-more"), None, u64::MAX),
            Some(Staging::TooManyBlocks)
        );
        assert_eq!(refused_before_body(&state("b7"), None, u64::MAX), None);
    }

    #[test]
    fn a_declared_length_past_the_entry_limit_is_refused_before_the_body() {
        let mut blocks = UploadBlocks::default();
        blocks.staged.insert(id("a"), chunk(6));
        let refused = |block: &str, declared| {
            refused_before_body(&BlockState::of(&blocks, &id(block)), declared, 10)
        };
        assert_eq!(refused("b", Some(5)), Some(Staging::TooLarge));
        assert_eq!(refused("b", Some(4)), None);
        // A retried block replaces its own copy, and an unknown length is decided once stored.
        assert_eq!(refused("a", Some(10)), None);
        assert_eq!(refused("b", None), None);
    }

    #[test]
    fn a_replaced_copy_is_garbage_unless_a_committed_part_shares_its_blob() {
        let old = chunk(3);
        let mut blocks = UploadBlocks::default();
        blocks.staged.insert(id("a"), old.clone());
        let replaced = decide_stage(&BlockState::of(&blocks, &id("a")), &chunk(3), 10);
        assert_eq!(
            replaced,
            Staging::Record {
                garbage: vec![old.blob.clone()]
            }
        );
        blocks.parts.push((id("a"), old));
        let kept = decide_stage(&BlockState::of(&blocks, &id("a")), &chunk(3), 10);
        assert_eq!(kept, Staging::Record { garbage: vec![] });
    }

    #[test]
    fn unlisted_blocks_become_garbage() {
        let (a, stray) = (chunk(1), chunk(9));
        let staged = HashMap::from([(id("a"), a), (id("stray"), stray.clone())]);
        let out = assemble(&[latest("a")], &staged, &[]).unwrap();
        assert_eq!(out.parts.len(), 1);
        assert_eq!(out.garbage, [stray.blob]);
    }

    #[test]
    fn an_unknown_id_is_refused() {
        let staged = HashMap::from([(id("a"), chunk(1))]);
        let err = assemble(&[latest("a"), latest("nope")], &staged, &[]).unwrap_err();
        assert_eq!(err, UnknownBlock(id("nope")));
    }

    #[test]
    fn sources_pick_staged_or_committed_blocks() {
        let old = chunk(1);
        let new = chunk(2);
        let staged = HashMap::from([(id("a"), new.clone())]);
        let committed = vec![(id("a"), old.clone())];

        let out = assemble(&[latest("a")], &staged, &committed).unwrap();
        assert_eq!(out.parts[0].1, new);
        assert_eq!(out.garbage, std::slice::from_ref(&old.blob));

        let out = assemble(
            &[BlockRef {
                id: id("a"),
                source: BlockSource::Committed,
            }],
            &staged,
            &committed,
        )
        .unwrap();
        assert_eq!(out.parts[0].1, old);

        let only_committed = assemble(
            &[BlockRef {
                id: id("a"),
                source: BlockSource::Uncommitted,
            }],
            &HashMap::new(),
            &committed,
        );
        assert!(only_committed.is_err());
    }

    fn ranges(spans: &[(u64, u64)]) -> UploadBlocks {
        let mut blocks = UploadBlocks::default();
        for (start, len) in spans {
            blocks.staged.insert(BlockId::range(*start), chunk(*len));
        }
        blocks
    }

    #[test]
    fn ranges_uploaded_out_of_order_tile_in_offset_order() {
        let blocks = ranges(&[(30, 5), (0, 10), (20, 10), (10, 10)]);
        let tiled = tile_ranges(&blocks, 35).unwrap();
        let starts: Vec<u64> = tiled
            .parts
            .iter()
            .map(|(id, _)| id.range_start().unwrap())
            .collect();
        assert_eq!(starts, [0, 10, 20, 30]);
        assert!(tiled.garbage.is_empty());
    }

    #[test]
    fn gaps_overlaps_and_wrong_sizes_are_refused() {
        assert_eq!(
            tile_ranges(&ranges(&[(0, 10), (11, 5)]), 16),
            Err(RangeProblem::Gap(10))
        );
        assert_eq!(
            tile_ranges(&ranges(&[(5, 5)]), 10),
            Err(RangeProblem::Gap(0))
        );
        assert_eq!(
            tile_ranges(&ranges(&[(0, 10), (8, 5)]), 13),
            Err(RangeProblem::Overlap(8))
        );
        assert_eq!(
            tile_ranges(&ranges(&[(0, 10), (10, 5)]), 16),
            Err(RangeProblem::Size {
                stored: 15,
                declared: 16
            })
        );
        assert_eq!(tile_ranges(&ranges(&[]), 0), Err(RangeProblem::Empty));
        let mut mixed = ranges(&[(0, 3)]);
        mixed.staged.insert(id("azure-block"), chunk(3));
        assert_eq!(tile_ranges(&mixed, 6), Err(RangeProblem::NotRanges));
    }

    #[test]
    fn a_block_may_be_listed_twice() {
        let a = chunk(5);
        let staged = HashMap::from([(id("a"), a.clone())]);
        let out = assemble(&[latest("a"), latest("a")], &staged, &[]).unwrap();
        assert_eq!(out.parts.len(), 2);
        assert!(out.garbage.is_empty());
    }
}
