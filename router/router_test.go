package router_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/router"
)

// fleet is n replicas of model "m", r0 to r(n-1). With events they publish
// KV-cache events; without, decisions remember what they sent each one as
// approximate entries, which the tests of that path rely on.
func fleet(n int, events bool) []kvroute.Replica {
	var list []kvroute.Replica
	for i := range n {
		r := kvroute.Replica{ID: fmt.Sprintf("r%d", i), Model: "m", URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i)}
		if events {
			r.Events = "tcp://x"
		}
		list = append(list, r)
	}
	return list
}

// putReplica replaces a replica registered in mem, as an admin's PUT
// would.
func putReplica(tb testing.TB, mem *mock.Memory, r kvroute.Replica) {
	tb.Helper()
	if err := mem.Registry().PutReplica(context.Background(), r); err != nil {
		tb.Fatal(err)
	}
}

func newRouter(t *testing.T, idx router.Index, reg router.Registry, now func() time.Time) *router.Router {
	t.Helper()
	cfg := router.DefaultConfig()
	cfg.RegistryTTL = 0
	r, err := router.New(idx, reg, cfg, router.Options{Rand: rand.New(rand.NewPCG(1, 1)), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func tokens(seed uint64, n int) []uint32 {
	r := rand.New(rand.NewPCG(seed, 0))
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(r.IntN(50000))
	}
	return t
}

func TestRoute(t *testing.T) {
	ctx := context.Background()
	t.Run("routes to the prefix holder", func(t *testing.T) {
		mem := mock.NewMemory(fleet(4, true)...)
		r := newRouter(t, mem.Index(), mem.Registry(), time.Now)
		tok := tokens(1, 10*16+3)
		mem.Hold("r2", kvroute.BlockKeys(r.KeySpace("m", ""), 16, tok, nil))
		d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tok})
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica.ID != "r2" || d.Matched != 10 || d.PromptBlocks != 10 {
			t.Errorf("got replica %s matched %d/%d, want r2 10/10", d.Replica.ID, d.Matched, d.PromptBlocks)
		}
		if got := mem.Load("r2").Requests; got != 1 {
			t.Errorf("r2 requests booked = %d, want 1", got)
		}
	})
	t.Run("empty index spreads by load", func(t *testing.T) {
		mem := mock.NewMemory(fleet(4, true)...)
		r := newRouter(t, mem.Index(), mem.Registry(), time.Now)
		seen := map[string]int{}
		for i := range 8 {
			d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(uint64(i), 64)})
			if err != nil {
				t.Fatal(err)
			}
			seen[d.Replica.ID]++
		}
		for id, n := range seen {
			if n != 2 {
				t.Errorf("replica %s got %d of 8, want 2 each (%v)", id, n, seen)
			}
		}
	})
	t.Run("a contested booking is settled in the store", func(t *testing.T) {
		// r0 is the obvious pick until another pod books it heavily
		// between this decision's read and its booking: the store books
		// the cheapest by the loads it finds, r1, in the same call.
		mem := mock.NewMemory(fleet(2, true)...)
		mem.SetLoad("r1", kvroute.Load{PrefillBlocks: 5})
		idx := mem.Index()
		best, calls := idx.ReserveBestFn, 0
		idx.ReserveBestFn = func(ctx context.Context, l kvroute.Lease, choices []kvroute.Choice, cost kvroute.ChoiceCost) (int, []kvroute.Load, error) {
			if calls++; calls == 1 {
				cur := mem.Load("r0")
				cur.PrefillBlocks += 1000
				cur.Version++
				mem.SetLoad("r0", cur)
			}
			return best(ctx, l, choices, cost)
		}
		idx.ReserveFn = func(context.Context, kvroute.Lease, int64) (bool, kvroute.Load, error) {
			t.Error("booked on a version: the store should have settled it")
			return false, kvroute.Load{}, nil
		}
		r := newRouter(t, idx, mem.Registry(), time.Now)
		d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 64)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica.ID != "r1" || calls != 1 {
			t.Errorf("picked %s in %d bookings, want r1 in one", d.Replica.ID, calls)
		}
		if got := mem.Load("r1"); got.Requests != 1 || got.PrefillBlocks != 5+4 {
			t.Errorf("r1 load = %+v, want this request's 4 prefill blocks and 1 request booked on it", got)
		}
	})
	t.Run("a decision past its booking budget is still settled in the store", func(t *testing.T) {
		// The lookup and scoring took longer than the booking budget (a
		// busy machine): the booking goes through at once, but on the
		// loads as the store finds them, so r0, booked heavily since the
		// read, is not booked on the strength of a stale view.
		mem := mock.NewMemory(fleet(2, true)...)
		mem.SetLoad("r1", kvroute.Load{PrefillBlocks: 5})
		var clock time.Time
		now := func() time.Time { clock = clock.Add(time.Second); return clock }
		idx := mem.Index()
		best, calls := idx.ReserveBestFn, 0
		idx.ReserveBestFn = func(ctx context.Context, l kvroute.Lease, choices []kvroute.Choice, cost kvroute.ChoiceCost) (int, []kvroute.Load, error) {
			calls++
			cur := mem.Load("r0")
			cur.PrefillBlocks += 1000
			cur.Version++
			mem.SetLoad("r0", cur)
			return best(ctx, l, choices, cost)
		}
		idx.ReserveFn = func(context.Context, kvroute.Lease, int64) (bool, kvroute.Load, error) {
			t.Error("booked regardless of the loads: the store should have settled it")
			return true, kvroute.Load{}, nil
		}
		r := newRouter(t, idx, mem.Registry(), now)
		d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 64)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica.ID != "r1" || calls != 1 {
			t.Errorf("picked %s in %d bookings, want r1 in one", d.Replica.ID, calls)
		}
	})
	t.Run("lost booking race re-scores", func(t *testing.T) {
		mem := mock.NewMemory(fleet(2, true)...)
		mem.SetLoad("r1", kvroute.Load{PrefillBlocks: 5}) // r0 is the obvious pick...
		idx := mem.Index()
		reserve, raced := idx.ReserveFn, false
		idx.ReserveFn = func(ctx context.Context, l kvroute.Lease, ifVersion int64) (bool, kvroute.Load, error) {
			if l.Replica == "r0" && !raced { // ...until another pod books it first
				raced = true
				cur := mem.Load("r0")
				cur.PrefillBlocks += 1000
				cur.Version++
				mem.SetLoad("r0", cur)
			}
			return reserve(ctx, l, ifVersion)
		}
		r := newRouter(t, idx, mem.Registry(), time.Now)
		// least-load: a policy the store does not settle.
		d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 64), Policy: "least-load"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica.ID != "r1" {
			t.Errorf("picked %s, want r1 after r0 was taken", d.Replica.ID)
		}
	})
	t.Run("booking within its slack loses no race", func(t *testing.T) {
		// r0 wins by far: another pod's booking on it between the read
		// and the booking leaves it the pick, so the first booking is
		// bounded by that margin and goes through, costing no retry.
		mem := mock.NewMemory(fleet(2, true)...)
		mem.SetLoad("r1", kvroute.Load{PrefillBlocks: 1000})
		idx := mem.Index()
		within, versioned, other := idx.ReserveWithinFn, 0, false
		idx.ReserveWithinFn = func(ctx context.Context, l kvroute.Lease, max kvroute.Load) (bool, kvroute.Load, error) {
			if !other {
				other = true
				cur := mem.Load("r0")
				cur.PrefillBlocks += l.PrefillBlocks
				cur.Requests++
				cur.Version++
				mem.SetLoad("r0", cur)
			}
			return within(ctx, l, max)
		}
		reserve := idx.ReserveFn
		idx.ReserveFn = func(ctx context.Context, l kvroute.Lease, ifVersion int64) (bool, kvroute.Load, error) {
			versioned++
			return reserve(ctx, l, ifVersion)
		}
		r := newRouter(t, idx, mem.Registry(), time.Now)
		d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 64), Policy: "least-load"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica.ID != "r0" || !other || versioned != 0 {
			t.Errorf("picked %s with %d versioned bookings (bounded tried: %v), want r0 booked within its bound at once", d.Replica.ID, versioned, other)
		}
		if got := mem.Load("r0").Requests; got != 2 {
			t.Errorf("r0 requests = %d, want 2 (the other pod's and this one)", got)
		}
	})
	t.Run("approximate entries for replicas without events", func(t *testing.T) {
		mem := mock.NewMemory(fleet(4, false)...)
		r := newRouter(t, mem.Index(), mem.Registry(), time.Now)
		tok := tokens(9, 20*16)
		first, err := r.Route(ctx, router.Request{Model: "m", Tokens: tok})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Release(ctx, first.RequestID); err != nil {
			t.Fatal(err)
		}
		again, err := r.Route(ctx, router.Request{Model: "m", Tokens: tok})
		if err != nil {
			t.Fatal(err)
		}
		if again.Replica.ID != first.Replica.ID || !again.Approximate || again.Matched != 20 {
			t.Errorf("repeat went to %s (approx %v, matched %d), want %s approx 20", again.Replica.ID, again.Approximate, again.Matched, first.Replica.ID)
		}
	})
	t.Run("unhealthy never picked", func(t *testing.T) {
		list := fleet(3, true)
		list[0].Health, list[1].Health = kvroute.HealthUnhealthy, kvroute.HealthUnhealthy
		mem := mock.NewMemory(list...)
		r := newRouter(t, mem.Index(), mem.Registry(), time.Now)
		for i := range 5 {
			d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(uint64(i), 32)})
			if err != nil || d.Replica.ID != "r2" {
				t.Fatalf("got %s, %v; want r2", d.Replica.ID, err)
			}
		}
		list[2].Health = kvroute.HealthUnhealthy
		putReplica(t, mem, list[2])
		_, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 32)})
		if !errors.Is(err, kvroute.ErrNoReplica) {
			t.Errorf("err = %v, want ErrNoReplica", err)
		}
	})
	t.Run("errors", func(t *testing.T) {
		mem := mock.NewMemory(fleet(1, true)...)
		r := newRouter(t, mem.Index(), mem.Registry(), time.Now)
		for _, tt := range []struct {
			name string
			req  router.Request
			want error
		}{
			{"unknown model", router.Request{Model: "nope"}, kvroute.ErrNotFound},
			{"no model", router.Request{}, kvroute.ErrInvalidInput},
			{"bad policy", router.Request{Model: "m", Policy: "best"}, kvroute.ErrInvalidInput},
		} {
			t.Run(tt.name, func(t *testing.T) {
				if _, err := r.Route(ctx, tt.req); !errors.Is(err, tt.want) {
					t.Errorf("err = %v, want %v", err, tt.want)
				}
			})
		}
	})
	t.Run("store down degrades to round robin", func(t *testing.T) {
		list := fleet(3, true)
		list[1].Health = kvroute.HealthUnhealthy
		mem := mock.NewMemory(list...)
		r := newRouter(t, mem.Index(), mem.Registry(), time.Now)
		if _, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 32)}); err != nil {
			t.Fatal(err)
		}
		mem.SetDown(true)
		got := map[string]int{}
		for i := range 4 {
			d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(uint64(i), 32)})
			if err != nil {
				t.Fatalf("degraded route: %v", err)
			}
			if !d.Degraded {
				t.Errorf("Degraded = false, want true")
			}
			got[d.Replica.ID]++
		}
		if got["r0"] != 2 || got["r2"] != 2 {
			t.Errorf("degraded placement %v, want r0 and r2 twice each", got)
		}
	})
}

