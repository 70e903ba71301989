-- outbox taken (token): the rows the take stamped with the token, in order.
SELECT seq, id, destination, headers, payload FROM idem_outbox WHERE taken_by = ? ORDER BY seq
