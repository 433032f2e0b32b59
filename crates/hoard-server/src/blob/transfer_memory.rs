//! The memory that large transfers on local disk hold at once: one budget in bytes for every
//! block being read and every block of received bytes waiting to be written, whatever the
//! number of transfers (`--transfer-memory`).
//!
//! A count of blocks per transfer bounded nothing once 64 jobs ran at once, and the allocator
//! kept what those blocks had used: the budget bounds the bytes, and a block's buffer is kept
//! for the next block instead of going back to the allocator (a fresh megabyte costs 256
//! page faults, and glibc's per-thread arenas kept freed blocks as resident memory). Kept buffers
//! stay inside the budget: they hold their share of it, and give it back when a transfer needs
//! it and none is free.
//!
//! A transfer asks for a wide block (1 MiB) when the budget has room at once and otherwise waits
//! for a narrow one (256 KiB), so that many transfers share the budget in smaller steps rather
//! than queue. A transfer never waits for the budget while it holds a part of it that only its
//! own progress would give back (see the put and get of [`super::fs`]), so the budget cannot
//! deadlock. A client that stops reading holds the blocks it was sent last for as long as its
//! connection lasts; so that a few of them cannot stall everyone, a transfer that has waited
//! [`OVERDRAFT_AFTER`] for room takes its block outside the budget (counted as an overdraft).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget's unit: sizes are rounded up to whole pages.
const UNIT: usize = 4 << 10;
/// The least budget accepted: one wide block being read and one being sent.
pub const MIN_BUDGET: u64 = 2 << 20;
/// How long a transfer waits for room in the budget before it takes a block outside it: the
/// budget bounds what a busy server holds, and a few clients that stop reading (each holds
/// what it was sent last) cannot stall the others for longer than this.
pub const OVERDRAFT_AFTER: std::time::Duration = std::time::Duration::from_secs(2);
/// What a block read or a batch written moves at most, when the budget has room.
pub const WIDE_BLOCK: usize = 1 << 20;
/// What it moves when the budget has no room for a wide one.
pub const NARROW_BLOCK: usize = 256 << 10;

/// A share of the budget, given back when dropped.
struct Reservation {
    /// `None` for an overdraft. Held only to be given back on drop.
    _permit: Option<OwnedSemaphorePermit>,
    bytes: usize,
    counters: Arc<Counters>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.counters.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// A buffer of the budget, with its share of it: given back when dropped, or kept for the next
/// block by [`TransferMemory::keep`].
pub struct Block {
    buf: Vec<u8>,
    /// Held only to be given back with the block.
    _reservation: Reservation,
}

impl Block {
    /// The bytes in it.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// How many bytes it holds at most.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    pub fn is_full(&self) -> bool {
        self.buf.len() == self.buf.capacity()
    }

    /// Drops the bytes past `len`.
    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    /// Copies as much of `frame` as there is room for, and advances it past what was copied.
    pub fn fill(&mut self, frame: &mut Bytes) {
        let n = frame.len().min(self.buf.capacity() - self.buf.len());
        self.buf.extend_from_slice(&frame[..n]);
        frame.advance(n);
    }

    /// Appends all that `reader` gives (which must give no more than there is room for), without
    /// zeroing the room first.
    pub fn read_to_end(&mut self, reader: &mut impl std::io::Read) -> std::io::Result<usize> {
        reader.read_to_end(&mut self.buf)
    }
}

/// What the budget holds, counted apart from the semaphore that enforces it, so that a test can
/// tell what was really held.
#[derive(Default)]
struct Counters {
    held: AtomicUsize,
    peak: AtomicUsize,
    overdrafts: std::sync::atomic::AtomicU64,
}

/// The budget, and the blocks kept for reuse (each with its share of the budget).
pub struct TransferMemory {
    budget: usize,
    overdraft_after: std::time::Duration,
    permits: Arc<Semaphore>,
    kept: Mutex<Vec<Block>>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for TransferMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferMemory")
            .field("budget", &self.budget)
            .field("held", &self.held())
            .finish()
    }
}

