-- claim_many($1 scopes, $2 keys, $3 fingerprints, $4 tokens, $5 lease ms,
-- $6 retention ms): the claim of sql/claim.sql for many keys in one
-- statement, one element of each array per claim.
--
-- The keys must be distinct (ON CONFLICT DO UPDATE cannot touch a row
-- twice in one statement); rows are inserted, and so locked, in the order
-- given. Each answer row carries `n`, the claim's 1-based position in the
-- arrays. A claim whose row is missing from the answer, or reads as not
-- live, was stopped by a row committed after the statement's snapshot
-- was taken: the client runs the single claim for it.
WITH input AS (
    SELECT scope COLLATE "C" AS scope, key COLLATE "C" AS key, fingerprint, token,
           lease_ms, keep_ms, n
    FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::float8[], $6::float8[])
         WITH ORDINALITY AS i(scope, key, fingerprint, token, lease_ms, keep_ms, n)
),
claimed AS (
    INSERT INTO {schema}.idem_records AS r (
        scope, key, state, fingerprint, attempt, fence, token, lease_until, takeover,
        response, failure_class, failure_message, created_at, updated_at, expires_at)
    SELECT scope, key, 'in_progress', fingerprint, 1, nextval('{schema}.idem_fence'), token,
           now() + lease_ms * interval '1 millisecond', false,
           NULL, NULL, NULL, now(), now(),
           now() + greatest(lease_ms, keep_ms) * interval '1 millisecond'
    FROM input
    ORDER BY n
{claim_rules}
    RETURNING r.scope, r.key, state, fingerprint, attempt, fence, takeover, lease_until
)
SELECT i.n, true AS acquired, c.state, c.fingerprint, c.attempt, c.fence, c.takeover,
       c.lease_until, 0::bigint AS lease_left_ms, NULL::bytea AS response,
       NULL::text AS failure_class, NULL::bytea AS failure_message, true AS live
FROM claimed c JOIN input i ON i.scope = c.scope AND i.key = c.key
UNION ALL
SELECT i.n, false, r.state, r.fingerprint, r.attempt, r.fence, r.takeover, r.lease_until,
       ceil(extract(epoch FROM r.lease_until - now()) * 1000)::bigint,
       r.response, r.failure_class, r.failure_message, r.expires_at > now()
FROM input i JOIN {schema}.idem_records r ON r.scope = i.scope AND r.key = i.key
WHERE NOT EXISTS (SELECT 1 FROM claimed c WHERE c.scope = i.scope AND c.key = i.key)
