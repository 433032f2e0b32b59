-- What operators see per repository: its name (owner/name, from the token's `repository`
-- claim or the forge), and its restores and misses since it was first seen.
ALTER TABLE repository_usage ADD COLUMN name TEXT NOT NULL DEFAULT '';
ALTER TABLE repository_usage ADD COLUMN hits INTEGER NOT NULL DEFAULT 0;
ALTER TABLE repository_usage ADD COLUMN misses INTEGER NOT NULL DEFAULT 0;
UPDATE repository_usage SET hits = (
    SELECT COALESCE(SUM(hits), 0) FROM entries WHERE entries.repository = repository_usage.repository
);
