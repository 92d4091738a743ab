package scoring_test

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scoring"
)

// TestSettleable: the store settles the kv cost at any weights it carries,
// and nothing else: no other policy, no decaying credit.
func TestSettleable(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*scoring.Config)
		want bool
	}{
		{"the defaults", func(*scoring.Config) {}, true},
		{"Dynamo's defaults", func(c *scoring.Config) { *c = scoring.DynamoConfig() }, true},
		{"no policy named (kv)", func(c *scoring.Config) { c.Policy = "" }, true},
		{"weights the store carries", func(c *scoring.Config) {
			c.OverlapCredit, c.PrefillLoadScale, c.DecodeRequestWeight, c.HostWeight, c.ApproxWeight = 7, 0.5, 3, 0.1, 0.2
		}, true},
		{"another policy's settings", func(c *scoring.Config) { c.BalanceAbs, c.BalanceRel, c.CacheThreshold, c.VirtualNodes = 1, 2, 0.9, 7 }, true},
		{"a decaying credit", func(c *scoring.Config) { c.CreditDecay = 1 }, false},
		{"least-load", func(c *scoring.Config) { c.Policy = scoring.PolicyLeastLoad }, false},
		{"hard-switch", func(c *scoring.Config) { c.Policy = scoring.PolicyHardSwitch }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := scoring.DefaultConfig()
			tc.edit(&c)
			if got := scoring.Settleable(c); got != tc.want {
				t.Errorf("Settleable(%+v) = %v, want %v", c, got, tc.want)
			}
		})
	}
}

// TestSettle: the pick first and its nearest rivals after it, each with
// the prefill it owes and its credit; the bound is the cheapest rival
// left out; nothing is settled without a rival or with a tie at the
// bound.
func TestSettle(t *testing.T) {
	cfg := scoring.DefaultConfig()
	req := scoring.Request{Blocks: 10, ActiveBlocks: 2}
	// Costs (credit 4, scale 2, decode 2): a 2×max(8, 0+10-4×2)+2 = 18
	// (the credit never forgives a's own 8 blocks), b 2×(1+10)+2 = 24, c
	// 26, d 28, e 30.
	cs := []scoring.Candidate{cand("e", 0, 4, 0), cand("b", 0, 1, 0), cand("a", 2, 0, 0), cand("d", 0, 3, 0), cand("c", 0, 2, 0)}
	res := pick(t, cfg, req, cs)
	st, ok := scoring.Settle(cfg, req, res)
	if !ok {
		t.Fatal("not settled")
	}
	want := []kvroute.Choice{{Replica: "a", PrefillBlocks: 8, Credit: 8, Floor: 8, Held: 2}, {Replica: "b", PrefillBlocks: 10, Floor: 10},
		{Replica: "c", PrefillBlocks: 10, Floor: 10}, {Replica: "d", PrefillBlocks: 10, Floor: 10}}
	if len(st.Choices) != len(want) {
		t.Fatalf("choices = %+v, want %+v", st.Choices, want)
	}
	for k := range want {
		if st.Choices[k] != want[k] || cs[st.Cands[k]].ID != want[k].Replica {
			t.Errorf("choice %d = %+v (candidate %d), want %+v", k, st.Choices[k], st.Cands[k], want[k])
		}
	}
	if wc := (kvroute.ChoiceCost{PrefillScale: 2, Blocks: 10, Active: 2, Bound: 30, Eps: scoring.SettleEps, OverlapCredit: 4, PredictWeight: 0.75}); st.Cost != wc {
		t.Errorf("cost = %+v, want %+v", st.Cost, wc)
	}
	t.Run("no rival", func(t *testing.T) {
		one := []scoring.Candidate{cs[2], cs[0]}
		one[1].Routable = false
		if _, ok := scoring.Settle(cfg, req, pick(t, cfg, req, one)); ok {
			t.Error("settled with no rival")
		}
	})
	t.Run("a tie at the bound", func(t *testing.T) {
		tied := append([]scoring.Candidate(nil), cs...)
		for i := range tied {
			tied[i] = cand(tied[i].ID, 0, 0, 0)
		}
		if _, ok := scoring.Settle(cfg, req, pick(t, cfg, req, tied)); ok {
			t.Error("settled a pick tied with a rival left out")
		}
	})
	t.Run("every rival given", func(t *testing.T) {
		st, ok := scoring.Settle(cfg, req, pick(t, cfg, req, cs[1:4]))
		if !ok || !math.IsInf(st.Cost.Bound, 1) {
			t.Errorf("bound = %v (settled %v), want +Inf", st.Cost.Bound, ok)
		}
	})
}
