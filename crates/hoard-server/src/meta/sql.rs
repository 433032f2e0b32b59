//! What the three SQL stores share: turning stored columns back into validated records, the
//! bounds of a prefix range, the statements built at run time (lookups, listings), and the
//! index hashes of the networked stores.

use super::dialect::{Backend, Shared, Upsert};
use super::row::{stored_count, Column, Row as _};
pub(super) use super::row::{Param, SqlRow};
use super::schema::{
    entries, entry_chunks, quarantined_entries, repository_usage, restores, uploads, EntryRow,
    RestoreRow,
};
use super::MetaError;
use crate::model::{
    BlobName, BlockId, Chunk, Entry, EntryId, EntryUse, Provenance, RepoId, Scope, Upload,
    UploadBlocks, UploadId, UploadState,
};

/// A chunk's stored columns, re-validated: the name must be one the server makes.
fn chunk_from_parts(
    name: String,
    size: i64,
    digest: Vec<u8>,
    xxh3: Option<i64>,
) -> Result<Chunk, MetaError> {
    let blob =
        BlobName::parse(&name).ok_or_else(|| MetaError::Corrupt(format!("blob name {name:?}")))?;
    let sha256 = match <[u8; 32]>::try_from(digest.as_slice()) {
        Ok(zero) if zero == [0; 32] => None,
        Ok(sha256) => Some(sha256),
        Err(_) if digest.is_empty() => None,
        Err(_) => return Err(MetaError::Corrupt("sha256 is not 32 bytes".into())),
    };
    if sha256.is_none() && xxh3.is_none() {
        return Err(MetaError::Corrupt(format!("chunk {name} has no digest")));
    }
    let size = u64::try_from(size).map_err(|_| MetaError::Corrupt(format!("chunk size {size}")))?;
    Ok(Chunk {
        blob,
        size,
        sha256,
        xxh3: xxh3.map(|v| v as u64),
    })
}

/// The migrations (`(version, SQL)`, in order) a database at schema `current` still needs;
/// `Corrupt` if it is newer than every one this server knows.
pub(super) fn migrations_after(
    all: &'static [(i64, &'static str)],
    current: i64,
) -> Result<impl Iterator<Item = &'static (i64, &'static str)>, MetaError> {
    let newest = all.last().map_or(0, |m| m.0);
    if current > newest {
        return Err(MetaError::Corrupt(format!(
            "the database schema is version {current}, newer than this server's {newest}"
        )));
    }
    Ok(all.iter().filter(move |m| m.0 > current))
}

/// The exclusive upper bound of the keys that start with `prefix`, under byte-wise comparison
/// of UTF-8: U+10FFFF (F4 8F BF BF) sorts above every other character, so the range holds every
/// key that continues the prefix, except one whose next character is U+10FFFF itself (a
/// noncharacter). Every backend uses the same bound, so all give the same answer.
pub(super) fn prefix_end(prefix: &str) -> String {
    format!("{prefix}\u{10FFFF}")
}

/// The lookup statement of the networked stores: for each (scope, key) pair, the exact match
/// and the newest prefix match, in one round trip. `placeholder(n)` spells the n-th parameter
/// (1-based) in the dialect. Parameters, per pair: bucket, repository, version, scope, key (exact);
/// then bucket, repository, version, scope, key, prefix end (prefix).
pub(super) fn candidates_sql(pairs: usize, placeholder: impl Fn(usize) -> String) -> String {
    static COLS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!("SELECT {} FROM entries", columns("entries", CANDIDATE))
    });
    let cols = COLS.as_str();
    let mut n = 0;
    let mut p = || {
        n += 1;
        placeholder(n)
    };
    let mut sql = String::with_capacity(pairs * 500);
    for i in 0..pairs {
        if i > 0 {
            sql.push_str(" UNION ALL ");
        }
        let (b, r, v, s, k) = (p(), p(), p(), p(), p());
        sql.push_str(&format!(
            "({cols} WHERE bucket = {b} AND repository = {r} AND version = {v} AND scope = {s} AND key_folded = {k} LIMIT 1)"
        ));
        let (b, r, v, s, k, end) = (p(), p(), p(), p(), p(), p());
        sql.push_str(&format!(
            " UNION ALL ({cols} WHERE bucket = {b} AND repository = {r} AND version = {v} AND scope = {s} \
             AND key_folded >= {k} AND key_folded < {end} ORDER BY created_at DESC, id DESC LIMIT 1)"
        ));
    }
    sql
}

