package tests_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/store"
)

// TestServiceAndSimulatorDecideAlike feeds one fleet state and one
// sequence of requests to the service's Router over a real redis-server
// and to the simulator's RouterView, and requires the same picks, the same
// scores, the same bookings and the same loads afterwards. The state has
// what makes the two easy to drift apart: host-tier blocks (credited at
// host_weight), replicas without events (approximate entries, credited at
// approx_weight 0.5), and loads that build up over the sequence.
func TestServiceAndSimulatorDecideAlike(t *testing.T) {
	const (
		n     = 4
		bsize = 4
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	// The store dates predicted entries and reads their progress by its
	// clock, the simulator by the decisions' Now: one clock for both.
	st, err := store.Open(ctx, redistest.Server(t), store.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatalf("store: %v", err)
	}
	defer st.Close()

	cfg := router.DefaultConfig()
	cfg.BlockSize = bsize
	cfg.Seed = seed
	cfg.Scoring.ApproxWeight = 0.5
	cfg.Scoring.HostWeight = 0.75
	ids := 0
	rt, err := router.New(st, st, cfg, router.Options{
		Now:  func() time.Time { return now },
		Rand: rand.New(rand.NewPCG(1, 1)),
		NewID: func(model string) string {
			ids++
			return store.RequestID(model, fmt.Sprintf("req-%d", ids))
		},
	})
	if err != nil {
		t.Fatalf("router: %v", err)
	}
	view, err := sim.NewRouterView(n, cfg, true, rand.New(rand.NewPCG(1, 1)))
	if err != nil {
		t.Fatalf("view: %v", err)
	}

	// r0 and r1 publish events; r2 and r3 do not, so decisions for them
	// leave approximate entries.
	for i, id := range view.IDs() {
		rep := kvroute.Replica{ID: id, Model: model, URL: "http://127.0.0.1:1"}
		if i < 2 {
			rep.Events = "tcp://127.0.0.1:1"
		}
		if err := st.PutReplica(ctx, rep); err != nil {
			t.Fatalf("put %s: %v", id, err)
		}
		view.SetEvents(i, i < 2)
	}

	prompt := func(base uint32, blocks int) []uint32 {
		toks := make([]uint32, blocks*bsize+1) // a partial last block
		for i := range toks {
			toks[i] = base + uint32(i)
		}
		return toks
	}
	keysOf := func(toks []uint32) []kvroute.BlockKey {
		return kvroute.BlockKeys(rt.KeySpace(model, ""), bsize, toks, kvroute.RequestExtras(""))
	}
	a, b := prompt(1000, 10), prompt(5000, 6)
	ka := keysOf(a)

	// r0 holds a's first 6 blocks on GPU; r1 holds 3 on GPU and the next
	// 5 only in an offload tier.
	held := []struct {
		rep    int
		from   int
		to     int
		tier   kvroute.Tier
		engine uint64
	}{
		{0, 0, 6, kvroute.TierGPU, 100},
		{1, 0, 3, kvroute.TierGPU, 200},
		{1, 3, 8, kvroute.TierHost, 300},
	}
	for seq, h := range held {
		var ops []kvroute.IndexOp
		for d := h.from; d < h.to; d++ {
			parent := kvroute.NoParent
			if d > 0 {
				parent = ka[d-1]
			}
			ops = append(ops, kvroute.IndexOp{Kind: kvroute.OpStore, EngineHash: h.engine + uint64(d), Key: ka[d], Parent: parent, Tier: h.tier})
		}
		id := view.IDs()[h.rep]
		if _, err := st.Apply(ctx, model, id, int64(seq+1), ops); err != nil {
			t.Fatalf("apply %s: %v", id, err)
		}
		view.Apply(true, h.rep, h.tier, ka[h.from:h.to], now)
	}

	steps := []struct {
		name      string
		tokens    []uint32
		maxTokens int
		session   string
		// firstToken reports the decision's first token afterwards, so
		// later decisions see its prefill released.
		firstToken bool
	}{
		{"cached on GPU and host", a, 64, "", false},
		{"unrelated prompt", b, 0, "", true},
		{"same prompt again", a, 200, "", false},
		{"unrelated again: approximate entries now count", b, 32, "s1", false},
		{"third time", b, 32, "s1", true},
		{"long output", a, 4000, "", false},
		{"a once more", a, 1, "", false},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			d, err := rt.Route(ctx, router.Request{Model: model, Tokens: step.tokens, MaxTokens: step.maxTokens, SessionID: step.session})
			if err != nil {
				t.Fatalf("service: %v", err)
			}
			out, err := view.Decide(sim.Ask{
				Keys: keysOf(step.tokens), PromptTokens: len(step.tokens), BlockSize: bsize,
				MaxTokens: step.maxTokens, SessionID: step.session, Now: now,
			})
			if err != nil {
				t.Fatalf("simulator: %v", err)
			}
			p := out.Pick
			if got, want := d.Replica.ID, view.IDs()[p]; got != want {
				t.Fatalf("service picked %s, simulator %s\nservice scores %+v\nsimulator scores %+v", got, want, d.Candidates, out.Result.Scores)
			}
			if got, want := d.Candidates, out.Result.Scores; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("scores differ:\nservice   %+v\nsimulator %+v", got, want)
			}
			if d.Matched != out.Matched || d.Approximate != out.Approximate {
				t.Errorf("matched: service %d (approx %v), simulator %d (approx %v)", d.Matched, d.Approximate, out.Matched, out.Approximate)
			}
			if !d.Expires.Equal(out.Lease.Expires) {
				t.Errorf("expiry: service %v, simulator %v", d.Expires, out.Lease.Expires)
			}
			booked := bookedLoads(t, ctx, st, view.IDs())
			if step.firstToken {
				if _, err := rt.FirstToken(ctx, d.RequestID); err != nil {
					t.Fatalf("first token: %v", err)
				}
				view.FirstToken(p, out.Lease, now)
				booked = bookedLoads(t, ctx, st, view.IDs())
			}
			for i := range n {
				got, want := booked[i], view.Load(i)
				if got != want {
					t.Errorf("%s load: service %+v, simulator %+v", view.IDs()[i], got, want)
				}
			}
		})
	}
	// The sequence must have exercised what it claims to.
	var host, approx, predicted bool
	d, err := rt.Route(ctx, router.Request{Model: model, Tokens: a, MaxTokens: 1, Policy: scoring.PolicyKV})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range d.Candidates {
		host = host || c.Any > c.GPU
		approx = approx || c.Approx > 0
		predicted = predicted || c.Predicted > c.GPU
	}
	if !host || !approx || !predicted {
		t.Errorf("scenario lost its point: host-tier overlap %v, approximate overlap %v, predicted overlap %v", host, approx, predicted)
	}
}

// bookedLoads is the store's booked load per replica in scoring's units.
func bookedLoads(t *testing.T, ctx context.Context, st *store.Store, ids []string) []scoring.Load {
	t.Helper()
	ls, err := st.Loads(ctx, model, ids)
	if err != nil {
		t.Fatalf("loads: %v", err)
	}
	out := make([]scoring.Load, len(ls))
	for i, l := range ls {
		out[i] = scoring.Load{Prefill: float64(l.PrefillBlocks), Decode: float64(l.DecodeBlocks), Requests: float64(l.Requests)}
	}
	return out
}
