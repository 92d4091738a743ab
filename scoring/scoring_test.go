package scoring_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/scoring"
)

func rng() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

func cand(id string, gpu int, prefill, decode float64) scoring.Candidate {
	return scoring.Candidate{ID: id, Routable: true, GPU: gpu, Any: gpu, Load: scoring.Load{Prefill: prefill, Decode: decode}}
}

func pick(t *testing.T, cfg scoring.Config, req scoring.Request, cs []scoring.Candidate) scoring.Result {
	t.Helper()
	res, err := scoring.Pick(cfg, req, cs, rng())
	if err != nil {
		t.Fatalf("Pick: %v", err)
	}
	return res
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestCostFormula checks Dynamo's documented formula term by term, from
// Dynamo's own weights (DynamoConfig) so the expected figures are the seed's.
func TestCostFormula(t *testing.T) {
	tests := []struct {
		name string
		cfg  func(*scoring.Config)
		c    scoring.Candidate
		req  scoring.Request
		want scoring.Score
	}{
		{
			name: "no overlap",
			c:    cand("a", 0, 4, 10),
			req:  scoring.Request{Blocks: 8, ActiveBlocks: 4},
			want: scoring.Score{RawPrefill: 12, Prefill: 12, Decode: 14, Cost: 26},
		},
		{
			name: "credit subtracts from backlog plus prompt",
			c:    cand("a", 6, 4, 0),
			req:  scoring.Request{Blocks: 8},
			want: scoring.Score{RawPrefill: 12, Prefill: 6, Cost: 6},
		},
		{
			name: "clamped at zero",
			cfg:  func(c *scoring.Config) { c.OverlapCredit = 5 },
			c:    cand("a", 8, 0, 3),
			req:  scoring.Request{Blocks: 8},
			want: scoring.Score{RawPrefill: 8, Prefill: 0, Decode: 3, Cost: 3},
		},
		{
			name: "prefill load scale",
			cfg:  func(c *scoring.Config) { c.PrefillLoadScale = 2 },
			c:    cand("a", 2, 0, 1),
			req:  scoring.Request{Blocks: 8},
			want: scoring.Score{RawPrefill: 8, Prefill: 6, Decode: 1, Cost: 13},
		},
		{
			name: "active request weight",
			cfg:  func(c *scoring.Config) { c.DecodeRequestWeight = 2 },
			c:    scoring.Candidate{ID: "a", Routable: true, Load: scoring.Load{Requests: 3}},
			req:  scoring.Request{Blocks: 1},
			want: scoring.Score{RawPrefill: 1, Prefill: 1, Requests: 6, Cost: 7},
		},
		{
			name: "host tier at 0.75",
			c:    scoring.Candidate{ID: "a", Routable: true, GPU: 2, Any: 6},
			req:  scoring.Request{Blocks: 8},
			want: scoring.Score{RawPrefill: 8, Prefill: 3, Cost: 3},
		},
		{
			name: "approximate overlap stands in when events say less",
			c:    scoring.Candidate{ID: "a", Routable: true, GPU: 1, Any: 1, Approx: 5},
			req:  scoring.Request{Blocks: 8},
			want: scoring.Score{RawPrefill: 8, Prefill: 3, Cost: 3},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := scoring.DynamoConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			got := pick(t, cfg, tt.req, []scoring.Candidate{tt.c}).Scores[0]
			for _, f := range []struct {
				name      string
				got, want float64
			}{
				{"raw prefill", got.RawPrefill, tt.want.RawPrefill},
				{"adjusted prefill", got.Prefill, tt.want.Prefill},
				{"decode", got.Decode, tt.want.Decode},
				{"request blocks", got.Requests, tt.want.Requests},
				{"cost", got.Cost, tt.want.Cost},
			} {
				if !near(f.got, f.want) {
					t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
				}
			}
		})
	}
}

