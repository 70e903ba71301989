-- idem 0005: the expiry index holds only records no longer in progress.
-- A claim used to insert into it and its completion to move its entry
-- (one insert and one delete a key, for a value the purge reads only once
-- the record has ended or been abandoned). In-progress records are exactly
-- the rows of the abandoned-claims index (0003), where the purge finds the
-- ones that expired.
DROP INDEX IF EXISTS idem_records_expires_at;
CREATE INDEX idem_records_expires_at ON idem_records (expires_at) WHERE state <> 0;
