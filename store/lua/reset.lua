-- reset.lua forgets a replica's event-fed entries and its applied seq, so
-- that a restarted engine's stream (seq 0 again) applies from scratch.
-- KEYS[1] = kvr:{m}:r:<id>:meta; ARGV = prefix, replica.
clearReplica(P .. 'r:' .. R .. ':e2r')
redis.call('DEL', KEYS[1])
return 1
