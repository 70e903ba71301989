-- abandoned($1 scope, $2 limit): in-progress records whose lease has run
-- out by the server's clock, longest-abandoned first (the partial index
-- idem_records_leased: `lease_until <= now()` implies its predicate).
SELECT scope, key, state, fingerprint, attempt, fence, token, lease_until, response,
       failure_class, failure_message, created_at, updated_at, expires_at
FROM {schema}.idem_records
WHERE state = 'in_progress'
  AND scope = $1
  AND lease_until <= now()
  AND expires_at > now()
ORDER BY lease_until
LIMIT $2
