package router_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/router"
)

// TestBackoffScopes: a store failure opens a back-off window only over
// what lives where the failure was. Under Redis Cluster a model's keys
// live on one shard and the registry on another, so a model whose calls
// fail must not degrade the others, and a registry that cannot be read
// must not stop decisions that can still read their model's index.
func TestBackoffScopes(t *testing.T) {
	twoModels := func() []kvroute.Replica {
		var list []kvroute.Replica
		for _, m := range []string{"a", "b"} {
			for i := range 2 {
				list = append(list, kvroute.Replica{ID: fmt.Sprintf("%s%d", m, i), Model: m, URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i), Events: "tcp://x"})
			}
		}
		return list
	}
	unavailable := fmt.Errorf("store: lookup: %w", kvroute.ErrUnavailable)

	t.Run("a failing model degrades alone", func(t *testing.T) {
		now := time.Unix(1000, 0)
		mem := mock.NewMemory(twoModels()...)
		idx := mem.Index()
		lookup, aDown, aLookups := idx.LookupFn, true, 0
		idx.LookupFn = func(ctx context.Context, model string, keys []kvroute.BlockKey, replicas []string) ([]kvroute.Overlap, []kvroute.Load, error) {
			if model == "a" {
				aLookups++
				if aDown {
					return nil, nil, unavailable
				}
			}
			return lookup(ctx, model, keys, replicas)
		}
		r := newRouter(t, idx, mem.Registry(), func() time.Time { return now })
		route := func(model string) router.Decision { t.Helper(); return mustRoute(t, r, model, 1) }
		if d := route("a"); !d.Degraded {
			t.Errorf("a, its store failing: Degraded = false, want true")
		}
		if d := route("b"); d.Degraded {
			t.Errorf("b, its store up: Degraded = true (%s), want a cache-aware decision", d.Reason)
		}
		if r.StoreUp() {
			t.Errorf("StoreUp() = true with a's window open, want false")
		}
		tried := aLookups
		now = now.Add(router.DefaultConfig().StoreBackoff / 2)
		if d := route("a"); !d.Degraded {
			t.Errorf("a inside its window: Degraded = false, want true")
		}
		if got := aLookups - tried; got != 0 {
			t.Errorf("a's store tried %d times inside its window, want 0", got)
		}
		if d := route("b"); d.Degraded {
			t.Errorf("b while a's window is open: Degraded = true (%s), want false", d.Reason)
		}
		aDown = false
		now = now.Add(router.DefaultConfig().StoreBackoff)
		if d := route("a"); d.Degraded {
			t.Errorf("a after its window: Degraded = true (%s), want false", d.Reason)
		}
		if !r.StoreUp() {
			t.Errorf("StoreUp() = false after every window closed, want true")
		}
	})

	t.Run("registry down, index up", func(t *testing.T) {
		now := time.Unix(1000, 0)
		mem := mock.NewMemory(twoModels()...)
		reg := mem.Registry()
		list, regDown, lists := reg.ListReplicasFn, false, 0
		reg.ListReplicasFn = func(ctx context.Context) ([]kvroute.Replica, error) {
			lists++
			if regDown {
				return nil, fmt.Errorf("store: list replicas: %w", kvroute.ErrUnavailable)
			}
			return list(ctx)
		}
		r := newRouter(t, mem.Index(), reg, func() time.Time { return now })
		route := func(model string) router.Decision { t.Helper(); return mustRoute(t, r, model, 2) }
		if d := route("a"); d.Degraded {
			t.Fatalf("before the fault: Degraded = true (%s)", d.Reason)
		}
		regDown = true
		// The decision that meets the failure does not try the index too:
		// with one Redis it would fail the same way, after a second wait.
		// Its model waits out the window; another model's decisions use
		// the last copy of the registry and their own shard.
		if d := route("a"); !d.Degraded {
			t.Errorf("the decision whose registry read failed: Degraded = false, want true")
		}
		read := lists
		for range 3 {
			now = now.Add(100 * time.Millisecond)
			if d := route("b"); d.Degraded {
				t.Errorf("b inside the registry's window: Degraded = true (%s), want a decision over the last copy", d.Reason)
			}
			if d := route("a"); !d.Degraded {
				t.Errorf("a inside the window its failed read opened: Degraded = false, want true")
			}
		}
		if got := lists - read; got != 0 {
			t.Errorf("registry read %d times inside its window, want 0", got)
		}
		regDown = false
		now = now.Add(router.DefaultConfig().StoreBackoff)
		if d := route("a"); d.Degraded {
			t.Errorf("a after the window: Degraded = true (%s), want false", d.Reason)
		}
		if lists == read {
			t.Errorf("registry not read again after its window")
		}
	})
}

// mustRoute decides for model (a 64-token prompt from seed) and fails the
// test on an error.
func mustRoute(t *testing.T, r *router.Router, model string, seed uint64) router.Decision {
	t.Helper()
	d, err := r.Route(context.Background(), router.Request{Model: model, Tokens: tokens(seed, 64)})
	if err != nil {
		t.Fatalf("route %s: %v", model, err)
	}
	return d
}
