-- fail(record; token, class, message, retention ms, grace ms, memory ms): a
-- retryable failure releases the record, terminal and unknown ones are
-- kept and replayed (and remembered, when memory is above 0). 1 if
-- written, 0 if the lease was lost.
local function fail(key, token, class, message, retention, grace, memory)
  local at = memory ~= '0' and memory_key(key)
  local st = 'f'
  if class == 'retryable' then
    st = 'r'
  end
  local fe, ex, fp = finish(key, token, st, class, message, '', retention, grace)
  if not fe then
    return 0
  end
  remember(at, st, ex, fp, memory)
  return 1
end
