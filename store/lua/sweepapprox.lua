-- sweepapprox.lua drops expired approximate pairs of one minute list (see
-- approx.lua), at most ARGV[3] keys per call. Go reads which minute is due
-- from P..'axq' first, so that the list is a declared key.
-- KEYS = P..'ax', P..'axq', P..'axb:'..<minute>; ARGV = minute, now_ms, limit.
-- Returns the pairs dropped.
local minute, now, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local sub, byte = string.sub, string.byte
local lk = KEYS[3]
local keys = redis.call('LRANGE', lk, 0, limit - 1)
redis.call('LTRIM', lk, #keys, -1)
local dropped = 0
if #keys > 0 then
  local vals = redis.call('HMGET', KEYS[1], unpack(keys))
  local set, del = {}, {}
  for j = 1, #keys do
    local v = vals[j]
    if v then
      local out = {}
      for i = 1, #v, 8 do
        local b1, b2, b3, b4, b5, b6 = byte(v, i + 2, i + 7)
        if ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6 > now then
          out[#out + 1] = sub(v, i, i + 7)
        else
          dropped = dropped + 1
        end
      end
      local nv = table.concat(out)
      if nv == '' then
        del[#del + 1] = keys[j]
      elseif nv ~= v then
        set[#set + 1] = keys[j]
        set[#set + 1] = nv
      end
    end
  end
  if #set > 0 then redis.call('HSET', KEYS[1], unpack(set)) end
  if #del > 0 then redis.call('HDEL', KEYS[1], unpack(del)) end
end
if redis.call('EXISTS', lk) == 0 then redis.call('ZREM', KEYS[2], minute) end
return dropped
