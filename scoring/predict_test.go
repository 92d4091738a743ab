package scoring_test

import (
	"testing"

	"github.com/kvroute/kvroute/scoring"
)

// TestFloor: the credit forgives queued prefill, never the request's own.
func TestFloor(t *testing.T) {
	cfg := scoring.DefaultConfig()
	req := scoring.Request{Blocks: 200}
	// a holds a quarter of the prompt, b all but 4 blocks: with
	// max(0, …) both cost nothing but their decode.
	res := pick(t, cfg, req, []scoring.Candidate{cand("a", 50, 0, 0), cand("b", 196, 0, 10)})
	if res.Pick != 1 {
		t.Errorf("picked %s, want b (the longer match)", res.Scores[res.Pick].ID)
	}
	for i, want := range []float64{150, 4} {
		if s := res.Scores[i]; !near(s.Prefill, want) || s.Owed != int64(want) || !near(s.Floor, want) {
			t.Errorf("%s: adjusted prefill %v owed %d floor %v, want %v", s.ID, s.Prefill, s.Owed, s.Floor, want)
		}
	}
}

// TestPredictedCredit walks how a predicted overlap is priced.
func TestPredictedCredit(t *testing.T) {
	cfg := scoring.DefaultConfig()
	cfg.PredictWeight = 1
	req := scoring.Request{Blocks: 128}
	idle := cand("idle", 0, 0, 0)
	tests := []struct {
		name      string
		c         scoring.Candidate
		owed      int64
		floor     float64
		credited  float64
		pickIt    bool
		policyOff bool
	}{
		// A conversation's next turn: everything in flight there is its.
		{"the next turn shares the whole in-flight prefill",
			scoring.Candidate{ID: "p", Routable: true, Predicted: 126, Wait: 126, Load: scoring.Load{Prefill: 126, Decode: 8}}, 2, 2, 504, true, false},
		// A sibling sharing half: waiting for the other half costs.
		{"a sibling waits for the half it does not share",
			scoring.Candidate{ID: "p", Routable: true, Predicted: 64, Wait: 128, Load: scoring.Load{Prefill: 128, Decode: 64}}, 64, 96, 256, false, false},
		{"a due prediction has no wait",
			scoring.Candidate{ID: "p", Routable: true, Predicted: 64, Ready: 1, Load: scoring.Load{Prefill: 0, Decode: 64}}, 64, 64, 256, true, false},
		{"other policies ignore it",
			scoring.Candidate{ID: "p", Routable: true, Predicted: 126, Wait: 126, Load: scoring.Load{Prefill: 126, Decode: 8}}, 128, 128, 0, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			if tc.policyOff {
				c.Policy = scoring.PolicyLeastLoad
			}
			res := pick(t, c, req, []scoring.Candidate{tc.c, idle})
			s := res.Scores[0]
			if s.Owed != tc.owed || !near(s.Floor, tc.floor) || (!tc.policyOff && !near(s.Credited, tc.credited)) {
				t.Errorf("owed %d floor %v credited %v, want %d %v %v", s.Owed, s.Floor, s.Credited, tc.owed, tc.floor, tc.credited)
			}
			if got := res.Pick == 0; got != tc.pickIt {
				t.Errorf("picked the predicted replica: %v, want %v (scores %+v)", got, tc.pickIt, res.Scores)
			}
		})
	}
	t.Run("weight 0 turns it off", func(t *testing.T) {
		c := cfg
		c.PredictWeight = 0
		res := pick(t, c, req, []scoring.Candidate{{ID: "p", Routable: true, Predicted: 126, Wait: 126}, idle})
		if s := res.Scores[0]; s.Owed != 128 || s.Credited != 0 {
			t.Errorf("owed %d credited %v, want 128 and 0", s.Owed, s.Credited)
		}
	})
	t.Run("the weight rises with progress", func(t *testing.T) {
		c := cfg
		c.PredictWeight = 0.5
		for _, tc := range []struct{ ready, credited float64 }{{0, 256}, {0.5, 384}, {1, 512}} {
			res := pick(t, c, req, []scoring.Candidate{{ID: "p", Routable: true, Predicted: 128, Ready: tc.ready}, idle})
			if s := res.Scores[0]; !near(s.Credited, tc.credited) {
				t.Errorf("at progress %v: credited %v, want %v", tc.ready, s.Credited, tc.credited)
			}
		}
	})
}
