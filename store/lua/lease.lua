-- lease.lua is prepended to advance, release and sweep. It applies a
-- lease's end (or its first token) to the replica's load, never letting a
-- counter drop below zero: a load purged while leases were out must not go
-- negative when they come back.
-- KEYS = P..'load', P..'lb' (lease bodies), P..'leases' (expiries), then
-- admit.lua's, which is prepended before it. A grant (phase 2, admit.lua)
-- holds one request and no blocks: only its end (full) releases it.
-- A lease's predicted entry (predict.lua, prepended before this) is made
-- due at its first token, and withdrawn when the lease ends without one:
-- WITHDRAWN counts those.
local WITHDRAWN = 0
local function unbook(id, full)
  local load, lb, leases = KEYS[1], KEYS[2], KEYS[3]
  local body = redis.call('HGET', lb, id)
  if not body then
    redis.call('ZREM', leases, id)
    return 0
  end
  local R, pre, dec, phase = string.match(body, '^([^,]*),(%d+),(%d+),(%d)$')
  pre, dec = tonumber(pre), tonumber(dec)
  if not full and phase ~= '0' then return 0 end
  if phase == '0' then
    if full then
      WITHDRAWN = WITHDRAWN + predictWithdraw(load, R, string.sub(id, 1, 64))
    else
      predictAdvance(load, R, string.sub(id, 1, 64), NOW)
    end
  end
  local cur = redis.call('HGET', load, R)
  if cur then
    local a, b, c, e = string.match(cur, '^(%d+),(%d+),(%d+),(%d+)$')
    local p, d, n, v = tonumber(a), tonumber(b), tonumber(c), tonumber(e)
    if phase == '0' then p = math.max(p - pre, 0) end
    if full then
      d = math.max(d - dec, 0)
      n = math.max(n - 1, 0)
    end
    redis.call('HSET', load, R, p .. ',' .. d .. ',' .. n .. ',' .. (v + 1))
  end
  if full then
    redis.call('HDEL', lb, id)
    redis.call('ZREM', leases, id)
  else
    redis.call('HSET', lb, id, R .. ',' .. pre .. ',' .. dec .. ',1')
  end
  return 1
end
