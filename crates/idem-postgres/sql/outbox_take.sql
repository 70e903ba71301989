UPDATE {schema}.idem_outbox o
   SET due_at = now() + make_interval(secs => $1),
       taken_by = $2,
       attempts = o.attempts + 1
 WHERE o.seq IN (
        SELECT seq FROM {schema}.idem_outbox
         WHERE due_at <= now()
         ORDER BY due_at, seq
         LIMIT $3
         FOR UPDATE SKIP LOCKED)
RETURNING o.seq, o.id, o.destination, o.headers::text, o.payload, o.enqueued_at
