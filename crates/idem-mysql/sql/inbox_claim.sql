-- inbox claim, part 1 (scope, key, claim, fingerprint, retention ms):
-- inserts the row, or takes over one past its retention as if it were
-- absent. A concurrent transaction's uncommitted row with the same key
-- makes this wait until that transaction ends. `expires_at` is assigned
-- last: the others read the stored one.
INSERT INTO idem_inbox (scope, `key`, claim, fingerprint, response, created_at, expires_at)
VALUES (?, ?, ?, ?, NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? * 1000 MICROSECOND)
ON DUPLICATE KEY UPDATE
    claim = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(claim), claim),
    fingerprint = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(fingerprint), fingerprint),
    response = IF(expires_at <= UTC_TIMESTAMP(6), NULL, response),
    created_at = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(created_at), created_at),
    expires_at = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)
