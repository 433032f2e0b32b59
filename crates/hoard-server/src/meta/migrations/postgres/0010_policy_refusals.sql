-- Writes and lookups the write policy refused, counted per family and hour beside hits and
-- misses (issue #42). Rows written before count none.
ALTER TABLE family_stats
    ADD COLUMN refused_writes BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN refused_reads  BIGINT NOT NULL DEFAULT 0;
ALTER TABLE server_stats
    ADD COLUMN refused_writes BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN refused_reads  BIGINT NOT NULL DEFAULT 0;
