package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// The kv cost is written once in Go (scoring/settle.go: kvCost, under
// Pick and under Settled) and once in Lua: the function cost in
// store/lua/reservebest.lua, the one Lua function a newcomer edits to let
// the store settle a new cost term. These tests hold the two equal, and
// keep every configuration the script does not know away from it.

// randomConfig is a valid scoring.Config with every field filled by
// reflection: a random value of the field's type, or its zero value a
// third of the time (the value a term the store does not know must take
// for a booking to be settled). A field added to Config is filled the
// day it is added; one of a type this does not know how to fill fails
// the test until it is taught.
func randomConfig(tb testing.TB, rng *rand.Rand) scoring.Config {
	tb.Helper()
	for {
		var cfg scoring.Config
		v := reflect.ValueOf(&cfg).Elem()
		for i := range v.NumField() {
			f, name := v.Field(i), v.Type().Field(i).Name
			if rng.IntN(3) == 0 {
				continue
			}
			switch {
			case f.Type() == reflect.TypeFor[scoring.Policy]():
				// The kv cost half the time: it is the one the store settles.
				p := scoring.PolicyKV
				if rng.IntN(2) == 0 {
					p = scoring.Policies[rng.IntN(len(scoring.Policies))]
				}
				f.SetString(string(p))
			case f.Kind() == reflect.Float64:
				f.SetFloat(rng.Float64() * []float64{1, 4, 64}[rng.IntN(3)])
			case f.Kind() == reflect.Int:
				f.SetInt(rng.Int64N(1000))
			default:
				tb.Fatalf("scoring.Config.%s is a %s: teach randomConfig to fill it", name, f.Type())
			}
		}
		if cfg.Validate() == nil {
			return cfg
		}
	}
}

// settleableOf is cfg with fields zeroed, in random order, until the
// store can settle it: a configuration the store settles that keeps every
// other field's random value, however many fields Config has that the
// store does not know. (A zero policy is the kv policy.)
func settleableOf(cfg scoring.Config, rng *rand.Rand) scoring.Config {
	v := reflect.ValueOf(&cfg).Elem()
	for _, i := range rng.Perm(v.NumField()) {
		if scoring.Settleable(cfg) {
			break
		}
		v.Field(i).SetZero()
	}
	return cfg
}

// TestReserveBestSettlesAsScoring: for random configurations the store
// can settle (scoring.Settleable) and random fleets, the booking script,
// the in-memory store and scoring.Settled land on the same choice, on the
// loads the decision scored (the pick) and on loads other bookings have
// since moved; the costs Settled weighs are Pick's, to the bit. For the
// configurations it cannot settle, scoring.Settle hands nothing over.
func TestReserveBestSettlesAsScoring(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		rng := rand.New(rand.NewPCG(19, 1))
		const trials = 300 // configurations, each as drawn and made settleable
		settled, moved := 0, 0
		for trial := range trials {
			cfg := randomConfig(t, rng)
			for k, c := range []scoring.Config{cfg, settleableOf(cfg, rng)} {
				ok, m := settleTrial(t, e, rng, c, 2*trial+k)
				if ok {
					settled++
				}
				if m {
					moved++
				}
			}
		}
		// Too few settled (or moved) trials would leave the script untested.
		t.Logf("%d of %d trials settled, %d on moved loads", settled, 2*trials, moved)
		if settled < trials/2 || moved < trials/8 {
			t.Errorf("%d of %d trials settled, %d on moved loads: want at least %d and %d", settled, 2*trials, moved, trials/2, trials/8)
		}
	})
}

