-- Entry ids are never reused: `AUTOINCREMENT` keeps the largest id ever given in
-- sqlite_sequence, where a plain INTEGER PRIMARY KEY gives the next entry the id of a deleted
-- newest one (so `hoard caches show 5` after a purge showed another entry, and audit lines
-- before and after it named two entries by one id). SQLite cannot add AUTOINCREMENT to a table,
-- so the table is made anew with the same columns and indexes (foreign keys are off while
-- migrations run). The sequence starts past every id hoard ever handed out that is still
-- named somewhere: in entries, uploads and the quarantine.
CREATE TABLE entries_new (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    repository    TEXT    NOT NULL,
    scope         TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    key_folded    TEXT    NOT NULL,
    version       TEXT    NOT NULL,
    size          INTEGER NOT NULL,
    chunk_count   INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    last_used_at  INTEGER NOT NULL,
    hits          INTEGER NOT NULL DEFAULT 0,
    writer_kind    TEXT NOT NULL DEFAULT '',
    writer_issuer  TEXT NOT NULL DEFAULT '',
    writer_subject TEXT NOT NULL DEFAULT '',
    writer_run_id  TEXT NOT NULL DEFAULT '',
    writer_job_id  TEXT NOT NULL DEFAULT '',
    writer_address TEXT NOT NULL DEFAULT '',
    digest         TEXT NOT NULL DEFAULT '',
    scope_class    INTEGER NOT NULL DEFAULT 0,
    family         TEXT NOT NULL DEFAULT '',
    ref_class      INTEGER NOT NULL DEFAULT 1
);
INSERT INTO entries_new (id, repository, scope, key, key_folded, version, size, chunk_count,
                         created_at, last_used_at, hits, writer_kind, writer_issuer,
                         writer_subject, writer_run_id, writer_job_id, writer_address, digest,
                         scope_class, family, ref_class)
    SELECT id, repository, scope, key, key_folded, version, size, chunk_count,
           created_at, last_used_at, hits, writer_kind, writer_issuer,
           writer_subject, writer_run_id, writer_job_id, writer_address, digest,
           scope_class, family, ref_class
    FROM entries;
DROP TABLE entries;
ALTER TABLE entries_new RENAME TO entries;
CREATE UNIQUE INDEX entries_identity ON entries (repository, version, scope, key_folded);
CREATE INDEX entries_by_use ON entries (repository, last_used_at, id);
CREATE INDEX entries_by_last_use ON entries (last_used_at, id);
CREATE INDEX entries_by_creation ON entries (created_at);
CREATE INDEX entries_by_class_use ON entries (repository, scope_class, last_used_at, id);
CREATE INDEX entries_awaiting_digest ON entries (id) WHERE digest = '';
DELETE FROM sqlite_sequence WHERE name = 'entries';
INSERT INTO sqlite_sequence (name, seq) VALUES ('entries', (
    SELECT MAX(m) FROM (
        SELECT COALESCE(MAX(id), 0) AS m FROM entries
        UNION ALL SELECT COALESCE(MAX(entry_id), 0) FROM uploads
        UNION ALL SELECT COALESCE(MAX(entry_id), 0) FROM quarantine
    )
));
