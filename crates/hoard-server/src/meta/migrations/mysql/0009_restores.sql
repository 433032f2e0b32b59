-- Who restored each entry: one row per entry and reader, the entry's writer copied so that the
-- row outlives the entry (no foreign key). Binary strings, as everywhere here; readers are
-- told apart by a hash of their columns, which together are too long for a unique index.
CREATE TABLE restores (
    id              BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    entry_id        BIGINT         NOT NULL,
    repository      VARBINARY(255) NOT NULL,
    scope           BLOB           NOT NULL,
    `key`           BLOB           NOT NULL,
    written_at      BIGINT         NOT NULL,
    writer_kind     VARBINARY(16)  NOT NULL,
    writer_issuer   VARBINARY(255) NOT NULL,
    writer_subject  VARBINARY(255) NOT NULL,
    writer_run_id   VARBINARY(255) NOT NULL,
    writer_job_id   VARBINARY(255) NOT NULL,
    writer_address  VARBINARY(255) NOT NULL,
    reader_hash     BINARY(32)     NOT NULL,
    reader_kind     VARBINARY(16)  NOT NULL,
    reader_issuer   VARBINARY(255) NOT NULL,
    reader_subject  VARBINARY(255) NOT NULL,
    reader_run_id   VARBINARY(255) NOT NULL,
    reader_job_id   VARBINARY(255) NOT NULL,
    reader_address  VARBINARY(255) NOT NULL,
    first_at        BIGINT         NOT NULL,
    last_at         BIGINT         NOT NULL,
    count           BIGINT         NOT NULL,
    UNIQUE KEY restores_by_reader (entry_id, reader_hash),
    KEY restores_by_entry (entry_id, last_at),
    KEY restores_by_writer_run (writer_run_id),
    KEY restores_by_last (last_at)
) ENGINE = InnoDB
;
