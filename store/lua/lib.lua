-- lib.lua is prepended to the index scripts (apply, slot, reset, purge,
-- approx). Their first three keys are lib's: KEYS[1] = P..'blk', KEYS[2] =
-- P..'load', KEYS[3] = P..'slotfree' (P = kvr:{m:<model>}:, one hash tag,
-- one Cluster slot); each script's own keys follow. ARGV[1] is the replica
-- R.
--
-- Every block of a model is one field of the hash P..'blk': the router key
-- as 8 big-endian bytes -> parent key (8) | first child key (8, zero: none)
-- | shape byte (1: bit 0 extra-children flag, bit 1 set when the four
-- bitmaps below are equal and only one is stored) | four bitmaps over
-- replica slots (or the one), each a length byte and its bytes with
-- trailing zero bytes trimmed (so equal sets are equal strings):
--   RG rooted on GPU: the slot holds this block on GPU and RG at the parent
--   RA rooted in any tier: the slot holds it in any tier and RA at the parent
--   HG holds it on GPU, HA holds it in any tier.
-- The root's parent is the zero key, which counts as rooted. RG|RA come
-- first so that lookup.lua compares the pair as one substring (of a
-- one-bitmap entry it doubles the bitmap, so equal pairs stay equal strings). Children
-- beyond the first are kept in the set P..'k:'..<key bytes> (signed decimal
-- members, an intset). An entry lives while some slot holds it (HA) or it
-- has children (so that a refilled hole finds its descendants again).
--
-- Bits are set without the bit library (miniredis's Lua lacks it): the slot
-- is byte SI (1-based) of a bitmap, bit value SM (1 << slot%8).

local BLK = KEYS[1]
local SLOTS = KEYS[2] -- slots live beside the loads: R..'#i' -> slot, '#n' next slot, '#g' changes
local SLOTFREE = KEYS[3]
-- The children sets P..'k:'..<key> are found while walking the tree, so
-- no caller can name them in advance: they are the one family of keys not
-- in KEYS, and they are built from BLK's name (so its hash tag, so its
-- slot), never from an argument.
local P = string.sub(BLK, 1, #BLK - 3)
local R = ARGV[1]
local RI = R .. '#i'
local MAXSLOT = 1024
local Z8 = '\0\0\0\0\0\0\0\0'
local floor = math.floor
local byte, char, sub = string.byte, string.char, string.sub
local U32 = 4294967296

local SI, SM = 0, 0
local function useSlot(s)
  SI = floor(s / 8) + 1
  SM = 2 ^ (s % 8)
end

-- has reports whether the current slot's bit is set in bm.
local function has(bm)
  local b = byte(bm, SI)
  return b ~= nil and floor(b / SM) % 2 == 1
end

-- put returns bm with the current slot's bit set to on, canonical.
local function put(bm, on)
  if has(bm) == on then return bm end
  local n = #bm
  if on then
    if SI > n then return bm .. string.rep('\0', SI - n - 1) .. char(SM) end
    return sub(bm, 1, SI - 1) .. char(byte(bm, SI) + SM) .. sub(bm, SI + 1)
  end
  local b = byte(bm, SI) - SM
  if SI < n then return sub(bm, 1, SI - 1) .. char(b) .. sub(bm, SI + 1) end
  bm = sub(bm, 1, SI - 1)
  if b ~= 0 then return bm .. char(b) end
  n = #bm
  while n > 0 and byte(bm, n) == 0 do n = n - 1 end
  return sub(bm, 1, n)
end

-- bumpSlots marks a change of slots: pods cache every replica's slot and
-- check '#g' with each lookup (lookup.go). It is the server's time and the
-- slot count, so that a store rebuilt from empty never repeats a value a
-- pod has cached.
local function bumpSlots()
  local t = redis.call('TIME')
  redis.call('HSET', SLOTS, '#g', t[1] .. '.' .. t[2] .. '.' .. (redis.call('HGET', SLOTS, '#n') or '0'))
end

-- slotOf returns R's slot (field R..'#i' of the load hash, so that Lookup
-- reads slots and loads with one HMGET) (allocating one when create is set: a slot freed
-- by a purge is reused once its approximate entries have all expired), or
-- nil. It also selects the slot for has/put.
local function slotOf(create, now)
  local s = redis.call('HGET', SLOTS, RI)
  if not s then
    if not create then return nil end
    local free = redis.call('ZRANGEBYSCORE', SLOTFREE, '-inf', now, 'LIMIT', 0, 1)
    if free[1] then
      redis.call('ZREM', SLOTFREE, free[1])
      s = free[1]
    else
      s = redis.call('HINCRBY', SLOTS, '#n', 1) - 1
      if s >= MAXSLOT then
        redis.call('HINCRBY', SLOTS, '#n', -1)
        error('kvroute: more than ' .. MAXSLOT .. ' replicas for one model')
      end
    end
    -- A value longer than hash-max-listpack-value keeps the load hash a
    -- real hash table: as a listpack (up to 512 fields on some servers)
    -- every HMGET field is a linear scan, 1.3 ms for 256 replicas.
    redis.call('HSET', SLOTS, RI, s, '#ht', string.rep('-', 80))
    bumpSlots()
  end
  s = tonumber(s)
  useSlot(s)
  return s
