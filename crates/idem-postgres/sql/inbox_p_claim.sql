-- partitioned inbox claim, part 2 ($1 scope, $2 key, $3 fingerprint, $4
-- retention ms), under the key's lock: insert unless a live row exists in
-- any partition. Expired rows stay where they are until their partition
-- is dropped; they read as absent.
INSERT INTO {schema}.idem_inbox_p (scope, key, fingerprint, response, created_at, expires_at)
SELECT $1, $2, $3, NULL, now(), now() + $4::float8 * interval '1 millisecond'
WHERE NOT EXISTS (
    SELECT 1 FROM {schema}.idem_inbox_p
    WHERE scope = $1 AND key = $2 AND expires_at > now())
RETURNING true