// TestDecayExample is the seed's arithmetic: one request-equivalent of
// excess prefill at decay 1 credits 6 matched blocks as 3.
func TestDecayExample(t *testing.T) {
	cs := []scoring.Candidate{cand("a", 6, 0, 0), cand("b", 6, 8, 0)}
	req := scoring.Request{Blocks: 8}
	plain := pick(t, scoring.DynamoConfig(), req, cs)
	cfg := scoring.DynamoConfig()
	cfg.CreditDecay = 1
	decayed := pick(t, cfg, req, cs)
	if got, want := plain.Scores[1].Cost, 8.0+8-6; !near(got, want) {
		t.Errorf("plain cost = %v, want %v", got, want)
	}
	if got, want := decayed.Scores[1].Cost, 8.0+8-3; !near(got, want) {
		t.Errorf("decayed cost = %v, want %v", got, want)
	}
	if got, want := decayed.Scores[0].Cost, plain.Scores[0].Cost; !near(got, want) {
		t.Errorf("least-loaded candidate decayed: cost %v, want %v", got, want)
	}
}

// TestActiveBlocksShiftEqually: the request's own decode blocks move every
// cost by the same amount, so they can never change the pick.
func TestActiveBlocksShiftEqually(t *testing.T) {
	cs := []scoring.Candidate{cand("a", 6, 0, 0), cand("b", 6, 8, 0), cand("c", 0, 1, 2)}
	a := pick(t, scoring.DefaultConfig(), scoring.Request{Blocks: 8}, cs)
	b := pick(t, scoring.DefaultConfig(), scoring.Request{Blocks: 8, ActiveBlocks: 4}, cs)
	for i := range cs {
		if got := b.Scores[i].Cost - a.Scores[i].Cost; !near(got, 4) {
			t.Errorf("candidate %d shifted by %v, want 4", i, got)
		}
	}
	if a.Pick != b.Pick {
		t.Errorf("pick changed from %d to %d", a.Pick, b.Pick)
	}
}

// TestEmptyIndexIsLeastLoaded is the seed's cold-index boundary: with no
// overlap anywhere, kv must pick the least-loaded replica, never replica 0.
func TestEmptyIndexIsLeastLoaded(t *testing.T) {
	cs := []scoring.Candidate{cand("r0", 0, 4, 0), cand("r1", 0, 1, 0), cand("r2", 0, 9, 0), cand("r3", 0, 3, 0)}
	res := pick(t, scoring.DefaultConfig(), scoring.Request{Blocks: 9, ActiveBlocks: 4.5}, cs)
	if res.Pick != 1 {
		t.Errorf("pick = %d, want 1", res.Pick)
	}
	t.Run("ties spread", func(t *testing.T) {
		idle := []scoring.Candidate{cand("r0", 0, 0, 0), cand("r1", 0, 0, 0), cand("r2", 0, 0, 0), cand("r3", 0, 0, 0)}
		r := rng()
		seen := map[int]bool{}
		for range 100 {
			res, _ := scoring.Pick(scoring.DefaultConfig(), scoring.Request{Blocks: 4}, idle, r)
			seen[res.Pick] = true
		}
		if len(seen) != 4 {
			t.Errorf("100 tied decisions went to %d replicas, want 4", len(seen))
		}
	})
}

