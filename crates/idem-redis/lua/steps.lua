-- steps(KEYS[1] record, KEYS[2] its journal): the journal as a flat list
-- of step name and value ('s' .. attempt, or 'd' .. result), or an empty
-- list when the record is absent or past its retention deadline.
local key = KEYS[1]
local r = load(key)
if not r or r.ex <= now then
  return {}
end
if r.hash then
  -- An earlier build's record: its steps are its own fields 'j:' .. name.
  local all = redis.call('HGETALL', key)
  local out = {}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'j:' then
      out[#out + 1] = string.sub(all[i], 3)
      out[#out + 1] = all[i + 1]
    end
  end
  return out
end
if r.j == 0 then
  return {}
end
return redis.call('HGETALL', journal(key, r))
