-- Every request a fresh Idempotency-Key (first deliveries).
wrk.method = "POST"
wrk.body = '{"amount": 1250, "currency": "EUR"}'
wrk.headers["Content-Type"] = "application/json"
-- UPSTREAM_DELAY_MS (from scripts/bench-gateway): how long the stand-in
-- upstream takes per request, to stand for a real service.
local delay = os.getenv("UPSTREAM_DELAY_MS")
if delay and delay ~= "0" then wrk.headers["X-Delay-Ms"] = delay end
local thread_id = 0
local counter = 0
function setup(thread)
  thread:set("id", thread_id)
  thread_id = thread_id + 1
end
function init(args)
  prefix = string.format("%d-%d-", id, os.time())
end
function request()
  counter = counter + 1
  -- wrk.format uses the table given instead of wrk.headers: copy them in.
  local headers = { ["Idempotency-Key"] = prefix .. counter }
  for name, value in pairs(wrk.headers) do headers[name] = value end
  return wrk.format(nil, nil, headers)
end
