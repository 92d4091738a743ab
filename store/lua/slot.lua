-- slot.lua returns R's slot, allocating one if R has none, as R's first
-- stored block would: Go needs the slot to compute a batch's entries for
-- applyfast.lua, so that even a replica's first batches skip apply.lua's
-- general path.
-- KEYS = lib's three (blk, load, slotfree); ARGV = replica, now_ms.
return slotOf(true, ARGV[2])
