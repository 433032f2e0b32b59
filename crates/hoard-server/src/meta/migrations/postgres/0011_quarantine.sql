-- Quarantine (issue #42): an entry taken out of every lookup, as a deletion does, whose row, chunks
-- and bytes are kept for examination until the quarantine retention ends (or it is released).
-- Its own tables, so that its slot is free for a new save at once and no lookup statement
-- needs to know about it. Ids stay unique across both: entry ids are never reused.
CREATE TABLE quarantined_entries (LIKE entries);
ALTER TABLE quarantined_entries
    ADD PRIMARY KEY (id),
    ADD COLUMN quarantine_reason TEXT   NOT NULL DEFAULT '',
    ADD COLUMN quarantined_at    BIGINT NOT NULL DEFAULT 0;
CREATE INDEX quarantined_entries_by_time ON quarantined_entries (quarantined_at, id);

-- With the primary key and the index by blob name (whether a chunk is referenced).
CREATE TABLE quarantined_chunks (LIKE entry_chunks INCLUDING INDEXES);
