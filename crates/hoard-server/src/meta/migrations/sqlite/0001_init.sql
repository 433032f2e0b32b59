-- Reservations: one per CreateCacheEntry. Only one may be open per identity.
CREATE TABLE uploads (
    id          INTEGER PRIMARY KEY,
    repository  TEXT    NOT NULL,
    scope       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    key_folded  TEXT    NOT NULL,
    version     TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('open', 'finalized', 'aborted')),
    created_by  TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    entry_id    INTEGER
);
CREATE UNIQUE INDEX uploads_one_open
    ON uploads (repository, scope, key_folded, version) WHERE state = 'open';
CREATE INDEX uploads_by_identity ON uploads (repository, scope, key_folded, version, state);
CREATE INDEX uploads_open_by_repository ON uploads (repository, state, created_at);

-- Blocks received by Put Block (or Put Blob, under the empty id) and not yet committed.
CREATE TABLE staged_blocks (
    upload_id  INTEGER NOT NULL REFERENCES uploads (id),
    block_id   BLOB    NOT NULL,
    blob_name  TEXT    NOT NULL,
    size       INTEGER NOT NULL,
    sha256     BLOB    NOT NULL,
    PRIMARY KEY (upload_id, block_id)
);

-- The committed block list of an upload, in order.
CREATE TABLE upload_parts (
    upload_id  INTEGER NOT NULL REFERENCES uploads (id),
    ordinal    INTEGER NOT NULL,
    block_id   BLOB    NOT NULL,
    blob_name  TEXT    NOT NULL,
    size       INTEGER NOT NULL,
    sha256     BLOB    NOT NULL,
    PRIMARY KEY (upload_id, ordinal)
);

-- Visible entries: only ever inserted by finalize, together with all their chunks.
CREATE TABLE entries (
    id            INTEGER PRIMARY KEY,
    repository    TEXT    NOT NULL,
    scope         TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    key_folded    TEXT    NOT NULL,
    version       TEXT    NOT NULL,
    size          INTEGER NOT NULL,
    chunk_count   INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    last_used_at  INTEGER NOT NULL,
    hits          INTEGER NOT NULL DEFAULT 0
);
-- Identity, and the index behind exact and prefix lookups (key_folded ranges).
CREATE UNIQUE INDEX entries_identity ON entries (repository, version, scope, key_folded);

CREATE TABLE entry_chunks (
    entry_id   INTEGER NOT NULL REFERENCES entries (id),
    ordinal    INTEGER NOT NULL,
    start      INTEGER NOT NULL,
    blob_name  TEXT    NOT NULL,
    size       INTEGER NOT NULL,
    sha256     BLOB    NOT NULL,
    PRIMARY KEY (entry_id, ordinal)
);
