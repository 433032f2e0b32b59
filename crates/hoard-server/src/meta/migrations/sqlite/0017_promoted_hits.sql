-- Hits served by promoted entries (issue #58), counted per family and hour beside the hits they
-- are part of: what promotion saved. Rows written before count none.
ALTER TABLE family_stats ADD COLUMN promoted_hits INTEGER NOT NULL DEFAULT 0;
ALTER TABLE server_stats ADD COLUMN promoted_hits INTEGER NOT NULL DEFAULT 0;
