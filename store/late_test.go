package store_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/wait"
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

// waitStalled waits until the server runs stallScript: a PING it does not
// answer within 300 ms (an idle server answers in a millisecond; one
// answered means the script has not reached the server yet).
func waitStalled(t *testing.T, e *env) {
	t.Helper()
	o, err := redis.ParseURL(e.url)
	if err != nil {
		t.Fatal(err)
	}
	o.ReadTimeout, o.MaxRetries = 300*time.Millisecond, -1
	probe := redis.NewClient(o)
	defer probe.Close()
	wait.Until(t, "the server stalled by the script", func() bool {
		var ne net.Error
		return errors.As(probe.Ping(context.Background()).Err(), &ne) && ne.Timeout()
	})
}

// TestLateBooking: bookings made in time are made; a booking whose caller
// gave up, and which the server runs only afterwards (stalled 3 s, past
// the deadline plus the one-second limit), is not: no lease, no load.
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
			go func() { stalled <- e.rc.Eval(ctx, stallScript, nil, 3000).Err() }()
			// Once the stall has begun it outlasts the bookings'
			// deadline plus the limit by over a second.
			waitStalled(t, e)
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
// a limited booking as late although its caller waits; the store says so,
// books it again without the limit, sends none for a minute (no booking
// refused), and then tries the limit again.
func TestLateBookingClockApart(t *testing.T) {
	exp := time.Now().Add(time.Hour)
	for _, first := range []string{"Reserve", "ReserveBest"} {
		t.Run("first by "+first, func(t *testing.T) {
			m := miniredis.RunT(t)
			m.SetTime(time.Now().Add(time.Hour))
			var logs bytes.Buffer
			clk := &clock{t: time.Now()}
			s, err := store.Open(context.Background(), "redis://"+m.Addr(), store.Options{Now: clk.Now, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			n := 0
			// book books through via under ctx and returns how many commands
			// miniredis ran for it (those a script calls included).
			book := func(ctx context.Context, via string) int {
				t.Helper()
				n++
				id := first + strconv.Itoa(n)
				before := m.CommandCount()
				if via == "Reserve" {
					if booked, _, err := s.Reserve(ctx, lease(id, "a", 1, 1, exp), -1); err != nil || !booked {
						t.Fatalf("Reserve %s = %v, %v; want booked", id, booked, err)
					}
				} else if j, _, err := s.ReserveBest(ctx, lease(id, "", 0, 1, exp), []kvroute.Choice{{Replica: "a", PrefillBlocks: 1}}, kvCost(1, 1)); err != nil || j != 0 {
					t.Fatalf("ReserveBest %s = %d, %v; want the first choice booked", id, j, err)
				}
				return m.CommandCount() - before
			}
			other := map[string]string{"Reserve": "ReserveBest", "ReserveBest": "Reserve"}[first]
			// Without a deadline a booking carries no limit: how many
			// commands a booking made at once takes (both scripts loaded).
			made := map[string]int{}
			for _, via := range []string{first, other, first, other} {
				made[via] = book(context.Background(), via)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// A refused booking is its EVALSHA and one TIME more.
			if got, want := book(ctx, first), made[first]+2; got != want {
				t.Errorf("the first limited %s took %d commands, want %d (refused, then made without the limit)", first, got, want)
			}
			if got := strings.Count(logs.String(), "clock"); got != 1 {
				t.Fatalf("the clocks' disagreement was logged %d times, want once:\n%s", got, logs.String())
			}
			for _, via := range []string{first, other, first} {
				if got, want := book(ctx, via), made[via]; got != want {
					t.Errorf("%s within the minute took %d commands, want %d (no limit, no refusal)", via, got, want)
				}
			}
			clk.Add(2 * time.Minute)
			if got, want := book(ctx, first), made[first]+2; got != want {
				t.Errorf("%s after the minute took %d commands, want %d (refused with the limit, then made without)", first, got, want)
			}
			if got := strings.Count(logs.String(), "clock"); got != 2 {
				t.Errorf("the clocks' disagreement was logged %d times in all, want twice:\n%s", got, logs.String())
			}
		})
	}
}
