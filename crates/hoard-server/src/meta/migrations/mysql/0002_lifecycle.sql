-- Lifecycle: eviction order, expiry, bytes per repository, deferred deletion, quarantine.
-- Least recently used first, within a repository (quota) and across all (global limits,
-- unused expiry); abandoned uploads across repositories; whether a chunk is referenced.

CREATE INDEX entries_by_use ON entries (repository, last_used_at, id)
;
CREATE INDEX entries_by_last_use ON entries (last_used_at, id)
;
CREATE INDEX uploads_by_state ON uploads (state, created_at)
;
CREATE INDEX entry_chunks_by_blob ON entry_chunks (blob_name)
;
CREATE INDEX staged_blocks_by_blob ON staged_blocks (blob_name)
;
CREATE INDEX upload_parts_by_blob ON upload_parts (blob_name)
;
-- Bytes and entries per repository, kept by the statements that add and remove entries.
CREATE TABLE repository_usage (
    repository  VARBINARY(255) NOT NULL PRIMARY KEY,
    bytes       BIGINT         NOT NULL,
    entries     BIGINT         NOT NULL
) ENGINE = InnoDB
;
INSERT INTO repository_usage (repository, bytes, entries)
    SELECT repository, SUM(size), COUNT(*) FROM entries GROUP BY repository
;
-- Chunks of removed entries, deleted once no reader can still be streaming them.
CREATE TABLE pending_deletions (
    blob_name  VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,
    size       BIGINT      NOT NULL,
    delete_at  BIGINT      NOT NULL,
    KEY pending_deletions_due (delete_at)
) ENGINE = InnoDB
;
-- Entries removed because a chunk was damaged or missing: the audit trail.
CREATE TABLE quarantine (
    id              BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    entry_id        BIGINT         NOT NULL,
    repository      VARBINARY(255) NOT NULL,
    scope           BLOB           NOT NULL,
    `key`           BLOB           NOT NULL,
    version         BLOB           NOT NULL,
    size            BIGINT         NOT NULL,
    reason          TEXT           NOT NULL,
    quarantined_at  BIGINT         NOT NULL
) ENGINE = InnoDB

;
-- A fast checksum of each chunk (XXH3-64), checked by every download; NULL for chunks recorded
-- before this version, which downloads check against their SHA-256.
ALTER TABLE staged_blocks ADD COLUMN xxh3 BIGINT NULL
;
ALTER TABLE upload_parts ADD COLUMN xxh3 BIGINT NULL
;
ALTER TABLE entry_chunks ADD COLUMN xxh3 BIGINT NULL