/// `alias.name, …` of `names`: a projection's select list. Qualified names need no quoting in
/// any dialect, though `KEY` is reserved in MySQL.
pub(super) fn columns(alias: &str, names: &[&str]) -> String {
    names
        .iter()
        .map(|name| format!("{alias}.{name}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns of `entries` that [`entry_from_row`] reads.
pub(super) const ENTRY: &[&str] = &[
    entries::id.name,
    entries::repository.name,
    entries::scope.name,
    entries::key.name,
    entries::version.name,
    entries::size.name,
    entries::created_at.name,
    entries::last_used_at.name,
    entries::hits.name,
];

/// The columns of `uploads` that [`upload_from_row`] reads.
pub(super) const UPLOAD: &[&str] = &[
    uploads::id.name,
    uploads::repository.name,
    uploads::scope.name,
    uploads::key.name,
    uploads::version.name,
    uploads::state.name,
    uploads::created_at.name,
    uploads::revision.name,
    uploads::writer_kind.name,
    uploads::writer_issuer.name,
    uploads::created_by.name,
    uploads::writer_run_id.name,
    uploads::writer_job_id.name,
    uploads::writer_address.name,
];

/// The columns of a chunk ([`chunk_from_row`]), alike in `entry_chunks`, `staged_blocks` and
/// `upload_parts`.
pub(super) const CHUNK: &[&str] = &[
    entry_chunks::blob_name.name,
    entry_chunks::size.name,
    entry_chunks::sha256.name,
    entry_chunks::xxh3.name,
];

/// The columns of `entries` that [`use_from_row`] reads.
pub(super) const USE: &[&str] = &[
    entries::id.name,
    entries::repository.name,
    entries::size.name,
    entries::created_at.name,
    entries::last_used_at.name,
    entries::family.name,
    entries::ref_class.name,
];

/// The columns of `entries` that [`candidate_from_row`] reads.
pub(super) const CANDIDATE: &[&str] = &[
    entries::id.name,
    entries::scope.name,
    entries::key.name,
    entries::key_folded.name,
    entries::created_at.name,
    entries::size.name,
    entries::promoted_by.name,
];

/// The writer's columns of `uploads` (whose subject is the older `created_by`), in
/// [`provenance_from_row`]'s order.
const UPLOAD_WRITER: [&str; 6] = [
    uploads::writer_kind.name,
    uploads::writer_issuer.name,
    uploads::created_by.name,
    uploads::writer_run_id.name,
    uploads::writer_job_id.name,
    uploads::writer_address.name,
];

/// The select list of every listing statement, as [`listed_from_row`] reads it: every column
/// [`EntryRow::read`] reads (quarantined entries have them all), the name from `u`, the entry's
/// repository's `repository_usage` row, and the quarantine's columns.
fn listed_columns(quarantined: bool) -> String {
    format!(
        "{}, COALESCE(u.name, '') AS repository_name{}",
        entries::TABLE.selected("e"),
        if quarantined {
            ", e.quarantine_reason, e.quarantined_at"
        } else {
            ", '' AS quarantine_reason, -1 AS quarantined_at"
        }
    )
}

/// `FROM … WHERE …` selecting what `filter` asks for, with its parameters pushed to `params`.
fn filtered(
    filter: &super::EntryFilter,
    params: &mut Vec<Param>,
    placeholder: &dyn Fn(usize) -> String,
) -> String {
    let table = if filter.quarantined {
        "quarantined_entries"
    } else {
        "entries"
    };
    let mut sql = format!(
        " FROM {table} e LEFT JOIN repository_usage u ON u.repository = e.repository WHERE 1 = 1",
    );
    let p = |value: Param, params: &mut Vec<Param>| {
        params.push(value);
        placeholder(params.len())
    };
    if let Some(repository) = &filter.repository {
        let (id, name) = (
            p(Param::Text(repository.clone()), params),
            p(Param::Text(repository.clone()), params),
        );
        sql.push_str(&format!(" AND (e.repository = {id} OR u.name = {name})"));
    }
    if let Some(id) = &filter.repository_id {
        let i = p(Param::Text(id.clone()), params);
        sql.push_str(&format!(" AND e.repository = {i}"));
    }
    if let Some(scope) = &filter.scope {
        let s = p(Param::Text(scope.as_str().to_owned()), params);
        sql.push_str(&format!(" AND e.scope = {s}"));
    }
    if let Some(prefix) = &filter.folded_key_prefix {
        let from = p(Param::Text(prefix.clone()), params);
        let to = p(Param::Text(prefix_end(prefix)), params);
        sql.push_str(&format!(
            " AND e.key_folded >= {from} AND e.key_folded < {to}"
        ));
    }
    if let Some(key) = &filter.folded_key {
        let k = p(Param::Text(key.clone()), params);
        sql.push_str(&format!(" AND e.key_folded = {k}"));
    }
    if let Some(version) = &filter.version {
        let v = p(Param::Text(version.clone()), params);
        sql.push_str(&format!(" AND e.version = {v}"));
    }
    if let Some(id) = filter.id {
        let i = p(Param::Int(id.get()), params);
        sql.push_str(&format!(" AND e.id = {i}"));
    }
    for (column, value) in [
        ("e.writer_run_id", &filter.run_id),
        ("e.writer_subject", &filter.subject),
        ("e.promoted_by", &filter.promoted_by),
    ] {
        if let Some(value) = value {
            let v = p(Param::Text(value.clone()), params);
            sql.push_str(&format!(" AND {column} = {v}"));
        }
    }
    if let Some(kind) = filter.kind {
        let k = p(Param::Text(kind.as_str().to_owned()), params);
        sql.push_str(&format!(" AND e.writer_kind = {k}"));
    }
    if let Some(after) = filter.written_after {
        let a = p(Param::Int(after), params);
        sql.push_str(&format!(" AND e.created_at >= {a}"));
    }
    if let Some(before) = filter.written_before {
        let b = p(Param::Int(before), params);
        sql.push_str(&format!(" AND e.created_at < {b}"));
    }
    if let Some(digest) = &filter.digest {
        let d = p(Param::Text(digest.clone()), params);
        sql.push_str(&format!(" AND e.digest = {d}"));
    }
    if let Some(chunk) = &filter.chunk {
        let c = p(Param::Text(chunk.clone()), params);
        let chunks = match filter.quarantined {
            true => "quarantined_chunks",
            false => "entry_chunks",
        };
        sql.push_str(&format!(
            " AND e.id IN (SELECT entry_id FROM {chunks} WHERE blob_name = {c})"
        ));
    }
    sql
}

/// The statement of [`super::MetaStore::select_entries`] and its parameters; the rows are
/// read by [`listed_from_row`]. Paging is by key set (sort value, id), so a page costs the same wherever it
/// starts.
pub(super) fn select_entries_sql(
    page: &super::EntryPage<'_>,
    placeholder: impl Fn(usize) -> String,
) -> (String, Vec<Param>) {
    let mut params = Vec::new();
    let mut sql = format!("SELECT {}", listed_columns(page.filter.quarantined));
    sql.push_str(&filtered(page.filter, &mut params, &placeholder));
    let column = match page.order {
        super::EntryOrder::LastUsed => "e.last_used_at",
        super::EntryOrder::Size => "e.size",
        super::EntryOrder::Created => "e.created_at",
    };
    let (beyond, direction) = if page.descending {
        ("<", "DESC")
    } else {
        (">", "ASC")
    };
    if let Some((value, id)) = page.after {
        params.push(Param::Int(value));
        let v1 = placeholder(params.len());
        params.push(Param::Int(value));
        let v2 = placeholder(params.len());
        params.push(Param::Int(id.get()));
        let i = placeholder(params.len());
        sql.push_str(&format!(
            " AND ({column} {beyond} {v1} OR ({column} = {v2} AND e.id {beyond} {i}))"
        ));
    }
    params.push(Param::Int(page.limit as i64));
    sql.push_str(&format!(
        " ORDER BY {column} {direction}, e.id {direction} LIMIT {}",
        placeholder(params.len())
    ));
    (sql, params)
}

/// The count of [`super::AdminStore::select_entries`] (`page.count`) and its parameters.
pub(super) fn count_entries_sql(
    filter: &super::EntryFilter,
    placeholder: impl Fn(usize) -> String,
) -> (String, Vec<Param>) {
    let mut params = Vec::new();
    let sql = format!(
        "SELECT COUNT(*) AS n{}",
        filtered(filter, &mut params, &placeholder)
    );
    (sql, params)
}

/// The statement of [`super::MetaStore::repositories`] and its parameters; rows are
/// repository, name, bytes, entries, hits, misses, pull-request and tag bytes and entries.
pub(super) fn repositories_sql(
    only: Option<&str>,
    limit: usize,
    placeholder: impl Fn(usize) -> String,
) -> (String, Vec<Param>) {
    let mut params = Vec::new();
    let names: Vec<&str> = repository_usage::TABLE
        .columns
        .iter()
        .map(|c| c.name)
        .collect();
    let mut sql = format!("SELECT {} FROM repository_usage", names.join(", "));
    if let Some(only) = only {
        params.push(Param::Text(only.to_owned()));
        let id = placeholder(params.len());
        params.push(Param::Text(only.to_owned()));
        let name = placeholder(params.len());
        sql.push_str(&format!(" WHERE repository = {id} OR name = {name}"));
    }
    params.push(Param::Int(limit as i64));
    sql.push_str(&format!(
        " ORDER BY bytes DESC, repository LIMIT {}",
        placeholder(params.len())
    ));
    (sql, params)
}

/// An upload and its blocks in one statement (one round trip, one snapshot). Columns: the upload
/// (as [`upload_from_row`] reads them), then per block: `block_kind` (1 staged, 2 committed part;
/// NULL when the upload has no blocks), ordinal, block id and the chunk. `upload_id` is an
/// expression for the upload's id, used in both block branches (MariaDB does not push the join
/// condition into a UNION, so the branches name it themselves), and `which` selects the upload
/// on columns of `u`; parameters appear in that order.
pub(super) fn upload_with_blocks_sql(upload_id: &str, which: &str) -> String {
    format!(
        "SELECT {}, b.block_kind, b.ordinal, b.block_id, b.blob_name, b.size, b.sha256, b.xxh3
         FROM uploads u LEFT JOIN (
             SELECT upload_id, 1 AS block_kind, 0 AS ordinal, block_id, blob_name, size, sha256, xxh3
             FROM staged_blocks WHERE upload_id = {upload_id}
             UNION ALL
             SELECT upload_id, 2, ordinal, block_id, blob_name, size, sha256, xxh3
             FROM upload_parts WHERE upload_id = {upload_id}
         ) b ON b.upload_id = u.id
         WHERE {which}
         ORDER BY b.block_kind, b.ordinal",
        columns("u", UPLOAD)
    )
}

/// An upload and the [`super::BlockState`] of one block in one statement, reading the upload's
/// row and at most one block (primary keys), whatever the upload holds. Parameters: the block
/// id, the upload id. Columns: the upload, its staged count and bytes, the block's staged
/// chunk (NULLs without one), whether a committed part shares its blob (`copy_committed`).
pub(super) static BLOCK_STATE_SQL: Shared = Shared::built(|| {
    format!(
        "SELECT {}, u.staged_count, u.staged_bytes, {},
           CASE WHEN EXISTS (SELECT 1 FROM upload_parts p WHERE p.upload_id = u.id AND p.blob_name = s.blob_name)
                THEN 1 ELSE 0 END AS copy_committed
         FROM uploads u LEFT JOIN staged_blocks s ON s.upload_id = u.id AND s.block_id = ?
         WHERE u.id = ?",
        columns("u", UPLOAD),
        columns("s", CHUNK)
    )
});

/// A row of [`BLOCK_STATE_SQL`].
pub(super) fn block_state_from_row(
    row: &impl SqlRow,
) -> Result<(Upload, super::BlockState), MetaError> {
    let copy = match row.opt_text(entry_chunks::blob_name.name)? {
        Some(_) => Some(chunk_from_row(row)?),
        None => None,
    };
    let state = super::BlockState {
        staged_count: row.count(uploads::staged_count.name)?,
        staged_bytes: row.count(uploads::staged_bytes.name)?,
        copy,
        copy_committed: row.int("copy_committed")? != 0,
    };
    Ok((upload_from_row(row)?, state))
}

/// The blocks of an upload from [`upload_with_blocks_sql`] rows.
pub(super) fn collect_blocks(rows: &[impl SqlRow]) -> Result<UploadBlocks, MetaError> {
    let mut blocks = UploadBlocks::default();
    for row in rows {
        let Some(kind) = row.opt_int("block_kind")? else {
            continue; // the upload has no blocks
        };
        let id = BlockId::from_stored(row.read(super::schema::upload_parts::block_id)?);
        let chunk = chunk_from_row(row)?;
        if kind == 2 {
            blocks.parts.push((id, chunk));
        } else {
            blocks.staged.insert(id, chunk);
        }
    }
    Ok(blocks)
}

pub(super) fn upload_from_row(r: &impl SqlRow) -> Result<Upload, MetaError> {
    let state = r.read(uploads::state)?;
    Ok(Upload {
        id: UploadId::new(r.read(uploads::id)?),
        repository: RepoId::new(r.read(uploads::repository)?),
        scope: Scope::new(r.read(uploads::scope)?),
        key: r.read(uploads::key)?,
        version: r.read(uploads::version)?,
        state: UploadState::parse(&state)
            .ok_or_else(|| MetaError::Corrupt(format!("upload state {state:?}")))?,
        created_at: r.read(uploads::created_at)?,
        revision: r.read(uploads::revision)?,
        written_by: provenance_from_row(r, UPLOAD_WRITER)?,
    })
}

/// A writer from its columns, named in the order kind, issuer, subject, run, job, address.
fn provenance_from_row(r: &impl SqlRow, names: [&str; 6]) -> Result<Option<Provenance>, MetaError> {
    let mut values = [const { String::new() }; 6];
    for (value, name) in values.iter_mut().zip(names) {
        *value = r.text(name)?;
    }
    super::schema::writer_of(values)
}

/// An entry from its [`ENTRY`] columns.
pub(super) fn entry_from_row(r: &impl SqlRow) -> Result<Entry, MetaError> {
    Ok(Entry {
        id: EntryId::new(r.read(entries::id)?),
        repository: RepoId::new(r.read(entries::repository)?),
        scope: Scope::new(r.read(entries::scope)?),
        key: r.read(entries::key)?,
        version: r.read(entries::version)?,
        size: r.count(entries::size.name)?,
        created_at: r.read(entries::created_at)?,
        last_used_at: r.read(entries::last_used_at)?,
        hits: r.count(entries::hits.name)?,
    })
}

/// A repository's [`crate::model::QuotaUsage`] row.
pub(super) static QUOTA_USAGE: Shared =
    Shared::new("SELECT bytes, pr_bytes FROM repository_usage WHERE repository = ?");

/// The statement of [`super::LifecycleStore::usage`] and its parameters: at most one row, read
/// by [`quota_usage_from_row`].
pub(super) fn usage_sql(of: super::UsageOf<'_>) -> (&'static Shared, Vec<Param>) {
    static EVERYTHING: Shared = Shared::new(
        "SELECT CAST(COALESCE(SUM(bytes), 0) AS {bigint}) AS bytes,
                CAST(COALESCE(SUM(pr_bytes), 0) AS {bigint}) AS pr_bytes
         FROM repository_usage",
    );
    static PENDING_DELETIONS: Shared = Shared::new(
        "SELECT CAST(COALESCE(SUM(size), 0) AS {bigint}) AS bytes, CAST(0 AS {bigint}) AS pr_bytes
         FROM pending_deletions",
    );
    match of {
        super::UsageOf::Repository(repository) => (
            &QUOTA_USAGE,
            vec![Param::Text(repository.as_str().to_owned())],
        ),
        super::UsageOf::Everything => (&EVERYTHING, Vec::new()),
        super::UsageOf::PendingDeletions => (&PENDING_DELETIONS, Vec::new()),
    }
}

/// What the store holds ([`super::AdminStore::totals`]): one row of `bytes`, `entries`,
/// `repositories` and `open_uploads`.
pub(super) static TOTALS: Shared = Shared::new(
    "SELECT CAST(COALESCE(SUM(bytes), 0) AS {bigint}) AS bytes,
            CAST(COALESCE(SUM(entries), 0) AS {bigint}) AS entries,
            COUNT(*) AS repositories,
            (SELECT COUNT(*) FROM uploads WHERE state = 'open') AS open_uploads
     FROM repository_usage",
);

/// [`Totals`](crate::model::Totals) from a [`TOTALS`] row.
pub(super) fn totals_from_row(r: &impl SqlRow) -> Result<crate::model::Totals, MetaError> {
    Ok(crate::model::Totals::from_counts(
        r.int("bytes")?,
        r.int("entries")?,
        r.int("repositories")?,
        r.int("open_uploads")?,
    ))
}

/// The [`crate::model::QuotaUsage`] of a [`QUOTA_USAGE`] row (none: nothing held).
pub(super) fn quota_usage_from_row(
    r: Option<&impl SqlRow>,
) -> Result<crate::model::QuotaUsage, MetaError> {
    let Some(r) = r else {
        return Ok(crate::model::QuotaUsage::default());
    };
    Ok(crate::model::QuotaUsage {
        bytes: r.count(repository_usage::bytes.name)?,
        pr_bytes: r.count(repository_usage::pr_bytes.name)?,
    })
}

/// What an entry of `class` and `size` bytes adds to its repository's pull-request and tag
/// bytes and entries (`repository_usage.pr_bytes`, `pr_entries`).
pub(super) fn pr_counts(class: crate::model::ScopeClass, size: u64) -> (i64, i64) {
    match class {
        crate::model::ScopeClass::PullRequestOrTag => (size as i64, 1),
        crate::model::ScopeClass::Branch => (0, 0),
    }
}

/// `SELECT` of the [`USE`] columns of `entries`, for statements that go on with a condition.
pub(super) static USE_COLS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("SELECT {} FROM entries", USE.join(", ")));

/// Up to `?` (second) chunks whose deletion is due at `?` (first), oldest first, that no entry,
/// live or quarantined, names: a promotion makes two entries of one chunk, and the removal of
/// either schedules it, while the other still owns it.
pub(super) static DUE_DELETIONS: Shared = Shared::new(
    "SELECT blob_name FROM pending_deletions p WHERE delete_at <= ?
       AND NOT EXISTS (SELECT 1 FROM entry_chunks c WHERE c.blob_name = p.blob_name)
       AND NOT EXISTS (SELECT 1 FROM quarantined_chunks q WHERE q.blob_name = p.blob_name)
     ORDER BY delete_at LIMIT ?",
);

/// Forgets, among the first `?` (second) deletions due at `?` (first), those of chunks an entry
/// still names ([`DUE_DELETIONS`] passes them over; the entry that names the chunk schedules it
/// again when it goes). Bounded, so that a long backlog is not read again each round; the
/// derived table lets MySQL read the table it deletes from.
pub(super) static FORGET_SHARED_DELETIONS: Shared = Shared::new(
    "DELETE FROM pending_deletions WHERE blob_name IN
       (SELECT blob_name FROM (SELECT blob_name FROM pending_deletions WHERE delete_at <= ?
                               ORDER BY delete_at LIMIT ?) AS due)
       AND (EXISTS (SELECT 1 FROM entry_chunks c WHERE c.blob_name = pending_deletions.blob_name)
            OR EXISTS (SELECT 1 FROM quarantined_chunks q WHERE q.blob_name = pending_deletions.blob_name))",
);

/// The statement of `LifecycleStore::walk_entries` and its parameters, on every backend; rows
/// as [`use_from_row`] reads them.
pub(super) fn walk_entries_sql(
    walk: &super::EntryWalk<'_>,
    limit: usize,
) -> (&'static Shared, Vec<Param>) {
    use super::EntryWalk;
    static LRU: Shared =
        Shared::built(|| format!("{} ORDER BY last_used_at, id LIMIT ?", *USE_COLS));
    static LRU_OF: Shared = Shared::built(|| {
        format!(
            "{} WHERE repository = ? ORDER BY last_used_at, id LIMIT ?",
            *USE_COLS
        )
    });
    static CLASS_LRU: Shared = Shared::built(|| {
        format!(
            "{} WHERE repository = ? AND scope_class = ? ORDER BY last_used_at, id LIMIT ?",
            *USE_COLS
        )
    });
    // Two arms, each on its own index, at most `limit` from each.
    static EXPIRED: Shared = Shared::built(|| {
        format!(
            "SELECT * FROM ({cols} WHERE last_used_at < ? LIMIT ?) AS unused
             UNION SELECT * FROM ({cols} WHERE created_at < ? LIMIT ?) AS old LIMIT ?",
            cols = *USE_COLS
        )
    });
    static ALL: Shared =
        Shared::built(|| format!("{} WHERE id > ? ORDER BY id LIMIT ?", *USE_COLS));
    static AWAITING_DIGEST: Shared = Shared::built(|| {
        format!(
            "{} WHERE digest = '' AND id > ? ORDER BY id LIMIT ?",
            *USE_COLS
        )
    });
    static QUARANTINED_BEFORE: Shared = Shared::built(|| {
        format!(
            "SELECT {} FROM quarantined_entries WHERE quarantined_at < ? AND id > ? ORDER BY id LIMIT ?",
            USE.join(", ")
        )
    });
    let limit = Param::Int(limit as i64);
    let after = |id: &EntryId| Param::Int(id.get());
    match walk {
        EntryWalk::LeastRecentlyUsed(None) => (&LRU, vec![limit]),
        EntryWalk::LeastRecentlyUsed(Some(repository)) => (
            &LRU_OF,
            vec![Param::Text(repository.as_str().to_owned()), limit],
        ),
        EntryWalk::LeastRecentlyUsedOfClass(repository, class) => (
            &CLASS_LRU,
            vec![
                Param::Text(repository.as_str().to_owned()),
                Param::Int(class.code()),
                limit,
            ],
        ),
        EntryWalk::Expired {
            unused_before,
            created_before,
        } => (
            &EXPIRED,
            vec![
                Param::Int(*unused_before),
                limit.clone(),
                Param::Int(created_before.unwrap_or(crate::model::Millis::MIN)),
                limit.clone(),
                limit,
            ],
        ),
        EntryWalk::All { after: id } => (&ALL, vec![after(id), limit]),
        EntryWalk::AwaitingDigest { after: id } => (&AWAITING_DIGEST, vec![after(id), limit]),
        EntryWalk::QuarantinedBefore { before, after: id } => (
            &QUARANTINED_BEFORE,
            vec![Param::Int(*before), after(id), limit],
        ),
    }
}

pub(super) fn use_from_row(r: &impl SqlRow) -> Result<EntryUse, MetaError> {
    Ok(EntryUse {
        id: EntryId::new(r.read(entries::id)?),
        repository: RepoId::new(r.read(entries::repository)?),
        size: r.count(entries::size.name)?,
        created_at: r.read(entries::created_at)?,
        last_used_at: r.read(entries::last_used_at)?,
        family: r.read(entries::family)?,
        ref_class: crate::model::RefClass::from_code(r.read(entries::ref_class)?),
    })
}

/// The chunk names of rows that select `blob_name`.
pub(super) fn names_from_rows(rows: &[impl SqlRow]) -> Result<Vec<BlobName>, MetaError> {
    let mut names = Vec::with_capacity(rows.len());
    for row in rows {
        names.extend(BlobName::parse(&row.read(entry_chunks::blob_name)?));
    }
    Ok(names)
}

/// A chunk from its [`CHUNK`] columns.
pub(super) fn chunk_from_row(r: &impl SqlRow) -> Result<Chunk, MetaError> {
    chunk_from_parts(
        r.read(entry_chunks::blob_name)?,
        r.read(entry_chunks::size)?,
        r.read(entry_chunks::sha256)?,
        r.read(entry_chunks::xxh3)?,
    )
}

/// A chunk of an entry from `start` and its [`CHUNK`] columns.
pub(super) fn entry_chunk_from_row(r: &impl SqlRow) -> Result<super::EntryChunk, MetaError> {
    Ok(super::EntryChunk {
        start: r.count(entry_chunks::start.name)?,
        chunk: chunk_from_row(r)?,
    })
}

/// A row of a listing statement ([`listed_columns`]).
pub(super) fn listed_from_row(r: &impl SqlRow) -> Result<crate::model::ListedEntry, MetaError> {
    // Live entries select a time of -1.
    let quarantine = match r.int(quarantined_entries::quarantined_at.name)? {
        at if at < 0 => None,
        at => Some(crate::model::Quarantine {
            reason: r.read(quarantined_entries::quarantine_reason)?,
            at,
        }),
    };
    EntryRow::read(r)?.listed(r.text("repository_name")?, quarantine)
}

/// A `repository_usage` row.
pub(super) fn repository_from_row(r: &impl SqlRow) -> Result<super::RepositoryUsage, MetaError> {
    use repository_usage as u;
    Ok(super::RepositoryUsage {
        repository: RepoId::new(r.read(u::repository)?),
        name: r.read(u::name)?,
        bytes: r.count(u::bytes.name)?,
        entries: r.count(u::entries.name)?,
        hits: r.count(u::hits.name)?,
        misses: r.count(u::misses.name)?,
        pr_bytes: r.count(u::pr_bytes.name)?,
        pr_entries: r.count(u::pr_entries.name)?,
    })
}

/// The columns of a restore record copied from its entry's row, and from which column.
const RESTORE_FROM_ENTRY: [(&str, &str); 11] = [
    (restores::entry_id.name, "e.id"),
    (restores::repository.name, "e.repository"),
    (restores::scope.name, "e.scope"),
    (restores::key.name, "e.key"),
    (restores::written_at.name, "e.created_at"),
    (restores::writer_kind.name, "e.writer_kind"),
    (restores::writer_issuer.name, "e.writer_issuer"),
    (restores::writer_subject.name, "e.writer_subject"),
    (restores::writer_run_id.name, "e.writer_run_id"),
    (restores::writer_job_id.name, "e.writer_job_id"),
    (restores::writer_address.name, "e.writer_address"),
];

/// The inserted columns of a restore record that its entry does not give: the reader's, as
/// parameters, in declaration order.
fn restore_reader_columns(backend: Backend) -> impl Iterator<Item = &'static Column> {
    restores::TABLE
        .inserted(backend)
        .filter(|c| RESTORE_FROM_ENTRY.iter().all(|(name, _)| *name != c.name))
}

/// The statement that records one reader's restores of one entry, spelled for `backend`:
/// the entry's columns copied from its row (nothing is recorded for an entry that is gone),
/// added to the reader's record if it has one. Parameters: those of [`restore_params`].
static RECORD_RESTORE: Shared = Shared::per_backend(|backend| {
    let values: Vec<String> = restores::TABLE
        .inserted(backend)
        .map(|c| {
            RESTORE_FROM_ENTRY
                .iter()
                .find(|(name, _)| *name == c.name)
                .map_or("?".to_owned(), |(_, from)| (*from).to_owned())
        })
        .collect();
    let (greatest, least) = (backend.greatest(), backend.least());
    let on_existing = match backend.upsert() {
            Upsert::OnConflict => format!(
                "ON CONFLICT (entry_id, reader_hash) DO UPDATE SET count = restores.count + excluded.count,
                     last_at = {greatest}(restores.last_at, excluded.last_at),
                     first_at = {least}(restores.first_at, excluded.first_at)"
            ),
            Upsert::OnDuplicateKey => format!(
                "ON DUPLICATE KEY UPDATE count = count + VALUES(count),
                     last_at = {greatest}(last_at, VALUES(last_at)),
                     first_at = {least}(first_at, VALUES(first_at))"
            ),
        };
    format!(
        "INSERT INTO restores ({}) SELECT {} FROM entries e WHERE e.id = ? {on_existing}",
        restores::TABLE.inserted_list(backend),
        values.join(", ")
    )
});

/// The parameters of [`RECORD_RESTORE`] on `backend`: the reader's columns of the record, in
/// the order the declaration gives them, then the entry's id.
fn restore_params(restore: &super::NewRestore, backend: Backend) -> Vec<Param> {
    let [reader_kind, reader_issuer, reader_subject, reader_run_id, reader_job_id, reader_address] =
        super::schema::writer_columns(Some(&restore.reader));
    let record = RestoreRow {
        reader_hash: super::schema::reader_hash(&restore.reader),
        reader_kind,
        reader_issuer,
        reader_subject,
        reader_run_id,
        reader_job_id,
        reader_address,
        first_at: restore.first_at,
        last_at: restore.last_at,
        count: stored_count(restore.count),
        ..RestoreRow::default()
    };
    let mut params: Vec<Param> = restore_reader_columns(backend)
        .filter_map(|c| record.value(c.name))
        .collect();
    params.push(Param::Int(restore.entry.get()));
    params
}

/// The statements that record `restores` on `backend`, to run in order in one transaction:
/// each reader's record, then, per entry, its readers past the
/// [`super::MAX_READERS_PER_ENTRY`] most recent dropped.
pub(super) fn record_restores_sql(
    restores: &[super::NewRestore],
    backend: Backend,
) -> Vec<(&'static str, Vec<Param>)> {
    let mut statements: Vec<(&'static str, Vec<Param>)> = restores
        .iter()
        .map(|r| (RECORD_RESTORE.on(backend), restore_params(r, backend)))
        .collect();
    let mut entries: Vec<EntryId> = restores.iter().map(|r| r.entry).collect();
    entries.sort_unstable();
    entries.dedup();
    statements.extend(entries.into_iter().map(|id| {
        let id = Param::Int(id.get());
        (PRUNE_READERS.on(backend), vec![id.clone(), id])
    }));
    statements
}

/// Drops an entry's readers past the [`super::MAX_READERS_PER_ENTRY`] most recent. Parameters:
/// the entry's id, twice.
static PRUNE_READERS: Shared = Shared::built(|| {
    format!(
        "DELETE FROM restores WHERE entry_id = ? AND id NOT IN (
             SELECT id FROM (SELECT id FROM restores WHERE entry_id = ?
                             ORDER BY last_at DESC, id DESC LIMIT {}) AS kept)",
        super::MAX_READERS_PER_ENTRY
    )
});

/// Forgets records whose latest restore is before the parameter.
static PRUNE_RESTORES: Shared = Shared::new("DELETE FROM restores WHERE last_at < ?");

/// The repositories holding more restore records than the parameter: read before the
/// statements of a bound on each repository ([`each_repository_keeps`]).
pub(super) static RESTORE_HEAVY_REPOSITORIES: Shared =
    Shared::new("SELECT repository FROM restores GROUP BY repository HAVING COUNT(*) > ?");

/// Forgets a repository's oldest restore records (by latest restore, then id), by index
/// `restores_by_repository`. Parameters: the repository, twice; how many at most; how many of
/// the most recent to keep. The derived table lets MySQL delete from the table it reads.
static DROP_OLDEST_RESTORES_OF: Shared = Shared::new(
    "DELETE FROM restores WHERE repository = ? AND id IN (
         SELECT id FROM (SELECT id FROM restores WHERE repository = ?
                         ORDER BY last_at DESC, id DESC LIMIT ? OFFSET ?) AS dropped)",
);

