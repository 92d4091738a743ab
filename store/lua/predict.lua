-- predict.lua is prepended to the scripts that book, advance, release or
-- sweep a lease and to those that apply events (reserve, reservebest,
-- advance, release, sweep, apply, applyfast). It keeps a replica's
-- predicted entries (kvroute/prediction.go): what bookings say the
-- replica will hold once their prefill has run, in the field R..'#p' of
-- the model's load hash, beside R's load, so that a lookup reads them with
-- the loads it reads anyway and a booking writes them in the step that
-- books. It touches no key but the load hash, which every including
-- script declares (as KEYS[1] of the booking and lease scripts, KEYS[2]
-- of apply and applyfast), passed in as LOAD.
--
-- The field is a concatenation of records:
--   owner length (1 byte) | owner (the request id) | start ms (6) |
--   due ms (6) | expiry ms (6) | span (4) | marks (1) |
--   per mark: depth (3) | router key (8)
-- all big-endian, marks in increasing depth (kvroute.PredictMarks); the
-- marks byte's high bit says the record is confirmed (CONFIRMED); an
-- empty list deletes the field. store/predict.go reads and writes the
-- same layout.
local pbyte, psub, pchar, pfloor = string.byte, string.sub, string.char, math.floor
-- PREDICT_MAX is kvroute.MaxPredictions (store's TestPredictScriptMax checks).
local PREDICT_MAX = 16
-- PREDICT_MIN is kvroute.MinPredictBlocks: a booking on a choice holding
-- all but fewer blocks of the chain predicts nothing.
local PREDICT_MIN = 4
-- CONFIRMED is the marks byte's flag of a confirmed record
-- (kvroute.Prediction.Confirmed): the event storing the chain's end came,
-- and the record stays until it expires, as a bridge for decisions whose
-- lookup ran before that event and whose booking runs after it.
local CONFIRMED = 128

local function pnum(s, i, n)
  local v = 0
  for j = i, i + n - 1 do v = v * 256 + pbyte(s, j) end
  return v
end

local function penc(v, n)
  if n == 4 then
    return pchar(pfloor(v / 16777216) % 256, pfloor(v / 65536) % 256, pfloor(v / 256) % 256, v % 256)
  end
  return pchar(pfloor(v / 1099511627776) % 256, pfloor(v / 4294967296) % 256, pfloor(v / 16777216) % 256,
    pfloor(v / 65536) % 256, pfloor(v / 256) % 256, v % 256)
end

-- pdecode parses a field into records {owner, start, due, exp, span,
-- marks (the raw mark bytes), last (the deepest mark's key), conf, raw}.
local function pdecode(v)
  local out, i = {}, 1
  while v and i <= #v do
    local ol = pbyte(v, i)
    local o = psub(v, i + 1, i + ol)
    local j = i + 1 + ol
    local nm = pbyte(v, j + 22)
    local conf = nm >= CONFIRMED
    if conf then nm = nm - CONFIRMED end
    local mend = j + 23 + 11 * nm
    out[#out + 1] = {owner = o, start = pnum(v, j, 6), due = pnum(v, j + 6, 6), exp = pnum(v, j + 12, 6),
      span = pnum(v, j + 18, 4), marks = psub(v, j + 23, mend - 1),
      last = psub(v, mend - 8, mend - 1), conf = conf, raw = psub(v, i, mend - 1)}
    i = mend
  end
  return out
end

-- pscan splits a field into records without decoding their marks:
-- {owner, exp, conf, raw} each, for the scripts that only prune, cap or
-- find one by owner (a booking reads a full list on every call).
local function pscan(v)
  local out, i = {}, 1
  while v and i <= #v do
    local ol = pbyte(v, i)
    local j = i + 1 + ol
    local nm = pbyte(v, j + 22)
    local conf = nm >= CONFIRMED
    if conf then nm = nm - CONFIRMED end
    local mend = j + 23 + 11 * nm
    out[#out + 1] = {owner = psub(v, i + 1, j - 1), exp = pnum(v, j + 12, 6), conf = conf, raw = psub(v, i, mend - 1)}
    i = mend
  end
  return out
end

local function pencode(r)
  return pchar(#r.owner) .. r.owner .. penc(r.start, 6) .. penc(r.due, 6) .. penc(r.exp, 6) ..
    penc(r.span, 4) .. pchar(#r.marks / 11 + (r.conf and CONFIRMED or 0)) .. r.marks
end

local function pstore(LOAD, R, recs)
  local raws = {}
  for k = 1, #recs do raws[k] = recs[k].raw end
  if #raws == 0 then
    redis.call('HDEL', LOAD, R .. '#p')
  else
    redis.call('HSET', LOAD, R .. '#p', table.concat(raws))
  end
end

-- predictWrite records owner's prediction on R, booked at now with span
-- prefill blocks booked on R (its own included): due after span blocks at
-- perUs µs a block (at most maxDue ms), expiring graceMs later
-- (kvroute.PredictPlan.Timing). Expired records are dropped, a record of
-- the same owner replaced, and a full list (maxN) drops the record that
-- expires first. Returns the records dropped unconfirmed (a confirmed
-- one came true: its end is no phantom).
local function predictWrite(LOAD, R, owner, now, span, perUs, graceMs, maxDue, marks, maxN, known)
  -- known is R's field as the caller already read it in this script
  -- (false: absent), or nil to read it here.
  local v = known
  if v == nil then v = redis.call('HGET', LOAD, R .. '#p') end
  local recs = v and pscan(v) or {}
  local kept, expired = {}, 0
  for k = 1, #recs do
    local r = recs[k]
    if r.exp <= now then
      if not r.conf then expired = expired + 1 end
    elseif r.owner ~= owner then
      kept[#kept + 1] = r
    end
  end
  if #kept >= maxN then
    local first = 1
    for k = 2, #kept do
      if kept[k].exp < kept[first].exp then first = k end
    end
    if not kept[first].conf then expired = expired + 1 end
    table.remove(kept, first)
  end
  local due = math.min(pfloor(span * perUs / 1000), maxDue)
  local r = {owner = owner, start = now, due = now + due, exp = now + due + graceMs, span = span, marks = marks}
  r.raw = pencode(r)
  kept[#kept + 1] = r
  pstore(LOAD, R, kept)
  return expired
end

-- predictFound is, per replica of reps, the deepest live prediction there
-- that shares a mark (depth and key) with marks (a request's, 11 bytes
-- each), as {depth, progress, wait} (kvroute.PredictedOverlap over the
-- marks both have), or nil: what a booking finds that its caller's lookup
-- may have missed. It also returns the fields as read (false: absent),
-- for predictWrite.
local function predictFound(LOAD, reps, marks, now)
  local fields = {}
  for j = 1, #reps do fields[j] = reps[j] .. '#p' end
  local vals = redis.call('HMGET', LOAD, unpack(fields))
  local read = {unpack(vals)}
  local out = {}
  local any = false
  for j = 1, #reps do any = any or vals[j] ~= false end
  if not any then return out, read end
  local want, mk = {}, {}
  for m = 1, #marks, 11 do
    local x = psub(marks, m, m + 10)
    want[x] = pnum(marks, m, 3)
    mk[#mk + 1] = x
  end
  -- A field with none of the request's marks in it needs no decoding.
  for j = 1, #reps do
    local v = vals[j]
    if v then
      local hit = false
      for k = #mk, 1, -1 do
        if string.find(v, mk[k], 1, true) then
          hit = true
          break
        end
      end
      if not hit then vals[j] = false end
    end
  end
  for j = 1, #reps do
    if vals[j] then
      local best
      for _, r in ipairs(pdecode(vals[j])) do
        if r.exp > now then
          local d = 0
          for m = 1, #r.marks, 11 do
            local x = want[psub(r.marks, m, m + 10)]
            if x and x > d then d = x end
          end
          if d > 0 then
            local prog = 1
            if r.due > r.start and now < r.due then
              prog = 0
              if now > r.start then prog = (now - r.start) / (r.due - r.start) end
            end
            local w = (1 - prog) * r.span
            if not best or d > best.depth or (d == best.depth and w < best.wait) then
              best = {depth = d, progress = prog, wait = w}
            end
          end
        end
      end
      out[j] = best
    end
  end
  return out, read
end

-- pdue makes r due at now (its prefill has run), if it was due later, and
-- expiring as much sooner: its grace (expiry less due) after now.
local function pdue(r, now)
  if r.due <= now then return false end
  local due = math.max(now, r.start)
  r.exp = r.exp - (r.due - due)
  r.due = due
  return true
end

-- predictEnd applies an event batch, applied at now (ms), to R's records:
-- a record whose deepest mark is among stored (a set of router keys
-- stored on GPU) is confirmed, one with any mark among removed is
-- evicted, and clear ends them all. A confirmed record is due now and
-- stays until its grace has passed (CONFIRMED): a decision that looked up
-- before this batch and books after it would otherwise find the chain
-- neither in its lookup's index nor predicted, and book another replica
-- cold (a burst on a busy machine split over two replicas this way).
-- Returns {confirmed, evicted}; a confirmed record that ends later is not
-- counted again (its fate was to come true).
local function predictEnd(LOAD, R, stored, removed, clear, now)
  local v = redis.call('HGET', LOAD, R .. '#p')
  if not v then return {0, 0} end
  local recs = pdecode(v)
  local kept, conf, ev = {}, 0, 0
  for k = 1, #recs do
    local r = recs[k]
    local gone = clear
    if not gone and stored[r.last] then
      if not r.conf then
        conf, r.conf = conf + 1, true
        pdue(r, now)
        r.raw = pencode(r)
      end
    elseif not gone then
      for m = 1, #r.marks, 11 do
        if removed[psub(r.marks, m + 3, m + 10)] then
          gone = true
          break
        end
      end
    end
    if not gone then
      kept[#kept + 1] = r
    elseif not r.conf then
      ev = ev + 1
    end
  end
  if #kept < #recs or conf > 0 then pstore(LOAD, R, kept) end
  return {conf, ev}
end

-- predictAdvance makes owner's record on R due at now (its first token
-- came: its prefill has run), as pdue does.
local function predictAdvance(LOAD, R, owner, now)
  local v = redis.call('HGET', LOAD, R .. '#p')
  if not v or not string.find(v, owner, 1, true) then return end
  local recs = pdecode(v)
  for k = 1, #recs do
    local r = recs[k]
    if r.owner == owner and pdue(r, now) then
      r.raw = pencode(r)
      pstore(LOAD, R, recs)
      return
    end
  end
end

-- predictWithdraw drops owner's record on R (its request ended before its
-- first token: its prefill may never run), unless it is confirmed (it
-- ran). Returns 1 if there was one to drop.
local function predictWithdraw(LOAD, R, owner)
  local v = redis.call('HGET', LOAD, R .. '#p')
  if not v or not string.find(v, owner, 1, true) then return 0 end
  local recs = pscan(v)
  for k = 1, #recs do
    if recs[k].owner == owner then
      if recs[k].conf then return 0 end
      table.remove(recs, k)
      pstore(LOAD, R, recs)
      return 1
    end
  end
  return 0
end
