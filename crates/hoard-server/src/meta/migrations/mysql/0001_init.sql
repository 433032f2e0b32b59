-- hoard's metadata on MySQL 8 and MariaDB 10.11+. Every string a lookup compares is VARBINARY
-- or BLOB: byte-wise, not folded for case or accents, trailing spaces significant, whatever the
-- server's default collation. `bucket` is SHA-256 of (repository, version, scope) and
-- `slot_hash` adds the folded key: fixed-size index keys within InnoDB's 3072-byte limit.
-- There are no partial indexes: `open_slot` is the slot hash while an upload is open and NULL
-- otherwise, and NULLs do not collide in a unique index. Statements are separated by lines
-- holding only `;`, because MySQL runs one statement per call.

CREATE TABLE uploads (
    id          BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    repository  VARBINARY(255) NOT NULL,
    scope       BLOB          NOT NULL,
    `key`       BLOB          NOT NULL,
    key_folded  BLOB          NOT NULL,
    version     BLOB          NOT NULL,
    slot_hash   BINARY(32)    NOT NULL,
    state       VARCHAR(16)   CHARACTER SET ascii NOT NULL,
    open_slot   BINARY(32)    AS (IF(state = 'open', slot_hash, NULL)) STORED,
    created_by  BLOB          NOT NULL,
    created_at  BIGINT        NOT NULL,
    updated_at  BIGINT        NOT NULL,
    revision    BIGINT        NOT NULL DEFAULT 0,
    entry_id    BIGINT,
    UNIQUE KEY uploads_one_open (open_slot),
    KEY uploads_by_slot (slot_hash, state, id),
    KEY uploads_open_by_repository (repository, state, created_at)
) ENGINE = InnoDB
;
CREATE TABLE staged_blocks (
    upload_id  BIGINT         NOT NULL,
    block_id   VARBINARY(1024) NOT NULL,
    blob_name  VARCHAR(64)    CHARACTER SET ascii NOT NULL,
    size       BIGINT         NOT NULL,
    sha256     BINARY(32)     NOT NULL,
    PRIMARY KEY (upload_id, block_id),
    FOREIGN KEY (upload_id) REFERENCES uploads (id)
) ENGINE = InnoDB
;
CREATE TABLE upload_parts (
    upload_id  BIGINT         NOT NULL,
    ordinal    INT            NOT NULL,
    block_id   VARBINARY(1024) NOT NULL,
    blob_name  VARCHAR(64)    CHARACTER SET ascii NOT NULL,
    size       BIGINT         NOT NULL,
    sha256     BINARY(32)     NOT NULL,
    PRIMARY KEY (upload_id, ordinal),
    FOREIGN KEY (upload_id) REFERENCES uploads (id)
) ENGINE = InnoDB
;
CREATE TABLE entries (
    id            BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    repository    VARBINARY(255) NOT NULL,
    scope         BLOB           NOT NULL,
    `key`         BLOB           NOT NULL,
    key_folded    VARBINARY(2560) NOT NULL,
    version       BLOB           NOT NULL,
    bucket        BINARY(32)     NOT NULL,
    slot_hash     BINARY(32)     NOT NULL,
    size          BIGINT         NOT NULL,
    chunk_count   INT            NOT NULL,
    created_at    BIGINT         NOT NULL,
    last_used_at  BIGINT         NOT NULL,
    hits          BIGINT         NOT NULL DEFAULT 0,
    UNIQUE KEY entries_one_per_slot (slot_hash),
    KEY entries_lookup (bucket, key_folded),
    KEY entries_by_creation (created_at)
) ENGINE = InnoDB
;
CREATE TABLE entry_chunks (
    entry_id   BIGINT        NOT NULL,
    ordinal    INT           NOT NULL,
    start      BIGINT        NOT NULL,
    blob_name  VARCHAR(64)   CHARACTER SET ascii NOT NULL,
    size       BIGINT        NOT NULL,
    sha256     BINARY(32)    NOT NULL,
    PRIMARY KEY (entry_id, ordinal),
    FOREIGN KEY (entry_id) REFERENCES entries (id) ON DELETE CASCADE
) ENGINE = InnoDB
