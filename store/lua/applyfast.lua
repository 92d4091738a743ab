-- applyfast.lua applies a batch made only of fresh chains whose block
-- entries and engine-hash values Go computed for the replica slot it
-- assumed (see Store.Apply), without lib.lua: it only verifies and writes.
-- KEYS[1] = kvr:{m}:r:<id>:meta
-- ARGV = prefix, replica, seq, now_ms, assumed slot, n, then n pairs
--        block key -> finished P..'blk' entry, then n pairs e2r field (the
--        engine hash's first 6 bytes, distinct) -> its one record.
-- Returns {1, n, 0, 0, slot} when applied, {0, 0, 0, 0} for a stale seq,
-- and {-1, 0, 0, 0, slot or -1} with nothing changed when the slot differs,
-- a block already exists or an e2r field is taken: Go then applies the
-- batch through apply.lua's general path.
local meta = KEYS[1]
local P, R = ARGV[1], ARGV[2]
local m = redis.call('HMGET', meta, 'seq', 'n')
if m[1] and tonumber(m[1]) >= tonumber(ARGV[3]) then return {0, 0, 0, 0} end
local s = redis.call('HGET', P .. 'load', R .. '#i')
if s ~= ARGV[5] then return {-1, 0, 0, 0, tonumber(s) or -1} end
local n = tonumber(ARGV[6])
local BLK, E2R = P .. 'blk', P .. 'r:' .. R .. ':e2r'
local B0, E0 = 6, 6 + 2 * n -- pair i: ARGV[B0 + 2i - 1], ARGV[B0 + 2i]
local unpack, min = unpack, math.min
for i = 1, n, 2000 do
  local j = min(i + 1999, n)
  local bk, ek = {}, {}
  for k = i, j do
    bk[k - i + 1] = ARGV[B0 + 2 * k - 1]
    ek[k - i + 1] = ARGV[E0 + 2 * k - 1]
  end
  local v = redis.call('HMGET', BLK, unpack(bk))
  for k = 1, #v do
    if v[k] then return {-1, 0, 0, 0, tonumber(s)} end
  end
  v = redis.call('HMGET', E2R, unpack(ek))
  for k = 1, #v do
    if v[k] then return {-1, 0, 0, 0, tonumber(s)} end
  end
end
for i = B0 + 1, B0 + 2 * n, 4000 do
  redis.call('HSET', BLK, unpack(ARGV, i, min(i + 3999, B0 + 2 * n)))
end
for i = E0 + 1, E0 + 2 * n, 4000 do
  redis.call('HSET', E2R, unpack(ARGV, i, min(i + 3999, E0 + 2 * n)))
end
redis.call('HSET', meta, 'seq', ARGV[3], 'at', ARGV[4], 'n', (tonumber(m[2]) or 0) + n)
return {1, n, 0, 0, tonumber(s)}
