package store_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestApplyBatchMatchesSingleOps checks Apply's batch fast path (fresh
// chains whose entries Go computes, see fastArgs) against applying the same
// ops one per batch: batches of fresh chains (GPU, host and mixed tiers),
// fresh chains whose root another replica already holds, engine hashes
// stored again, and fresh chains mixed with removals and stores
// under existing blocks must leave the same index (Lookup and refcounts) in
// both models and agree with the brute-force scan.
func TestApplyBatchMatchesSingleOps(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(9, 9))
		const batched, single = "batched", "single"
		reps := replicaNames(3)
		m := newModel()
		seqB, seqS := map[string]int64{}, map[string]int64{}
		var all [][]kvroute.BlockKey
		apply := func(r string, ops []kvroute.IndexOp) {
			t.Helper()
			want := m.apply(r, ops)
			seqB[r]++
			got, err := e.s.Apply(ctx, batched, r, seqB[r], ops)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("batched apply of %d ops: %+v, want %+v", len(ops), got, want)
			}
			var st, rm, un int
			for _, op := range ops {
				seqS[r]++
				res, err := e.s.Apply(ctx, single, r, seqS[r], []kvroute.IndexOp{op})
				if err != nil {
					t.Fatal(err)
				}
				st, rm, un = st+res.Stored, rm+res.Removed, un+res.Unknown
			}
			if st != want.Stored || rm != want.Removed || un != want.Unknown {
				t.Fatalf("single applies: stored %d removed %d unknown %d, want %+v", st, rm, un, want)
			}
		}
		fresh := func(n int, tiers ...kvroute.Tier) ([]kvroute.BlockKey, []kvroute.IndexOp) {
			k := chain(rng, n)
			all = append(all, k)
			ops := storeChain(k, 0, n, kvroute.TierGPU)
			for i := range ops {
				ops[i].Tier = tiers[i%len(tiers)]
			}
			return k, ops
		}
		gpu, host := kvroute.TierGPU, kvroute.TierHost
		// First batches: slots are not known to Go yet (read, and
		// allocated, through slot.lua).
		shared, ops := fresh(6, gpu)
		apply(reps[1], ops)
		_, ops = fresh(3, gpu)
		apply(reps[0], ops)
		// All-fresh batches: two chains, GPU, host, and GPU under host.
		_, a := fresh(5, gpu)
		_, b := fresh(4, host)
		apply(reps[0], append(a, b...))
		_, ops = fresh(7, gpu, host, gpu, gpu)
		apply(reps[0], ops)
		// A fresh-looking chain whose root (and more) replica 1 holds.
		c := append([]kvroute.BlockKey{}, shared[:3]...)
		c = append(c, chain(rng, 4)...)
		all = append(all, c)
		apply(reps[0], storeChain(c, 0, len(c), gpu))
		// A chain stored again (known blocks and engine hashes), once whole
		// and once as a fresh-looking chain from its third block.
		apply(reps[0], a)
		apply(reps[0], storeChain([]kvroute.BlockKey{a[2].Key, a[3].Key}, 0, 2, host))
		k2, _ := fresh(3, gpu)
		// Fresh chains mixed with removals, a store under an existing block
		// and a duplicate store.
		_, f1 := fresh(4, gpu)
		mixed := append([]kvroute.IndexOp{}, f1...)
		mixed = append(mixed, remove1(a[3].Key, gpu), store1(kvroute.BlockKey(rng.Uint64()|1), shared[5], gpu))
		mixed = append(mixed, store1(k2[0], kvroute.NoParent, host))
		_, f2 := fresh(3, host, gpu)
		mixed = append(mixed, f2...)
		apply(reps[0], mixed)
		apply(reps[2], mixed)
		// A clear followed by fresh chains, then fresh chains again.
		_, f3 := fresh(5, gpu)
		apply(reps[2], append([]kvroute.IndexOp{{Kind: kvroute.OpClear}}, f3...))
		_, f4 := fresh(5, gpu)
		apply(reps[2], f4)

		var keys []kvroute.BlockKey
		for _, k := range all {
			keys = append(keys, k...)
		}
		checkRefs(t, e, batched, m, keys)
		checkRefs(t, e, single, m, keys)
		now := e.clk.Now()
		for _, req := range all {
			for _, mod := range []string{batched, single} {
				ov, _, err := e.s.Lookup(ctx, mod, req, reps)
				if err != nil {
					t.Fatal(err)
				}
				for i, r := range reps {
					if want := m.overlap(r, req, now); ov[i] != want {
						t.Errorf("%s: %s overlap %+v, want %+v", mod, r, ov[i], want)
					}
				}
			}
		}
	})
}

