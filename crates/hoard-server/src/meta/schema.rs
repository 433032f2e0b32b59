//! Every table hoard keeps, declared once (see `row.rs` for the [`table!`] macro): the typed row,
//! its columns and kinds, and the rows the domain's changes become. The SQL stores build their
//! INSERTs from these rows and read columns by the names declared here. `tests/meta_conformance`
//! checks, on every backend, that the migrations made
//! each declared column with its declared kind.
//!
//! A new column: a migration per database, a field here (and where the domain's value becomes
//! it, in the `from` functions below), and the record in `model` that shows it.

use super::dialect::Backend;
use super::hashes::{bucket, slot_hash};
use super::row::{table, Table};
use super::{EntryChunk, MetaError, NewEntry, NewUpload};
use crate::model::{
    BlockId, CallerKind, Chunk, Entry, EntryId, EntryRecord, ListedEntry, Millis, Promotion,
    Provenance, Quarantine, RepoId, Scope, Slot, ToolObject, UploadState,
};

table! {
    /// A reservation and, after its finalize, which entry it became.
    UploadRow in uploads {
        id: i64 = database,
        repository: String,
        scope: String,
        key: String,
        key_folded: String,
        version: String,
        slot_hash: Vec<u8> = networked,
        state: String,
        /// The writer's subject (the column is older than the other writer columns).
        created_by: String,
        created_at: i64,
        updated_at: i64,
        revision: i64 = database,
        entry_id: Option<i64> = database,
        writer_kind: String,
        writer_issuer: String,
        writer_run_id: String,
        writer_job_id: String,
        writer_address: String,
        /// The blocks staged and their bytes, kept by every change to them.
        staged_count: i64 = database,
        staged_bytes: i64 = database,
    }
}

table! {
    /// A block put and not yet committed by a block list (a retry replaces it).
    StagedBlockRow in staged_blocks {
        upload_id: i64,
        block_id: Vec<u8>,
        blob_name: String,
        size: i64,
        /// Empty until known (see [`Chunk::sha256`]).
        sha256: Vec<u8>,
        xxh3: Option<i64>,
    }
}

table! {
    /// A block of an upload's committed block list, in order.
    UploadPartRow in upload_parts {
        upload_id: i64,
        ordinal: i64,
        block_id: Vec<u8>,
        blob_name: String,
        size: i64,
        sha256: Vec<u8>,
        xxh3: Option<i64>,
    }
}

table! {
    /// A finalized cache entry: what lookups find.
    EntryRow in entries {
        id: i64 = database,
        repository: String,
        scope: String,
        key: String,
        key_folded: String,
        version: String,
        /// The networked stores' lookup index key ([`bucket`]).
        bucket: Vec<u8> = networked,
        /// The networked stores' unique key of the slot ([`slot_hash`]).
        slot_hash: Vec<u8> = networked,
        size: i64,
        chunk_count: i64,
        created_at: i64,
        last_used_at: i64,
        hits: i64 = database,
        writer_kind: String,
        writer_issuer: String,
        writer_subject: String,
        writer_run_id: String,
        writer_job_id: String,
        writer_address: String,
        /// See [`crate::model::entry_digest`]; empty until the digest pass records it.
        digest: String,
        scope_class: i64,
        family: String,
        ref_class: i64,
        /// A promoted entry's origin ([`crate::model::Promotion`]); empty for every other.
        promoted_from: String,
        promoted_by: String,
        promoted_for: String,
        /// A build tool's object ([`crate::model::ToolObject`]); empty for an Actions entry.
        tool: String,
        tool_headers: String,
        /// Where a read-through entry was read from; empty for every other.
        read_through: String,
    }
}

