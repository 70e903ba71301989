INSERT INTO {schema}.idem_outbox (id, destination, headers, payload)
VALUES ($1, $2, $3::jsonb, $4)
