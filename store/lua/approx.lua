-- approx.lua records that the router sent a request's chain to a replica
-- that publishes no events. Entries live apart from event-fed ones
-- (kvr:{m}:a:<key>, field replica -> expiry ms) so they never overwrite
-- them. An entry only ever moves its expiry later: every record covers a
-- chain from the root, so expiries never increase along a chain and
-- Lookup's binary search over "expiry > now" stays exact.
-- KEYS[1] = kvr:{m}:r:<id>:ak (zset key -> expiry, to purge the replica)
-- ARGV = prefix, replica, now_ms, expiry_ms, ttl_ms, keys...
local P, R = ARGV[1], ARGV[2]
local exp = tonumber(ARGV[4])
local ttl = ARGV[5]
for i = 6, #ARGV do
  local k = P .. 'a:' .. ARGV[i]
  local cur = redis.call('HGET', k, R)
  if not cur or tonumber(cur) < exp then
    redis.call('HSET', k, R, ARGV[4])
    redis.call('ZADD', KEYS[1], ARGV[4], ARGV[i])
  end
  redis.call('PEXPIRE', k, ttl)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
