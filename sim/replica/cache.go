package replica

import "container/list"

// lru is the replica's prefix cache: a bounded set of full blocks keyed by
// engine digest, least recently used at the back. It is not safe for
// concurrent use; the Replica's mutex guards it together with the sequence
// counter so that events leave in the order the cache changed.
type lru struct {
	cap   int
	order *list.List // of Digest, most recent at the front
	index map[Digest]*list.Element
}

func newLRU(capacity int) *lru {
	return &lru{cap: capacity, order: list.New(), index: make(map[Digest]*list.Element)}
}

func (c *lru) len() int { return c.order.Len() }

func (c *lru) has(d Digest) bool { _, ok := c.index[d]; return ok }

// match counts the leading digests held, stopping at the first miss: block i
// is useless to an engine that lacks block i-1.
func (c *lru) match(ds []Digest) int {
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
func (c *lru) admit(ds []Digest, hits int) (evicted []Digest) {
	for _, d := range ds[:hits] {
		c.order.MoveToFront(c.index[d])
	}
	fresh := 0
	for _, d := range ds[hits:] {
		if !c.has(d) {
			fresh++
		}
	}
	for over := c.order.Len() + fresh - c.cap; over > 0; over-- {
		back := c.order.Back()
		d := back.Value.(Digest)
		c.order.Remove(back)
		delete(c.index, d)
		evicted = append(evicted, d)
	}
	for i := len(ds) - 1; i >= 0; i-- {
		d := ds[i]
		if e, ok := c.index[d]; ok {
			c.order.MoveToFront(e)
			continue
		}
		c.index[d] = c.order.PushFront(d)
	}
	return evicted
}

func (c *lru) clear() {
	c.order.Init()
	c.index = make(map[Digest]*list.Element)
}
