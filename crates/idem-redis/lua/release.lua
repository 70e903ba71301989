-- release(record; token): 1 if released, 0 if the lease was lost. The
-- retention deadline is unchanged.
local function release(key, token)
  local r = held(key, token)
  if not r then
    return 0
  end
  r.st, r.ua, r.lu, r.tk, r.fc, r.fm = 'r', now, 0, '', '', ''
  save(key, r)
  ended(key, r)
  return 1
end
