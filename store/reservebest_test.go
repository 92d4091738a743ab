package store_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/store"
)

// kvCost is ChoiceCost with DefaultConfig's kv weights.
func kvCost(blocks, active float64) kvroute.ChoiceCost {
	c := scoring.DefaultConfig()
	return kvroute.ChoiceCost{PrefillScale: c.PrefillLoadScale, RequestWeight: c.DecodeRequestWeight,
		Blocks: blocks, Active: active, Bound: math.Inf(1), Eps: 1e-9}
}

// TestReserveBest: the booking lands on the cheapest choice by the loads
// at that moment, ties going to the less loaded and then to the earlier
// choice; nothing is booked when the cheapest is not under the bound; a
// request is never booked twice.
func TestReserveBest(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		exp := e.clk.Now().Add(time.Minute)
		// a owes 10 prefill blocks, b 2 decode blocks, c nothing.
		for _, l := range []kvroute.Lease{lease("x1", "a", 10, 0, exp), lease("x2", "b", 0, 2, exp)} {
			if booked, _, err := e.s.Reserve(ctx, l, -1); err != nil || !booked {
				t.Fatalf("reserve %s = %v, %v", l.Replica, booked, err)
			}
		}
		for _, tc := range []struct {
			name    string
			choices []kvroute.Choice
			cost    func(kvroute.ChoiceCost) kvroute.ChoiceCost
			want    string // "" when nothing is booked
		}{
			{"the cheapest", []kvroute.Choice{{Replica: "a", PrefillBlocks: 4}, {Replica: "b", PrefillBlocks: 4}}, nil, "b"},
			{"credit for a cached prefix", []kvroute.Choice{{Replica: "b", PrefillBlocks: 4}, {Replica: "a", PrefillBlocks: 0, Credit: 16}}, nil, "a"},
			// b: (0 + 4 - 2) + 2 decode; c: (0 + 4) + 0 decode. Both 4.
			{"equal cost goes to the less loaded", []kvroute.Choice{{Replica: "b", PrefillBlocks: 2, Credit: 2}, {Replica: "c", PrefillBlocks: 4}},
				func(c kvroute.ChoiceCost) kvroute.ChoiceCost { c.PrefillScale = 1; return c }, "c"},
			{"a tie goes to the earlier choice", []kvroute.Choice{{Replica: "d", PrefillBlocks: 4}, {Replica: "c", PrefillBlocks: 4}}, nil, "d"},
			{"not under the bound", []kvroute.Choice{{Replica: "a", PrefillBlocks: 4}, {Replica: "b", PrefillBlocks: 4}},
				func(c kvroute.ChoiceCost) kvroute.ChoiceCost { c.Bound = 2 + c.Active + 2*c.Blocks; return c }, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cost := kvCost(4, 1)
				if tc.cost != nil {
					cost = tc.cost(cost)
				}
				before := map[string]kvroute.Load{}
				for _, c := range tc.choices {
					before[c.Replica] = loadOf(t, e, c.Replica)
				}
				l := lease("best-"+tc.name, "", 0, 1, exp)
				j, loads, err := e.s.ReserveBest(ctx, l, tc.choices, cost)
				if err != nil {
					t.Fatal(err)
				}
				got := ""
				if j >= 0 {
					got = tc.choices[j].Replica
				}
				if got != tc.want {
					t.Fatalf("booked %q (index %d), want %q", got, j, tc.want)
				}
				for i, c := range tc.choices {
					want := before[c.Replica]
					if c.Replica == tc.want {
						want.PrefillBlocks += c.PrefillBlocks
						want.DecodeBlocks++
						want.Requests++
						want.Version++
					}
					if got := loadOf(t, e, c.Replica); got != want {
						t.Errorf("%s: store has %+v, want %+v", c.Replica, got, want)
					}
					// The loads are answered unless the first choice was
					// booked (the caller's own pick).
					switch {
					case j == 0 && loads != nil:
						t.Errorf("answered loads %+v for the first choice, want none", loads)
					case j != 0 && loads[i] != want:
						t.Errorf("%s: answered %+v, want %+v", c.Replica, loads[i], want)
					}
				}
				if tc.want == "" {
					return
				}
				// A retry of the same request books nothing more.
				again, _, err := e.s.ReserveBest(ctx, l, tc.choices, cost)
				if err != nil || again != j {
					t.Errorf("retry = %d, %v; want %d, nothing booked", again, err, j)
				}
				// ... and with choices that leave its replica out, an error.
				if _, _, err := e.s.ReserveBest(ctx, l, []kvroute.Choice{{Replica: "z", PrefillBlocks: 1}}, cost); !errors.Is(err, store.ErrLeaseElsewhere) {
					t.Errorf("retry elsewhere: err = %v, want ErrLeaseElsewhere", err)
				}
				if got := loadOf(t, e, "z"); got != (kvroute.Load{}) {
					t.Errorf("z = %+v after a retry elsewhere, want nothing booked", got)
				}
				if ok, err := e.s.Release(ctx, l.RequestID); err != nil || !ok {
					t.Errorf("release = %v, %v", ok, err)
				}
			})
		}
	})
}

// TestReserveBestRejects: a booking no script may be given is an error
// naming the field, and books nothing.
func TestReserveBestRejects(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		exp := e.clk.Now().Add(time.Minute)
		ok := []kvroute.Choice{{Replica: "a", PrefillBlocks: 1}}
		for _, tc := range []struct {
			name    string
			lease   kvroute.Lease
			choices []kvroute.Choice
			field   string
		}{
			{"no choices", lease("r1", "", 0, 1, exp), nil, "replica"},
			{"a choice without a replica", lease("r2", "", 0, 1, exp), []kvroute.Choice{{PrefillBlocks: 1}}, "replica"},
			{"negative prefill", lease("r3", "", 0, 1, exp), []kvroute.Choice{{Replica: "a", PrefillBlocks: -1}}, "blocks"},
			{"an id of another model", kvroute.Lease{RequestID: "x", Model: mdl, DecodeBlocks: 1, Expires: exp}, ok, "request_id"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, _, err := e.s.ReserveBest(ctx, tc.lease, tc.choices, kvCost(1, 1))
				var fe *kvroute.FieldError
				if !errors.As(err, &fe) || fe.Field != tc.field {
					t.Errorf("err = %v, want a FieldError on %s", err, tc.field)
				}
				if got := loadOf(t, e, "a"); got != (kvroute.Load{}) {
					t.Errorf("load of a = %+v, want nothing booked", got)
				}
			})
		}
	})
}
