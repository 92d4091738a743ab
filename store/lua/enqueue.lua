-- enqueue.lua queues a request no replica had room for, then dispatches
-- at once: capacity freed between the booking that refused the request
-- and this call admits it here, so no wake-up is lost.
-- KEYS: see admit.lua. ARGV = id, pod, band, tenant, cost, deadline ms,
-- hold ms (how long the ticket lives unless its pod renews it), queue
-- max, band max, tenant max (0: none; 'f': the tenant's fair share of
-- the band), now ms.
-- Returns {0, position} queued, {1, replica} granted (a seat is set aside
-- on replica), {2, reason} shed, {3} the id is already queued or granted.
local id, pod, b, t = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local cost, dl, hold = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local qmax, bmax = tonumber(ARGV[8]), tonumber(ARGV[9])
local fair = ARGV[10] == 'f'
local tmax = fair and 0 or tonumber(ARGV[10])
NOW = tonumber(ARGV[11])
local now = NOW
expire(now, 100)
if redis.call('HEXISTS', Q, id) == 1 or redis.call('HEXISTS', KEYS[2], id) == 1 then return {3} end
local c = redis.call('HMGET', ADM, 'n', 'nb:' .. b, 'nt:' .. b .. ':' .. t)
local n, nb, nt = tonumber(c[1] or '0'), tonumber(c[2] or '0'), tonumber(c[3] or '0')
if qmax > 0 and n >= qmax then return {2, 'queue_full'} end
if bmax > 0 and nb >= bmax then return {2, 'band_full'} end
if fair and bmax > 0 then
  -- The tenant's fair share of the band (admission.ShareOf): its limit
  -- over the other tenants backlogged in it, itself and one more.
  local others = redis.call('ZCARD', QP .. 'qt:' .. b)
  if nt > 0 then others = others - 1 end
  tmax = math.ceil(bmax / (others + 2))
end
if tmax > 0 and nt >= tmax then return {2, 'tenant_full'} end
-- Position: the tickets queued in this band and the bands before it.
local pos = 0
local bands = redis.call('ZRANGEBYSCORE', QB, '-inf', tonumber(b))
if #bands > 0 then
  local f = {}
  for i, x in ipairs(bands) do f[i] = 'nb:' .. x end
  for _, v in ipairs(redis.call('HMGET', ADM, unpack(f))) do pos = pos + tonumber(v or '0') end
end
local seq = redis.call('HINCRBY', ADM, 's', 1)
local qt = QP .. 'qt:' .. b
if not redis.call('ZSCORE', qt, t) then
  -- A tenant that was idle starts at the band's virtual time: it banks
  -- no credit for the time it sent nothing.
  local saved = redis.call('HMGET', ADM, 'f:' .. b .. ':' .. t, 'v:' .. b)
  local f = math.max(tonumber(saved[1] or '0'), tonumber(saved[2] or '0'))
  redis.call('ZADD', qt, f, t)
  redis.call('HDEL', ADM, 'f:' .. b .. ':' .. t)
end
redis.call('ZADD', QP .. 'qf:' .. b .. ':' .. t, seq, id)
redis.call('ZADD', QB, tonumber(b), b)
redis.call('HSET', Q, id, pod .. '|' .. b .. '|' .. t .. '|' .. cost .. '|' .. dl .. '|' .. seq)
redis.call('ZADD', QX, math.min(dl, now + hold), id)
redis.call('HINCRBY', ADM, 'n', 1)
redis.call('HINCRBY', ADM, 'nb:' .. b, 1)
redis.call('HINCRBY', ADM, 'nt:' .. b .. ':' .. t, 1)
redis.call('RPUSH', DEPTH, '1')
for _, g in ipairs(dispatch(now, 16)) do
  if g == id then
    local body = redis.call('HGET', KEYS[2], id)
    return {1, string.match(body, '^([^,]*),')}
  end
end
return {0, pos}
