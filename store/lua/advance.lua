-- advance.lua moves a lease past its first token: its prefill blocks are
-- released, its decode blocks stay booked; prefill tokens freed may admit
-- a queued request (admit.lua). Idempotent.
-- KEYS: see lease.lua; ARGV = request id, now ms. Returns {1 if it advanced, 0}.
NOW = tonumber(ARGV[2])
local done = unbook(ARGV[1], false)
if done == 1 and queued() then dispatch(nowMs(), 16) end
return {done, WITHDRAWN}