fn units(bytes: usize) -> u32 {
    bytes.div_ceil(UNIT).try_into().unwrap_or(u32::MAX)
}

impl TransferMemory {
    /// A budget of `bytes` (at least [`MIN_BUDGET`]).
    pub fn new(bytes: u64) -> Arc<Self> {
        Self::overdrawn_after(bytes, OVERDRAFT_AFTER)
    }

    /// A budget of `bytes` whose transfers wait `wait` for room before an overdraft.
    pub fn overdrawn_after(bytes: u64, wait: std::time::Duration) -> Arc<Self> {
        let budget = usize::try_from(bytes.max(MIN_BUDGET)).unwrap_or(usize::MAX);
        let budget = (budget / UNIT).min(u32::MAX as usize) * UNIT;
        Arc::new(Self {
            budget,
            overdraft_after: wait,
            permits: Arc::new(Semaphore::new(budget / UNIT)),
            kept: Mutex::new(Vec::new()),
            counters: Arc::default(),
        })
    }

    /// The kept buffers. Nothing panics while holding them, so a poisoned lock is still sound.
    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<Block>> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes held now: blocks and batches in flight, and kept buffers.
    pub fn held(&self) -> usize {
        self.counters.held.load(Ordering::Relaxed)
    }

    /// The most bytes held at once since the start.
    pub fn peak(&self) -> usize {
        self.counters.peak.load(Ordering::Relaxed)
    }

    fn granted(&self, permit: OwnedSemaphorePermit, bytes: usize) -> Reservation {
        let held = self.counters.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.counters.peak.fetch_max(held, Ordering::Relaxed);
        Reservation {
            _permit: Some(permit),
            bytes,
            counters: self.counters.clone(),
        }
    }

    /// `bytes` of the budget if they are free now, giving back kept buffers to make room.
    fn try_reserve(&self, bytes: usize) -> Option<Reservation> {
        let bytes = bytes.min(self.budget);
        loop {
            if let Ok(permit) = self.permits.clone().try_acquire_many_owned(units(bytes)) {
                return Some(self.granted(permit, bytes));
            }
            // A kept buffer is given back only when that makes room.
            self.kept().pop()?;
        }
    }

    /// `bytes` of the budget (at most the whole budget), waiting until they are free, or for
    /// [`OVERDRAFT_AFTER`] (by default) at most: then they are granted outside the budget (and
    /// counted apart), so that clients that stop reading cannot stall every other transfer.
    async fn reserve(&self, bytes: usize) -> Reservation {
        let bytes = bytes.min(self.budget);
        if let Some(reservation) = self.try_reserve(bytes) {
            return reservation;
        }
        let acquire = self.permits.clone().acquire_many_owned(units(bytes));
        match tokio::time::timeout(self.overdraft_after, acquire).await {
            Ok(permit) => self.granted(
                permit.expect("the budget's semaphore is never closed"),
                bytes,
            ),
            Err(_) => {
                self.counters.overdrafts.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    bytes,
                    "transfer memory budget full: a block granted outside it"
                );
                Reservation {
                    _permit: None,
                    bytes: 0,
                    counters: self.counters.clone(),
                }
            }
        }
    }

    /// Blocks granted outside the budget since the start (see [`Self::reserve`]).
    pub fn overdrafts(&self) -> u64 {
        self.counters.overdrafts.load(Ordering::Relaxed)
    }

    /// A buffer of `capacity` bytes and its share of the budget: a kept one if there is one of
    /// that size, else a new one; `None` when the budget has no room now.
    fn try_buffer(&self, capacity: usize) -> Option<Block> {
        {
            let mut kept = self.kept();
            if let Some(at) = kept.iter().rposition(|b| b.capacity() == capacity) {
                return Some(kept.swap_remove(at));
            }
        }
        let reservation = self.try_reserve(capacity)?;
        Some(Block {
            buf: Vec::with_capacity(capacity),
            _reservation: reservation,
        })
    }

    /// A buffer for the next block of a transfer (a read, or received bytes to be written) of
    /// which `left` bytes remain, if the budget has room now: wide if it has room for one, else
    /// narrow. Buffers of exactly these two sizes are kept for reuse; a chunk's last, shorter
    /// block still goes into a whole one.
    pub fn try_block(&self, left: u64) -> Option<Block> {
        if left > NARROW_BLOCK as u64 {
            if let Some(found) = self.try_buffer(WIDE_BLOCK) {
                return Some(found);
            }
        }
        self.try_buffer(NARROW_BLOCK)
    }

    /// As [`Self::try_block`], waiting for a narrow one when the budget has no room.
    pub async fn block(&self, left: u64) -> Block {
        if let Some(found) = self.try_block(left) {
            return found;
        }
        // Reserved first: a transfer waiting for room must not hold the buffer meanwhile.
        let reservation = self.reserve(NARROW_BLOCK).await;
        Block {
            buf: Vec::with_capacity(NARROW_BLOCK),
            _reservation: reservation,
        }
    }

    /// `block`, filled, as [`Bytes`] that hand it back to be kept once the last of them is
    /// dropped.
    pub fn filled(self: &Arc<Self>, block: Block) -> Bytes {
        Bytes::from_owner(KeptOnDrop {
            block: Some(block),
            memory: self.clone(),
        })
    }

    /// Keeps `block` for the next one, while the kept blocks are at most a quarter of the
    /// budget; frees it otherwise.
    pub fn keep(&self, mut block: Block) {
        if block.capacity() != WIDE_BLOCK && block.capacity() != NARROW_BLOCK {
            return;
        }
        block.buf.clear();
        let mut kept = self.kept();
        let kept_bytes: usize = kept.iter().map(Block::capacity).sum();
        if kept_bytes + block.capacity() <= self.budget / 4 {
            kept.push(block);
        }
    }
}