table! {
    /// An entry in quarantine: out of every lookup, kept with its chunks and bytes for
    /// examination until the retention ends or it is released. The columns of [`EntryRow`],
    /// copied as they were, and why and when.
    QuarantinedEntryRow in quarantined_entries {
        id: i64,
        repository: String,
        scope: String,
        key: String,
        key_folded: String,
        version: String,
        bucket: Vec<u8> = networked,
        slot_hash: Vec<u8> = networked,
        size: i64,
        chunk_count: i64,
        created_at: i64,
        last_used_at: i64,
        hits: i64,
        writer_kind: String,
        writer_issuer: String,
        writer_subject: String,
        writer_run_id: String,
        writer_job_id: String,
        writer_address: String,
        digest: String,
        scope_class: i64,
        family: String,
        ref_class: i64,
        quarantine_reason: String,
        quarantined_at: i64,
        promoted_from: String,
        promoted_by: String,
        promoted_for: String,
        /// A build tool's object ([`crate::model::ToolObject`]); empty for an Actions entry.
        tool: String,
        tool_headers: String,
        /// Where a read-through entry was read from; empty for every other.
        read_through: String,
    }
}

table! {
    /// A chunk of a quarantined entry: the columns of [`EntryChunkRow`].
    QuarantinedChunkRow in quarantined_chunks {
        entry_id: i64,
        ordinal: i64,
        start: i64,
        blob_name: String,
        size: i64,
        sha256: Vec<u8>,
        xxh3: Option<i64>,
    }
}

table! {
    /// A chunk of an entry, with its byte offset in the entry.
    EntryChunkRow in entry_chunks {
        entry_id: i64,
        ordinal: i64,
        start: i64,
        blob_name: String,
        size: i64,
        sha256: Vec<u8>,
        xxh3: Option<i64>,
    }
}

table! {
    /// A repository's usage and counts, kept by every change.
    RepositoryUsageRow in repository_usage {
        repository: String,
        bytes: i64,
        entries: i64,
        name: String,
        hits: i64,
        misses: i64,
        pr_bytes: i64,
        pr_entries: i64,
    }
}

table! {
    /// A chunk to delete once every download that may read it is over.
    PendingDeletionRow in pending_deletions {
        blob_name: String,
        size: i64,
        delete_at: i64,
    }
}

table! {
    /// An entry removed because a check found it damaged, by servers before quarantine kept
    /// entries ([`QuarantinedEntryRow`]): a record, no longer written.
    QuarantineRow in quarantine {
        id: i64 = database,
        entry_id: i64,
        repository: String,
        scope: String,
        key: String,
        version: String,
        size: i64,
        reason: String,
        quarantined_at: i64,
    }
}

table! {
    /// Counters of one repository's key family, ref class and hour (bucket 0) or day (1).
    FamilyStatsRow in family_stats {
        repository: String,
        family: String,
        ref_class: i64,
        bucket: i64,
        start_at: i64,
        lookups: i64,
        exact_hits: i64,
        restore_key_hits: i64,
        misses: i64,
        bytes_restored: i64,
        saves: i64,
        bytes_saved: i64,
        evicted: i64,
        expired: i64,
        quarantined: i64,
        deleted: i64,
        refused_writes: i64,
        refused_reads: i64,
        /// Hits (exact or by restore key) served by a promoted entry.
        promoted_hits: i64,
    }
}

table! {
    /// The server's counters per ref class and hour or day.
    ServerStatsRow in server_stats {
        ref_class: i64,
        bucket: i64,
        start_at: i64,
        lookups: i64,
        exact_hits: i64,
        restore_key_hits: i64,
        misses: i64,
        bytes_restored: i64,
        saves: i64,
        bytes_saved: i64,
        evicted: i64,
        expired: i64,
        quarantined: i64,
        deleted: i64,
        refused_writes: i64,
        refused_reads: i64,
        /// Hits (exact or by restore key) served by a promoted entry.
        promoted_hits: i64,
    }
}

table! {
    /// A key family counted on its own (the others count as one).
    StatsFamilyRow in stats_families {
        repository: String,
        family: String,
        created_at: i64,
    }
}

table! {
    /// One reader's restores of one entry, with the entry's writer copied from it: the record
    /// outlives the entry. `reader_hash` is [`reader_hash`] of the reader's six columns.
    RestoreRow in restores {
        id: i64 = database,
        entry_id: i64,
        repository: String,
        scope: String,
        key: String,
        written_at: i64,
        writer_kind: String,
        writer_issuer: String,
        writer_subject: String,
        writer_run_id: String,
        writer_job_id: String,
        writer_address: String,
        reader_hash: Vec<u8>,
        reader_kind: String,
        reader_issuer: String,
        reader_subject: String,
        reader_run_id: String,
        reader_job_id: String,
        reader_address: String,
        first_at: i64,
        last_at: i64,
        count: i64,
    }
}

