-- list($1 state or NULL, $2 scope or NULL, $3 after-scope or NULL, $4 after-key, $5 limit)
SELECT scope, key, state, fingerprint, attempt, fence, token, lease_until, response,
       failure_class, failure_message, created_at, updated_at, expires_at
FROM {schema}.idem_records
WHERE expires_at > now()
  AND ($1::text IS NULL OR state = $1)
  AND ($2::text IS NULL OR scope = $2)
  AND ($3::text IS NULL OR (scope, key) > ($3::text, $4::text))
ORDER BY scope, key
LIMIT $5
