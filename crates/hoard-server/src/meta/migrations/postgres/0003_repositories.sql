-- What operators see per repository: its name (owner/name, from the token's `repository`
-- claim or the forge), and its restores and misses since it was first seen.
ALTER TABLE repository_usage
    ADD COLUMN name   TEXT   NOT NULL DEFAULT '',
    ADD COLUMN hits   BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN misses BIGINT NOT NULL DEFAULT 0;
UPDATE repository_usage SET hits = (
    SELECT COALESCE(SUM(hits), 0) FROM entries WHERE entries.repository = repository_usage.repository
);
