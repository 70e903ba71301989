-- partitioned inbox claim, part 1 ($1 scope, $2 key): take the key's
-- transaction advisory lock, so a concurrent duplicate waits here until
-- this transaction ends. One row (two NULL columns, the shape the client
-- reads) when taken; none when the transaction is not READ COMMITTED,
-- where the next statement's snapshot could miss a row committed while it
-- waited.
SELECT NULL::bytea, NULL::bytea
FROM (SELECT pg_advisory_xact_lock(hashtextextended('idem-inbox/{schema}/' || $1 || chr(10) || $2, 0))) AS taken
WHERE current_setting('transaction_isolation') = 'read committed'
