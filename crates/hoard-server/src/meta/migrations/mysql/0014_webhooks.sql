-- GitHub's webhooks (issue #58): the deliveries received, so that a redelivery is answered and
-- not applied twice, and what they said about commits, so that a merge group and the push that
-- lands it find each other whichever arrives first (and on whichever replica). Both are
-- forgotten after a while (the domain says when).
CREATE TABLE webhook_deliveries (
    delivery    VARBINARY(255) NOT NULL PRIMARY KEY,
    received_at BIGINT         NOT NULL,
    INDEX webhook_deliveries_by_time (received_at)
) ENGINE = InnoDB
;
-- `kind`: 1 a merge group's head (git_ref its branch, base_ref the branch it merges into), 2 a
-- push (git_ref the branch, sha its new head), 3 a pull request's head (git_ref its merge ref).
CREATE TABLE webhook_refs (
    repository  VARBINARY(255)  NOT NULL,
    sha         VARBINARY(64)   NOT NULL,
    kind        BIGINT          NOT NULL,
    git_ref     VARBINARY(1024) NOT NULL,
    base_ref    VARBINARY(1024) NOT NULL,
    received_at BIGINT          NOT NULL,
    PRIMARY KEY (repository, sha, kind, git_ref),
    INDEX webhook_refs_by_time (received_at)
) ENGINE = InnoDB
;
