-- Read-through (issue #59): an entry hoard stored on a local miss from the upstream cache
-- (`--upstream-cache`, such as GitHub's) names where it was read from; empty for every other
-- entry. Quarantine keeps it.
ALTER TABLE entries ADD COLUMN read_through TEXT NOT NULL DEFAULT '';
ALTER TABLE quarantined_entries ADD COLUMN read_through TEXT NOT NULL DEFAULT '';
