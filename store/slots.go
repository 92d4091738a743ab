package store

import (
	"sync"
	"time"
)

// Every lookup needs each candidate's slot (which bit of the index's
// bitmaps is the replica's), and slots almost never change: a replica gets
// one on its first store and loses it when purged. Reading them with the
// loads was a third of the lookup's load fields (64 of 192 at 64
// replicas). A pod now caches them per model, with the load hash's '#g',
// which every script that assigns or frees a slot rewrites (lua/lib.lua
// bumpSlots): a lookup reads '#g' with the loads, in the same HMGET, and
// uses the cached slots only when it is unchanged, so they are exactly the
// slots of the loads it read. Otherwise it reads the slots too, as before.
// Each cached slot is also read again slotTTL after it was read, which
// bounds what a server whose scripts do not yet bump '#g' (a rolling
// upgrade) can hide.

// slotTTL bounds how long cached slots are used without reading them.
const slotTTL = time.Second

// slotCache is each model's replica slots as last read.
type slotCache struct {
	mu     sync.Mutex
	models map[string]*modelSlots
}

type modelSlots struct {
	gen   any // '#g' as read with them (nil: never written)
	slots map[string]cachedSlot
}

type cachedSlot struct {
	v    any // the replica's '#i' value (nil: none)
	read time.Time
}

// get returns replicas' cached slots and the '#g' they were read with, or
// ok false when any is not cached or was read more than slotTTL ago.
func (c *slotCache) get(model string, replicas []string, now time.Time) (slots []any, gen any, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.models[model]
	if m == nil {
		return nil, nil, false
	}
	slots = make([]any, len(replicas))
	for i, r := range replicas {
		e, found := m.slots[r]
		if !found || now.Sub(e.read) > slotTTL || now.Before(e.read) {
			return nil, nil, false
		}
		slots[i] = e.v
	}
	return slots, m.gen, true
}

// seen reports whether model's slots were read with a '#g' (some slot
// was ever assigned): a load hash without one then lacks data.
func (c *slotCache) seen(model string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.models[model]
	return m != nil && m.gen != nil
}

// put files replicas' slots as read with gen at now. Slots cached with
// another '#g' are dropped: they may no longer hold.
func (c *slotCache) put(model string, replicas []string, slots []any, gen any, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.models == nil {
		c.models = map[string]*modelSlots{}
	}
	m := c.models[model]
	if m == nil || m.gen != gen {
		m = &modelSlots{gen: gen, slots: make(map[string]cachedSlot, len(replicas))}
		c.models[model] = m
	}
	for i, r := range replicas {
		m.slots[r] = cachedSlot{v: slots[i], read: now}
	}
}
