//! `--fill-page-cache`: the free memory filled with clean page cache before the rounds.
//!
//! A server that has run for a while has no free memory: its page cache holds what it wrote
//! and read, and each new write takes a page the kernel reclaims from there. A machine that
//! has just booted hands out free pages instead, and on a virtual machine that gives its free
//! memory back to the host (free page reporting, as on the development machine) the first
//! write into such a page waits for the host to provide it again: there, 1 GiB written to a
//! file took 4 s in that state against 0.4 s into memory the page cache recycled, and which
//! target happened on recycled memory decided the upload figures. A scratch file as large as
//! the free memory, written and synced once before the rounds (untimed), puts every target in
//! the steady state; the kernel reclaims it as the targets write.

use std::fs::File;
use std::io::{self, Write};
use std::time::Instant;
use tempfile::TempDir;

/// Memory left free for what the servers and the bench allocate before the kernel reclaims.
const LEFT_FREE: u64 = 1 << 30;
const WRITE: usize = 8 << 20;

/// Writes and syncs a scratch file as large as the free memory (less [`LEFT_FREE`], and at
/// most half the file system's free space) in a temporary directory, which the caller keeps
/// for the run: dropping it removes the file and its page cache.
pub fn fill() -> io::Result<TempDir> {
    let dir = tempfile::tempdir()?;
    let free_memory = super::procstat::free_memory_bytes().unwrap_or(0);
    let stat = rustix::fs::statvfs(dir.path())?;
    let free_disk = stat.f_bavail.saturating_mul(stat.f_frsize);
    let size = free_memory.saturating_sub(LEFT_FREE).min(free_disk / 2);
    let writes = size / WRITE as u64;
    if writes == 0 {
        tracing::info!("--fill-page-cache: no free memory to fill");
        return Ok(dir);
    }
    let size = writes * WRITE as u64;
    tracing::info!(
        "filling {} MiB of free memory with a scratch file's page cache (untimed)",
        size >> 20
    );
    let started = Instant::now();
    let mut file = File::create(dir.path().join("page-cache-fill"))?;
    let zeros = vec![0u8; WRITE];
    for _ in 0..writes {
        file.write_all(&zeros)?;
    }
    // Clean pages: the kernel reclaims them without writing anything.
    file.sync_data()?;
    tracing::info!(
        "filled {} MiB in {:.1} s",
        size >> 20,
        started.elapsed().as_secs_f64()
    );
    Ok(dir)
}
