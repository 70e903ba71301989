-- idem 0003: finding abandoned records (in progress, lease run out) for
-- the completer without scanning the table: only in-progress rows are
-- indexed, so the index stays as small as the work in flight.
CREATE INDEX idem_records_abandoned ON idem_records (scope, lease_until) WHERE state = 0;
