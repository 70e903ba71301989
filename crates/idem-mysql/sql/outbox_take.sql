-- outbox take (lease ms, token, limit): the due rows, oldest first, moved
-- a lease ahead under the token. One statement: a row is taken by one
-- dispatcher, and a concurrent one waits for this to commit, then finds
-- the row no longer due.
UPDATE idem_outbox
   SET due_at = UTC_TIMESTAMP(6) + INTERVAL ? * 1000 MICROSECOND,
       taken_by = ?,
       attempts = attempts + 1
 WHERE due_at <= UTC_TIMESTAMP(6)
 ORDER BY due_at, seq
 LIMIT ?
