-- Every request a fresh Idempotency-Key (first deliveries).
wrk.method = "POST"
wrk.body = '{"amount": 1250, "currency": "EUR"}'
wrk.headers["Content-Type"] = "application/json"
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
  return wrk.format(nil, nil, { ["Idempotency-Key"] = prefix .. counter })
end
