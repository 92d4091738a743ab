-- lookup.lua answers which leading blocks of a request's key chain every
-- replica slot holds.
-- KEYS = kvr:{m}:blk, kvr:{m}:ax
-- ARGV = now_ms, keys (8 big-endian bytes each, one string), then hint
-- positions (decimal, any order): where the caller expects run ends, from
-- earlier lookups of chains sharing this prefix. Hints only add probes to
-- the first level; the search below proves every run whatever they say, so
-- a wrong hint costs one field, never a wrong answer.
-- The candidates' slots and loads are read by a plain HMGET pipelined with
-- this script (Redis turns a long reply into Lua values slowly).
-- Returns {segments, approx segments}: segments is a flat
-- list, in no order, of (position, RG|RA substring) for the last position
-- of every maximal run of equal non-empty values; approx segments likewise
-- with the string of 2-byte slots whose approximate entry is live. Go decodes the bitmaps: a slot's GPU match is
-- 1 + the largest position whose RG has it.
--
-- Along a request's chain v(p) = RG|RA of block p only shrinks (as sets,
-- canonical strings), so v(lo) == v(hi) proves every position between equal.
-- The search keeps the open ranges [lo, hi] with v(lo) ~= v(hi), hi > lo + 1
-- and reads all their midpoints with ONE HMGET per level: about log2(n)
-- HMGETs in all, each with one field per distinct answer boundary.
local now = tonumber(ARGV[1])
local blob = ARGV[2]
local n = #blob / 8
local sub, byte = string.sub, string.byte
local floor = math.floor

local function kat(p) return sub(blob, 8 * p + 1, 8 * p + 8) end

local function evVal(v)
  if not v then return '' end
  local a = byte(v, 18)
  if byte(v, 17) >= 2 then
    -- One bitmap for all four: RG|RA is it twice.
    if a == 0 then return '' end
    local g = sub(v, 18, 18 + a)
    return g .. g
  end
  local b = byte(v, 19 + a)
  if a + b == 0 then return '' end
  return sub(v, 18, 19 + a + b)
end

local function axVal(v)
  if not v then return '' end
  local out = {}
  for i = 1, #v, 8 do
    local b1, b2, b3, b4, b5, b6 = byte(v, i + 2, i + 7)
    if ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6 > now then
      out[#out + 1] = sub(v, i, i + 1)
    end
  end
  return table.concat(out)
end

-- The first level's probes: both ends and the hints inside, sorted.
local function probes(hinted)
  local ps = {0}
  if hinted then
    local seen = {[0] = true, [n - 1] = true}
    for i = 3, #ARGV do
      local h = tonumber(ARGV[i])
      if h and h > 0 and h < n - 1 and not seen[h] then
        seen[h] = true
        ps[#ps + 1] = h
      end
    end
    table.sort(ps)
  end
  if n > 1 then ps[#ps + 1] = n - 1 end
  return ps
end

local function search(hkey, conv, hinted)
  local segs = {}
  if n == 0 then return segs end
  local val = {}
  local ps = probes(hinted)
  local fields = {}
  for i = 1, #ps do fields[i] = kat(ps[i]) end
  local first = redis.call('HMGET', hkey, unpack(fields))
  val[0] = conv(first[1])
  if val[0] == '' then return segs end
  for i = 2, #ps do val[ps[i]] = conv(first[i]) end
  -- Open ranges between consecutive probes that differ; a change between
  -- neighbours is a run's end.
  local open = {}
  for i = 1, #ps - 1 do
    local lo, hi = ps[i], ps[i + 1]
    if val[lo] ~= val[hi] then
      if hi - lo > 1 then
        open[#open + 1] = lo; open[#open + 1] = hi
      elseif val[lo] ~= '' then
        segs[#segs + 1] = lo; segs[#segs + 1] = val[lo]
      end
    end
  end
  while #open > 0 do
    local mids, fields = {}, {}
    for i = 1, #open, 2 do
      local mid = floor((open[i] + open[i + 1]) / 2)
      mids[#mids + 1] = mid
      fields[#fields + 1] = kat(mid)
    end
    local vals = redis.call('HMGET', hkey, unpack(fields))
    local nxt = {}
    for j = 1, #mids do
      local lo, hi, mid = open[2 * j - 1], open[2 * j], mids[j]
      local v = conv(vals[j])
      val[mid] = v
      if v ~= val[lo] then
        if mid - lo > 1 then
          nxt[#nxt + 1] = lo; nxt[#nxt + 1] = mid
        elseif val[lo] ~= '' then
          segs[#segs + 1] = lo; segs[#segs + 1] = val[lo]
        end
      end
      if v ~= val[hi] then
        if hi - mid > 1 then
          nxt[#nxt + 1] = mid; nxt[#nxt + 1] = hi
        elseif v ~= '' then
          segs[#segs + 1] = mid; segs[#segs + 1] = v
        end
      end
    end
    open = nxt
  end
  if val[n - 1] ~= '' then
    segs[#segs + 1] = n - 1
    segs[#segs + 1] = val[n - 1]
  end
  return segs
end

return {search(KEYS[1], evVal, true), search(KEYS[2], axVal, false)}
