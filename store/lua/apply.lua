-- apply.lua applies one event batch of one replica atomically.
-- KEYS[1] = kvr:{m}:r:<id>:meta
-- ARGV = prefix, replica, seq, now_ms, ops: 26 bytes per op: kind (S|R|C),
--        engine hash (8, big-endian), key (8), parent key (8, zero: none),
--        tier (0 GPU, 1 host).
-- Returns {applied, stored, removed, unknown}. A batch whose seq is not newer
-- than the applied seq changes nothing, so redelivery is harmless.
--
-- R's engine-hash map P..'r:'..R..':e2r' maps engine hash (8 bytes) -> key
-- (8 bytes) .. "<gpu refs>,<host refs>"; a block leaves a tier when its
-- count drops to 0, and R's HG/HA bits at the block follow the counts.
local meta = KEYS[1]
local E2R = P .. 'r:' .. R .. ':e2r'
local seq = tonumber(ARGV[3])
local ops = ARGV[5]
local m = redis.call('HMGET', meta, 'seq', 'n')
if m[1] and tonumber(m[1]) >= seq then return {0, 0, 0, 0} end
local held = tonumber(m[2] or 0) or 0
local stored, removed, unknown = 0, 0, 0
local nops = #ops / 26

-- Prefetch every engine-hash entry and block entry the batch may touch.
local ehs, anyStore = {}, false
for i = 0, nops - 1 do
  local o = i * 26
  ehs[#ehs + 1] = sub(ops, o + 2, o + 9)
  if sub(ops, o + 1, o + 1) == 'S' then anyStore = true end
end
local eraw, ec, edirty, elist = {}, {}, {}, {}
if #ehs > 0 then
  for i = 1, #ehs, 4000 do
    local part = {unpack(ehs, i, math.min(i + 3999, #ehs))}
    local vals = redis.call('HMGET', E2R, unpack(part))
    for j = 1, #part do eraw[part[j]] = vals[j] end
  end
end
local slot = slotOf(anyStore, ARGV[4])
if not slot then
  -- R never stored anything: it holds nothing, every removal is unknown.
  for i = 0, nops - 1 do
    if sub(ops, i * 26 + 1, i * 26 + 1) == 'R' then unknown = unknown + 1 end
  end
  redis.call('HSET', meta, 'seq', ARGV[3], 'at', ARGV[4], 'n', 0)
  return {1, 0, 0, unknown}
end
do
  local want = {}
  for i = 0, nops - 1 do
    local o = i * 26
    local kind = sub(ops, o + 1, o + 1)
    if kind == 'S' then
      want[#want + 1] = sub(ops, o + 10, o + 17)
      local par = sub(ops, o + 18, o + 25)
      if par ~= Z8 then want[#want + 1] = par end
    elseif kind == 'R' then
      local v = eraw[sub(ops, o + 2, o + 9)]
      if v then want[#want + 1] = sub(v, 1, 8) end
    end
  end
  prefetch(want)
end

local function eget(eh)
  local x = ec[eh]
  if x == nil then
    local v = eraw[eh]
    if v == nil then v = redis.call('HGET', E2R, eh) end
    if v then
      local g, h = string.match(sub(v, 9), '^(%d+),(%d+)$')
      x = {k = sub(v, 1, 8), g = tonumber(g), h = tonumber(h)}
    else
      x = false
    end
    ec[eh] = x
  end
  return x or nil
end

local function emark(eh)
  if not edirty[eh] then
    edirty[eh] = true
    elist[#elist + 1] = eh
  end
end

local function eflush()
  local set, del = {}, {}
  for i = 1, #elist do
    local eh = elist[i]
    local x = ec[eh]
    if x then
      set[#set + 1] = eh
      set[#set + 1] = x.k .. x.g .. ',' .. x.h
    else
      del[#del + 1] = eh
    end
  end
  chunked('HSET', E2R, set)
  chunked('HDEL', E2R, del)
  edirty, elist = {}, {}
end

-- holdings sets R's HG/HA bits at x.k from x's counts and fixes rootedness.
local function holdings(x)
  local e = bget(x.k)
  if not e then return end
  e.hg, e.ha = put(e.hg, x.g > 0), put(e.ha, x.g + x.h > 0)
  bmark(x.k)
  fix(x.k, e)
  drop(x.k)
end

for i = 0, nops - 1 do
  local o = i * 26
  local kind = sub(ops, o + 1, o + 1)
  local eh = sub(ops, o + 2, o + 9)
  if kind == 'S' then
    local key, par, tier = sub(ops, o + 10, o + 17), sub(ops, o + 18, o + 25), byte(ops, o + 26)
    local x = eget(eh)
    if x and x.k ~= key then
      -- The engine hash now names another block: the old one is released.
      x.g, x.h = 0, 0
      holdings(x)
      held = held - 1
      x = nil
    end
    if not x then
      x = {k = key, g = 0, h = 0}
      ec[eh] = x
      held = held + 1
    end
    emark(eh)
    if tier == 0 then x.g = x.g + 1 else x.h = x.h + 1 end
    local e = bget(key)
    if not e then
      e = newEntry(par)
      bc[key] = e
      if par ~= Z8 then link(par, key) end
    elseif e.par == Z8 and par ~= Z8 and e.ha == '' then
      e.par = par
      link(par, key)
    end
    bmark(key)
    e.hg, e.ha = put(e.hg, x.g > 0), put(e.ha, true)
    fix(key, e)
    stored = stored + 1
  elseif kind == 'R' then
    local tier = byte(ops, o + 26)
    local x = eget(eh)
    if not x or (tier == 0 and x.g == 0) or (tier ~= 0 and x.h == 0) then
      unknown = unknown + 1
    else
      if tier == 0 then x.g = x.g - 1 else x.h = x.h - 1 end
      removed = removed + 1
      emark(eh)
      if x.g + x.h == 0 then
        ec[eh] = false
        held = held - 1
      end
      holdings(x)
    end
  elseif kind == 'C' then
    eflush()
    clearSlot(E2R)
    eraw, ec = {}, {}
    held = 0
  end
end

bflush()
eflush()
if held < 0 then held = 0 end
redis.call('HSET', meta, 'seq', ARGV[3], 'at', ARGV[4], 'n', held)
return {1, stored, removed, unknown}
