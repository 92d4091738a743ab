package store_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// corpus is a tree of conversations: each one continues another's prefix up
// to a random branch point, the way chat turns and agent prompts share
// system prompts and history.
func corpus(rng *rand.Rand, convs, maxLen int) [][]kvroute.BlockKey {
	out := [][]kvroute.BlockKey{chain(rng, 1+rng.IntN(maxLen))}
	for len(out) < convs {
		base := out[rng.IntN(len(out))]
		b := rng.IntN(len(base) + 1)
		c := append(append([]kvroute.BlockKey{}, base[:b]...), chain(rng, 1+rng.IntN(maxLen))...)
		out = append(out, c)
	}
	return out
}

// TestLookupMatchesScan drives 8 replicas through stores, duplicate stores,
// interior removals, refilled holes, tier changes, clears and approximate
// records, and after every batch checks Lookup against the brute-force scan
// for a random request on every replica.
func TestLookupMatchesScan(t *testing.T) {
	const requests = 1000
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(42, 7))
		convs := corpus(rng, 40, 120)
		reps := replicaNames(8)
		m := newModel()
		seq := map[string]int64{}
		var all []kvroute.BlockKey
		for _, c := range convs {
			all = append(all, c...)
		}
		var nGPU, nHost, nApprox, nHole int // coverage: the test must see each case
		for i := range requests {
			r := reps[rng.IntN(len(reps))]
			c := convs[rng.IntN(len(convs))]
			var ops []kvroute.IndexOp
			for range 1 + rng.IntN(3) {
				tier := kvroute.TierGPU
				if rng.IntN(4) == 0 {
					tier = kvroute.TierHost
				}
				switch x := rng.IntN(100); {
				case x < 45: // store a stretch of a conversation, maybe not from its start
					from := 0
					if rng.IntN(3) == 0 {
						from = rng.IntN(len(c))
					}
					to := from + rng.IntN(len(c)-from+1)
					ops = append(ops, storeChain(c, from, to, tier)...)
				case x < 85: // remove random blocks, interior ones included
					for range 1 + rng.IntN(6) {
						k := c[rng.IntN(len(c))]
						ops = append(ops, remove1(k, tier))
					}
				case x < 93: // remove a tail, like LRU eviction
					from := rng.IntN(len(c))
					for j := len(c) - 1; j >= from; j-- {
						ops = append(ops, remove1(c[j], tier))
					}
				case x < 94:
					ops = append(ops, kvroute.IndexOp{Kind: kvroute.OpClear})
				default: // approximate record of a routed request
					n := rng.IntN(len(c) + 1)
					if err := e.s.RecordApprox(ctx, mdl, r, c[:n]); err != nil {
						t.Fatal(err)
					}
					m.recordApprox(r, c[:n], e.clk.Now().Add(10*time.Minute))
				}
			}
			seq[r]++
			got, err := e.s.Apply(ctx, mdl, r, seq[r], ops)
			if err != nil {
				t.Fatalf("request %d: apply: %v", i, err)
			}
			if want := m.apply(r, ops); got != want {
				t.Fatalf("request %d: apply = %+v, want %+v", i, got, want)
			}
			e.clk.Add(time.Duration(rng.IntN(20)) * time.Second)

			q := convs[rng.IntN(len(convs))]
			q = q[:rng.IntN(len(q)+1)]
			ov, _, err := e.s.Lookup(ctx, mdl, q, reps)
			if err != nil {
				t.Fatalf("request %d: lookup: %v", i, err)
			}
			for j, rep := range reps {
				want := m.overlap(rep, q, e.clk.Now())
				if want.GPU > 0 {
					nGPU++
				}
				if want.Any > want.GPU {
					nHost++
				}
				if want.Approx > 0 {
					nApprox++
				}
				if want.Any < len(q) && m.refs[rep][q[len(q)-1]] != nil {
					nHole++
				}
				if ov[j] != want {
					t.Fatalf("request %d (%d keys): replica %s: lookup = %+v, scan = %+v", i, len(q), rep, ov[j], want)
				}
			}
		}
		t.Logf("replica-requests with gpu match %d, host beyond gpu %d, approx %d, stopped at a hole %d", nGPU, nHost, nApprox, nHole)
		if nGPU < 100 || nHost < 20 || nApprox < 20 || nHole < 20 {
			t.Errorf("corpus too easy: gpu %d, host %d, approx %d, hole %d", nGPU, nHost, nApprox, nHole)
		}
		for _, rep := range reps {
			st, err := e.s.Stats(ctx, mdl, rep)
			if err != nil {
				t.Fatal(err)
			}
			if st.Blocks != len(m.refs[rep]) {
				t.Errorf("%s: stats blocks = %d, want %d", rep, st.Blocks, len(m.refs[rep]))
			}
		}
		checkRefs(t, e, mdl, m, all)
		// Every conversation, at full length, on every replica.
		for _, c := range convs {
			ov, _, err := e.s.Lookup(ctx, mdl, c, reps)
			if err != nil {
				t.Fatal(err)
			}
			for j, rep := range reps {
				if want := m.overlap(rep, c, e.clk.Now()); ov[j] != want {
					t.Errorf("final: replica %s: lookup = %+v, scan = %+v", rep, ov[j], want)
				}
			}
		}
	})
}
