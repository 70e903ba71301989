-- idem 0004: the transitions that read before they write, as stored
-- procedures, so each is one round trip and decided by the server's
-- clock (UTC_TIMESTAMP(6), read after the row is locked). Fences are
-- microseconds of that clock, and at least one more than the stored
-- fence: they rise per key, across expiry, delete and purge, as long as
-- the server's clock does not step back past a deleted record's fence.
--
-- Read by `mysql` as is (DELIMITER), and by idem statement by statement.

DROP PROCEDURE IF EXISTS idem_answers_ready;
DROP PROCEDURE IF EXISTS idem_claim_row;
DROP PROCEDURE IF EXISTS idem_claim;
DROP PROCEDURE IF EXISTS idem_claim_many;
DROP PROCEDURE IF EXISTS idem_complete_row;
DROP PROCEDURE IF EXISTS idem_complete_many;
DROP PROCEDURE IF EXISTS idem_extend;
DROP PROCEDURE IF EXISTS idem_step_begin;
DROP PROCEDURE IF EXISTS idem_step_finish;
DROP PROCEDURE IF EXISTS idem_resolve;

DELIMITER $$

-- The session's table of claim answers, made once per session and
-- emptied for each call.
CREATE PROCEDURE idem_answers_ready()
BEGIN
    CREATE TEMPORARY TABLE IF NOT EXISTS idem_answers (
        n               INT             NOT NULL PRIMARY KEY,
        acquired        BOOLEAN         NOT NULL,
        state           VARCHAR(16)     NOT NULL,
        fingerprint     VARBINARY(32)   NULL,
        attempt         INT UNSIGNED    NOT NULL,
        fence           BIGINT UNSIGNED NOT NULL,
        takeover        BOOLEAN         NOT NULL,
        lease_until     BIGINT          NULL,
        lease_left_ms   BIGINT          NULL,
        response        LONGBLOB        NULL,
        failure_class   VARCHAR(16)     NULL,
        failure_message BLOB            NULL,
        live            BOOLEAN         NOT NULL
    ) ENGINE = InnoDB;
    DELETE FROM idem_answers;
END$$

-- One claim, inside the caller's transaction; its answer goes to the
-- session's idem_answers table (made by idem_answers_ready). The INSERT
-- acquires an absent key; on a duplicate it changes nothing but locks the
-- row. The row is then taken only if it is expired (a new record: attempt
-- 1, the new fingerprint), released, or in progress past its lease (a
-- takeover), with the same fingerprint. The answer is the row as it
-- stands, for the client to answer from.
--
-- Every procedure sends its one result set last, after COMMIT: an error
-- raised after a result set was sent would reach the client only with its
-- next statement.
CREATE PROCEDURE idem_claim_row(
    IN p_n INT, IN p_scope VARBINARY(512), IN p_key VARBINARY(2048),
    IN p_fp VARBINARY(32), IN p_token BINARY(16), IN p_lease BIGINT, IN p_keep BIGINT)