/// The same over every repository, by index `restores_by_last`. Parameters: how many at most;
/// how many of the most recent to keep.
static DROP_OLDEST_RESTORES: Shared = Shared::new(
    "DELETE FROM restores WHERE id IN (
         SELECT id FROM (SELECT id FROM restores
                         ORDER BY last_at DESC, id DESC LIMIT ? OFFSET ?) AS dropped)",
);

/// Forgets the restore records of one entry (by index `restores_by_entry`).
static FORGET_RESTORES: Shared = Shared::new("DELETE FROM restores WHERE entry_id = ?");

/// How many records each repository keeps, if `which` bounds each repository: then the stores
/// read [`RESTORE_HEAVY_REPOSITORIES`] first, for [`drop_restores_sql`].
pub(super) fn each_repository_keeps(which: &super::RestoreDrop<'_>) -> Option<u64> {
    match *which {
        super::RestoreDrop::Oldest {
            of: super::RestoreBound::EachRepository,
            keep,
            ..
        } => Some(keep),
        _ => None,
    }
}

/// The statements of `LifecycleStore::drop_restores`, with their parameters, as the
/// transactions to run one after the other: one transaction (of one statement, or one per entry),
/// or one per repository for a bound on each, so that no transaction holds the database for more
/// than a repository's round. `over` is what [`RESTORE_HEAVY_REPOSITORIES`] answered (read
/// first) when `which` bounds each repository.
pub(super) fn drop_restores_sql(
    which: &super::RestoreDrop<'_>,
    over: &[RepoId],
) -> Vec<Vec<(&'static Shared, Vec<Param>)>> {
    use super::{RestoreBound, RestoreDrop};
    let oldest_of = |repository: &RepoId, keep: u64, limit: usize| {
        let repository = Param::Text(repository.as_str().to_owned());
        let (keep, limit) = (Param::count(keep), Param::Int(limit as i64));
        (
            &DROP_OLDEST_RESTORES_OF,
            vec![repository.clone(), repository, limit, keep],
        )
    };
    match *which {
        RestoreDrop::LastRestoredBefore(before) => {
            vec![vec![(&PRUNE_RESTORES, vec![Param::Int(before)])]]
        }
        RestoreDrop::Oldest { of, keep, limit } => match of {
            RestoreBound::Repository(repository) => vec![vec![oldest_of(repository, keep, limit)]],
            RestoreBound::EachRepository => over
                .iter()
                .map(|repository| vec![oldest_of(repository, keep, limit)])
                .collect(),
            RestoreBound::All => vec![vec![(
                &DROP_OLDEST_RESTORES,
                vec![Param::Int(limit as i64), Param::count(keep)],
            )]],
        },
        RestoreDrop::OfEntries(entries) => vec![entries
            .iter()
            .map(|id| (&FORGET_RESTORES, vec![Param::Int(id.get())]))
            .collect()],
    }
}

