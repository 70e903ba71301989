-- ttl($1 scope, $2 key, $3 sha256 of a response): whole milliseconds a
-- live record completed with that response has left, by the server's clock
-- (rounded down, so a cache never outlives the record).
SELECT floor(extract(epoch FROM expires_at - now()) * 1000)::bigint
FROM {schema}.idem_records
WHERE scope = $1 AND key = $2 AND expires_at > now()
  AND state = 'completed' AND sha256(response) = $3
