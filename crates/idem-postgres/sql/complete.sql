-- complete($1 scope, $2 key, $3 token, $4 response, $5 retention ms)
UPDATE {schema}.idem_records SET
    state = 'completed', response = $4, token = NULL, lease_until = NULL, takeover = false,
    failure_class = NULL, failure_message = NULL, updated_at = now(),
    expires_at = now() + $5::float8 * interval '1 millisecond'
WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND token = $3 AND expires_at > now()
