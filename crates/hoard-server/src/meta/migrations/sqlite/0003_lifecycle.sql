-- Lifecycle: eviction order, expiry, bytes per repository, deferred deletion, quarantine.

-- Least recently used first, within a repository (quota) and across all (global limits,
-- unused expiry); oldest first (maximum age).
CREATE INDEX entries_by_use ON entries (repository, last_used_at, id);
CREATE INDEX entries_by_last_use ON entries (last_used_at, id);
CREATE INDEX entries_by_creation ON entries (created_at);
-- Abandoned uploads and old upload records, across repositories.
CREATE INDEX uploads_by_state ON uploads (state, created_at);
-- Whether a chunk is referenced (orphan collection).
CREATE INDEX entry_chunks_by_blob ON entry_chunks (blob_name);
CREATE INDEX staged_blocks_by_blob ON staged_blocks (blob_name);
CREATE INDEX upload_parts_by_blob ON upload_parts (blob_name);

-- Bytes and entries per repository, kept by the statements that add and remove entries, so a
-- quota check is one row whatever the repository holds.
CREATE TABLE repository_usage (
    repository  TEXT    PRIMARY KEY,
    bytes       INTEGER NOT NULL,
    entries     INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO repository_usage (repository, bytes, entries)
    SELECT repository, SUM(size), COUNT(*) FROM entries GROUP BY repository;

-- Chunks of removed entries, deleted once no reader can still be streaming them.
CREATE TABLE pending_deletions (
    blob_name  TEXT    PRIMARY KEY,
    size       INTEGER NOT NULL,
    delete_at  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX pending_deletions_due ON pending_deletions (delete_at);

-- Entries removed because a chunk was damaged or missing: the audit trail.
CREATE TABLE quarantine (
    id              INTEGER PRIMARY KEY,
    entry_id        INTEGER NOT NULL,
    repository      TEXT    NOT NULL,
    scope           TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    version         TEXT    NOT NULL,
    size            INTEGER NOT NULL,
    reason          TEXT    NOT NULL,
    quarantined_at  INTEGER NOT NULL
);

-- A fast checksum of each chunk (XXH3-64), checked by every download; NULL for chunks recorded
-- before this version, which downloads check against their SHA-256.
ALTER TABLE staged_blocks ADD COLUMN xxh3 INTEGER;
ALTER TABLE upload_parts ADD COLUMN xxh3 INTEGER;
ALTER TABLE entry_chunks ADD COLUMN xxh3 INTEGER;
