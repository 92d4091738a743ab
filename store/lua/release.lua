-- release.lua ends a lease: everything it booked is released, and the
-- seat it frees admits the next queued request (admit.lua). Idempotent.
-- KEYS: see lease.lua; ARGV = request id, now ms. Returns {1 if released, predictions withdrawn}.
NOW = tonumber(ARGV[2])
local done = unbook(ARGV[1], true)
if done == 1 and queued() then dispatch(nowMs(), 16) end
return {done, WITHDRAWN}
