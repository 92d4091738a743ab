-- disown.lua gives up an ownership lease, but only the caller's own: a lease
-- that expired and was taken over by another owner is left alone.
-- KEYS[1] = kvr:own:<name>; ARGV = owner.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
