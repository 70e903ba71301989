-- claim_remembering($1..$6 as sql/claim.sql, $7 digest, $8 fingerprint
-- prefix, $9 first day kept): sql/claim.sql for a schema that remembers
-- expired keys (idem::horizon). A key remembered with this fingerprint, or
-- whose expired row ended (completed or failed) with it within the
-- memory, is not acquired; the answer then carries the row as it stands
-- (with `expires_at`) or, for a remembered key with no row, a row whose
-- state is 'forgotten', and the client answers Forgotten. Every branch
-- carries `expires_at` for that.
WITH remembered AS (
    SELECT day FROM {schema}.idem_horizon
    WHERE digest = $7 AND fingerprint = $8 AND day >= $9
), claimed AS (
    INSERT INTO {schema}.idem_records AS r (
        scope, key, state, fingerprint, attempt, fence, token, lease_until, takeover,
        response, failure_class, failure_message, created_at, updated_at, expires_at)
    SELECT
        $1, $2, 'in_progress', $3, 1, nextval('{schema}.idem_fence'), $4,
        now() + $5::float8 * interval '1 millisecond', false,
        NULL, NULL, NULL, now(), now(),
        now() + greatest($5::float8, $6::float8) * interval '1 millisecond'
    WHERE NOT EXISTS (SELECT 1 FROM remembered)
{claim_rules}
      AND NOT (r.expires_at <= now() AND r.state IN ('completed', 'failed')
               AND r.fingerprint IS NOT DISTINCT FROM excluded.fingerprint
               AND r.expires_at >= to_timestamp($9::float8 * 86400))
    RETURNING true AS acquired, state, fingerprint, attempt, fence, takeover, lease_until,
              0::bigint AS lease_left_ms, response, failure_class, failure_message, true AS live,
              expires_at
)
SELECT * FROM claimed
UNION ALL
SELECT false, state, fingerprint, attempt, fence, takeover, lease_until,
       ceil(extract(epoch FROM lease_until - now()) * 1000)::bigint,
       response, failure_class, failure_message, expires_at > now(), expires_at
FROM {schema}.idem_records
WHERE scope = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM claimed)
UNION ALL
SELECT false, 'forgotten', NULL, 0, 0, false, NULL,
       0::bigint, NULL, NULL, NULL, false, to_timestamp(day::float8 * 86400)
FROM remembered
WHERE NOT EXISTS (SELECT 1 FROM claimed)
