-- Statistics by key family (issue #24). Each entry keeps the family and the ref class
-- (`model::RefClass` code: 0 default branch, 1 other branch, 2 pull request, 3 tag) of the save
-- that made it. Entries stored before have no family ('', counted as `other`) and are classed
-- by their scope: pull requests and tags as such, any other as another branch.
ALTER TABLE entries ADD COLUMN family TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN ref_class SMALLINT NOT NULL DEFAULT 1;
UPDATE entries SET ref_class = 2 WHERE substr(scope, 1, 10) = 'refs/pull/';
UPDATE entries SET ref_class = 3 WHERE substr(scope, 1, 10) = 'refs/tags/';
-- Counts per repository, family, ref class and bucket (0: the hour starting at start_at, 1: the
-- day), added to by the restore bookkeeping; hours are folded into days by the maintenance pass.
CREATE TABLE family_stats (
    repository       TEXT    COLLATE "C" NOT NULL,
    family           TEXT    COLLATE "C" NOT NULL,
    ref_class        SMALLINT NOT NULL,
    bucket           BIGINT  NOT NULL,
    start_at         BIGINT  NOT NULL,
    lookups          BIGINT  NOT NULL DEFAULT 0,
    exact_hits       BIGINT  NOT NULL DEFAULT 0,
    restore_key_hits BIGINT  NOT NULL DEFAULT 0,
    misses           BIGINT  NOT NULL DEFAULT 0,
    bytes_restored   BIGINT  NOT NULL DEFAULT 0,
    saves            BIGINT  NOT NULL DEFAULT 0,
    bytes_saved      BIGINT  NOT NULL DEFAULT 0,
    evicted          BIGINT  NOT NULL DEFAULT 0,
    expired          BIGINT  NOT NULL DEFAULT 0,
    quarantined      BIGINT  NOT NULL DEFAULT 0,
    deleted          BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (repository, family, ref_class, bucket, start_at)
);
CREATE INDEX family_stats_by_repository_time ON family_stats (repository, start_at);
CREATE INDEX family_stats_by_time ON family_stats (start_at);
-- The same counts for the whole server per ref class: what the overview reads, without summing
-- every repository's rows.
CREATE TABLE server_stats (
    ref_class        SMALLINT NOT NULL,
    bucket           BIGINT  NOT NULL,
    start_at         BIGINT  NOT NULL,
    lookups          BIGINT  NOT NULL DEFAULT 0,
    exact_hits       BIGINT  NOT NULL DEFAULT 0,
    restore_key_hits BIGINT  NOT NULL DEFAULT 0,
    misses           BIGINT  NOT NULL DEFAULT 0,
    bytes_restored   BIGINT  NOT NULL DEFAULT 0,
    saves            BIGINT  NOT NULL DEFAULT 0,
    bytes_saved      BIGINT  NOT NULL DEFAULT 0,
    evicted          BIGINT  NOT NULL DEFAULT 0,
    expired          BIGINT  NOT NULL DEFAULT 0,
    quarantined      BIGINT  NOT NULL DEFAULT 0,
    deleted          BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (ref_class, bucket, start_at)
);
-- The families kept per repository (at most --stats-max-families; later ones count as `other`).
CREATE TABLE stats_families (
    repository  TEXT    COLLATE "C" NOT NULL,
    family      TEXT    COLLATE "C" NOT NULL,
    created_at  BIGINT  NOT NULL,
    PRIMARY KEY (repository, family)
);
