-- extend(record; token, lease ms, grace ms): the new lease deadline (never
-- earlier than the old one), or -1 if the lease was lost.
local function extend(key, token, lease, grace)
  local r = held(key, token)
  if not r then
    return -1
  end
  r.lu = math.max(now + tonumber(lease), r.lu)
  r.ex = math.max(r.ex, r.lu)
  r.ua = now
  save(key, r, r.ex + tonumber(grace))
  return r.lu
end
