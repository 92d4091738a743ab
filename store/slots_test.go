package store_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/store"
)

// TestSlotCache: lookups cache every replica's slot, and a slot that
// changes under the cache (a replica purged and its slot given to
// another, by this pod or any other; the whole store emptied and rebuilt
// in another order) is never read from it.
func TestSlotCache(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(6, 6))
		ka, kb, kc := chain(rng, 6), chain(rng, 4), chain(rng, 5)
		// Another pod's store writes; e.s (this pod) only looks up.
		other, err := store.Open(ctx, e.url, store.Options{Now: e.clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		apply := func(r string, keys []kvroute.BlockKey) {
			t.Helper()
			if _, err := other.Apply(ctx, mdl, r, 1, storeChain(keys, 0, len(keys), kvroute.TierGPU)); err != nil {
				t.Fatal(err)
			}
		}
		check := func(step string, keys []kvroute.BlockKey, want map[string]int) {
			t.Helper()
			reps := []string{"a", "b", "c"}
			for range 2 { // the second from the cache
				ov, _, err := e.s.Lookup(ctx, mdl, keys, reps)
				if err != nil {
					t.Fatal(err)
				}
				for i, r := range reps {
					if ov[i].GPU != want[r] {
						t.Errorf("%s: %s holds %d blocks, want %d", step, r, ov[i].GPU, want[r])
					}
				}
			}
		}
		apply("a", ka)
		apply("b", kb)
		check("a and b stored", ka, map[string]int{"a": 6})
		// a is purged; c takes its slot.
		if err := other.PurgeReplica(ctx, mdl, "a"); err != nil {
			t.Fatal(err)
		}
		apply("c", kc)
		check("a's slot given to c: a's chain", ka, map[string]int{})
		check("a's slot given to c: c's chain", kc, map[string]int{"c": 5})
		// The store emptied and rebuilt with the slots in another order.
		if err := e.rc.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		other.Close()
		if other, err = store.Open(ctx, e.url, store.Options{Now: e.clk.Now}); err != nil {
			t.Fatal(err)
		}
		apply("c", kc)
		apply("a", ka)
		check("rebuilt: a's chain", ka, map[string]int{"a": 6})
		check("rebuilt: c's chain", kc, map[string]int{"c": 5})
	})
}
