-- release.lua ends a lease: everything it booked is released. Idempotent.
-- KEYS: see lease.lua; ARGV = request id. Returns 1 if released.
return unbook(ARGV[1], true)