end

-- dec and k8 convert an 8-byte key to signed decimal and back (Lua numbers
-- are doubles: the arithmetic works on 32-bit halves).
local function dec(k)
  local b1, b2, b3, b4, b5, b6, b7, b8 = byte(k, 1, 8)
  local hi = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
  local lo = ((b5 * 256 + b6) * 256 + b7) * 256 + b8
  local sign = ''
  if hi >= 2147483648 then
    sign = '-'
    if lo == 0 then hi = U32 - hi else lo = U32 - lo; hi = U32 - 1 - hi end
  end
  local parts = {}
  while hi > 0 or lo >= 1000000 do
    local rh = hi % 1000000
    hi = (hi - rh) / 1000000
    local t = rh * U32 + lo
    local r = t % 1000000
    lo = (t - r) / 1000000
    table.insert(parts, 1, string.format('%06d', r))
  end
  return sign .. string.format('%d', lo) .. table.concat(parts)
end

local function k8(s)
  local neg = sub(s, 1, 1) == '-'
  if neg then s = sub(s, 2) end
  local hi, lo = 0, 0
  for i = 1, #s do
    lo = lo * 10 + (byte(s, i) - 48)
    local c = floor(lo / U32)
    lo = lo - c * U32
    hi = hi * 10 + c
  end
  if neg then
    if lo == 0 then hi = (U32 - hi) % U32 else lo = U32 - lo; hi = U32 - 1 - hi end
  end
  return char(floor(hi / 16777216) % 256, floor(hi / 65536) % 256, floor(hi / 256) % 256, hi % 256,
    floor(lo / 16777216) % 256, floor(lo / 65536) % 256, floor(lo / 256) % 256, lo % 256)
end

local function decode(v)
  local x = byte(v, 17)
  if x >= 2 then
    -- One bitmap stands for all four (the shape bit, 2, of byte 17).
    local bm = sub(v, 19, 18 + byte(v, 18))
    return {par = sub(v, 1, 8), fc = sub(v, 9, 16), x = x - 2, rg = bm, ra = bm, hg = bm, ha = bm}
  end
  local i = 18
  local n = byte(v, i)
  local rg = sub(v, i + 1, i + n)
  i = i + 1 + n
  n = byte(v, i)
  local ra = sub(v, i + 1, i + n)
  i = i + 1 + n
  n = byte(v, i)
  local hg = sub(v, i + 1, i + n)
  i = i + 1 + n
  n = byte(v, i)
  return {par = sub(v, 1, 8), fc = sub(v, 9, 16), x = x, rg = rg, ra = ra, hg = hg,
    ha = sub(v, i + 1, i + n)}
end

