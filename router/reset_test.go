package router_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/router"
)

// epochRegistry is a registry whose data can be lost: it lists what list
// holds and reports epoch, calling onEpoch (once) first.
type epochRegistry struct {
	mu      sync.Mutex
	list    []kvroute.Replica
	epoch   string
	onEpoch func()
}

func (e *epochRegistry) ListReplicas(context.Context) ([]kvroute.Replica, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.list, nil
}

func (e *epochRegistry) Epoch(context.Context) (string, error) {
	e.mu.Lock()
	hook, epoch := e.onEpoch, e.epoch
	e.onEpoch = nil
	e.mu.Unlock()
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
