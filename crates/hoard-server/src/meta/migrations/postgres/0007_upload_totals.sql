-- How many blocks an upload has staged and their bytes, kept by every change to its staged
-- blocks in the same statement, so that a Put Block checks Azure's count and the entry size
-- limit on one row instead of reading every staged block.
ALTER TABLE uploads
    ADD COLUMN staged_count BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN staged_bytes BIGINT NOT NULL DEFAULT 0;
UPDATE uploads SET staged_count = t.n, staged_bytes = t.bytes
    FROM (SELECT upload_id, COUNT(*) AS n, SUM(size) AS bytes FROM staged_blocks GROUP BY upload_id) AS t
    WHERE uploads.id = t.upload_id;
