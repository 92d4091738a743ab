package refindex_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/refindex"
)

// TestMatchedEqualsBruteForce is the seed's section 1: the single-descent
// answer equals a per-replica scan on every request, interior holes included.
func TestMatchedEqualsBruteForce(t *testing.T) {
	const n, bs = 4, kvroute.DefaultBlockSize
	r := rand.New(rand.NewPCG(20260826, 0))
	toks := func(k int) []uint32 {
		out := make([]uint32, k)
		for i := range out {
			out[i] = uint32(r.IntN(50_000))
		}
		return out
	}
	ks := kvroute.KeySpace{Model: "m"}
	sys := toks(4 * bs)
	var corpus [][]kvroute.BlockKey
	for range 24 {
		p := append(append([]uint32(nil), sys...), toks((2+r.IntN(7))*bs+7)...)
		corpus = append(corpus, kvroute.BlockKeys(ks, bs, p, nil))
	}
	ix := refindex.New(n)
	held := make([]map[kvroute.BlockKey]bool, n)
	for i := range held {
		held[i] = map[kvroute.BlockKey]bool{}
	}
	for i, keys := range corpus[:16] {
		ix.Store(i%n, keys)
		for _, k := range keys {
			held[i%n][k] = true
		}
	}
	check := func(t *testing.T) {
		t.Helper()
		got := make([]int, n)
		for i, keys := range corpus {
			ix.Matched(keys, got)
			if want := refindex.BruteForce(held, keys); !slices.Equal(got, want) {
				t.Errorf("request %d: matched %v, want %v", i, got, want)
			}
		}
	}
	t.Run("warm", check)
	t.Run("interior hole", func(t *testing.T) {
		victim := corpus[2]
		ix.Remove(2, victim[5:6])
		delete(held[2], victim[5])
		got := make([]int, n)
		ix.Matched(victim, got)
		if got[2] != 5 {
			t.Errorf("replica 2 matched %d, want 5 (stop at the hole)", got[2])
		}
		check(t)
	})
}
