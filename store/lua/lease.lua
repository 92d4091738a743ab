-- lease.lua is prepended to advance, release and sweep. It applies a
-- lease's end (or its first token) to the replica's load, never letting a
-- counter drop below zero: a load purged while leases were out must not go
-- negative when they come back.
local function unbook(P, id, full)
  local lb = P .. 'lb'
  local body = redis.call('HGET', lb, id)
  if not body then
    redis.call('ZREM', P .. 'leases', id)
    return 0
  end
  local R, pre, dec, phase = string.match(body, '^([^,]*),(%d+),(%d+),(%d)$')
  pre, dec = tonumber(pre), tonumber(dec)
  if not full and phase == '1' then return 0 end
  local load = P .. 'load'
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
    redis.call('ZREM', P .. 'leases', id)
  else
    redis.call('HSET', lb, id, R .. ',' .. pre .. ',' .. dec .. ',1')
  end
  return 1
end
