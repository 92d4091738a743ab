-- apply.lua applies one event batch of one replica atomically, or the ops of
-- consecutive batches first seq..seq in order (see Store.ApplyRun).
-- KEYS = lib's three (blk, load, slotfree), then P..'r:'..R..':meta',
--        P..'r:'..R..':e2r'
-- ARGV = replica, seq, now_ms, first seq, kinds (two bytes per op:
--        kind S|R|C, tier 0 GPU | 1 host), then for the n ops: n engine
--        hashes, n keys, n parent keys (8 big-endian bytes each; zero key: no
--        parent; empty where the kind has none), then the writer (see
--        fence.lua, prepended; empty: unfenced).
-- Returns {applied, stored, removed, unknown, R's slot or -1, predictions
-- confirmed, predictions evicted} (Go caches the slot for applyfast.lua);
-- applied is 0 (stale), 1, or 2 (applied, and R had no applied seq
-- before), -2 (fenced: another writer holds R, nothing changed) or -3
-- (the applied seq, second, is older than first seq - 1: the store lost
-- acknowledged batches; nothing changed). A GPU store of a predicted chain's end confirms R's prediction
-- (predict.lua, prepended), a GPU removal of any of its marks or a clear
-- ends it. A batch whose seq (a run whose first seq) is not
-- newer than the applied seq changes nothing, so redelivery is harmless.
--
-- R's engine-hash map P..'r:'..R..':e2r' maps engine hash (8 bytes, as
-- records under its 6-byte prefix: see lib.lua) -> key (8 bytes) and
-- "<gpu refs>,<host refs>"; a block leaves a tier when its count drops to 0,
-- and R's HG/HA bits at the block follow the counts.
--
-- The common op, a fresh engine hash storing a new block under a parent the
-- replica holds rooted (the next block of a prompt), takes a fast path that
-- writes the finished entry directly; every other op takes the general one.
local meta = KEYS[4]
local E2R = KEYS[5]
local first = tonumber(ARGV[4])
local kinds = ARGV[5]
local nops = #kinds / 2
local EH0, K0, P0 = 5, 5 + nops, 5 + 2 * nops -- op i's hash, key, parent: ARGV[EH0 + i], ...
local m = redis.call('HMGET', meta, 'seq', 'n', 'w')
if fenced(m[3], ARGV[6 + 3 * nops]) then return {-2, 0, 0, 0} end
if m[1] and tonumber(m[1]) >= first then return {0, 0, 0, 0} end
-- A run that does not follow the applied seq: the store lost batches it
-- had acknowledged (a failover, an AOF's last second). Applying it would
-- leave a hole for good: the follower replays from the stored seq.
if m[1] and tonumber(m[1]) < first - 1 then return {-3, tonumber(m[1]), 0, 0} end
claim(meta, m[3], ARGV[6 + 3 * nops])
-- Applied is 1 over an applied seq, 2 when the replica had none: its first
-- run, or the store lost or cleared its entries (see ApplyResult.NoPrior).
-- Such a run starts the replica's history in the store: its first seq is
-- kept as meta's 'from' (Store.HistoryStart), so that a follower whose
-- reply was lost can still tell.
local applied = m[1] and 1 or 2
local held = tonumber(m[2] or 0) or 0
local stored, removed, unknown = 0, 0, 0

-- Prefetch every engine-hash entry and block entry the batch may touch:
-- evals[i] is op i's engine-hash entry, bvals[i] its block and
-- bvals[nops + i] its parent, as they were before the batch (false: none).
-- Blocks are written only at the end, engine hashes also at a clear (after
-- which evals is not used: cleared marks that).
local function mget(hkey, from, to)
  local out = {}
  for i = from, to, 4000 do
    local vals = redis.call('HMGET', hkey, unpack(ARGV, i, math.min(i + 3999, to)))
    for j = 1, #vals do out[#out + 1] = vals[j] end
  end
  return out
end
-- eraw[prefix] is the e2r value of an engine-hash prefix as it is in Redis
-- (false: none); evals[i] is op i's.
local eraw, ec, edirty, elist = {}, {}, {}, {}
local evals = {}
do
  local f = {}
  for i = 1, nops do f[i] = sub(ARGV[EH0 + i], 1, 6) end
  for i = 1, nops, 4000 do
    local vals = redis.call('HMGET', E2R, unpack(f, i, math.min(i + 3999, nops)))
    for j = 1, #vals do evals[i + j - 1] = vals[j] end
  end
  for i = 1, nops do
    if f[i] ~= '' and eraw[f[i]] == nil then eraw[f[i]] = evals[i] end
  end
end
local cleared = false
local slot = slotOf(string.find(kinds, 'S', 1, true) ~= nil, ARGV[3])
if not slot then
  -- R never stored anything: it holds nothing, every removal is unknown.
  for i = 1, nops do
    if byte(kinds, 2 * i - 1) == 82 then unknown = unknown + 1 end
  end
  redis.call('HSET', meta, 'seq', ARGV[2], 'at', ARGV[3], 'n', 0)
  if applied == 2 then redis.call('HSET', meta, 'from', ARGV[4]) end
  return {applied, 0, 0, unknown, -1}
end
local bvals = mget(BLK, K0 + 1, P0 + nops)
do
  local want = {}
  for i = 1, nops do
    if byte(kinds, 2 * i - 1) == 82 then
      local v = evals[i]
      if v then
        local k = erec(v, sub(ARGV[EH0 + i], 7, 8))
        if k then want[#want + 1] = k end
      end
    end
  end
  prefetch(want)
end

-- The fast path. SB is the bitmap of R's slot alone; a fast-path block is
-- entry par | first child | TG (on GPU: rooted and held on GPU, one bitmap
-- for all four) or TH (in host memory: rooted and held in any tier), its
-- engine hash maps to key ..
-- '1,0' or '0,1'. bc[key] and ec[eh] hold the op's index until something
-- else touches them (bmat, eget); ffc[key] is the block's first child.
local SB = string.rep('\0', SI - 1) .. char(SM)
local LB = char(#SB)
local TG = '\2' .. LB .. SB
local TH = '\0\0' .. LB .. SB .. '\0' .. LB .. SB
local ffc, fast = {}, {}

bmat = function(k, i)
  local e
  if byte(kinds, 2 * i) == 0 then
    e = {par = ARGV[P0 + i], fc = ffc[k] or Z8, x = 0, rg = SB, ra = SB, hg = SB, ha = SB}
  else
    e = {par = ARGV[P0 + i], fc = ffc[k] or Z8, x = 0, rg = '', ra = SB, hg = '', ha = SB}
  end
  ffc[k] = nil
  bc[k] = e
  bmark(k)
  return e
end

-- fastE appends the fast-path engine hashes not touched since to the
-- records by prefix, pre.
local function fastE(pre)
  for j = 1, #fast do
    local i = fast[j]
    local eh = ARGV[EH0 + i]
    if ec[eh] == i then
      local p = sub(eh, 1, 6)
      local g = pre[p] or {}
      pre[p] = g
      if byte(kinds, 2 * i) == 0 then
        g[sub(eh, 7, 8)] = ARGV[K0 + i] .. '1,0'
      else
        g[sub(eh, 7, 8)] = ARGV[K0 + i] .. '0,1'
      end
    end
  end
  return pre
end

-- rawOf returns the e2r value of prefix p as it is in Redis, or false.
local function rawOf(p)
  local v = eraw[p]
  if v == nil then
    if cleared then v = false else v = redis.call('HGET', E2R, p) end
    eraw[p] = v
  end
  return v
end

local function emark(eh)
  if not edirty[eh] then
    edirty[eh] = true
    elist[#elist + 1] = eh
  end
end

local function eget(eh, i)
  local x = ec[eh]
  if type(x) == 'number' then
    local g = 1
    if byte(kinds, 2 * x) ~= 0 then g = 0 end
    x = {k = ARGV[K0 + x], g = g, h = 1 - g}
    ec[eh] = x
    emark(eh)
    return x
  end
  if x == nil then
    local v = rawOf(sub(eh, 1, 6))
    local k, g, h
    if v then k, g, h = erec(v, sub(eh, 7, 8)) end
    if k then
      x = {k = k, g = g, h = h}
    else
      x = false
    end
    ec[eh] = x
  end
  return x or nil
end


-- refs formats a pair of counts; small ones come from a table (formatting a
-- number costs more than the rest of a fast-path op).
local RS = {[0] = '0,0', '0,1', '0,2', '0,3', '1,0', '1,1', '1,2', '1,3', '2,0', '2,1', '2,2', '2,3', '3,0', '3,1', '3,2', '3,3'}
local function refs(g, h)
  if g < 4 and h < 4 then return RS[g * 4 + h] end
  return g .. ',' .. h
end

-- eflush writes every changed engine hash: the records of each prefix
-- touched are merged with those of other engine hashes under it.
local function eflush()
  local pre = fastE({})
  for i = 1, #elist do
    local eh = elist[i]
    local x = ec[eh]
    local p = sub(eh, 1, 6)
    local g = pre[p] or {}
    pre[p] = g
    if x then g[sub(eh, 7, 8)] = x.k .. refs(x.g, x.h) else g[sub(eh, 7, 8)] = false end
  end
  local set, del = {}, {}
  for p, g in pairs(pre) do
    local out = {}
    local v = rawOf(p)
    if v then
      erecs(v, function(suf, rec)
        if g[suf] == nil then out[#out + 1] = rec end
      end)
    end
    for suf, r in pairs(g) do
      if r then out[#out + 1] = suf .. r .. ';' end
    end
    if #out > 0 then
      v = table.concat(out)
      set[#set + 1] = p
      set[#set + 1] = v
    else
      v = false
      del[#del + 1] = p
    end
    eraw[p] = v
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

local pst, prm = {}, {}
for i = 1, nops do
  local kind, tier = byte(kinds, 2 * i - 1, 2 * i)
  local eh = ARGV[EH0 + i]
  local isfast = false
  if kind == 83 and tier == 0 then pst[ARGV[K0 + i]] = true end
  if kind == 83 then -- 'S'
    local key, par = ARGV[K0 + i], ARGV[P0 + i]
    if ec[eh] == nil and evals[i] == false and bc[key] == nil and bvals[i] == false then
      -- A fresh engine hash storing a new block: fast if the parent is
      -- rooted for R in the op's tier.
      local pg, pa, pf = true, true, nil
      if par ~= Z8 then
        local pe = bc[par]
        if type(pe) == 'number' then
          pf = pe
          pg, pa = byte(kinds, 2 * pe) == 0, true
        else
          if pe == nil and braw[par] == nil then braw[par] = bvals[nops + i] end
          pe = bget(par)
          if pe then pg, pa = has(pe.rg), has(pe.ra) else pg, pa = false, false end
        end
      end
      if (tier == 0 and pg) or (tier ~= 0 and pa) then
        isfast = true
        bc[key], ec[eh] = i, i
        fast[#fast + 1] = i
        held, stored = held + 1, stored + 1
        if par ~= Z8 then
          if pf and ffc[par] == nil then ffc[par] = key else link(par, key) end
        end
      end
    end
  end
  if isfast then
    -- done
  elseif kind == 83 then
    local key, par = ARGV[K0 + i], ARGV[P0 + i]
    if braw[key] == nil then braw[key] = bvals[i] end
    if braw[par] == nil then braw[par] = bvals[nops + i] end
    local x = eget(eh, i)
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
  elseif kind == 82 then -- 'R'
    local x = eget(eh, i)
    if not x or (tier == 0 and x.g == 0) or (tier ~= 0 and x.h == 0) then
      unknown = unknown + 1
    else
      if tier == 0 then prm[x.k] = true end
      if tier == 0 then x.g = x.g - 1 else x.h = x.h - 1 end
      removed = removed + 1
      emark(eh)
      if x.g + x.h == 0 then
        ec[eh] = false
        held = held - 1
      end
      holdings(x)
    end
  elseif kind == 67 then -- 'C'
    eflush()
    clearSlot(E2R)
    eraw, ec, cleared = {}, {}, true
    held = 0
  end
end

do
  local set = {}
  for j = 1, #fast do
    local i = fast[j]
    local key = ARGV[K0 + i]
    if bc[key] == i then
      set[#set + 1] = key
      if byte(kinds, 2 * i) == 0 then
        set[#set + 1] = ARGV[P0 + i] .. (ffc[key] or Z8) .. TG
      else
        set[#set + 1] = ARGV[P0 + i] .. (ffc[key] or Z8) .. TH
      end
    end
  end
  bflush(set)
end
eflush()
if held < 0 then held = 0 end
redis.call('HSET', meta, 'seq', ARGV[2], 'at', ARGV[3], 'n', held)
if applied == 2 then redis.call('HSET', meta, 'from', ARGV[4]) end
local pend = predictEnd(KEYS[2], R, pst, prm, cleared, tonumber(ARGV[3]))
return {applied, stored, removed, unknown, slot, pend[1], pend[2]}
