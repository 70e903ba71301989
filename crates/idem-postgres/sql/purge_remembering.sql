-- purge_remembering($1 limit, $2 first day kept): sql/purge.sql, with the
-- completed and failed records it deletes remembered in idem_horizon
-- (idem::horizon: the digest is SHA-256 of 'idem.horizon.v1', NUL, the
-- scope, NUL and the key, its first 8 bytes as a big-endian bigint; the
-- outbox's own scopes are not remembered), and up to $1 keys of the days
-- before $2 dropped, in one statement.
WITH gone AS (
    DELETE FROM {schema}.idem_records
    WHERE (scope, key) IN (
        SELECT scope, key FROM {schema}.idem_records
        WHERE expires_at <= now()
        ORDER BY expires_at
        LIMIT $1
        FOR UPDATE SKIP LOCKED)
      AND expires_at <= now()
    RETURNING scope, key, state, fingerprint, expires_at
), remembered AS (
    INSERT INTO {schema}.idem_horizon AS h (digest, fingerprint, day)
    SELECT ('x' || encode(substring(sha256(
               convert_to('idem.horizon.v1', 'UTF8') || '\x00'::bytea
               || convert_to(scope, 'UTF8') || '\x00'::bytea || convert_to(key, 'UTF8'))
               FROM 1 FOR 8), 'hex'))::bit(64)::bigint,
           ('x' || encode(coalesce(substring(fingerprint FROM 1 FOR 8), '\x0000000000000000'::bytea),
               'hex'))::bit(64)::bigint,
           floor(extract(epoch FROM expires_at) / 86400)::integer
    FROM gone
    WHERE state IN ('completed', 'failed')
      AND scope <> 'idem.outbox' AND scope NOT LIKE 'idem.outbox/%'
    ON CONFLICT (digest) DO UPDATE SET fingerprint = excluded.fingerprint, day = excluded.day
), dropped AS (
    DELETE FROM {schema}.idem_horizon
    WHERE digest IN (SELECT digest FROM {schema}.idem_horizon WHERE day < $2 LIMIT $1)
)
SELECT count(*) FROM gone
