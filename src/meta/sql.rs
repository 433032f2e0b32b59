//! What the three SQL stores share: turning stored columns back into validated records, the
//! bounds of a prefix range, the statements built at run time (lookups, listings), and the
//! index hashes of the networked stores.

use super::MetaError;
use crate::model::{
    BlobName, BlockId, CallerKind, Chunk, Entry, EntryId, EntryUse, Provenance, RepoId, Scope,
    Upload, UploadBlocks, UploadId, UploadState,
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

/// A chunk's XXH3 as stored: the 64 bits as a signed integer.
/// The stored SHA-256 of a chunk: empty until the digest pass records it (MySQL's fixed-width
/// column pads that to 32 zero bytes, which reads back the same).
pub(super) fn sha256_column(chunk: &Chunk) -> &[u8] {
    chunk.sha256.as_ref().map_or(&[], |d| &d[..])
}

pub(super) fn xxh3_column(chunk: &Chunk) -> Option<i64> {
    chunk.xxh3.map(|v| v as i64)
}

/// The exclusive upper bound of the keys that start with `prefix`, under byte-wise comparison
/// of UTF-8: U+10FFFF (F4 8F BF BF) sorts above every other character, so the range holds every
/// key that continues the prefix, except one whose next character is U+10FFFF itself (a
/// noncharacter). Every backend uses the same bound, so all give the same answer.
pub(super) fn prefix_end(prefix: &str) -> String {
    format!("{prefix}\u{10FFFF}")
}

/// SHA-256 over length-prefixed fields: equal exactly when every field is equal.
fn digest(fields: &[&[u8]]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for field in fields {
        hasher.update((field.len() as u64).to_le_bytes());
        hasher.update(field);
    }
    hasher.finalize().to_vec()
}

/// The networked stores' index key for one (repository, version, scope): a fixed 32 bytes,
/// because the columns themselves together are longer than MySQL's and PostgreSQL's index
/// entries may be. Lookups scan `(bucket, key_folded)` ranges, and also compare the columns.
pub(super) fn bucket(
    repository: &RepoId,
    version: &crate::model::Version,
    scope: &Scope,
) -> Vec<u8> {
    digest(&[
        repository.as_str().as_bytes(),
        version.as_str().as_bytes(),
        scope.as_str().as_bytes(),
    ])
}

/// The networked stores' unique key for a slot: its bucket and folded key.
pub(super) fn slot_hash(slot: &crate::model::Slot) -> Vec<u8> {
    let bucket = bucket(&slot.repository, &slot.version, &slot.scope);
    digest(&[&bucket, slot.key.folded().as_bytes()])
}

/// The lookup statement of the networked stores: for each (scope, key) pair, the exact match
/// and the newest prefix match, in one round trip. `placeholder(n)` spells the n-th parameter
/// (1-based) in the dialect. Parameters, per pair: bucket, repository, version, scope, key (exact);
/// then bucket, repository, version, scope, key, prefix end (prefix).
pub(super) fn candidates_sql(pairs: usize, placeholder: impl Fn(usize) -> String) -> String {
    // `entries.key`: a qualified name needs no quoting in either dialect, though KEY is
    // reserved in MySQL.
    const COLS: &str =
        "SELECT entries.id, entries.scope, entries.key, entries.key_folded, entries.created_at, entries.size FROM entries";
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
            "({COLS} WHERE bucket = {b} AND repository = {r} AND version = {v} AND scope = {s} AND key_folded = {k} LIMIT 1)"
        ));
        let (b, r, v, s, k, end) = (p(), p(), p(), p(), p(), p());
        sql.push_str(&format!(
            " UNION ALL ({COLS} WHERE bucket = {b} AND repository = {r} AND version = {v} AND scope = {s} \
             AND key_folded >= {k} AND key_folded < {end} ORDER BY created_at DESC, id DESC LIMIT 1)"
        ));
    }
    sql
}

/// A parameter of a statement built at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    Text(String),
    Int(i64),
    Bytes(Vec<u8>),
}

/// The columns of `entries` (as `e`) that [`entry_from_row`] reads, in its order: a literal, so
/// that statements can be `concat!`ed from it. A new column of entries is added here once.
macro_rules! entry_columns {
    () => {
        "e.id, e.repository, e.scope, e.key, e.version, e.size, e.created_at, e.last_used_at, e.hits"
    };
}
pub(super) use entry_columns;

