-- Each change to an upload as one call, one round trip: MySQL has no data-modifying CTEs, and a
-- transaction of separate statements costs a round trip each, BEGIN and COMMIT included. The
-- procedures apply what hoard decided and decide nothing: they claim the upload at the
-- revision hoard loaded (else SQLSTATE 40001, which hoard reads as "stale, decide again"), then
-- write. Lists arrive as JSON arrays, with binary values in hex.

CREATE PROCEDURE hoard_stage_block(
    IN p_upload BIGINT, IN p_revision BIGINT, IN p_now BIGINT,
    IN p_block VARBINARY(1024), IN p_blob VARCHAR(64), IN p_size BIGINT, IN p_sha256 BINARY(32))
BEGIN
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    UPDATE uploads SET revision = revision + 1, updated_at = p_now
     WHERE id = p_upload AND revision = p_revision AND state = 'open';
    IF ROW_COUNT() = 0 THEN
        SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = 'the upload changed since it was read';
    END IF;
    INSERT INTO staged_blocks (upload_id, block_id, blob_name, size, sha256)
    VALUES (p_upload, p_block, p_blob, p_size, p_sha256)
    ON DUPLICATE KEY UPDATE blob_name = p_blob, size = p_size, sha256 = p_sha256;
    COMMIT;
END
;
CREATE PROCEDURE hoard_commit_parts(
    IN p_upload BIGINT, IN p_revision BIGINT, IN p_now BIGINT, IN p_parts LONGTEXT)
BEGIN
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    UPDATE uploads SET revision = revision + 1, updated_at = p_now
     WHERE id = p_upload AND revision = p_revision AND state = 'open';
    IF ROW_COUNT() = 0 THEN
        SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = 'the upload changed since it was read';
    END IF;
    DELETE FROM staged_blocks WHERE upload_id = p_upload;
    DELETE FROM upload_parts WHERE upload_id = p_upload;
    INSERT INTO upload_parts (upload_id, ordinal, block_id, blob_name, size, sha256)
    SELECT p_upload, j.o, UNHEX(j.b), j.n, j.s, UNHEX(j.h)
      FROM JSON_TABLE(p_parts, '$[*]' COLUMNS (
          o INT PATH '$.o', b VARCHAR(2048) PATH '$.b', n VARCHAR(64) PATH '$.n',
          s BIGINT PATH '$.s', h CHAR(64) PATH '$.h')) AS j;
    COMMIT;
END
;
CREATE PROCEDURE hoard_finalize(
    IN p_upload BIGINT, IN p_revision BIGINT, IN p_now BIGINT,
    IN p_repository VARBINARY(255), IN p_scope BLOB, IN p_key BLOB, IN p_key_folded VARBINARY(2560),
    IN p_version BLOB, IN p_bucket BINARY(32), IN p_slot_hash BINARY(32), IN p_size BIGINT,
    IN p_chunks LONGTEXT)
BEGIN
    DECLARE v_entry BIGINT;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    INSERT INTO entries (repository, scope, `key`, key_folded, version, bucket, slot_hash, size,
                         chunk_count, created_at, last_used_at)
    VALUES (p_repository, p_scope, p_key, p_key_folded, p_version, p_bucket, p_slot_hash, p_size,
            JSON_LENGTH(p_chunks), p_now, p_now);
    SET v_entry = LAST_INSERT_ID();
    UPDATE uploads SET revision = revision + 1, updated_at = p_now, state = 'finalized',
                       entry_id = v_entry
     WHERE id = p_upload AND revision = p_revision AND state = 'open';
    IF ROW_COUNT() = 0 THEN
        SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = 'the upload changed since it was read';
    END IF;
    INSERT INTO entry_chunks (entry_id, ordinal, start, blob_name, size, sha256)
    SELECT v_entry, j.o, j.st, j.n, j.s, UNHEX(j.h)
      FROM JSON_TABLE(p_chunks, '$[*]' COLUMNS (
          o INT PATH '$.o', st BIGINT PATH '$.st', n VARCHAR(64) PATH '$.n',
          s BIGINT PATH '$.s', h CHAR(64) PATH '$.h')) AS j;
    DELETE FROM staged_blocks WHERE upload_id = p_upload;
    DELETE FROM upload_parts WHERE upload_id = p_upload;
    COMMIT;
    SELECT v_entry;
END
