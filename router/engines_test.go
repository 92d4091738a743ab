package router_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/router"
)

// dpFleet is one plain replica r0 and a 4-engine data-parallel replica dp.
func dpFleet(pinIgnored bool) []kvroute.Replica {
	list := fleet(1, true)
	return append(list, kvroute.Replica{ID: "dp", Model: "m", URL: "http://127.0.0.1:9100",
		Events: "tcp://127.0.0.1:5557", DataParallelSize: 4, PinIgnored: pinIgnored})
}

func TestRouteDataParallel(t *testing.T) {
	ctx := context.Background()
	t.Run("an engine's cache pins its rank", func(t *testing.T) {
		mem := mock.NewMemory(dpFleet(false)...)
		r := newRouter(t, mem.Index(), mem.Registry(), time.Now)
		tok := tokens(3, 10*16+3)
		mem.Hold("dp/2", kvroute.BlockKeys(r.KeySpace("m", ""), 16, tok, nil))
		d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tok})
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica.ID != "dp" || !d.Pinned || d.DataParallelRank != 2 || d.Matched != 10 {
			t.Errorf("got %s pinned %v rank %d matched %d, want dp pinned to rank 2 with 10", d.Replica.ID, d.Pinned, d.DataParallelRank, d.Matched)
		}
		if d.Replica.Events != "tcp://127.0.0.1:5557" || d.Replica.DataParallelSize != 4 {
			t.Errorf("decision names %+v, want the registered replica", d.Replica)
		}
		if len(d.Candidates) != 5 {
			t.Errorf("got %d candidates, want r0 and dp's 4 engines", len(d.Candidates))
		}
		if got := mem.Load("dp/2").Requests; got != 1 {
			t.Errorf("dp/2 requests booked = %d, want 1: loads are per engine", got)
		}
	})
	t.Run("ignored pins merge the engines", func(t *testing.T) {
		mem := mock.NewMemory(dpFleet(true)...)
		r := newRouter(t, mem.Index(), mem.Registry(), time.Now)
		tok := tokens(4, 10*16+3)
		keys := kvroute.BlockKeys(r.KeySpace("m", ""), 16, tok, nil)
		mem.Hold("dp/3", keys)
		mem.Hold("dp/1", keys[:4])
		d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tok})
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica.ID != "dp" || d.Pinned || d.Matched != 10 || len(d.Candidates) != 2 {
			t.Errorf("got %s pinned %v matched %d over %d candidates, want dp unpinned, its best engine's 10, 2 candidates",
				d.Replica.ID, d.Pinned, d.Matched, len(d.Candidates))
		}
		if got := mem.Load("dp").Requests; got != 1 {
			t.Errorf("dp requests booked = %d, want 1", got)
		}
	})
	t.Run("merged loads are summed", func(t *testing.T) {
		mem := mock.NewMemory(dpFleet(true)...)
		for _, e := range []string{"dp/0", "dp/1", "dp/2", "dp/3"} {
			mem.SetLoad(e, kvroute.Load{PrefillBlocks: 2, Requests: 1})
		}
		mem.SetLoad("r0", kvroute.Load{PrefillBlocks: 5, Requests: 1})
		r := newRouter(t, mem.Index(), mem.Registry(), time.Now)
		d, err := r.Route(ctx, router.Request{Model: "m", Tokens: tokens(5, 64)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica.ID != "r0" {
			t.Errorf("routed to %s, want r0: dp owes 8 blocks over its engines, r0 5", d.Replica.ID)
		}
	})
}