// TestEngineHashPrefixCollision stores engine hashes that share the e2r
// field (their first 6 bytes), in one batch and across batches, removes and
// clears them, and checks refcounts, EngineKeys and Lookup.
func TestEngineHashPrefixCollision(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(5, 5))
		m := newModel()
		const r = "r0"
		var seq int64
		k := chain(rng, 7)
		eh := func(i int) uint64 { return 0xabcdef0123450000 | uint64(i) }
		op := func(i int, tier kvroute.Tier) kvroute.IndexOp {
			p := kvroute.NoParent
			if i > 0 {
				p = k[i-1]
			}
			return kvroute.IndexOp{Kind: kvroute.OpStore, EngineHash: eh(i), Key: k[i], Parent: p, Tier: tier}
		}
		rm := func(i int, tier kvroute.Tier) kvroute.IndexOp {
			return kvroute.IndexOp{Kind: kvroute.OpRemove, EngineHash: eh(i), Tier: tier}
		}
		check := func(step string) {
			t.Helper()
			checkRefs(t, e, mdl, m, k)
			hs := make([]uint64, len(k)+1) // and one never stored
			for i := range hs {
				hs[i] = eh(i)
			}
			keys, found, err := e.s.EngineKeys(ctx, mdl, r, hs)
			if err != nil {
				t.Fatal(err)
			}
			for i, h := range hs {
				want, ok := m.e2r[r][h]
				if found[i] != ok || (ok && keys[i] != want) {
					t.Errorf("%s: engine key of %x: %v %v, want %v %v", step, h, keys[i], found[i], want, ok)
				}
			}
			for _, req := range [][]kvroute.BlockKey{k[:6], k[6:]} { // k[6] is a root
				ov, _, err := e.s.Lookup(ctx, mdl, req, []string{r})
				if err != nil {
					t.Fatal(err)
				}
				if want := m.overlap(r, req, e.clk.Now()); ov[0] != want {
					t.Errorf("%s: overlap %+v, want %+v", step, ov[0], want)
				}
			}
		}
		for _, b := range []struct {
			name string
			ops  []kvroute.IndexOp
		}{
			{"store 0-2", []kvroute.IndexOp{op(0, kvroute.TierGPU), op(1, kvroute.TierGPU), op(2, kvroute.TierHost)}},
			{"store 3-4", []kvroute.IndexOp{op(3, kvroute.TierGPU), op(4, kvroute.TierGPU)}},
			{"store 1 again, remove 2", []kvroute.IndexOp{op(1, kvroute.TierGPU), rm(2, kvroute.TierHost)}},
			{"remove 1", []kvroute.IndexOp{rm(1, kvroute.TierGPU)}},
			{"store 2, 5", []kvroute.IndexOp{op(2, kvroute.TierGPU), op(5, kvroute.TierGPU)}},
			{"clear, store 0-1", []kvroute.IndexOp{{Kind: kvroute.OpClear}, op(0, kvroute.TierGPU), op(1, kvroute.TierGPU)}},
			{"store 2-3", []kvroute.IndexOp{op(2, kvroute.TierGPU), op(3, kvroute.TierHost)}},
			// A fresh root whose engine hash shares a field: Go's fast path
			// must fall back.
			{"store root 6", []kvroute.IndexOp{{Kind: kvroute.OpStore, EngineHash: eh(6), Key: k[6], Parent: kvroute.NoParent}}},
			{"remove 6", []kvroute.IndexOp{rm(6, kvroute.TierGPU)}},
		} {
			want := m.apply(r, b.ops)
			seq++
			got, err := e.s.Apply(ctx, mdl, r, seq, b.ops)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s: %+v, want %+v", b.name, got, want)
			}
			check(b.name)
		}
	})
}