/// The statement of [`super::AdminStore::restores`] and its parameters, with `placeholder`
/// spelling the n-th.
pub(super) fn restores_sql(
    query: &super::RestoreQuery,
    placeholder: impl Fn(usize) -> String,
) -> (String, Vec<Param>) {
    let names: Vec<&str> = restores::TABLE
        .columns
        .iter()
        .map(|c| c.name)
        .filter(|name| *name != restores::reader_hash.name)
        .collect();
    let mut params = Vec::new();
    let mut p = |value: Param| {
        params.push(value);
        placeholder(params.len())
    };
    let mut sql = format!(
        "SELECT {} FROM restores r LEFT JOIN repository_usage u ON u.repository = r.repository WHERE 1 = 1",
        columns("r", &names)
    );
    if !query.entries.is_empty() {
        let list: Vec<String> = query
            .entries
            .iter()
            .map(|id| p(Param::Int(id.get())))
            .collect();
        sql.push_str(&format!(" AND r.entry_id IN ({})", list.join(", ")));
    }
    let f = &query.written_under;
    if let Some(repository) = &f.repository {
        let (id, name) = (
            p(Param::Text(repository.clone())),
            p(Param::Text(repository.clone())),
        );
        sql.push_str(&format!(" AND (r.repository = {id} OR u.name = {name})"));
    }
    for (column, value) in [
        ("r.repository", f.repository_id.clone()),
        ("r.scope", f.scope.as_ref().map(|s| s.as_str().to_owned())),
        ("r.writer_run_id", f.run_id.clone()),
        ("r.writer_subject", f.subject.clone()),
        ("r.writer_kind", f.kind.map(|k| k.as_str().to_owned())),
    ] {
        if let Some(value) = value {
            let v = p(Param::Text(value));
            sql.push_str(&format!(" AND {column} = {v}"));
        }
    }
    if let Some(after) = f.written_after {
        let a = p(Param::Int(after));
        sql.push_str(&format!(" AND r.written_at >= {a}"));
    }
    if let Some(before) = f.written_before {
        let b = p(Param::Int(before));
        sql.push_str(&format!(" AND r.written_at < {b}"));
    }
    let limit = p(Param::Int(query.limit as i64));
    sql.push_str(&format!(
        " ORDER BY r.last_at DESC, r.id DESC LIMIT {limit}"
    ));
    (sql, params)
}

