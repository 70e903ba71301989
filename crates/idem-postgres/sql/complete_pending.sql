-- complete_pending($1 scope, $2 key, $3 token, $4 response, $5 retention
-- ms, $6 hold ms): sql/complete.sql, and in the same statement the run's
-- row in the pending index (migration 0012), held for $6. One row
-- answered if stored; none if the lease was lost (nothing written).
WITH done AS (
    UPDATE {schema}.idem_records SET
        state = 'completed', response = $4, token = NULL, lease_until = NULL,
        takeover = false, failure_class = NULL, failure_message = NULL,
        updated_at = now(), expires_at = now() + $5::float8 * interval '1 millisecond'
    WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND token = $3
      AND expires_at > now()
    RETURNING scope, key, fence
),
marked AS (
    INSERT INTO {schema}.idem_pending (scope, key, fence, held_until)
    SELECT scope, key, fence, now() + $6::float8 * interval '1 millisecond' FROM done
    ON CONFLICT (scope, key) DO UPDATE
        SET fence = EXCLUDED.fence, held_until = EXCLUDED.held_until
)
SELECT 1 FROM done
