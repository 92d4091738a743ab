-- reservebest.lua books a lease on the cheapest of several replicas by
-- their loads as they are now: decisions in flight together that chose
-- the same replica are settled here, one after another, instead of by
-- lost races and retries. The cost is the router's kv cost (see
-- kvroute.ChoiceCost and the function cost below), in the same order of
-- operations, so that on unchanged loads it picks exactly what the router
-- picked.
-- KEYS = kvr:{m}:load, kvr:{m}:lb, kvr:{m}:leases
-- (and predict.lua's, prepended)
-- ARGV = request id, decode, expiry_ms, prefill scale, request weight,
--        request blocks, active blocks, bound, eps, not_after_ms, admit,
--        the prediction (now ms, µs a block, grace ms, longest due ms,
--        marks: 11 bytes each; no marks: none), overlap credit, predict
--        weight, then per choice: replica, prefill, credit, floor, held
-- A booking with marks also records the prediction on the replica it
-- books (predict.lua), due when that replica's booked prefill, its own
-- included, has run. It first credits each choice with a prediction
-- written there since the caller's lookup (predictFound: a burst's
-- decisions all look up before any books), or confirmed since (a lookup
-- leaves a confirmed record to the index, but this caller's lookup may
-- have read the index before the confirming event), when that is worth
-- more than what the caller scored.
-- admit ('1:<now ms>': under admission by the caller's clock, admit.lua, prepended) books only a choice
-- with room and only when nothing is queued before the request, unless
-- the request holds a seat, which the booking then takes.
-- not_after_ms (0: none) is the Redis time past which nothing is booked,
-- as in reserve.lua: the caller has given up on the answer.
-- Returns {status, index, then per choice its booked load and scraped
-- (absent when the first choice was booked: the caller's own pick), then
-- the predictions the booking dropped expired}:
-- status 1 booked the choice at index (1-based), 0 booked nothing (the
-- cheapest is not under the bound), 2 the request already holds a lease
-- (index: its replica among the choices, 0 if none); {3, 0} too late,
-- nothing read or booked; {4, 0} the request must queue; 5 no choice has
-- room (with the loads).
local id, dec, exp = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local scale, weight = tonumber(ARGV[4]), tonumber(ARGV[5])
local blocks, active = tonumber(ARGV[6]), tonumber(ARGV[7])
local bound, eps = tonumber(ARGV[8]), tonumber(ARGV[9])
local late = tonumber(ARGV[10])
local admit = string.sub(ARGV[11], 1, 2) == '1:'
if admit then NOW = tonumber(string.sub(ARGV[11], 3)) end
-- head is how many ARGV come before the choices: choice j's replica,
-- prefill, credit, floor and held are ARGV[head + 5j - 4 .. head + 5j];
-- the prediction's five and its two weights are the last before them. A
-- settled cost term's weight goes after admit, before the prediction, and
-- head (with the prediction's indices) grows by one.
local head = 18
local W = 5
if late > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > late then return {3, 0} end
end
local n = (#ARGV - head) / W
-- Scraped requests count only with a request weight.
local scraped = weight ~= 0
local fields = {}
for j = 1, n do
  local R = ARGV[head + W * j - 4]
  if scraped then
    fields[2 * j - 1], fields[2 * j] = R, R .. '#s'
  else
    fields[j] = R
  end
end
local cur = redis.call('HMGET', KEYS[1], unpack(fields))
local function booked(j) if scraped then return cur[2 * j - 1] else return cur[j] end end
-- The loads go back only when the caller must score again: nothing was
-- booked, or not its pick.
local expired = 0
local function reply(status, index)
  local out = {status, index}
  if not (status ~= 0 and index == 1) then
    for j = 1, n do
      out[2 * j + 1] = booked(j) or false
      out[2 * j + 2] = (scraped and cur[2 * j]) or false
    end
  end
  out[#out + 1] = expired
  return out
end
local seat = admit and seatOf(id)
local body = not seat and redis.call('HGET', KEYS[2], id)
if body then
  local R = string.match(body, '^([^,]*),')
  for j = 1, n do
    if ARGV[head + W * j - 4] == R then return reply(2, j) end
  end
  return reply(2, 0)
end
-- Each choice's prefill owed, credit and floor: as the caller scored
-- them, or as a prediction found now prices them.
local cpre, ccredit, cfloor = {}, {}, {}
for j = 1, n do
  cpre[j] = tonumber(ARGV[head + W * j - 3])
  ccredit[j] = tonumber(ARGV[head + W * j - 2])
  cfloor[j] = tonumber(ARGV[head + W * j - 1])
end
local pw = tonumber(ARGV[18])
-- The choices' predicted entries as read here, for the write below.
local pread
if ARGV[16] ~= '' and pw > 0 then
  local reps = {}
  for j = 1, n do reps[j] = ARGV[head + W * j - 4] end
  local found
  found, pread = predictFound(KEYS[1], reps, ARGV[16], tonumber(ARGV[12]))
  local credit = tonumber(ARGV[17])
  for j = 1, n do
    local f = found[j]
    local held = tonumber(ARGV[head + W * j])
    if f and f.depth > held then
      -- scoring's creditedBlocks, for a prediction the lookup missed.
      local w = pw + (1 - pw) * f.progress
      local extra = f.depth - held
      local cr = credit * (held + w * extra)
      if cr > ccredit[j] then
        local owed = math.max(blocks - f.depth, 0)
        local fl = owed
        if f.wait > extra and scale > 0 then fl = owed + (f.wait - extra) / scale end
        cpre[j], ccredit[j], cfloor[j] = owed, cr, fl
      end
    end
  end
end
-- cost is choice j's kv cost at its booked load p, d, q: scoring.ChoiceCostAt
-- (scoring/settle.go) operation by operation, requests counted as
-- scoring.ActiveRequests counts them, so that on unchanged loads it lands
-- on the router's bits. It is the one Lua function a cost term the store
-- settles is added to (its weight comes in ARGV, from store/reservebest.go,
-- and read with the others above);
-- store's TestReserveBestSettlesAsScoring holds it equal to the Go.
local function cost(j, p, d, q)
  local reqs = q
  if scraped and cur[2 * j] then
    local w, r = string.match(cur[2 * j], '^(%d+),(%d+),')
    if w and tonumber(w) + tonumber(r) > reqs then reqs = tonumber(w) + tonumber(r) end
  end
  local adj = (p + blocks) - ccredit[j]
  local floor = cfloor[j]
  if adj < floor then adj = floor end
  return scale * adj + (d + active) + weight * reqs
end
-- Under admission a choice without room is not booked.
local ok = {}
if admit then
  if mustQueue(seat) then return {4, 0} end
  local reps, pairs2 = {}, {}
  for j = 1, n do
    reps[j] = ARGV[head + W * j - 4]
    pairs2[2 * j - 1] = booked(j)
    pairs2[2 * j] = scraped and cur[2 * j]
  end
  ok = roomy(reps, pairs2, seat, not scraped)
end
-- The cheapest wins, then the less loaded, then the earlier (scoring.Settled).
local best, bestCost, bestBlocks, bestLoad
for j = 1, n do
  if not admit or ok[j] then
    local p, d, q, v = 0, 0, 0, 0
    local b = booked(j)
    if b then
      local a1, a2, a3, a4 = string.match(b, '^(%d+),(%d+),(%d+),(%d+)$')
      p, d, q, v = tonumber(a1), tonumber(a2), tonumber(a3), tonumber(a4)
    end
    local c = cost(j, p, d, q)
    local l = p + d
    if best == nil or c < bestCost - eps or (math.abs(c - bestCost) <= eps and l < bestBlocks - eps) then
      best, bestCost, bestBlocks, bestLoad = j, c, l, {p, d, q, v}
    end
  end
end
if best == nil then return reply(5, 0) end
if not (bestCost < bound - eps) then return reply(0, 0) end
local R, pre = ARGV[head + W * best - 4], cpre[best]
local ld = bestLoad
local value = (ld[1] + pre) .. ',' .. (ld[2] + dec) .. ',' .. (ld[3] + 1) .. ',' .. (ld[4] + 1)
if seat then value = takeSeat(seat, R, value) end
redis.call('HSET', KEYS[1], R, value)
redis.call('HSET', KEYS[2], id, R .. ',' .. pre .. ',' .. dec .. ',0')
redis.call('ZADD', KEYS[3], exp, id)
if scraped then cur[2 * best - 1] = value else cur[best] = value end
if ARGV[16] ~= '' and blocks - tonumber(ARGV[head + W * best]) >= PREDICT_MIN then
  expired = predictWrite(KEYS[1], R, string.sub(id, 1, 64), tonumber(ARGV[12]), ld[1] + pre, tonumber(ARGV[13]),
    tonumber(ARGV[14]), tonumber(ARGV[15]), ARGV[16], PREDICT_MAX, pread and pread[best])
end
return reply(1, best)
