-- fence.lua is prepended to apply, applyfast and reset. It keeps one writer
-- per replica: meta's 'w' names the ingestor that may write the replica's
-- index (Store.ClaimReplica, by the lease holder when it starts following).
-- A write by any other is refused, so that a former owner that has not yet
-- noticed the takeover cannot reset or extend the history the new one
-- continues. A replica with no writer recorded (the store lost its data, or
-- a purge) is claimed by the first write. An empty writer is an unfenced
-- caller (tests, discovery's reset of a returning replica).
local function fenced(holder, writer)
  return writer ~= '' and holder ~= false and holder ~= writer
end

-- claim records writer in meta when it holds no writer yet.
local function claim(meta, holder, writer)
  if writer ~= '' and holder ~= writer then
    redis.call('HSET', meta, 'w', writer)
  end
end
