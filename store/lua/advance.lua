-- advance.lua moves a lease past its first token: its prefill blocks are
-- released, its decode blocks stay booked. Idempotent.
-- KEYS: see lease.lua; ARGV = request id. Returns 1 if it advanced.
return unbook(ARGV[1], false)
