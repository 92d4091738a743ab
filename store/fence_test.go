package store_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestFence holds apply.lua, applyfast.lua and reset.lua to lua/fence.lua's
// rule: one writer per replica. A replica's claimed writer applies and
// resets; any other is refused with ErrFenced and changes nothing; the
// first writer of an unclaimed replica (after a loss of the store's data,
// or a purge) claims it; an empty writer is never fenced and claims
// nothing.
func TestFence(t *testing.T) {
	ctx := context.Background()
	k := chain(rand.New(rand.NewPCG(7, 8)), 12)
	gpu := kvroute.TierGPU
	forBackends(t, func(t *testing.T, e *env) {
		applied := func(t *testing.T, writer string, seq int64, ops []kvroute.IndexOp) {
			t.Helper()
			res, err := e.s.ApplyRun(ctx, mdl, "a", writer, seq, seq, ops)
			if err != nil || !res.Applied {
				t.Fatalf("apply seq %d by %q = %+v, %v; want applied", seq, writer, res, err)
			}
		}
		refused := func(t *testing.T, writer string, seq int64, ops []kvroute.IndexOp) {
			t.Helper()
			before := stats(t, e)
			if _, err := e.s.ApplyRun(ctx, mdl, "a", writer, seq, seq, ops); !errors.Is(err, kvroute.ErrFenced) {
				t.Fatalf("apply seq %d by %q: err %v, want ErrFenced", seq, writer, err)
			}
			if err := e.s.ResetReplica(ctx, mdl, "a", writer); !errors.Is(err, kvroute.ErrFenced) {
				t.Fatalf("reset by %q: err %v, want ErrFenced", writer, err)
			}
			if got := stats(t, e); got != before {
				t.Errorf("after %q was refused: %+v, want %+v unchanged", writer, got, before)
			}
		}

		t.Run("the first writer claims an unclaimed replica", func(t *testing.T) {
			applied(t, "ing-a", 1, storeChain(k, 0, 4, gpu)) // fresh chain: applyfast.lua
			refused(t, "ing-b", 2, storeChain(k, 4, 6, gpu))
			refused(t, "ing-b", 2, []kvroute.IndexOp{remove1(k[3], gpu)}) // apply.lua
		})
		t.Run("an empty writer is not fenced", func(t *testing.T) {
			applied(t, "", 2, []kvroute.IndexOp{remove1(k[3], gpu)})
			applied(t, "ing-a", 3, storeChain(k, 3, 4, gpu))
		})
		t.Run("a claim moves the replica to the claimer", func(t *testing.T) {
			if err := e.s.ClaimReplica(ctx, mdl, "a", "ing-b"); err != nil {
				t.Fatal(err)
			}
			refused(t, "ing-a", 4, storeChain(k, 4, 6, gpu))
			refused(t, "ing-a", 4, []kvroute.IndexOp{remove1(k[0], gpu)})
			applied(t, "ing-b", 4, storeChain(k, 4, 6, gpu))
		})
		t.Run("the writer keeps the replica through its reset", func(t *testing.T) {
			if err := e.s.ResetReplica(ctx, mdl, "a", "ing-b"); err != nil {
				t.Fatal(err)
			}
			if got := stats(t, e); got.HasSeq || got.Blocks != 0 {
				t.Errorf("after the reset: %+v, want no seq and no blocks", got)
			}
			refused(t, "ing-a", 0, storeChain(k, 0, 2, gpu))
			applied(t, "ing-b", 0, storeChain(k, 0, 2, gpu))
		})
		t.Run("an unfenced reset keeps the writer", func(t *testing.T) {
			if err := e.s.ResetReplica(ctx, mdl, "a", ""); err != nil {
				t.Fatal(err)
			}
			refused(t, "ing-a", 0, storeChain(k, 0, 2, gpu))
		})
		t.Run("a purge forgets the writer", func(t *testing.T) {
			if err := e.s.PurgeReplica(ctx, mdl, "a"); err != nil {
				t.Fatal(err)
			}
			applied(t, "ing-a", 0, storeChain(k, 0, 2, gpu))
			refused(t, "ing-b", 1, storeChain(k, 2, 3, gpu))
		})
		t.Run("a store that lost its data has no writer", func(t *testing.T) {
			if err := e.rc.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			applied(t, "ing-b", 5, storeChain(k, 6, 9, gpu))
			refused(t, "ing-a", 6, storeChain(k, 9, 10, gpu))
		})
		t.Run("an empty claim is refused", func(t *testing.T) {
			if err := e.s.ClaimReplica(ctx, mdl, "a", ""); !errors.Is(err, kvroute.ErrInvalidInput) {
				t.Errorf("claim by \"\": err %v, want ErrInvalidInput", err)
			}
		})
	})
}

// stats reads replica a's index statistics.
func stats(t *testing.T, e *env) kvroute.ReplicaStats {
	t.Helper()
	st, err := e.s.Stats(context.Background(), mdl, "a")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestApplyBehind holds apply.lua and applyfast.lua to refusing a run that
// does not follow the replica's applied seq, which is older: the store
// lost batches it had acknowledged, and applying the run would leave that
// hole for good. Nothing changes, and the error says ErrStoreBehind; a run
// that follows, a stale one and a first one are applied as before.
func TestApplyBehind(t *testing.T) {
	ctx := context.Background()
	k := chain(rand.New(rand.NewPCG(9, 10)), 8)
	gpu := kvroute.TierGPU
	forBackends(t, func(t *testing.T, e *env) {
		if _, err := e.s.ApplyRun(ctx, mdl, "a", "ing-a", 3, 3, storeChain(k, 0, 2, gpu)); err != nil {
			t.Fatal(err)
		}
		before := stats(t, e)
		for _, c := range []struct {
			name string
			ops  []kvroute.IndexOp
		}{
			{"fresh chain (applyfast.lua)", storeChain(k, 2, 4, gpu)},
			{"general path (apply.lua)", []kvroute.IndexOp{remove1(k[1], gpu)}},
		} {
			t.Run(c.name, func(t *testing.T) {
				if _, err := e.s.ApplyRun(ctx, mdl, "a", "ing-a", 5, 6, c.ops); !errors.Is(err, kvroute.ErrStoreBehind) {
					t.Errorf("a run from seq 5 over applied seq 3: err %v, want ErrStoreBehind", err)
				}
				if got := stats(t, e); got != before {
					t.Errorf("after the refusal: %+v, want %+v unchanged", got, before)
				}
			})
		}
		if res, err := e.s.ApplyRun(ctx, mdl, "a", "ing-a", 4, 4, storeChain(k, 2, 4, gpu)); err != nil || !res.Applied {
			t.Errorf("the run that follows: %+v, %v; want applied", res, err)
		}
	})
}
