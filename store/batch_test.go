package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/store"
	"github.com/redis/go-redis/v9"
)

// roundTrips is a go-redis hook that counts what the client sends (not
// counting a new connection's handshake), and can hold every send until
// released.
type roundTrips struct {
	sends, cmds atomic.Int64
	gate        chan struct{} // nil: never hold
}

func handshake(cmds []redis.Cmder) bool {
	switch cmds[0].Name() {
	case "hello", "client", "auth", "select":
		return true
	}
	return false
}

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !handshake([]redis.Cmder{cmd}) {
			h.hold(ctx, 1)
		}
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !handshake(cmds) {
			h.hold(ctx, len(cmds))
		}
		return next(ctx, cmds)
	}
}

func (h *roundTrips) hold(ctx context.Context, n int) {
	h.sends.Add(1)
	h.cmds.Add(int64(n))
	if h.gate != nil {
		select {
		case <-h.gate:
		case <-ctx.Done():
		}
	}
}

// hookedStore is a Store over a client of its own carrying h.
func hookedStore(t *testing.T, url string, h *roundTrips) *store.Store {
	t.Helper()
	o, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(o)
	c.AddHook(h)
	s := store.New(c, store.Options{})
	t.Cleanup(func() { s.Close() })
	return s
}

// TestCoalescing: decisions in flight together share round trips, and each
// still gets its own answer: every booking lands once, every load read is
// a real one, and a flushed script cache is survived.
func TestCoalescing(t *testing.T) {
	for _, b := range []struct {
		name string
		url  func(testing.TB) string
	}{{"miniredis", redistest.Miniredis}, {"redis", redistest.Server}} {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			h := &roundTrips{}
			url := b.url(t)
			s := hookedStore(t, url, h)
			reps := replicaNames(4)
			if _, err := s.Apply(ctx, mdl, reps[0], 1, storeChain(chain(rand.New(rand.NewPCG(1, 1)), 8), 0, 8, kvroute.TierGPU)); err != nil {
				t.Fatal(err)
			}
			const n = 200
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Go(func() {
					if i == n/2 && b.name == "redis" {
						// Half way through, the server forgets every
						// script: queued bookings must load it again.
						o, _ := redis.ParseURL(url)
						rc := redis.NewClient(o)
						defer rc.Close()
						if err := rc.ScriptFlush(ctx).Err(); err != nil {
							errs <- err
						}
					}
					r := reps[i%len(reps)]
					lease := kvroute.Lease{RequestID: rid(fmt.Sprintf("c%d", i)), Model: mdl, Replica: r,
						PrefillBlocks: 1, DecodeBlocks: 2, Expires: time.Now().Add(time.Minute)}
					booked, _, err := s.Reserve(ctx, lease, -1)
					if err != nil || !booked {
						errs <- fmt.Errorf("reserve %d: booked %v, %v", i, booked, err)
						return
					}
					if _, err := s.Loads(ctx, mdl, reps); err != nil {
						errs <- fmt.Errorf("loads %d: %v", i, err)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			loads, err := s.Loads(ctx, mdl, reps)
			if err != nil {
				t.Fatal(err)
			}
			for i, l := range loads {
				want := kvroute.Load{PrefillBlocks: n / 4, DecodeBlocks: n / 2, Requests: n / 4, Version: n / 4}
				l.Waiting, l.Running, l.KVUsage = 0, 0, 0
				if l != want {
					t.Errorf("%s: load = %+v, want %+v", reps[i], l, want)
				}
			}
			if got := h.sends.Load(); got >= 2*n {
				t.Errorf("round trips = %d for %d bookings and %d load reads, want fewer: nothing was coalesced", got, n, n)
			}
			t.Logf("%d commands in %d round trips", h.cmds.Load(), h.sends.Load())
		})
	}
}

// TestCoalescedCallerGivesUp: a caller whose deadline passes while it waits
// for a pipeline gets an unavailable store at its deadline, not when the
// pipelines ahead of it finish, whatever it sent (a read, a booking, a
// release), and its command is never sent. Another model's commands do
// not wait behind the held ones at all: a model's batcher is its own, so a
// hung shard holds up only its models.
func TestCoalescedCallerGivesUp(t *testing.T) {
	ctx := context.Background()
	h := &roundTrips{gate: make(chan struct{})}
	s := hookedStore(t, redistest.Server(t), h)
	reps := replicaNames(2)
	var wg sync.WaitGroup
	// Every pipeline mdl's batcher may have in flight is held in the hook.
	for {
		before := h.sends.Load()
		wg.Go(func() { _, _ = s.Loads(ctx, mdl, reps) })
		deadline := time.Now().Add(200 * time.Millisecond)
		for h.sends.Load() == before && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if h.sends.Load() == before {
			break // queued: the pipelines are all taken
		}
	}
	sent := h.cmds.Load()
	exp := time.Now().Add(time.Minute)
	for name, call := range map[string]func(context.Context) error{
		"loads": func(ctx context.Context) error { _, err := s.Loads(ctx, mdl, reps); return err },
		"reserve": func(ctx context.Context) error {
			_, _, err := s.Reserve(ctx, lease("g1", "a", 1, 1, exp), -1)
			return err
		},
		"reserve best": func(ctx context.Context) error {
			_, _, err := s.ReserveBest(ctx, lease("g2", "", 0, 1, exp), []kvroute.Choice{{Replica: "a", PrefillBlocks: 1}}, kvCost(1, 1))
			return err
		},
		"release": func(ctx context.Context) error { _, err := s.Release(ctx, rid("g3")); return err },
	} {
		t.Run(name, func(t *testing.T) {
			qctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := call(qctx)
			if waited := time.Since(start); waited > time.Second {
				t.Errorf("waited %v, want about the caller's 50ms deadline", waited)
			}
			if !errors.Is(err, kvroute.ErrUnavailable) {
				t.Errorf("err = %v, want one wrapping ErrUnavailable", err)
			}
		})
	}
	t.Run("another model", func(t *testing.T) {
		free := make(chan error, 1)
		go func() {
			other := "other-model"
			_, err := s.Loads(ctx, other, reps)
			free <- err
		}()
		// The hook holds this send too (it holds every send): what matters
		// is that it was sent at once, not queued behind mdl's.
		deadline := time.Now().Add(time.Second)
		for h.cmds.Load() == sent && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if got := h.cmds.Load() - sent; got != 1 {
			t.Errorf("commands sent for another model = %d, want 1 at once", got)
		}
		sent = h.cmds.Load()
		close(h.gate)
		if err := <-free; err != nil {
			t.Errorf("another model's read: %v", err)
		}
	})
	wg.Wait()
	// The held pipelines and the one queued behind them went out; the
	// abandoned calls did not.
	if got := h.cmds.Load(); got > sent+1 {
		t.Errorf("commands sent after the callers gave up = %d, want at most 1 (the queued read)", got-sent)
	}
}
