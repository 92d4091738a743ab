-- purge.lua removes everything the store knows about one replica of one
-- model: event-fed entries, meta, slot, load and its leases. Its slot is
-- freed for reuse once its approximate entries have all expired (they are
-- then invisible, and the approximate sweeper drops them).
-- KEYS[1] = kvr:{m}:r:<id>:meta; ARGV = prefix, replica, now_ms.
-- Returns the request ids of the dropped leases so that the caller can drop
-- them from the global request -> model map (another slot).
local s = slotOf(false)
if s then
  clearSlot(P .. 'r:' .. R .. ':e2r')
  bflush()
  local x = tonumber(redis.call('HGET', SLOTS, R .. '#x') or 0)
  redis.call('ZADD', SLOTFREE, math.max(x, tonumber(ARGV[3])), s)
end
redis.call('DEL', P .. 'r:' .. R .. ':e2r')
redis.call('DEL', KEYS[1])
redis.call('HDEL', P .. 'load', R, R .. '#s', RI, R .. '#x')
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
