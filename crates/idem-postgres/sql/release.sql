-- release($1 scope, $2 key, $3 token)
UPDATE {schema}.idem_records SET
    state = 'released', token = NULL, lease_until = NULL, takeover = false,
    failure_class = NULL, failure_message = NULL, updated_at = now()
WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND token = $3 AND expires_at > now()
