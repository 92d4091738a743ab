// Package refindex is the seed document's in-memory index, kept as the
// correctness and speed reference for the Redis index: a radix tree over
// chained block keys whose nodes carry the set of replicas holding them,
// answered in one descent. Tests and benchmarks use it; the service does not.
package refindex

import "github.com/kvroute/kvroute"

// Index is a prefix tree over block keys for n replicas.
type Index struct {
	n       int
	kids    []map[kvroute.BlockKey]int32
	holders []map[int]struct{}
	nodeOf  map[kvroute.BlockKey]int32
}

// New returns an empty index for n replicas.
func New(n int) *Index {
	return &Index{n: n, kids: []map[kvroute.BlockKey]int32{{}}, holders: []map[int]struct{}{{}}, nodeOf: map[kvroute.BlockKey]int32{}}
}

// Store records that replica holds the chain keys (from the root).
func (ix *Index) Store(replica int, keys []kvroute.BlockKey) {
	node := int32(0)
	for _, k := range keys {
		nxt, ok := ix.kids[node][k]
		if !ok {
			nxt = int32(len(ix.kids))
			ix.kids = append(ix.kids, map[kvroute.BlockKey]int32{})
			ix.holders = append(ix.holders, map[int]struct{}{})
			ix.kids[node][k] = nxt
			ix.nodeOf[k] = nxt
		}
		node = nxt
		ix.holders[node][replica] = struct{}{}
	}
}

// Remove drops replica from the given blocks, wherever they are.
func (ix *Index) Remove(replica int, keys []kvroute.BlockKey) {
	for _, k := range keys {
		if node, ok := ix.nodeOf[k]; ok {
			delete(ix.holders[node], replica)
		}
	}
}

// Matched writes into out (len n) each replica's count of leading keys held,
// in one descent: a replica drops out at its first hole and never returns,
// so each level only looks at the replicas still in the running.
func (ix *Index) Matched(keys []kvroute.BlockKey, out []int) {
	clear(out)
	alive := make([]int, ix.n)
	for i := range alive {
		alive[i] = i
	}
	node := int32(0)
	for depth, k := range keys {
		nxt, ok := ix.kids[node][k]
		if !ok {
			return
		}
		node = nxt
		h := ix.holders[node]
		kept := alive[:0]
		for _, r := range alive {
			if _, ok := h[r]; ok {
				out[r] = depth + 1
				kept = append(kept, r)
			}
		}
		alive = kept
		if len(alive) == 0 {
			return
		}
	}
}

// BruteForce is the slow reference: per replica, count leading keys held.
func BruteForce(held []map[kvroute.BlockKey]bool, keys []kvroute.BlockKey) []int {
	out := make([]int, len(held))
	for r, h := range held {
		for _, k := range keys {
			if !h[k] {
				break
			}
			out[r]++
		}
	}
	return out
}
