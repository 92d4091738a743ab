-- lookup.lua answers, for every candidate replica, how many leading blocks of
-- a request's key chain it holds on GPU, in any tier, and approximately, plus
-- its load, in one round trip.
-- KEYS[1] = kvr:{m}:load
-- ARGV = prefix, now_ms, n replicas, replicas..., keys...
-- Returns {gpu_1..gpu_n, any_1..any_n, approx_1..approx_n,
--          booked_1, scraped_1, ..., booked_n, scraped_n}.
--
-- "Replica r holds the first d blocks" is monotone in d (it is r's rooted
-- flag on block d), so each replica's answer is found by binary search. All
-- candidates are searched jointly: a task (lo, hi, items) knows its items'
-- answers lie in [lo, hi]; one HMGET at the midpoint answers for every item
-- still in play and splits them. Probes ~ distinct answers x log2(blocks),
-- independent of how many blocks a replica holds.
local P = ARGV[1]
local now = tonumber(ARGV[2])
local nr = tonumber(ARGV[3])
local base = 3 + nr
local nk = #ARGV - base

local function search(kp, nitems, per, pred, out)
  local first = {}
  for i = 1, nitems do first[i] = i end
  local stack = {{0, nk, first}}
  while #stack > 0 do
    local t = table.remove(stack)
    local lo, hi, its = t[1], t[2], t[3]
    if lo == hi then
      for i = 1, #its do out[its[i]] = lo end
    else
      local mid = math.floor((lo + hi + 1) / 2)
      -- items of one replica are adjacent and stay so, in order.
      local fields, slot, last = {}, {}, -1
      for i = 1, #its do
        local r = math.floor((its[i] - 1) / per) + 1
        if r ~= last then
          fields[#fields + 1] = ARGV[3 + r]
          last = r
        end
        slot[i] = #fields
      end
      local vals = redis.call('HMGET', kp .. ARGV[base + mid], unpack(fields))
      local yes, no = {}, {}
      for i = 1, #its do
        if pred(vals[slot[i]], its[i]) then yes[#yes + 1] = its[i] else no[#no + 1] = its[i] end
      end
      if #no > 0 then stack[#stack + 1] = {lo, mid - 1, no} end
      if #yes > 0 then stack[#stack + 1] = {mid, hi, yes} end
    end
  end
end

local res = {}
local tiers = {}
-- item 2r-1: any tier (flag >= 1); item 2r: GPU (flag >= 2).
search(P .. 'b:', 2 * nr, 2, function(v, it)
  if not v then return false end
  return string.byte(v, -1) - 48 >= 2 - (it % 2)
end, tiers)
for r = 1, nr do res[r] = tiers[2 * r] or 0 end
for r = 1, nr do res[nr + r] = tiers[2 * r - 1] or 0 end

local approx = {}
if nk > 0 and redis.call('EXISTS', P .. 'a:' .. ARGV[base + 1]) == 1 then
  search(P .. 'a:', nr, 1, function(v, it)
    return v and tonumber(v) > now
  end, approx)
end
for r = 1, nr do res[2 * nr + r] = approx[r] or 0 end

local lf = {}
for r = 1, nr do
  lf[2 * r - 1] = ARGV[3 + r]
  lf[2 * r] = ARGV[3 + r] .. '#s'
end
if nr > 0 then
  local loads = redis.call('HMGET', KEYS[1], unpack(lf))
  for i = 1, 2 * nr do res[3 * nr + i] = loads[i] end
end
return res
