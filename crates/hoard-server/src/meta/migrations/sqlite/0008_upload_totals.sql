-- How many blocks an upload has staged and their bytes, kept by every change to its staged
-- blocks in the same transaction, so that a Put Block checks Azure's count and the entry size
-- limit on one row instead of reading every staged block.
ALTER TABLE uploads ADD COLUMN staged_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE uploads ADD COLUMN staged_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE uploads SET
    staged_count = (SELECT COUNT(*) FROM staged_blocks s WHERE s.upload_id = uploads.id),
    staged_bytes = (SELECT COALESCE(SUM(size), 0) FROM staged_blocks s WHERE s.upload_id = uploads.id)
    WHERE id IN (SELECT upload_id FROM staged_blocks);
