DELETE FROM {schema}.idem_outbox WHERE seq = ANY($1) AND taken_by = $2