/// A row of [`restores_sql`].
pub(super) fn restore_from_row(r: &impl SqlRow) -> Result<crate::model::RestoreRecord, MetaError> {
    let writer = [
        restores::writer_kind.name,
        restores::writer_issuer.name,
        restores::writer_subject.name,
        restores::writer_run_id.name,
        restores::writer_job_id.name,
        restores::writer_address.name,
    ];
    let reader = [
        restores::reader_kind.name,
        restores::reader_issuer.name,
        restores::reader_subject.name,
        restores::reader_run_id.name,
        restores::reader_job_id.name,
        restores::reader_address.name,
    ];
    Ok(crate::model::RestoreRecord {
        entry_id: EntryId::new(r.read(restores::entry_id)?),
        repository: RepoId::new(r.read(restores::repository)?),
        scope: Scope::new(r.read(restores::scope)?),
        key: r.read(restores::key)?,
        written_by: provenance_from_row(r, writer)?,
        written_at: r.read(restores::written_at)?,
        reader: provenance_from_row(r, reader)?.ok_or_else(|| {
            MetaError::Corrupt("a restore record without its reader's kind".into())
        })?,
        first_at: r.read(restores::first_at)?,
        last_at: r.read(restores::last_at)?,
        count: r.count(restores::count.name)?,
    })
}

