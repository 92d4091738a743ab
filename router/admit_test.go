package router_test

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/router"
)

func TestRoom(t *testing.T) {
	now := time.Unix(1000, 0)
	input := func() router.Input {
		return router.Input{Model: "m", BlockSize: 16, Now: now, Candidates: []router.Candidate{
			{ID: "a", Routable: true}, {ID: "b", Routable: true}, {ID: "c", Routable: false}}}
	}
	lims := []kvroute.Limits{{MaxRequests: 2}, {MaxRequests: 2, MaxWaiting: 3}, {}}
	for _, tc := range []struct {
		name  string
		cfg   admission.Config
		loads []kvroute.Load
		want  []bool
	}{
		{"room everywhere", admission.Config{}, []kvroute.Load{{}, {}, {}}, []bool{true, true, false}},
		{"a full by its bookings", admission.Config{}, []kvroute.Load{{Requests: 2}, {Requests: 1}, {}}, []bool{false, true, false}},
		{"b full by a fresh scrape", admission.Config{}, []kvroute.Load{{}, {Waiting: 3, ScrapedAt: now}, {}}, []bool{true, false, false}},
		{"b's stale scrape ignored", admission.Config{}, []kvroute.Load{{}, {Waiting: 3, ScrapedAt: now.Add(-time.Minute)}, {}}, []bool{true, true, false}},
		{"b's stale scrape saturated", admission.Config{StaleSaturated: true}, []kvroute.Load{{}, {Waiting: 0, ScrapedAt: now.Add(-time.Minute)}, {}}, []bool{true, false, false}},
		{"fleet at its max", admission.Config{MaxInFlight: 3}, []kvroute.Load{{Requests: 1}, {Requests: 1}, {Requests: 1}}, []bool{false, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := input()
			n := router.Room(tc.cfg, &in, lims, tc.loads)
			want := 0
			for i, w := range tc.want {
				if in.Candidates[i].Routable != w {
					t.Errorf("candidate %s routable = %v, want %v", in.Candidates[i].ID, in.Candidates[i].Routable, w)
				}
				if w {
					want++
				}
			}
			if n != want {
				t.Errorf("Room = %d, want %d", n, want)
			}
		})
	}
}

func TestCost(t *testing.T) {
	cfg := router.DefaultConfig()
	in := router.Input{PromptTokens: 640, BlockSize: 16, MaxTokens: 64, Candidates: []router.Candidate{
		{Overlap: kvroute.Overlap{Any: 10}}, {Overlap: kvroute.Overlap{Any: 30}}}}
	if got, want := router.Cost(cfg, in), int64(640-30*16+64); got != want {
		t.Errorf("cost = %d, want %d (uncached on the best candidate plus output)", got, want)
	}
	in.MaxTokens = 0
	if got, want := router.Cost(cfg, in), int64(640-30*16+cfg.MaxTokens); got != want {
		t.Errorf("cost without max_tokens = %d, want %d", got, want)
	}
}
