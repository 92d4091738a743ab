package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

func lease(id, replica string, pre, dec int64, exp time.Time) kvroute.Lease {
	return kvroute.Lease{RequestID: rid(id), Model: mdl, Replica: replica, PrefillBlocks: pre, DecodeBlocks: dec, Expires: exp}
}

func loadOf(t *testing.T, e *env, r string) kvroute.Load {
	t.Helper()
	l, err := e.s.Loads(context.Background(), mdl, []string{r})
	if err != nil {
		t.Fatalf("loads: %v", err)
	}
	return l[0]
}

func TestLeases(t *testing.T) {
	ctx := context.Background()
	forBackends(t, func(t *testing.T, e *env) {
		exp := e.clk.Now().Add(time.Minute)
		t.Run("book advance release", func(t *testing.T) {
			booked, cur, err := e.s.Reserve(ctx, lease("q1", "a", 10, 4, exp), 0)
			if err != nil || !booked {
				t.Fatalf("reserve = %v, %v; want booked", booked, err)
			}
			if want := (kvroute.Load{PrefillBlocks: 10, DecodeBlocks: 4, Requests: 1, Version: 1}); cur != want {
				t.Errorf("booked load = %+v, want %+v", cur, want)
			}
			for i, want := range []bool{true, false} {
				if ok, err := e.s.Advance(ctx, rid("q1")); err != nil || ok != want {
					t.Errorf("advance #%d = %v, %v; want %v", i, ok, err, want)
				}
			}
			if got, want := loadOf(t, e, "a"), (kvroute.Load{DecodeBlocks: 4, Requests: 1, Version: 2}); got != want {
				t.Errorf("after advance: %+v, want %+v", got, want)
			}
			for i, want := range []bool{true, false} {
				if ok, err := e.s.Release(ctx, rid("q1")); err != nil || ok != want {
					t.Errorf("release #%d = %v, %v; want %v", i, ok, err, want)
				}
			}
			if ok, err := e.s.Advance(ctx, rid("q1")); err != nil || ok {
				t.Errorf("advance after release = %v, %v; want false", ok, err)
			}
			if got, want := loadOf(t, e, "a"), (kvroute.Load{Version: 3}); got != want {
				t.Errorf("after release: %+v, want %+v", got, want)
			}
		})
		t.Run("stale version", func(t *testing.T) {
			booked, cur, err := e.s.Reserve(ctx, lease("q2", "a", 5, 1, exp), 1)
			if err != nil || booked {
				t.Fatalf("reserve with stale version = %v, %v; want not booked", booked, err)
			}
			if want := (kvroute.Load{Version: 3}); cur != want {
				t.Errorf("current load = %+v, want %+v", cur, want)
			}
			if ok, err := e.s.Release(ctx, rid("q2")); err != nil || ok {
				t.Errorf("release of unbooked = %v, %v; want false", ok, err)
			}
			if booked, _, err := e.s.Reserve(ctx, lease("q2", "a", 5, 1, exp), cur.Version); err != nil || !booked {
				t.Errorf("reserve with current version = %v, %v; want booked", booked, err)
			}
			if booked, cur, err := e.s.Reserve(ctx, lease("q2", "a", 5, 1, exp), -1); err != nil || !booked || cur.Requests != 1 {
				t.Errorf("retried reserve = %v, %+v, %v; want booked once", booked, cur, err)
			}
			if ok, err := e.s.Release(ctx, rid("q2")); err != nil || !ok {
				t.Errorf("release = %v, %v", ok, err)
			}
		})
		t.Run("sweep", func(t *testing.T) {
			for i := range 3 {
				if _, _, err := e.s.Reserve(ctx, lease(fmt.Sprint("s", i), "b", 2, 1, e.clk.Now().Add(time.Duration(i+1)*time.Second)), -1); err != nil {
					t.Fatal(err)
				}
			}
			e.clk.Add(2500 * time.Millisecond)
			if n, err := e.s.SweepExpired(ctx, mdl); err != nil || n != 2 {
				t.Errorf("sweep = %d, %v; want 2", n, err)
			}
			if got := loadOf(t, e, "b"); got.PrefillBlocks != 2 || got.Requests != 1 {
				t.Errorf("after sweep: %+v, want one lease left", got)
			}
			if ok, _ := e.s.Release(ctx, rid("s0")); ok {
				t.Errorf("release of swept lease = true, want false")
			}
			if ok, _ := e.s.Release(ctx, rid("s2")); !ok {
				t.Errorf("release of live lease = false, want true")
			}
		})
		t.Run("scraped", func(t *testing.T) {
			if err := e.s.SetScraped(ctx, mdl, "c", 3, 7, 0.25); err != nil {
				t.Fatal(err)
			}
			if _, _, err := e.s.Reserve(ctx, lease("c1", "c", 1, 1, exp), -1); err != nil {
				t.Fatal(err)
			}
			// The scrape is stamped with the store's clock, so that
			// admission can tell a stale one.
			want := kvroute.Load{PrefillBlocks: 1, DecodeBlocks: 1, Requests: 1, Version: 1, Waiting: 3, Running: 7, KVUsage: 0.25,
				ScrapedAt: time.UnixMilli(e.clk.Now().UnixMilli())}
			if got := loadOf(t, e, "c"); got != want {
				t.Errorf("loads = %+v, want %+v", got, want)
			}
			_, loads, err := e.s.Lookup(ctx, mdl, nil, []string{"x", "c"})
			if err != nil {
				t.Fatal(err)
			}
			if loads[0] != (kvroute.Load{}) || loads[1] != want {
				t.Errorf("lookup loads = %+v, want [{} %+v]", loads, want)
			}
		})
		t.Run("malformed values are errors", func(t *testing.T) {
			key := "kvr:{m:" + mdl + "}:load"
			for _, tc := range []struct{ field, value string }{
				{"bad", "1,2,3"}, {"bad", "1,2,3,4,5"}, {"bad", "1,x,3,4"}, {"bad", ""},
				{"bad#s", "1,2"}, {"bad#s", "1,2,0.5,9,9"}, {"bad#s", "1,2,0.5,soon"}, {"bad#s", "1,2,lots"},
			} {
				if err := e.rc.HSet(ctx, key, tc.field, tc.value).Err(); err != nil {
					t.Fatal(err)
				}
				if _, err := e.s.Loads(ctx, mdl, []string{"bad"}); err == nil || !strings.Contains(err.Error(), "bad") {
					t.Errorf("%s = %q: err = %v, want one naming the replica", tc.field, tc.value, err)
				}
				e.rc.HDel(ctx, key, "bad", "bad#s")
			}
		})
	})
}

