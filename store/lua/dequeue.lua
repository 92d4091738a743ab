-- dequeue.lua takes a request out of admission: its client left or its
-- wait ran out. A queued ticket leaves the queue; a seat already granted
-- to it is released, and admits the next (admit.lua).
-- KEYS: see admit.lua; ARGV = id, now ms. Returns 1 dequeued, 2 its grant
-- released, 0 neither (already booked, released or expired).
local id = ARGV[1]
NOW = tonumber(ARGV[2])
local tk = ticketOf(id)
if tk then
  unqueue(id, tk)
  return 1
end
local body = redis.call('HGET', KEYS[2], id)
if body and string.match(body, ',2$') then
  unbook(id, true)
  if queued() then dispatch(nowMs(), 16) end
  return 2
end
return 0
