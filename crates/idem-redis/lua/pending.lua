-- The outbox's pending index (idem::store::PendingSends): beside a record
-- whose completion stored messages not yet confirmed sent, its mark
-- `<record key>:o` (the same hash tag, so the same Cluster slot; declared
-- beside the record, as the journal is): the fence the record was
-- completed under and the server time (ms) until which its holder keeps
-- it, as 'FENCE:UNTIL'. Redis drops it with the record (the same expiry);
-- a mark whose record moved on (deleted, claimed again) is dropped by the
-- first taker that finds it.

-- complete_pending(record; token, response, retention ms, grace ms, memory
-- ms, hold ms): complete(), and in the same script the run's mark, held
-- for `hold` ms. 1 if stored, 0 if the lease was lost (nothing written).
local function complete_pending(key, token, response, retention, grace, memory, hold)
  local mark = pending_key(key)
  local fe, ex = complete_record(key, token, response, retention, grace, memory)
  if not fe then
    return 0
  end
  redis.call('SET', mark, int(fe) .. ':' .. int(now + tonumber(hold)),
    'PXAT', int(ex + tonumber(grace)))
  return 1
end

-- confirm(record; fence): the run's messages were confirmed sent; deletes
-- its mark if it still names `fence`. Always 1.
local function confirm(key, fence)
  local mark = pending_key(key)
  local v = redis.call('GET', mark)
  if v and string.match(v, '^(%d+):') == fence then
    redis.call('DEL', mark)
  end
  return 1
end
