-- admit.lua is prepended to every script that books, ends or queues a
-- request (reserve, reservebest, advance, release, sweep, enqueue,
-- dequeue, kick): admission's room check and its one queue per model.
-- KEYS = P..'load', P..'lb', P..'leases' (as lease.lua), then
--   KEYS[4] P..'cap'   hash: replica -> its limits "requests,prefill
--                      blocks,waiting,kv usage" (0: none); '#' -> the
--                      model's "fleet max,stale ms,stale saturated (0|1),
--                      grant ms". The replicas in it are the routable
--                      fleet, written by the pods (store/admit.go).
--   KEYS[5] P..'adm'   hash: 'n' queued, 'nb:'..b per band, 'nt:'..b..':'..t
--                      per tenant, 's' the push sequence, 'v:'..b band b's
--                      virtual time, 'f:'..b..':'..t an idle tenant's
--                      finish tag.
--   KEYS[6] P..'q'     hash: id -> "pod|band|tenant|cost|deadline ms|seq".
--   KEYS[7] P..'qx'    sorted set: id by the time it leaves the queue
--                      unless its pod renews it (min(deadline, hold)).
--   KEYS[8] P..'qb'    sorted set: the bands with queued tickets, by band.
--   KEYS[9] P..'depth' list: one element per queued ticket, so that its
--                      LLEN is the model's queue depth (KEDA's redis
--                      scaler reads it).
-- The per-band and per-tenant sets, P..'qt:'..b (tenants by finish tag)
-- and P..'qf:'..b..':'..t (a tenant's tickets by sequence), are named by
-- the tickets themselves, so no caller can list them in advance: like
-- lib.lua's children sets they are built from KEYS[5]'s name (its hash
-- tag, so its slot), never from an argument.
-- The dispatch order is admission.Queue's (admission/queue.go), to the
-- letter: bands strictly by number, start-time fair queuing between a
-- band's tenants charged each ticket's cost, FCFS within a tenant.

local CAP, ADM, Q, QX, QB, DEPTH = KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local QP = string.sub(ADM, 1, #ADM - 3)

-- NOW is the caller's clock (ms), which each script sets from its ARGV
-- before it calls anything here: leases already expire by the pods'
-- clocks, and grants, holds and scrapes must be read on the same one.
local NOW = 0
local function nowMs() return NOW end

local function queued()
  return tonumber(redis.call('HGET', ADM, 'n') or '0') > 0
end

-- capConf returns the model's fleet max, stale ms, stale-saturated flag
-- and grant ms; a model no pod has described has no limits.
local function capConf()
  local c = redis.call('HGET', CAP, '#')
  if not c then return 0, 5000, false, 2000 end
  local a, b, s, g = string.match(c, '^(%d+),(%d+),(%d),(%d+)$')
  return tonumber(a), tonumber(b), s == '1', tonumber(g)
end

local function parseBooked(v)
  if not v then return 0, 0, 0, 0 end
  local a, b, c, e = string.match(v, '^(%d+),(%d+),(%d+),(%d+)$')
  return tonumber(a), tonumber(b), tonumber(c), tonumber(e)
end

-- room is admission.HasRoom: booked requests (less own, a seat the caller
-- holds) and prefill under their limits, and, while the scrape is fresh,
-- the engine's waiting and KV usage under theirs.
local function room(lim, booked, scraped, own, now, staleMs, staleSat)
  if not lim or lim == '0,0,0,0' then return true end
  local mr, mp, mw, mk = string.match(lim, '^(%d+),(%d+),(%d+),([%d.eE+-]+)$')
  mr, mp, mw, mk = tonumber(mr), tonumber(mp), tonumber(mw), tonumber(mk)
  local p, _, n = parseBooked(booked)
  n = n - own
  if mr > 0 and n >= mr then return false end
  if mp > 0 and p >= mp then return false end
  if (mw == 0 and mk == 0) or not scraped then return true end
  local w, _, kv, at = string.match(scraped, '^(%d+),(%d+),([^,]+),(%d+)$')
  if not at then return true end
  if now - tonumber(at) > staleMs then return not staleSat end
  if mw > 0 and tonumber(w) >= mw then return false end
  if mk > 0 and tonumber(kv) >= mk then return false end
  return true
end

-- fleet reads every replica the pods described, sorted by name, with its
-- limits, booked load and scrape, and the requests booked on them all.
local function fleet()
  local kv = redis.call('HGETALL', CAP)
  local names, lims = {}, {}
  for i = 1, #kv, 2 do
    if kv[i] ~= '#' then
      names[#names + 1] = kv[i]
      lims[kv[i]] = kv[i + 1]
    end
  end
  table.sort(names)
  local reps, total = {}, 0
  if #names == 0 then return reps, 0 end
  local fields = {}
  for i, R in ipairs(names) do
    fields[2 * i - 1], fields[2 * i] = R, R .. '#s'
  end
  local cur = redis.call('HMGET', KEYS[1], unpack(fields))
  for i, R in ipairs(names) do
    local _, _, n = parseBooked(cur[2 * i - 1])
    total = total + n
    reps[i] = {R = R, lim = lims[R], booked = cur[2 * i - 1], scraped = cur[2 * i], n = n}
  end
  return reps, total
end

local function ticketOf(id)
  local body = redis.call('HGET', Q, id)
  if not body then return nil end
  local pod, b, t, cost, dl, seq = string.match(body, '^([^|]*)|([^|]*)|([^|]*)|(%d+)|(%d+)|(%d+)$')
  return {pod = pod, b = b, t = t, cost = tonumber(cost), dl = tonumber(dl), seq = seq}
end

-- unqueue takes ticket id (its fields tk) out of every structure; a
-- tenant left with nothing queued in its band keeps its finish tag in
-- ADM, and a band left empty leaves QB.
local function unqueue(id, tk)
  local qt, qf = QP .. 'qt:' .. tk.b, QP .. 'qf:' .. tk.b .. ':' .. tk.t
  redis.call('ZREM', qf, id)
  if redis.call('ZCARD', qf) == 0 then
    local f = redis.call('ZSCORE', qt, tk.t)
    redis.call('ZREM', qt, tk.t)
    if f then redis.call('HSET', ADM, 'f:' .. tk.b .. ':' .. tk.t, f) end
    if redis.call('ZCARD', qt) == 0 then redis.call('ZREM', QB, tk.b) end
  end
  redis.call('HDEL', Q, id)
  redis.call('ZREM', QX, id)
  redis.call('HINCRBY', ADM, 'n', -1)
  redis.call('HINCRBY', ADM, 'nb:' .. tk.b, -1)
  if redis.call('HINCRBY', ADM, 'nt:' .. tk.b .. ':' .. tk.t, -1) <= 0 then
    redis.call('HDEL', ADM, 'nt:' .. tk.b .. ':' .. tk.t)
  end
  redis.call('LPOP', DEPTH)
end

-- nextTicket returns the next ticket in dispatch order and charges its tenant:
-- the band's virtual time moves to the tenant's finish tag, which grows
-- by the ticket's cost.
local function nextTicket()
  local bs = redis.call('ZRANGE', QB, 0, 0)
  if #bs == 0 then return nil end
  local b = bs[1]
  local qt = QP .. 'qt:' .. b
  local ts = redis.call('ZRANGE', qt, 0, 0, 'WITHSCORES')
  local t, f = ts[1], tonumber(ts[2])
  local ids = redis.call('ZRANGE', QP .. 'qf:' .. b .. ':' .. t, 0, 0)
  local id = ids[1]
  local tk = ticketOf(id)
  redis.call('HSET', ADM, 'v:' .. b, f)
  redis.call('ZADD', qt, f + math.max(tk.cost, 1), t)
  return id, tk
end

-- grant sets a seat aside for ticket id on replica rep (a booking of one
-- request and no blocks, phase 2, expiring after grant ms) and tells the
-- pod that holds it.
local function grant(id, tk, rep, now, grantMs)
  local p, d, n, v = parseBooked(rep.booked)
  local value = p .. ',' .. d .. ',' .. (n + 1) .. ',' .. (v + 1)
  redis.call('HSET', KEYS[1], rep.R, value)
  rep.booked, rep.n = value, n + 1
  redis.call('HSET', KEYS[2], id, rep.R .. ',0,0,2')
  redis.call('ZADD', KEYS[3], now + grantMs, id)
  unqueue(id, tk)
  redis.call('PUBLISH', 'kvr:grant:' .. tk.pod, id .. ' ' .. rep.R .. ' ' .. now)
end

-- expire drops the tickets whose time ran out (their pod stopped renewing
-- them, or their deadline passed), at most limit of them.
local function expire(now, limit)
  local ids = redis.call('ZRANGEBYSCORE', QX, '-inf', '(' .. now, 'LIMIT', 0, limit)
  for _, id in ipairs(ids) do
    local tk = ticketOf(id)
    if tk then unqueue(id, tk) else redis.call('ZREM', QX, id) end
  end
  return #ids
end

-- dispatch grants queued tickets, in dispatch order, while some replica
-- has room and the fleet is under its max: up to limit of them, each on
-- the replica with room that has the fewest requests booked. It returns
-- the ids granted.
local function dispatch(now, limit)
  expire(now, 100)
  local done = {}
  if not queued() then return done end
  local fmax, staleMs, staleSat, grantMs = capConf()
  local reps, total = fleet()
  while #done < limit and queued() do
    if fmax > 0 and total >= fmax then break end
    local best
    for _, rep in ipairs(reps) do
      if room(rep.lim, rep.booked, rep.scraped, 0, now, staleMs, staleSat) and (best == nil or rep.n < best.n) then
        best = rep
      end
    end
    if not best then break end
    local id, tk = nextTicket()
    grant(id, tk, best, now, grantMs)
    total = total + 1
    done[#done + 1] = id
  end
  return done
end

-- seatOf returns the replica of the seat granted to id, or nil.
local function seatOf(id)
  local body = redis.call('HGET', KEYS[2], id)
  if body and string.match(body, ',2$') then return string.match(body, '^([^,]*),') end
  return nil
end

-- mustQueue reports whether a booking without a seat has to queue:
-- requests are queued before it, or the fleet is at its max.
local function mustQueue(seat)
  if seat then return false end
  if queued() then return true end
  local fmax = capConf()
  if fmax > 0 then
    local _, total = fleet()
    if total >= fmax then return true end
  end
  return false
end

-- roomy returns, per replica of reps (with its booked and scraped load in
-- cur, pairs), whether it has room; the caller's own seat on seat does
-- not count against it. With fetch, the scrapes are not in cur: each is
-- read only for a replica whose limits need the engine's figures.
local function roomy(reps, cur, seat, fetch)
  local _, staleMs, staleSat = capConf()
  local lims = redis.call('HMGET', CAP, unpack(reps))
  local now = nowMs()
  local out = {}
  for j, R in ipairs(reps) do
    local own = 0
    if R == seat then own = 1 end
    local lim = lims[j] or nil
    local sc = cur[2 * j]
    if fetch and lim and not string.match(lim, ',0,0$') then sc = redis.call('HGET', KEYS[1], R .. '#s') end
    out[j] = room(lim, cur[2 * j - 1], sc, own, now, staleMs, staleSat)
  end
  return out
end

-- takeSeat turns the caller's seat into its booking on R (value: R's load
-- with the booking added): a seat on R itself already counts the request.
local function takeSeat(seat, R, value)
  if not seat then return value end
  if seat == R then
    local p, d, n, v = parseBooked(value)
    return p .. ',' .. d .. ',' .. (n - 1) .. ',' .. v
  end
  local p, d, n, v = parseBooked(redis.call('HGET', KEYS[1], seat))
  redis.call('HSET', KEYS[1], seat, p .. ',' .. d .. ',' .. math.max(n - 1, 0) .. ',' .. (v + 1))
  return value
end