// TestStoreBackoff: after the store fails, decisions skip it for
// StoreBackoff (degraded at once, no connection attempt), then try again.
func TestStoreBackoff(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	mem := mock.NewMemory(fleet(2, true)...)
	reg := mem.Registry()
	list, lists := reg.ListReplicasFn, 0
	reg.ListReplicasFn = func(ctx context.Context) ([]kvroute.Replica, error) {
		lists++ // every time a decision goes to the store for the fleet
		return list(ctx)
	}
	r := newRouter(t, mem.Index(), reg, clock)
	if _, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 32)}); err != nil {
		t.Fatal(err)
	}
	mem.SetDown(true)
	d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 32)})
	if err != nil || !d.Degraded {
		t.Fatalf("first decision in the outage: degraded=%v err=%v", d.Degraded, err)
	}
	calls := lists
	for range 5 {
		now = now.Add(100 * time.Millisecond)
		if d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 32)}); err != nil || !d.Degraded {
			t.Fatalf("decision in the backoff window: degraded=%v err=%v", d.Degraded, err)
		}
	}
	if got := lists - calls; got != 0 {
		t.Errorf("store tried %d times within the backoff window, want 0", got)
	}
	mem.SetDown(false)
	now = now.Add(time.Second)
	if d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 32)}); err != nil || d.Degraded {
		t.Errorf("after the backoff: degraded=%v err=%v, want a normal decision", d.Degraded, err)
	}
}

