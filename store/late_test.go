package store_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/store"
)

// stallScript keeps the server busy for ARGV[1] ms: whatever reaches it
// meanwhile waits in its socket, as on a primary frozen or stalled.
const stallScript = `
local t = redis.call('TIME')
local from = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
repeat
  t = redis.call('TIME')
until tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - from >= tonumber(ARGV[1])
return 1
`

// TestLateBooking: bookings made in time are made; a booking whose caller
// gave up, and which the server runs only afterwards (stalled past the
// deadline plus the one-second limit), is not: no lease, no load.
func TestLateBooking(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		exp := e.clk.Now().Add(time.Minute)
		// Each books on replicas of its own: the first bookings (in time)
		// also load the scripts, as a live pod's have been.
		// Both are sent at once, each within its own timeout.
		book := func(timeout time.Duration, id, ra, rb string) (reserved, best error) {
			var wg sync.WaitGroup
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				_, _, reserved = e.s.Reserve(ctx, lease(id+"-r", ra, 2, 3, exp), -1)
			})
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				_, _, best = e.s.ReserveBest(ctx, lease(id+"-b", "", 0, 3, exp), []kvroute.Choice{{Replica: rb, PrefillBlocks: 2}}, kvCost(2, 3))
			})
			wg.Wait()
			return reserved, best
		}
		t.Run("in time", func(t *testing.T) {
			if r, b := book(5*time.Second, "prompt", "a", "b"); r != nil || b != nil {
				t.Fatalf("bookings = %v, %v; want both made", r, b)
			}
			if got, want := loadOf(t, e, "a"), (kvroute.Load{PrefillBlocks: 2, DecodeBlocks: 3, Requests: 1}); got.PrefillBlocks != want.PrefillBlocks || got.DecodeBlocks != want.DecodeBlocks || got.Requests != want.Requests {
				t.Errorf("load of a = %+v, want %+v", got, want)
			}
		})
		t.Run("stalled past the limit", func(t *testing.T) {
			stalled := make(chan error, 1)
			go func() { stalled <- e.rc.Eval(ctx, stallScript, nil, 1600).Err() }()
			time.Sleep(100 * time.Millisecond) // the stall has begun
			r, b := book(100*time.Millisecond, "late", "c", "d")
			for name, err := range map[string]error{"Reserve": r, "ReserveBest": b} {
				if !errors.Is(err, kvroute.ErrUnavailable) {
					t.Errorf("%s under a stalled server = %v, want ErrUnavailable", name, err)
				}
			}
			if err := <-stalled; err != nil {
				t.Fatalf("stall: %v", err)
			}
			for _, r := range []string{"c", "d"} {
				if got := loadOf(t, e, r); got.PrefillBlocks != 0 || got.DecodeBlocks != 0 || got.Requests != 0 {
					t.Errorf("load of %s after the stall = %+v, want nothing booked", r, got)
				}
			}
			for _, id := range []string{"late-r", "late-b"} {
				if found, err := e.s.Release(ctx, rid(id)); err != nil || found {
					t.Errorf("release %s after the stall = %v, %v; want false (never booked)", id, found, err)
				}
			}
		})
	})
}

// TestLateBookingClockApart: a server whose clock is an hour ahead refuses
// every limited booking as late although its caller waits; the store says
// so once and books without the limit from then on.
func TestLateBookingClockApart(t *testing.T) {
	m := miniredis.RunT(t)
	m.SetTime(time.Now().Add(time.Hour))
	var logs bytes.Buffer
	s, err := store.Open(context.Background(), "redis://"+m.Addr(), store.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	exp := time.Now().Add(time.Minute)
	for i, id := range []string{"one", "two", "three"} {
		booked, _, err := s.Reserve(ctx, lease(id, "a", 1, 1, exp), -1)
		if err != nil || !booked {
			t.Fatalf("booking %d = %v, %v; want booked", i, booked, err)
		}
	}
	if _, _, err := s.ReserveBest(ctx, lease("four", "", 0, 1, exp), []kvroute.Choice{{Replica: "a", PrefillBlocks: 1}}, kvCost(1, 1)); err != nil {
		t.Fatalf("ReserveBest = %v, want booked", err)
	}
	if got := strings.Count(logs.String(), "clock"); got != 1 {
		t.Errorf("the clocks' disagreement was logged %d times, want once:\n%s", got, logs.String())
	}
}
