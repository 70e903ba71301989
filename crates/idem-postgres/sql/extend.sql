-- extend($1 scope, $2 key, $3 token, $4 lease ms): never shortens the lease.
UPDATE {schema}.idem_records SET
    lease_until = greatest(lease_until, now() + $4::float8 * interval '1 millisecond'),
    expires_at = greatest(expires_at, now() + $4::float8 * interval '1 millisecond'),
    updated_at = now()
WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND token = $3 AND expires_at > now()
RETURNING lease_until