// TestBlockSize checks which block size a request is keyed with: the index
// holds keys of the size in the replicas' events, so the size they report
// wins over the configured default unless the model's size is pinned.
func TestBlockSize(t *testing.T) {
	rep := func(bs int) kvroute.Replica {
		return kvroute.Replica{ID: "r", Model: "m", URL: "http://x", BlockSize: bs}
	}
	tests := []struct {
		name   string
		pinned map[string]int
		fleet  []kvroute.Replica
		want   int
	}{
		{"nothing reported", nil, []kvroute.Replica{rep(0), rep(0)}, 16},
		{"reported", nil, []kvroute.Replica{rep(32), rep(32)}, 32},
		{"some reported", nil, []kvroute.Replica{rep(0), rep(64)}, 64},
		{"replicas disagree", nil, []kvroute.Replica{rep(32), rep(64)}, 16},
		{"pinned beats reported", map[string]int{"m": 8}, []kvroute.Replica{rep(32)}, 8},
		{"pinned for another model", map[string]int{"other": 8}, []kvroute.Replica{rep(32)}, 32},
		{"empty fleet", nil, nil, 16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := router.DefaultConfig()
			cfg.BlockSizes = tt.pinned
			// BlockSize asks the store nothing: these mocks panic if it does.
			r, err := router.New(&mock.Index{}, &mock.Registry{}, cfg, router.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := r.BlockSize("m", tt.fleet); got != tt.want {
				t.Errorf("BlockSize = %d, want %d", got, tt.want)
			}
		})
	}
	t.Run("decision keyed with the reported size", func(t *testing.T) {
		list := fleet(2, true)
		for i := range list {
			list[i].BlockSize = 32
		}
		mem := mock.NewMemory(list...)
		r := newRouter(t, mem.Index(), mem.Registry(), time.Now)
		d, err := r.Route(context.Background(), router.Request{Model: "m", Tokens: tokens(1, 100)})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := d.BlockSize, 32; got != want {
			t.Errorf("decision block size = %d, want %d", got, want)
		}
		if got, want := d.PromptBlocks, 100/32; got != want {
			t.Errorf("prompt blocks = %d, want %d", got, want)
		}
	})
}
