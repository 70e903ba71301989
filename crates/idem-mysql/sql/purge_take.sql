-- purge, remembering (limit): at most `limit` expired records, oldest
-- first, locked until the purge commits (their memory is written and they
-- are deleted in the same transaction).
SELECT scope, `key`, state, fingerprint,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at) DIV 1000 AS expires_at
FROM idem_records WHERE expires_at <= UTC_TIMESTAMP(6) ORDER BY expires_at LIMIT ?
FOR UPDATE
