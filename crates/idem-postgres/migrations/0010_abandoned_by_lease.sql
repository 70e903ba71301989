-- idem 0010: the writes that end a claim find their record by the
-- primary key, however PostgreSQL planned them.
--
-- The index of abandoned records had the predicate `state =
-- 'in_progress'`, which every write that ends or extends a claim also
-- states (`... AND state = 'in_progress' AND token = $3`): the generic
-- plans PostgreSQL caches per connection, made while the table was small
-- or its statistics said few records were in progress, took that index
-- (smaller than the primary key) for those writes and read every record
-- in progress in the scope to find one. With thousands in progress (the
-- outbox's markers while a broker is away, long handlers) each
-- completion took milliseconds. Only a record in progress has a lease
-- (`lease_until` is cleared by every write that ends it), so the same
-- rows are indexed under a predicate none of those writes implies.
--
-- Building the index reads the whole table and holds off writes to it
-- while it does (it runs in the migrations' transaction). On a large
-- table create it beforehand without blocking writes, and this
-- migration only drops the old one:
--   CREATE INDEX CONCURRENTLY idem_records_leased
--       ON <schema>.idem_records (scope, lease_until)
--       WHERE lease_until IS NOT NULL;
DROP INDEX IF EXISTS {schema}.idem_records_abandoned;
CREATE INDEX IF NOT EXISTS idem_records_leased
    ON {schema}.idem_records (scope, lease_until)
    WHERE lease_until IS NOT NULL;