// TestPolicies checks each policy's rule and that none picks an unroutable
// candidate.
func TestPolicies(t *testing.T) {
	down := cand("down", 100, 0, 0)
	down.Routable = false
	base := []scoring.Candidate{down, cand("hot", 6, 50, 50), cand("cold", 0, 1, 1), cand("mid", 3, 10, 10)}
	base[1].Load.Requests, base[2].Load.Requests, base[3].Load.Requests = 90, 1, 10
	tests := []struct {
		policy scoring.Policy
		req    scoring.Request
		mod    func([]scoring.Candidate)
		want   string
	}{
		{scoring.PolicyKV, scoring.Request{Blocks: 8}, nil, "cold"},
		{scoring.PolicyPureAffinity, scoring.Request{Blocks: 8}, nil, "hot"},
		{scoring.PolicyLeastLoad, scoring.Request{Blocks: 8}, nil, "cold"},
		{scoring.PolicyHardSwitch, scoring.Request{Blocks: 8}, nil, "cold"}, // 90-1 > 64 and 90 > 1.5: imbalanced
		{scoring.PolicyHardSwitch, scoring.Request{Blocks: 8}, func(cs []scoring.Candidate) { cs[1].Load.Requests = 20 }, "hot"},
		{scoring.PolicyHardSwitch, scoring.Request{Blocks: 40}, func(cs []scoring.Candidate) { cs[1].Load.Requests = 20 }, "cold"}, // 6/40 < 0.3
		{scoring.PolicyRoundRobin, scoring.Request{Counter: 0}, nil, "hot"},
		{scoring.PolicyRoundRobin, scoring.Request{Counter: 4}, nil, "cold"},
		{scoring.PolicySession, scoring.Request{Blocks: 8}, nil, "cold"}, // no session: least-load
	}
	for _, tt := range tests {
		t.Run(string(tt.policy), func(t *testing.T) {
			cs := append([]scoring.Candidate(nil), base...)
			if tt.mod != nil {
				tt.mod(cs)
			}
			cfg := scoring.DefaultConfig()
			cfg.Policy = tt.policy
			res := pick(t, cfg, tt.req, cs)
			if got := cs[res.Pick].ID; got != tt.want {
				t.Errorf("picked %s (mode %q), want %s", got, res.Mode, tt.want)
			}
		})
	}
	t.Run("no routable replica", func(t *testing.T) {
		_, err := scoring.Pick(scoring.DefaultConfig(), scoring.Request{Blocks: 1}, []scoring.Candidate{down}, rng())
		if !errors.Is(err, scoring.ErrNoCandidate) {
			t.Errorf("err = %v, want ErrNoCandidate", err)
		}
	})
	t.Run("power-of-two never picks unroutable", func(t *testing.T) {
		cfg := scoring.DefaultConfig()
		cfg.Policy = scoring.PolicyPowerOfTwo
		r := rng()
		for range 200 {
			res, err := scoring.Pick(cfg, scoring.Request{Blocks: 1}, base, r)
			if err != nil || base[res.Pick].ID == "down" {
				t.Fatalf("pick %d err %v", res.Pick, err)
			}
		}
	})
}

