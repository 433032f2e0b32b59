-- Restore records are bounded per repository (--max-restore-records-per-repository): the
-- maintenance pass counts them per repository and drops each one's oldest by this index.
CREATE INDEX restores_by_repository ON restores (repository, last_at);