// settleTrial books a random fleet's loads in e's store and in an
// in-memory store, scores a random request under cfg and, when the store
// can settle it, settles it in the script, in memory and in Go. It says
// whether it settled, and whether other bookings moved the loads first.
func settleTrial(t *testing.T, e *env, rng *rand.Rand, cfg scoring.Config, trial int) (settled, moved bool) {
	t.Helper()
	ctx := context.Background()
	exp := e.clk.Now().Add(time.Hour)
	reps, loads, mem := bookFleet(t, e, rng, trial)
	blocks := 1 + rng.IntN(64)
	req := scoring.Request{Blocks: blocks, ActiveBlocks: float64(1 + rng.IntN(8))}
	cands := make([]scoring.Candidate, len(reps))
	for i, r := range reps {
		gpu := rng.IntN(blocks + 1)
		cands[i] = scoring.Candidate{ID: r, Routable: rng.IntN(6) > 0, GPU: gpu, Any: gpu + rng.IntN(blocks-gpu+1),
			Approx: rng.IntN(blocks + 1), Load: scoring.LoadOf(loads[i])}
	}
	res, err := scoring.Pick(cfg, req, cands, rng)
	if err != nil {
		return false, false // nothing routable
	}
	st, ok := scoring.Settle(cfg, req, res)
	if !scoring.Settleable(cfg) {
		if ok {
			t.Fatalf("trial %d: Settle handed the store a configuration it cannot settle: %+v", trial, cfg)
		}
		return false, false
	}
	if !ok {
		return false, false // no rival, or a tie at the bound
	}
	if g := scoring.Settled(st.Cost, st.Choices, pick(loads, st.Cands)); g != 0 {
		t.Fatalf("trial %d: Settled lands on choice %d on the loads scored, want the pick (config %+v, scores %+v)", trial, g, cfg, res.Scores)
	}
	// Other pods' bookings between the read and this one, half the time.
	if moved = rng.IntN(2) == 0; moved {
		loads = bookOthers(t, e, mem, rng, reps, blocks, trial)
		for i := range cands {
			cands[i].Load = scoring.LoadOf(loads[i])
		}
		if res, err = scoring.Pick(cfg, req, cands, rng); err != nil {
			t.Fatal(err)
		}
	}
	for k, i := range st.Cands {
		if got, want := scoring.ChoiceCostAt(st.Cost, st.Choices[k], loads[i]), res.Scores[i].Cost; got != want {
			t.Fatalf("trial %d: %s costs %v to settle, %v to Pick (config %+v)", trial, reps[i], got, want, cfg)
		}
	}
	want := scoring.Settled(st.Cost, st.Choices, pick(loads, st.Cands))
	l := lease(fmt.Sprintf("t%d-best", trial), "", 0, int64(req.ActiveBlocks), exp)
	got, _, err := e.s.ReserveBest(ctx, l, st.Choices, st.Cost)
	if err != nil {
		t.Fatal(err)
	}
	inMem, _, err := mem.Index().ReserveBest(ctx, l, st.Choices, st.Cost)
	if err != nil {
		t.Fatal(err)
	}
	if got != want || inMem != want {
		t.Fatalf("trial %d (moved: %v): the script booked choice %d, the in-memory store %d, scoring.Settled %d (config %+v, choices %+v, loads %+v)",
			trial, moved, got, inMem, want, cfg, st.Choices, pick(loads, st.Cands))
	}
	after, err := e.s.Loads(ctx, mdl, reps)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range reps {
		if g, m := after[i], mem.Load(r); g.PrefillBlocks != m.PrefillBlocks || g.DecodeBlocks != m.DecodeBlocks || g.Requests != m.Requests {
			t.Fatalf("trial %d: %s is %+v in the store, %+v in memory", trial, r, g, m)
		}
	}
	return true, moved
}

// bookOthers books other pods' random leases on some of reps, in e's
// store and in mem alike, and answers the loads the store then holds.
func bookOthers(t *testing.T, e *env, mem *mock.Memory, rng *rand.Rand, reps []string, blocks, trial int) []kvroute.Load {
	t.Helper()
	ctx := context.Background()
	exp := e.clk.Now().Add(time.Hour)
	for k, r := range reps {
		if rng.IntN(2) == 0 {
			continue
		}
		l := lease(fmt.Sprintf("t%d-other%d", trial, k), r, rng.Int64N(int64(2*blocks)), rng.Int64N(8), exp)
		if _, _, err := e.s.Reserve(ctx, l, -1); err != nil {
			t.Fatal(err)
		}
		if _, _, err := mem.Index().Reserve(ctx, l, -1); err != nil {
			t.Fatal(err)
		}
	}
	loads, err := e.s.Loads(ctx, mdl, reps)
	if err != nil {
		t.Fatal(err)
	}
	return loads
}

