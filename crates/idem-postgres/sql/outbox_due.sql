SELECT EXISTS (SELECT 1 FROM {schema}.idem_outbox WHERE due_at <= now())
