package router_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/router"
)

// TestQueuedCountsRetries: a queued report counts as queued until its
// retry has reached the store, not only until the retry takes it, so that
// a caller waiting for the queue to drain finds the report delivered.
func TestQueuedCountsRetries(t *testing.T) {
	mem := mock.NewMemory(fleet(1, true)...)
	idx := mem.Index()
	down := true
	entered, unblock := make(chan struct{}, 1), make(chan struct{})
	release := idx.ReleaseFn
	idx.ReleaseFn = func(ctx context.Context, id string) (bool, error) {
		if down {
			return false, kvroute.ErrUnavailable
		}
		entered <- struct{}{}
		<-unblock
		return release(ctx, id)
	}
	cfg := router.DefaultConfig()
	cfg.StoreBackoff = 10 * time.Millisecond
	rt, err := router.New(idx, mem.Registry(), cfg, router.Options{Rand: rand.New(rand.NewPCG(1, 1))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Release(context.Background(), "q.bQ"); !errors.Is(err, router.ErrQueued) {
		t.Fatalf("release with the store down = %v, want ErrQueued", err)
	}
	down = false
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = rt.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	<-entered // the retry is under way, the store not yet answered
	if got := rt.Queued(); got != 1 {
		t.Errorf("queued while the retry is in flight = %d, want 1", got)
	}
	close(unblock)
	wait.Until(t, "the queue empty after the retry was let through", func() bool { return rt.Queued() == 0 })
}
