-- purge.lua removes everything the store knows about one replica of one
-- model: event-fed entries, meta, slot, load and its leases. Its slot is
-- freed for reuse once its approximate entries have all expired (they are
-- then invisible, and the approximate sweeper drops them).
-- KEYS = lib's three (blk, load, slotfree), then P..'r:'..R..':meta',
-- P..'r:'..R..':e2r', P..'lb', P..'leases'; ARGV = replica, now_ms.
-- Returns how many leases it dropped.
local s = slotOf(false)
if s then
  clearSlot(KEYS[5])
  bflush()
  local x = tonumber(redis.call('HGET', SLOTS, R .. '#x') or 0)
  redis.call('ZADD', SLOTFREE, math.max(x, tonumber(ARGV[2])), s)
end
redis.call('DEL', KEYS[5])
redis.call('DEL', KEYS[4])
redis.call('HDEL', SLOTS, R, R .. '#s', RI, R .. '#x', R .. '#p')
if s then bumpSlots() end
local lb = KEYS[6]
local bodies = redis.call('HGETALL', lb)
local dropped = 0
for i = 1, #bodies, 2 do
  local rep = string.match(bodies[i + 1], '^([^,]*),')
  if rep == R then
    dropped = dropped + 1
    redis.call('HDEL', lb, bodies[i])
    redis.call('ZREM', KEYS[7], bodies[i])
  end
end
return dropped
