-- Quarantine (issue #42): an entry taken out of every lookup, as a deletion does, whose row, chunks
-- and bytes are kept for examination until the quarantine retention ends (or it is released).
-- Its own tables, so that its slot is free for a new save at once and no lookup statement
-- needs to know about it. Ids stay unique across both: entry ids are never reused (0010).
CREATE TABLE quarantined_entries (
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
    hits          INTEGER NOT NULL,
    writer_kind    TEXT NOT NULL,
    writer_issuer  TEXT NOT NULL,
    writer_subject TEXT NOT NULL,
    writer_run_id  TEXT NOT NULL,
    writer_job_id  TEXT NOT NULL,
    writer_address TEXT NOT NULL,
    digest         TEXT NOT NULL,
    scope_class    INTEGER NOT NULL,
    family         TEXT NOT NULL,
    ref_class      INTEGER NOT NULL,
    quarantine_reason TEXT    NOT NULL,
    quarantined_at    INTEGER NOT NULL
);
CREATE INDEX quarantined_entries_by_time ON quarantined_entries (quarantined_at, id);

CREATE TABLE quarantined_chunks (
    entry_id   INTEGER NOT NULL,
    ordinal    INTEGER NOT NULL,
    start      INTEGER NOT NULL,
    blob_name  TEXT    NOT NULL,
    size       INTEGER NOT NULL,
    sha256     BLOB    NOT NULL,
    xxh3       INTEGER,
    PRIMARY KEY (entry_id, ordinal)
) WITHOUT ROWID;
-- Whether a chunk is referenced (orphan collection).
CREATE INDEX quarantined_chunks_by_blob ON quarantined_chunks (blob_name);
