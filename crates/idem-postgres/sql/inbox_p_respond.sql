-- partitioned inbox set_response($1 scope, $2 key, $3 response): never
-- overwrites.
UPDATE {schema}.idem_inbox_p SET response = $3
WHERE scope = $1 AND key = $2 AND response IS NULL AND expires_at > now()
