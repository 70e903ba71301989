-- partitioned inbox purge($1 limit): rows deleted one small batch at a
-- time, as in the plain layout. Inbox::maintain, which drops whole
-- partitions, is the cheaper clean-up for this layout.
DELETE FROM {schema}.idem_inbox_p
WHERE (scope, key, created_at) IN (
    SELECT scope, key, created_at FROM {schema}.idem_inbox_p
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
  AND expires_at <= now()