/// A lookup's candidate from its [`CANDIDATE`] columns.
pub(super) fn candidate_from_row(r: &impl SqlRow) -> Result<crate::model::Candidate, MetaError> {
    Ok(crate::model::Candidate {
        id: crate::model::EntryId::new(r.read(entries::id)?),
        scope: Scope::new(r.read(entries::scope)?),
        key: r.read(entries::key)?,
        key_folded: r.read(entries::key_folded)?,
        created_at: r.read(entries::created_at)?,
        size: r.count(entries::size.name)?,
        promoted: !r.read(entries::promoted_by)?.is_empty(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[(i64, &str)] = &[(1, "a"), (2, "b"), (3, "c")];

    #[test]
    fn migrations_run_from_the_current_schema_and_a_newer_database_is_refused() {
        let versions = |current| {
            migrations_after(ALL, current).map(|pending| pending.map(|m| m.0).collect::<Vec<_>>())
        };
        assert_eq!(versions(0).unwrap(), [1, 2, 3]);
        assert_eq!(versions(2).unwrap(), [3]);
        assert!(versions(3).unwrap().is_empty());
        let newer = versions(4).unwrap_err().to_string();
        assert!(
            newer.contains("version 4, newer than this server's 3"),
            "{newer}"
        );
    }
}
