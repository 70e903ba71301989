-- No Idempotency-Key: the gateway only proxies (the cost of the hop).
wrk.method = "POST"
wrk.body = '{"amount": 1250, "currency": "EUR"}'
wrk.headers["Content-Type"] = "application/json"
-- UPSTREAM_DELAY_MS (from scripts/bench-gateway): how long the stand-in
-- upstream takes per request, to stand for a real service.
local delay = os.getenv("UPSTREAM_DELAY_MS")
if delay and delay ~= "0" then wrk.headers["X-Delay-Ms"] = delay end
