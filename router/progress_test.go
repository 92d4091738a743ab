package router_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
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

// TestQueuedRetriedWhenWindowCloses: a queued report is retried as soon
// as its back-off window has closed, not on a tick of its own. Until it
// lands, the released booking still loads its replica for every pod's
// decisions; a tick out of phase with the window let decisions weigh it
// for up to a StoreBackoff after the store was back. StoreBackoff is half
// an hour here (inside the longest lease, past which a report is
// dropped), so that only a retry that follows the window can land.
func TestQueuedRetriedWhenWindowCloses(t *testing.T) {
	mem := mock.NewMemory(fleet(1, true)...)
	idx := mem.Index()
	var mu sync.Mutex
	now, down := time.Unix(1_000_000, 0), true
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	delivered := make(chan string, 1)
	idx.ReleaseFn = func(ctx context.Context, id string) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return false, kvroute.ErrUnavailable
		}
		delivered <- id
		return true, nil
	}
	cfg := router.DefaultConfig()
	cfg.StoreBackoff = 30 * time.Minute
	rt, err := router.New(idx, mem.Registry(), cfg, router.Options{Rand: rand.New(rand.NewPCG(1, 1)), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Release(context.Background(), "q.bQ"); !errors.Is(err, router.ErrQueued) {
		t.Fatalf("release with the store down = %v, want ErrQueued", err)
	}
	// The store is back and the window has closed by the time the retry
	// loop looks.
	mu.Lock()
	now, down = now.Add(cfg.StoreBackoff+time.Second), false
	mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = rt.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	wait.Until(t, "the queue empty after the retry", func() bool { return rt.Queued() == 0 })
	select {
	case got := <-delivered:
		if got != "q.bQ" {
			t.Errorf("delivered %q, want q.bQ", got)
		}
	default:
		t.Error("the queue emptied without delivering the release")
	}
}
