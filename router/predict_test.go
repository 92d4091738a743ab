package router_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// TestDecidePredicts: a booking predicts the prompt's chain on a replica
// that publishes events, never on one that does not or with predictions
// off, and says when a prediction changed the pick.
func TestDecidePredicts(t *testing.T) {
	keys := make([]kvroute.BlockKey, 40)
	for i := range keys {
		keys[i] = kvroute.BlockKey(i + 1)
	}
	in := func(events bool, predicted int) router.Input {
		return router.Input{
			RequestID: "q", Model: "m", Keys: keys, Blocks: len(keys), PromptTokens: 640, BlockSize: 16, MaxTokens: 16,
			Now: time.Unix(1000, 0),
			Candidates: []router.Candidate{
				{ID: "busy", Routable: true, Events: events, Overlap: kvroute.Overlap{Predicted: predicted, Wait: float64(predicted)},
					Load: scoring.Load{Prefill: float64(predicted), Decode: 1, Requests: 1}},
				{ID: "idle", Routable: true, Events: events},
			},
		}
	}
	cfg := router.DefaultConfig()
	rng := rand.New(rand.NewPCG(1, 1))
	t.Run("a cold prompt on a replica with events", func(t *testing.T) {
		out, err := router.Decide(cfg, in(true, 0), rng)
		if err != nil {
			t.Fatal(err)
		}
		p := out.Lease.Predict
		if p == nil || len(p.Marks) == 0 || p.Marks[len(p.Marks)-1] != (kvroute.Mark{Depth: 40, Key: keys[39]}) {
			t.Fatalf("plan %+v, want the chain's marks ending at 40", p)
		}
		if want := 8 * time.Millisecond; p.PerBlock != want || p.Grace != router.DefaultPredictGrace {
			t.Errorf("plan timing %v a block, grace %v, want %v (16 tokens at 2,000/s) and %v", p.PerBlock, p.Grace, want, router.DefaultPredictGrace)
		}
		if out.Predicted || out.PredictionChanged {
			t.Errorf("predicted %v changed %v, want neither: no candidate had a prediction", out.Predicted, out.PredictionChanged)
		}
	})
	t.Run("a replica without events gets approximate entries instead", func(t *testing.T) {
		out, _ := router.Decide(cfg, in(false, 0), rng)
		if out.Lease.Predict != nil || !out.RecordApprox {
			t.Errorf("plan %+v, record approx %v; want none and true", out.Lease.Predict, out.RecordApprox)
		}
	})
	t.Run("predictions off", func(t *testing.T) {
		c := cfg
		c.Scoring.PredictWeight = 0
		out, _ := router.Decide(c, in(true, 38), rng)
		if out.Lease.Predict != nil || out.Pick != 1 {
			t.Errorf("plan %+v, pick %d; want none and the idle replica", out.Lease.Predict, out.Pick)
		}
	})
	t.Run("a prediction that moves the pick", func(t *testing.T) {
		out, _ := router.Decide(cfg, in(true, 38), rng)
		if out.Pick != 0 || !out.Predicted || !out.PredictionChanged {
			t.Errorf("pick %d predicted %v changed %v, want the predicted replica, true, true", out.Pick, out.Predicted, out.PredictionChanged)
		}
		if out.Lease.PrefillBlocks != 2 {
			t.Errorf("booked prefill %d, want the 2 blocks the prediction does not cover", out.Lease.PrefillBlocks)
		}
	})
	t.Run("a replica holding all but a few blocks predicts nothing", func(t *testing.T) {
		x := in(true, 0)
		x.Candidates[0].Overlap = kvroute.Overlap{GPU: 38, Any: 38}
		out, _ := router.Decide(cfg, x, rng)
		if out.Pick != 0 || out.Lease.Predict != nil {
			t.Errorf("pick %d plan %+v, want the holder and no plan (2 < %d new blocks)", out.Pick, out.Lease.Predict, kvroute.MinPredictBlocks)
		}
	})
}