/// The key that tells readers apart: SHA-256 over their six columns, length-prefixed (the
/// columns themselves are too long together for MySQL's unique indexes).
pub fn reader_hash(reader: &Provenance) -> Vec<u8> {
    let r = reader;
    let fields = [
        r.kind.as_str(),
        &r.issuer,
        &r.subject,
        &r.run_id,
        &r.job_id,
        &r.address,
    ];
    super::hashes::digest(&fields.map(str::as_bytes))
}

/// Columns one database has for its own use, which it fills and no row reads or writes: the
/// schema check accepts them there, and only there.
#[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
pub static DATABASE_OWN: [(Backend, &str, &str); 2] = [
    // A surrogate key for tools that need one (logical replication); the block list is
    // replaced whole, so (upload_id, ordinal) cannot be unique.
    (Backend::Postgres, "upload_parts", "id"),
    // The slot hash while the upload is open: a unique index on it stands in for the partial
    // unique index MySQL does not have.
    (Backend::MySql, "uploads", "open_slot"),
];

table! {
    /// A GitHub webhook delivery received (`X-GitHub-Delivery`): a redelivery is not applied
    /// twice.
    WebhookDeliveryRow in webhook_deliveries {
        delivery: String,
        received_at: i64,
    }
}

table! {
    /// What a webhook delivery said about a commit of a repository ([`crate::meta::RefKind`]),
    /// kept so that a merge group and the push that lands it meet, in either order.
    WebhookRefRow in webhook_refs {
        repository: String,
        sha: String,
        kind: i64,
        git_ref: String,
        base_ref: String,
        received_at: i64,
    }
}

/// Every declared table.
#[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
pub static TABLES: [&Table; 16] = [
    &uploads::TABLE,
    &staged_blocks::TABLE,
    &upload_parts::TABLE,
    &entries::TABLE,
    &entry_chunks::TABLE,
    &repository_usage::TABLE,
    &pending_deletions::TABLE,
    &quarantine::TABLE,
    &family_stats::TABLE,
    &server_stats::TABLE,
    &stats_families::TABLE,
    &restores::TABLE,
    &quarantined_entries::TABLE,
    &quarantined_chunks::TABLE,
    &webhook_deliveries::TABLE,
    &webhook_refs::TABLE,
];

/// A writer's six columns (kind, issuer, subject, run, job, address), empty when unknown.
pub(super) fn writer_columns(p: Option<&Provenance>) -> [String; 6] {
    match p {
        Some(p) => [
            p.kind.as_str().to_owned(),
            p.issuer.clone(),
            p.subject.clone(),
            p.run_id.clone(),
            p.job_id.clone(),
            p.address.clone(),
        ],
        None => Default::default(),
    }
}

impl UploadRow {
    /// The row a reservation inserts on `backend` (the networked columns only where it has
    /// them: their hashes cost a lookup's worth of work).
    pub fn from_new(new: &NewUpload<'_>, backend: Backend) -> Self {
        let slot = new.slot;
        let [writer_kind, writer_issuer, created_by, writer_run_id, writer_job_id, writer_address] =
            writer_columns(Some(new.written_by));
        Self {
            repository: slot.repository.as_str().to_owned(),
            scope: slot.scope.as_str().to_owned(),
            key: slot.key.as_str().to_owned(),
            key_folded: slot.key.folded(),
            version: slot.version.as_str().to_owned(),
            slot_hash: networked(backend, || slot_hash(slot)),
            state: UploadState::Open.as_str().to_owned(),
            created_by,
            created_at: new.now,
            updated_at: new.now,
            writer_kind,
            writer_issuer,
            writer_run_id,
            writer_job_id,
            writer_address,
            ..Self::default()
        }
    }
}

