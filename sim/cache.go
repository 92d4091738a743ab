package sim

import (
	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/lru"
)

// blockCache is one engine's prefix cache: blocks pinned by running requests
// (outside the recency order, never evicted) and an LRU of unpinned blocks
// that admissions evict from the back. Each entry's value is its pin count.
type blockCache struct {
	l      *lru.List[kvroute.BlockKey, int32]
	pinned int
}

func newBlockCache() *blockCache {
	return &blockCache{l: lru.New[kvroute.BlockKey, int32]()}
}

// match counts the leading keys held, pinned or not.
func (c *blockCache) match(keys []kvroute.BlockKey) int {
	for i, k := range keys {
		if _, ok := c.l.Lookup(k); !ok {
			return i
		}
	}
	return len(keys)
}

// newPins counts how many of keys pinning would add to the pinned set.
func (c *blockCache) newPins(keys []kvroute.BlockKey) int {
	n := 0
	for _, k := range keys {
		if id, ok := c.l.Lookup(k); !ok || *c.l.Value(id) == 0 {
			n++
		}
	}
	return n
}

// pin takes a reference on k, inserting it if absent; it reports insertion.
func (c *blockCache) pin(k kvroute.BlockKey) bool {
	id, ok := c.l.Lookup(k)
	if !ok {
		c.l.Add(k, 1)
		c.pinned++
		return true
	}
	ref := c.l.Value(id)
	if *ref == 0 {
		c.l.Unlink(id)
		c.pinned++
	}
	*ref++
	return false
}

// unpin drops a reference; a block nobody uses joins the LRU as most recent.
func (c *blockCache) unpin(k kvroute.BlockKey) {
	id, ok := c.l.Lookup(k)
	if !ok {
		return
	}
	ref := c.l.Value(id)
	if *ref == 0 {
		return
	}
	*ref--
	if *ref == 0 {
		c.pinned--
		c.l.PushFront(id)
	}
}

// touch inserts k unpinned as most recent (or refreshes it); it reports
// insertion.
func (c *blockCache) touch(k kvroute.BlockKey) bool {
	id, ok := c.l.Lookup(k)
	if !ok {
		c.l.PushFront(c.l.Add(k, 0))
		return true
	}
	if *c.l.Value(id) == 0 {
		c.l.PushFront(id)
	}
	return false
}

// evictTo evicts least recently used unpinned blocks until at most limit
// blocks remain (or none is evictable), appending their keys to dst.
func (c *blockCache) evictTo(limit int, dst []kvroute.BlockKey) []kvroute.BlockKey {
	for c.l.Len() > limit {
		id, ok := c.l.Back()
		if !ok {
			break
		}
		dst = append(dst, c.l.Key(id))
		c.l.Delete(id)
	}
	return dst
}
