-- sweep.lua releases up to ARGV[3] leases that expired before ARGV[2] (ms):
-- the bookings of scoring pods that died mid-request.
-- KEYS[1] = kvr:{m}:load; ARGV = prefix, now_ms, limit. Returns the ids.
local P = ARGV[1]
local ids = redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', '(' .. ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local done = {}
for i = 1, #ids do
  if unbook(P, ids[i], true) == 1 then done[#done + 1] = ids[i] end
end
return {#ids, done}
