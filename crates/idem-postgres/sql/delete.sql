-- delete($1 scope, $2 key): true when a live record was there.
DELETE FROM {schema}.idem_records WHERE scope = $1 AND key = $2 RETURNING expires_at > now()
