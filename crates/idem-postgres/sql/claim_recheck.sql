-- claim_recheck($1 scope, $2 key, $3 token, $4 digest, $5 fingerprint
-- prefix, $6 first day kept): after a claim that acquired a new record on
-- a schema that remembers expired keys. A purge that deleted the key's
-- expired row while the claim waited on it commits its memory of the key
-- after the claim's snapshot was taken, so the claim could not see it:
-- read the memory again, in a new snapshot, and if the key is remembered
-- with this fingerprint, delete the claim's own row (by its token) and
-- return the day, for the client to answer Forgotten.
WITH remembered AS (
    SELECT day FROM {schema}.idem_horizon
    WHERE digest = $4 AND fingerprint = $5 AND day >= $6
), undone AS (
    DELETE FROM {schema}.idem_records
    WHERE scope = $1 AND key = $2 AND token = $3 AND EXISTS (SELECT 1 FROM remembered)
)
SELECT day FROM remembered
