package replica

// lru is the replica's prefix cache: a bounded set of full blocks keyed by
// engine digest, least recently used at the back. The recency list is
// intrusive, nodes in one slice linked by index, so that admitting a block
// allocates nothing but map growth: a container/list element and a boxed
// digest per block made the simulated replicas, not the ingestor, the
// bottleneck of the ingestion benchmark. It is not safe for concurrent use;
// the Replica's mutex guards it together with the sequence counter so that
// events leave in the order the cache changed.
type lru struct {
	cap int
	// index maps a digest's 64-bit form (the one events publish) to its
	// node: a map keyed by the whole 32 bytes spent more time hashing and
	// missing cache than the rest of the replica. Two held digests sharing
	// 64 bits would be one block here, as they are in the events.
	index map[uint64]int32
	nodes []lruNode
	free  []int32 // nodes of evicted digests, for reuse
	// head is the most recent node, tail the least; -1 when empty.
	head, tail int32
}

type lruNode struct {
	d          Digest
	prev, next int32 // toward head, toward tail; -1 at the ends
}

func newLRU(capacity int) *lru {
	return &lru{cap: capacity, index: make(map[uint64]int32), head: -1, tail: -1}
}

func (c *lru) len() int { return len(c.index) }

// unlink takes node i out of the recency list.
func (c *lru) unlink(i int32) {
	n := &c.nodes[i]
	if n.prev >= 0 {
		c.nodes[n.prev].next = n.next
	} else {
		c.head = n.next
	}
	if n.next >= 0 {
		c.nodes[n.next].prev = n.prev
	} else {
		c.tail = n.prev
	}
}

// pushFront makes node i the most recent.
func (c *lru) pushFront(i int32) {
	n := &c.nodes[i]
	n.prev, n.next = -1, c.head
	if c.head >= 0 {
		c.nodes[c.head].prev = i
	} else {
		c.tail = i
	}
	c.head = i
}

func (c *lru) moveToFront(i int32) {
	if c.head != i {
		c.unlink(i)
		c.pushFront(i)
	}
}

// insert adds d as the most recent digest.
func (c *lru) insert(d Digest) {
	var i int32
	if k := len(c.free); k > 0 {
		i, c.free = c.free[k-1], c.free[:k-1]
		c.nodes[i].d = d
	} else {
		i = int32(len(c.nodes))
		c.nodes = append(c.nodes, lruNode{d: d})
	}
	c.index[d.Uint64()] = i
	c.pushFront(i)
}

// evictOldest removes the least recent digest and returns it.
func (c *lru) evictOldest() Digest {
	i := c.tail
	d := c.nodes[i].d
	c.unlink(i)
	delete(c.index, d.Uint64())
	c.free = append(c.free, i)
	return d
}

func (c *lru) has(d Digest) bool { _, ok := c.index[d.Uint64()]; return ok }

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
		c.moveToFront(c.index[d.Uint64()])
	}
	fresh := 0
	for _, d := range ds[hits:] {
		if !c.has(d) {
			fresh++
		}
	}
	for over := c.len() + fresh - c.cap; over > 0; over-- {
		evicted = append(evicted, c.evictOldest())
	}
	for i := len(ds) - 1; i >= 0; i-- {
		d := ds[i]
		if n, ok := c.index[d.Uint64()]; ok {
			c.moveToFront(n)
			continue
		}
		c.insert(d)
	}
	return evicted
}

func (c *lru) clear() {
	*c = *newLRU(c.cap)
}
