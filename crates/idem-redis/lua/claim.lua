-- claim(record; token, fingerprint, lease ms, retention ms, scope, key,
-- grace ms, memory ms), mirroring idem::machine::decide_claim, and
-- idem::horizon::late_retry when the store remembers (memory above 0).
-- Replies:
--   {'A', fence, attempt, takeover 0|1, lease deadline ms}  acquired
--   {'P', ms until the lease runs out}                      in progress
--   {'C', response} | {'F', class, message} | {'M'}         stored outcome / mismatch
--   {'G', expiry ms}                                        a late retry, forgotten

-- A new record in progress, packed: attempt 1 under `fence`, its lease
-- until `lease_until`, kept until `ex`.
local function new_record(fence, lease_until, ex, token, fp, scope, name)
  return struct.pack(RECORD, 'p', 1, fence, now, now, ex, lease_until,
    #token, token, #fp, fp, 0, '', 0, '', #scope, scope, #name, name,
    fence, 0, 0, 0, '')
end

-- The answer to a claim with fingerprint `fp` of a live record (its
-- retention not run out) in state `st` with fingerprint `was_fp`, lease
-- deadline `lu`, failure `fc`/`fm` and response `rs`: a mismatch, the
-- stored outcome or a duplicate in progress; nil, with the fingerprints
-- equal, when the claim may take the record (released, or its lease run
-- out) or the record is a tombstone.
local function answered(fp, st, was_fp, lu, fc, fm, rs)
  if was_fp ~= fp then
    return {'M'}
  elseif st == 'c' then
    return {'C', rs}
  elseif st == 'f' then
    return {'F', fc, fm}
  elseif st == 'p' and lu > now then
    return {'P', lu - now}
  end
  return nil
end

local function claim(key, token, fp, lease, retention, scope, name, grace, memory)
  lease = tonumber(lease)
  retention = math.max(tonumber(retention), lease)
  grace = tonumber(grace)
  local lease_until = now + lease
  local ex = now + retention
  local m = redis.pcall('GET', key)
  -- A live record of the current layout answers from locals, with no
  -- table: a replay, a mismatch, a duplicate in progress. Every other
  -- record (one to take over or start afresh, one of an earlier layout,
  -- one that does not unpack) goes on through loaded(), which also says
  -- DAMAGED for what cannot be read. A new key, the common case, is told
  -- apart first (GET answered false), without a call of type().
  if m and type(m) == 'string' then
    local ok, st, _, _, _, _, was_ex, lu, _, was_fp, fc, fm, _, _, _, _, _, rs =
      pcall(struct.unpack, RECORD, m)
    if ok and STATES[st] and was_ex > now then
      local answer = answered(fp, st, was_fp, lu, fc, fm, rs)
      if answer then
        return answer
      end
    end
  end
  local r = loaded(key, m)

  -- Fences rise per key: past the stored one while the record (or its
  -- tombstone) exists, and past the server clock in microseconds otherwise.
  local fence = now_us
  if r then
    fence = math.max(fence, r.fe + 1)
  end

  if not r or r.ex <= now then
    local expired_at = memory ~= '0' and late_retry(key, r, fp, memory)
    if expired_at then
      return {'G', expired_at}
    end
    -- No record, an expired one or a tombstone: a new record (SET replaces
    -- whatever the key held), with a new journal.
    if r and r.j == 1 then
      redis.call('DEL', journal(key, r))
    end
    redis.call('SET', key, new_record(fence, lease_until, ex, token, fp, scope,
      name), 'PXAT', int(ex + grace))
    return {'A', fence, 1, 0, lease_until}
  end

  local answer = answered(fp, r.st, r.fp, r.lu, r.fc, r.fm, r.rs)
  if answer then
    return answer
  end
  local st = r.st
  if st == 'x' then
    damaged(key, 'a tombstone that has not expired')
  end

  local takeover = 0
  if st == 'p' then
    takeover = 1
  end
  r.st, r.at, r.fe, r.ua, r.lu, r.tk = 'p', r.at + 1, fence, now, lease_until, token
  r.ex = math.max(r.ex, now + retention)
  r.fc, r.fm = '', ''
  save(key, r, r.ex + grace)
  return {'A', fence, r.at, takeover, lease_until}
end