impl EntryRow {
    /// The row a finalize inserts on `backend` (its id and hits come from the database; the
    /// networked columns are filled only where the backend has them).
    pub fn from_new(new: &NewEntry<'_>, backend: Backend) -> Self {
        let (slot, record) = (new.slot, &new.record);
        let promotion = record.promotion.as_ref();
        let [writer_kind, writer_issuer, writer_subject, writer_run_id, writer_job_id, writer_address] =
            writer_columns(new.record.written_by.as_ref());
        Self {
            repository: slot.repository.as_str().to_owned(),
            scope: slot.scope.as_str().to_owned(),
            key: new.key.to_owned(),
            key_folded: slot.key.folded(),
            version: slot.version.as_str().to_owned(),
            bucket: networked(backend, || {
                bucket(&slot.repository, &slot.version, &slot.scope)
            }),
            slot_hash: networked(backend, || slot_hash(slot)),
            size: new.chunks.iter().map(|c| c.size).sum::<u64>() as i64,
            chunk_count: new.chunks.len() as i64,
            created_at: new.now,
            last_used_at: new.now,
            writer_kind,
            writer_issuer,
            writer_subject,
            writer_run_id,
            writer_job_id,
            writer_address,
            digest: record.digest.clone(),
            scope_class: new.scope_class.code(),
            family: new.family.to_owned(),
            ref_class: new.ref_class.code(),
            promoted_from: promotion.map_or("", |p| p.from_scope.as_str()).to_owned(),
            promoted_by: promotion.map_or("", |p| &p.by).to_owned(),
            promoted_for: promotion.map_or("", |p| &p.cause).to_owned(),
            tool: record
                .tool
                .as_ref()
                .map_or("", |t| t.tool.as_str())
                .to_owned(),
            tool_headers: record.tool.as_ref().map_or("", |t| &t.headers).to_owned(),
            read_through: record.read_through.clone().unwrap_or_default(),
            ..Self::default()
        }
    }

    /// The entry as an operator's listing shows it (read by [`EntryRow::read`]); the inverse of
    /// [`EntryRow::from_new`] for what a listing shows.
    pub fn listed(
        self,
        repository_name: String,
        quarantine: Option<Quarantine>,
    ) -> Result<ListedEntry, MetaError> {
        let written_by = writer_of([
            self.writer_kind,
            self.writer_issuer,
            self.writer_subject,
            self.writer_run_id,
            self.writer_job_id,
            self.writer_address,
        ])?;
        Ok(ListedEntry {
            entry: Entry {
                id: EntryId::new(self.id),
                repository: RepoId::new(self.repository),
                scope: Scope::new(self.scope),
                key: self.key,
                version: self.version,
                size: self.size.max(0) as u64,
                created_at: self.created_at,
                last_used_at: self.last_used_at,
                hits: self.hits.max(0) as u64,
            },
            repository_name,
            record: EntryRecord {
                written_by,
                digest: self.digest,
                promotion: (!self.promoted_by.is_empty()).then(|| Promotion {
                    from_scope: Scope::new(self.promoted_from),
                    by: self.promoted_by,
                    cause: self.promoted_for,
                }),
                tool: ToolObject::stored(self.tool, self.tool_headers),
                read_through: (!self.read_through.is_empty()).then_some(self.read_through),
            },
            quarantine,
        })
    }

    /// The row of an entry stored in bulk (`SqliteStore::import`): as a finalize with no writer,
    /// family or known ref would store it.
    pub fn imported(slot: &Slot, chunks: &[Chunk], at: Millis, backend: Backend) -> Self {
        let scope_class = crate::model::ScopeClass::of(&slot.scope);
        Self::from_new(
            &NewEntry {
                record: EntryRecord {
                    digest: crate::model::entry_digest(chunks).unwrap_or_default(),
                    ..EntryRecord::default()
                },
                scope_class,
                ref_class: crate::model::RefClass::OtherBranch,
                ..NewEntry::new(slot, chunks, at)
            },
            backend,
        )
    }
}

/// A writer from its columns in [`writer_columns`]' order; `None` when the kind is empty
/// (written before hoard recorded it).
pub(super) fn writer_of(
    [kind, issuer, subject, run_id, job_id, address]: [String; 6],
) -> Result<Option<Provenance>, MetaError> {
    if kind.is_empty() {
        return Ok(None);
    }
    let kind: CallerKind = kind
        .parse()
        .map_err(|e: crate::model::InvalidInput| MetaError::Corrupt(e.0))?;
    Ok(Some(Provenance {
        kind,
        issuer,
        subject,
        run_id,
        job_id,
        address,
    }))
}

