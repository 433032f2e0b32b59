-- Promotion (issue #58): an entry made readable in another scope of its repository (a merge
-- queue's entries in its base branch, a merged pull request's), as a new entry over the same
-- chunks, no byte copied. It records where it came from: the scope of the entry it copies, what
-- promoted it (a webhook delivery's id, or `admin:<operator>`) and why (`merge_group:<ref>`,
-- `pull_request:<number>`, empty by hand). Empty for every other entry. Quarantine keeps them.
ALTER TABLE entries
    ADD COLUMN promoted_from VARBINARY(1024) NOT NULL DEFAULT '',
    ADD COLUMN promoted_by   VARBINARY(255) NOT NULL DEFAULT '',
    ADD COLUMN promoted_for  VARBINARY(1024) NOT NULL DEFAULT ''
;
ALTER TABLE quarantined_entries
    ADD COLUMN promoted_from VARBINARY(1024) NOT NULL DEFAULT '',
    ADD COLUMN promoted_by   VARBINARY(255) NOT NULL DEFAULT '',
    ADD COLUMN promoted_for  VARBINARY(1024) NOT NULL DEFAULT ''
;
