//! The memory that large transfers on local disk hold at once: one budget in bytes for every
//! block being read and every batch of received frames waiting to be written, whatever the
//! number of transfers (`--transfer-memory`).
//!
//! A count of blocks per transfer bounded nothing once 64 jobs ran at once, and the allocator
//! kept what those blocks had used: the budget bounds the bytes, and a read block's buffer is
//! kept for the next read instead of going back to the allocator (a fresh megabyte costs 256
//! page faults, and glibc's per-thread arenas kept freed blocks as resident memory). Kept buffers
//! stay inside the budget: they hold their share of it, and give it back when a transfer needs
//! it and none is free.
//!
//! A transfer asks for a wide block (1 MiB) when the budget has room at once and otherwise waits
//! for a narrow one (256 KiB), so that many transfers share the budget in smaller steps rather
//! than queue. A transfer never waits for the budget while it holds a part of it that only its
//! own progress would give back (see the put and get of [`super::fs`]), so the budget cannot
//! deadlock; a client that stops reading or sending holds its blocks until its idle timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget's unit: sizes are rounded up to whole pages.
const UNIT: usize = 4 << 10;
/// The least budget accepted: one wide block being read and one being sent.
pub const MIN_BUDGET: u64 = 2 << 20;
/// What a block read or a batch written moves at most, when the budget has room.
pub const WIDE_BLOCK: usize = 1 << 20;
/// What it moves when the budget has no room for a wide one.
pub const NARROW_BLOCK: usize = 256 << 10;

/// A share of the budget, given back when dropped.
pub struct Reservation {
    /// `None` only once merged into another.
    permit: Option<OwnedSemaphorePermit>,
    bytes: usize,
    counters: Arc<Counters>,
}

impl Reservation {
    /// Adds `other` to this one.
    pub fn merge(&mut self, mut other: Reservation) {
        if let (Some(mine), Some(theirs)) = (self.permit.as_mut(), other.permit.take()) {
            mine.merge(theirs);
        }
        self.bytes += std::mem::take(&mut other.bytes);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.counters.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// What the budget holds, counted apart from the semaphore that enforces it, so that a test can
/// tell what was really held.
#[derive(Default)]
struct Counters {
    held: AtomicUsize,
    peak: AtomicUsize,
}

/// The budget, and the read buffers kept for reuse (each with its share of the budget).
pub struct TransferMemory {
    budget: usize,
    permits: Arc<Semaphore>,
    kept: Mutex<Vec<(Vec<u8>, Reservation)>>,
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
        let budget = usize::try_from(bytes.max(MIN_BUDGET)).unwrap_or(usize::MAX);
        let budget = (budget / UNIT).min(u32::MAX as usize) * UNIT;
        Arc::new(Self {
            budget,
            permits: Arc::new(Semaphore::new(budget / UNIT)),
            kept: Mutex::new(Vec::new()),
            counters: Arc::default(),
        })
    }

    /// The kept buffers. Nothing panics while holding them, so a poisoned lock is still sound.
    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<(Vec<u8>, Reservation)>> {
        self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
            permit: Some(permit),
            bytes,
            counters: self.counters.clone(),
        }
    }

    /// `bytes` of the budget if they are free now, giving back kept buffers to make room.
    pub fn try_reserve(&self, bytes: usize) -> Option<Reservation> {
        let bytes = bytes.min(self.budget);
        loop {
            if let Ok(permit) = self.permits.clone().try_acquire_many_owned(units(bytes)) {
                return Some(self.granted(permit, bytes));
            }
            // A kept buffer is given back only when that makes room.
            self.kept().pop()?;
        }
    }

    /// `bytes` of the budget (at most the whole budget), waiting until they are free.
    pub async fn reserve(&self, bytes: usize) -> Reservation {
        let bytes = bytes.min(self.budget);
        if let Some(reservation) = self.try_reserve(bytes) {
            return reservation;
        }
        let permit = self
            .permits
            .clone()
            .acquire_many_owned(units(bytes))
            .await
            .expect("the budget's semaphore is never closed");
        self.granted(permit, bytes)
    }

    /// A buffer of `capacity` bytes and its share of the budget: a kept one if there is one of
    /// that size, else a new one; `None` when the budget has no room now.
    fn try_buffer(&self, capacity: usize) -> Option<(Vec<u8>, Reservation)> {
        {
            let mut kept = self.kept();
            if let Some(at) = kept.iter().rposition(|(b, _)| b.capacity() == capacity) {
                return Some(kept.swap_remove(at));
            }
        }
        let reservation = self.try_reserve(capacity)?;
        Some((Vec::with_capacity(capacity), reservation))
    }

    /// A buffer for the next block of a read of which `left` bytes remain, if the budget has
    /// room now: wide if it has room for one, else narrow. Buffers of exactly these two sizes
    /// are kept for reuse; a chunk's last, shorter block still reads into a whole one.
    pub fn try_read_buffer(&self, left: u64) -> Option<(Vec<u8>, Reservation)> {
        if left > NARROW_BLOCK as u64 {
            if let Some(found) = self.try_buffer(WIDE_BLOCK) {
                return Some(found);
            }
        }
        self.try_buffer(NARROW_BLOCK)
    }

    /// As [`Self::try_read_buffer`], waiting for a narrow one when the budget has no room.
    pub async fn read_buffer(&self, left: u64) -> (Vec<u8>, Reservation) {
        if let Some(found) = self.try_read_buffer(left) {
            return found;
        }
        let reservation = self.reserve(NARROW_BLOCK).await;
        (Vec::with_capacity(NARROW_BLOCK), reservation)
    }

    /// `buf`, filled, as [`Bytes`] that hand the buffer back to be kept once the last of them is
    /// dropped.
    pub fn filled(self: &Arc<Self>, buf: Vec<u8>, reservation: Reservation) -> Bytes {
        Bytes::from_owner(KeptOnDrop {
            buf: Some((buf, reservation)),
            memory: self.clone(),
        })
    }

    /// Keeps `buf` for the next read, while the kept buffers are at most a quarter of the
    /// budget; frees it otherwise.
    fn keep(&self, mut buf: Vec<u8>, reservation: Reservation) {
        if buf.capacity() != WIDE_BLOCK && buf.capacity() != NARROW_BLOCK {
            return;
        }
        buf.clear();
        let mut kept = self.kept();
        let kept_bytes: usize = kept.iter().map(|(b, _)| b.capacity()).sum();
        if kept_bytes + buf.capacity() <= self.budget / 4 {
            kept.push((buf, reservation));
        }
    }
}

/// The owner behind a filled read buffer's [`Bytes`].
struct KeptOnDrop {
    buf: Option<(Vec<u8>, Reservation)>,
    memory: Arc<TransferMemory>,
}

impl AsRef<[u8]> for KeptOnDrop {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |(b, _)| b.as_slice())
    }
}

impl Drop for KeptOnDrop {
    fn drop(&mut self) {
        if let Some((buf, reservation)) = self.buf.take() {
            self.memory.keep(buf, reservation);
        }
    }
}
