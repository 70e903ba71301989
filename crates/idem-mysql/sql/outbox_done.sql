-- outbox done (token, last sent seq): the confirmed rows, a prefix of the
-- taken ones in order, deleted while they are still this taker's.
DELETE FROM idem_outbox WHERE taken_by = ? AND seq <= ?