// bookFleet books 2 to 8 replicas' random loads (some scraped, some
// small enough to tie) in e's store, and the same loads in an in-memory
// store.
func bookFleet(t *testing.T, e *env, rng *rand.Rand, trial int) ([]string, []kvroute.Load, *mock.Memory) {
	t.Helper()
	ctx := context.Background()
	exp := e.clk.Now().Add(time.Hour)
	reps := make([]string, 2+rng.IntN(7))
	for i := range reps {
		reps[i] = fmt.Sprintf("t%d-r%d", trial, i)
		if rng.IntN(4) > 0 {
			most := []int64{4, 200}[rng.IntN(2)]
			l := lease(fmt.Sprintf("t%d-%d", trial, i), reps[i], rng.Int64N(most), rng.Int64N(most/4+1), exp)
			if _, _, err := e.s.Reserve(ctx, l, -1); err != nil {
				t.Fatal(err)
			}
		}
		if rng.IntN(2) == 0 {
			if err := e.s.SetScraped(ctx, mdl, reps[i], rng.Int64N(5), rng.Int64N(5), 0.5); err != nil {
				t.Fatal(err)
			}
		}
	}
	loads, err := e.s.Loads(ctx, mdl, reps)
	if err != nil {
		t.Fatal(err)
	}
	mem := mock.NewMemory()
	for i, r := range reps {
		mem.SetLoad(r, loads[i])
	}
	return reps, loads, mem
}

// pick is loads[i] for each i of idx, in order.
func pick(loads []kvroute.Load, idx []int) []kvroute.Load {
	out := make([]kvroute.Load, len(idx))
	for k, i := range idx {
		out[k] = loads[i]
	}
	return out
}

// TestRouterSettlesOnlySettleable: a router configured with a random
// scoring.Config leaves a contested booking to the store exactly when
// scoring.Settleable accepts the configuration; any other is booked on
// the version scored or within its slack, never handed to the script.
func TestRouterSettlesOnlySettleable(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(19, 2))
	tok := make([]uint32, 4*kvroute.DefaultBlockSize)
	for i := range tok {
		tok[i] = uint32(rng.IntN(50000))
	}
	accepted := 0
	for trial := range 200 {
		cfg := randomConfig(t, rng)
		mem := mock.NewMemory(
			kvroute.Replica{ID: "a", Model: "m", URL: "http://127.0.0.1:9000", Events: "tcp://x"},
			kvroute.Replica{ID: "b", Model: "m", URL: "http://127.0.0.1:9001", Events: "tcp://x"})
		mem.SetLoad("b", kvroute.Load{PrefillBlocks: 1 + rng.Int64N(100), Running: rng.Int64N(4)})
		idx := mem.Index()
		best, calls := idx.ReserveBestFn, 0
		idx.ReserveBestFn = func(ctx context.Context, l kvroute.Lease, choices []kvroute.Choice, cost kvroute.ChoiceCost) (int, []kvroute.Load, error) {
			calls++
			return best(ctx, l, choices, cost)
		}
		rc := router.DefaultConfig()
		rc.Scoring, rc.RegistryTTL = cfg, 0
		r, err := router.New(idx, mem.Registry(), rc, router.Options{Rand: rand.New(rand.NewPCG(1, uint64(trial))), Now: time.Now})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Route(ctx, router.Request{Model: "m", Tokens: tok}); err != nil {
			t.Fatalf("trial %d: %v (config %+v)", trial, err, cfg)
		}
		// Two routable replicas always make a booking the store can
		// settle, if it can settle the configuration at all.
		want := 0
		if scoring.Settleable(cfg) {
			want = 1
			accepted++
		}
		if calls != want {
			t.Fatalf("trial %d: %d bookings left to the store, want %d (Settleable: %v, config %+v)", trial, calls, want, want == 1, cfg)
		}
	}
	if accepted == 0 || accepted == 200 {
		t.Errorf("%d of 200 configurations settleable: want some of each", accepted)
	}
}
