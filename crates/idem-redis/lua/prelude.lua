-- Shared by every idem script (prepended when the scripts are built).
--
-- A record is one string: the record packed with struct.pack in the
-- layout RECORD, its response last. One GET reads it and one SET (with
-- PXAT, the key's expiry) writes it, so a claim makes two calls and a
-- completion two. With the record in a hash, which needs HSET and
-- PEXPIREAT apart and EXISTS to tell a foreign hash from no record, a
-- claim and its completion made eight.
--
-- The fields of RECORD, in order: st state (p in progress, c completed,
-- f failed, r released, x deleted: a tombstone that keeps its fence), at
-- attempt, fe fence, ca created ms, ua updated ms, ex retention deadline
-- ms, lu lease deadline ms (0 unless in progress), tk token hex ('' unless
-- in progress), fp fingerprint hex ('' for none), fc/fm failure class and
-- message ('' unless failed, or released by a retryable failure), s scope,
-- k key, g generation (the fence of the claim that created the record: it
-- named the record's journal in builds before 2026-11-27), w 1 once
-- someone waits for the record to end (only then does the end publish), j
-- 1 once the record has a journal, rs the response ('' unless completed).
-- Numbers are doubles: exact for every millisecond and microsecond time
-- until the year 2255.
--
-- The step journal is a hash of its own, `<record key>:j` (the same hash
-- tag, so the same Cluster slot), kept until the record's own expiry. A
-- script touches it only when it is declared (in KEYS) beside the record,
-- so that a Cluster moving the slot answers TRYAGAIN while the two are
-- apart instead of running the script on half of them: a script about to
-- touch an undeclared journal stops first, before any write, with the
-- error JOURNAL, and the client sends it again with the journal declared.
-- (On a Cluster the client declares it only then: a record without a
-- journal is one key, which a moving slot serves by ASK as before.) A
-- record reads its journal only once it is marked as having one (j), and
-- the mark is set by wiping the journal first, so a new record never reads
-- the journal of the record it replaced.
--
-- Keys remembered past their retention (design §11, idem::horizon): a
-- store that remembers keeps, beside each record that ended (completed or
-- failed), the record's memory `<record key>:h` (the same hash tag, so the
-- same Cluster slot): the day its retention ends (4 bytes, big-endian)
-- and the first 16 hex digits of its fingerprint. Redis drops it `memory`
-- ms after that day ends, so it outlives the record by the memory. It is
-- written by the end itself (Redis drops records by expiry, with nothing
-- to run as it does), holds the latest request that ended under the key,
-- and is read only by a claim that would start the key afresh. Deleting a
-- live record or releasing a parked one forgets it. A script touches it
-- only when it is declared beside the record, as the journal is; a
-- script about to read or write an undeclared memory stops first with
-- the error MEMORY.
--
-- Builds before 2026-11-27 named the journal `<record key>:j:<generation>`
-- (g below) and did not declare it. A record of theirs that has a journal
-- has it renamed to the declared name by the first script that needs it;
-- the old name is read for that alone, and only for records those builds
-- journaled (within their retention).
--
-- Builds before 2026-11-26 kept a record as a hash (RECORD_HASH in field
-- 'm', the response in 'rs', each step in 'j:' .. name). Such a record is
-- read as it is, and the first write turns it into a string, moving its
-- journal out, so a store can be upgraded without draining it.
--
-- Time is the server's. Numbers put into strings are formatted with '%d'
-- (int below) because Lua's default formatting would round integers above
-- 10^14. Numbers given to redis.call are formatted so too: Redis would
-- format a number itself with '%.17g', exactly but at a higher cost
-- (BENCHMARKS.md, "The two next steps, measured and not kept").

-- Set by a script that runs on a single server only, where every key
-- counts as declared (the batch, which names many records).
local all_declared = false

-- Whether the script's caller declared the record's (KEYS[1]) key named
-- by `suffix` beside it: ':j' its journal, ':h' its memory. Asked only
-- when the key is needed, so that a script that needs neither pays
-- nothing.
local function declared(suffix)
  if all_declared then
    return true
  end
  local name = KEYS[1] .. suffix
  for i = 2, #KEYS do
    if KEYS[i] == name then
      return true
    end
  end
  return false
end

local tm = redis.call('TIME')
local now_us = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local now = math.floor(now_us / 1000)

local RECORD = '>c1I4dddddBc0Bc0Bc0I4c0I4c0I4c0dBBI4c0'
local RECORD_HASH = '>c1I4dddddBc0Bc0Bc0I4c0I4c0I4c0'
local STATES = {p = true, c = true, f = true, r = true, x = true}
local DAY = 86400000

local function int(n)
  return string.format('%d', n)
end

-- Stops the script for a record it cannot read. The error's first word,
-- DAMAGED, is what the client turns into StoreError::Corrupt; the record
-- is left as it is.
local function damaged(key, why)
  error({err = 'DAMAGED record ' .. key .. ': ' .. why})
end

-- The record packed in `m` with `layout`, as a table.
local function unpacked(key, m, layout)
  local ok, st, at, fe, ca, ua, ex, lu, tk, fp, fc, fm, s, k, g, w, j, rs =
    pcall(struct.unpack, layout, m)
  if not ok then
    damaged(key, 'its fields do not unpack (' .. tostring(st) .. ')')
  end
  if not STATES[st] then
    damaged(key, 'unknown state ' .. string.format('%q', st))
  end
  return {st = st, at = at, fe = fe, ca = ca, ua = ua, ex = ex, lu = lu,
    tk = tk, fp = fp, fc = fc, fm = fm, s = s, k = k, g = g, w = w, j = j,
    rs = rs}
end

-- A record kept as a hash by an earlier build, marked `hash`. Its end
-- always publishes (w), as those builds did.
local function load_hash(key)
  local m = redis.call('HGET', key, 'm')
  if not m then
    -- Every write of those builds set 'm', so a hash without it was not
    -- written by idem (or by the field-per-value layout before them).
    -- Taking it for no record would restart its fence and run a finished
    -- key again.
    damaged(key, "it has no packed record (field 'm')")
  end
  local r = unpacked(key, m, RECORD_HASH)
  local rs = ''
  if r.st == 'c' then
    rs = redis.call('HGET', key, 'rs') or ''
  end
  r.g, r.w, r.j, r.rs, r.hash = r.fe, 1, 0, rs, true
  return r
end

-- The record at `key` as a table, or nil when there is none, from `m`,
-- what GET (as redis.pcall) answered for it.
local function loaded(key, m)
  if type(m) == 'table' then
    -- Not a string: a record of an earlier build, or a key of another type
    -- (whose HGET fails as a wrong type).
    return load_hash(key)
  end
  if not m then
    return nil
  end
  return unpacked(key, m, RECORD)
end

-- The record at `key` as a table, or nil when there is none.
local function load(key)
  return loaded(key, redis.pcall('GET', key))
end

-- The key of the record's step journal (KEYS[2] of its scripts). A
-- journal an earlier build kept under the generation's name is renamed to
-- it first.
local function journal(key, r)
  if not declared(':j') then
    error({err = 'JOURNAL record ' .. key .. ' needs its step journal declared'})
  end
  local steps = key .. ':j'
  if r.j == 1 and redis.call('EXISTS', steps) == 0 then
    local old = key .. ':j:' .. int(r.g)
    if redis.call('EXISTS', old) == 1 then
      redis.call('RENAME', old, steps)
    end
  end
  return steps
end

-- Turns a record kept as a hash into a string in place, its steps moved to
-- its journal. Returns the key's expiry (ms), or nil when it has none.
local function unhash(key, r)
  local steps = journal(key, r)
  local all = redis.call('HGETALL', key)
  local until_ms = redis.call('PEXPIRETIME', key)
  redis.call('DEL', key)
  r.hash = nil
  redis.call('DEL', steps)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'j:' then
      redis.call('HSET', steps, string.sub(all[i], 3), all[i + 1])
      r.j = 1
    end
  end
  if until_ms < 0 then
    return nil
  end
  if r.j == 1 then
    redis.call('PEXPIREAT', steps, int(until_ms))
  end
  return until_ms
end

-- Writes `r` as the record at `key`. `until_ms` is when Redis drops the key
-- (and the journal); nil keeps the expiry it has.
local function save(key, r, until_ms)
  if r.hash then
    local kept = unhash(key, r)
    until_ms = until_ms or kept
  end
  local m = struct.pack(RECORD, r.st, r.at, r.fe, r.ca, r.ua, r.ex, r.lu,
    #r.tk, r.tk, #r.fp, r.fp, #r.fc, r.fc, #r.fm, r.fm, #r.s, r.s, #r.k, r.k,
    r.g, r.w, r.j, #r.rs, r.rs)
  if not until_ms then
    redis.call('SET', key, m, 'KEEPTTL')
    return
  end
  -- Named before the first write: an undeclared journal stops the script.
  local steps = r.j == 1 and journal(key, r)
  redis.call('SET', key, m, 'PXAT', int(until_ms))
  if steps then
    redis.call('PEXPIREAT', steps, int(until_ms))
  end
end

-- The key of held record `r`'s journal, ready for a step: a record kept as
-- a hash becomes a string first (its steps moved), and the record is
-- marked as having a journal, so that its later writes keep the journal
-- as long as the record.
local function journaled(key, r)
  if r.hash then
    save(key, r)
  end
  if r.j ~= 1 then
    -- A journal left by a record that vanished without its own (never
    -- through idem's scripts) is not this record's.
    redis.call('DEL', journal(key, r))
    r.j = 1
    save(key, r)
  end
  return journal(key, r)
end

-- Writes step `name` as `value` to `steps`, the journal of the record at
-- `key`, which keeps it until the record's own expiry.
local function journal_step(key, steps, name, value)
  redis.call('HSET', steps, name, value)
  local until_ms = redis.call('PEXPIRETIME', key)
  if until_ms > 0 then
    redis.call('PEXPIREAT', steps, until_ms)
  end
end

-- Tells waiters (src/notify.rs) that the record at `key` has left "in
-- progress": a publish on its own channel, which carries its hash tag,
-- made only once a waiter has marked the record (watch.lua).
local function ended(key, r)
  if r.w == 1 then
    redis.call('PUBLISH', key .. ':done', '')
  end
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

-- Ends the record at `key` that `token` holds (as held() decides): state
-- `st` (c completed, f failed, r released by a retryable failure) with
-- failure class and message `fc`/`fm` and response `rs`, kept `retention`
-- ms and by Redis `grace` ms more; waiters are told. Returns the record's
-- fence, its new retention deadline and its fingerprint, or nil when the
-- lease was lost (nothing written).
--
-- A record of the current layout without a journal, the common case, is
-- unpacked into locals and packed again from them, with no table between
-- (the table and save() were about a fifth of a completion's work in
-- Redis). Every other record (one kept as a hash, one with a journal, one
-- that does not unpack) goes through load() and save(), which also say
-- DAMAGED for what cannot be read. A record in progress has no response,
-- so the one it unpacks is not kept.
local function finish(key, token, st, fc, fm, rs, retention, grace)
  local ex = now + tonumber(retention)
  local until_ms = ex + tonumber(grace)
  local m = redis.pcall('GET', key)
  if type(m) == 'string' then
    local ok, was, at, fe, ca, _, was_ex, _, tk, fp, _, _, s, k, g, w, j =
      pcall(struct.unpack, RECORD, m)
    if ok and STATES[was] and j == 0 then
      if was ~= 'p' or tk ~= token or was_ex <= now then
        return nil
      end
      redis.call('SET', key, struct.pack(RECORD, st, at, fe, ca, now, ex, 0, 0,
        '', #fp, fp, #fc, fc, #fm, fm, #s, s, #k, k, g, w, j, #rs, rs),
        'PXAT', int(until_ms))
      if w == 1 then
        redis.call('PUBLISH', key .. ':done', '')
      end
      return fe, ex, fp
    end
  end
  local r = held(key, token)
  if not r then
    return nil
  end
  r.st, r.ua, r.ex, r.lu, r.tk, r.fc, r.fm, r.rs = st, now, ex, 0, '', fc, fm, rs
  save(key, r, until_ms)
  ended(key, r)
  return r.fe, ex, r.fp
end

-- The key of the record's memory (see the top of this file). The scripts
-- that end a record name it before their first write, when the store
-- remembers (their `memory` argument is not '0'): an undeclared memory
-- stops the script first.
local function memory_key(key)
  if not declared(':h') then
    error({err = 'MEMORY record ' .. key .. ' needs its memory declared'})
  end
  return key .. ':h'
end

-- The key of the record's mark in the outbox's pending index
-- (pending.lua), named before the first write of a script that touches
-- it: an undeclared mark stops the script first.
local function pending_key(key)
  if not declared(':o') then
    error({err = 'PENDING record ' .. key .. ' needs its pending mark declared'})
  end
  return key .. ':o'
end

-- Remembers a record that has just ended in state `st` with retention
-- deadline `ex` and fingerprint `fp`, at `at` (its memory_key, or nil when
-- the store does not remember) for `memory` ms past the day its retention
-- ends: a completed or failed record only.
local function remember(at, st, ex, fp, memory)
  if not at or (st ~= 'c' and st ~= 'f') then
    return
  end
  local day = math.floor(ex / DAY)
  redis.call('SET', at, struct.pack('>I4', day) .. string.sub(fp, 1, 16),
    'PXAT', int((day + 1) * DAY + tonumber(memory)))
end

-- For a claim of `key` with fingerprint `fp` that would start the key
-- afresh (`r` is nil or expired), on a store that remembers for `memory`
-- ms: when it is a late retry, the time to name as its record's expiry,
-- else nil. A late retry repeats the last request that ended under the
-- key, whose record expired on a day the memory still keeps: the expired
-- record if Redis still holds it, else its memory. Mirrors
-- idem::horizon::late_retry.
local function late_retry(key, r, fp, memory)
  memory = tonumber(memory)
  local first_day = math.floor((now - memory) / DAY)
  local wanted = string.sub(fp, 1, 16)
  if r and (r.st == 'c' or r.st == 'f') and string.sub(r.fp, 1, 16) == wanted
      and math.floor(r.ex / DAY) >= first_day then
    return r.ex
  end
  local m = redis.call('GET', memory_key(key))
  if not m then
    return nil
  end
  if #m < 4 then
    damaged(key, 'its memory holds ' .. #m .. ' bytes, too few for a day')
  end
  local day = struct.unpack('>I4', m)
  if string.sub(m, 5) == wanted and day >= first_day then
    return day * DAY
  end
  return nil
end
