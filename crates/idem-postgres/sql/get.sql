-- get($1 scope, $2 key): a live record.
SELECT scope, key, state, fingerprint, attempt, fence, token, lease_until, response,
       failure_class, failure_message, created_at, updated_at, expires_at
FROM {schema}.idem_records
WHERE scope = $1 AND key = $2 AND expires_at > now()
