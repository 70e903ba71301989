-- No Idempotency-Key: the gateway only proxies (the cost of the hop).
wrk.method = "POST"
wrk.body = '{"amount": 1250, "currency": "EUR"}'
wrk.headers["Content-Type"] = "application/json"