// TestApplyRun checks that consecutive batches applied by one ApplyRun
// leave what applying them one by one leaves, on both of Apply's paths
// (fresh chains; removals, including of a block an earlier batch of the run
// stored), and that a run reaching back to the applied seq changes nothing.
func TestApplyRun(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(3, 3))
		const runs, single = "runs", "single"
		gpu, host := kvroute.TierGPU, kvroute.TierHost
		m := newModel()
		var seq int64
		apply := func(batches ...[]kvroute.IndexOp) {
			t.Helper()
			first := seq + 1
			var ops []kvroute.IndexOp
			want := kvroute.ApplyResult{Applied: true, NoPrior: first == 1}
			for _, b := range batches {
				seq++
				if _, err := e.s.Apply(ctx, single, "r0", seq, b); err != nil {
					t.Fatal(err)
				}
				r := m.apply("r0", b)
				want.Stored, want.Removed, want.Unknown = want.Stored+r.Stored, want.Removed+r.Removed, want.Unknown+r.Unknown
				ops = append(ops, b...)
			}
			got, err := e.s.ApplyRun(ctx, runs, "r0", "", first, seq, ops)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("run of seqs %d to %d: %+v, want %+v", first, seq, got, want)
			}
		}
		a, b, c := chain(rng, 6), chain(rng, 3), chain(rng, 4)
		// Fresh chains: applyfast.lua, the slot read through slot.lua.
		apply(storeChain(a, 0, 6, gpu), storeChain(b, 0, 3, gpu), nil)
		// The general path: a removal of a block stored in the same run,
		// a host copy, an unknown removal.
		apply(storeChain(c, 0, 4, gpu), []kvroute.IndexOp{remove1(c[3], gpu), remove1(a[5], gpu)},
			[]kvroute.IndexOp{store1(a[1], a[0], host), remove1(999, gpu)})
		keys := append(append(append([]kvroute.BlockKey{}, a...), b...), c...)
		checkRefs(t, e, runs, m, keys)

		// Runs that reach back to the applied seq change nothing, on
		// either path.
		for _, run := range []struct {
			first, last int64
			ops         []kvroute.IndexOp
		}{
			{seq, seq + 2, storeChain(chain(rng, 3), 0, 3, gpu)},
			{seq - 2, seq + 1, []kvroute.IndexOp{remove1(a[0], gpu)}},
			{seq - 3, seq - 1, storeChain(chain(rng, 2), 0, 2, gpu)},
		} {
			got, err := e.s.ApplyRun(ctx, runs, "r0", "", run.first, run.last, run.ops)
			if err != nil {
				t.Fatal(err)
			}
			if got != (kvroute.ApplyResult{}) {
				t.Errorf("run of seqs %d to %d over applied %d: %+v, want nothing applied", run.first, run.last, seq, got)
			}
		}
		st, err := e.s.Stats(ctx, runs, "r0")
		if err != nil {
			t.Fatal(err)
		}
		if st.AppliedSeq != seq {
			t.Errorf("applied seq %d, want %d", st.AppliedSeq, seq)
		}
		checkRefs(t, e, runs, m, keys)
		for _, k := range [][]kvroute.BlockKey{a, b, c} {
			for _, mod := range []string{runs, single} {
				ov, _, err := e.s.Lookup(ctx, mod, k, []string{"r0"})
				if err != nil {
					t.Fatal(err)
				}
				if want := m.overlap("r0", k, e.clk.Now()); ov[0] != want {
					t.Errorf("%s: overlap %+v, want %+v", mod, ov[0], want)
				}
			}
		}
		if _, err := e.s.ApplyRun(ctx, runs, "r0", "", seq+2, seq+1, nil); !errors.Is(err, kvroute.ErrInvalidInput) {
			t.Errorf("run of seqs %d to %d: err %v, want ErrInvalidInput", seq+2, seq+1, err)
		}
	})
}