-- tails caches the encoded end of entries whose four bitmaps are one set
-- (held and rooted on GPU by the same slots, nearly every entry: shape byte
-- x + 2, one bitmap) and of those held only off GPU (RG = HG = '', RA = HA).
local tails, xtails, htails = {}, {}, {}

local function encode(e)
  local rg, ra = e.rg, e.ra
  if rg == ra and rg == e.hg and rg == e.ha then
    local c = tails
    if e.x == 1 then c = xtails end
    local t = c[rg]
    if not t then
      t = char(e.x + 2, #rg) .. rg
      c[rg] = t
    end
    return e.par .. e.fc .. t
  end
  if e.x == 0 and rg == '' and e.hg == '' and ra == e.ha then
    local t = htails[ra]
    if not t then
      local l = char(#ra)
      t = '\0\0' .. l .. ra .. '\0' .. l .. ra
      htails[ra] = t
    end
    return e.par .. e.fc .. t
  end
  return e.par .. e.fc .. char(e.x, #rg) .. rg .. char(#ra) .. ra .. char(#e.hg) .. e.hg .. char(#e.ha) .. e.ha
end

-- Block entries are read once and written back once per script: bc caches
-- decoded entries (false: absent), braw holds prefetched raw values. apply.lua
-- also keeps a block it wrote by its fast path as the op's index (a number)
-- in bc, turned into a decoded entry by bmat when something else touches it.
local braw, bc, bdirty, blist = {}, {}, {}, {}
local bmat

local function chunked(cmd, key, list)
  for i = 1, #list, 4000 do
    redis.call(cmd, key, unpack(list, i, math.min(i + 3999, #list)))
  end
end

local function prefetch(keys)
  for i = 1, #keys, 4000 do
    local part = {unpack(keys, i, math.min(i + 3999, #keys))}
    local vals = redis.call('HMGET', BLK, unpack(part))
    for j = 1, #part do
      if braw[part[j]] == nil then braw[part[j]] = vals[j] end
    end
  end
end

local function bget(k)
  local e = bc[k]
  if e == nil then
    local v = braw[k]
    if v == nil then v = redis.call('HGET', BLK, k) end
    if v then e = decode(v) else e = false end
    bc[k] = e
  elseif type(e) == 'number' then
    e = bmat(k, e)
  end
  return e or nil
end

local function bmark(k)
  if not bdirty[k] then
    bdirty[k] = true
    blist[#blist + 1] = k
  end
end

-- bflush writes every changed entry, after the field-value pairs in set
-- (optional) that the caller has ready.
local function bflush(set)
  local del = {}
  set = set or {}
  for i = 1, #blist do
    local k = blist[i]
    local e = bc[k]
    if e then
      set[#set + 1] = k
      set[#set + 1] = encode(e)
    else
      del[#del + 1] = k
    end
  end
  chunked('HSET', BLK, set)
  chunked('HDEL', BLK, del)
  bdirty, blist = {}, {}
end

local function newEntry(par)
  return {par = par, fc = Z8, x = 0, rg = '', ra = '', hg = '', ha = ''}
end

local function kidsKey(k) return P .. 'k:' .. k end

-- link records ck as a child of pk, creating a placeholder entry for a
-- parent not stored yet.
local function link(pk, ck)
  local pe = bget(pk)
  if not pe then
    pe = newEntry(Z8)
    bc[pk] = pe
  end
  if pe.fc == Z8 then
    pe.fc = ck
  elseif pe.fc ~= ck then
    redis.call('SADD', kidsKey(pk), dec(ck))
    pe.x = 1
  end
  bmark(pk)
end

-- drop deletes k's entry if nobody holds it and it has no children, and
-- unlinks it from its parent, which may cascade upwards.
local function drop(k)
  while true do
    local e = bget(k)
    if not e or e.ha ~= '' or e.fc ~= Z8 then return end
    bc[k] = false
    bmark(k)
    local pk = e.par
    if pk == Z8 then return end
    local pe = bget(pk)
    if not pe then return end
    local kk = kidsKey(pk)
    if pe.fc == k then
      if pe.x == 1 then
        pe.fc = k8(redis.call('SPOP', kk))
        if redis.call('EXISTS', kk) == 0 then pe.x = 0 end
      else
        pe.fc = Z8
      end
    elseif pe.x == 1 then
      redis.call('SREM', kk, dec(k))
      if redis.call('EXISTS', kk) == 0 then pe.x = 0 end
    end
    bmark(pk)
    k = pk
  end
end

local function children(k, e)
  local out = {}
  if e.fc ~= Z8 then out[1] = e.fc end
  if e.x == 1 then
    local m = redis.call('SMEMBERS', kidsKey(k))
    for i = 1, #m do out[#out + 1] = k8(m[i]) end
  end
  return out
end

-- fix recomputes the slot's RG/RA bits at k from its HG/HA bits and the
-- parent's RG/RA; when they flip, the slot's holdings below k are
-- recomputed the same way (an explicit stack, not recursion).
local function fix(k, e)
  local pg, pa = true, true
  if e.par ~= Z8 then
    local pe = bget(e.par)
    if pe then pg, pa = has(pe.rg), has(pe.ra) else pg, pa = false, false end
  end
  local ng, na = pg and has(e.hg), pa and has(e.ha)
  if ng == has(e.rg) and na == has(e.ra) then return end
  e.rg, e.ra = put(e.rg, ng), put(e.ra, na)
  bmark(k)
  local stack = {k}
  while #stack > 0 do
    local pk = table.remove(stack)
    local pe = bget(pk)
    local g, a = has(pe.rg), has(pe.ra)
    local kids = children(pk, pe)
    for i = 1, #kids do
      local c = kids[i]
      local ce = bget(c)
      if ce and has(ce.ha) then
        local cg = g and has(ce.hg)
        if cg ~= has(ce.rg) or a ~= has(ce.ra) then
          ce.rg, ce.ra = put(ce.rg, cg), put(ce.ra, a)
          bmark(c)
          stack[#stack + 1] = c
        end
      end
    end
  end
end

-- R's engine-hash map P..'r:'..R..':e2r' is keyed by the first 6 bytes of
-- the engine hash (a 6-byte field and a value of up to 14 bytes fit
-- jemalloc's 8- and 16-byte classes); the value is one record per engine
-- hash with that prefix (nearly always one): the last 2 bytes of the
-- engine hash, the block key (8), "<gpu refs>,<host refs>" and ';'.

-- erec returns the key and counts of the record of suffix suf in the e2r
-- value v, or nil.
local function erec(v, suf)
  local i, n = 1, #v
  while i < n do
    local j = string.find(v, ';', i + 10, true)
    if sub(v, i, i + 1) == suf then
      local g, h = string.match(sub(v, i + 10, j - 1), '^(%d+),(%d+)$')
      return sub(v, i + 2, i + 9), tonumber(g), tonumber(h)
    end
    i = j + 1
  end
  return nil
end

-- erecs calls fn(suffix, record) for every record of the e2r value v.
local function erecs(v, fn)
  local i, n = 1, #v
  while i < n do
    local j = string.find(v, ';', i + 10, true)
    fn(sub(v, i, i + 1), sub(v, i, j))
    i = j + 1
  end
end

-- clearSlot forgets every block the slot holds (walking R's engine-hash map
-- e2r) and deletes e2r. Other slots' bits never depend on this one, so no
-- propagation is needed.
local function clearSlot(e2r)
  local all = redis.call('HGETALL', e2r)
  for i = 2, #all, 2 do
    erecs(all[i], function(_, rec)
      local k = sub(rec, 3, 10)
      local e = bget(k)
      if e then
        e.rg, e.ra, e.hg, e.ha = put(e.rg, false), put(e.ra, false), put(e.hg, false), put(e.ha, false)
        bmark(k)
        drop(k)
      end
    end)
  end
  redis.call('DEL', e2r)
end
