//! The write-ahead log's bound: its size is watched before batches of writes; past the soft
//! limit the durability loop is asked for an early checkpoint, past the hard limit writes wait
//! for one (and are refused if a long reader prevents it).

use std::path::PathBuf;
use std::time::Duration;

use rusqlite::Connection;

use super::group_commit::Guard;
use crate::meta::MetaError;

/// Past this size the write-ahead log asks for an early sync and checkpoint, and a checkpoint
/// truncates it to this size at most (`journal_size_limit`).
pub const WAL_SOFT_LIMIT: u64 = 64 << 20;
/// The log never grows past this (plus the writes in flight): a write that finds it larger waits
/// for a checkpoint, and is refused as unavailable if a long read transaction prevents one.
pub const WAL_HARD_LIMIT: u64 = 256 << 20;
/// The log's size is looked at once every this many batches of writes (a `stat`), and before
/// every batch while it is past the soft limit.
const WAL_CHECK_EVERY: u64 = 16;
/// How long a write past the hard bound waits for a checkpoint before it is refused.
const HARD_LIMIT_WAIT: Duration = Duration::from_secs(5);

/// Keeps the write-ahead log bounded (see [`WAL_SOFT_LIMIT`], [`WAL_HARD_LIMIT`]).
#[derive(Debug)]
pub(super) struct WalBound {
    pub(super) path: PathBuf,
    pub(super) writes: std::sync::atomic::AtomicU64,
    /// The size last seen was past the soft limit: look at every write.
    pub(super) large: std::sync::atomic::AtomicBool,
    /// Wakes the durability loop for an early sync and checkpoint.
    pub(super) wanted: tokio::sync::Notify,
}

impl WalBound {
    pub(super) fn size(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// Before a batch of writes: the log's size, looked at every [`WAL_CHECK_EVERY`] batches
    /// (every batch while it is large); past the soft limit the durability loop is asked for a
    /// checkpoint. True when the batch must wait for the log to come under its hard limit.
    fn over_hard_limit(&self) -> bool {
        use std::sync::atomic::Ordering;
        let n = self.writes.fetch_add(1, Ordering::Relaxed);
        if !n.is_multiple_of(WAL_CHECK_EVERY) && !self.large.load(Ordering::Relaxed) {
            return false;
        }
        let size = self.size();
        self.large.store(size > WAL_SOFT_LIMIT, Ordering::Relaxed);
        if size > WAL_SOFT_LIMIT {
            self.wanted.notify_one();
        }
        size > WAL_HARD_LIMIT
    }

    /// Before a batch of writes, with the writer connection held: past the hard bound, the
    /// durability loop has not kept up (a large checkpoint takes seconds on a busy disk), or a
    /// reader holds an old snapshot. Writes then queue here, checkpointing when they can, and
    /// are refused if the log cannot start over in time. The bound holds.
    pub(super) async fn wait_for_room<'a>(
        &self,
        conn: Guard<'a>,
    ) -> (Guard<'a>, Result<(), MetaError>) {
        if !self.over_hard_limit() {
            return (conn, Ok(()));
        }
        let deadline = tokio::time::Instant::now() + HARD_LIMIT_WAIT;
        loop {
            // Busy (another checkpoint runs, a reader stays): look again shortly.
            let _ = checkpoint_now(&conn, Duration::ZERO);
            if self.size() <= WAL_HARD_LIMIT {
                return (conn, Ok(()));
            }
            if tokio::time::Instant::now() >= deadline {
                let refused = MetaError::Unavailable(format!(
                    "the write-ahead log is at its bound ({} MiB) and a long read transaction prevents a checkpoint",
                    WAL_HARD_LIMIT >> 20
                ));
                return (conn, Err(refused));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Checkpoints the whole log into the database and truncates it, waiting up to `wait` for
/// readers; if they still hold it, copies what it can (never an error for being busy).
pub(super) fn checkpoint_now(conn: &Connection, wait: Duration) -> Result<(), MetaError> {
    conn.busy_timeout(wait)?;
    let done = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        r.get::<_, i64>(0)
    });
    conn.busy_timeout(Duration::from_secs(10))?;
    if done? != 0 {
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
    }
    Ok(())
}
