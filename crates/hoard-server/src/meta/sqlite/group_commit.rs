//! Group commit for the SQLite writer: the changes that queue while one transaction is being
//! written are written together in the next one, each inside its own savepoint.
//!
//! Every commit appends the pages it changed to the write-ahead log, with a checksum per page and
//! a system call per frame; concurrent saves change the same few pages (the upload table, the
//! repository's usage row, the index leaves of recent keys), so a batch writes them once. A
//! change sees exactly what it would see alone, and its outcome is its own: a change that fails
//! is rolled back to its savepoint, and the others in the batch commit without it. Nobody hears
//! of a success before the batch's `COMMIT` succeeded.
//!
//! Whoever holds the connection runs the queue (up to [`MAX_BATCH`] changes), so no extra task
//! exists: a change queued while a batch runs is taken by the next holder, which may be its own
//! caller. Every reply, a failure's too, is sent once the batch's transaction has ended, so a
//! caller that retries on fresh state reads what the batch committed. A caller that gives up (a
//! dropped future) takes its change off the queue if no batch has taken it yet; a batch runs
//! without an `.await`, so a change that was taken is also done, and may be committed after its
//! caller is gone (the domain forgets what such a change may outdate: `cache::ForgetIfDropped`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::meta::MetaError;

/// One change as queued: run inside a batch, or refused before it could run.
trait Queued: Send {
    /// Runs the change; the reply is sent once the batch's transaction has ended, whatever
    /// the change's outcome, so that a caller told of a failure (and retrying on fresh state)
    /// reads what the batch committed. `true` if the change succeeded.
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Box<dyn Reply>);
    fn refuse(self: Box<Self>, error: MetaError);
}

/// A change's reply, held until its batch's transaction has ended.
trait Reply: Send {
    /// `committed` is the fate of the batch; a change that failed reports its own error.
    fn send(self: Box<Self>, committed: Result<(), MetaError>);
}

struct Change<F, T> {
    change: F,
    reply: oneshot::Sender<Result<T, MetaError>>,
}

struct Held<T> {
    outcome: Result<T, MetaError>,
    reply: oneshot::Sender<Result<T, MetaError>>,
}

impl<F, T> Queued for Change<F, T>
where
    F: FnOnce(&Connection) -> Result<T, MetaError> + Send + 'static,
    T: Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Box<dyn Reply>) {
        let Self { change, reply } = *self;
        let outcome = change(conn);
        (outcome.is_ok(), Box::new(Held { outcome, reply }))
    }

    fn refuse(self: Box<Self>, error: MetaError) {
        let _ = self.reply.send(Err(error));
    }
}

impl<T: Send> Reply for Held<T> {
    fn send(self: Box<Self>, committed: Result<(), MetaError>) {
        let Self { outcome, reply } = *self;
        let _ = reply.send(outcome.and_then(|value| committed.map(|()| value)));
    }
}

/// The writer connection, held by whoever runs a batch.
pub(super) type Guard<'a> = tokio::sync::MutexGuard<'a, Connection>;

/// The writer connection and the changes waiting for it.
#[derive(Debug)]
pub(super) struct GroupCommit {
    conn: tokio::sync::Mutex<Connection>,
    queue: Mutex<Vec<(u64, Box<dyn Queued>)>>,
    next_ticket: AtomicU64,
}

impl std::fmt::Debug for dyn Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a queued change")
    }
}

/// Takes a change off the queue if its caller gave up before a batch took it.
struct Ticket<'a> {
    writer: &'a GroupCommit,
    number: u64,
    armed: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.writer.queue().retain(|(n, _)| *n != self.number);
        }
    }
}

