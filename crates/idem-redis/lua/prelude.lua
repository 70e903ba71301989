-- Shared by every idem script (prepended when the scripts are built).
--
-- A record is one hash: field 'm' holds the record packed with
-- struct.pack in the layout RECORD, 'rs' the response once completed, and
-- 'j:' .. name each journaled step. Packing keeps the hot path to one
-- field read and one field write per call: a claim used to read 9 fields
-- and write 13, which cost Redis more than the rest of the call.
--
-- The fields of 'm', in order: st state (p in progress, c completed,
-- f failed, r released, x deleted: a tombstone that keeps its fence), at
-- attempt, fe fence, ca created ms, ua updated ms, ex retention deadline
-- ms, lu lease deadline ms (0 unless in progress), tk token hex ('' unless
-- in progress), fp fingerprint hex ('' for none), fc/fm failure class and
-- message ('' unless failed, or released by a retryable failure), s scope,
-- k key. Numbers are doubles: exact for every millisecond and microsecond
-- time until the year 2255.
--
-- Time is the server's. Numbers given to Redis are formatted with '%d'
-- because Lua's default formatting would round integers above 10^14.

local tm = redis.call('TIME')
local now_us = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local now = math.floor(now_us / 1000)

local RECORD = '>c1I4dddddBc0Bc0Bc0I4c0I4c0I4c0'
local STATES = {p = true, c = true, f = true, r = true, x = true}

local function int(n)
  return string.format('%d', n)
end

-- Stops the script for a record it cannot read. The error's first word,
-- DAMAGED, is what the client turns into StoreError::Corrupt; the record
-- is left as it is.
local function damaged(key, why)
  error({err = 'DAMAGED record ' .. key .. ': ' .. why})
end

-- The record at `key` as a table, or nil when there is none.
local function load(key)
  local m = redis.call('HGET', key, 'm')
  if not m then
    -- Every write sets 'm', so a hash without it was not written by this
    -- idem (the field-per-value layout of earlier builds, say). Taking it
    -- for no record would restart its fence and run a finished key again.
    if redis.call('EXISTS', key) == 1 then
      damaged(key, "it has no packed record (field 'm')")
    end
    return nil
  end
  local ok, st, at, fe, ca, ua, ex, lu, tk, fp, fc, fm, s, k = pcall(struct.unpack, RECORD, m)
  if not ok then
    damaged(key, 'its fields do not unpack (' .. tostring(st) .. ')')
  end
  if not STATES[st] then
    damaged(key, 'unknown state ' .. string.format('%q', st))
  end
  return {st = st, at = at, fe = fe, ca = ca, ua = ua, ex = ex, lu = lu,
    tk = tk, fp = fp, fc = fc, fm = fm, s = s, k = k}
end

-- Writes `r` as the record at `key`, with any further field/value pairs
-- (the response).
local function save(key, r, ...)
  redis.call('HSET', key, 'm', struct.pack(RECORD, r.st, r.at, r.fe, r.ca, r.ua,
    r.ex, r.lu, #r.tk, r.tk, #r.fp, r.fp, #r.fc, r.fc, #r.fm, r.fm, #r.s, r.s,
    #r.k, r.k), ...)
end

-- The record stays in Redis `grace` ms past its retention deadline, so its
-- fence is still there to build on when the key is claimed again; Redis
-- reclaims the memory afterwards. Expiry itself is decided here, at read.
local function keep_until(key, ex, grace)
  redis.call('PEXPIREAT', key, int(ex + grace))
end

-- Tells waiters (src/notify.rs) that the record at `key` has left "in
-- progress": a publish on its own channel, which carries its hash tag.
-- Cheap with nobody subscribed.
local function ended(key)
  redis.call('PUBLISH', key .. ':done', '')
end

-- The record, or nil when it does not carry `token` in a live lease
-- (taken over, finished, deleted, expired).
local function held(key, token)
  local r = load(key)
  if not r or r.st ~= 'p' or r.tk ~= token or r.ex <= now then
    return nil
  end
  return r
end
