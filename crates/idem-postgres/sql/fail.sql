-- fail($1 scope, $2 key, $3 token, $4 class, $5 message, $6 retention ms)
-- A retryable failure releases the record; terminal and unknown ones are kept.
UPDATE {schema}.idem_records SET
    state = CASE WHEN $4::text = 'retryable' THEN 'released' ELSE 'failed' END,
    failure_class = $4, failure_message = $5, token = NULL, lease_until = NULL,
    takeover = false, updated_at = now(),
    expires_at = now() + $6::float8 * interval '1 millisecond'
WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND token = $3 AND expires_at > now()
