-- list(state, state, scope, scope, after-scope, after-scope, after-key,
-- limit): live records in id order, each filter NULL for any.
SELECT {record} FROM idem_records
WHERE expires_at > UTC_TIMESTAMP(6)
  AND (? IS NULL OR state = ?)
  AND (? IS NULL OR scope = ?)
  AND (? IS NULL OR (scope, `key`) > (?, ?))
ORDER BY scope, `key`
LIMIT ?
