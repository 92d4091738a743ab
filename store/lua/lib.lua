-- lib.lua is prepended to every index script (apply, reset, purge). It holds
-- the block-entry codec and the "rooted" bookkeeping.
--
-- A block hash kvr:{m:<model>}:b:<key> maps each holding replica to
-- "<gpu refs>,<host refs>,<flag>" and the field "^" to the parent key. The
-- flag says how far the replica holds the block's whole chain from the root:
-- 0 not rooted, 1 rooted in some tier, 2 rooted on GPU (which implies 1).
-- Lookup relies on the flag to binary-search a request's chain, so every
-- write that changes a replica's holding of a block must fix its flag and
-- those of the replica's descendants (kvr:{m}:k:<key> lists child keys).

local P = ARGV[1]
local R = ARGV[2]

local function parse(v)
  local g, h, f = string.match(v, '^(%d+),(%d+),(%d)$')
  return tonumber(g), tonumber(h), tonumber(f)
end

local function pack(g, h, f)
  return g .. ',' .. h .. ',' .. f
end

-- calc derives R's flag on a block from its refcounts and its parent's flag.
local function calc(g, h, pf)
  if g > 0 and pf >= 2 then return 2 end
  if g + h > 0 and pf >= 1 then return 1 end
  return 0
end

-- flagOf is R's flag on parent; the virtual root ("0") is fully rooted.
local function flagOf(parent)
  if parent == false or parent == nil or parent == '0' then return 2 end
  local v = redis.call('HGET', P .. 'b:' .. parent, R)
  if not v then return 0 end
  return string.byte(v, -1) - 48
end

-- propagate recomputes R's flag on every descendant of key that R holds,
-- after R's flag on key became f. It stops where a flag does not change, so
-- a leaf store or a duplicate reference costs one SMEMBERS of an absent key.
local function propagate(key, f)
  local stack = {key, f}
  while #stack > 0 do
    local pf = table.remove(stack)
    local k = table.remove(stack)
    local kids = redis.call('SMEMBERS', P .. 'k:' .. k)
    for i = 1, #kids do
      local c = kids[i]
      local bk = P .. 'b:' .. c
      local v = redis.call('HGET', bk, R)
      if v then
        local g, h, cf = parse(v)
        local nf = calc(g, h, pf)
        if nf ~= cf then
          redis.call('HSET', bk, R, pack(g, h, nf))
          stack[#stack + 1] = c
          stack[#stack + 1] = nf
        end
      end
    end
  end
end

-- dropIfEmpty deletes a block hash no replica holds any more and unlinks it
-- from its parent's child set. The block's own child set stays: children
-- held elsewhere must be found again if the block comes back.
local function dropIfEmpty(bk, key)
  local parent = redis.call('HGET', bk, '^')
  local n = redis.call('HLEN', bk)
  if n == 0 or (n == 1 and parent) then
    redis.call('DEL', bk)
    if parent then redis.call('SREM', P .. 'k:' .. parent, key) end
  end
end

-- clearReplica forgets every block R holds. No flag propagation is needed:
-- R's flags go with its entries, and other replicas' flags do not depend on R.
local function clearReplica(e2r)
  local all = redis.call('HGETALL', e2r)
  for i = 2, #all, 2 do
    local key = all[i]
    local bk = P .. 'b:' .. key
    if redis.call('HDEL', bk, R) == 1 then dropIfEmpty(bk, key) end
  end
  redis.call('DEL', e2r)
end