// TestSessionRing checks consistent hashing: stable, spread, and moving only
// the departed replica's sessions when one leaves.
func TestSessionRing(t *testing.T) {
	cfg := scoring.DefaultConfig()
	cfg.Policy = scoring.PolicySession
	cs := []scoring.Candidate{cand("a", 0, 0, 0), cand("b", 0, 0, 0), cand("c", 0, 0, 0), cand("d", 0, 0, 0)}
	owner := map[string]string{}
	count := map[string]int{}
	for i := range 2000 {
		s := "session-" + string(rune('A'+i%26)) + string(rune(i))
		res := pick(t, cfg, scoring.Request{SessionID: s}, cs)
		owner[s] = cs[res.Pick].ID
		count[cs[res.Pick].ID]++
	}
	for id, n := range count {
		if n < 300 || n > 700 {
			t.Errorf("replica %s got %d of 2000 sessions, want 300..700", id, n)
		}
	}
	cs[2].Routable = false
	moved := 0
	for s, was := range owner {
		res := pick(t, cfg, scoring.Request{SessionID: s}, cs)
		if now := cs[res.Pick].ID; now != was {
			moved++
			if was != "c" {
				t.Fatalf("session %s moved from %s to %s though %s is still up", s, was, now, was)
			}
		}
	}
	if moved != count["c"] {
		t.Errorf("moved %d sessions, want %d (those of c)", moved, count["c"])
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*scoring.Config)
		ok   bool
	}{
		{"default", func(*scoring.Config) {}, true},
		{"negative credit", func(c *scoring.Config) { c.OverlapCredit = -1 }, false},
		{"NaN decay", func(c *scoring.Config) { c.CreditDecay = math.NaN() }, false},
		{"host weight above 1", func(c *scoring.Config) { c.HostWeight = 2 }, false},
		{"unknown policy", func(c *scoring.Config) { c.Policy = "best" }, false},
		{"zero vnodes", func(c *scoring.Config) { c.VirtualNodes = 0 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := scoring.DefaultConfig()
			tt.mod(&c)
			if err := c.Validate(); (err == nil) != tt.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

// TestDefaults pins kvroute's defaults to Dynamo's apart from the three
// weights measured better on the simulator (see DefaultConfig): credit,
// scale and the predicted entries Dynamo keeps off by default.
func TestDefaults(t *testing.T) {
	got, want := scoring.DefaultConfig(), scoring.DynamoConfig()
	if got.OverlapCredit != 4 || got.PrefillLoadScale != 2 {
		t.Errorf("defaults: credit %v, prefill scale %v, want 4, 2", got.OverlapCredit, got.PrefillLoadScale)
	}
	if got.PredictWeight != 0.75 || want.PredictWeight != 0 {
		t.Errorf("predict weight: default %v, Dynamo's %v, want 0.75 and 0", got.PredictWeight, want.PredictWeight)
	}
	want.OverlapCredit, want.PrefillLoadScale, want.PredictWeight = got.OverlapCredit, got.PrefillLoadScale, got.PredictWeight
	if got != want {
		t.Errorf("defaults differ from Dynamo's beyond credit, scale and predictions:\n got %+v\nwant %+v", got, want)
	}
	for name, c := range map[string]scoring.Config{"default": scoring.DefaultConfig(), "dynamo": scoring.DynamoConfig()} {
		if err := c.Validate(); err != nil {
			t.Errorf("%s config invalid: %v", name, err)
		}
	}
	if d := scoring.DynamoConfig(); d.OverlapCredit != 1 || d.CreditDecay != 0 || d.PrefillLoadScale != 1 || d.DecodeRequestWeight != 0 || d.HostWeight != 0.75 {
		t.Errorf("Dynamo config = %+v, want credit 1, decay 0, scale 1, request weight 0, host 0.75", d)
	}
}

// TestKeeps: a pick keeps on load alone only when its cost is strictly the
// lowest under a cost policy.
func TestKeeps(t *testing.T) {
	cfg := scoring.DefaultConfig()
	req := scoring.Request{Blocks: 10}
	for _, tc := range []struct {
		name   string
		policy scoring.Policy
		cands  []scoring.Candidate
		pick   int
		want   bool
	}{
		{"clear winner", scoring.PolicyKV, []scoring.Candidate{cand("a", 10, 0, 0), cand("b", 0, 0, 0)}, 0, true},
		{"the loser", scoring.PolicyKV, []scoring.Candidate{cand("a", 10, 0, 0), cand("b", 0, 0, 0)}, 1, false},
		{"a tie", scoring.PolicyKV, []scoring.Candidate{cand("a", 0, 0, 0), cand("b", 0, 0, 0)}, 0, false},
		{"least load", scoring.PolicyLeastLoad, []scoring.Candidate{cand("a", 0, 0, 0), cand("b", 10, 5, 0)}, 0, true},
		{"not a cost policy", scoring.PolicyRoundRobin, []scoring.Candidate{cand("a", 10, 0, 0), cand("b", 0, 0, 0)}, 0, false},
		{"unroutable pick", scoring.PolicyKV, []scoring.Candidate{{ID: "a", GPU: 10, Any: 10}, cand("b", 0, 0, 0)}, 0, false},
		{"out of range", scoring.PolicyKV, []scoring.Candidate{cand("a", 10, 0, 0)}, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.Policy = tc.policy
			if got := scoring.Keeps(c, req, tc.cands, tc.pick); got != tc.want {
				t.Errorf("Keeps = %v, want %v", got, tc.want)
			}
		})
	}
}
