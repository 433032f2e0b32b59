-- Statistics by key family (issue #24). Each entry keeps the family and the ref class
-- (`model::RefClass` code: 0 default branch, 1 other branch, 2 pull request, 3 tag) of the save
-- that made it. Entries stored before have no family ('', counted as `other`) and are classed
-- by their scope: pull requests and tags as such, any other as another branch.
ALTER TABLE entries ADD COLUMN family TEXT NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN ref_class INTEGER NOT NULL DEFAULT 1;
UPDATE entries SET ref_class = 2 WHERE substr(scope, 1, 10) = 'refs/pull/';
UPDATE entries SET ref_class = 3 WHERE substr(scope, 1, 10) = 'refs/tags/';
-- Counts per repository, family, ref class and bucket (0: the hour starting at start_at, 1: the
-- day), added to by the restore bookkeeping; hours are folded into days by the maintenance pass.
CREATE TABLE family_stats (
    repository       TEXT    NOT NULL,
    family           TEXT    NOT NULL,
    ref_class        INTEGER NOT NULL,
    bucket           INTEGER NOT NULL,
    start_at         INTEGER NOT NULL,
    lookups          INTEGER NOT NULL DEFAULT 0,
    exact_hits       INTEGER NOT NULL DEFAULT 0,
    restore_key_hits INTEGER NOT NULL DEFAULT 0,
    misses           INTEGER NOT NULL DEFAULT 0,
    bytes_restored   INTEGER NOT NULL DEFAULT 0,
    saves            INTEGER NOT NULL DEFAULT 0,
    bytes_saved      INTEGER NOT NULL DEFAULT 0,
    evicted          INTEGER NOT NULL DEFAULT 0,
    expired          INTEGER NOT NULL DEFAULT 0,
    quarantined      INTEGER NOT NULL DEFAULT 0,
    deleted          INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (repository, family, ref_class, bucket, start_at)
) WITHOUT ROWID;
CREATE INDEX family_stats_by_repository_time ON family_stats (repository, start_at);
CREATE INDEX family_stats_by_time ON family_stats (start_at);
-- The same counts for the whole server per ref class: what the overview reads, without summing
-- every repository's rows.
CREATE TABLE server_stats (
    ref_class        INTEGER NOT NULL,
    bucket           INTEGER NOT NULL,
    start_at         INTEGER NOT NULL,
    lookups          INTEGER NOT NULL DEFAULT 0,
    exact_hits       INTEGER NOT NULL DEFAULT 0,
    restore_key_hits INTEGER NOT NULL DEFAULT 0,
    misses           INTEGER NOT NULL DEFAULT 0,
    bytes_restored   INTEGER NOT NULL DEFAULT 0,
    saves            INTEGER NOT NULL DEFAULT 0,
    bytes_saved      INTEGER NOT NULL DEFAULT 0,
    evicted          INTEGER NOT NULL DEFAULT 0,
    expired          INTEGER NOT NULL DEFAULT 0,
    quarantined      INTEGER NOT NULL DEFAULT 0,
    deleted          INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (ref_class, bucket, start_at)
) WITHOUT ROWID;
-- The families kept per repository (at most --stats-max-families; later ones count as `other`).
CREATE TABLE stats_families (
    repository  TEXT    NOT NULL,
    family      TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (repository, family)
) WITHOUT ROWID;
