// Package lru is the recency list under the simulators' block caches: a
// map from key to entry, and entries in one slice linked by index, so that
// caching a block allocates nothing but map and slice growth. A
// container/list element and a boxed key per block made the caches, not
// the code they simulate, the cost of a run. Entries may sit outside the
// list (pinned blocks that must not be evicted) and rejoin it later.
package lru

// List holds entries keyed by K with a value V each; the linked ones are
// ordered from most recent (front) to least recent (back). Entry ids stay
// valid until the entry is deleted. A List is not safe for concurrent use.
type List[K comparable, V any] struct {
	idx        map[K]int32
	ents       []entry[K, V]
	free       []int32
	head, tail int32 // -1 when no entry is linked
	linked     int
}

type entry[K comparable, V any] struct {
	key        K
	val        V
	prev, next int32 // toward the front, toward the back; -1 at the ends
	in         bool  // linked
}

// New returns an empty list.
func New[K comparable, V any]() *List[K, V] {
	return &List[K, V]{idx: make(map[K]int32), head: -1, tail: -1}
}

// Len is the number of entries, linked or not.
func (l *List[K, V]) Len() int { return len(l.idx) }

// Linked is the number of entries in the recency order.
func (l *List[K, V]) Linked() int { return l.linked }

// Lookup returns k's entry.
func (l *List[K, V]) Lookup(k K) (id int32, ok bool) {
	id, ok = l.idx[k]
	return id, ok
}

// Add inserts k, which must be absent, with value v, outside the order.
func (l *List[K, V]) Add(k K, v V) int32 {
	var id int32
	if n := len(l.free); n > 0 {
		id, l.free = l.free[n-1], l.free[:n-1]
	} else {
		id = int32(len(l.ents))
		l.ents = append(l.ents, entry[K, V]{})
	}
	l.ents[id] = entry[K, V]{key: k, val: v, prev: -1, next: -1}
	l.idx[k] = id
	return id
}

// Key is entry id's key.
func (l *List[K, V]) Key(id int32) K { return l.ents[id].key }

// Value points at entry id's value, for the caller to read or change.
func (l *List[K, V]) Value(id int32) *V { return &l.ents[id].val }

// PushFront makes entry id the most recent, linking it if it was not.
func (l *List[K, V]) PushFront(id int32) {
	if l.ents[id].in {
		if l.head == id {
			return
		}
		l.Unlink(id)
	}
	e := &l.ents[id]
	e.prev, e.next, e.in = -1, l.head, true
	if l.head >= 0 {
		l.ents[l.head].prev = id
	} else {
		l.tail = id
	}
	l.head = id
	l.linked++
}

// Unlink takes entry id out of the order, keeping the entry.
func (l *List[K, V]) Unlink(id int32) {
	e := &l.ents[id]
	if !e.in {
		return
	}
	if e.prev >= 0 {
		l.ents[e.prev].next = e.next
	} else {
		l.head = e.next
	}
	if e.next >= 0 {
		l.ents[e.next].prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.in = false
	l.linked--
}

// Back returns the least recent linked entry.
func (l *List[K, V]) Back() (id int32, ok bool) { return l.tail, l.tail >= 0 }

// Delete removes entry id; its id may be reused by the next Add.
func (l *List[K, V]) Delete(id int32) {
	l.Unlink(id)
	delete(l.idx, l.ents[id].key)
	var zero entry[K, V]
	l.ents[id] = zero
	l.free = append(l.free, id)
}
