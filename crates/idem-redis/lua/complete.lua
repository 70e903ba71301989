-- complete(record; token, response, retention ms, grace ms): 1 if stored,
-- 0 if the lease was lost (nothing written).
local function complete(key, token, response, retention, grace)
  local r = held(key, token)
  if not r then
    return 0
  end
  r.st, r.ua, r.ex = 'c', now, now + tonumber(retention)
  r.lu, r.tk, r.fc, r.fm, r.rs = 0, '', '', '', response
  save(key, r, r.ex + tonumber(grace))
  ended(key, r)
  return 1
end
