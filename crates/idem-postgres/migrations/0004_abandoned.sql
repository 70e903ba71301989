-- idem 0004: finding abandoned records (in progress, lease run out) for
-- the completer without scanning the table: only in-progress rows are
-- indexed, so the index stays as small as the work in flight.
CREATE INDEX IF NOT EXISTS idem_records_abandoned
    ON {schema}.idem_records (scope, lease_until)
    WHERE state = 'in_progress';
