-- inbox claim, part 2 (same parameters): take over a row past its
-- retention, as if it were absent.
UPDATE {schema}.idem_inbox SET
    fingerprint = $3, response = NULL, created_at = now(),
    expires_at = now() + $4::float8 * interval '1 millisecond'
WHERE scope = $1 AND key = $2 AND expires_at <= now()
RETURNING true
