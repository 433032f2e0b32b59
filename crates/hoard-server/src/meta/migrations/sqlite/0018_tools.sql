-- Build-tool objects (issue #60): an entry written through a build tool's own protocol (Turborepo's
-- remote cache API first) names its tool, and keeps the headers the tool sent with the object
-- that it reads back with it (Turborepo's `x-artifact-duration` and `x-artifact-tag`), one
-- `name: value` per line. Both empty for an Actions cache entry. Quarantine keeps them.
ALTER TABLE entries ADD COLUMN tool TEXT NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN tool_headers TEXT NOT NULL DEFAULT '';
ALTER TABLE quarantined_entries ADD COLUMN tool TEXT NOT NULL DEFAULT '';
ALTER TABLE quarantined_entries ADD COLUMN tool_headers TEXT NOT NULL DEFAULT '';