impl GroupCommit {
    pub(super) fn new(conn: Connection) -> Self {
        Self {
            conn: tokio::sync::Mutex::new(conn),
            queue: Mutex::new(Vec::new()),
            next_ticket: AtomicU64::new(0),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Box<dyn Queued>)>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `change` in a write transaction, with whatever else is queued by then (up to
    /// [`MAX_BATCH`] changes), and returns its outcome once that transaction has ended.
    /// `before` runs on the connection once per turn at it; its error refuses what this turn
    /// would have run, this change included.
    pub(super) async fn write<'a, T, F, B, BF>(
        &'a self,
        change: F,
        before: B,
    ) -> Result<T, MetaError>
    where
        F: FnOnce(&Connection) -> Result<T, MetaError> + Send + 'static,
        T: Send + 'static,
        B: FnOnce(Guard<'a>) -> BF,
        BF: std::future::Future<Output = (Guard<'a>, Result<(), MetaError>)>,
    {
        let (reply, mut outcome) = oneshot::channel();
        let number = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        self.queue()
            .push((number, Box::new(Change { change, reply })));
        let mut ticket = Ticket {
            writer: self,
            number,
            armed: true,
        };
        tokio::select! {
            biased;
            // A batch of another caller's ran this change.
            done = &mut outcome => {
                ticket.armed = false;
                return done.unwrap_or_else(|_| Err(lost()));
            }
            conn = self.conn.lock() => {
                let (conn, room) = before(conn).await;
                loop {
                    // One turn of the scheduler first: requests already under way reach their
                    // writes and join this batch, instead of each waiting for a commit of its
                    // own. (Between slices of a long queue, it lets other tasks run.)
                    tokio::task::yield_now().await;
                    let batch: Vec<_> = {
                        let mut queue = self.queue();
                        let take = queue.len().min(MAX_BATCH);
                        queue.drain(..take).collect()
                    };
                    let batch = batch.into_iter().map(|(_, c)| c);
                    match &room {
                        Ok(()) => run_batch(&conn, batch.collect()),
                        Err(e) => batch.for_each(|change| change.refuse(e.clone())),
                    }
                    // Done once this change was in a batch, this caller's or an earlier one's.
                    if !self.queue().iter().any(|(n, _)| *n == number) {
                        ticket.armed = false;
                        break;
                    }
                }
            }
        }
        outcome.await.unwrap_or_else(|_| Err(lost()))
    }
}

/// Most changes one batch takes: a batch runs without a pause on one runtime thread, so a long
/// queue (built up while writes waited for a checkpoint) is taken a slice at a time.
const MAX_BATCH: usize = 256;

fn lost() -> MetaError {
    MetaError::Internal("a queued change was dropped without an answer".into())
}

fn exec(conn: &Connection, sql: &str) -> Result<(), MetaError> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// Runs `changes` in as few transactions as possible: one, unless the database itself ends a
/// transaction (a full disk, an I/O error), in which case what ran in it is refused and the
/// rest go on in a new one.
fn run_batch(conn: &Connection, changes: Vec<Box<dyn Queued>>) {
    // A transaction left open (only a panic in a change could leave one; release builds abort
    // on panic) would make every later BEGIN fail: end it first.
    if !conn.is_autocommit() {
        if let Err(e) = exec(conn, "ROLLBACK") {
            tracing::error!(error = %e, "the writer connection is inside a transaction that cannot be rolled back");
        }
    }
    let alone = changes.len() == 1;
    let mut changes = changes.into_iter();
    let mut next = changes.next();
    while next.is_some() {
        if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
            for change in next.into_iter().chain(changes) {
                change.refuse(e.clone());
            }
            return;
        }
        let mut replies: Vec<Box<dyn Reply>> = Vec::new();
        let mut ended: Option<MetaError> = None;
        while let Some(change) = next.take() {
            next = changes.next();
            // A change alone needs no savepoint: a failure rolls the transaction back.
            if !alone {
                if let Err(e) = exec(conn, "SAVEPOINT change") {
                    change.refuse(e.clone());
                    ended = Some(e);
                    break;
                }
            }
            let (succeeded, reply) = change.run(conn);
            replies.push(reply);
            if conn.is_autocommit() {
                // The database rolled the whole transaction back (or a change ended it).
                ended = Some(MetaError::Unavailable(
                    "the database rolled back the transaction".into(),
                ));
                break;
            }
            if alone {
                if !succeeded {
                    ended = Some(MetaError::Internal("the change failed".into()));
                }
                continue;
            }
            let finished = if succeeded {
                exec(conn, "RELEASE change")
            } else {
                exec(conn, "ROLLBACK TO change").and_then(|()| exec(conn, "RELEASE change"))
            };
            if let Err(e) = finished {
                ended = Some(e);
                break;
            }
        }
        let committed = match ended {
            Some(e) => Err(e),
            None => exec(conn, "COMMIT"),
        };
        if committed.is_err() && !conn.is_autocommit() {
            if let Err(e) = exec(conn, "ROLLBACK") {
                tracing::error!(error = %e, "a write transaction could not be rolled back");
            }
        }
        for reply in replies {
            reply.send(committed.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn writer() -> Arc<GroupCommit> {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (k TEXT NOT NULL UNIQUE, n INTEGER NOT NULL)")
            .unwrap();
        Arc::new(GroupCommit::new(conn))
    }

    /// The `before` of a writer whose log has room: refuses nothing.
    async fn room(g: Guard<'_>) -> (Guard<'_>, Result<(), MetaError>) {
        (g, Ok(()))
    }

    /// Waits until `n` changes are queued (the test holds the connection meanwhile).
    async fn queued(w: &GroupCommit, n: usize) {
        while w.queue().len() < n {
            tokio::task::yield_now().await;
        }
    }

    async fn insert(w: &GroupCommit, k: &'static str) -> Result<usize, MetaError> {
        w.write(
            move |c| Ok(c.execute("INSERT INTO t (k, n) VALUES (?, 1)", [k])?),
            room,
        )
        .await
    }

    async fn count(w: &GroupCommit) -> i64 {
        w.write(
            |c| Ok(c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))?),
            room,
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_failing_change_in_a_batch_leaves_the_others_committed() {
        let w = writer();
        // Hold the connection so that the changes queue into one batch.
        let held = w.conn.lock().await;
        let tasks: Vec<_> = ["a", "b", "a", "c"]
            .into_iter()
            .map(|k| {
                let w = w.clone();
                tokio::spawn(async move { insert(&w, k).await })
            })
            .collect();
        queued(&w, 4).await;
        drop(held);
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.unwrap());
        }
        let conflicts = outcomes
            .iter()
            .filter(|o| matches!(o, Err(MetaError::Conflict)))
            .count();
        assert_eq!(conflicts, 1, "{outcomes:?}");
        assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 3);
        assert_eq!(count(&w).await, 3);
    }

    #[tokio::test]
    async fn a_partial_change_is_rolled_back_to_its_savepoint() {
        let w = writer();
        let held = w.conn.lock().await;
        let partial = {
            let w = w.clone();
            tokio::spawn(async move {
                w.write(
                    |c| {
                        c.execute("INSERT INTO t (k, n) VALUES ('half', 1)", [])?;
                        Err::<(), _>(MetaError::Stale)
                    },
                    room,
                )
                .await
            })
        };
        let whole = {
            let w = w.clone();
            tokio::spawn(async move { insert(&w, "whole").await })
        };
        queued(&w, 2).await;
        drop(held);
        assert!(matches!(partial.await.unwrap(), Err(MetaError::Stale)));
        assert_eq!(whole.await.unwrap().unwrap(), 1);
        let keys: Vec<String> = w
            .write(
                |c| {
                    let mut s = c.prepare("SELECT k FROM t")?;
                    let rows = s.query_map([], |r| r.get::<_, String>(0))?;
                    Ok(rows.collect::<Result<Vec<_>, _>>()?)
                },
                room,
            )
            .await
            .unwrap();
        assert_eq!(keys, vec!["whole".to_owned()]);
    }

    #[tokio::test]
    async fn a_caller_that_gives_up_while_queued_changes_nothing() {
        let w = writer();
        let held = w.conn.lock().await;
        let abandoned = {
            let w = w.clone();
            tokio::spawn(async move { insert(&w, "gone").await })
        };
        queued(&w, 1).await;
        abandoned.abort();
        let _ = abandoned.await;
        assert!(w.queue().is_empty());
        drop(held);
        assert_eq!(count(&w).await, 0);
    }

    #[tokio::test]
    async fn a_refusal_before_the_batch_refuses_every_queued_change() {
        let w = writer();
        let held = w.conn.lock().await;
        // Queued first, so it takes the connection first, and refuses.
        let refusing = {
            let w = w.clone();
            tokio::spawn(async move {
                w.write(
                    |c| Ok(c.execute("INSERT INTO t (k, n) VALUES ('y', 1)", [])?),
                    |g| async { (g, Err(MetaError::Unavailable("full".into()))) },
                )
                .await
            })
        };
        queued(&w, 1).await;
        let queued_behind = {
            let w = w.clone();
            tokio::spawn(async move { insert(&w, "x").await })
        };
        queued(&w, 2).await;
        drop(held);
        assert!(matches!(
            refusing.await.unwrap(),
            Err(MetaError::Unavailable(_))
        ));
        assert!(matches!(
            queued_behind.await.unwrap(),
            Err(MetaError::Unavailable(_))
        ));
        assert_eq!(count(&w).await, 0);
    }
}
