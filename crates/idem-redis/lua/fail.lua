-- fail(record; token, class, message, retention ms, grace ms, memory ms): a
-- retryable failure releases the record, terminal and unknown ones are
-- kept and replayed (and remembered, when memory is above 0). 1 if
-- written, 0 if the lease was lost.
local function fail(key, token, class, message, retention, grace, memory)
  local r = held(key, token)
  if not r then
    return 0
  end
  local at = memory ~= '0' and memory_key(key)
  r.st = 'f'
  if class == 'retryable' then
    r.st = 'r'
  end
  r.fc, r.fm, r.ua, r.ex = class, message, now, now + tonumber(retention)
  r.lu, r.tk = 0, ''
  save(key, r, r.ex + tonumber(grace))
  remember(at, r, memory)
  ended(key, r)
  return 1
end
