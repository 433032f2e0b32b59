-- Who restored each entry (docs/security.md, "Which jobs restored it"): one row per entry and
-- reader, with the entry's writer copied so that the row outlives the entry. No foreign key:
-- a purge or quarantine of the entry keeps its records.
CREATE TABLE restores (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    entry_id        INTEGER NOT NULL,
    repository      TEXT    NOT NULL,
    scope           TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    written_at      INTEGER NOT NULL,
    writer_kind     TEXT    NOT NULL,
    writer_issuer   TEXT    NOT NULL,
    writer_subject  TEXT    NOT NULL,
    writer_run_id   TEXT    NOT NULL,
    writer_job_id   TEXT    NOT NULL,
    writer_address  TEXT    NOT NULL,
    reader_hash     BLOB    NOT NULL,
    reader_kind     TEXT    NOT NULL,
    reader_issuer   TEXT    NOT NULL,
    reader_subject  TEXT    NOT NULL,
    reader_run_id   TEXT    NOT NULL,
    reader_job_id   TEXT    NOT NULL,
    reader_address  TEXT    NOT NULL,
    first_at        INTEGER NOT NULL,
    last_at         INTEGER NOT NULL,
    count           INTEGER NOT NULL
);
CREATE UNIQUE INDEX restores_by_reader ON restores (entry_id, reader_hash);
CREATE INDEX restores_by_entry ON restores (entry_id, last_at);
CREATE INDEX restores_by_writer_run ON restores (writer_run_id);
CREATE INDEX restores_by_last ON restores (last_at);
