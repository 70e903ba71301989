-- delete($1 scope, $2 key, $3 live only): true when a live record was
-- there. With $3 (a schema that remembers expired keys) an expired record
-- is left to the purge, which remembers it.
DELETE FROM {schema}.idem_records
WHERE scope = $1 AND key = $2 AND (NOT $3::boolean OR expires_at > now())
RETURNING expires_at > now()
