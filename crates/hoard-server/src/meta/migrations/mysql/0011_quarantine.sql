-- Quarantine (issue #42): an entry taken out of every lookup, as a deletion does, whose row, chunks
-- and bytes are kept for examination until the quarantine retention ends (or it is released).
-- Its own tables, so that its slot is free for a new save at once and no lookup statement
-- needs to know about it. Ids stay unique across both: entry ids are never reused. LIKE copies
-- the columns and indexes (not the foreign key); a slot may be quarantined more than once.
CREATE TABLE quarantined_entries LIKE entries
;
ALTER TABLE quarantined_entries
    DROP INDEX entries_one_per_slot,
    MODIFY id BIGINT NOT NULL,
    ADD COLUMN quarantine_reason BLOB   NOT NULL,
    ADD COLUMN quarantined_at    BIGINT NOT NULL DEFAULT 0,
    ADD INDEX quarantined_entries_by_time (quarantined_at, id)
;
CREATE TABLE quarantined_chunks LIKE entry_chunks
