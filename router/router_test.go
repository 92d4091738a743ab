package router_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
)

// fakeIndex is an in-memory Index: per replica a set of held keys and a
// load; enough to test the decision flow without a store.
type fakeIndex struct {
	mu       sync.Mutex
	held     map[string]map[kvroute.BlockKey]bool
	approx   map[string]map[kvroute.BlockKey]bool
	loads    map[string]*kvroute.Load
	leases   map[string]kvroute.Lease
	down     bool
	raceOnce map[string]bool // replica -> bump its version once before the next Reserve
}

func newFake() *fakeIndex {
	return &fakeIndex{held: map[string]map[kvroute.BlockKey]bool{}, approx: map[string]map[kvroute.BlockKey]bool{},
		loads: map[string]*kvroute.Load{}, leases: map[string]kvroute.Lease{}, raceOnce: map[string]bool{}}
}

func (f *fakeIndex) load(id string) *kvroute.Load {
	if f.loads[id] == nil {
		f.loads[id] = &kvroute.Load{}
	}
	return f.loads[id]
}

func lead(set map[kvroute.BlockKey]bool, keys []kvroute.BlockKey) int {
	n := 0
	for n < len(keys) && set[keys[n]] {
		n++
	}
	return n
}

func (f *fakeIndex) Lookup(_ context.Context, _ string, keys []kvroute.BlockKey, ids []string) ([]kvroute.Overlap, []kvroute.Load, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, nil, fmt.Errorf("fake: %w", kvroute.ErrUnavailable)
	}
	ov := make([]kvroute.Overlap, len(ids))
	ld := make([]kvroute.Load, len(ids))
	for i, id := range ids {
		n := lead(f.held[id], keys)
		ov[i] = kvroute.Overlap{GPU: n, Any: n, Approx: lead(f.approx[id], keys)}
		ld[i] = *f.load(id)
	}
	return ov, ld, nil
}

func (f *fakeIndex) Reserve(_ context.Context, l kvroute.Lease, ifVersion int64) (bool, kvroute.Load, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.load(l.Replica)
	if f.raceOnce[l.Replica] {
		f.raceOnce[l.Replica] = false
		cur.PrefillBlocks += 1000 // another pod booked it first
		cur.Version++
	}
	if ifVersion >= 0 && ifVersion != cur.Version {
		return false, *cur, nil
	}
	cur.PrefillBlocks += l.PrefillBlocks
	cur.DecodeBlocks += l.DecodeBlocks
	cur.Requests++
	cur.Version++
	f.leases[l.RequestID] = l
	return true, *cur, nil
}

func (f *fakeIndex) RecordApprox(_ context.Context, _, replica string, keys []kvroute.BlockKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.approx[replica] == nil {
		f.approx[replica] = map[kvroute.BlockKey]bool{}
	}
	for _, k := range keys {
		f.approx[replica][k] = true
	}
	return nil
}

func (f *fakeIndex) Advance(context.Context, string) (bool, error) { return true, nil }
func (f *fakeIndex) Release(_ context.Context, id string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leases[id]
	if ok {
		cur := f.load(l.Replica)
		cur.PrefillBlocks -= l.PrefillBlocks
		cur.DecodeBlocks -= l.DecodeBlocks
		cur.Requests--
		delete(f.leases, id)
	}
	return ok, nil
}

type fakeRegistry struct {
	mu    sync.Mutex
	list  []kvroute.Replica
	down  bool
	calls int
}

func (r *fakeRegistry) ListReplicas(context.Context) ([]kvroute.Replica, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.down {
		return nil, fmt.Errorf("fake: %w", kvroute.ErrUnavailable)
	}
	return append([]kvroute.Replica(nil), r.list...), nil
}

