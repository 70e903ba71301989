-- complete(record; token, response, retention ms, grace ms, memory ms): 1
-- if stored (and remembered, when memory is above 0), 0 if the lease was
-- lost (nothing written).

-- The same, returning the record's fence and retention deadline, or nil
-- when the lease was lost.
local function complete_record(key, token, response, retention, grace, memory)
  local at = memory ~= '0' and memory_key(key)
  local fe, ex, fp = finish(key, token, 'c', '', '', response, retention, grace)
  if not fe then
    return nil
  end
  remember(at, 'c', ex, fp, memory)
  return fe, ex
end

local function complete(key, token, response, retention, grace, memory)
  return complete_record(key, token, response, retention, grace, memory) and 1 or 0
end
