-- Writes and lookups the write policy refused, counted per family and hour beside hits and
-- misses (issue #42). Rows written before count none.
ALTER TABLE family_stats ADD COLUMN refused_writes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE family_stats ADD COLUMN refused_reads INTEGER NOT NULL DEFAULT 0;
ALTER TABLE server_stats ADD COLUMN refused_writes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE server_stats ADD COLUMN refused_reads INTEGER NOT NULL DEFAULT 0;
