-- The columns of a whole record, times as milliseconds since the epoch
-- (filled in for `{record}`).
scope, `key`, state, fingerprint, attempt, fence, token,
TIMESTAMPDIFF(MICROSECOND, '1970-01-01', lease_until) DIV 1000 AS lease_until,
response, failure_class, failure_message,
TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) DIV 1000 AS created_at,
TIMESTAMPDIFF(MICROSECOND, '1970-01-01', updated_at) DIV 1000 AS updated_at,
TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at) DIV 1000 AS expires_at