/// `value()` on a backend whose tables have the networked columns, else nothing.
fn networked(backend: Backend, value: impl FnOnce() -> Vec<u8>) -> Vec<u8> {
    match backend {
        Backend::Sqlite => Vec::new(),
        Backend::Postgres | Backend::MySql => value(),
    }
}

/// A chunk's stored SHA-256: empty until the digest pass records it (MySQL's fixed-width column
/// pads that to 32 zero bytes, which reads back the same).
fn sha256_column(chunk: &Chunk) -> Vec<u8> {
    chunk.sha256.map_or_else(Vec::new, |d| d.to_vec())
}

/// A chunk's XXH3 as stored: the 64 bits as a signed integer.
fn xxh3_column(chunk: &Chunk) -> Option<i64> {
    chunk.xxh3.map(|v| v as i64)
}

impl EntryChunkRow {
    /// The rows of an entry's chunks, laid end to end.
    pub fn of_entry(entry_id: i64, chunks: &[Chunk]) -> Vec<Self> {
        EntryChunk::starts(chunks)
            .enumerate()
            .map(|(ordinal, (start, chunk))| Self {
                entry_id,
                ordinal: ordinal as i64,
                start: start as i64,
                blob_name: chunk.blob.as_str().to_owned(),
                size: chunk.size as i64,
                sha256: sha256_column(chunk),
                xxh3: xxh3_column(chunk),
            })
            .collect()
    }
}

impl StagedBlockRow {
    pub fn new(upload_id: i64, block: &BlockId, chunk: &Chunk) -> Self {
        Self {
            upload_id,
            block_id: block.as_bytes().to_vec(),
            blob_name: chunk.blob.as_str().to_owned(),
            size: chunk.size as i64,
            sha256: sha256_column(chunk),
            xxh3: xxh3_column(chunk),
        }
    }
}

impl UploadPartRow {
    /// The rows of a committed block list, in its order.
    pub fn of_list(upload_id: i64, parts: &[(BlockId, Chunk)]) -> Vec<Self> {
        parts
            .iter()
            .enumerate()
            .map(|(ordinal, (block, chunk))| Self {
                upload_id,
                ordinal: ordinal as i64,
                block_id: block.as_bytes().to_vec(),
                blob_name: chunk.blob.as_str().to_owned(),
                size: chunk.size as i64,
                sha256: sha256_column(chunk),
                xxh3: xxh3_column(chunk),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::row::{Param, Row};

    #[test]
    fn an_insert_names_the_written_columns_of_its_backend_in_declaration_order() {
        assert_eq!(
            pending_deletions::TABLE.insert(Backend::Postgres),
            "INSERT INTO pending_deletions (blob_name, size, delete_at) VALUES ($1, $2, $3)"
        );
        let sqlite = entries::TABLE.insert(Backend::Sqlite);
        assert!(!sqlite.contains("bucket") && !sqlite.contains(" id,") && !sqlite.contains("hits"));
        let mysql = entries::TABLE.insert(Backend::MySql);
        assert!(mysql.contains("`key`, `key_folded`") && mysql.contains("`bucket`"));
        let values = EntryRow::default().inserted_values(Backend::MySql);
        assert_eq!(values.len(), mysql.matches('?').count());
        let values = EntryRow::default().inserted_values(Backend::Sqlite);
        assert_eq!(values.len(), sqlite.matches('?').count());
        // In the INSERT's order: every value of the row whose column it names.
        let row = EntryRow {
            id: 3,
            key: "k".into(),
            size: 7,
            bucket: vec![1],
            digest: "d".into(),
            ..Default::default()
        };
        for backend in [Backend::Sqlite, Backend::Postgres, Backend::MySql] {
            let named: Vec<Param> = entries::TABLE
                .columns
                .iter()
                .zip(row.clone().into_values())
                .filter(|(column, _)| column.inserted_on(backend))
                .map(|(_, value)| value)
                .collect();
            assert_eq!(row.clone().inserted_values(backend), named, "{backend:?}");
        }
    }
}
