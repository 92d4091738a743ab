package store_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/store"
)

const mdl = "llama"

func TestApply(t *testing.T) {
	ctx := context.Background()
	k := []kvroute.BlockKey{11, 22, 33, 44, 1<<63 | 55} // the last one is negative as a key name
	gpu, host := kvroute.TierGPU, kvroute.TierHost
	type step struct {
		seq  int64
		ops  []kvroute.IndexOp
		want kvroute.ApplyResult
	}
	tests := []struct {
		name  string
		steps []step
		want  kvroute.Overlap // of the whole chain k, replica "a"
		want2 int             // Stats.Blocks
	}{
		{
			name:  "chain",
			steps: []step{{1, storeChain(k, 0, 5, gpu), kvroute.ApplyResult{Applied: true, Stored: 5}}},
			want:  kvroute.Overlap{GPU: 5, Any: 5}, want2: 5,
		},
		{
			name: "stale seq is a no-op",
			steps: []step{
				{5, storeChain(k, 0, 2, gpu), kvroute.ApplyResult{Applied: true, Stored: 2}},
				{5, storeChain(k, 2, 5, gpu), kvroute.ApplyResult{}},
				{4, storeChain(k, 2, 5, gpu), kvroute.ApplyResult{}},
			},
			want: kvroute.Overlap{GPU: 2, Any: 2}, want2: 2,
		},
		{
			name: "duplicate stores need as many removes",
			steps: []step{
				{1, append(storeChain(k, 0, 3, gpu), store1(k[2], k[1], gpu)), kvroute.ApplyResult{Applied: true, Stored: 4}},
				{2, []kvroute.IndexOp{remove1(k[2], gpu)}, kvroute.ApplyResult{Applied: true, Removed: 1}},
			},
			want: kvroute.Overlap{GPU: 3, Any: 3}, want2: 3,
		},
		{
			name: "interior hole stops the match",
			steps: []step{
				{1, storeChain(k, 0, 5, gpu), kvroute.ApplyResult{Applied: true, Stored: 5}},
				{2, []kvroute.IndexOp{remove1(k[1], gpu)}, kvroute.ApplyResult{Applied: true, Removed: 1}},
			},
			want: kvroute.Overlap{GPU: 1, Any: 1}, want2: 4,
		},
		{
			name: "refilled hole restores the match",
			steps: []step{
				{1, storeChain(k, 0, 5, gpu), kvroute.ApplyResult{Applied: true, Stored: 5}},
				{2, []kvroute.IndexOp{remove1(k[1], gpu)}, kvroute.ApplyResult{Applied: true, Removed: 1}},
				{3, storeChain(k, 1, 2, gpu), kvroute.ApplyResult{Applied: true, Stored: 1}},
			},
			want: kvroute.Overlap{GPU: 5, Any: 5}, want2: 5,
		},
		{
			name: "child stored before parent",
			steps: []step{
				{1, storeChain(k, 2, 5, gpu), kvroute.ApplyResult{Applied: true, Stored: 3}},
				{2, storeChain(k, 0, 2, gpu), kvroute.ApplyResult{Applied: true, Stored: 2}},
			},
			want: kvroute.Overlap{GPU: 5, Any: 5}, want2: 5,
		},
		{
			name: "host tier counts for any only",
			steps: []step{
				{1, append(storeChain(k, 0, 2, gpu), storeChain(k, 2, 4, host)...), kvroute.ApplyResult{Applied: true, Stored: 4}},
				{2, storeChain(k, 4, 5, gpu), kvroute.ApplyResult{Applied: true, Stored: 1}},
			},
			want: kvroute.Overlap{GPU: 2, Any: 5}, want2: 5,
		},
		{
			name: "gpu copy evicted, host copy kept",
			steps: []step{
				{1, append(storeChain(k, 0, 5, gpu), store1(k[1], k[0], host)), kvroute.ApplyResult{Applied: true, Stored: 6}},
				{2, []kvroute.IndexOp{remove1(k[1], gpu)}, kvroute.ApplyResult{Applied: true, Removed: 1}},
			},
			want: kvroute.Overlap{GPU: 1, Any: 5}, want2: 5,
		},
		{
			name: "unknown removals change nothing",
			steps: []step{
				{1, storeChain(k, 0, 3, gpu), kvroute.ApplyResult{Applied: true, Stored: 3}},
				{2, []kvroute.IndexOp{remove1(999, gpu), remove1(k[0], host), remove1(k[4], gpu)},
					kvroute.ApplyResult{Applied: true, Unknown: 3}},
				{3, []kvroute.IndexOp{remove1(k[2], gpu), remove1(k[2], gpu)}, kvroute.ApplyResult{Applied: true, Removed: 1, Unknown: 1}},
			},
			want: kvroute.Overlap{GPU: 2, Any: 2}, want2: 2,
		},
		{
			name: "clear inside a batch",
			steps: []step{
				{1, storeChain(k, 0, 5, gpu), kvroute.ApplyResult{Applied: true, Stored: 5}},
				{2, append([]kvroute.IndexOp{remove1(k[4], gpu), {Kind: kvroute.OpClear}}, storeChain(k, 0, 1, gpu)...),
					kvroute.ApplyResult{Applied: true, Stored: 1, Removed: 1}},
				{3, []kvroute.IndexOp{remove1(k[3], gpu)}, kvroute.ApplyResult{Applied: true, Unknown: 1}},
			},
			want: kvroute.Overlap{GPU: 1, Any: 1}, want2: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, e *env) {
				m := newModel()
				had := false // an applied seq is stored
				for i, st := range tc.steps {
					got, err := e.s.Apply(ctx, mdl, "a", st.seq, st.ops)
					if err != nil {
						t.Fatalf("step %d: apply: %v", i, err)
					}
					want := st.want
					want.NoPrior = want.Applied && !had
					if got != want {
						t.Errorf("step %d: apply = %+v, want %+v", i, got, want)
					}
					if got.Applied {
						had = true
						m.apply("a", st.ops)
					}
				}
				// Another replica holding the same chain must not be affected.
				if _, err := e.s.Apply(ctx, mdl, "b", 1, storeChain(k, 0, 5, gpu)); err != nil {
					t.Fatal(err)
				}
				ov, _, err := e.s.Lookup(ctx, mdl, k, []string{"a", "b", "c"})
				if err != nil {
					t.Fatalf("lookup: %v", err)
				}
				want := []kvroute.Overlap{tc.want, {GPU: 5, Any: 5}, {}}
				for i := range want {
					if ov[i] != want[i] {
						t.Errorf("overlap[%d] = %+v, want %+v", i, ov[i], want[i])
					}
				}
				st, err := e.s.Stats(ctx, mdl, "a")
				if err != nil {
					t.Fatal(err)
				}
				if st.Blocks != tc.want2 || !st.HasSeq || !st.LastApplied.Equal(e.clk.Now()) {
					t.Errorf("stats = %+v, want %d blocks, a seq, applied at %v", st, tc.want2, e.clk.Now())
				}
				checkRefs(t, e, mdl, m, append(k, 999))
			})
		})
	}
}

