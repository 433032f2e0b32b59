//! The statements of quarantine, the same for every SQL store: an entry moves with its chunks
//! from `entries` to `quarantined_entries` (out of every lookup, as a deletion is, but kept), and
//! back on release, or goes for good when its quarantine ends. The column lists come from the
//! declarations, so a column added to entries is carried by quarantine once it is declared in
//! both tables.

use super::dialect::{Backend, Shared};
use super::schema::{entries, entry_chunks};
use super::sql::Param;

/// The columns of `entries` that `backend` has, spelled for it.
fn entry_columns(backend: Backend) -> String {
    entries::TABLE
        .columns
        .iter()
        .filter(|c| c.exists_on(backend))
        .map(|c| backend.quote(c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn chunk_columns(backend: Backend) -> String {
    entry_chunks::TABLE
        .columns
        .iter()
        .map(|c| backend.quote(c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Copies entry `?3` into quarantine with its reason `?1` and time `?2`.
pub(super) static KEEP_ENTRY: Shared = Shared::per_backend(|backend| {
    let columns = entry_columns(backend);
    format!(
        "INSERT INTO quarantined_entries ({columns}, quarantine_reason, quarantined_at)
         SELECT {columns}, ?, ? FROM entries WHERE id = ?"
    )
});

/// Copies the chunks of entry `?` into quarantine.
pub(super) static KEEP_CHUNKS: Shared = Shared::per_backend(|backend| {
    let columns = chunk_columns(backend);
    format!(
        "INSERT INTO quarantined_chunks ({columns})
         SELECT {columns} FROM entry_chunks WHERE entry_id = ?"
    )
});

/// Puts quarantined entry `?` back among the entries, with its id. A live entry that holds its
/// slot meanwhile makes this fail as a conflict.
pub(super) static RELEASE_ENTRY: Shared = Shared::per_backend(|backend| {
    let columns = entry_columns(backend);
    format!(
        "INSERT INTO entries ({columns}) SELECT {columns} FROM quarantined_entries WHERE id = ?"
    )
});

/// Puts the chunks of quarantined entry `?` back.
pub(super) static RELEASE_CHUNKS: Shared = Shared::per_backend(|backend| {
    let columns = chunk_columns(backend);
    format!(
        "INSERT INTO entry_chunks ({columns}) SELECT {columns} FROM quarantined_chunks WHERE entry_id = ?"
    )
});

/// Counts quarantined entry `?` (all four parameters are its id) in its repository's usage
/// again, as a finalize does; nothing if it is not in quarantine.
pub(super) static RELEASE_USAGE: Shared = Shared::new(
    "UPDATE repository_usage SET
         bytes = bytes + (SELECT size FROM quarantined_entries WHERE id = ?),
         entries = entries + 1,
         pr_bytes = pr_bytes
             + (SELECT CASE WHEN scope_class = 1 THEN size ELSE 0 END FROM quarantined_entries WHERE id = ?),
         pr_entries = pr_entries
             + (SELECT CASE WHEN scope_class = 1 THEN 1 ELSE 0 END FROM quarantined_entries WHERE id = ?)
     WHERE repository = (SELECT repository FROM quarantined_entries WHERE id = ?)",
);

/// Schedules the chunks of quarantined entry `?2` for deletion at `?1`.
pub(super) static DROP_CHUNKS: Shared = Shared::per_backend(|backend| {
    let upsert = super::schema::pending_deletions::TABLE.on_existing_replace(backend, 1);
    format!(
        "INSERT INTO pending_deletions (blob_name, size, delete_at)
         SELECT blob_name, size, ? FROM quarantined_chunks WHERE entry_id = ? {upsert}"
    )
});

/// Forgets the chunks of quarantined entry `?` (after [`DROP_CHUNKS`] or a release).
pub(super) static FORGET_CHUNKS: Shared =
    Shared::new("DELETE FROM quarantined_chunks WHERE entry_id = ?");

/// Forgets quarantined entry `?`; one row changed if it was in quarantine.
pub(super) static FORGET_ENTRY: Shared =
    Shared::new("DELETE FROM quarantined_entries WHERE id = ?");

/// Quarantined entry `?` as eviction and expiry weigh it ([`super::sql::use_from_row`]).
static USE: Shared = Shared::built(|| {
    format!(
        "SELECT {} FROM quarantined_entries WHERE id = ?",
        super::sql::USE.join(", ")
    )
});

/// The statements that end the quarantine of entry `id`, to run in order in one transaction:
/// the entry as [`super::sql::use_from_row`] reads it (no row: not in quarantine), then its
/// chunks scheduled for deletion at `delete_at`, then its rows forgotten (one entry row
/// changed: it was in quarantine).
pub(super) fn end(id: i64, delete_at: i64) -> [(&'static Shared, Vec<Param>); 4] {
    [
        (&USE, vec![Param::Int(id)]),
        (&DROP_CHUNKS, vec![Param::Int(delete_at), Param::Int(id)]),
        (&FORGET_CHUNKS, vec![Param::Int(id)]),
        (&FORGET_ENTRY, vec![Param::Int(id)]),
    ]
}

/// A quarantined entry `?`, with the columns [`super::sql::entry_from_row`] reads.
pub(super) static ENTRY: Shared = Shared::built(|| {
    format!(
        "SELECT {} FROM quarantined_entries e WHERE e.id = ?",
        super::sql::columns("e", super::sql::ENTRY)
    )
});

/// The chunks of quarantined entry `?`, in order.
pub(super) static CHUNKS: Shared = Shared::built(|| {
    format!(
        "SELECT start, {} FROM quarantined_chunks WHERE entry_id = ? ORDER BY ordinal",
        super::sql::CHUNK.join(", ")
    )
});
