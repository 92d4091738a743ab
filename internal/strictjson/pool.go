package strictjson

import (
	"math/bits"
	"sync"
)

// Buffers for a decision's two big allocations, recycled. A 2,048-block
// /v1/route body is 175 KB of JSON and its ids 128 KB, both garbage the
// moment the decision is answered; at a pod's ceiling that is a few
// hundred MB/s, which the garbage collector pays for in cycles and in
// clearing fresh memory. A handler gives them back only when nothing
// outlives it that could still point into them: a decision made on
// client-given token ids (text and chat prompts may be read after the
// answer, by shadow tokenization), not the proxy (it forwards the body).

// Size classes are powers of two from minPooled to maxPooled: a buffer is
// filed under the largest class it holds and handed out for requests up
// to that class, so no class pins more than it was asked for.
const (
	minPooledBits = 12 // 4 KB
	maxPooledBits = 24 // 16 MB
)

// Pool recycles slices of T by size class. The zero value is ready to use.
type Pool[T any] struct {
	pools [maxPooledBits - minPooledBits + 1]sync.Pool // of *[]T
}

// Get returns an empty slice with room for n elements, recycled when one
// is at hand.
func (p *Pool[T]) Get(n int) []T {
	c := bits.Len(uint(max(n, 1) - 1)) // the class that fits n
	if c > maxPooledBits {
		return make([]T, 0, n)
	}
	c = max(c, minPooledBits)
	if s, ok := p.pools[c-minPooledBits].Get().(*[]T); ok {
		return (*s)[:0]
	}
	return make([]T, 0, 1<<c)
}

// Put files s for reuse; the caller must hold no other reference to it.
func (p *Pool[T]) Put(s []T) {
	c := bits.Len(uint(cap(s))) - 1 // the largest class s holds
	if c < minPooledBits || c > maxPooledBits {
		return
	}
	s = s[:0]
	p.pools[c-minPooledBits].Put(&s)
}

// IDs holds the buffers Scan parses token ids into. A caller gives a
// Taken's IDs back (IDs.Put) once nothing can still read them.
var IDs Pool[uint32]
