package router_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// slackInput is a decision over a replica holding the prompt and others
// holding nothing, with some load on the holder already.
func slackInput(policy scoring.Policy, others int) router.Input {
	in := router.Input{
		RequestID: "q", Model: "m", Blocks: 40, PromptTokens: 640, BlockSize: 16, MaxTokens: 64,
		Policy: policy, Now: time.Unix(1000, 0),
		Candidates: []router.Candidate{{ID: "holder", Routable: true, Events: true,
			Overlap: kvroute.Overlap{GPU: 40, Any: 40}, Load: scoring.Load{Prefill: 6, Decode: 60, Requests: 2}}},
	}
	for i := range others {
		in.Candidates = append(in.Candidates, router.Candidate{ID: string(rune('a' + i)), Routable: true, Events: true,
			Load: scoring.Load{Decode: float64(4 * i)}})
	}
	return in
}

// TestSlack: Slack is exactly how many more bookings like the decision's
// the pick takes while the same decision, made again in sequence, still
// picks it without a tie.
func TestSlack(t *testing.T) {
	cfg := router.DefaultConfig()
	rng := rand.New(rand.NewPCG(1, 1))
	t.Run("cost policy", func(t *testing.T) {
		in := slackInput(scoring.PolicyKV, 3)
		out, err := router.Decide(cfg, in, rng)
		if err != nil || out.Pick != 0 {
			t.Fatalf("decide = pick %d, %v; want the holder", out.Pick, err)
		}
		k := router.Slack(cfg, in, out)
		if k < 1 || k >= router.MaxSlack {
			t.Fatalf("slack = %d, want between 1 and %d for this fleet", k, router.MaxSlack-1)
		}
		booked := func(n int) router.Input {
			c := in
			c.Candidates = append([]router.Candidate(nil), in.Candidates...)
			l := &c.Candidates[0].Load
			l.Prefill += float64(n) * float64(out.Lease.PrefillBlocks)
			l.Decode += float64(n) * float64(out.Lease.DecodeBlocks)
			l.Requests += float64(n)
			return c
		}
		if again, _ := router.Decide(cfg, booked(k), rng); again.Pick != 0 {
			t.Errorf("after %d more bookings the holder lost (pick %d); slack said it keeps", k, again.Pick)
		}
		if router.Slack(cfg, booked(k+1), out) != 0 {
			t.Errorf("after %d more bookings the holder still keeps; slack said %d", k+1, k)
		}
	})
	t.Run("alone", func(t *testing.T) {
		in := slackInput(scoring.PolicyKV, 0)
		out, _ := router.Decide(cfg, in, rng)
		if k := router.Slack(cfg, in, out); k != router.MaxSlack {
			t.Errorf("slack of the only candidate = %d, want %d", k, router.MaxSlack)
		}
	})
	t.Run("not a cost policy", func(t *testing.T) {
		in := slackInput(scoring.PolicyRoundRobin, 3)
		out, _ := router.Decide(cfg, in, rng)
		if k := router.Slack(cfg, in, out); k != 0 {
			t.Errorf("slack under round-robin = %d, want 0", k)
		}
	})
}
