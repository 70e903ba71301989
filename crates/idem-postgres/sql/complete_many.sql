-- complete_many($1 scopes, $2 keys, $3 tokens, $4 responses, $5 retention
-- ms): the completion of sql/complete.sql for many keys in one statement,
-- one element of each array per completion.
--
-- The keys must be distinct. Rows are locked in the order given (the
-- client sorts them as claim_many does, so batches never wait on each
-- other in a cycle), each only if it still carries its completion's
-- token. The answer is the 1-based position `n` of every completion
-- stored; one not answered lost its lease and nothing was written.
WITH input AS (
    SELECT scope COLLATE "C" AS scope, key COLLATE "C" AS key, token, response, keep_ms, n
    FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::float8[])
         WITH ORDINALITY AS i(scope, key, token, response, keep_ms, n)
    -- Every item; a limit PostgreSQL cannot read from the plan makes it
    -- expect one row instead of ten, so a plan cached while the table
    -- was new (taken for ten pages) looks each row up by its primary key
    -- rather than scanning the table once for the batch.
    LIMIT cardinality($2::text[])
),
held AS (
    SELECT r.scope, r.key, i.token, i.response, i.keep_ms, i.n
    FROM input i JOIN {schema}.idem_records r ON r.scope = i.scope AND r.key = i.key
    WHERE r.state = 'in_progress' AND r.token = i.token AND r.expires_at > now()
    ORDER BY i.n
    FOR UPDATE OF r
)
UPDATE {schema}.idem_records r SET
    state = 'completed', response = h.response, token = NULL, lease_until = NULL,
    takeover = false, failure_class = NULL, failure_message = NULL, updated_at = now(),
    expires_at = now() + h.keep_ms * interval '1 millisecond'
FROM held h
WHERE r.scope = h.scope AND r.key = h.key AND r.state = 'in_progress' AND r.token = h.token
RETURNING h.n
