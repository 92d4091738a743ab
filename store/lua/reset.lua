-- reset.lua forgets a replica's event-fed entries and its applied seq, so
-- that a restarted engine's stream (seq 0 again) applies from scratch. The
-- replica keeps its slot (its approximate entries survive) and its writer
-- (fence.lua, prepended): a reset is refused (-2, nothing changed) to any
-- writer but the one the store holds, and the one that resets keeps the
-- replica.
-- KEYS = lib's three (blk, load, slotfree), then P..'r:'..R..':meta',
-- P..'r:'..R..':e2r'; ARGV = replica, writer (empty: unfenced).
local holder = redis.call('HGET', KEYS[4], 'w')
if fenced(holder, ARGV[2]) then return -2 end
if slotOf(false) then
  clearSlot(KEYS[5])
  bflush()
end
redis.call('DEL', KEYS[4])
if ARGV[2] ~= '' then holder = ARGV[2] end
if holder then redis.call('HSET', KEYS[4], 'w', holder) end
return 1
