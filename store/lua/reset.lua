-- reset.lua forgets a replica's event-fed entries and its applied seq, so
-- that a restarted engine's stream (seq 0 again) applies from scratch. The
-- replica keeps its slot (its approximate entries survive).
-- KEYS[1] = kvr:{m}:r:<id>:meta; ARGV = prefix, replica.
if slotOf(false) then
  clearSlot(P .. 'r:' .. R .. ':e2r')
  bflush()
end
redis.call('DEL', KEYS[1])
return 1