func fleet(n int, events bool) *fakeRegistry {
	reg := &fakeRegistry{}
	for i := range n {
		r := kvroute.Replica{ID: fmt.Sprintf("r%d", i), Model: "m", URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i)}
		if events {
			r.Events = "tcp://x"
		}
		reg.list = append(reg.list, r)
	}
	return reg
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
		idx, reg := newFake(), fleet(4, true)
		r := newRouter(t, idx, reg, time.Now)
		tok := tokens(1, 10*16+3)
		keys := kvroute.BlockKeys(r.KeySpace("m", ""), 16, tok, nil)
		idx.held["r2"] = map[kvroute.BlockKey]bool{}
		for _, k := range keys {
			idx.held["r2"][k] = true
		}
		d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tok})
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica.ID != "r2" || d.Matched != 10 || d.PromptBlocks != 10 {
			t.Errorf("got replica %s matched %d/%d, want r2 10/10", d.Replica.ID, d.Matched, d.PromptBlocks)
		}
		if got := idx.loads["r2"].Requests; got != 1 {
			t.Errorf("r2 requests booked = %d, want 1", got)
		}
	})
	t.Run("empty index spreads by load", func(t *testing.T) {
		idx, reg := newFake(), fleet(4, true)
		r := newRouter(t, idx, reg, time.Now)
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
	t.Run("lost booking race re-scores", func(t *testing.T) {
		idx, reg := newFake(), fleet(2, true)
		r := newRouter(t, idx, reg, time.Now)
		idx.load("r1").PrefillBlocks = 5 // r0 is the obvious pick...
		idx.raceOnce["r0"] = true        // ...until another pod books it first
		d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 64)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica.ID != "r1" {
			t.Errorf("picked %s, want r1 after r0 was taken", d.Replica.ID)
		}
	})
	t.Run("approximate entries for replicas without events", func(t *testing.T) {
		idx, reg := newFake(), fleet(4, false)
		r := newRouter(t, idx, reg, time.Now)
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
		idx, reg := newFake(), fleet(3, true)
		reg.list[0].Health, reg.list[1].Health = kvroute.HealthUnhealthy, kvroute.HealthUnhealthy
		r := newRouter(t, idx, reg, time.Now)
		for i := range 5 {
			d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(uint64(i), 32)})
			if err != nil || d.Replica.ID != "r2" {
				t.Fatalf("got %s, %v; want r2", d.Replica.ID, err)
			}
		}
		reg.list[2].Health = kvroute.HealthUnhealthy
		_, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 32)})
		if !errors.Is(err, kvroute.ErrNoReplica) {
			t.Errorf("err = %v, want ErrNoReplica", err)
		}
	})
	t.Run("errors", func(t *testing.T) {
		r := newRouter(t, newFake(), fleet(1, true), time.Now)
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
		idx, reg := newFake(), fleet(3, true)
		reg.list[1].Health = kvroute.HealthUnhealthy
		r := newRouter(t, idx, reg, time.Now)
		if _, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 32)}); err != nil {
			t.Fatal(err)
		}
		idx.down, reg.down = true, true
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
	idx, reg := newFake(), fleet(2, true)
	r := newRouter(t, idx, reg, clock)
	if _, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 32)}); err != nil {
		t.Fatal(err)
	}
	idx.down, reg.down = true, true
	d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 32)})
	if err != nil || !d.Degraded {
		t.Fatalf("first decision in the outage: degraded=%v err=%v", d.Degraded, err)
	}
	calls := reg.calls
	for range 5 {
		now = now.Add(100 * time.Millisecond)
		if d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 32)}); err != nil || !d.Degraded {
			t.Fatalf("decision in the backoff window: degraded=%v err=%v", d.Degraded, err)
		}
	}
	if got := reg.calls - calls; got != 0 {
		t.Errorf("store tried %d times within the backoff window, want 0", got)
	}
	idx.down, reg.down = false, false
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
			r, err := router.New(newFake(), &fakeRegistry{}, cfg, router.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := r.BlockSize("m", tt.fleet); got != tt.want {
				t.Errorf("BlockSize = %d, want %d", got, tt.want)
			}
		})
	}
	t.Run("decision keyed with the reported size", func(t *testing.T) {
		reg := fleet(2, true)
		for i := range reg.list {
			reg.list[i].BlockSize = 32
		}
		r := newRouter(t, newFake(), reg, time.Now)
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
