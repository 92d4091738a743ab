package store_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/store"
)

// TestLookupHints checks that Lookup's hints (run ends remembered from
// earlier lookups) never change an answer: on a branching corpus with
// holes and partial holders, every lookup with hints (learned from other
// chains, or random positions, out-of-range ones included) must equal the
// same lookup without them, and the brute-force scan.
func TestLookupHints(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(9, 9))
		convs := corpus(rng, 30, 200)
		reps := replicaNames(12)
		m := newModel()
		seq := map[string]int64{}
		apply := func(r string, ops []kvroute.IndexOp) {
			seq[r]++
			if _, err := e.s.Apply(ctx, mdl, r, seq[r], ops); err != nil {
				t.Fatal(err)
			}
			m.apply(r, ops)
		}
		for _, r := range reps {
			for range 3 {
				c := convs[rng.IntN(len(convs))]
				apply(r, storeChain(c, 0, rng.IntN(len(c)+1), kvroute.TierGPU))
			}
		}
		cold, err := store.Open(ctx, e.url, store.Options{Now: e.clk.Now, NoLookupHints: true})
		if err != nil {
			t.Fatal(err)
		}
		defer cold.Close()
		for i := range 400 {
			if i%20 == 0 { // holes: hints learned before them go stale
				r := reps[rng.IntN(len(reps))]
				c := convs[rng.IntN(len(convs))]
				apply(r, []kvroute.IndexOp{remove1(c[rng.IntN(len(c))], kvroute.TierGPU)})
			}
			if i%50 == 25 { // approximate entries: the plain read must leave them to the script
				r := reps[rng.IntN(len(reps))]
				c := convs[rng.IntN(len(convs))]
				n := 1 + rng.IntN(len(c))
				if err := e.s.RecordApprox(ctx, mdl, r, c[:n]); err != nil {
					t.Fatal(err)
				}
				m.recordApprox(r, c[:n], e.clk.Now().Add(store.DefaultApproxTTL))
			}
			c := convs[rng.IntN(len(convs))]
			q := c[:1+rng.IntN(len(c))]
			if rng.IntN(3) == 0 {
				pos := make([]int32, rng.IntN(40))
				for j := range pos {
					pos[j] = int32(rng.IntN(len(q)+8)) - 2
				}
				e.s.SetLookupHints(mdl, q, pos)
			}
			got, _, err := e.s.Lookup(ctx, mdl, q, reps)
			if err != nil {
				t.Fatal(err)
			}
			want, _, err := cold.Lookup(ctx, mdl, q, reps)
			if err != nil {
				t.Fatal(err)
			}
			for j, r := range reps {
				if got[j] != want[j] || got[j] != m.overlap(r, q, e.clk.Now()) {
					t.Fatalf("lookup %d, %s on %d blocks: hinted %+v, cold %+v, scan %+v", i, r, len(q), got[j], want[j], m.overlap(r, q, e.clk.Now()))
				}
			}
		}
		// A chain looked up again, by a store that has not seen the wrong
		// hints above, once the approximate entries have expired: its own
		// hints prove it, and the plain read answers, exactly.
		e.clk.Add(store.DefaultApproxTTL + time.Minute)
		again, err := store.Open(ctx, e.url, store.Options{Now: e.clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer again.Close()
		for i := range 60 {
			c := convs[rng.IntN(len(convs))]
			if len(c) <= 16 {
				continue // too short to file hints under
			}
			q := c[:17+rng.IntN(len(c)-16)]
			for range 2 {
				got, _, err := again.Lookup(ctx, mdl, q, reps)
				if err != nil {
					t.Fatal(err)
				}
				for j, r := range reps {
					if want := m.overlap(r, q, e.clk.Now()); got[j] != want {
						t.Fatalf("again %d, %s on %d blocks: %+v, scan %+v", i, r, len(q), got[j], want)
					}
				}
			}
		}
		tries, hits := e.s.PlainLookups()
		t.Logf("plain reads with wrong hints: %d tried, %d proved the chain", tries, hits)
		tries, hits = again.PlainLookups()
		t.Logf("plain reads of chains looked up again: %d tried, %d proved the chain", tries, hits)
		if hits < 30 {
			t.Errorf("%d of 60 repeated lookups were answered by a plain read (%d tried), want most: the path this test guards did not run", hits, tries)
		}
	})
}
