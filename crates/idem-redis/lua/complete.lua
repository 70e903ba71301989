-- complete(record; token, response, retention ms, grace ms): 1 if stored,
-- 0 if the lease was lost (nothing written).
local function complete(key, token, response, retention, grace)
  local r = held(key, token)
  if not r then
    return 0
  end
  r.st, r.ua, r.ex = 'c', now, now + tonumber(retention)
  r.lu, r.tk, r.fc, r.fm = 0, '', '', ''
  save(key, r, 'rs', response)
  keep_until(key, r.ex, tonumber(grace))
  ended(key)
  return 1
end
