-- pending_confirm($1 scopes, $2 keys, $3 fences): deletes the pending
-- index's rows (migration 0012) of runs whose messages were confirmed
-- sent, each only while it still names the fence it was written with.
DELETE FROM {schema}.idem_pending p
USING unnest($1::text[], $2::text[], $3::int8[]) AS c(scope, key, fence)
WHERE p.scope = c.scope COLLATE "C" AND p.key = c.key COLLATE "C" AND p.fence = c.fence
