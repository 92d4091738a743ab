package sim

import "github.com/kvroute/kvroute"

// blockCache is one engine's prefix cache: blocks pinned by running requests
// and an LRU of unpinned blocks that admissions evict from the tail. Entries
// live in a slice and link by index, so the hot path allocates nothing.
type blockCache struct {
	idx        map[kvroute.BlockKey]int32
	ents       []cacheEntry
	free       []int32
	head, tail int32 // unpinned LRU: head most recent; -1 when empty
	pinned     int
	unpinned   int
}

type cacheEntry struct {
	key        kvroute.BlockKey
	ref        int32
	prev, next int32
}

func newBlockCache() *blockCache {
	return &blockCache{idx: make(map[kvroute.BlockKey]int32), head: -1, tail: -1}
}

// match counts the leading keys held, pinned or not.
func (c *blockCache) match(keys []kvroute.BlockKey) int {
	for i, k := range keys {
		if _, ok := c.idx[k]; !ok {
			return i
		}
	}
	return len(keys)
}

// newPins counts how many of keys pinning would add to the pinned set.
func (c *blockCache) newPins(keys []kvroute.BlockKey) int {
	n := 0
	for _, k := range keys {
		if i, ok := c.idx[k]; !ok || c.ents[i].ref == 0 {
			n++
		}
	}
	return n
}

func (c *blockCache) unlink(i int32) {
	e := &c.ents[i]
	if e.prev >= 0 {
		c.ents[e.prev].next = e.next
	} else {
		c.head = e.next
	}
	if e.next >= 0 {
		c.ents[e.next].prev = e.prev
	} else {
		c.tail = e.prev
	}
	c.unpinned--
}

func (c *blockCache) pushFront(i int32) {
	e := &c.ents[i]
	e.prev, e.next = -1, c.head
	if c.head >= 0 {
		c.ents[c.head].prev = i
	} else {
		c.tail = i
	}
	c.head = i
	c.unpinned++
}

func (c *blockCache) alloc(k kvroute.BlockKey, ref int32) int32 {
	var i int32
	if n := len(c.free); n > 0 {
		i = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		i = int32(len(c.ents))
		c.ents = append(c.ents, cacheEntry{})
	}
	c.ents[i] = cacheEntry{key: k, ref: ref, prev: -1, next: -1}
	c.idx[k] = i
	return i
}

// pin takes a reference on k, inserting it if absent; it reports insertion.
func (c *blockCache) pin(k kvroute.BlockKey) bool {
	i, ok := c.idx[k]
	if !ok {
		c.alloc(k, 1)
		c.pinned++
		return true
	}
	if c.ents[i].ref == 0 {
		c.unlink(i)
		c.pinned++
	}
	c.ents[i].ref++
	return false
}

// unpin drops a reference; a block nobody uses joins the LRU as most recent.
func (c *blockCache) unpin(k kvroute.BlockKey) {
	i, ok := c.idx[k]
	if !ok || c.ents[i].ref == 0 {
		return
	}
	c.ents[i].ref--
	if c.ents[i].ref == 0 {
		c.pinned--
		c.pushFront(i)
	}
}

// touch inserts k unpinned as most recent (or refreshes it); it reports
// insertion.
func (c *blockCache) touch(k kvroute.BlockKey) bool {
	i, ok := c.idx[k]
	if !ok {
		c.pushFront(c.alloc(k, 0))
		return true
	}
	if c.ents[i].ref == 0 {
		c.unlink(i)
		c.pushFront(i)
	}
	return false
}

// evictTo evicts least recently used unpinned blocks until at most limit
// blocks remain (or none is evictable), appending their keys to dst.
func (c *blockCache) evictTo(limit int, dst []kvroute.BlockKey) []kvroute.BlockKey {
	for len(c.idx) > limit && c.tail >= 0 {
		i := c.tail
		c.unlink(i)
		k := c.ents[i].key
		delete(c.idx, k)
		c.free = append(c.free, i)
		dst = append(dst, k)
	}
	return dst
}
