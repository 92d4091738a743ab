package vllmtest

import "github.com/kvroute/kvroute/internal/lru"

// blockLRU is the replica's prefix cache: a bounded set of full blocks
// keyed by engine digest, least recently used at the back. It is keyed by
// the digest's 64-bit form, the one events publish: a map keyed by the
// whole 32 bytes spent more time hashing and missing cache than the rest of
// the replica, and two held digests sharing 64 bits would be one block in
// the events anyway. It is not safe for concurrent use; the Replica's
// mutex guards it together with the sequence counter so that events leave
// in the order the cache changed.
type blockLRU struct {
	cap int
	l   *lru.List[uint64, Digest]
}

func newLRU(capacity int) *blockLRU {
	return &blockLRU{cap: capacity, l: lru.New[uint64, Digest]()}
}

func (c *blockLRU) len() int { return c.l.Len() }

func (c *blockLRU) has(d Digest) bool { _, ok := c.l.Lookup(d.Uint64()); return ok }

// match counts the leading digests held, stopping at the first miss: block i
// is useless to an engine that lacks block i-1.
func (c *blockLRU) match(ds []Digest) int {
	for i, d := range ds {
		if !c.has(d) {
			return i
		}
	}
	return len(ds)
}

// admit caches a prompt's chain, whose first hits digests are already held,
// and returns the digests it evicted (oldest first) to make room. At most
// c.cap digests are admitted; the caller trims longer chains. Afterwards the
// chain sits at the front with block 0 most recent, so that, as in vLLM's free
// queue, a prompt's tail blocks are evicted before its head.
func (c *blockLRU) admit(ds []Digest, hits int) (evicted []Digest) {
	for _, d := range ds[:hits] {
		id, _ := c.l.Lookup(d.Uint64())
		c.l.PushFront(id)
	}
	fresh := 0
	for _, d := range ds[hits:] {
		if !c.has(d) {
			fresh++
		}
	}
	for over := c.len() + fresh - c.cap; over > 0; over-- {
		id, _ := c.l.Back()
		evicted = append(evicted, *c.l.Value(id))
		c.l.Delete(id)
	}
	for i := len(ds) - 1; i >= 0; i-- {
		d := ds[i]
		id, ok := c.l.Lookup(d.Uint64())
		if !ok {
			id = c.l.Add(d.Uint64(), d)
		}
		c.l.PushFront(id)
	}
	return evicted
}

func (c *blockLRU) clear() { c.l = lru.New[uint64, Digest]() }
