-- extend(record; token, lease ms, grace ms): the new lease deadline (never
-- earlier than the old one), or -1 if the lease was lost.
local function extend(key, token, lease, grace)
  local r = held(key, token)
  if not r then
    return -1
  end
  local lease_until = math.max(now + tonumber(lease), tonumber(r[4]))
  local ex = math.max(tonumber(r[3]), lease_until)
  redis.call('HSET', key, 'lu', int(lease_until), 'ex', int(ex), 'ua', int(now))
  keep_until(key, ex, tonumber(grace))
  return lease_until
end