// TestLeasesAnyOrder throws reserve, advance, release and sweep at random
// ids in random order and repetition; no counter may go negative or leak.
func TestLeasesAnyOrder(t *testing.T) {
	ctx := context.Background()
	forBackends(t, func(t *testing.T, e *env) {
		rng := rand.New(rand.NewPCG(9, 9))
		reps := []string{"a", "b"}
		for i := range 600 {
			id := fmt.Sprint("q", rng.IntN(40))
			switch rng.IntN(5) {
			case 0, 1:
				l := lease(id, reps[rng.IntN(2)], rng.Int64N(50), rng.Int64N(20), e.clk.Now().Add(time.Duration(rng.IntN(30))*time.Second))
				if _, _, err := e.s.Reserve(ctx, l, -1); err != nil {
					t.Fatal(err)
				}
			case 2:
				if _, err := e.s.Advance(ctx, rid(id)); err != nil {
					t.Fatal(err)
				}
			case 3:
				if _, err := e.s.Release(ctx, rid(id)); err != nil {
					t.Fatal(err)
				}
			case 4:
				e.clk.Add(time.Duration(rng.IntN(5)) * time.Second)
				if _, err := e.s.SweepExpired(ctx, mdl); err != nil {
					t.Fatal(err)
				}
			}
			if i%50 == 0 && rng.IntN(4) == 0 {
				if err := e.s.PurgeReplica(ctx, mdl, "b"); err != nil {
					t.Fatal(err)
				}
			}
			loads, err := e.s.Loads(ctx, mdl, reps)
			if err != nil {
				t.Fatal(err)
			}
			for j, l := range loads {
				if l.PrefillBlocks < 0 || l.DecodeBlocks < 0 || l.Requests < 0 {
					t.Fatalf("step %d: %s load negative: %+v", i, reps[j], l)
				}
			}
		}
		for i := range 40 {
			if _, err := e.s.Release(ctx, rid(fmt.Sprint("q", i))); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range reps {
			if l := loadOf(t, e, r); l.PrefillBlocks != 0 || l.DecodeBlocks != 0 || l.Requests != 0 {
				t.Errorf("%s: load after releasing everything = %+v, want zero", r, l)
			}
		}
		if n, err := e.rc.HLen(ctx, "kvr:reqs").Result(); err != nil || n != 0 {
			t.Errorf("request map left with %d entries (%v)", n, err)
		}
		if n, err := e.rc.ZCard(ctx, "kvr:{m:"+mdl+"}:leases").Result(); err != nil || n != 0 {
			t.Errorf("lease set left with %d entries (%v)", n, err)
		}
	})
}

// TestReserveWithin: a booking bounded by load books while every counter
// is within its bound, whatever the version, and refuses with the current
// load once one is past it; a request that holds a lease is reported
// booked and not booked twice.
func TestReserveWithin(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		exp := e.clk.Now().Add(time.Minute)
		if booked, _, err := e.s.Reserve(ctx, lease("w1", "a", 10, 4, exp), -1); err != nil || !booked {
			t.Fatalf("reserve = %v, %v; want booked", booked, err)
		}
		for _, tc := range []struct {
			name   string
			max    kvroute.Load
			booked bool
		}{
			{"prefill past", kvroute.Load{PrefillBlocks: 9, DecodeBlocks: 100, Requests: 100}, false},
			{"decode past", kvroute.Load{PrefillBlocks: 100, DecodeBlocks: 3, Requests: 100}, false},
			{"requests past", kvroute.Load{PrefillBlocks: 100, DecodeBlocks: 100, Requests: 0}, false},
			{"all within", kvroute.Load{PrefillBlocks: 10, DecodeBlocks: 4, Requests: 1}, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				booked, cur, err := e.s.ReserveWithin(ctx, lease("w2", "a", 5, 1, exp), tc.max)
				if err != nil || booked != tc.booked {
					t.Fatalf("reserve within %+v = %v, %v; want %v", tc.max, booked, err, tc.booked)
				}
				want := kvroute.Load{PrefillBlocks: 10, DecodeBlocks: 4, Requests: 1, Version: 1}
				if tc.booked {
					want = kvroute.Load{PrefillBlocks: 15, DecodeBlocks: 5, Requests: 2, Version: 2}
				}
				if cur != want {
					t.Errorf("load = %+v, want %+v", cur, want)
				}
			})
		}
		big := kvroute.Load{PrefillBlocks: 1000, DecodeBlocks: 1000, Requests: 1000}
		// Booked already (true, as Reserve answers a retry), not twice.
		if booked, cur, err := e.s.ReserveWithin(ctx, lease("w2", "a", 5, 1, exp), big); err != nil || !booked || cur.Requests != 2 {
			t.Errorf("the same request again = %v, %+v, %v; want booked once (2 requests)", booked, cur, err)
		}
	})
}
