-- claim($1 scope, $2 key, $3 fingerprint, $4 token, $5 lease ms, $6 retention ms)
--
-- One statement. The INSERT acquires an absent key. On a conflict the
-- existing row is locked, and the UPDATE of sql/claim_rules.sql acquires
-- it only if it is expired (a new record: attempt 1, the new
-- fingerprint), released, or in progress past its lease (a takeover),
-- with the same fingerprint. Otherwise nothing is written and the second
-- SELECT returns the row as
-- it stands, for the client to answer from (completed, failed, in
-- progress, mismatch). The statement's snapshot may predate a row that a
-- concurrent claim just committed; the client then runs it again.
WITH claimed AS (
    INSERT INTO {schema}.idem_records AS r (
        scope, key, state, fingerprint, attempt, fence, token, lease_until, takeover,
        response, failure_class, failure_message, created_at, updated_at, expires_at)
    VALUES (
        $1, $2, 'in_progress', $3, 1, nextval('{schema}.idem_fence'), $4,
        now() + $5::float8 * interval '1 millisecond', false,
        NULL, NULL, NULL, now(), now(),
        now() + greatest($5::float8, $6::float8) * interval '1 millisecond')
{claim_rules}
    RETURNING true AS acquired, state, fingerprint, attempt, fence, takeover, lease_until,
              0::bigint AS lease_left_ms, response, failure_class, failure_message, true AS live
)
SELECT * FROM claimed
UNION ALL
SELECT false, state, fingerprint, attempt, fence, takeover, lease_until,
       ceil(extract(epoch FROM lease_until - now()) * 1000)::bigint,
       response, failure_class, failure_message, expires_at > now()
FROM {schema}.idem_records
WHERE scope = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM claimed)
