-- inbox purge($1 limit): like the store's purge, one small batch, skipping
-- rows another transaction holds.
DELETE FROM {schema}.idem_inbox
WHERE (scope, key) IN (
    SELECT scope, key FROM {schema}.idem_inbox
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
  AND expires_at <= now()
