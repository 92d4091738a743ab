-- acquire.lua takes or renews an ownership lease: free -> taken by owner,
-- already owned by owner -> expiry pushed out, owned by another -> refused.
-- KEYS[1] = kvr:own:<name>; ARGV = owner, ttl_ms. Returns 1 if owned.
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if cur then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
