-- Every request the same Idempotency-Key (all duplicates after the first).
wrk.method = "POST"
wrk.body = '{"amount": 1250, "currency": "EUR"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = "bench-replay-key"
-- UPSTREAM_DELAY_MS (from scripts/bench-gateway): how long the stand-in
-- upstream takes per request, to stand for a real service.
local delay = os.getenv("UPSTREAM_DELAY_MS")
if delay and delay ~= "0" then wrk.headers["X-Delay-Ms"] = delay end
