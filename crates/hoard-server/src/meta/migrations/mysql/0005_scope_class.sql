-- Scope classes (`--pr-scope-share`): 1 for an entry of a pull request (`refs/pull/*`) or a tag
-- (`refs/tags/*`), 0 otherwise. New entries get the class the domain decided
-- (`model::ScopeClass`); the entries already stored are classified here once, by the same rule
-- (byte-wise prefixes of the binary scope, as `ScopeClass::of` compares them).
ALTER TABLE entries ADD COLUMN scope_class SMALLINT NOT NULL DEFAULT 0
;
UPDATE entries SET scope_class = 1
    WHERE SUBSTRING(scope, 1, 10) = 'refs/pull/' OR SUBSTRING(scope, 1, 10) = 'refs/tags/'
;
-- The least recently used entries of one class of a repository (its share and its quota).
CREATE INDEX entries_by_class_use ON entries (repository, scope_class, last_used_at, id)
;
-- Bytes and entries of pull requests and tags per repository, kept with `bytes` and `entries`.
ALTER TABLE repository_usage
    ADD COLUMN pr_bytes   BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN pr_entries BIGINT NOT NULL DEFAULT 0
;
UPDATE repository_usage SET
    pr_bytes = (SELECT COALESCE(SUM(size), 0) FROM entries
                WHERE entries.repository = repository_usage.repository AND scope_class = 1),
    pr_entries = (SELECT COUNT(*) FROM entries
                  WHERE entries.repository = repository_usage.repository AND scope_class = 1)
;