// TestApplyNoPrior: a run applied to a replica the store holds no applied
// seq for says so, through either script, and is kept as the start of the
// replica's history (HistoryStart), so that a follower that had applied
// the stream learns the store lost its entries (see
// kvroute.ApplyResult.NoPrior), even when the reply was lost.
func TestApplyNoPrior(t *testing.T) {
	ctx := context.Background()
	k := chain(rand.New(rand.NewPCG(5, 6)), 12)
	gpu := kvroute.TierGPU
	forBackends(t, func(t *testing.T, e *env) {
		steps := []struct {
			name   string
			before func(t *testing.T)
			seq    int64
			ops    []kvroute.IndexOp
			want   bool
			from   int64 // HistoryStart after the run
		}{
			{name: "first run (fresh chain)", seq: 4, ops: storeChain(k, 0, 4, gpu), want: true, from: 4},
			{name: "next run (fresh chain)", seq: 5, ops: storeChain(k, 4, 6, gpu), from: 4},
			{name: "next run (general path)", seq: 6, ops: []kvroute.IndexOp{remove1(k[5], gpu)}, from: 4},
			{name: "after the store lost its data (fresh chain)", before: func(t *testing.T) {
				if err := e.rc.FlushDB(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}, seq: 7, ops: storeChain(k, 6, 9, gpu), want: true, from: 7},
			{name: "after the store lost its data (general path)", before: func(t *testing.T) {
				if err := e.rc.FlushDB(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}, seq: 8, ops: []kvroute.IndexOp{remove1(k[7], gpu)}, want: true, from: 8},
			{name: "after a reset", before: func(t *testing.T) {
				if err := e.s.ResetReplica(ctx, mdl, "a", ""); err != nil {
					t.Fatal(err)
				}
				if _, ok, err := e.s.HistoryStart(ctx, mdl, "a"); err != nil || ok {
					t.Errorf("HistoryStart after a reset: ok %v, %v; want none", ok, err)
				}
			}, seq: 9, ops: storeChain(k, 9, 12, gpu), want: true, from: 9},
			{name: "stale run", seq: 9, ops: storeChain(k, 9, 12, gpu), from: 9},
		}
		for _, st := range steps {
			t.Run(st.name, func(t *testing.T) {
				if st.before != nil {
					st.before(t)
				}
				res, err := e.s.Apply(ctx, mdl, "a", st.seq, st.ops)
				if err != nil {
					t.Fatal(err)
				}
				if got := res.NoPrior; got != st.want {
					t.Errorf("NoPrior = %v (result %+v), want %v", got, res, st.want)
				}
				if from, ok, err := e.s.HistoryStart(ctx, mdl, "a"); err != nil || !ok || from != st.from {
					t.Errorf("HistoryStart = %d, %v, %v; want %d, true", from, ok, err, st.from)
				}
			})
		}
	})
}

func TestResetAndPurge(t *testing.T) {
	ctx := context.Background()
	k := chain(rand.New(rand.NewPCG(1, 2)), 8)
	forBackends(t, func(t *testing.T, e *env) {
		for _, r := range []string{"a", "b"} {
			if _, err := e.s.Apply(ctx, mdl, r, 7, storeChain(k, 0, 8, kvroute.TierGPU)); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.s.RecordApprox(ctx, mdl, "a", k[:4]); err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.s.Reserve(ctx, kvroute.Lease{RequestID: rid("q1"), Model: mdl, Replica: "a", PrefillBlocks: 3, DecodeBlocks: 2}, -1); err != nil {
			t.Fatal(err)
		}

		t.Run("reset", func(t *testing.T) {
			if err := e.s.ResetReplica(ctx, mdl, "a", ""); err != nil {
				t.Fatal(err)
			}
			if _, ok, err := e.s.AppliedSeq(ctx, mdl, "a"); err != nil || ok {
				t.Fatalf("applied seq after reset: ok=%v err=%v, want none", ok, err)
			}
			res, err := e.s.Apply(ctx, mdl, "a", 0, storeChain(k, 0, 2, kvroute.TierGPU))
			if err != nil || !res.Applied {
				t.Fatalf("apply seq 0 after reset = %+v, %v; want applied", res, err)
			}
			ov, loads, err := e.s.Lookup(ctx, mdl, k, []string{"a", "b"})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := ov[0], (kvroute.Overlap{GPU: 2, Any: 2, Approx: 4}); got != want {
				t.Errorf("a = %+v, want %+v (approx and load survive a reset)", got, want)
			}
			if got, want := ov[1], (kvroute.Overlap{GPU: 8, Any: 8}); got != want {
				t.Errorf("b = %+v, want %+v", got, want)
			}
			if loads[0].Requests != 1 {
				t.Errorf("a load = %+v, want 1 request", loads[0])
			}
		})
		t.Run("purge", func(t *testing.T) {
			if err := e.s.PurgeReplica(ctx, mdl, "a"); err != nil {
				t.Fatal(err)
			}
			ov, loads, err := e.s.Lookup(ctx, mdl, k, []string{"a", "b"})
			if err != nil {
				t.Fatal(err)
			}
			if ov[0] != (kvroute.Overlap{}) || loads[0] != (kvroute.Load{}) {
				t.Errorf("a after purge = %+v %+v, want zero", ov[0], loads[0])
			}
			if ov[1] != (kvroute.Overlap{GPU: 8, Any: 8}) {
				t.Errorf("b after purging a = %+v", ov[1])
			}
			if ok, err := e.s.Release(ctx, rid("q1")); err != nil || ok {
				t.Errorf("release of purged lease = %v, %v; want false", ok, err)
			}
			st, err := e.s.Stats(ctx, mdl, "a")
			if err != nil || st != (kvroute.ReplicaStats{}) {
				t.Errorf("stats after purge = %+v, %v", st, err)
			}
			keys, err := e.rc.Keys(ctx, "*:r:a:*").Result()
			if err != nil || len(keys) != 0 {
				t.Errorf("keys of a left after purge: %v %v", keys, err)
			}
		})
	})
}

func TestEngineKeys(t *testing.T) {
	ctx := context.Background()
	forBackends(t, func(t *testing.T, e *env) {
		neg := kvroute.BlockKey(1<<64 - 1) // -1 as a key name
		k := []kvroute.BlockKey{neg, 2, 3}
		if _, err := e.s.Apply(ctx, mdl, "a", 1, storeChain(k, 0, 3, kvroute.TierGPU)); err != nil {
			t.Fatal(err)
		}
		keys, found, err := e.s.EngineKeys(ctx, mdl, "a", []uint64{ehOf(neg), 12345, ehOf(3)})
		if err != nil {
			t.Fatal(err)
		}
		if keys[0] != neg || !found[0] || found[1] || keys[2] != 3 || !found[2] {
			t.Errorf("engine keys = %v %v, want [-1 0 3] [true false true]", keys, found)
		}
	})
}

func TestApprox(t *testing.T) {
	ctx := context.Background()
	forBackends(t, func(t *testing.T, e *env) {
		k := chain(rand.New(rand.NewPCG(3, 4)), 10)
		if _, err := e.s.Apply(ctx, mdl, "a", 1, storeChain(k, 0, 3, kvroute.TierGPU)); err != nil {
			t.Fatal(err)
		}
		// Approximate entries never overwrite event-fed ones, both ways.
		if err := e.s.RecordApprox(ctx, mdl, "a", k[:6]); err != nil {
			t.Fatal(err)
		}
		if err := e.s.RecordApprox(ctx, mdl, "b", k[:10]); err != nil {
			t.Fatal(err)
		}
		e.clk.Add(5 * time.Minute)
		if err := e.s.RecordApprox(ctx, mdl, "b", k[:2]); err != nil {
			t.Fatal(err)
		}
		check := func(want []kvroute.Overlap) {
			t.Helper()
			ov, _, err := e.s.Lookup(ctx, mdl, k, []string{"a", "b"})
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if ov[i] != want[i] {
					t.Errorf("overlap[%d] = %+v, want %+v", i, ov[i], want[i])
				}
			}
		}
		check([]kvroute.Overlap{{GPU: 3, Any: 3, Approx: 6}, {Approx: 10}})
		e.clk.Add(5*time.Minute + time.Millisecond)
		check([]kvroute.Overlap{{GPU: 3, Any: 3}, {Approx: 2}})
		e.clk.Add(5 * time.Minute)
		check([]kvroute.Overlap{{GPU: 3, Any: 3}, {}})
	})
}

func TestErrUnavailable(t *testing.T) {
	ctx := context.Background()
	url := backends[1].url(t)
	s, err := store.Open(ctx, url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, _, err = s.Lookup(ctx, mdl, []kvroute.BlockKey{1}, []string{"a"})
	if !errors.Is(err, kvroute.ErrUnavailable) {
		t.Errorf("lookup on closed store: %v, want ErrUnavailable", err)
	}
	if _, err := store.Open(ctx, "redis://127.0.0.1:1", store.Options{}); !errors.Is(err, kvroute.ErrUnavailable) {
		t.Errorf("open of closed port: %v, want ErrUnavailable", err)
	}
}
