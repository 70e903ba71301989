-- outbox enqueue (id, destination, headers JSON, payload): due at once.
INSERT INTO idem_outbox (id, destination, headers, payload, enqueued_at, due_at)
VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
