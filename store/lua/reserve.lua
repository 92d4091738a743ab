-- reserve.lua books a lease on a replica's load if the load's version is
-- still the one the caller scored on (ifVersion < 0: unconditionally), or,
-- given bounds, if the load's counters are all within them (a load at
-- which the caller's pick still wins).
-- KEYS = kvr:{m}:load, kvr:{m}:lb, kvr:{m}:leases
-- (then admit.lua's, which is prepended)
-- (and predict.lua's, prepended)
-- ARGV = request id, replica, prefill, decode, expiry_ms, ifVersion,
--        not_after_ms, admit, then the prediction (now ms, µs a block,
--        grace ms, longest due ms, marks: 11 bytes each; no marks: none)
--        [, max prefill, max decode, max requests]
-- admit ('1:<now ms>': under admission, by the caller's clock) books only on a replica with room and only
-- when nothing is queued before the request, unless the request holds a
-- seat (admit.lua), which the booking then takes.
-- not_after_ms (0: none) is the Redis time past which the booking is not
-- made: its caller has given up on it (a server that was frozen runs what
-- waited in its sockets when it resumes), and a load booked then would
-- stand, unreleased, until its lease expired.
-- Load field <replica> = "prefill,decode,requests,version"; lease bodies in
-- kvr:{m}:lb (id -> "replica,prefill,decode,phase"), expiries in kvr:{m}:leases.
-- A booking with marks also records the prediction on the replica
-- (predict.lua), due when the replica's booked prefill, its own included,
-- has run.
-- Returns {status, booked load, scraped, predictions dropped expired}: 1 booked, 0 version moved on (or
-- the load is past the bounds), 2 the request already holds a lease (a
-- retry: nothing booked twice); {3} too late, nothing read or booked; 4
-- the request must queue, 5 the replica has no room.
local late = tonumber(ARGV[7])
if late > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > late then return {3} end
end
local id, R = ARGV[1], ARGV[2]
local pre, dec = tonumber(ARGV[3]), tonumber(ARGV[4])
local ifv = tonumber(ARGV[6])
local lb = KEYS[2]
local cur = redis.call('HMGET', KEYS[1], R, R .. '#s')
local admit = string.sub(ARGV[8], 1, 2) == '1:'
if admit then NOW = tonumber(string.sub(ARGV[8], 3)) end
local seat = admit and seatOf(id)
if not seat and redis.call('HEXISTS', lb, id) == 1 then return {2, cur[1], cur[2]} end
if admit then
  if mustQueue(seat) then return {4, cur[1], cur[2]} end
  if not roomy({R}, cur, seat)[1] then return {5, cur[1], cur[2]} end
end
local p, d, n, v = 0, 0, 0, 0
if cur[1] then
  local a, b, c, e = string.match(cur[1], '^(%d+),(%d+),(%d+),(%d+)$')
  p, d, n, v = tonumber(a), tonumber(b), tonumber(c), tonumber(e)
end
if ARGV[16] then
  if p > tonumber(ARGV[14]) or d > tonumber(ARGV[15]) or n > tonumber(ARGV[16]) then
    return {0, cur[1], cur[2]}
  end
elseif ifv >= 0 and ifv ~= v then
  return {0, cur[1], cur[2]}
end
local booked = (p + pre) .. ',' .. (d + dec) .. ',' .. (n + 1) .. ',' .. (v + 1)
if seat then booked = takeSeat(seat, R, booked) end
redis.call('HSET', KEYS[1], R, booked)
redis.call('HSET', lb, id, R .. ',' .. pre .. ',' .. dec .. ',0')
redis.call('ZADD', KEYS[3], ARGV[5], id)
local expired = 0
if ARGV[13] ~= '' then
  expired = predictWrite(KEYS[1], R, string.sub(id, 1, 64), tonumber(ARGV[9]), p + pre, tonumber(ARGV[10]),
    tonumber(ARGV[11]), tonumber(ARGV[12]), ARGV[13], PREDICT_MAX)
end
return {1, booked, cur[2], expired}
