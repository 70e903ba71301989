-- pending_take($1 scope, $2 hold ms, $3 limit): takes up to $3 rows of
-- the pending index (migration 0012) in the scope whose hold ran out,
-- holding each for $2 ms more. Rows another taker is taking are skipped,
-- so two takers never take the same. The caller reads each taken run's
-- record and drops a row whose record moved on (sql/pending_confirm.sql,
-- naming its fence).
WITH due AS (
    SELECT scope, key FROM {schema}.idem_pending
    WHERE scope = $1 AND held_until <= now()
    ORDER BY held_until
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.idem_pending p
SET held_until = now() + $2::float8 * interval '1 millisecond'
FROM due
WHERE p.scope = due.scope AND p.key = due.key
RETURNING p.key, p.fence
