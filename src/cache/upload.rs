//! Upload rules: how a block list turns staged blocks into the ordered chunks of an entry.
//!
//! Azure's Put Block List semantics (PROTOCOL.md §3.4): each listed id names a staged
//! (uncommitted) block, a block of the currently committed list, or — for `Latest` — the staged
//! block if there is one and else the committed one. The blocks are concatenated in list order;
//! blocks not listed are discarded. There is no merge step: the parts stay separate chunks.

use std::collections::{HashMap, HashSet};

use super::model::{BlobName, BlockId, Chunk};

/// Where a block-list element looks for its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockSource {
    Latest,
    Committed,
    Uncommitted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRef {
    pub id: BlockId,
    pub source: BlockSource,
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
    let kept: HashSet<&BlobName> = parts.iter().map(|(_, c)| &c.blob).collect();
    let mut garbage: Vec<BlobName> = staged
        .values()
        .chain(committed.iter().map(|(_, c)| c))
        .map(|c| &c.blob)
        .filter(|b| !kept.contains(b))
        .cloned()
        .collect();
    garbage.sort();
    garbage.dedup();
    Ok(Assembly { parts, garbage })
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
            sha256: [0; 32],
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

    #[test]
    fn a_block_may_be_listed_twice() {
        let a = chunk(5);
        let staged = HashMap::from([(id("a"), a.clone())]);
        let out = assemble(&[latest("a"), latest("a")], &staged, &[]).unwrap();
        assert_eq!(out.parts.len(), 2);
        assert!(out.garbage.is_empty());
    }
}