BEGIN
    DECLARE v_now DATETIME(6);
    DECLARE v_state VARCHAR(16);
    DECLARE v_fp VARBINARY(32);
    DECLARE v_token BINARY(16);
    DECLARE v_lease_until DATETIME(6);
    DECLARE v_expires DATETIME(6);
    SET v_now = UTC_TIMESTAMP(6);
    INSERT INTO idem_records (
        scope, `key`, state, fingerprint, attempt, fence, token, lease_until, takeover,
        response, failure_class, failure_message, created_at, updated_at, expires_at)
    VALUES (
        p_scope, p_key, 'in_progress', p_fp, 1,
        TIMESTAMPDIFF(MICROSECOND, '1970-01-01', v_now), p_token,
        v_now + INTERVAL p_lease * 1000 MICROSECOND, FALSE,
        NULL, NULL, NULL, v_now, v_now,
        v_now + INTERVAL GREATEST(p_lease, p_keep) * 1000 MICROSECOND)
    ON DUPLICATE KEY UPDATE scope = scope;
    SET v_now = UTC_TIMESTAMP(6);
    SELECT state, fingerprint, token, lease_until, expires_at
      INTO v_state, v_fp, v_token, v_lease_until, v_expires
      FROM idem_records WHERE scope = p_scope AND `key` = p_key FOR UPDATE;
    IF NOT (v_token <=> p_token)
       AND (v_expires <= v_now
            OR (v_fp <=> p_fp
                AND (v_state = 'released'
                     OR (v_state = 'in_progress' AND v_lease_until <= v_now)))) THEN
        UPDATE idem_records SET
            state = 'in_progress',
            token = p_token,
            lease_until = v_now + INTERVAL p_lease * 1000 MICROSECOND,
            fence = GREATEST(fence + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', v_now)),
            response = NULL,
            failure_class = NULL,
            failure_message = NULL,
            updated_at = v_now,
            takeover = (v_expires > v_now AND v_state = 'in_progress'),
            fingerprint = IF(v_expires <= v_now, p_fp, fingerprint),
            attempt = IF(v_expires <= v_now, 1, attempt + 1),
            created_at = IF(v_expires <= v_now, v_now, created_at),
            expires_at = IF(v_expires <= v_now,
                            v_now + INTERVAL GREATEST(p_lease, p_keep) * 1000 MICROSECOND,
                            GREATEST(expires_at,
                                     v_now + INTERVAL GREATEST(p_lease, p_keep) * 1000 MICROSECOND))
        WHERE scope = p_scope AND `key` = p_key;
    END IF;
    INSERT INTO idem_answers
    SELECT p_n, (token <=> p_token), state, fingerprint, attempt, fence, takeover,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01', lease_until) DIV 1000,
           CEIL(TIMESTAMPDIFF(MICROSECOND, v_now, lease_until) / 1000),
           response, failure_class, failure_message, (expires_at > v_now)
      FROM idem_records WHERE scope = p_scope AND `key` = p_key;
END$$

-- claim(scope, key, fingerprint, token, lease ms, retention ms): one
-- claim in its own transaction.
CREATE PROCEDURE idem_claim(
    IN p_scope VARBINARY(512), IN p_key VARBINARY(2048),
    IN p_fp VARBINARY(32), IN p_token BINARY(16), IN p_lease BIGINT, IN p_keep BIGINT)
BEGIN
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    CALL idem_answers_ready();
    START TRANSACTION;
    CALL idem_claim_row(1, p_scope, p_key, p_fp, p_token, p_lease, p_keep);
    COMMIT;
    SELECT * FROM idem_answers;
END$$

-- claim_many(items): many claims in one transaction, one answer row each
-- (`n` naming the item). `items` is a JSON array of
-- [scope, key, fingerprint hex or null, token hex, lease ms, retention
-- ms], keys in byte order so two batches never wait on each other in a
-- cycle.
CREATE PROCEDURE idem_claim_many(IN p_items LONGTEXT)
BEGIN
    DECLARE i INT DEFAULT 0;
    DECLARE n INT DEFAULT JSON_LENGTH(p_items);
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    CALL idem_answers_ready();
    START TRANSACTION;
    WHILE i < n DO
        CALL idem_claim_row(
            i + 1,
            JSON_UNQUOTE(JSON_EXTRACT(p_items, CONCAT('$[', i, '][0]'))),
            JSON_UNQUOTE(JSON_EXTRACT(p_items, CONCAT('$[', i, '][1]'))),
            UNHEX(JSON_UNQUOTE(JSON_EXTRACT(p_items, CONCAT('$[', i, '][2]')))),
            UNHEX(JSON_UNQUOTE(JSON_EXTRACT(p_items, CONCAT('$[', i, '][3]')))),
            JSON_EXTRACT(p_items, CONCAT('$[', i, '][4]')),
            JSON_EXTRACT(p_items, CONCAT('$[', i, '][5]')));
        SET i = i + 1;
    END WHILE;
    COMMIT;
    SELECT * FROM idem_answers ORDER BY n;
END$$

-- One completion inside the caller's transaction; whether it was written.
CREATE PROCEDURE idem_complete_row(
    IN p_scope VARBINARY(512), IN p_key VARBINARY(2048),
    IN p_token BINARY(16), IN p_response LONGBLOB, IN p_keep BIGINT, OUT p_written BOOLEAN)
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
    UPDATE idem_records SET
        state = 'completed', response = p_response, token = NULL, lease_until = NULL,
        takeover = FALSE, failure_class = NULL, failure_message = NULL, updated_at = v_now,
        expires_at = v_now + INTERVAL p_keep * 1000 MICROSECOND
    WHERE scope = p_scope AND `key` = p_key AND state = 'in_progress' AND token = p_token
      AND expires_at > v_now;
    SET p_written = ROW_COUNT() > 0;
END$$

-- complete_many(items): many completions in one transaction; answers
-- one row, a string of '1' (written) and '0' (lease lost), one character
-- per item. `items` is a JSON array of [scope, key, token hex, response
-- base64, retention ms], keys in byte order.
CREATE PROCEDURE idem_complete_many(IN p_items LONGTEXT)
BEGIN
    DECLARE i INT DEFAULT 0;
    DECLARE n INT DEFAULT JSON_LENGTH(p_items);
    DECLARE v_written BOOLEAN DEFAULT FALSE;
    DECLARE v_answers LONGTEXT DEFAULT '';
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    WHILE i < n DO
        CALL idem_complete_row(
            JSON_UNQUOTE(JSON_EXTRACT(p_items, CONCAT('$[', i, '][0]'))),
            JSON_UNQUOTE(JSON_EXTRACT(p_items, CONCAT('$[', i, '][1]'))),
            UNHEX(JSON_UNQUOTE(JSON_EXTRACT(p_items, CONCAT('$[', i, '][2]')))),
            FROM_BASE64(JSON_UNQUOTE(JSON_EXTRACT(p_items, CONCAT('$[', i, '][3]')))),
            JSON_EXTRACT(p_items, CONCAT('$[', i, '][4]')),
            v_written);
        SET v_answers = CONCAT(v_answers, IF(v_written, '1', '0'));
        SET i = i + 1;
    END WHILE;
    COMMIT;
    SELECT v_answers AS written;
END$$

-- extend(scope, key, token, lease ms): never shortens the lease; answers
-- the lease's end in ms since the epoch, or no row if the lease is lost.
CREATE PROCEDURE idem_extend(
    IN p_scope VARBINARY(512), IN p_key VARBINARY(2048), IN p_token BINARY(16),
    IN p_lease BIGINT)
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
    UPDATE idem_records SET
        lease_until = GREATEST(lease_until, v_now + INTERVAL p_lease * 1000 MICROSECOND),
        expires_at = GREATEST(expires_at, v_now + INTERVAL p_lease * 1000 MICROSECOND),
        updated_at = v_now
    WHERE scope = p_scope AND `key` = p_key AND state = 'in_progress' AND token = p_token
      AND expires_at > v_now;
    IF ROW_COUNT() > 0 THEN
        SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', lease_until) DIV 1000
          FROM idem_records WHERE scope = p_scope AND `key` = p_key;
    END IF;
END$$

-- step_begin(scope, key, token, step, attempt): if the record is live
-- and in progress under the token (locked in share mode, so no takeover
-- commits in between), marks the step started by the attempt unless it is
-- done. Answers whether the lease held and the step's earlier attempt and
-- result.
CREATE PROCEDURE idem_step_begin(
    IN p_scope VARBINARY(512), IN p_key VARBINARY(2048), IN p_token BINARY(16),
    IN p_name VARBINARY(128), IN p_attempt INT)
BEGIN
    DECLARE v_generation DATETIME(6) DEFAULT NULL;
    DECLARE v_attempt INT DEFAULT NULL;
    DECLARE v_result LONGBLOB DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SELECT created_at INTO v_generation FROM idem_records
     WHERE scope = p_scope AND `key` = p_key AND state = 'in_progress' AND token = p_token
       AND expires_at > UTC_TIMESTAMP(6)
     LOCK IN SHARE MODE;
    IF v_generation IS NOT NULL THEN
        SELECT attempt, result INTO v_attempt, v_result FROM idem_steps
         WHERE scope = p_scope AND `key` = p_key AND name = p_name AND generation = v_generation
         FOR UPDATE;
        IF v_result IS NULL THEN
            INSERT INTO idem_steps (scope, `key`, name, generation, attempt, result)
            VALUES (p_scope, p_key, p_name, v_generation, p_attempt, NULL)
            ON DUPLICATE KEY UPDATE generation = v_generation, attempt = p_attempt, result = NULL;
        END IF;
    END IF;
    COMMIT;
    SELECT v_generation IS NOT NULL AS held, v_attempt AS prev_attempt, v_result AS prev_result;
END$$

-- step_finish(scope, key, token, step, result): journals the result if
-- the record is live and in progress under the token; answers whether it
-- was.
CREATE PROCEDURE idem_step_finish(
    IN p_scope VARBINARY(512), IN p_key VARBINARY(2048), IN p_token BINARY(16),
    IN p_name VARBINARY(128), IN p_result LONGBLOB)
BEGIN
    DECLARE v_generation DATETIME(6) DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SELECT created_at INTO v_generation FROM idem_records
     WHERE scope = p_scope AND `key` = p_key AND state = 'in_progress' AND token = p_token
       AND expires_at > UTC_TIMESTAMP(6)
     LOCK IN SHARE MODE;
    IF v_generation IS NOT NULL THEN
        INSERT INTO idem_steps (scope, `key`, name, generation, attempt, result)
        VALUES (p_scope, p_key, p_name, v_generation, 0, p_result)
        ON DUPLICATE KEY UPDATE generation = v_generation, result = p_result;
    END IF;
    COMMIT;
    SELECT v_generation IS NOT NULL AS held;
END$$

-- resolve(scope, key, step, applied, result): on a parked record (live,
-- failed with an unknown outcome) whose step is in doubt (started, not
-- done), journals the result if applied, removes the step's mark if not,
-- and releases the record. Answers 'R' released, 'P' not parked, 'S' step
-- not in doubt.
CREATE PROCEDURE idem_resolve(
    IN p_scope VARBINARY(512), IN p_key VARBINARY(2048), IN p_name VARBINARY(128),
    IN p_applied BOOLEAN, IN p_result LONGBLOB)
BEGIN
    DECLARE v_generation DATETIME(6) DEFAULT NULL;
    DECLARE v_parked BOOLEAN DEFAULT FALSE;
    DECLARE v_doubt INT DEFAULT 0;
    DECLARE v_answer CHAR(1) DEFAULT 'P';
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SELECT created_at, (state = 'failed' AND failure_class = 'unknown')
      INTO v_generation, v_parked
      FROM idem_records
     WHERE scope = p_scope AND `key` = p_key AND expires_at > UTC_TIMESTAMP(6)
     FOR UPDATE;
    IF v_parked THEN
        SET v_answer = 'S';
        SELECT COUNT(*) INTO v_doubt FROM idem_steps
         WHERE scope = p_scope AND `key` = p_key AND name = p_name
           AND generation = v_generation AND result IS NULL
         FOR UPDATE;
        IF v_doubt > 0 THEN
            IF p_applied THEN
                UPDATE idem_steps SET result = p_result
                 WHERE scope = p_scope AND `key` = p_key AND name = p_name;
            ELSE
                DELETE FROM idem_steps WHERE scope = p_scope AND `key` = p_key AND name = p_name;
            END IF;
            UPDATE idem_records
               SET state = 'released', failure_class = NULL, failure_message = NULL,
                   updated_at = UTC_TIMESTAMP(6)
             WHERE scope = p_scope AND `key` = p_key;
            SET v_answer = 'R';
        END IF;
    END IF;
    COMMIT;
    SELECT v_answer;
END$$

DELIMITER ;
