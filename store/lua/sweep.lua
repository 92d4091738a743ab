-- sweep.lua releases up to ARGV[2] leases that expired before ARGV[1] (ms):
-- the bookings of scoring pods that died mid-request.
-- KEYS: see lease.lua; ARGV = now_ms, limit. Returns the ids.
local ids = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local done = {}
for i = 1, #ids do
  if unbook(ids[i], true) == 1 then done[#done + 1] = ids[i] end
end
return {#ids, done}
