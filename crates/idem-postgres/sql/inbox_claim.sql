-- inbox claim, part 1 ($1 scope, $2 key, $3 fingerprint, $4 retention ms):
-- insert if absent. A concurrent transaction's uncommitted row with the
-- same key makes this wait until that transaction ends.
INSERT INTO {schema}.idem_inbox (scope, key, fingerprint, response, created_at, expires_at)
VALUES ($1, $2, $3, NULL, now(), now() + $4::float8 * interval '1 millisecond')
ON CONFLICT (scope, key) DO NOTHING
RETURNING true
