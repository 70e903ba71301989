-- abandoned(scope, limit): in-progress records whose lease has run out
-- by the server's clock, longest-abandoned first.
SELECT {record} FROM idem_records
WHERE scope = ? AND state = 'in_progress'
  AND lease_until <= UTC_TIMESTAMP(6) AND expires_at > UTC_TIMESTAMP(6)
ORDER BY lease_until
LIMIT ?
