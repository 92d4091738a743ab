package router_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// clock is a settable time source for the router.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestSuspects(t *testing.T) {
	ctx := context.Background()
	clk := &clock{t: time.Unix(1_000_000, 0)}
	mem := mock.NewMemory(fleet(3, true)...)
	rt := newRouter(t, mem.Index(), mem.Registry(), clk.now)
	route := func(t *testing.T) router.Decision {
		t.Helper()
		d, err := rt.Route(ctx, router.Request{Model: "m", Tokens: tokens(1, 64), Policy: scoring.PolicyRoundRobin})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Release(ctx, d.RequestID); err != nil {
			t.Fatal(err)
		}
		return d
	}
	picks := func(t *testing.T, n int) map[string]int {
		t.Helper()
		got := map[string]int{}
		for range n {
			got[route(t).Replica.ID]++
		}
		return got
	}

	t.Run("a suspect is skipped", func(t *testing.T) {
		rt.MarkSuspect("r1", 10*time.Second)
		if !rt.Suspect("r1") || rt.Suspect("r0") {
			t.Fatalf("Suspect(r1)=%v Suspect(r0)=%v, want true false", rt.Suspect("r1"), rt.Suspect("r0"))
		}
		got := picks(t, 30)
		if got["r1"] != 0 || got["r0"] == 0 || got["r2"] == 0 {
			t.Errorf("picks %v, want r0 and r2 only", got)
		}
	})
	t.Run("explain shows it as not eligible", func(t *testing.T) {
		d := route(t)
		for _, c := range d.Candidates {
			if c.ID == "r1" && c.Eligible {
				t.Errorf("suspect r1 scored eligible: %+v", c)
			}
		}
	})
	t.Run("every routable replica suspect: still routed", func(t *testing.T) {
		rt.MarkSuspect("r0", 10*time.Second)
		rt.MarkSuspect("r2", 10*time.Second)
		if got := picks(t, 9); len(got) != 3 {
			t.Errorf("picks %v, want all three (no replica is better than a suspect)", got)
		}
	})
	t.Run("suspicion lapses", func(t *testing.T) {
		clk.add(11 * time.Second)
		if rt.Suspect("r1") {
			t.Error("r1 still suspect after its deadline")
		}
		rt.MarkSuspect("r1", 10*time.Second)
		clk.add(10 * time.Second)
		if got := picks(t, 9); got["r1"] == 0 {
			t.Errorf("picks %v, want r1 back", got)
		}
	})
	t.Run("a suspect beside unhealthy replicas", func(t *testing.T) {
		putReplica(t, mem, kvroute.Replica{ID: "r0", Model: "m", URL: "http://127.0.0.1:9000", Events: "tcp://x", Health: kvroute.HealthUnhealthy})
		putReplica(t, mem, kvroute.Replica{ID: "r2", Model: "m", URL: "http://127.0.0.1:9002", Events: "tcp://x", Health: kvroute.HealthUnhealthy})
		rt.MarkSuspect("r1", 10*time.Second)
		if got := picks(t, 3); got["r1"] != 3 {
			t.Errorf("picks %v, want the suspect r1: the only routable replica", got)
		}
	})
}
