-- approx.lua records that the router sent a request's chain to a replica
-- that publishes no events. Entries live apart from event-fed ones, in the
-- hash P..'ax': key (8 bytes) -> pairs sorted by slot of slot (2 bytes,
-- big-endian) and expiry ms (6 bytes, big-endian). An expiry only moves
-- later and every record covers a chain from the root, so expiries never
-- increase along a chain and Lookup's search over "expiry > now" is exact.
-- Every pair whose expiry moves into a new minute is listed under that
-- minute (list P..'axb:'<minute>, minutes in zset P..'axq') for sweep_approx.
-- KEYS = lib's three (blk, load, slotfree), then P..'ax', P..'axq' and
-- P..'axb:'..<the expiry's minute> (Go computes the minute as this script
-- does: the script checks it); ARGV = replica, now_ms, expiry_ms, keys (8n
-- bytes)
local AX, AXQ, AXB = KEYS[4], KEYS[5], KEYS[6]
local now, exp, blob = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local s = slotOf(true, ARGV[2])
local s2 = char(floor(s / 256), s % 256)
local exp6 = char(floor(exp / 1099511627776) % 256, floor(exp / 4294967296) % 256,
  floor(exp / 16777216) % 256, floor(exp / 65536) % 256, floor(exp / 256) % 256, exp % 256)
local G = 60000
local nb = floor(exp / G)
if AXB ~= P .. 'axb:' .. nb then error('kvroute: approx: minute list ' .. AXB .. ' for minute ' .. nb) end
local keys = {}
for i = 1, #blob, 8 do keys[#keys + 1] = sub(blob, i, i + 7) end
local set, push = {}, {}
for c = 1, #keys, 4000 do
  local part = {unpack(keys, c, math.min(c + 3999, #keys))}
  local vals = redis.call('HMGET', AX, unpack(part))
  for j = 1, #part do
    local v = vals[j] or ''
    local at, found = #v + 1, false
    for i = 1, #v, 8 do
      local ps = byte(v, i) * 256 + byte(v, i + 1)
      if ps >= s then
        at, found = i, ps == s
        break
      end
    end
    local nv
    if found then
      local b1, b2, b3, b4, b5, b6 = byte(v, at + 2, at + 7)
      local old = ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6
      if old < exp then
        nv = sub(v, 1, at + 1) .. exp6 .. sub(v, at + 8)
        if floor(old / G) ~= nb then push[#push + 1] = part[j] end
      end
    else
      nv = sub(v, 1, at - 1) .. s2 .. exp6 .. sub(v, at)
      push[#push + 1] = part[j]
    end
    if nv then
      set[#set + 1] = part[j]
      set[#set + 1] = nv
    end
  end
end
chunked('HSET', AX, set)
if #push > 0 then
  chunked('RPUSH', AXB, push)
  redis.call('ZADD', AXQ, (nb + 1) * G, nb)
end
local x = tonumber(redis.call('HGET', SLOTS, R .. '#x') or 0)
if x < exp then redis.call('HSET', SLOTS, R .. '#x', ARGV[3]) end
return 1
