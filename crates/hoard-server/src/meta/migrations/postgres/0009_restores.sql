-- Who restored each entry: one row per entry and reader, the entry's writer copied so that the
-- row outlives the entry (no foreign key).
CREATE TABLE restores (
    id              BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entry_id        BIGINT  NOT NULL,
    repository      TEXT    COLLATE "C" NOT NULL,
    scope           TEXT    COLLATE "C" NOT NULL,
    key             TEXT    COLLATE "C" NOT NULL,
    written_at      BIGINT  NOT NULL,
    writer_kind     TEXT    NOT NULL,
    writer_issuer   TEXT    NOT NULL,
    writer_subject  TEXT    COLLATE "C" NOT NULL,
    writer_run_id   TEXT    COLLATE "C" NOT NULL,
    writer_job_id   TEXT    NOT NULL,
    writer_address  TEXT    NOT NULL,
    reader_hash     BYTEA   NOT NULL,
    reader_kind     TEXT    NOT NULL,
    reader_issuer   TEXT    NOT NULL,
    reader_subject  TEXT    NOT NULL,
    reader_run_id   TEXT    NOT NULL,
    reader_job_id   TEXT    NOT NULL,
    reader_address  TEXT    NOT NULL,
    first_at        BIGINT  NOT NULL,
    last_at         BIGINT  NOT NULL,
    count           BIGINT  NOT NULL
);
CREATE UNIQUE INDEX restores_by_reader ON restores (entry_id, reader_hash);
CREATE INDEX restores_by_entry ON restores (entry_id, last_at);
CREATE INDEX restores_by_writer_run ON restores (writer_run_id);
CREATE INDEX restores_by_last ON restores (last_at);