/// The columns of `uploads` (as `u`) that [`upload_from_row`] reads, in its order; the
/// writer's subject is the older `created_by`.
macro_rules! upload_columns {
    () => {
        "u.id, u.repository, u.scope, u.key, u.version, u.state, u.created_at, u.revision, \
         u.writer_kind, u.writer_issuer, u.created_by, u.writer_run_id, u.writer_job_id, u.writer_address"
    };
}
pub(super) use upload_columns;

/// How many columns [`upload_columns`] names: what a statement selects after them starts here.
pub(super) const UPLOAD_COLUMNS: usize = 14;

/// The columns every listing statement selects, as [`listed_from_row`] reads them; `u` is the
/// entry's repository's `repository_usage` row.
const LISTED_COLUMNS: &str = concat!(
    entry_columns!(),
    ", COALESCE(u.name, ''), e.writer_kind, e.writer_issuer, e.writer_subject, e.writer_run_id, \
     e.writer_job_id, e.writer_address, e.digest"
);

/// `FROM … WHERE …` selecting what `filter` asks for, with its parameters pushed to `params`.
fn filtered(
    filter: &super::EntryFilter,
    params: &mut Vec<Param>,
    placeholder: &dyn Fn(usize) -> String,
) -> String {
    let mut sql = String::from(
        " FROM entries e LEFT JOIN repository_usage u ON u.repository = e.repository WHERE 1 = 1",
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
    sql
}

/// The statement of [`super::MetaStore::list_entries`] and its parameters; the rows are
/// read by [`listed_from_row`]. Paging is by key set (sort value, id), so a page costs the same wherever it
/// starts.
pub(super) fn list_entries_sql(
    page: &super::EntryPage<'_>,
    placeholder: impl Fn(usize) -> String,
) -> (String, Vec<Param>) {
    let mut params = Vec::new();
    let mut sql = format!("SELECT {LISTED_COLUMNS}");
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

/// The statement of [`super::MetaStore::count_entries`] and its parameters.
pub(super) fn count_entries_sql(
    filter: &super::EntryFilter,
    placeholder: impl Fn(usize) -> String,
) -> (String, Vec<Param>) {
    let mut params = Vec::new();
    let sql = format!(
        "SELECT COUNT(*){}",
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
    let mut sql =
        String::from("SELECT repository, name, bytes, entries, hits, misses, pr_bytes, pr_entries FROM repository_usage");
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
/// (as [`upload_from_row`] reads them), then per block: kind (1 staged, 2 committed part; NULL when the
/// upload has no blocks), ordinal, block id, blob name, size, SHA-256, XXH3. `upload_id` is
/// an expression for the upload's id, used in both block branches (MariaDB does not push the
/// join condition into a UNION, so the branches name it themselves), and `which` selects the
/// upload on columns of `u`; parameters appear in that order.
pub(super) fn upload_with_blocks_sql(upload_id: &str, which: &str) -> String {
    format!(
        "SELECT {}, b.kind, b.ordinal, b.block_id, b.blob_name, b.size, b.sha256, b.xxh3
         FROM uploads u LEFT JOIN (
             SELECT upload_id, 1 AS kind, 0 AS ordinal, block_id, blob_name, size, sha256, xxh3
             FROM staged_blocks WHERE upload_id = {upload_id}
             UNION ALL
             SELECT upload_id, 2, ordinal, block_id, blob_name, size, sha256, xxh3
             FROM upload_parts WHERE upload_id = {upload_id}
         ) b ON b.upload_id = u.id
         WHERE {which}
         ORDER BY b.kind, b.ordinal",
        upload_columns!()
    )
}

/// An upload and the [`super::BlockState`] of one block in one statement, reading the upload's
/// row and at most one block (primary keys), whatever the upload holds. Parameters: the block
/// id, the upload id. Columns: the upload, its staged count and bytes, the block's staged
/// chunk (NULLs without one), whether a committed part shares its blob.
pub(super) const BLOCK_STATE_SQL: &str = concat!(
    "SELECT ",
    upload_columns!(),
    ", u.staged_count, u.staged_bytes, s.blob_name, s.size, s.sha256, s.xxh3,
       CASE WHEN EXISTS (SELECT 1 FROM upload_parts p WHERE p.upload_id = u.id AND p.blob_name = s.blob_name)
            THEN 1 ELSE 0 END
     FROM uploads u LEFT JOIN staged_blocks s ON s.upload_id = u.id AND s.block_id = ?
     WHERE u.id = ?"
);

/// A row of [`BLOCK_STATE_SQL`].
pub(super) fn block_state_from_row(
    row: &impl SqlRow,
) -> Result<(Upload, super::BlockState), MetaError> {
    let first = UPLOAD_COLUMNS;
    let count = |col| {
        let n = row.int(col)?;
        u64::try_from(n).map_err(|_| MetaError::Corrupt(format!("staged total {n}")))
    };
    let copy = match row.opt_text(first + 2)? {
        Some(_) => Some(chunk_from_row(row, first + 2)?),
        None => None,
    };
    let state = super::BlockState {
        staged_count: count(first)?,
        staged_bytes: count(first + 1)?,
        copy,
        copy_committed: row.int(first + 6)? != 0,
    };
    Ok((upload_from_row(row)?, state))
}

/// The blocks of an upload from [`upload_with_blocks_sql`] rows: per row, past the upload's
/// columns, the kind (1 staged, 2 committed part; NULL when the upload has no blocks), ordinal,
/// block id and the chunk.
pub(super) fn collect_blocks(rows: &[impl SqlRow]) -> Result<UploadBlocks, MetaError> {
    let mut blocks = UploadBlocks::default();
    let first = UPLOAD_COLUMNS;
    for row in rows {
        let Some(kind) = row.opt_int(first)? else {
            continue; // the upload has no blocks
        };
        let id = BlockId::from_stored(row.opt_bytes(first + 2)?.ok_or_else(|| null(first + 2))?);
        let chunk = chunk_from_row(row, first + 3)?;
        if kind == 2 {
            blocks.parts.push((id, chunk));
        } else {
            blocks.staged.insert(id, chunk);
        }
    }
    Ok(blocks)
}

/// A row as the SQL stores read it, by column index. Each driver decodes its own column types
/// (SQLite's dynamic ones, PostgreSQL's strict integer widths, MySQL's binary strings).
pub trait SqlRow {
    fn opt_int(&self, col: usize) -> Result<Option<i64>, MetaError>;
    fn opt_text(&self, col: usize) -> Result<Option<String>, MetaError>;
    fn opt_bytes(&self, col: usize) -> Result<Option<Vec<u8>>, MetaError>;

    fn int(&self, col: usize) -> Result<i64, MetaError> {
        self.opt_int(col)?.ok_or_else(|| null(col))
    }
    fn text(&self, col: usize) -> Result<String, MetaError> {
        self.opt_text(col)?.ok_or_else(|| null(col))
    }
}

pub(super) fn null(col: usize) -> MetaError {
    MetaError::Corrupt(format!("column {col} is NULL"))
}

pub(super) fn upload_from_row(r: &impl SqlRow) -> Result<Upload, MetaError> {
    let state = r.text(5)?;
    Ok(Upload {
        id: UploadId::new(r.int(0)?),
        repository: RepoId::new(r.text(1)?),
        scope: Scope::new(r.text(2)?),
        key: r.text(3)?,
        version: r.text(4)?,
        state: UploadState::parse(&state)
            .ok_or_else(|| MetaError::Corrupt(format!("upload state {state:?}")))?,
        created_at: r.int(6)?,
        revision: r.int(7)?,
        written_by: provenance_from_row(r, 8)?,
    })
}

/// A writer's columns from `first` on: kind, issuer, subject, run, job, address; `None` when
/// the kind is empty (written before hoard recorded it).
fn provenance_from_row(r: &impl SqlRow, first: usize) -> Result<Option<Provenance>, MetaError> {
    let kind = r.text(first)?;
    if kind.is_empty() {
        return Ok(None);
    }
    let kind: CallerKind = kind
        .parse()
        .map_err(|e: crate::model::InvalidInput| MetaError::Corrupt(e.0))?;
    Ok(Some(Provenance {
        kind,
        issuer: r.text(first + 1)?,
        subject: r.text(first + 2)?,
        run_id: r.text(first + 3)?,
        job_id: r.text(first + 4)?,
        address: r.text(first + 5)?,
    }))
}

/// The columns a provenance is stored in, for statements that write it: kind (empty when not
/// recorded), issuer, subject, run, job, address.
pub(super) fn provenance_columns(p: Option<&Provenance>) -> [&str; 6] {
    match p {
        Some(p) => [
            p.kind.as_str(),
            &p.issuer,
            &p.subject,
            &p.run_id,
            &p.job_id,
            &p.address,
        ],
        None => [""; 6],
    }
}

/// An entry from its columns: id, repository, scope, key, version, size, created, last used, hits.
pub(super) fn entry_from_row(r: &impl SqlRow) -> Result<Entry, MetaError> {
    Ok(Entry {
        id: EntryId::new(r.int(0)?),
        repository: RepoId::new(r.text(1)?),
        scope: Scope::new(r.text(2)?),
        key: r.text(3)?,
        version: r.text(4)?,
        size: r.int(5)?.max(0) as u64,
        created_at: r.int(6)?,
        last_used_at: r.int(7)?,
        hits: r.int(8)?.max(0) as u64,
    })
}

/// A repository's [`crate::model::QuotaUsage`] row: bytes, pull-request and tag bytes.
pub(super) const QUOTA_USAGE: &str =
    "SELECT bytes, pr_bytes FROM repository_usage WHERE repository = ?";

/// The [`crate::model::QuotaUsage`] of a [`QUOTA_USAGE`] row (none: nothing held).
pub(super) fn quota_usage_from_row(
    r: Option<&impl SqlRow>,
) -> Result<crate::model::QuotaUsage, MetaError> {
    let Some(r) = r else {
        return Ok(crate::model::QuotaUsage::default());
    };
    Ok(crate::model::QuotaUsage {
        bytes: r.int(0)?.max(0) as u64,
        pr_bytes: r.int(1)?.max(0) as u64,
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

/// The least recently used entries of one class of a repository (repository, class, limit).
pub(super) const CLASS_LRU: &str =
    "SELECT id, repository, size, created_at, last_used_at, family, ref_class FROM entries
     WHERE repository = ? AND scope_class = ? ORDER BY last_used_at, id LIMIT ?";

/// The columns [`use_from_row`] reads.
pub(super) const USE_COLS: &str =
    "SELECT id, repository, size, created_at, last_used_at, family, ref_class FROM entries";

pub(super) fn use_from_row(r: &impl SqlRow) -> Result<EntryUse, MetaError> {
    Ok(EntryUse {
        id: EntryId::new(r.int(0)?),
        repository: RepoId::new(r.text(1)?),
        size: r.int(2)?.max(0) as u64,
        created_at: r.int(3)?,
        last_used_at: r.int(4)?,
        family: r.text(5)?,
        ref_class: crate::model::RefClass::from_code(r.int(6)?),
    })
}

pub(super) fn names_from_rows(rows: &[impl SqlRow]) -> Result<Vec<BlobName>, MetaError> {
    let mut names = Vec::with_capacity(rows.len());
    for row in rows {
        names.extend(BlobName::parse(&row.text(0)?));
    }
    Ok(names)
}

/// A chunk from its columns, from `first` on: blob name, size, SHA-256, XXH3.
pub(super) fn chunk_from_row(r: &impl SqlRow, first: usize) -> Result<Chunk, MetaError> {
    let digest = r.opt_bytes(first + 2)?.ok_or_else(|| null(first + 2))?;
    chunk_from_parts(
        r.text(first)?,
        r.int(first + 1)?,
        digest,
        r.opt_int(first + 3)?,
    )
}

/// A row of a listing statement (`LISTED_COLUMNS`).
pub(super) fn listed_from_row(r: &impl SqlRow) -> Result<super::ListedEntry, MetaError> {
    Ok(super::ListedEntry {
        entry: entry_from_row(r)?,
        repository_name: r.text(9)?,
        written_by: provenance_from_row(r, 10)?,
        digest: r.text(16)?,
    })
}

/// A `repository_usage` row: repository, name, bytes, entries, hits, misses, pull-request and
/// tag bytes and entries.
pub(super) fn repository_from_row(r: &impl SqlRow) -> Result<super::RepositoryUsage, MetaError> {
    let count = |col| Ok::<_, MetaError>(r.int(col)?.max(0) as u64);
    Ok(super::RepositoryUsage {
        repository: RepoId::new(r.text(0)?),
        name: r.text(1)?,
        bytes: count(2)?,
        entries: count(3)?,
        hits: count(4)?,
        misses: count(5)?,
        pr_bytes: count(6)?,
        pr_entries: count(7)?,
    })
}

/// A lookup's candidate: id, scope, key, folded key, created, size.
pub(super) fn candidate_from_row(r: &impl SqlRow) -> Result<crate::model::Candidate, MetaError> {
    Ok(crate::model::Candidate {
        id: crate::model::EntryId::new(r.int(0)?),
        scope: Scope::new(r.text(1)?),
        key: r.text(2)?,
        key_folded: r.text(3)?,
        created_at: r.int(4)?,
        size: r.int(5)?.max(0) as u64,
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
