-- complete(record; token, response, retention ms, grace ms, memory ms): 1
-- if stored (and remembered, when memory is above 0), 0 if the lease was
-- lost (nothing written).
local function complete_record(key, token, response, retention, grace, memory)
  local r = held(key, token)
  if not r then
    return nil
  end
  local at = memory ~= '0' and memory_key(key)
  r.st, r.ua, r.ex = 'c', now, now + tonumber(retention)
  r.lu, r.tk, r.fc, r.fm, r.rs = 0, '', '', '', response
  save(key, r, r.ex + tonumber(grace))
  remember(at, r, memory)
  ended(key, r)
  return r
end

local function complete(key, token, response, retention, grace, memory)
  return complete_record(key, token, response, retention, grace, memory) and 1 or 0
end
