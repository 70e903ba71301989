-- pending_take_run($1 scope, $2 key, $3 hold ms): sql/pending_take.sql
-- for one run, found by its primary key (a replay re-dispatching): its
-- row if its hold ran out, held for $3 ms more. A taker that waited on
-- the row's lock reads it again, finds it held, and takes nothing.
UPDATE {schema}.idem_pending
SET held_until = now() + $3::float8 * interval '1 millisecond'
WHERE scope = $1 AND key = $2 AND held_until <= now()
RETURNING key, fence
