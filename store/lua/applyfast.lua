-- applyfast.lua applies a batch made only of fresh chains whose block
-- entries and engine-hash values Go computed for the replica slot it
-- assumed (see Store.Apply), without lib.lua: it only verifies and writes.
-- KEYS = P..'r:'..R..':meta', P..'load', P..'blk', P..'r:'..R..':e2r'
-- ARGV = replica, seq, now_ms, assumed slot, n, first seq, blocks,
--        engine hashes, writer (see fence.lua, prepended). The ops may be those of consecutive batches first
--        seq..seq (see Store.ApplyRun). blocks packs n records block key (8)
--        | entry length (2, big-endian) | finished P..'blk' entry; engine
--        hashes packs n records e2r field (the engine hash's first 6 bytes,
--        distinct) | its one record (14). Two strings rather than 4n
--        arguments: Redis parses and converts each argument, which cost more
--        than the script's string.sub calls.
-- Returns {applied, n, 0, 0, slot, predictions confirmed, 0} when applied (1, or 2 when the replica
-- had no applied seq: see apply.lua), {0, 0, 0, 0} for a stale seq
-- (the applied seq is first seq or newer), and {-1, 0, 0, 0, slot or -1}
-- with nothing changed when the slot differs, a block already exists or an
-- e2r field is taken: Go then applies the batch through apply.lua's general
-- path; {-2, 0, 0, 0} when another writer holds R, {-3, applied seq, 0, 0}
-- when the applied seq is older than first seq - 1 (nothing changed).
local meta, BLK, E2R = KEYS[1], KEYS[3], KEYS[4]
local R = ARGV[1]
local m = redis.call('HMGET', meta, 'seq', 'n', 'w')
if fenced(m[3], ARGV[9]) then return {-2, 0, 0, 0} end
if m[1] and tonumber(m[1]) >= tonumber(ARGV[6]) then return {0, 0, 0, 0} end
if m[1] and tonumber(m[1]) < tonumber(ARGV[6]) - 1 then return {-3, tonumber(m[1]), 0, 0} end -- as in apply.lua
local applied = m[1] and 1 or 2 -- as in apply.lua
local s = redis.call('HGET', KEYS[2], R .. '#i')
if s ~= ARGV[4] then return {-1, 0, 0, 0, tonumber(s) or -1} end
local n = tonumber(ARGV[5])
local B, E = ARGV[7], ARGV[8]
local byte, sub, unpack, min = string.byte, string.sub, unpack, math.min
-- bk, ek: the fields to check; bs, es: the field-value pairs to write.
local bk, ek, bs, es = {}, {}, {}, {}
local p = 1
for k = 1, n do
  local key = sub(B, p, p + 7)
  local hi, lo = byte(B, p + 8, p + 9)
  local q = p + 10 + hi * 256 + lo
  bk[k], bs[2 * k - 1], bs[2 * k] = key, key, sub(B, p + 10, q - 1)
  p = q
  q = 20 * k - 19
  local f = sub(E, q, q + 5)
  ek[k], es[2 * k - 1], es[2 * k] = f, f, sub(E, q + 6, q + 19)
end
if p ~= #B + 1 or #E ~= 20 * n then error('kvroute: applyfast: bad arguments') end
for i = 1, n, 4000 do
  local j = min(i + 3999, n)
  local v = redis.call('HMGET', BLK, unpack(bk, i, j))
  for k = 1, #v do
    if v[k] then return {-1, 0, 0, 0, tonumber(s)} end
  end
  v = redis.call('HMGET', E2R, unpack(ek, i, j))
  for k = 1, #v do
    if v[k] then return {-1, 0, 0, 0, tonumber(s)} end
  end
end
for i = 1, 2 * n, 4000 do
  local j = min(i + 3999, 2 * n)
  redis.call('HSET', BLK, unpack(bs, i, j))
  redis.call('HSET', E2R, unpack(es, i, j))
end
redis.call('HSET', meta, 'seq', ARGV[2], 'at', ARGV[3], 'n', (tonumber(m[2]) or 0) + n)
claim(meta, m[3], ARGV[9])
if applied == 2 then redis.call('HSET', meta, 'from', ARGV[6]) end
-- A store of a predicted chain's end confirms R's prediction (predict.lua,
-- prepended).
local pst = {}
for k = 1, n do pst[bk[k]] = true end
local pend = predictEnd(KEYS[2], R, pst, {}, false, tonumber(ARGV[3]))
return {applied, n, 0, 0, tonumber(s), pend[1], pend[2]}
