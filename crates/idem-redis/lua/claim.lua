-- claim(record; token, fingerprint, lease ms, retention ms, scope, key,
-- grace ms), mirroring idem::machine::decide_claim. Replies:
--   {'A', fence, attempt, takeover 0|1, lease deadline ms}  acquired
--   {'P', ms until the lease runs out}                      in progress
--   {'C', response} | {'F', class, message} | {'M'}         stored outcome / mismatch
local function claim(key, token, fp, lease, retention, scope, name, grace)
  lease = tonumber(lease)
  retention = math.max(tonumber(retention), lease)
  grace = tonumber(grace)
  local r = redis.call('HMGET', key, 'st', 'fp', 'at', 'fe', 'ex', 'lu', 'rs', 'fc', 'fm')
  local lease_until = now + lease

  -- Fences rise per key: past the stored one while the record (or its
  -- tombstone) exists, and past the server clock in microseconds otherwise.
  local fence = now_us
  if r[4] then
    fence = math.max(fence, tonumber(r[4]) + 1)
  end

  if not r[1] or tonumber(r[5]) <= now then
    local ex = now + retention
    if r[5] then
      -- An expired record or a tombstone: start from an empty hash.
      redis.call('DEL', key)
    end
    redis.call('HSET', key, 's', scope, 'k', name, 'st', 'p', 'fp', fp,
      'at', 1, 'fe', int(fence), 'ca', int(now), 'ua', int(now), 'ex', int(ex),
      'tk', token, 'lu', int(lease_until))
    keep_until(key, ex, grace)
    return {'A', fence, 1, 0, lease_until}
  end

  if r[2] ~= fp then
    return {'M'}
  end
  local st = r[1]
  if st == 'c' then
    return {'C', r[7]}
  elseif st == 'f' then
    return {'F', r[8], r[9]}
  elseif st == 'p' and tonumber(r[6]) > now then
    return {'P', tonumber(r[6]) - now}
  end

  local takeover = 0
  if st == 'p' then
    takeover = 1
  end
  local attempt = tonumber(r[3]) + 1
  local ex = math.max(tonumber(r[5]), now + retention)
  redis.call('HDEL', key, 'fc', 'fm')
  redis.call('HSET', key, 'st', 'p', 'at', attempt, 'fe', int(fence), 'ua', int(now),
    'ex', int(ex), 'tk', token, 'lu', int(lease_until))
  keep_until(key, ex, grace)
  return {'A', fence, attempt, takeover, lease_until}
end