/// The owner behind a filled block's [`Bytes`].
struct KeptOnDrop {
    block: Option<Block>,
    memory: Arc<TransferMemory>,
}

impl AsRef<[u8]> for KeptOnDrop {
    fn as_ref(&self) -> &[u8] {
        self.block.as_ref().map_or(&[], Block::bytes)
    }
}

impl Drop for KeptOnDrop {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.memory.keep(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_full_budget_makes_transfers_wait_then_overdraw_rather_than_stall() {
        let memory = TransferMemory::overdrawn_after(MIN_BUDGET, Duration::from_millis(50));
        let all = memory.try_reserve(MIN_BUDGET as usize).unwrap();
        assert!(memory.try_reserve(UNIT).is_none(), "the budget is full");

        // Room that comes back in time is granted inside the budget.
        let waiting = memory.reserve(UNIT);
        let (reservation, ()) = tokio::join!(waiting, async { drop(all) });
        assert_eq!((memory.held(), memory.overdrafts()), (UNIT, 0));

        // Room that does not come back: granted outside, and counted apart.
        let rest = memory.try_reserve(MIN_BUDGET as usize - UNIT).unwrap();
        let overdrawn = memory.reserve(NARROW_BLOCK).await;
        assert_eq!(memory.overdrafts(), 1);
        assert_eq!(
            memory.held(),
            MIN_BUDGET as usize,
            "an overdraft is not held"
        );
        assert_eq!(memory.peak(), MIN_BUDGET as usize);
        drop((reservation, rest, overdrawn));
        assert_eq!(memory.held(), 0);
    }

    #[tokio::test]
    async fn read_buffers_are_kept_within_the_budget_and_reused() {
        let memory = TransferMemory::new(8 << 20);
        let block = memory.block(10 << 20).await;
        assert_eq!(block.capacity(), WIDE_BLOCK);
        let pointer = block.bytes().as_ptr();
        let bytes = memory.filled(block);
        drop(bytes);
        assert_eq!(
            memory.held(),
            WIDE_BLOCK,
            "kept with its share of the budget"
        );
        let again = memory.block(10 << 20).await;
        assert_eq!(again.bytes().as_ptr(), pointer, "the kept buffer is reused");
        // A reservation that needs the kept buffers' room gets it.
        drop(again);
        let whole = memory.try_reserve(8 << 20);
        assert!(whole.is_some(), "kept buffers give their room back");
    }
}
