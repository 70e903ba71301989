-- partitioned inbox claim, part 3 ($1 scope, $2 key): the live row that
-- made this a duplicate.
SELECT fingerprint, response FROM {schema}.idem_inbox_p
WHERE scope = $1 AND key = $2 AND expires_at > now()
ORDER BY created_at DESC
LIMIT 1
