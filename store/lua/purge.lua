-- purge.lua removes everything the store knows about one replica of one
-- model: event-fed entries, approximate entries, meta, load and its leases.
-- KEYS[1] = kvr:{m}:r:<id>:meta; ARGV = prefix, replica.
-- Returns the request ids of the dropped leases so that the caller can drop
-- them from the global request -> model map (another slot).
clearReplica(P .. 'r:' .. R .. ':e2r')
redis.call('DEL', KEYS[1])
local ak = P .. 'r:' .. R .. ':ak'
local akeys = redis.call('ZRANGE', ak, 0, -1)
for i = 1, #akeys do
  local k = P .. 'a:' .. akeys[i]
  redis.call('HDEL', k, R)
end
redis.call('DEL', ak)
redis.call('HDEL', P .. 'load', R, R .. '#s')
local lb = P .. 'lb'
local bodies = redis.call('HGETALL', lb)
local ids = {}
for i = 1, #bodies, 2 do
  local rep = string.match(bodies[i + 1], '^([^,]*),')
  if rep == R then
    ids[#ids + 1] = bodies[i]
    redis.call('HDEL', lb, bodies[i])
    redis.call('ZREM', P .. 'leases', bodies[i])
  end
end
return ids
