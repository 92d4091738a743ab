-- reset.lua forgets a replica's event-fed entries and its applied seq, so
-- that a restarted engine's stream (seq 0 again) applies from scratch. The
-- replica keeps its slot (its approximate entries survive).
-- KEYS = lib's three (blk, load, slotfree), then P..'r:'..R..':meta',
-- P..'r:'..R..':e2r'; ARGV = replica.
if slotOf(false) then
  clearSlot(KEYS[5])
  bflush()
end
redis.call('DEL', KEYS[4])
return 1
