-- release.lua ends a lease: everything it booked is released. Idempotent.
-- KEYS[1] = kvr:{m}:load; ARGV = prefix, request id. Returns 1 if released.
return unbook(ARGV[1], ARGV[2], true)
