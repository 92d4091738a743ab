package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestConcurrent runs ingest (one goroutine per replica, as ingestors own
// replicas), bookings from many "pods" and lookups at once, then checks
// every invariant: refcounts equal the per-replica models, lookups equal the
// scan, every load is back to zero and no lease or request entry is left.
//
// The store's client has generous timeouts and no retry here: under CPU
// load an Apply queued behind the others can outlast the 500 ms request-path
// read timeout, and its retry, finding the seq applied by the first try,
// answers "stale" (Applied false) where this test checks exact results.
// What this test proves is the invariants under concurrency, not the
// request path's timeouts.
func TestConcurrent(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { concurrent(t, newEnv(t, patient(b.url(t)))) })
	}
}

// patient is url with long read and write timeouts and no retry.
func patient(url string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "read_timeout=60s&write_timeout=60s&max_retries=-1"
}

func concurrent(t *testing.T, e *env) {
	ctx := context.Background()
	convs := corpus(rand.New(rand.NewPCG(5, 5)), 30, 80)
	reps := replicaNames(8)
	models := make([]*model, len(reps))
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i, r := range reps {
		models[i] = newModel()
		wg.Add(1)
		go func(i int, r string) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for seq := int64(1); seq <= 60; seq++ {
				c := convs[rng.IntN(len(convs))]
				var ops []kvroute.IndexOp
				if rng.IntN(2) == 0 {
					ops = storeChain(c, rng.IntN(len(c)/2+1), len(c), kvroute.Tier(rng.IntN(2)))
				} else {
					for range 1 + rng.IntN(8) {
						ops = append(ops, remove1(c[rng.IntN(len(c))], kvroute.Tier(rng.IntN(2))))
					}
				}
				got, err := e.s.Apply(ctx, mdl, r, seq, ops)
				if err != nil {
					errs <- err
					return
				}
				if want := models[i].apply(r, ops); got != want {
					errs <- fmt.Errorf("%s seq %d: apply = %+v, want %+v", r, seq, got, want)
					return
				}
			}
		}(i, r)
	}
	for p := range 8 {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), 2))
			for i := range 80 {
				id := rid(fmt.Sprintf("p%d-%d", p, i))
				q := convs[rng.IntN(len(convs))]
				_, loads, err := e.s.Lookup(ctx, mdl, q, reps)
				if err != nil {
					errs <- err
					return
				}
				j := rng.IntN(len(reps))
				l := kvroute.Lease{RequestID: id, Model: mdl, Replica: reps[j], PrefillBlocks: int64(len(q)), DecodeBlocks: 8, Expires: time.Now().Add(time.Hour)}
				ver := loads[j].Version
				for {
					booked, cur, err := e.s.Reserve(ctx, l, ver)
					if err != nil {
						errs <- err
						return
					}
					if booked {
						break
					}
					ver = cur.Version
				}
				// Duplicated and reordered calls, as flaky clients make them.
				for _, op := range []func(context.Context, string) (bool, error){e.s.Advance, e.s.Advance, e.s.Release, e.s.Advance, e.s.Release} {
					if rng.IntN(3) == 0 {
						continue
					}
					if _, err := op(ctx, id); err != nil {
						errs <- err
						return
					}
				}
				if _, err := e.s.Release(ctx, id); err != nil {
					errs <- err
					return
				}
			}
		}(p)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	merged := newModel()
	var all []kvroute.BlockKey
	for _, c := range convs {
		all = append(all, c...)
	}
	for i, r := range reps {
		merged.refs[r] = models[i].refs[r]
		merged.e2r[r] = models[i].e2r[r]
	}
	checkRefs(t, e, mdl, merged, all)
	for _, c := range convs {
		ov, _, err := e.s.Lookup(ctx, mdl, c, reps)
		if err != nil {
			t.Fatal(err)
		}
		for j, r := range reps {
			if want := merged.overlap(r, c, e.clk.Now()); ov[j] != want {
				t.Errorf("replica %s: lookup = %+v, scan = %+v", r, ov[j], want)
			}
		}
	}
	loads, err := e.s.Loads(ctx, mdl, reps)
	if err != nil {
		t.Fatal(err)
	}
	for j, l := range loads {
		if l.PrefillBlocks != 0 || l.DecodeBlocks != 0 || l.Requests != 0 {
			t.Errorf("%s: load after all released = %+v, want zero", reps[j], l)
		}
	}
	if n, _ := e.rc.HLen(ctx, "kvr:reqs").Result(); n != 0 {
		t.Errorf("request map left with %d entries", n)
	}
	if n, _ := e.rc.HLen(ctx, "kvr:{m:"+mdl+"}:lb").Result(); n != 0 {
		t.Errorf("lease bodies left: %d", n)
	}
}
