-- sweep.lua releases up to ARGV[2] leases that expired before ARGV[1] (ms):
-- the bookings of scoring pods that died mid-request, and the seats
-- granted to queued requests that were never booked.
-- KEYS: see lease.lua; ARGV = now_ms, limit. Returns {leases seen, the
-- ids released, predictions withdrawn}.
NOW = tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local done = {}
for i = 1, #ids do
  if unbook(ids[i], true) == 1 then done[#done + 1] = ids[i] end
end
-- Seats the sweep freed, and tickets whose pods stopped renewing them,
-- go to the queue's next (admit.lua).
if queued() then dispatch(nowMs(), 64) end
return {#ids, done, WITHDRAWN}
