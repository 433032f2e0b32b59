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
//! Whoever holds the connection runs the whole queue, so no thread waits for the database and
//! no extra task exists: a change queued while a batch runs is taken by the next holder, which
//! may be its own caller. A caller that gives up (a dropped future) takes its change off the
//! queue if no batch has taken it yet; a batch runs without an `.await`, so a change that was
//! taken is also done.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::MetaError;

/// One change as queued: run inside a batch, or refused before it could run.
trait Queued: Send {
    /// Runs the change. `Some` holds the reply to send once the batch is committed; `None`
    /// means the change failed and its error was sent already.
    fn run(self: Box<Self>, conn: &Connection) -> Option<Box<dyn Reply>>;
    fn refuse(self: Box<Self>, error: MetaError);
}

/// A change's reply, held until its batch is committed (or not).
trait Reply: Send {
    fn send(self: Box<Self>, committed: Result<(), MetaError>);
}

struct Change<F, T> {
    change: F,
    reply: oneshot::Sender<Result<T, MetaError>>,
}

struct Held<T> {
    value: T,
    reply: oneshot::Sender<Result<T, MetaError>>,
}

impl<F, T> Queued for Change<F, T>
where
    F: FnOnce(&Connection) -> Result<T, MetaError> + Send + 'static,
    T: Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection) -> Option<Box<dyn Reply>> {
        let Self { change, reply } = *self;
        match change(conn) {
            Ok(value) => Some(Box::new(Held { value, reply })),
            Err(e) => {
                let _ = reply.send(Err(e));
                None
            }
        }
    }

    fn refuse(self: Box<Self>, error: MetaError) {
        let _ = self.reply.send(Err(error));
    }
}

impl<T: Send> Reply for Held<T> {
    fn send(self: Box<Self>, committed: Result<(), MetaError>) {
        let Self { value, reply } = *self;
        let _ = reply.send(committed.map(|()| value));
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

    /// Runs `change` in a write transaction, with whatever else is queued by then, and returns
    /// its outcome once that transaction is committed. `before` runs on the connection before
    /// each batch (with the batch's changes still queued); its error refuses the whole batch.
    pub(super) async fn write<'a, T, F, B, BF>(
        &'a self,
        change: F,
        before: B,
    ) -> Result<T, MetaError>
    where
        F: FnOnce(&Connection) -> Result<T, MetaError> + Send + 'static,
        T: Send + 'static,
        B: FnOnce(Guard<'a>) -> BF,
        BF: std::future::Future<Output = Result<Guard<'a>, MetaError>>,
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
                let conn = match before(conn).await {
                    Ok(conn) => conn,
                    Err(e) => {
                        ticket.armed = false;
                        let refused: Vec<_> = std::mem::take(&mut *self.queue());
                        for (_, change) in refused {
                            change.refuse(e.clone());
                        }
                        return outcome.await.unwrap_or_else(|_| Err(lost()));
                    }
                };
                // One turn of the scheduler first: requests already under way reach their
                // writes and join this batch, instead of each waiting for a commit of its own.
                tokio::task::yield_now().await;
                let batch: Vec<_> = std::mem::take(&mut *self.queue());
                ticket.armed = false;
                run_batch(&conn, batch.into_iter().map(|(_, c)| c).collect());
            }
        }
        // This change was in the batch just run, or in an earlier one: either way it is done.
        outcome.await.unwrap_or_else(|_| Err(lost()))
    }
}

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
                    change.refuse(e);
                    continue;
                }
            }
            match change.run(conn) {
                Some(reply) => {
                    replies.push(reply);
                    if !alone {
                        if let Err(e) = exec(conn, "RELEASE change") {
                            ended = Some(e);
                            break;
                        }
                    }
                }
                None if conn.is_autocommit() => {
                    ended = Some(MetaError::Unavailable(
                        "the database rolled back the transaction".into(),
                    ));
                    break;
                }
                None if alone => {}
                None => {
                    let undone = exec(conn, "ROLLBACK TO change")
                        .and_then(|()| exec(conn, "RELEASE change"));
                    if let Err(e) = undone {
                        ended = Some(e);
                        break;
                    }
                }
            }
        }
        let committed = match ended {
            Some(e) => Err(e),
            None if replies.is_empty() => Err(MetaError::Internal("nothing to commit".into())),
            None => exec(conn, "COMMIT"),
        };
        if committed.is_err() && !conn.is_autocommit() {
            let _ = exec(conn, "ROLLBACK");
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

    async fn insert(w: &GroupCommit, k: &'static str) -> Result<usize, MetaError> {
        w.write(
            move |c| Ok(c.execute("INSERT INTO t (k, n) VALUES (?, 1)", [k])?),
            |g| async { Ok(g) },
        )
        .await
    }

    async fn count(w: &GroupCommit) -> i64 {
        w.write(
            |c| Ok(c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))?),
            |g| async { Ok(g) },
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
        while w.queue().len() < 4 {
            tokio::task::yield_now().await;
        }
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
                    |g| async { Ok(g) },
                )
                .await
            })
        };
        let whole = {
            let w = w.clone();
            tokio::spawn(async move { insert(&w, "whole").await })
        };
        while w.queue().len() < 2 {
            tokio::task::yield_now().await;
        }
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
                |g| async { Ok(g) },
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
        while w.queue().is_empty() {
            tokio::task::yield_now().await;
        }
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
                    |_g| async { Err(MetaError::Unavailable("full".into())) },
                )
                .await
            })
        };
        while w.queue().is_empty() {
            tokio::task::yield_now().await;
        }
        let queued_behind = {
            let w = w.clone();
            tokio::spawn(async move { insert(&w, "x").await })
        };
        while w.queue().len() < 2 {
            tokio::task::yield_now().await;
        }
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
