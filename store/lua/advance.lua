-- advance.lua moves a lease past its first token: its prefill blocks are
-- released, its decode blocks stay booked. Idempotent.
-- KEYS[1] = kvr:{m}:load; ARGV = prefix, request id. Returns 1 if it advanced.
return unbook(ARGV[1], ARGV[2], false)
