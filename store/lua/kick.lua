-- kick.lua is a pod's periodic beat for a model while it holds queued
-- requests (or wants the queue's depth): it renews its tickets' hold,
-- dispatches (capacity that appeared without a release: a replica
-- registered, a scrape, a limit raised) and tells the pod where each of
-- its tickets stands, which recovers a grant whose message was lost.
-- KEYS: see admit.lua. ARGV = now ms, hold ms, then ids.
-- Returns {depth, then per id: replica granted, 1 still queued, 0 gone}.
NOW = tonumber(ARGV[1])
local now = NOW
local hold = tonumber(ARGV[2])
for i = 3, #ARGV do
  local tk = ticketOf(ARGV[i])
  if tk then redis.call('ZADD', QX, math.min(tk.dl, now + hold), ARGV[i]) end
end
-- Seats granted and never booked (their pod died) are given back here as
-- well as by the ingestors' sweep, so that a live pod's beat bounds it.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, 50)) do
  local body = redis.call('HGET', KEYS[2], id)
  if body and string.match(body, ',2$') then unbook(id, true) end
end
dispatch(now, 64)
local out = {tonumber(redis.call('HGET', ADM, 'n') or '0')}
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('HEXISTS', Q, id) == 1 then
    out[i - 1] = 1
  else
    local body = redis.call('HGET', KEYS[2], id)
    if body and string.match(body, ',2$') then
      out[i - 1] = string.match(body, '^([^,]*),')
    else
      out[i - 1] = 0
    end
  end
end
return out
