package router_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/router"
)

// epochRegistry is a registry whose data can be lost: it lists what list
// holds and reports epoch, calling onEpoch (once) first.
// While down is set both fail as an unreachable store does, and calls
// counts every call.
type epochRegistry struct {
	mu      sync.Mutex
	list    []kvroute.Replica
	epoch   string
	onEpoch func()
	down    bool
	calls   int
}

func (e *epochRegistry) ListReplicas(context.Context) ([]kvroute.Replica, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls++
	if e.down {
		return nil, fmt.Errorf("store: list replicas: %w", kvroute.ErrUnavailable)
	}
	return e.list, nil
}

func (e *epochRegistry) Epoch(context.Context) (string, error) {
	e.mu.Lock()
	hook, epoch, down := e.onEpoch, e.epoch, e.down
	e.onEpoch = nil
	e.calls++
	e.mu.Unlock()
	if down {
		return "", fmt.Errorf("store: epoch: %w", kvroute.ErrUnavailable)
	}
	if hook != nil {
		hook()
	}
	return epoch, nil
}

// TestStoreReset: a decision for a model that vanished because the store
// lost its data answers degraded over the pod's last copy, never 404,
// even when the serving process's own epoch check sees the reset first,
// between the decision's registry read and its own check (which then
// finds the epoch current).
func TestStoreReset(t *testing.T) {
	ctx := context.Background()
	reps := fleet(2, true)
	mem := mock.NewMemory(reps...)
	reg := &epochRegistry{list: reps, epoch: "e1"}
	r := newRouter(t, mem.Index(), reg, time.Now)
	if _, err := r.CheckEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 64)}); err != nil {
		t.Fatal(err)
	}
	// The store comes back empty with a new epoch; the periodic check
	// runs just before the decision's own.
	reg.mu.Lock()
	reg.list, reg.epoch = nil, "e2"
	reg.onEpoch = func() {
		if reset, err := r.CheckEpoch(ctx); err != nil || !reset {
			t.Errorf("the periodic check = %v, %v; want the reset seen", reset, err)
		}
	}
	reg.mu.Unlock()
	d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 64)})
	if errors.Is(err, kvroute.ErrNotFound) {
		t.Fatalf("decision after the reset: %v, want a degraded answer over the last copy", err)
	}
	if err != nil || !d.Degraded || d.Reason != router.ReasonStoreReset {
		t.Errorf("decision after the reset = %+v, %v; want degraded with the reset's reason", d, err)
	}
}

// TestResetThenDown: the store lost its data (a pod knows a fleet the
// registry no longer lists), and then stops answering. A decision for the
// vanished model must not ask for the epoch again while the store's
// window is open (each ask would wait out the store), and once the reset
// window is over it must still answer degraded over the last fleet
// known, not 404, since the store never said the model is gone.
func TestResetThenDown(t *testing.T) {
	ctx := context.Background()
	reps := fleet(2, true)
	mem := mock.NewMemory(reps...)
	reg := &epochRegistry{list: reps, epoch: "e1"}
	now := time.Unix(1000, 0)
	r, err := router.New(oneServer{mem.Index()}, reg, router.DefaultConfig(), router.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.CheckEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	mustRoute(t, r, "m", 1)
	reg.mu.Lock()
	reg.list, reg.epoch = nil, "e2" // the store lost its data
	reg.mu.Unlock()
	now = now.Add(time.Second)
	if d := mustRoute(t, r, "m", 1); !d.Degraded || d.Reason != router.ReasonStoreReset {
		t.Fatalf("after the reset: degraded %v (%s), want the reset's reason", d.Degraded, d.Reason)
	}
	reg.mu.Lock()
	reg.down = true
	reg.mu.Unlock()
	now = now.Add(time.Second) // the registry copy is stale: the next decision reads it
	if d := mustRoute(t, r, "m", 1); !d.Degraded {
		t.Fatalf("the store down: Degraded = false, want true")
	}
	reg.mu.Lock()
	calls := reg.calls
	reg.mu.Unlock()
	for range 5 {
		now = now.Add(100 * time.Millisecond)
		if d := mustRoute(t, r, "m", 1); !d.Degraded {
			t.Errorf("inside the window: Degraded = false, want true")
		}
	}
	reg.mu.Lock()
	if got := reg.calls - calls; got != 0 {
		t.Errorf("the store was asked %d times (registry or epoch) inside its window, want 0", got)
	}
	reg.mu.Unlock()
	now = now.Add(router.ResetWindow)
	d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 64)})
	if err != nil || !d.Degraded {
		t.Errorf("after the reset window, the store still down: %+v, %v; want a degraded answer over the last fleet known", d.Degraded, err)
	}
}

// TestResetStaleEmptyRead: after a reset was seen and the registry
// re-seeded (and read back whole), a decision whose registry read still
// finds the model missing (a read that raced the re-seed, or a copy of
// the empty registry cached by it) answers degraded over the last copy
// while the reset's window is open, not 404: seen as 151 decisions
// answered 404 in one of TestStoreResetRecovers's busy runs.
func TestResetStaleEmptyRead(t *testing.T) {
	ctx := context.Background()
	reps := fleet(2, true)
	mem := mock.NewMemory(reps...)
	reg := &epochRegistry{list: reps, epoch: "e1"}
	cfg := router.DefaultConfig()
	cfg.RegistryTTL = 0
	r, err := router.New(mem.Index(), reg, cfg, router.Options{OnStoreReset: func(_ context.Context, known []kvroute.Replica) {
		reg.mu.Lock()
		reg.list = known
		reg.mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.CheckEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	mustRoute(t, r, "m", 1)
	reg.mu.Lock()
	reg.list, reg.epoch = nil, "e2" // the store lost its data
	reg.mu.Unlock()
	if reset, err := r.CheckEpoch(ctx); err != nil || !reset {
		t.Fatalf("CheckEpoch = %v, %v; want the reset seen", reset, err)
	}
	reg.mu.Lock()
	reg.list = nil // the read a decision made before the re-seed
	reg.mu.Unlock()
	d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 64)})
	if err != nil || !d.Degraded || d.Reason != router.ReasonStoreReset {
		t.Errorf("decision over a stale empty read after the re-seed = %+v, %v; want degraded with the reset's reason", d, err)
	}
}
