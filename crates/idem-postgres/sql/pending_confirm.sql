-- pending_confirm($1 scopes, $2 keys, $3 fences): deletes the pending
-- index's rows (migration 0012) of runs whose messages were confirmed
-- sent, each only while it still names the fence it was written with,
-- each found by its primary key (the function's loop).
SELECT {schema}.idem_pending_confirm($1::text[], $2::text[], $3::int8[])
