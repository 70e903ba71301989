-- complete_many_pending($1 scopes, $2 keys, $3 tokens, $4 responses, $5
-- retention ms, $6 hold ms, NULL for a plain completion):
-- sql/complete_many.sql for a batch where some completions mark their run
-- pending, each such run's row in the pending index (migration 0012)
-- written by the same statement. The keys must be distinct and in the
-- order of sql/complete_many.sql; the answer is the same: the 1-based
-- position `n` of every completion stored.
WITH input AS (
    SELECT scope COLLATE "C" AS scope, key COLLATE "C" AS key, token, response, keep_ms,
           hold_ms, n
    FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::float8[], $6::float8[])
         WITH ORDINALITY AS i(scope, key, token, response, keep_ms, hold_ms, n)
    LIMIT cardinality($2::text[])
),
held AS (
    SELECT r.scope, r.key, i.token, i.response, i.keep_ms, i.hold_ms, i.n
    FROM input i JOIN {schema}.idem_records r ON r.scope = i.scope AND r.key = i.key
    WHERE r.state = 'in_progress' AND r.token = i.token AND r.expires_at > now()
    ORDER BY i.n
    FOR UPDATE OF r
),
done AS (
    UPDATE {schema}.idem_records r SET
        state = 'completed', response = h.response, token = NULL, lease_until = NULL,
        takeover = false, failure_class = NULL, failure_message = NULL, updated_at = now(),
        expires_at = now() + h.keep_ms * interval '1 millisecond'
    FROM held h
    WHERE r.scope = h.scope AND r.key = h.key AND r.state = 'in_progress'
      AND r.token = h.token
    RETURNING h.n, r.scope, r.key, r.fence, h.hold_ms
),
marked AS (
    INSERT INTO {schema}.idem_pending (scope, key, fence, held_until)
    SELECT scope, key, fence, now() + hold_ms * interval '1 millisecond'
    FROM done WHERE hold_ms IS NOT NULL
    ORDER BY scope, key
    ON CONFLICT (scope, key) DO UPDATE
        SET fence = EXCLUDED.fence, held_until = EXCLUDED.held_until
)
SELECT n FROM done
