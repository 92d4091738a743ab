-- apply.lua applies one event batch of one replica atomically.
-- KEYS[1] = kvr:{m}:r:<id>:meta
-- ARGV = prefix, replica, seq, now_ms, then 5 per op: kind (S|R|C),
--        engine hash, key, parent key ("0" for none), tier (0 GPU, 1 host).
-- Returns {applied, stored, removed, unknown}. A batch whose seq is not newer
-- than the applied seq changes nothing, so redelivery is harmless.
local meta = KEYS[1]
local e2r = P .. 'r:' .. R .. ':e2r'
local seq = tonumber(ARGV[3])
local m = redis.call('HMGET', meta, 'seq', 'n')
if m[1] and tonumber(m[1]) >= seq then return {0, 0, 0, 0} end
local held = tonumber(m[2] or 0) or 0
local stored, removed, unknown = 0, 0, 0

for i = 5, #ARGV, 5 do
  local kind, eh, key, parent, tier = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  if kind == 'S' then
    local bk = P .. 'b:' .. key
    local v = redis.call('HGET', bk, R)
    local g, h, f = 0, 0, 0
    if v then g, h, f = parse(v) end
    if g + h == 0 then held = held + 1 end
    if tier == '0' then g = g + 1 else h = h + 1 end
    redis.call('HSET', e2r, eh, key)
    if parent ~= '0' and redis.call('HSETNX', bk, '^', parent) == 1 then
      redis.call('SADD', P .. 'k:' .. parent, key)
    end
    local nf = calc(g, h, flagOf(parent))
    redis.call('HSET', bk, R, pack(g, h, nf))
    if nf ~= f then propagate(key, nf) end
    stored = stored + 1
  elseif kind == 'R' then
    local k = redis.call('HGET', e2r, eh)
    local v = k and redis.call('HGET', P .. 'b:' .. k, R)
    if not k then
      unknown = unknown + 1
    elseif not v then
      unknown = unknown + 1
      redis.call('HDEL', e2r, eh)
    else
      local bk = P .. 'b:' .. k
      local g, h, f = parse(v)
      local ok = true
      if tier == '0' then
        if g > 0 then g = g - 1 else ok = false end
      else
        if h > 0 then h = h - 1 else ok = false end
      end
      if not ok then
        unknown = unknown + 1
      else
        removed = removed + 1
        if g + h == 0 then
          redis.call('HDEL', bk, R)
          redis.call('HDEL', e2r, eh)
          held = held - 1
          dropIfEmpty(bk, k)
          if f ~= 0 then propagate(k, 0) end
        else
          local nf = calc(g, h, flagOf(redis.call('HGET', bk, '^')))
          redis.call('HSET', bk, R, pack(g, h, nf))
          if nf ~= f then propagate(k, nf) end
        end
      end
    end
  elseif kind == 'C' then
    clearReplica(e2r)
    held = 0
  end
end

if held < 0 then held = 0 end
redis.call('HSET', meta, 'seq', ARGV[3], 'at', ARGV[4], 'n', held)
return {1, stored, removed, unknown}
